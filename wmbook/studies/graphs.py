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
from .. import variants
from ..params import DEVICE, OUTPUT_DIR, PRESET, REPEATS, RESULTS_PATH, SEED, WARMUP, Param, boolean, choice, integer
from ..profiling.analysis.launches import LAUNCH_CALLS, steady_idle, union_ms
from ..profiling.analysis.roofline import account_sentence, category_account
from ..profiling.collect import profile_calls
from ..profiling.trace import Trace
from ..runconfig import WORKLOAD, NotebookSpec, RunConfig
from ..runconfig import validate as _validate
from ..variants import Variant
from ..variants.builtin import compile_variant
from ..variants.ladder import LadderSettings, apply_stack, effective
from ..variants.ladder import run_ladder as _run
from ..workloads import E2ESize
from . import decoder as dstudy
from .common import COMPILE_AHEAD, compile_backend, e2e_blocks, variant_stack

NOTEBOOK = "06_cuda_graphs"


def check_e2e(cfg: RunConfig) -> None:
    """The end-to-end run's blocks fit the preset (notebooks 05 and 06)."""
    cfg.workload.check_e2e(cfg.preset, "e2e_blocks", e2e_size(cfg), cfg.device)


def _e2e_repeats(v, ctx):
    return integer(0)(v, ctx) or (3 if ctx["device"].type == "cuda" else 2)


# the end-to-end run of every ladder row (notebooks 05 and 06); checked against the preset by check_e2e
E2E_PARAMS = (
    Param("e2e_blocks", 0, e2e_blocks, "blocks per end-to-end run (causal DiT); 0: 4 on a GPU, 3 on a CPU"),
    Param("e2e_ddim_steps", 0, integer(0), "DDIM steps per pass in the end-to-end run (UNet); 0: the preset's "
          "default (50 at the real shape: seconds per interaction iteration)"),
    Param("e2e_repeats", 0, _e2e_repeats, "timed end-to-end runs per row (their median with p20-p80); 0: 3 on a "
          "GPU, 2 on a CPU"),
)


def _reduce_overhead(v, ctx):
    """auto: measured where the workload compiles regionally (mg2: one DiT block's graph, a compile of seconds), left
    out where it compiles the whole denoiser (wma): there the row is a cold compile of the whole UNet (252 s on the
    H200, NOTES.md) whose forward equalled the cuda-graphs row's (44.90 ms both; its iteration 5.25 s against 4.74:
    what mg2's row shows too, at a compile of seconds); True measures it anyway."""
    v = choice("auto", True, False)(v, ctx)
    return ctx["workload"].compile_scope == "regional" if isinstance(v, str) else bool(v)


SPEC = NotebookSpec(NOTEBOOK, (
    WORKLOAD, PRESET, DEVICE,
    Param("base", "auto", variant_stack(), "the stack the graph rows build on; auto: notebook 04's best (its ladder + "
          "compile), on a GPU with notebook 05's denoiser kernels"),
    Param("steps", "auto", variant_stack(), "the rows added to the base, in order; auto: static caches, ring KV "
          "caches, CUDA graphs, then the decoder's (bf16, stream buffers, channels-last, compile, graphs)"),
    Param("reduce_overhead", "auto", _reduce_overhead, "also measure the base with torch.compile mode "
          "reduce-overhead (GPU); auto: where the workload compiles regionally (mg2), not where it compiles the "
          "whole denoiser (wma: minutes of compile for the row)"),
    Param("decoder_table", True, boolean, "the decoder rows (the same latents through each decoder stack)"),
    Param("compile_backend", "auto", compile_backend, "auto: inductor on a GPU, aot_eager on a CPU"),
    WARMUP.with_default(3), REPEATS.with_default(10), *E2E_PARAMS, COMPILE_AHEAD,
    OUTPUT_DIR, RESULTS_PATH, SEED), workload_params=False, cross_check=check_e2e,
    # reduce-overhead compiles the whole denoiser once more (minutes at wma's real shape)
    quick={"reduce_overhead": False, "warmup": 2, "repeats": 5, "e2e_repeats": 1},
    builds_on=("04_compile_autocast", "05_triton_kernels"))


def validate(**params) -> RunConfig:
    """Check every notebook-06 parameter before any heavy work; errors name the parameter and allowed values."""
    return _validate(SPEC, **params)


