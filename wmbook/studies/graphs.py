"""Notebook 06 (static caches and CUDA graphs): the best stack of notebook 04, then static caches and CUDA-graph
capture on top, gated against fp32; wall vs GPU busy time and launches per forward, end-to-end speed, what was
captured and what it cost, torch.compile's own CUDA graphs (reduce-overhead) as a comparison.

Nothing here branches on a workload's name: what is static and what is captured comes from the workload object
(`static_caches`, `graph_targets`).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import torch

from .. import results as results_store
from ..params import DEVICE, OUTPUT_DIR, PRESET, REPEATS, RESULTS_PATH, SEED, WARMUP, Param, boolean, integer
from ..runconfig import WORKLOAD, NotebookSpec, RunConfig
from ..runconfig import validate as _validate
from ..workloads import E2ESize
from .compile import _compile_backend, _e2e_blocks

NOTEBOOK = "06_cuda_graphs"


def _base(v, ctx):
    if v == "auto":
        return None
    from .. import variants
    from ..params import name_list

    steps = name_list(v, ctx)
    variants.resolve(steps, ctx["workload"], ctx["device"])
    return tuple(steps)


def _cross_check(cfg: RunConfig) -> None:
    cfg.workload.check_e2e(cfg.preset, "e2e_blocks", e2e_size(cfg))


SPEC = NotebookSpec(NOTEBOOK, (
    WORKLOAD, PRESET, DEVICE,
    Param("base", "auto", _base, "the stack the graph rows build on; auto: notebook 04's best (its ladder + compile)"),
    Param("reduce_overhead", True, boolean, "also measure the base with torch.compile mode reduce-overhead (GPU)"),
    Param("compile_backend", "auto", _compile_backend, "auto: inductor on a GPU, aot_eager on a CPU"),
    WARMUP.with_default(3), REPEATS.with_default(10),
    Param("e2e_blocks", 0, _e2e_blocks, "blocks per end-to-end run (causal DiT); 0: 4 on a GPU, 3 on a CPU"),
    Param("e2e_ddim_steps", 0, integer(0), "DDIM steps per pass in the end-to-end run (UNet); 0: the preset's "
          "default (50 at the real shape: seconds per interaction iteration)"),
    Param("e2e_repeats", 2, integer(1), "timed end-to-end runs per row"),
    OUTPUT_DIR, RESULTS_PATH, SEED), workload_params=False, cross_check=_cross_check)


def validate(**params) -> RunConfig:
    """Check every notebook-06 parameter before any heavy work; errors name the parameter and allowed values."""
    return _validate(SPEC, **params)


def e2e_size(cfg: RunConfig) -> E2ESize:
    steps = cfg.options.e2e_ddim_steps or getattr(cfg.preset, "default_steps", 5)
    return E2ESize(blocks=cfg.options.e2e_blocks, ddim_steps=steps)


def base_stack(cfg: RunConfig) -> list[str]:
    """The stack the graph rows build on: `base`, or notebook 04's best (its default ladder, then compile in the
    workload's scope)."""
    from ..variants.builtin import compile_variant

    if cfg.options.base is not None:
        return list(cfg.options.base)
    return [*cfg.workload.default_ladder(cfg.device, None), compile_variant(cfg.workload.compile_scope)]


def graph_steps(cfg: RunConfig) -> list[str]:
    """What the graph rows add, in order: static caches (where the workload carries state across calls), then
    CUDA graphs (on a GPU)."""
    from .. import variants

    steps = [n for n in ("static-caches",) if n in variants.known(cfg.workload)]
    return steps + (["cuda-graphs"] if cfg.device.type == "cuda" else [])


def static_cache_check(cfg: RunConfig, blocks: int | None = None) -> pd.DataFrame:
    """Static caches against fresh ones: two generations (two seeds) through one set of caches reset in place, with
    more blocks than the KV window holds, compared with fresh caches (max abs difference, whether the caches kept
    their addresses). Empty for a workload without cross-call state."""
    from .. import variants

    wl = cfg.workload
    if "static-caches" not in variants.known(wl):
        return pd.DataFrame()
    ref = wl.pipeline(cfg.preset, cfg.device, torch.float32, torch.float32, cfg.seed)
    static = wl.pipeline(cfg.preset, cfg.device, torch.float32, torch.float32, cfg.seed)
    wl.static_caches(static)
    p = cfg.preset
    n = blocks or p.kv_capacity_frames() // p.num_frame_per_block + 2
    rows, ptr = [], None
    with torch.no_grad():
        for seed in (cfg.seed, cfg.seed + 1):
            a = ref.generate(ref.prepare(n, seed=seed), progress=False, decode=False).latents
            b = static.generate(static.prepare(n, seed=seed), progress=False, decode=False).latents
            cache = static._static_cache
            same = ptr is None or cache.kv[0].k.data_ptr() == ptr
            ptr = cache.kv[0].k.data_ptr()
            rows.append({"generation seed": seed, "blocks": n, "window (latent frames)": p.kv_capacity_frames(),
                         "max abs diff": float((a.float() - b.float()).abs().max()), "equal": bool(torch.equal(a, b)),
                         "same cache addresses": same})
    return pd.DataFrame(rows).set_index("generation seed")


