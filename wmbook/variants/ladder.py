"""The cumulative ladder: each row = the previous row + one variant, gated against the fp32 reference.

For one workload and preset the runner builds the fp32 eager reference once and records, on fixed seeded
inputs: one steady-state denoiser forward (the gate's reference output) and a short end-to-end run (frames
for PSNR). Each row then deep-copies the reference pipeline, applies its variants in order, and measures (a row whose
variant leaves the denoiser as it was, Variant.denoiser False, is built on the row before's pipeline instead: its
compiled and captured denoiser kept, which a fresh copy compiles again, most of a minute for a whole UNet on a GPU):

- the gate (wmbook.check.ladder_gate): the same forward against the fp32 reference, within the relative-L2
  budget of the loosest precision in effect and, for rows that do not change precision, no less accurate than
  the eager model at that precision (the seed's max/mean numbers against that eager output are reported);
  a row that fails is shown with its numbers but its time does not count (no speedup);
- forward time: median and p20/p80 over repeats after warm-up (CUDA events), against the FLOP floor;
- end to end: the workload's metric (FPS of a streaming generation, ms per DDIM step of a short iteration) and
  the PSNR of its decoded frames against the reference's;
- peak memory, and for compiled rows the first-call time (the probe's setup and first forward, compilation
  included; a cache hit where the stack compiled ahead: wmbook.variants.compile_ahead) and the recompiles of the
  steady end-to-end runs. wmbook.variants.compile.measure_compile_time gives cold and warm compile time proper.
"""

from __future__ import annotations

import contextlib
import copy
import gc
import math
import time
from dataclasses import dataclass, field, fields

import pandas as pd
import torch
from tqdm.auto import tqdm

from .. import check
from ..bench import Samples, time_fn
from ..check import to_uint8_frames
from ..device import floor_ms
from ..presets import dtype_name
from ..profiling.analysis.launches import LAUNCH_CALLS
from ..profiling.breakdown import kernel_summary, profile_calls
from ..profiling.trace import Trace
from ..workloads import E2ESize, get
from .builtin import captures, graph_calls, warm_up
from .compile import reset_compile_state
from .compile_ahead import check_processes, for_ladder
from .compile_monitor import compile_note
from .compile_monitor import entered as _monitor
from .registry import GlobalFlags, VariantContext, apply_variants, effective, resolve, tolerance_for


@dataclass(frozen=True)
class LadderSettings:
    """How every row is measured."""

    seed: int = 0
    warmup: int = 3
    repeats: int = 10
    e2e: E2ESize = E2ESize()
    e2e_repeats: int = 2
    compile_backend: str = "inductor"
    ceilings: dict | None = None  # measured device ceilings: the FLOP floor the x_floor columns divide by
    # keep each row's forward trace and what its CUDA graphs captured (LadderRow.trace, .captures), and the pipelines
    # of the first measured row (until on_first_row) and the last row (LadderRow.pipeline; others freed: memory)
    keep: bool = False
    compile_ahead: int | str = 0  # processes compiling the rows' stacks ahead (wmbook.variants.compile_ahead)

    def __post_init__(self):
        check_processes(self.compile_ahead)
        for name, v, lo in (("warmup", self.warmup, 0), ("repeats", self.repeats, 1),
                            ("e2e_repeats", self.e2e_repeats, 1), ("e2e.blocks", self.e2e.blocks, 1),
                            ("e2e.ddim_steps", self.e2e.ddim_steps, 1)):
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise ValueError(f"{name}={v!r} is not allowed; allowed values: an integer >= {lo}")


@dataclass
class GateReference:
    """What a row's outputs are gated against: the fp32 reference, and the eager model at the row's precision."""

    forward: object  # the fp32 reference forward's output(s)
    frames: torch.Tensor | None  # the fp32 reference's decoded frames (PSNR)
    same_precision: object = None  # eager output at the row's precision (None: the row changes precision)
    same_precision_rel_l2: float | None = None  # that eager output's error against fp32


