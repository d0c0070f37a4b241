"""Notebook 02 logic: record (or load) a labelled trace, break it down, and turn the numbers into findings.

The breakdown itself lives in `wmbook.profiling.breakdown`; this module validates the notebook's
parameters, records the trace with fine labels and shapes, picks the workload's region and forward
labels, writes results rows and computes the interpretation sentences.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from . import results as results_store
from .profiling import profile, set_labels
from .profiling.breakdown import DIT_FINE_LABELS, FORWARD_LABEL, Breakdown, analyze
from .workloads import WORKLOADS
from .workloads import module as baseline_module
from .workloads import validate as validate_workload

REPO = Path(__file__).resolve().parent.parent
NOTEBOOK = "02_bottleneck_breakdown"


@dataclass(frozen=True)
class WorkloadLabels:
    """Which labels a workload's breakdown reads."""

    region: str  # the labelled range whose device time is broken down
    forward: str  # one denoiser forward
    fine: tuple[str, ...]  # fine labels splitting one forward


def workload_labels(workload: str) -> WorkloadLabels:
    if workload == "mg2":
        return WorkloadLabels("2_Pipeline_Inference", FORWARD_LABEL, DIT_FINE_LABELS)
    if workload == "wma":
        from .models.wma import WMA_FINE_LABELS, WMA_FORWARD_LABEL
        from .pipelines.ddim import ITERATION_LABEL  # noqa: F401

        return WorkloadLabels(ITERATION_LABEL, WMA_FORWARD_LABEL, tuple(WMA_FINE_LABELS))
    raise ValueError(f"workload={workload!r} is not allowed; allowed values: {list(WORKLOADS)}")


@dataclass
class BreakdownConfig:
    base: object  # the workload's validated baseline config (wmbook.baseline / wmbook.baseline_wma)
    workload: str
    trace: Path | None  # None: record afresh
    region: str
    detail: bool
    profiling_config: str
    measure_overhead: bool
    overhead_repeats: int
    output_dir: Path
    results_path: Path

    @property
    def tiny(self) -> bool:
        return self.base.tiny

    def table(self) -> pd.DataFrame:
        d = dict(self.base.params()) | {
            "workload": self.workload, "trace": str(self.trace) if self.trace else "(record afresh)",
            "region": self.region, "detail_labels": self.detail, "profiling_config": self.profiling_config,
            "measure_overhead": self.measure_overhead, "overhead_repeats": self.overhead_repeats,
            "warmup": self.base.warmup, "output_dir": str(self.output_dir), "results_path": str(self.results_path),
        }  # fmt: skip
        return pd.DataFrame({"value": {k: str(v) for k, v in d.items()}}).rename_axis("parameter")




def validate(*, workload="mg2", trace="", region="auto", detail=True, profiling_config="development",
             measure_overhead=True, overhead_repeats=3, output_dir="auto", results_path="auto",
             **base_params) -> BreakdownConfig:
    """Check every notebook-02 parameter before any heavy work (errors name the parameter and allowed values).

    base_params go to the workload's notebook-01 `validate` (preset, device, dtype, num_blocks or ddim_steps, ...).
    """
    if workload not in WORKLOADS:
        raise ValueError(f"workload={workload!r} is not allowed; allowed values: {list(WORKLOADS)}")
    for name, v in (("detail", detail), ("measure_overhead", measure_overhead)):
        if not isinstance(v, bool):
            raise ValueError(f"{name}={v!r} is not allowed; allowed values: [True, False]")
    if isinstance(overhead_repeats, bool) or not isinstance(overhead_repeats, int) or overhead_repeats < 1:
        raise ValueError(f"overhead_repeats={overhead_repeats!r} is not allowed; allowed values: an integer >= 1")
    if not isinstance(trace, (str, Path)):
        raise ValueError(f"trace={trace!r} is not allowed; allowed values: '' (record afresh) or a path to a "
                         f".json / .json.gz Chrome trace")
    tpath = None
    if str(trace):
        tpath = Path(trace)
        if not tpath.is_file() or not (tpath.name.endswith(".json") or tpath.name.endswith(".json.gz")):
            raise ValueError(f"trace={str(trace)!r} is not allowed; allowed values: '' (record afresh) or an "
                             f"existing .json / .json.gz Chrome trace file")
    from .profiling.config import load_config

    try:
        load_config(profiling_config)
    except ValueError as e:
        raise ValueError(f"profiling_config={profiling_config!r} is not allowed: {e}; allowed values: "
                         f"'development', 'production' or the path of a YAML file") from None
    base = validate_workload(workload, profile=True, output_dir=output_dir, results_path=results_path, **base_params)
    labels = workload_labels(workload)
    reg = labels.region if region == "auto" else region
    if not isinstance(reg, str) or not reg:
        raise ValueError(f"region={region!r} is not allowed; allowed values: 'auto' or a label name")
    out = Path(output_dir) if output_dir != "auto" else REPO / "reports" / "artifacts" / NOTEBOOK / \
        f"{base.preset}-{base.device.type}"
    return BreakdownConfig(base=base, workload=workload, trace=tpath, region=reg, detail=detail,
                           profiling_config=profiling_config if isinstance(profiling_config, str) else "custom",
                           measure_overhead=measure_overhead, overhead_repeats=overhead_repeats, output_dir=out,
                           results_path=base.results_path)