def e2e_size(cfg: RunConfig) -> E2ESize:
    steps = cfg.options.e2e_ddim_steps or getattr(cfg.preset, "default_steps", 5)
    return E2ESize(blocks=cfg.options.e2e_blocks, ddim_steps=steps)


def best_of_04(cfg: RunConfig) -> list[Variant]:
    """Notebook 04's best stack: its default ladder, then compile in the workload's scope (notebook 05's base)."""
    names = [*cfg.workload.default_ladder(cfg.device, None), compile_variant(cfg.workload.compile_scope)]
    return variants.resolve(names, cfg.workload, cfg.device)


# notebook 05's rows that change the denoiser's kernels, not its precision: on a GPU notebook 06 builds on them (it
# builds on the best rows of notebook 04, and of 05 where it ran). As graph rows they would cost a compile of the whole
# denoiser each (minutes per row at the real shapes); in the base they are compiled once. vae-triton-fused (the
# decoder), fp8 and attn-sage (low precision, comparison rows of notebook 05) are not among them, nor are fused-qkv and
# attn-cudnn (no faster inside this stack on the H200, NOTES.md). ffn-gelu-epilogue is: 19.2 -> 18.6 ms a forward in it;
# so is action-norm-rope: a steady block 144.3 -> 141.0 ms in notebook 06's stack; so is upsample-fold (wma): an
# iteration at DDIM 2+2 240.6 -> 238.5 ms in it; so is norm-conv-bias (wma): 238.1 -> 232.4 ms; so is
# frames-norm-triton (wma): 218.5 -> 213.1 ms (H200, NOTES.md). geglu-gemm is not: 218.3 -> 219.8 ms in the same stack.
DENOISER_KERNELS = ("triton-fused", "norm-conv-bias", "head-conv-gemm", "upsample-fold", "frames-norm-triton",
                    "ffn-gelu-epilogue", "action-norm-rope")

# the comparison row that keeps notebook 04's best stack alone (the goal's baseline) where the base differs from it:
# on a GPU the base adds notebook 05's kernels; a `base` given as a parameter may also fold rows in (e.g. wma's
# skip-unused-decode + skip-unused-heads, which cost a compile of the whole UNet each as rows of their own)
BEST_OF_04 = "notebook 04's best stack alone (the goal's baseline)"


def denoiser_kernels(cfg: RunConfig) -> list[Variant]:
    """DENOISER_KERNELS that apply to the workload, on a GPU (on a CPU the kernels run in Triton's interpreter)."""
    if cfg.device.type != "cuda":
        return []
    known = variants.known(cfg.workload)
    return variants.resolve([k for k in DENOISER_KERNELS if k in known], cfg.workload, cfg.device)


def base_stack(cfg: RunConfig) -> list[Variant]:
    """The stack the graph rows build on: `base`, or notebook 04's best with notebook 05's denoiser kernels (on a GPU,
    where they apply) before its compile."""
    if cfg.options.base is not None:
        return list(cfg.options.base)
    best = best_of_04(cfg)
    return [*best[:-1], *denoiser_kernels(cfg), best[-1]]


# what the graph rows add after the base stack, in order, where they apply (`gpu`: only on a CUDA device): static state
# first, then the captured denoiser; the workload's decoder rows follow (Workload.decoder_ladder). decode-overlap (the
# decode on a second stream) is not among them: it cannot follow vae-compile (its error says why); pass `steps` to add
# it (variant, GPU only). skip-unused-encode, constant-conditioning (wma: the observed frame it drops not encoded, the
# text tokens computed once) and skip-unused-heads (wma: each pass runs only the head it is read for; its flags stay out
# of the compiled graphs: swaps.SkippableHead) on a GPU only, to keep the CPU run short; after the denoiser's graphs
# (wma) the encoder in bf16, the image tokens and the encoder compiled (the conditioning 14.4 -> 5.7 ms an iteration on
# the H200, NOTES.md), then captured too (conditioning-cuda-graphs). After the decoder rows, the
# rows that change when frames leave, not what is computed
# (FRAME_STEPS): decode-first (each block decoded before its cache refresh, a forward sooner) and stream-frames (each
# latent frame's pixels handed out when decoded): the same frames, an earlier first frame. Between the two, on a GPU,
# graph-memset-kernels (GRAPH_TAIL): every graph so far captured again with its small memsets as kernel nodes (the
# wma iteration at DDIM 2+2 209.2 -> 208.0 ms, the mg2 DiT forward 20.4 -> 20.2 ms on the H200, NOTES.md).
# Notebook 05's kernels are in the base on a GPU (DENOISER_KERNELS).
GRAPH_STEPS = (("static-caches", False), ("ring-kv-cache", False), ("skip-unused-decode", False),
               ("skip-unused-encode", True), ("constant-conditioning", True), ("skip-unused-heads", True),
               ("cuda-graphs", True), ("vae-encoder-bf16", True), ("conditioning-compile", True),
               ("conditioning-cuda-graphs", True))
