"""Notebook 07 (motion-data loading): the per-step reference-motion fetch of thousands of simulated robots (seed 003),
profiled with the seed's recipe, broken down by its stages, then optimized one named variant at a time, every row
gated against a float64 reference, measured against the bytes it must move, and scaled to more robots.

Everything workload-specific comes from the `motion` workload object (wmbook.workloads.motion) and wmbook.motion.
Results rows and interpretation: wmbook.studies.motion_report.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from .. import check
from ..bench import (
    ReplayFloor,
    Samples,
    graph_replay_floor,
    host_launch_ms,
    time_back_to_back,
    time_fn,
    time_in_graph,
    time_once,
)
from ..motion import variants as mvariants
from ..motion.fetch import (
    CALL_STAGES,
    FETCH_LABEL,
    STATE_LABEL,
    STATE_STAGES,
    MotionState,
    get_motion_state,
    no_label,
    sample_queries,
    state_layout,
)
from ..params import (
    DEVICE,
    OUTPUT_DIR,
    PRESET,
    REPEATS,
    RESULTS_PATH,
    SEED,
    WARMUP,
    Param,
    ParameterError,
    integer,
    name_list,
)
from ..profiling import label_table, profile, profile_calls, trace_busy_ms
from ..runconfig import WORKLOAD, NotebookSpec, RunConfig
from ..runconfig import validate as _validate
from ..variants.ladder import launch_count
from .common import compile_backend
from .motion_plots import plot_ladder, plot_scaling

IN_GRAPH_K = 16  # fetches captured in one graph for MotionLadder.in_graph (measure_in_graph)

NOTEBOOK = "07_motion_data_loading"
QUAT_FIELDS = ("root_rot", "body_rot_b")  # q and -q are one rotation: compared after taking the reference's sign


def _steps(v, ctx):
    if v == "auto":
        return None
    steps = name_list(v, ctx)
    if not steps:
        raise ParameterError(f"steps={v!r} is not allowed; allowed values: 'auto' or a comma-separated list of "
                             f"{mvariants.known()}")
    # unknown names list the known ones; GPU-only ones are refused on a CPU
    return tuple(mvariants.resolve(steps, ctx["device"]))


def _scaling_envs(v, ctx):
    if v == "auto":
        return tuple(ctx["preset"].scaling_envs)
    items = [v] if isinstance(v, int) and not isinstance(v, bool) else name_list(v, ctx)
    try:
        envs = tuple(int(x) for x in items)
    except (TypeError, ValueError):
        envs = ()
    if not envs or any(n < 1 for n in envs) or len(set(envs)) != len(envs):
        raise ParameterError(f"scaling_envs={v!r} is not allowed; allowed values: 'auto' (the preset's "
                             f"{list(ctx['preset'].scaling_envs)}) or distinct robot counts >= 1, comma-separated")
    return tuple(sorted(envs))


SPEC = NotebookSpec(NOTEBOOK, (
    Param("workload", "motion", WORKLOAD.check, "motion (reference-motion loading: the workloads with this notebook)"),
    PRESET, DEVICE,
    Param("steps", "auto", _steps, "the ladder after the eager reference, in order; auto: every motion variant that "
          f"runs on the device ({', '.join(mvariants.known())})"),
    Param("scaling_envs", "auto", _scaling_envs, "robot counts of the scaling figure; auto: the preset's"),
    Param("compile_backend", "auto", compile_backend, "auto: inductor on a GPU, aot_eager on a CPU"),
    Param("profile_warmup", 5, integer(0), "profiler schedule: untraced warm-up steps (the seed's --warmup)"),
    Param("profile_active", 10, integer(1), "profiler schedule: traced steps (the seed's --active)"),
    WARMUP.with_default(5), REPEATS.with_default(50), OUTPUT_DIR, RESULTS_PATH, SEED),
    requires=frozenset({"motion"}), quick={"profile_active": 5, "repeats": 20})


def validate(**params) -> RunConfig:
    """Check every notebook-07 parameter before any heavy work; errors name the parameter and allowed values."""
    return _validate(SPEC, **params)


def ladder_steps(cfg: RunConfig) -> list[mvariants.MotionVariant]:
    """The variants the ladder adds after the eager reference, in order."""
    if cfg.options.steps is not None:
        return list(cfg.options.steps)
    return mvariants.resolve(cfg.workload.default_ladder(cfg.device), cfg.device)


# --- the setup: one library, its float64 copy, the robots' clips and times --------------------------------------

@dataclass
class MotionSetup:
    cfg: RunConfig
    library: object  # wmbook.motion.library.MotionLibrary, fp32 on the device
    library64: object  # the same values in float64: the gate's reference
    ceilings: dict

    @property
    def num_envs(self) -> int:
        return self.cfg.options.num_envs

    @property
    def frames_per_env(self) -> int:
        return self.cfg.options.frames_per_env

    def queries(self, num_envs: int):
        """The seeded (motion_ids, episode_times) of `num_envs` robots."""
        return sample_queries(self.library, num_envs, self.cfg.seed)

    def term(self, stack=(), num_envs: int | None = None, ctx=None):
        """A term with `stack` applied, its robots on their seeded clips and times."""
        n = num_envs or self.num_envs
        term = mvariants.apply_stack(stack, self.library, n, self.frames_per_env, self.cfg.preset.step_dt,
                                     ctx or self.context())
        term.reset(*self.queries(n))
        return term

    def context(self):
        return mvariants.MotionContext(device=self.cfg.device, compile_backend=self.cfg.options.compile_backend)

    def bytes_per_step(self, num_envs: int | None = None) -> int:
        from ..motion.kernel import fetch_bytes  # noqa: PLC0415  late: the kernel reads TRITON_INTERPRET on import

        lib = self.library
        width = state_layout(lib.num_joints, lib.num_bodies).width
        return fetch_bytes(num_envs or self.num_envs, self.frames_per_env, lib.num_motions, width,
                           lib.fields["root_pos"].element_size())

    def floor_ms(self, num_envs: int | None = None) -> float:
        """The bytes a step's fetch must move at the measured copy bandwidth (read + write), ms."""
        return self.bytes_per_step(num_envs) / (self.ceilings["copy_gbps"] * 1e9) * 1e3