def record_trace(run_fn, cfg: BreakdownConfig, name: str = "02_breakdown_trace") -> Path:
    """One traced call of run_fn (after cfg.base.warmup untraced calls and one profiler warm-up call),
    fine labels on and input shapes recorded (needed for the roofline); returns the gzip trace path."""
    from tqdm.auto import tqdm

    for _ in tqdm(range(cfg.base.warmup), desc="warm-up (untraced)", leave=False):
        run_fn()
    set_labels(True, detail=cfg.detail)
    try:
        res = profile(run_fn, wait=0, warmup=1, active=1, out_dir=cfg.output_dir, name=name, record_shapes=True)
    finally:
        set_labels(True, detail=False)
    return res.trace_path


def breakdown(trace, cfg: BreakdownConfig, ceilings: dict | None) -> Breakdown:
    labels = workload_labels(cfg.workload)
    return analyze(trace, region=cfg.region, ceilings=ceilings, forward_label=labels.forward, fine_labels=labels.fine)


def session_report(pipe, inputs, cfg: BreakdownConfig, bd: Breakdown, ceilings: dict):
    """Run the pipeline once inside a ProfilingSession (monitors on, tracing off), attach the breakdown and
    the measured profiling overhead, write the JSON + HTML session report. Returns (session, paths, overhead)."""
    from .profiling.session import ProfilingSession, measure_overhead

    bm = baseline_module(cfg.workload)
    overhead = None
    if cfg.measure_overhead:
        gen = bm.generate_callable(pipe, inputs, cfg.base)
        # one run per round, alternating with and without the session: drifts (clocks, host load) hit both alike
        overhead = measure_overhead(gen, config=cfg.profiling_config, repeats=2 * cfg.overhead_repeats,
                                    warmup=1, device=cfg.base.device, rounds=2 * cfg.overhead_repeats)
    tags = {"notebook": NOTEBOOK, "workload": cfg.workload, "preset": cfg.base.preset}
    session = ProfilingSession(f"{NOTEBOOK}-{cfg.base.preset}", config=cfg.profiling_config, device=cfg.base.device,
                               tags=tags, output_dir=cfg.output_dir / "session")
    session.config = session.config.replace(generate_final_report=False)  # written below, with the breakdown
    with session:
        bm.session_run(pipe, inputs, cfg.base, session)
    session.set_metrics(ceilings={k: ceilings.get(k) for k in ("gemm_tflops", "copy_gbps", "sdpa_tflops")})
    session.attach_breakdown(bd)
    if overhead is not None:
        session.set_overhead(overhead)
    paths = session.write_report()
    return session, paths, overhead