GRAPH_TAIL = (("graph-memset-kernels", True),)
FRAME_STEPS = ("decode-first", "stream-frames")


def graph_steps(cfg: RunConfig) -> list[Variant]:
    """What the graph rows add, in order (GRAPH_STEPS that apply to the workload and run on the device, then the
    workload's decoder rows, GRAPH_TAIL, then FRAME_STEPS that apply), or the `steps` parameter when given."""
    if cfg.options.steps is not None:
        return list(cfg.options.steps)
    known = variants.known(cfg.workload)
    steps = [n for n, gpu in GRAPH_STEPS if n in known and (cfg.device.type == "cuda" or not gpu)]
    steps += cfg.workload.decoder_ladder(cfg.device)
    steps += [n for n, gpu in GRAPH_TAIL if n in known and (cfg.device.type == "cuda" or not gpu)]
    steps += [n for n in FRAME_STEPS if n in known]
    return variants.resolve(steps, cfg.workload, cfg.device)


def stand_in_row(cfg: RunConfig, base: list[Variant]) -> dict[str, list[Variant]]:
    """{label: stack} of the comparison row with the workload's stand-in decoder (Workload.stand_in_decoder: the tiny
    decoder, compiled) after the captured denoiser, where the workload has one and `steps` is not given: the loop's
    end-to-end rate once the decoder costs what the tiny one does. Its frames need the stand-in's real weights."""
    stand_in = cfg.workload.stand_in_decoder(cfg.device)
    if not stand_in or cfg.options.steps is not None:
        return {}
    dec = set(cfg.workload.decoder_ladder(cfg.device))
    denoiser = [v for v in graph_steps(cfg) if v.name not in dec]
    return {"captured denoiser + the tiny decoder, compiled (random weights: frames not judged)":
            base + denoiser + variants.resolve(stand_in, cfg.workload, cfg.device)}


CACHE_STACKS = (("static-caches",), ("ring-kv-cache",), ("static-caches", "ring-kv-cache"))


def static_cache_check(cfg: RunConfig, blocks: int | None = None) -> pd.DataFrame:
    """The cache variants against fresh dynamic caches (the reference): for each stack of CACHE_STACKS that applies,
    two generations (two seeds) through one pipeline with more blocks than the KV window holds (so the reference
    evicts and the ring wraps), compared with the reference's latents (max abs difference, bit-equal or not) and
    whether the caches kept their addresses across the generations (what a CUDA-graph replay needs). The ring reads
    its keys in slot order, not time order, so it may differ from the reference by fp32 rounding once it wraps.
    Empty for a workload without cross-call state."""
    wl = cfg.workload
    known = variants.known(wl)
    stacks = [s for s in CACHE_STACKS if all(n in known for n in s)]
    if not stacks:
        return pd.DataFrame()
    ref = wl.pipeline(cfg.preset, cfg.device, torch.float32, torch.float32, cfg.seed)
    p = cfg.preset
    n = blocks or p.kv_capacity_frames() // p.num_frame_per_block + 2
    rows = []
    with torch.no_grad():
        expected = {seed: ref.generate(ref.prepare(n, seed=seed), progress=False, decode=False).latents
                    for seed in (cfg.seed, cfg.seed + 1)}
        for stack in stacks:
            pipe, _ = apply_stack(ref, wl, variants.resolve(stack, wl, cfg.device), cfg.device)
            ptr = None
            for seed, a in expected.items():
                inputs = pipe.prepare(n, seed=seed)
                seen = []
                pipe.init_cache = _spy(pipe.init_cache, seen)  # the generation's caches, for their addresses
                b = pipe.generate(inputs, progress=False, decode=False).latents
                del pipe.init_cache
                now = seen[0].kv[0].k.data_ptr()
                diff = (a.float() - b.float()).abs()
                rows.append({"caches": " + ".join(stack), "generation seed": seed, "blocks": n,
                             "window (latent frames)": p.kv_capacity_frames(), "max abs diff": float(diff.max()),
                             "max rel diff": float(diff.max() / a.float().abs().max()),
                             "equal": bool(torch.equal(a, b)), "same cache addresses": ptr is None or now == ptr})
                ptr = now
    return pd.DataFrame(rows).set_index(["caches", "generation seed"])