def setup(cfg: RunConfig, ceilings: dict) -> MotionSetup:
    """The preset's library on the device (generated from the seed), its float64 copy, the measured ceilings."""
    lib = cfg.workload.library(cfg.preset, cfg.device, cfg.seed)
    return MotionSetup(cfg, lib, lib.to(dtype=torch.float64), ceilings)


def library_table(s: MotionSetup) -> pd.DataFrame:
    """The library and one step's work: clips, frames, bytes, robots, queries, bytes a step must move."""
    t = s.library.table()
    extra = {"robots (num_envs)": s.num_envs, "states per robot per step": s.frames_per_env,
             "queries per step": s.num_envs * s.frames_per_env,
             "bytes a step must move (MB)": f"{s.bytes_per_step() / 1e6:.2f}",
             "quaternions": "(x, y, z, w); a quarter of the stored ones negated (same rotation)"}
    return pd.concat([t, pd.DataFrame({"value": {k: str(v) for k, v in extra.items()}})]).rename_axis("quantity")


# --- the seed's profiler recipe, and the stage breakdown -------------------------------------------------------------

def profile_fetch(s: MotionSetup, stack=(), name: str = "07_motion_fetch_trace"):
    """The seed's recipe: torch.profiler with a schedule (profile_warmup untraced steps, then profile_active traced
    ones), shapes recorded, the trace exported (gzip Chrome trace under output_dir; Perfetto or TensorBoard open it).
    Returns the ProfileResult (wmbook.profiling.collect)."""
    term = s.term(stack)
    term.fetch()  # lazy work (the packed tables) outside the trace
    o = s.cfg.options
    return profile(term.fetch, wait=0, warmup=o.profile_warmup, active=o.profile_active, out_dir=s.cfg.output_dir,
                   name=name, record_shapes=True)