@dataclass
class LadderRow:
    """One measured stack of variants (a ladder row or a variant-table row). Times in ms."""

    stack: list
    tolerance: str
    forward: Samples
    flops: float
    gpu_busy_ms: float = math.nan
    launches: float = math.nan  # kernel/graph launch calls per forward (host -> GPU submissions)
    categories: dict = field(default_factory=dict)  # GPU kernel ms per forward by category
    peak_memory_gib: float = math.nan
    first_call_s: float = math.nan
    compiled_ahead_s: float = math.nan  # its stack's cold first call in a process of its own, compiling ahead
    row_s: float = math.nan  # the whole row's wall time: apply, compile, gate, timing, profile, end-to-end runs
    phases_s: dict = field(default_factory=dict)  # seconds per phase of row_s (apply, first call, timing, ...)
    e2e_metric: str = ""
    e2e_value: float = math.nan
    e2e_first_frame_ms: float = math.nan
    e2e_run_s: float = math.nan
    e2e_samples: Samples | None = None  # the timed end-to-end runs' metric values (e2e_value is their median)
    e2e_run_samples: Samples | None = None  # and their seconds (e2e_run_s is their median)
    e2e_first_frame_samples: Samples | None = None  # and their first frames (e2e_first_frame_ms is their median)
    psnr_db: float = math.nan
    gate: str = "reference"
    rel_l2_vs_fp32: float = 0.0
    allowed_rel_l2: float = math.nan
    budget_rel_l2: float = math.nan
    max_rel_same_precision: float = math.nan
    mean_rel_same_precision: float = math.nan
    recompiles: float = math.nan
    graph_breaks: float = math.nan
    decoder: str = ""  # what decoded the row's end-to-end frames: the VAE's dtype and the decoder variants in effect
    note: str = ""
    row: int = 0
    variant: str = ""
    speedup: float = math.nan
    e2e_speedup: float = math.nan
    x_floor: float = math.nan
    busy_x_floor: float = math.nan
    pipeline: object = field(default=None, repr=False)  # with LadderSettings.keep
    captures: list = field(default_factory=list, repr=False)  # with keep: GraphedCallable.table() of each graph
    trace: object = field(default=None, repr=False)  # the profiled forward's chrome trace, with LadderSettings.keep

    @property
    def counts(self) -> bool:
        """Whether its time counts (the gate passed, or it is the reference)."""
        return self.gate in ("pass", "reference")

    def record(self) -> dict:
        """The row as a flat dict (LADDER_COLUMNS order first)."""
        skip = ("stack", "forward", "categories", "flops", "pipeline", "trace", "e2e_samples", "e2e_run_samples")
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in skip}
        d["stack"] = " + ".join(v.name for v in effective(self.stack)) or "-"
        d.update(forward_ms=self.forward.median, forward_p20=self.forward.p20, forward_p80=self.forward.p80)
        for name, smp in (("e2e", self.e2e_samples), ("e2e_run_s", self.e2e_run_samples)):
            d[f"{name}_p20"], d[f"{name}_p80"] = (smp.p20, smp.p80) if smp is not None else (math.nan, math.nan)
        return {c: d.get(c) for c in LADDER_COLUMNS}

    def finish(self, floor_ms: float, base_forward_ms: float | None, base_e2e: float | None, metric) -> None:
        """Speedups over the reference row (only when the time counts) and the distance to the FLOP floor."""
        self.x_floor, self.busy_x_floor = self.forward.median / floor_ms, self.gpu_busy_ms / floor_ms
        self.speedup = base_forward_ms / self.forward.median if self.counts and base_forward_ms else math.nan
        ok = self.counts and base_e2e and self.e2e_value == self.e2e_value
        self.e2e_speedup = metric.speedup(self.e2e_value, base_e2e) if ok else math.nan