def run_ladder(ref, cfg: RunConfig, ceilings: dict | None):
    """The base stack (one row), then each graph step (static caches, CUDA graphs), gated against fp32; with
    reduce_overhead (GPU), the base compiled with mode reduce-overhead as a comparison row. Rows keep their
    pipelines and profiled forwards (for the capture table and the timeline figure)."""
    from ..variants.builtin import compile_variant
    from ..variants.ladder import LadderSettings
    from ..variants.ladder import run_ladder as _run

    base = base_stack(cfg)
    comparisons = {}
    if cfg.options.reduce_overhead and cfg.device.type == "cuda" and any(s.startswith("compile-") for s in base):
        ro = [compile_variant(cfg.workload.compile_scope, "reduce-overhead") if s.startswith("compile-") else s
              for s in base]
        comparisons["base, compiled with mode reduce-overhead (torch.compile's CUDA graphs)"] = ro
    o = cfg.options
    st = LadderSettings(seed=cfg.seed, warmup=cfg.warmup, repeats=cfg.repeats, e2e=e2e_size(cfg),
                        e2e_repeats=o.e2e_repeats, compile_backend=o.compile_backend, ceilings=ceilings, keep=True)
    from .. import variants

    n_base = len(variants.resolve(base, cfg.workload, cfg.device))  # groups (hygiene) expand to their variants
    return _run(cfg.workload, cfg.preset, base + graph_steps(cfg), device=cfg.device, settings=st, reference=ref,
                from_row=n_base, comparisons=comparisons)


def forward_table(lad) -> pd.DataFrame:
    """Per measured row: forward wall time (median, p20-p80) against the GPU busy time of its kernels, the idle
    share of the forward (1 - busy / wall) and the kernel/graph launches it takes."""
    rows = []
    for r in lad.rows[1:]:
        wall, busy = r.forward.median, r.gpu_busy_ms
        rows.append({"row": r.variant, "gate": r.gate, "forward ms": wall, "p20": r.forward.p20, "p80": r.forward.p80,
                     "GPU busy ms": busy, "wall / busy": wall / busy if busy == busy and busy > 0 else math.nan,
                     "GPU idle share": 1 - busy / wall if busy == busy and wall > 0 else math.nan,
                     "launches / forward": r.launches})
    return pd.DataFrame(rows).set_index("row")


def e2e_table(lad) -> pd.DataFrame:
    """Per measured row: the workload's end-to-end metric (FPS, or ms per DDIM step), first-frame latency
    (streaming), the whole run's seconds (an interaction iteration for the UNet), PSNR against fp32, peak memory."""
    rows = []
    for r in lad.rows[1:]:
        rows.append({"row": r.variant, "gate": r.gate, r.e2e_metric or "e2e": r.e2e_value,
                     "first frame ms": r.e2e_first_frame_ms, "run s": r.e2e_run_s, "frames PSNR dB": r.psnr_db,
                     "peak GiB": r.peak_memory_gib, "first call s": r.first_call_s})
    return pd.DataFrame(rows).set_index("row")