def top_operations(prof, cfg: RunConfig, n: int = 15) -> pd.DataFrame:
    """The profiler's key_averages, top `n` by total device time (the seed's table: the labels and the operators; by
    self CPU time on a CPU), in ms per step."""
    df = prof.key_averages()
    steps = cfg.options.profile_active
    df = df[~df["name"].str.startswith("ProfilerStep")]
    key = "device_time_total_us" if cfg.device.type == "cuda" else "self_cpu_time_total_us"
    df = df.sort_values([key, "cpu_time_total_us"], ascending=False).head(n)
    # on a GPU a record_function range is listed twice, as its CPU range and as its GPU annotation (no CPU time)
    names = df["name"].where(~(df["name"].duplicated(keep=False) & (df["cpu_time_total_us"] == 0)),
                             df["name"] + " (GPU annotation)")
    # a templated CUDA kernel's name runs to hundreds of characters and pushed every number off the page (H100
    # report): keep its head, the full names are in the trace
    names = names.where(names.str.len() <= 90, names.str.slice(0, 87) + "...")
    out = pd.DataFrame({"calls / step": df["count"].to_numpy() / steps}, index=pd.Index(names, name="operation"))
    for col, new in (("self_device_time_total_us", "self device ms / step"),
                     ("device_time_total_us", "device ms / step"), ("self_cpu_time_total_us", "self CPU ms / step"),
                     ("cpu_time_total_us", "CPU ms / step")):
        out[new] = df[col].to_numpy() / 1e3 / steps
    if cfg.device.type != "cuda":
        out = out.drop(columns=["self device ms / step", "device ms / step"])
    return out


LEAF_STAGES = ("prepare_query", *STATE_STAGES, "store_buffers")  # the innermost stages, in call order


def stage_table(prof, cfg: RunConfig) -> pd.DataFrame:
    """The seed's labelled stages, per step: host time, device time (README: a label's device time; NaN on a CPU) and
    each stage's share of the whole fetch's host time and device time (an eager fetch on a GPU is host-bound: its
    host shares say where the wall time goes, its device shares where the kernels' time goes)."""
    labels = label_table(prof.trace_path).set_index("label")
    steps = cfg.options.profile_active
    order = [FETCH_LABEL, *CALL_STAGES, STATE_LABEL, *STATE_STAGES]
    depth = {FETCH_LABEL: 0, **dict.fromkeys(CALL_STAGES, 1), STATE_LABEL: 2, **dict.fromkeys(STATE_STAGES, 3)}
    rows = []
    for name in order:
        r = labels.loc[name] if name in labels.index else None
        rows.append({"stage": "  " * depth[name] + name, "label": name,
                     "calls / step": float(r["count"]) / steps if r is not None else 0.0,
                     "host ms / step": float(r["cpu_total_ms"]) / steps if r is not None else 0.0,
                     "device ms / step": float(r["gpu_total_ms"]) / steps if r is not None else math.nan})
    df = pd.DataFrame(rows).set_index("stage")
    for side in ("host", "device"):
        df[f"{side} share"] = df[f"{side} ms / step"] / df[f"{side} ms / step"].iloc[0]
    return df


def plot_stages(stages: pd.DataFrame, ax=None):
    """Horizontal bars: the innermost stages' share of the fetch's host time (and device time, where measured)."""
    import matplotlib.pyplot as plt  # noqa: PLC0415  heavy: matplotlib.pyplot

    leaves = stages.set_index("label").loc[list(LEAF_STAGES)]
    if ax is None:
        _, ax = plt.subplots(figsize=(6.5, 2.8))
    y = np.arange(len(leaves))[::-1]
    sides = [c for c in ("host share", "device share") if leaves[c].notna().any()]
    h = 0.8 / len(sides)
    for i, (c, color) in enumerate(zip(sides, ("#4477AA", "#EE6677"))):
        ax.barh(y - i * h, leaves[c] * 100, height=h, color=color, label=c.replace(" share", " time"))
    ax.set_yticks(y - h * (len(sides) - 1) / 2, leaves.index)
    ax.set_xlabel("% of the fetch")
    ax.set_title("Eager reference: the labelled stages (profiled steps)")
    ax.legend(fontsize=8)
    return ax


# --- the gate ------------------------------------------------------------------------------------------------------