def _spy(fn, seen: list):
    def init_cache(*args, **kwargs):
        cache = fn(*args, **kwargs)
        seen.append(cache)
        return cache

    return init_cache


def comparison_rows(cfg: RunConfig, base: list[Variant]) -> dict[str, list[Variant]]:
    """{label: stack} of the rows measured beside the ladder: notebook 04's best stack alone (BEST_OF_04, the 2x
    goal's baseline) on a GPU wherever the base differs from it (notebook 05's kernels, or a `base` parameter that
    folds rows in); with reduce_overhead (GPU), the base compiled with mode reduce-overhead; the stand-in decoder's
    row (stand_in_row)."""
    comparisons = {}
    best = best_of_04(cfg)
    if cfg.device.type == "cuda" and base != best:
        comparisons[BEST_OF_04] = best
    if cfg.options.reduce_overhead and cfg.device.type == "cuda" and any(v.family == "compile" for v in base):
        ro = variants.get(compile_variant(cfg.workload.compile_scope, "reduce-overhead"), cfg.workload)
        comparisons["base, compiled with mode reduce-overhead (torch.compile's CUDA graphs)"] = [
            ro if v.family == "compile" else v for v in base]
    comparisons.update(stand_in_row(cfg, base))
    return comparisons


def run_ladder(ref, cfg: RunConfig, ceilings: dict | None):
    """The base stack (one row), then each graph step (static caches, CUDA graphs), gated against fp32; with
    reduce_overhead (GPU), the base compiled with mode reduce-overhead as a comparison row (comparison_rows). Rows
    keep their profiled forwards (for the capture table and the timeline figure). Each row's results rows are stored
    as soon as it is measured (store_each_row). The profiled whole generations (generation_traces, in
    `ladder.generation_traces`): the base row's as soon as it is measured, so the next row can be built on its
    pipeline instead of compiling the denoiser again; the last row's before the comparison rows (profiling a
    generation after the reduce-overhead row, inductor's own CUDA graphs in the process, ended the notebook's kernel
    on an H100; profiling it before never did)."""
    base = base_stack(cfg)
    comparisons = comparison_rows(cfg, base)
    o = cfg.options
    st = LadderSettings(seed=cfg.seed, warmup=cfg.warmup, repeats=cfg.repeats, e2e=e2e_size(cfg),
                        e2e_repeats=o.e2e_repeats, compile_backend=o.compile_backend, ceilings=ceilings, keep=True,
                        compile_ahead=o.compile_ahead)

    def first(lad):  # the base row's generation, before the next row is built on its pipeline (no second compile)
        lad.generation_traces = generation_traces(lad, cfg, which=(0,))

    def last(lad):
        lad.generation_traces.update(generation_traces(lad, cfg, which=(-1,), skip=lad.generation_traces))

    return _run(cfg.workload, cfg.preset, base + graph_steps(cfg), device=cfg.device, settings=st, reference=ref,
                from_row=len(base), comparisons=comparisons, on_row=store_each_row(cfg), on_first_row=first,
                before_comparisons=last)


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
    (streaming), the whole run's seconds (an interaction iteration for the UNet), each the median of the timed runs
    with their p20-p80, PSNR against fp32 (none for a stand-in decoder with random weights: `frames judged` False),
    peak memory."""
    rows = []
    for r in lad.rows[1:]:
        m, rec = r.e2e_metric or "e2e", r.record()  # the record holds the runs' p20-p80
        rows.append({"row": r.variant, "gate": r.gate, m: r.e2e_value, f"{m} p20": rec["e2e_p20"],
                     f"{m} p80": rec["e2e_p80"], "first frame ms": r.e2e_first_frame_ms, "run s": r.e2e_run_s,
                     "run s p20": rec["e2e_run_s_p20"], "run s p80": rec["e2e_run_s_p80"], "frames PSNR dB": r.psnr_db,
                     "frames judged": all(v.frames_judged for v in r.stack),
                     "peak GiB": r.peak_memory_gib, "first call s": r.first_call_s})
    return pd.DataFrame(rows).set_index("row")


def capture_table(lad) -> pd.DataFrame:
    """What the CUDA-graph rows captured: per graphed callable and input signature, whether a graph exists (or why
    not), eager calls, replays and the graph pool's memory."""
    frames = [t.assign(row=r.variant) for r in lad.rows for t in r.captures]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def plot_timelines(lad, rows=None, span_ms: float | None = None):
    """One profiled forward per row as a timeline: host launch calls above, GPU kernels below (the same time axis,
    from the first launch): a launch-bound forward shows the GPU waiting for the host; a graph replay shows one
    launch and back-to-back kernels."""
    import matplotlib.pyplot as plt  # noqa: PLC0415  heavy: matplotlib.pyplot

    picked = [r for r in lad.rows[1:] if r.trace is not None and (rows is None or r.variant in rows)]
    # one shared time axis: the rows are compared by how long their forward is, so every lane keeps the same scale
    fig, axes = plt.subplots(len(picked) or 1, 1, figsize=(12, 1.4 * max(len(picked), 1) + 0.6), squeeze=False,
                             sharex=True)
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