def capture_table(lad) -> pd.DataFrame:
    """What the CUDA-graph rows captured: per graphed callable and input signature, whether a graph exists (or why
    not), eager calls, replays and the graph pool's memory."""
    from ..variants.builtin import graphed_callables

    frames = [g.table().assign(row=r.variant) for r in lad.rows if r.pipeline is not None
              for g in graphed_callables(r.pipeline)]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def plot_timelines(lad, rows=None, span_ms: float | None = None):
    """One profiled forward per row as a timeline: host launch calls above, GPU kernels below (the same time axis,
    from the first launch): a launch-bound forward shows the GPU waiting for the host; a graph replay shows one
    launch and back-to-back kernels."""
    import matplotlib.pyplot as plt

    from ..profiling.analysis.launches import LAUNCH_CALLS
    from ..profiling.trace import Trace

    picked = [r for r in lad.rows[1:] if r.trace is not None and (rows is None or r.variant in rows)]
    fig, axes = plt.subplots(len(picked) or 1, 1, figsize=(12, 1.4 * max(len(picked), 1) + 0.6), squeeze=False)
    for ax, r in zip(axes[:, 0], picked):
        t = Trace.load(r.trace)
        R, K = t.runtime_calls, t.device_activities
        launches = R[R["name"].isin(LAUNCH_CALLS)] if len(R) else R
        t0 = min([x["start_us"].min() for x in (launches, K) if len(x)] or [0.0])
        for y, frame, color in ((1, launches, "#ee6677"), (0, K, "#4477aa")):
            if len(frame):
                ax.broken_barh(list(zip((frame["start_us"] - t0) / 1e3, frame["duration_us"].clip(lower=1) / 1e3)),
                               (y - 0.4, 0.8), color=color, lw=0)
        ax.set_yticks([0, 1], ["GPU kernels", "host launches"])
        ax.set_title(f"{r.variant}: {len(launches)} launches, GPU busy {r.gpu_busy_ms:.3g} ms of a "
                     f"{r.forward.median:.3g} ms forward", fontsize=9, loc="left")
        if span_ms:
            ax.set_xlim(0, span_ms)
    axes[-1, 0].set_xlabel("ms from the forward's first launch (one profiled forward per row)")
    fig.tight_layout()
    return fig


def result_rows(cfg: RunConfig, lad) -> list[dict]:
    """Each measured row's forward time (with its spread), GPU busy time, launches per forward, end-to-end metric,
    first-frame latency, run seconds, PSNR and peak memory, as results rows."""
    from ..variants.ladder import effective

    common = dict(notebook=cfg.notebook, workload=cfg.workload.name, preset=cfg.preset.name, params=cfg.params(),
                  warmup=cfg.warmup, repeats=cfg.repeats)
    out = []
    for r in lad.rows[1:]:
        v = " + ".join(s.name for s in effective(r.stack))
        extra = dict(gate=r.gate, rel_l2_vs_fp32=r.rel_l2_vs_fp32)
        out.append(results_store.make_row(metric="forward_ms", value=r.forward.median, unit="ms", variant=v,
                                          timing=r.forward, **common, **extra))
        for metric, value, unit in (("gpu_busy_ms", r.gpu_busy_ms, "ms"), ("launches_per_forward", r.launches, "count"),
                                    (r.e2e_metric, r.e2e_value, cfg.workload.metric.unit),
                                    ("first_frame_ms", r.e2e_first_frame_ms, "ms"), ("run_s", r.e2e_run_s, "s"),
                                    ("psnr_db", r.psnr_db, "dB"), ("peak_memory_gib", r.peak_memory_gib, "GiB")):
            if metric and value is not None and np.isfinite(value):
                out.append(results_store.make_row(metric=metric, value=float(value), unit=unit, variant=v, **common))
    return out


def interpret(cfg: RunConfig, lad, checks: pd.DataFrame | None = None) -> str:
    """Sentences computed from the measured rows."""
    lines = []
    if checks is not None and len(checks):
        ok = bool(checks["equal"].all() and checks["same cache addresses"].all())
        lines.append(f"Static caches {'give exactly' if ok else 'do NOT give'} what fresh caches give over "
                     f"{int(checks['blocks'].iloc[0])} blocks (the window holds "
                     f"{int(checks['window (latent frames)'].iloc[0])} latent frames), keeping their addresses.")
    f = forward_table(lad)
    if len(f):
        b = f.iloc[0]
        lines.append(f"The base stack's forward takes {b['forward ms']:.3g} ms of wall time"
                     + (f" for {b['GPU busy ms']:.3g} ms of GPU work ({b['wall / busy']:.2f}x; "
                        f"{b['launches / forward']:.0f} launches)" if b["GPU busy ms"] == b["GPU busy ms"] else "")
                     + ".")
        graphs = [i for i in f.index if i.endswith("cuda-graphs")]
        if graphs:
            g = f.loc[graphs[0]]
            lines.append(f"Replayed as CUDA graphs ({g['gate']}): {g['forward ms']:.3g} ms, {g['wall / busy']:.2f}x "
                         f"its GPU busy time of {g['GPU busy ms']:.3g} ms (goal: within 1.10x), "
                         f"{g['launches / forward']:.0f} launches per forward.")
        else:
            lines.append("CUDA-graph capture needs a GPU: on this device the notebook checked the static caches "
                         "only.")
    e = e2e_table(lad)
    if len(e) and cfg.workload.metric.name in e:
        m = cfg.workload.metric
        vals = e[m.name]
        lines.append(f"End to end ({m.label}): " + ", ".join(f"{i}: {v:.3g}" for i, v in vals.items()) + ".")
    if cfg.tiny:
        lines.append("Tiny-preset numbers check the code paths, not the speed of the real model.")
    return " ".join(lines)