def reference_state(s: MotionSetup, term) -> MotionState:
    """The float64 reference of a term's queries: the eager reference's math on the float64 library, at exactly the
    query times the fp32 term computes."""
    ids, times = term.prepare_query()
    with torch.no_grad():
        return get_motion_state(s.library64, ids, times.double(), no_label)


@dataclass
class StateGate:
    """Every field of a fetched state against the float64 reference (wmbook.check.ladder_gate, fp32 budget)."""

    fields: dict  # name -> check.GateResult

    @property
    def passed(self) -> bool:
        return all(g.passed for g in self.fields.values())

    @property
    def worst(self) -> str:
        return max(self.fields, key=lambda k: self.fields[k].vs_fp32.rel_l2)

    def rel_l2(self) -> dict:
        return {k: g.vs_fp32.rel_l2 for k, g in self.fields.items()}

    def table(self) -> pd.DataFrame:
        return pd.DataFrame({k: {"rel-L2": g.vs_fp32.rel_l2, "allowed": g.allowed_rel_l2, "max abs": g.vs_fp32.max_abs,
                                 "pass": g.passed} for k, g in self.fields.items()}).T.rename_axis("field")


def gate_state(state: MotionState, ref: MotionState, anchors: dict | None = None) -> StateGate:
    """Each field of `state` ([envs, K, ...]) against `ref` ([queries, ...], float64): relative L2 within the fp32
    budget and, given the eager reference's errors (`anchors`), no worse than 1.1x them. Quaternions are compared
    after taking the sign that matches the reference's (q and -q are the same rotation)."""
    out = {}
    for name, r in ref.items():
        x = getattr(state, name).reshape(r.shape).double()
        if name in QUAT_FIELDS:
            x = x * torch.where((x * r).sum(-1, keepdim=True) < 0, -1.0, 1.0)
        out[name] = check.ladder_gate(x, r, dtype="fp32", anchor_rel_l2=(anchors or {}).get(name))
    return StateGate(out)


# --- the ladder ------------------------------------------------------------------------------------------------------

@dataclass
class MotionRow:
    """One measured stack of motion variants (a ladder row, or a scaling point). Times in ms."""

    stack: list
    num_envs: int
    fetch: Samples
    gate: str  # reference | pass | FAIL
    check: StateGate
    floor_ms: float
    bytes: int
    first_call_s: float = math.nan
    gpu_busy_ms: float = math.nan
    host_ms: float = math.nan  # host time to issue one fetch (GPU): wall >> GPU busy with host ~ wall is launch-bound
    loop: Samples | None = None  # ms per fetch issued back to back (bench.time_back_to_back): a training loop's rate
    launches: float = math.nan
    speed_counts: bool = True  # False: the time is not the variant's speed (an interpreter, a reference fallback)
    note: str = ""
    captures: object = None  # the CUDA graph's table (GraphedCallable.table())
    speedup: float = math.nan

    @property
    def name(self) -> str:
        eff = mvariants.effective(self.stack)
        return " + ".join(eff) if eff else "eager"

    @property
    def counts(self) -> bool:
        return self.gate in ("pass", "reference") and self.speed_counts

    @property
    def x_floor(self) -> float:
        return self.fetch.median / self.floor_ms

    @property
    def gbps(self) -> float:
        return self.bytes / (self.fetch.median * 1e-3) / 1e9

    @property
    def loop_x_floor(self) -> float:
        return self.loop.median / self.floor_ms if self.loop is not None else math.nan


@dataclass
class MotionLadder:
    rows: list = field(default_factory=list)
    anchors: dict = field(default_factory=dict)  # the eager reference's error per field (the gate's anchor)
    notes: dict = field(default_factory=dict)
    replay: ReplayFloor | None = None  # a one-kernel CUDA graph's replay cost on this machine (GPU only)
    # the best row's fetch with IN_GRAPH_K fetches captured in one graph: ms per fetch (GPU only), and that stack
    in_graph: Samples | None = None
    in_graph_stack: str = ""
    in_graph_k: int = IN_GRAPH_K

    @property
    def reference(self) -> MotionRow:
        return self.rows[0]

    def best(self) -> MotionRow:
        ok = [r for r in self.rows if r.counts]
        return min(ok, key=lambda r: r.fetch.median)