LADDER_COLUMNS = [
    "row", "variant", "stack", "gate", "tolerance", "rel_l2_vs_fp32", "allowed_rel_l2", "budget_rel_l2",
    "max_rel_same_precision", "mean_rel_same_precision", "forward_ms", "forward_p20", "forward_p80",
    "speedup", "x_floor", "gpu_busy_ms", "busy_x_floor", "launches", "e2e_metric", "e2e_value", "e2e_p20", "e2e_p80",
    "e2e_speedup", "e2e_first_frame_ms", "e2e_run_s", "e2e_run_s_p20", "e2e_run_s_p80", "psnr_db",
    "peak_memory_gib", "first_call_s", "compiled_ahead_s", "row_s", "recompiles", "graph_breaks", "decoder", "note",
]  # fmt: skip


@dataclass
class Ladder:
    workload: object  # wmbook.workloads.Workload
    preset: str
    rows: list[LadderRow] = field(default_factory=list)
    floor_ms: float = float("nan")
    generation_traces: dict = field(default_factory=dict)  # {row: profiled whole generation} (notebook 06, GPU)
    # {row label: uint8 [T, H, W, 3] frames on the host} of the reference and of the latest row whose frames were
    # judged and passed: what a frame comparer shows (reference vs optimized) without running either again
    frames: dict = field(default_factory=dict)
    compile_ahead: object = None  # wmbook.variants.compile_ahead.Ahead, where the rows' stacks compiled ahead

    def table(self) -> pd.DataFrame:
        return pd.DataFrame([r.record() for r in self.rows], columns=LADDER_COLUMNS).set_index("row")

    def failures(self) -> list[str]:
        """A sentence per row that failed to apply, compile or run (gate "error"; the later rows went on without
        its variant)."""
        return [f"`{r.variant}` failed and has no time: {r.note}." for r in self.rows if r.gate == "error"]

    def categories(self) -> pd.DataFrame:
        """GPU kernel ms per forward by category (rows: ladder rows; empty off CUDA): which kernels each step
        removed and what is left between the row and the FLOP floor."""
        d = pd.DataFrame([r.categories for r in self.rows], index=[r.variant for r in self.rows]).fillna(0.0)
        if d.empty or not len(d.columns):
            return pd.DataFrame()
        return d[d.sum().sort_values(ascending=False).index]

    def plot_categories(self, ax=None):
        """Stacked bars of the categories() table with the FLOP floor as a line."""
        import matplotlib.pyplot as plt  # noqa: PLC0415  heavy: matplotlib.pyplot

        d = self.categories()
        if ax is None:
            _, ax = plt.subplots(figsize=(8, 0.45 * max(len(d), 1) + 1))
        if d.empty:
            ax.text(0.5, 0.5, "no GPU kernel times (CPU run)", ha="center", va="center", transform=ax.transAxes)
            return ax
        d[::-1].plot.barh(stacked=True, ax=ax, width=0.75, colormap="tab10")
        if self.floor_ms == self.floor_ms:
            ax.axvline(self.floor_ms, color="k", ls="--", lw=1, label=f"FLOP floor {self.floor_ms:.1f} ms")
        ax.set_xlabel("GPU kernel ms per forward (by category)")
        ax.legend(fontsize=7, loc="lower right")
        ax.set_title(f"Where the GPU time goes: {self.workload.name} / {self.preset}")
        return ax

    def plot(self, ax=None):
        """Speedup of each row over the eager fp32 reference (forward), rows whose gate failed in grey."""
        import matplotlib.pyplot as plt  # noqa: PLC0415  heavy: matplotlib.pyplot

        t = self.table()
        if ax is None:
            _, ax = plt.subplots(figsize=(8, 0.45 * len(t) + 1))
        ok = t["gate"].isin(["pass", "reference"])
        sp = t["forward_ms"].iloc[0] / t["forward_ms"]
        ax.barh(t["variant"][::-1], sp[::-1], color=["#4477aa" if o else "#cccccc" for o in ok[::-1]])
        for y, (v, o) in enumerate(zip(sp[::-1], ok[::-1])):
            ax.text(v, y, f" {v:.2f}x" + ("" if o else " (gate failed)"), va="center", fontsize=8)
        ax.axvline(1.0, color="k", lw=0.8)
        ax.set_xlabel("forward speedup vs fp32 eager (cumulative: each row adds one variant)")
        ax.set_title(f"Ladder: {self.workload.name} / {self.preset}")
        return ax