def row_results(cfg: RunConfig, r) -> list[dict]:
    """One measured ladder row's forward time (with its spread, and the row's notes: what its variants did, its
    recompiles and graph breaks), GPU busy time, launches per forward, end-to-end metric, first-frame latency, run
    seconds, PSNR, peak memory, its first call's and the whole row's seconds (the note adds each phase's), and its GPU
    kernel ms per forward by category (`category_ms:<category>`, a GPU run's profiled forward: what the kernel goals
    of notebook 05 count), as results rows."""
    common = dict(notebook=cfg.notebook, workload=cfg.workload.name, preset=cfg.preset.name, params=cfg.params(),
                  warmup=cfg.warmup, repeats=cfg.repeats)
    v = " + ".join(s.name for s in effective(r.stack))
    extra = dict(gate=r.gate, rel_l2_vs_fp32=r.rel_l2_vs_fp32)
    if r.gate == "error":  # a row that failed (ladder._failed_row): the failure is the result, with no time
        return [results_store.make_row(metric="forward_ms", value=float("nan"), unit="ms", variant=v, note=r.note,
                                       **common, **extra)]
    phases = ", ".join(f"{k} {s:.0f}" for k, s in (r.phases_s or {}).items())
    note = "; ".join(n for n in (r.note, f"seconds: {phases}" if phases else "") if n)
    out = [results_store.make_row(metric="forward_ms", value=r.forward.median, unit="ms", variant=v,
                                  timing=r.forward, note=note or None, **common, **extra)]
    for metric, value, unit, timing in (
            ("gpu_busy_ms", r.gpu_busy_ms, "ms", None), ("launches_per_forward", r.launches, "count", None),
            (r.e2e_metric, r.e2e_value, cfg.workload.metric.unit, r.e2e_samples),
            ("first_frame_ms", r.e2e_first_frame_ms, "ms", r.e2e_first_frame_samples),
            ("run_s", r.e2e_run_s, "s", r.e2e_run_samples),
            ("psnr_db", r.psnr_db, "dB", None), ("peak_memory_gib", r.peak_memory_gib, "GiB", None),
            # where a row's minutes go (a compiled row's can be many): its first call (the compile, for compiled
            # rows) and the whole row
            ("first_call_s", r.first_call_s, "s", None), ("compiled_ahead_s", r.compiled_ahead_s, "s", None),
            ("row_s", r.row_s, "s", None)):
        if metric and value is not None and np.isfinite(value):
            out.append(results_store.make_row(metric=metric, value=float(value), unit=unit, variant=v, timing=timing,
                                              **common))
    for cat, ms in (r.categories or {}).items():
        if ms is not None and np.isfinite(ms):
            out.append(results_store.make_row(metric=f"category_ms:{cat}", value=float(ms), unit="ms", variant=v,
                                              **common))
    return out