def measure(s: MotionSetup, stack, num_envs: int | None = None, anchors: dict | None = None,
            notes: dict | None = None, loop_calls: int = 50) -> MotionRow:
    """Build the stack's term, warm it (compile, capture), gate its output against the float64 reference, then time
    `repeats` steps after `warmup` (CUDA events; an interpreted kernel only 3, without warm-up: its time is not a
    speed), then `repeats` rounds of `loop_calls` fetches issued back to back (`loop`: the per-step cost in a loop,
    where
    the host issues a fetch while the GPU runs the last; the one-at-a-time time adds the two); on a GPU also its GPU
    busy time and launches per step from one profiled run of 5 steps."""
    cfg = s.cfg
    ctx = s.context()
    term = s.term(stack, num_envs, ctx)
    with warnings.catch_warnings():
        # inductor suggests TF32 for the compiled fetch's fp32 matmuls; the fetch stays fp32 on purpose (its gate is
        # 1e-5 against float64, TF32's 10-bit mantissa is not), so the suggestion would only clutter the report
        warnings.filterwarnings("ignore", message="TensorFloat32 tensor cores for float32 matrix multiplication")
        first = time_once(term.fetch, cfg.device) / 1e3
    for _ in range(3):  # a CUDA graph: two eager calls, then the capture; every later call replays
        term.fetch()
    ref = reference_state(s, term)
    gate = gate_state(term.fetch(), ref, anchors)
    eff = mvariants.effective(stack)
    slow = cfg.device.type != "cuda" and "triton" in eff
    samples = time_fn(term.fetch, warmup=0 if slow else cfg.warmup, repeats=min(cfg.repeats, 3) if slow
                      else cfg.repeats, device=cfg.device)
    n = term.num_envs
    loop = None if slow else time_back_to_back(term.fetch, calls=loop_calls, rounds=cfg.repeats, warmup=1,
                                               device=cfg.device)
    verdict = "reference" if anchors is None else ("pass" if gate.passed else "FAIL")
    row = MotionRow([str(v) for v in stack], n, samples, verdict, gate, s.floor_ms(n), s.bytes_per_step(n),
                    first_call_s=first, speed_counts=not slow,
                    note="; ".join(v for k, v in ctx.notes.items() if k in eff), loop=loop)
    if cfg.device.type == "cuda":
        row.host_ms = float(np.median([host_launch_ms(term.fetch, cfg.device) for _ in range(cfg.repeats)]))
        trace = profile_calls(term.fetch, cfg.device, calls=5)
        row.gpu_busy_ms = trace_busy_ms(trace) / 5
        row.launches = launch_count(trace) / 5
    graphed = getattr(term._fetch, "table", None)
    if graphed is not None:
        row.captures = graphed()
        fails = [f for f in term._fetch.failures] or ([term._fetch.disabled_reason] if term._fetch.disabled_reason
                                                      else [])
        row.note = "; ".join([row.note, *fails]).strip("; ")
    if notes is not None:
        notes.update(ctx.notes)
    return row


def run_ladder(s: MotionSetup) -> MotionLadder:
    """The eager reference, then each variant of `steps` added in turn; every row gated, timed and set against the
    bytes floor. A row that fails the gate is shown, but its time does not count."""
    lad = MotionLadder()
    steps = ladder_steps(s.cfg)
    for i in tqdm(range(len(steps) + 1), desc="ladder", leave=False):
        row = measure(s, steps[:i], anchors=lad.anchors if i else None, notes=lad.notes)
        if i == 0:
            lad.anchors = row.check.rel_l2()
        lad.rows.append(row)
    ref = lad.reference.fetch.median
    for r in lad.rows:
        r.speedup = ref / r.fetch.median if r.counts else math.nan
    lad.replay = graph_replay_floor(s.cfg.device, rounds=s.cfg.repeats)
    measure_in_graph(s, lad)
    return lad