# --- the runner ---------------------------------------------------------------------------------------


def run_ladder(workload, preset, steps: list[str], *, device: torch.device, settings: LadderSettings = LadderSettings(),
               reference=None, from_row: int = 1, comparisons: dict | None = None, on_row=None,
               on_first_row=None, before_comparisons=None) -> Ladder:
    """Row 0 is the fp32 eager reference; row i applies steps[:i] (all names checked before any work).

    `reference`: the fp32 reference pipeline, if already built (each row works on a deep copy of it, or on the row
    before's pipeline when its variant leaves the denoiser as it was: its note says "built on the row before").
    `from_row`: measure row 0 and rows from_row.. only (a ladder on top of a known stack: notebook 06 starts at
    notebook 04's best row); the first measured row is gated against the fp32 budget of its precision alone, the
    later ones also against it (no less accurate).
    `comparisons`: {label: stack} measured after the ladder with the last row's gate, shown below it (not
    cumulative: e.g. the same stack with torch.compile's own CUDA graphs instead of ours).
    `on_row(row)`: called with each measured row when it is finished (the notebooks store its rows then: a run cut
    by a time limit or an error keeps them). `on_first_row(ladder)`: once the first measured row is in, its kept
    pipeline as measured; with it that pipeline is not kept after, so the next row may be built on it (else it
    builds afresh: a second compile). `before_comparisons(ladder)`: once the rows are measured, before the comparison
    rows, with the last row's global switches on (notebook 06 profiles a generation there, before torch.compile's own
    CUDA graphs run in the process).
    A row after the first measured one whose variant fails to apply, compile or run (an inductor error, an
    out-of-memory) is kept as a row with gate "error" and the error in its note, and the later rows go on without that
    variant; the reference and the first measured row still raise (nothing to measure against)."""
    if isinstance(from_row, bool) or not isinstance(from_row, int) or from_row < 1:
        raise ValueError(f"from_row={from_row!r} is not allowed; allowed values: an integer >= 1")
    wl = get(workload)
    vs = resolve(steps, wl, device)
    extra = {label: resolve(stack, wl, device) for label, stack in (comparisons or {}).items()}
    preset = wl.presets[preset] if isinstance(preset, str) else preset
    flags = GlobalFlags()
    ref = reference if reference is not None else wl.reference_pipeline(preset, device, settings.seed)
    lad = Ladder(wl, preset.name)
    gate_ref = None
    base_ms = base_e2e = None
    try:
        if from_row > len(vs):
            raise ValueError(f"from_row={from_row} is past the last row ({len(vs)})")
        applied: list = []  # the variants of the last row that ran (a failed row's variant is left out of later rows)
        built = None  # that row's pipeline (_Built)
        keep_first = settings.keep and on_first_row is None
        lad.compile_ahead = ahead = for_ladder(wl, preset, vs, from_row, extra, device, settings,
                                               lambda s, i, b: _afresh(s, i, from_row, b, keep_first))
        for i in tqdm([0, *range(from_row, len(vs) + 1)], desc=f"ladder {wl.name}", leave=False):
            stack = vs[:i] if i <= from_row else [*applied, vs[i - 1]]
            # a variant that leaves the denoiser as it was goes on the row before's pipeline, switches and compiled
            # code (a fresh copy would compile and capture the same denoiser again); a kept first measured row's
            # pipeline stays as measured unless on_first_row has seen it
            if _afresh(stack, i, from_row, None if built is None else built.row, keep_first):
                dropped, built = built is not None, None
                if dropped and device.type == "cuda":
                    gc.collect()  # its graphs hold it in reference cycles: freed before this row builds its own
                    torch.cuda.empty_cache()
                flags.restore()
            changes_precision = i > 0 and (_changes_precision(stack[-1])
                                           or (i == from_row and any(_changes_precision(v) for v in stack)))
            saved = (gate_ref.same_precision, gate_ref.same_precision_rel_l2) if gate_ref is not None else None
            if gate_ref is not None and changes_precision:  # this row is gated against fp32 alone
                gate_ref.same_precision, gate_ref.same_precision_rel_l2 = None, None
            try:  # the reference of a ladder shown from a later row: its frames, not its end-to-end time
                row, out, frames, built = _measure(ref, wl, stack, device, settings, gate_ref,
                                                   e2e="frames" if i == 0 and from_row > 1 else True, base=built)
            except Exception as e:  # noqa: BLE001 - any failure of one later row: recorded, the ladder goes on
                if i <= from_row:
                    raise
                row, out, built = _failed_row(stack, e, device), None, None
                gate_ref.same_precision, gate_ref.same_precision_rel_l2 = saved
            else:
                applied, built.row = stack, i
            if i == 0:
                outs = _outputs(out)
                outs = outs if isinstance(outs, list) else [outs]
                check.require_finite({**{f"forward output {k}": o for k, o in enumerate(outs)}, "frames": frames},
                                     f"the fp32 reference ({wl.name}, {preset.name})")
                gate_ref = GateReference(forward=out, frames=frames, same_precision=out, same_precision_rel_l2=0.0)
                base_ms, base_e2e = row.forward.median, row.e2e_value
            elif changes_precision and row.gate != "error":  # later rows: no less accurate than eager at this precision
                anchor = row.rel_l2_vs_fp32
                if i == from_row and i > 1:  # a stack measured as one row: its eager precision is the anchor
                    anchor = max(anchor, _eager_anchor(ref, wl, stack, device, settings, gate_ref))
                gate_ref.same_precision, gate_ref.same_precision_rel_l2 = out, anchor
            row.row = i
            row.variant = ("fp32 eager (reference)" if i == 0 else "+ " + stack[-1].name if i > from_row or i == 1
                           else stack_label(stack))
            floor = flop_floor_ms(row.flops, settings.ceilings)
            if floor == floor:
                lad.floor_ms = floor
            row.finish(floor, base_ms, base_e2e, wl.metric)
            if ahead is not None:
                ahead.mark(row, stack)
            if frames is not None and (i == 0 or (row.counts and row.psnr_db == row.psnr_db)):
                _keep_frames(lad, row.variant, frames, i == 0)
            for r in lad.rows if row.gate != "error" else []:  # keep the first measured row's (until on_first_row
                if r.row != from_row or on_first_row is not None:  # has seen it) and the latest measured row's only
                    r.pipeline = None
            lad.rows.append(row)
            if on_row is not None and i > 0:
                on_row(row)
            if on_first_row is not None and i == from_row:
                on_first_row(lad)
            del out
            if device.type == "cuda":
                gc.collect()  # graphed callables hold their pipelines in reference cycles
                torch.cuda.empty_cache()
        built = None
        if before_comparisons is not None:  # with the global switches of the last row (tf32, cuDNN benchmark) on
            before_comparisons(lad)
        for label, stack in extra.items():
            flags.restore()
            try:
                row, out, _ = measure(ref, wl, stack, device, settings, gate_ref)
            except Exception as e:  # noqa: BLE001 - a failed comparison is shown as such, like a failed row
                row, out = _failed_row(stack, e, device), None
            row.row, row.variant = len(lad.rows), label
            row.pipeline = None
            row.finish(lad.floor_ms, base_ms, base_e2e, wl.metric)
            if ahead is not None:
                ahead.mark(row, stack)
            lad.rows.append(row)
            if on_row is not None:
                on_row(row)
            del out
    finally:
        flags.restore()
    return lad


