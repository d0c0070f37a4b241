"""The two workloads behind one interface: `mg2` (causal DiT + KV cache, wmbook.baseline) and `wma` (video UNet +
DDIM, wmbook.baseline_wma). Both modules provide validate, build, model_table, run_benchmark, floor_table,
profile_stages, plot_overview, result_rows, interpret, run_callable, generate_callable and session_run."""

from __future__ import annotations

WORKLOADS = ("mg2", "wma")


def module(workload: str):
    """The notebook-01 logic module of a workload."""
    if workload == "mg2":
        from . import baseline

        return baseline
    if workload == "wma":
        from . import baseline_wma

        return baseline_wma
    raise ValueError(f"workload={workload!r} is not allowed; allowed values: {list(WORKLOADS)}")


def validate(workload: str = "mg2", *, num_blocks=0, ddim_steps=0, guidance_scale=1.0, **params):
    """Validate notebook parameters for `workload`: num_blocks applies to mg2, ddim_steps/guidance_scale to wma;
    a non-default value given to the other workload is an error (it would be silently ignored otherwise)."""
    mod = module(workload)
    if workload == "mg2":
        if ddim_steps not in (0, None) or guidance_scale not in (1.0, 1, None):
            raise ValueError(f"ddim_steps={ddim_steps!r} / guidance_scale={guidance_scale!r} apply to workload "
                             f"'wma' only; for workload 'mg2' leave them at 0 / 1.0 (allowed values there: 0, 1.0)")
        return mod.validate(num_blocks=num_blocks, **params)
    if num_blocks not in (0, None):
        raise ValueError(f"num_blocks={num_blocks!r} applies to workload 'mg2' only; for workload 'wma' leave it "
                         f"at 0 (allowed value there: 0) and use ddim_steps")
    return mod.validate(ddim_steps=ddim_steps, guidance_scale=guidance_scale, **params)