def measure_in_graph(s: MotionSetup, lad: MotionLadder, k: int = IN_GRAPH_K) -> None:
    """On a GPU, the best row's fetch (its stack without `cuda-graph`) with `k` fetches captured in one CUDA graph
    and replayed back to back (bench.time_in_graph): what a fetch costs inside a larger captured program, e.g. an
    environment step captured whole, where one graph launch serves every kernel of the step. Left out (None) off a
    GPU or when the fetch cannot be captured (the reason goes to lad.notes)."""
    if s.cfg.device.type != "cuda" or not lad.rows:
        return
    best = lad.best()
    stack = [n for n in best.stack if n != "cuda-graph"]
    term = s.term(stack)
    try:
        lad.in_graph = time_in_graph(term._fetch, k, rounds=s.cfg.repeats, device=s.cfg.device)
        lad.in_graph_stack, lad.in_graph_k = " + ".join(mvariants.effective(stack)) or "eager", k
    except Exception as e:  # noqa: BLE001  (a fetch that cannot be captured: say why, keep the ladder)
        torch.cuda.synchronize(s.cfg.device)
        lad.notes["in-graph"] = f"{k} fetches in one graph: capture failed: {type(e).__name__}: {str(e)[:200]}"


def step_floor_ms(s: MotionSetup, lad: MotionLadder) -> float:
    """The least a captured fetch issued once a step can cost in a loop: the larger of the bytes floor and the replay
    floor (one graph replay issued back to back; the bytes floor alone where there is no GPU)."""
    return max(s.floor_ms(), lad.replay.ms) if lad.replay is not None else s.floor_ms()


def ladder_table(lad: MotionLadder) -> pd.DataFrame:
    """One line per row: the stack, the gate (worst field's rel-L2 vs float64), ms per step (p20-p80), speedup, x the
    bytes floor, achieved GB/s, GPU busy ms, host ms to issue a fetch and launches per step (GPU), first call
    (compile, capture), notes."""
    rows = []
    for i, r in enumerate(lad.rows):
        rows.append({"row": i, "added": r.stack[-1] if r.stack else "-", "stack (effective)": r.name, "gate": r.gate,
                     "worst field": r.check.worst, "rel-L2 vs fp64": r.check.fields[r.check.worst].vs_fp32.rel_l2,
                     "fetch ms": r.fetch.median, "p20": r.fetch.p20, "p80": r.fetch.p80,
                     "speedup": r.speedup, "x bytes floor": r.x_floor if r.counts else math.nan,
                     "GB/s": r.gbps if r.counts else math.nan,
                     **{f"in a loop {k}": getattr(r.loop, q) if r.loop is not None else math.nan
                        for k, q in (("ms", "median"), ("p20", "p20"), ("p80", "p80"))},
                     "loop x bytes floor": r.loop_x_floor if r.counts else math.nan,
                     "GPU busy ms": r.gpu_busy_ms, "host ms": r.host_ms,
                     "launches / step": r.launches, "first call s": r.first_call_s, "note": r.note})
    return pd.DataFrame(rows).set_index("row")


def capture_table(lad: MotionLadder) -> pd.DataFrame:
    """What the CUDA-graph rows captured (wmbook.graphs: signatures, replays, graph memory, or why not)."""
    parts = [r.captures.assign(row=r.name) for r in lad.rows if r.captures is not None]
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


def gate_table(lad: MotionLadder) -> pd.DataFrame:
    """Every row's relative L2 error against the float64 reference, field by field (allowed: 1e-5)."""
    return pd.DataFrame({r.name: r.check.rel_l2() for r in lad.rows}).T.rename_axis("stack")


def skipped(cfg: RunConfig) -> pd.DataFrame:
    """The motion variants this device leaves out of the ladder, and why."""
    rows = [{"variant": n, "why": "needs a CUDA device"} for n in mvariants.known()
            if n not in mvariants.known(cfg.device) and cfg.options.steps is None]
    return pd.DataFrame(rows, columns=["variant", "why"])