def _afresh(stack: list, i: int, from_row: int, built_row: int | None, keep_first: bool) -> bool:
    """Whether row i builds its pipeline afresh rather than adding its variant (one that leaves the denoiser as it
    was) to the row before's (built_row's); keep_first: the first measured row's pipeline stays as it was measured."""
    return not (built_row is not None and i > from_row and not stack[-1].denoiser and stack[-1].family != "compile"
                and not (keep_first and built_row == from_row))


def _failed_row(stack: list, error: BaseException, device: torch.device) -> LadderRow:
    """The row of a stack that failed to apply, compile or run: no times, gate "error", the error in the note."""
    if device.type == "cuda":
        torch.cuda.synchronize()  # raises here if the failure left the device unusable (the ladder cannot go on)
    first = (str(error).strip().splitlines() or [""])[0]
    return LadderRow(stack=list(stack), tolerance=tolerance_for(stack), forward=Samples(), flops=math.nan, gate="error",
                     note=f"{type(error).__name__}: {first[:300]} (left out of the later rows)")


def flop_floor_ms(flops: float, ceilings: dict | None) -> float:
    """The FLOP floor at the measured bf16 GEMM ceiling (NaN without ceilings): what `x_floor` divides by."""
    return floor_ms(flops, ceilings) if ceilings and ceilings.get("gemm_tflops") else float("nan")