def store_each_row(cfg: RunConfig):
    """The ladder's on_row callback of notebooks 05 and 06: each finished row's results rows appended to the run's
    results file at once (atomically), so a run cut by its time limit or an error keeps every row it measured."""
    def on_row(r):
        results_store.append(row_results(cfg, r), cfg.results_path)

    return on_row


def skipped_graphs(lad) -> list[str]:
    """A sentence per row whose notes say that inductor declined to capture its CUDA graphs (torch.compile's
    reduce-overhead row; wmbook.variants.builtin notes the reason from inductor's log)."""
    return [f"`{r.variant}`: {part}." for r in lad.rows[1:] for part in (r.note or "").split("; ")
            if "skipped its CUDA graphs" in part]


GOAL_STEADY_IDLE = 0.05  # notebook 06: GPU idle inside a steady block (mg2, H100)
# notebook 06's other goals are the workload's (Workload.goals): "fps" (the causal DiT at the real shape, the full
# decoder counted) and "run_speedup" (a workload timed per step: its whole run against notebook 04's best stack)
GOAL_RUN_SPEEDUP = 2.0  # when a workload names no run_speedup


def interpret(cfg: RunConfig, lad, checks: pd.DataFrame | None = None, idle: pd.DataFrame | None = None,
              ceilings: dict | None = None) -> str:
    """Sentences computed from the measured rows (`ceilings`: the rate of the best row's matrix work against them)."""
    lines = []
    if checks is not None and len(checks):
        for stack, c in checks.groupby(level="caches", sort=False):
            addr = "kept" if c["same cache addresses"].all() else "did not keep"
            same = ("exactly what fresh dynamic caches give" if c["equal"].all() else
                    f"what fresh dynamic caches give within {c['max rel diff'].max():.1e} (relative to the largest "
                    f"latent; the ring sums attention in slot order)")
            lines.append(f"`{stack}`: {int(c['blocks'].iloc[0])} blocks (the window holds "
                         f"{int(c['window (latent frames)'].iloc[0])} latent frames) give {same}; the caches {addr} "
                         f"their addresses across generations.")
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
    lines += skipped_graphs(lad) + lad.failures()
    e = e2e_table(lad)
    if len(e) and cfg.workload.metric.name in e:
        m = cfg.workload.metric
        vals = e[m.name].dropna()
        lines.append(f"End to end ({m.label}): " + ", ".join(f"{i}: {v:.3g}" for i, v in vals.items()) + ".")
        ok = e[e["gate"].isin(["pass", "reference"]) & e["frames judged"]][m.name].dropna()  # the goal counts the
        goal_fps = cfg.workload.goals.get("fps")  # full decoder: a stand-in's rate is told apart below
        if goal_fps and m.higher_is_better and len(ok) and not cfg.tiny:
            best = ok.idxmax()
            lines.append(f"The best gated row, `{best}`, streams at {ok[best]:.3g} FPS: "
                         + (f"the {goal_fps:.0f} FPS goal is met." if ok[best] >= goal_fps else
                            f"short of the {goal_fps:.0f} FPS goal, which needs a steady block in "
                            f"{12 / goal_fps * 1e3:.0f} ms."))
            r = next((r for r in lad.rows if r.variant == best and r.categories), None)  # where the rest is held
            if r is not None:
                lines.append(account_sentence(f"One forward of `{best}`", category_account(
                    r.categories, cfg.workload.flops_by_category(cfg.preset), ceilings)))
        if not m.higher_is_better and not cfg.tiny:
            lines += _run_goal(e, f, lad.categories(), cfg.workload.goals.get("run_speedup", GOAL_RUN_SPEEDUP))
        stand_in = e[e["gate"].isin(["pass"]) & ~e["frames judged"]][m.name].dropna()
        for row, v in stand_in.items():
            lines.append(f"With the stand-in decoder instead (`{row}`; random weights, so its frames are not judged "
                         f"and it does not count toward the goal): {v:.3g} {m.unit}.")
    if idle is not None and len(idle):
        lines.append("GPU idle share of a whole run (first to last kernel): "
                     + ", ".join(f"{i}: {r['GPU idle share']:.1%} over {r['streams']} stream(s)"
                                 for i, r in idle.iterrows()) + ".")
        if "steady GPU idle share" in idle:
            st = idle["steady GPU idle share"].dropna()
            if len(st):
                last = st.index[-1]
                lines.append("Inside the steady blocks (the first block left out): "
                             + ", ".join(f"{i}: {v:.1%}" for i, v in st.items())
                             + f"; `{last}` {'meets' if st[last] < GOAL_STEADY_IDLE else 'misses'} the goal of "
                             f"under {GOAL_STEADY_IDLE:.0%}.")
    if cfg.tiny:
        lines.append("Tiny-preset numbers check the code paths, not the speed of the real model.")
    return " ".join(lines)