def floor_table(s: MotionSetup, lad: MotionLadder) -> pd.DataFrame:
    """What one step must move against what the best row achieves: bytes (each query's two frame rows read once and
    its state written once, plus the robots' clip ids and times and the clips' metadata), the measured copy bandwidth
    (read + write), the floor, the best row and the eager reference against it."""
    best, ref = lad.best(), lad.reference
    d = {"bytes per step (MB)": s.bytes_per_step() / 1e6, "measured copy GB/s (read + write)": s.ceilings["copy_gbps"],
         "bytes floor ms": s.floor_ms(), "eager reference ms": ref.fetch.median,
         "eager x floor": ref.x_floor, f"best ({best.name}) ms": best.fetch.median, "best x floor": best.x_floor,
         "best achieved GB/s": best.gbps}
    if lad.replay is not None:
        d |= {"one-kernel graph replay ms, back to back": lad.replay.ms,
              "one-kernel graph replay, host ms to issue": lad.replay.host_ms,
              "step floor ms (the larger floor)": step_floor_ms(s, lad)}
        if best.loop is not None:
            d |= {f"best ({best.name}) in a loop ms": best.loop.median,
                  "best in a loop x step floor": best.loop.median / step_floor_ms(s, lad)}
    if lad.in_graph is not None:
        d |= {f"{lad.in_graph_stack}, {lad.in_graph_k} fetches in one graph: ms per fetch": lad.in_graph.median,
              "in one graph x bytes floor": lad.in_graph.median / s.floor_ms()}
    return pd.DataFrame({"value": d}).rename_axis("quantity")


# --- scaling --------------------------------------------------------------------------------------------------------

def run_scaling(s: MotionSetup, lad: MotionLadder) -> pd.DataFrame:
    """Every ladder row whose time counts, at each robot count of `scaling_envs` (gated again at each count): ms per
    step with its spread, the bytes floor there, x floor."""
    rows = []
    todo = [(r, n) for n in s.cfg.options.scaling_envs for r in lad.rows if r.counts]
    for r, n in tqdm(todo, desc="scaling", leave=False):
        m = measure(s, r.stack, n, anchors=None if not r.stack else lad.anchors)
        row = {"stack": r.name, "num_envs": n, "queries": n * s.frames_per_env, "gate": m.gate,
               "fetch ms": m.fetch.median, "p20": m.fetch.p20, "p80": m.fetch.p80, "bytes floor ms": m.floor_ms,
               "x bytes floor": m.x_floor, "GB/s": m.gbps, "us per robot": m.fetch.median * 1e3 / n}
        if "triton" in r.stack and s.cfg.device.type == "cuda":  # what the kernel's autotune picked at this count
            from ..motion.kernel import tuned_config  # noqa: PLC0415  late: the kernel reads TRITON_INTERPRET on import

            tc = tuned_config(n * s.frames_per_env)
            row["kernel config"] = f"{tc['BLOCK_Q']} queries x {tc['num_warps']} warps" if tc else ""
        rows.append(row)
    return pd.DataFrame(rows)


def scaling_slopes(scaling: pd.DataFrame) -> pd.DataFrame:
    """How cost grows with robots, per stack and interval: the log-log slope (0: flat, launch-bound; 1: linear,
    bandwidth-bound)."""
    out = []
    for stack, g in scaling.groupby("stack", sort=False):
        g = g.sort_values("num_envs")
        pts = g[["num_envs", "fetch ms"]].to_numpy()
        for (n0, t0), (n1, t1) in zip(pts[:-1], pts[1:]):
            out.append({"stack": stack, "from robots": int(n0), "to robots": int(n1), "time x": t1 / t0,
                        "slope": math.log(t1 / t0) / math.log(n1 / n0)})
    return pd.DataFrame(out)


__all__ = ["IN_GRAPH_K", "MotionLadder", "MotionRow", "MotionSetup", "SPEC", "StateGate", "capture_table",
           "floor_table", "gate_state", "gate_table", "ladder_steps", "ladder_table", "library_table", "measure",
           "plot_ladder", "plot_scaling", "plot_stages", "profile_fetch", "reference_state", "run_ladder",
           "run_scaling", "scaling_slopes", "setup", "skipped", "stage_table", "step_floor_ms", "top_operations",
           "validate"]