def apply_stack(ref, workload, stack, device, compile_backend: str = "inductor"):
    """A deep copy of the reference pipeline with a stack of variants (names or Variants) applied in order, the
    effective compile only: (pipeline, VariantContext)."""
    wl = get(workload)
    vs = resolve(stack, wl, device)  # Variants pass through; names (tools, tests) are looked up here
    pipe = copy.deepcopy(ref)
    return pipe, apply_variants(pipe, wl, vs, device, compile_backend)


def _eager_anchor(ref, workload, stack, device, settings: LadderSettings, gate_ref: GateReference) -> float:
    """The error against fp32 of the eager model at a stack's precision (its precision variants alone): what the
    rows after a stack measured as one row may exceed by at most SAME_PRECISION_MAX_RATIO. The stack's own error is
    not that anchor when it compiles: inductor computes a fused chain in fp32 without the model's intermediate bf16
    roundings (H100, mg2-universal, 665a961: compiled bf16 stack 0.0159 against eager bf16 about 0.0186), so a
    kernel that rounds where the model rounds would fail a gate the eager model passes."""
    eager = [v for v in stack if v.family == "precision"]
    if len(eager) == len(stack):
        return 0.0
    pipe, _ = apply_stack(ref, workload, eager, device, settings.compile_backend)
    with torch.no_grad():
        out = workload.forward_probe(pipe, settings.seed).forward()
    err = check.ladder_gate(_outputs(out), _outputs(gate_ref.forward), dtype=tolerance_for(eager)).vs_fp32.rel_l2
    del pipe, out
    if device.type == "cuda":
        gc.collect()
        torch.cuda.empty_cache()
    return err


def _changes_precision(v) -> bool:
    return v.family == "precision" and v.tolerance is not None


def stack_label(stack) -> str:
    """A row that measures a whole stack at once (a ladder shown from a later row), named so that a table stays narrow:
    the stack itself up to three variants, else its size and last variant (the full stack: the table's `stack`)."""
    names = [v.name for v in stack]
    return " + ".join(names) if len(names) <= 3 else f"base: {len(names)} variants, ... + {names[-1]}"


def _keep_frames(lad: Ladder, label: str, frames: torch.Tensor, reference: bool) -> None:
    """The reference's frames and the latest judged row's, as uint8 on the host (small: one short run each)."""
    if not reference:
        lad.frames = {k: v for k, v in list(lad.frames.items())[:1]}
    lad.frames[label] = to_uint8_frames(frames)


@dataclass
class _Built:
    """A measured row's pipeline, for a next row whose variant leaves the denoiser as it was (Variant.denoiser)."""

    pipe: object
    ctx: VariantContext
    m0: int  # device memory allocated before the pipeline was built: the peak of the rows built on it counts from here
    row: int = 0