def _run_goal(e: pd.DataFrame, f: pd.DataFrame, categories: pd.DataFrame | None = None,
              goal: float = GOAL_RUN_SPEEDUP) -> list[str]:
    """The whole run's seconds of the best gated row against notebook 04's best stack (goal): its
    comparison row (BEST_OF_04) where the base added notebook 05's kernels, else the base row; and, where that
    row's forward already replays at its GPU busy time, what is left: GPU work, not launches, with the GPU busy time
    a forward would need and where that row's GPU time goes (`categories`: Ladder.categories(), a GPU run's)."""
    runs = e["run s"].dropna()
    ok = e[e["gate"].isin(["pass", "reference"]) & e["frames judged"]]["run s"].dropna()
    if BEST_OF_04 in e.index and BEST_OF_04 not in runs.index:  # the base holds kernels; the baseline row failed
        return [f"`{BEST_OF_04}` gave no run time (see its row), so the {goal:g}x goal is not judged."]
    if BEST_OF_04 in runs.index:
        base, what = runs[BEST_OF_04], "notebook 04's best stack, measured in this run"
        ok = ok.drop(BEST_OF_04, errors="ignore")
        if not len(ok):
            return []
    elif len(ok) >= 2:
        base, what = ok.iloc[0], "the base stack (notebook 04's best)"
    else:
        return []
    best = ok.idxmin()
    sp = base / ok[best]
    out = [f"The best gated row, `{best}`, takes {ok[best]:.3g} s for the whole run against {base:.3g} s for "
           f"{what}: {sp:.2f}x, "
           + ("meeting the goal of " if sp >= goal else "short of the goal of ") + f"{goal:g}x."]
    if sp < goal and best in f.index and f.loc[best, "wall / busy"] <= 1.10:
        r = f.loc[best]
        out.append(f"Its forward replays at {r['wall / busy']:.2f}x its GPU busy time of {r['GPU busy ms']:.3g} ms: "
                   f"what is left is GPU work, so the rest of the way is fewer or cheaper kernels (notebook 05's "
                   f"kernels and low precision) or fewer forwards (notebook 03's step counts), not launches.")
        need = r["GPU busy ms"] * (base / goal) / ok[best]  # the run scales with its GPU work
        row = categories.loc[best] if categories is not None and best in categories.index else pd.Series(dtype=float)
        total, top = row.sum(), row[row > 0].sort_values(ascending=False).head(4)
        out.append(f"At the same share of the run, the goal needs about {need:.3g} ms of GPU work per forward"
                   + (": its GPU time goes to " + ", ".join(f"{c} {ms:.3g} ms ({ms / total:.0%})"
                                                            for c, ms in top.items())
                      if len(top) else "") + ".")
    return out


# --- whole generations before and after: GPU idle and the streams
# ------------------------------------------------------


TRACE_DDIM_STEPS = 10  # DDIM steps per pass of a profiled whole generation (UNet workloads)


def trace_size(cfg: RunConfig) -> E2ESize:
    """The end-to-end size of a profiled whole generation: the timed runs' blocks, at most TRACE_DDIM_STEPS DDIM
    steps per pass. Every step repeats the same kernels, so the idle share needs few of them; a 50-step wma run
    under the profiler is ~280,000 kernels for the compiled base row, and its trace took the notebook's kernel
    down (H100, 665a961, after 916 s)."""
    size = e2e_size(cfg)
    return E2ESize(blocks=size.blocks, ddim_steps=min(size.ddim_steps, TRACE_DDIM_STEPS))