def result_rows(cfg: BreakdownConfig, bd: Breakdown, overhead: dict | None = None) -> list[dict]:
    """Category shares, idle/launch statistics and achieved throughput as results rows."""
    common = dict(notebook=NOTEBOOK, workload=cfg.workload, preset=cfg.base.preset, variant="eager",
                  params=cfg.base.params() | {"region": cfg.region, "detail": cfg.detail},
                  warmup=cfg.base.warmup, repeats=1)
    rows = []
    for _, r in bd.categories.iterrows():
        rows.append(results_store.make_row(metric=f"category_share:{r['category']}", value=float(r["share"]),
                                           unit="fraction", **common))
    s = bd.summary()
    for key, unit in (("busy_ms", "ms"), ("idle_share", "fraction"), ("kernels_per_forward", "kernels"),
                      ("short_kernel_share", "fraction"), ("forward_ms", "ms"), ("syncs_in_forward", "count"),
                      ("casts_per_forward", "count"), ("gemm_tflops", "TFLOP/s"), ("gemm_frac_of_ceiling", "fraction"),
                      ("attention_tflops", "TFLOP/s"), ("attention_frac_of_ceiling", "fraction"),
                      ("conv_tflops", "TFLOP/s"), ("busy_over_host", "fraction")):
        v = s.get(key)
        if v is not None and not (isinstance(v, float) and math.isnan(v)):
            rows.append(results_store.make_row(metric=key, value=float(v), unit=unit, **common))
    if overhead:
        rows.append(results_store.make_row(metric="profiling_overhead", value=float(overhead["overhead_frac"]),
                                           unit="fraction", **common))
    return rows


def interpret(cfg: BreakdownConfig, bd: Breakdown, overhead: dict | None = None) -> str:
    """Sentences computed from the breakdown's numbers."""
    s = bd.summary()
    basis = "GPU kernel time" if bd.source == "gpu" else "CPU self time of aten ops (the trace has no device activity)"
    top = bd.categories.head(3)
    cats = ", ".join(f"{c} {sh:.0%}" for c, sh in zip(top["category"], top["share"]))
    lines = [f"In `{cfg.region}` ({s['busy_ms']:.1f} ms of {basis}), the largest operator categories are {cats}."]
    if bd.source == "gpu" and s.get("idle_share") == s.get("idle_share"):
        lines.append(f"The GPU is idle {s['idle_share']:.0%} of the region's span ({s['idle_ms']:.1f} ms): "
                     f"kernels run {s['busy_over_host']:.0%} of the host time the region takes, with "
                     f"{s['kernels_per_forward']:.0f} kernel launches per forward, "
                     f"{s['short_kernel_share']:.0%} of them under 10 us.")
    fs = bd.forward_split
    if len(fs):
        f0 = fs.iloc[0]
        lines.append(f"Inside one forward ({s['forward_ms']:.3g} ms of {bd.basis} time, mean over {fs.attrs['forwards']} "
                     f"forwards), `{f0['fine_label']}` takes the most: {f0['share']:.0%}.")
    for key, what in (("gemm", "GEMMs"), ("attention", "attention")):
        tf, frac = s.get(f"{key}_tflops"), s.get(f"{key}_frac_of_ceiling")
        if tf is not None and frac is not None:
            lines.append(f"{what} achieve {tf:.3g} TFLOP/s, {frac:.0%} of the measured ceiling.")
    if len(bd.suggestions):
        sg = bd.suggestions.iloc[0]
        lines.append(f"First suggestion: {sg['finding']} ({sg['evidence']}) -> notebook {sg['notebook']}.")
    if overhead:
        b, i = overhead["baseline_ms"], overhead["session_ms"]
        noise = overhead["baseline_spread_frac"]
        verdict = ("within the run-to-run spread" if abs(overhead["overhead_frac"]) <= noise
                   else "larger than the run-to-run spread")
        lines.append(f"Profiling overhead with monitors on and tracing off (`{overhead['config']}` config): "
                     f"{overhead['overhead_frac']:+.1%} ({i['median']:.1f} vs {b['median']:.1f} ms median over "
                     f"{overhead['repeats']} runs each), {verdict} (p20-p80 spread {noise:.1%} of the median).")
        share = (overhead.get("monitor") or {}).get("sampling_share_of_wall")
        if share is not None:
            lines.append(f"Measured directly, the sampler thread spent {share:.2%} of the session's wall time taking "
                         f"samples (an upper bound on the host time it can take from the launching thread).")
    if cfg.tiny:
        lines.append("Tiny-preset numbers: they check the analysis, not the speed of the real model.")
    return " ".join(lines)


def plot_dashboard(bd: Breakdown):
    """Category bars, per-forward split, roofline: one figure."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(17, 4.2), gridspec_kw={"width_ratios": [1, 1, 1.1]})
    bd.plot_categories(ax=axes[0])
    bd.plot_forward_split(ax=axes[1])
    bd.plot_roofline(ax=axes[2])
    fig.tight_layout()
    return fig