def measure(ref, workload, stack, device, settings: LadderSettings, gate_ref: GateReference | None,
            e2e: bool | str = True) -> tuple[LadderRow, object, torch.Tensor | None]:
    """Apply `stack` to a copy of `ref`, gate its forward, time it (and an end-to-end run when `e2e`):
    (row, forward output, decoded frames). e2e="frames": one end-to-end run for its frames only (no warm-up run, no
    end-to-end time on the row): the fp32 reference of a ladder whose tables start at a later row needs its frames
    to gate against, not its time (at wma three fp32 iterations fewer, each about half a minute on an H100)."""
    return _measure(ref, workload, stack, device, settings, gate_ref, e2e)[:3]


def _measure(ref, workload, stack, device, settings: LadderSettings, gate_ref: GateReference | None,
             e2e: bool | str = True, base: _Built | None = None):
    """measure(), and the row's pipeline (_Built) last. `base`: the row before's, to which this row adds its last
    variant (one that leaves the denoiser as it was), in place: its compiled code and graphs are kept."""
    if e2e not in (True, False, "frames"):
        raise ValueError(f"e2e={e2e!r} is not allowed; allowed values: True, False, 'frames'")
    wl = get(workload)
    m0 = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0  # the kept reference is not this row's
    compiled = any(v.family == "compile" for v in stack)
    if compiled and base is None:  # compiled code is cached per code object, across copies: start every compiled row
        reset_compile_state()  # afresh
    t_row = time.perf_counter()
    phases = {}  # seconds per phase of the row: where a slow row's minutes went
    with _phase(phases, "apply"):  # calls: the graphs' calls before a row built on the row before (when kept)
        if base is None:
            (pipe, ctx), calls = apply_stack(ref, wl, stack, device, settings.compile_backend), None
        else:
            pipe, ctx, m0 = base.pipe, base.ctx, base.m0
            calls = graph_calls(pipe) if settings.keep else None
            stack[-1].apply(pipe, ctx)
    mon = _monitor() if compiled else None  # from the first compiled call on
    steady = frames = None
    try:
        with _phase(phases, "first call"):  # compiled rows: the probe's setup (block 0's forwards for mg2) compiles
            probe = wl.forward_probe(pipe, settings.seed)
            with torch.no_grad():
                out = probe.forward()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
        first_call_s = phases["first call"] if compiled else math.nan
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        with _phase(phases, "timing"), torch.no_grad():
            tm = time_fn(probe.forward, warmup=settings.warmup, repeats=settings.repeats, device=device)
        row = LadderRow(stack=list(stack), tolerance=tolerance_for(stack), forward=tm, flops=probe.flops,
                        first_call_s=first_call_s,
                        decoder=decoder_setting(pipe, stack),
                        note="; ".join([*(str(n) for k, n in ctx.notes.items() if not k.startswith("compile:")),
                                        *(["built on the row before, its compiled denoiser kept"] if base else [])]))
        if device.type == "cuda":  # this row's weights, caches and activations
            row.peak_memory_gib = (torch.cuda.max_memory_allocated(device) - m0) / 2**30
        with _phase(phases, "profile"), torch.no_grad():  # kernels alone: the rest is host and launch overhead
            trace = profile_calls(probe.forward, device)
        if trace is not None:  # and kernel time per category (sums overlaps, unlike busy): where the rest goes
            cats = kernel_summary(trace)["categories"]
            row.gpu_busy_ms = cats.attrs["busy_ms"]
            row.categories = dict(zip(cats["category"], cats["ms"]))
            row.launches = launch_count(trace)
        if settings.keep:
            row.trace, row.pipeline = trace, pipe
        del trace
        runs = []
        if e2e == "frames":
            with _phase(phases, "end-to-end frames"):
                frames = wl.end_to_end(pipe, settings.seed, settings.e2e).frames
        elif e2e:
            # end to end: a warm-up run (compiles the shapes the probe did not see; more, shorter ones until the
            # graphs a run calls once are captured), then the timed runs, whose recompiles a second monitor counts
            # (the steady-state count the compile goal is about)
            with _phase(phases, "end-to-end warm-up"):
                short = wl.graph_warmup_size(settings.e2e)
                n = warm_up(pipe, lambda: wl.end_to_end(pipe, settings.seed, settings.e2e),
                            again=lambda: wl.end_to_end(pipe, settings.seed, short))
            if n > 1:
                phases[f"end-to-end warm-up ({n} runs)"] = phases.pop("end-to-end warm-up")
            steady = _monitor() if compiled else None
            with _phase(phases, "end-to-end runs"):
                runs = [wl.end_to_end(pipe, settings.seed, settings.e2e) for _ in range(settings.e2e_repeats)]
    finally:
        for m in (steady, mon):
            if m is not None:
                m.__exit__(None, None, None)
    if settings.keep:  # after the end-to-end runs: what every graph captured and replayed in this row
        row.captures = captures(pipe, calls)
    if runs:
        row.e2e_samples = Samples([float(r.value) for r in runs], runs[0].metric.unit)
        row.e2e_run_samples = Samples([float(r.run_s) for r in runs], "s")
        row.e2e_metric, row.e2e_value, frames = runs[0].metric.name, row.e2e_samples.median, runs[-1].frames
        row.e2e_first_frame_samples = Samples([float(r.first_frame_ms) for r in runs], "ms")
        row.e2e_first_frame_ms = row.e2e_first_frame_samples.median
        row.e2e_run_s = row.e2e_run_samples.median
    if mon is not None:
        row.graph_breaks = int(mon.summary()["graph_breaks"])
        row.recompiles = int((steady if steady is not None else mon).summary()["recompiles"])
        row.note = "; ".join(n for n in (row.note, compile_note(mon.summary())) if n)
    if gate_ref is not None:
        res = check.ladder_gate(_outputs(out), _outputs(gate_ref.forward), dtype=row.tolerance,
                                same_precision_ref=None if gate_ref.same_precision is None
                                else _outputs(gate_ref.same_precision),
                                anchor_rel_l2=gate_ref.same_precision_rel_l2)
        row.gate = "pass" if res.passed else "FAIL"
        row.rel_l2_vs_fp32, row.budget_rel_l2, row.allowed_rel_l2 = (res.vs_fp32.rel_l2, res.budget_rel_l2,
                                                                     res.allowed_rel_l2)
        if res.vs_same_precision is not None:
            row.max_rel_same_precision = res.vs_same_precision.max_rel
            row.mean_rel_same_precision = res.vs_same_precision.mean_rel
        if frames is not None and gate_ref.frames is not None and all(v.frames_judged for v in stack):
            row.psnr_db = check.compare(frames.float(), gate_ref.frames.float(), dtype="fp32", frames=True).psnr
    else:
        row.psnr_db = math.inf
    row.row_s = time.perf_counter() - t_row
    row.phases_s = phases
    return row, _detach(out), frames, _Built(pipe, ctx, m0)