def generation_traces(lad, cfg: RunConfig, which=(0, -1), skip=()) -> dict:
    """One profiled end-to-end run (warm) of the measured rows whose pipelines are kept, picked by `which` (their
    indices among them), at trace_size: {row: trace}; rows named in `skip` are left out."""
    rows = [r for r in lad.rows[1:] if r.pipeline is not None]
    picked = {id(rows[i]): rows[i] for i in which if rows and -len(rows) <= i < len(rows)}
    out = {}
    size = trace_size(cfg)
    for r in picked.values():
        if r.variant in skip:
            continue
        run = lambda: cfg.workload.end_to_end(r.pipeline, cfg.seed, size)  # noqa: E731
        run()
        tr = profile_calls(run, cfg.device)
        if tr is not None:
            out[r.variant] = tr
    return out


def generation_idle(traces: dict, labels=None) -> pd.DataFrame:
    """Per profiled run: its span from first to last GPU kernel, the GPU busy time (the union over every stream),
    the idle share, the streams used and the kernel/graph launches; with a workload's `labels` that name a repeated
    unit (a streaming block), also the idle share inside the steady units (launches.steady_idle: the first block
    left out)."""
    rows = []
    for name, tr in traces.items():
        t = Trace.load(tr)
        K = t.device_activities
        K = K[K["kind"] == "kernel"] if "kind" in K and (K["kind"] == "kernel").any() else K
        span = (K["end_us"].max() - K["start_us"].min()) / 1e3
        busy = union_ms(K["start_us"].to_numpy(), K["end_us"].to_numpy())
        R = t.runtime_calls
        row = {"row": name, "span ms": span, "GPU busy ms": busy, "GPU idle share": 1 - busy / span,
               "streams": int(K["stream"].nunique()),
               "launches": int(R["name"].isin(LAUNCH_CALLS).sum()) if len(R) else 0}
        if labels is not None and getattr(labels, "unit", ""):
            st = steady_idle(t, labels.unit, labels.unit_skip)
            row.update({"steady blocks": st["steady_units"], "steady span ms": st["span_ms"],
                        "steady GPU idle share": st["idle_share"]})
        rows.append(row)
    return pd.DataFrame(rows).set_index("row") if rows else pd.DataFrame()


def plot_generation_timelines(traces: dict):
    """Each profiled run's GPU kernels on a time axis, one lane per CUDA stream: gaps are GPU idle time; with the
    decode on a second stream its kernels run beside the DiT's."""
    import matplotlib.pyplot as plt  # noqa: PLC0415  heavy: matplotlib.pyplot

    fig, axes = plt.subplots(len(traces) or 1, 1, figsize=(12, 1.2 + 1.1 * max(len(traces), 1)), squeeze=False,
                             sharex=True)  # before and after on one time scale
    for ax, (name, tr) in zip(axes[:, 0], traces.items()):
        K = Trace.load(tr).device_activities
        t0 = K["start_us"].min()
        streams = sorted(K["stream"].unique(), key=str)
        for y, s in enumerate(streams):
            k = K[K["stream"] == s]
            ax.broken_barh(list(zip((k["start_us"] - t0) / 1e3, k["duration_us"].clip(lower=1) / 1e3)), (y - 0.4, 0.8),
                           color="#4477aa" if y == 0 else "#ee6677", lw=0)
        ax.set_yticks(range(len(streams)), [f"stream {s}" for s in streams], fontsize=7)
        ax.set_title(name, fontsize=9, loc="left")
    axes[-1, 0].set_xlabel("ms from the run's first kernel (one warm end-to-end run per row)")
    fig.tight_layout()
    return fig


# --- the decoder rows -------------------------------------------------------------------------------------------------


def decoder_study(cfg: RunConfig, ref, ceilings: dict | None):
    """The decoder table (wmbook.studies.decoder) on the reference's own latents: (table, rows); empty for a
    workload without a decoder table or with decoder_table off."""
    stacks = dstudy.decoder_stacks(cfg.workload, cfg.device) if cfg.options.decoder_table else {}
    if not stacks:
        return pd.DataFrame(), []
    lat = cfg.workload.decoder_latents(ref, cfg.seed, e2e_size(cfg))
    rows = dstudy.run_decoder_table(ref, cfg.workload, lat, stacks, warmup=1, repeats=max(2, cfg.repeats // 3),
                                    compile_backend=cfg.options.compile_backend)
    return dstudy.decoder_table(rows, cfg.workload.decoder_flops(cfg.preset), ceilings), rows