@contextlib.contextmanager
def _phase(phases: dict, name: str):
    """Host seconds of the block as phases[name] (a row's phases: LadderRow.phases_s)."""
    t = time.perf_counter()
    try:
        yield
    finally:
        phases[name] = time.perf_counter() - t


def decoder_setting(pipe, stack) -> str:
    """The decoder a row's frames come from: the VAE's dtype, then the decoder variants in effect ('eager' when
    none)."""
    dt = getattr(pipe, "vae_dtype", None)
    names = [v.name for v in stack if v.family == "decoder"]
    return f"VAE {dtype_name(dt) if dt is not None else '?'}, " + (" + ".join(names) if names else "eager")


def launch_count(trace) -> int:
    """Kernel and graph launch calls (cudaLaunchKernel, cuLaunchKernel, cudaGraphLaunch, ...) in a trace."""
    calls = Trace.load(trace).runtime_calls
    return int(calls["name"].isin(LAUNCH_CALLS).sum()) if len(calls) else 0


def _outputs(out):
    """The tensors the gate compares, in fp32 (a forward returns one tensor, or the UNet's (video, action, state))."""
    if isinstance(out, (tuple, list)):
        return [o.float() for o in out]
    return out.float()


def _detach(out):
    if isinstance(out, (tuple, list)):
        return type(out)(o.detach().clone() for o in out)
    return out.detach().clone()
