"""Notebook 03 (step-count reduction): sweep the sampler's step counts and solvers of a workload, time every point,
measure how far its output moves from the model's own full-step output and, for a trained world preset, its quality
against ground truth; name the knee point (fewest forwards within a quality budget) per curve; draw the frontier;
results rows.

What is swept comes from the workload (`Workload.step_axis()`, wmbook.pipelines.solvers): the UNet's DDIM step counts
per pass against diffusers' DPM-Solver++ 2M and UniPC, and each pass alone; the causal DiT's nominal step lists per
block under the re-noising reference, the flow-matching Euler ODE and UniPC, and other warps (shift). Nothing here
branches on a workload's name.

Definitions used in the tables and rows:
- full-step run: the reference sampler at the preset's settings (DDIM at `default_steps` per pass; the re-noising
  sampler on the preset's step list and shift), same pipeline, same seeded inputs.
- deviation: decoded frames of a point against the full-step run's (PSNR, data range 2 for frames in [-1, 1]; rel-L2)
  and, for the UNet, the decision pass's action chunk (rel-L2). With random weights this is solver error only: how
  far fewer steps (or another solver) move the sample, not whether the image is good.
- quality (trained world presets only): wmbook.world.eval on held-out episodes: PSNR/SSIM of predicted vs true frames,
  the agent's position error; the budget compares a point's PSNR with the full-step run's.
- knee: per curve, the point with the fewest denoiser forwards whose quality is within `quality_budget_db` of the
  full-step run (with ground truth), else whose deviation PSNR is at least `deviation_budget_db` (without).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from .. import results as results_store
from .. import workloads
from ..bench import Samples
from ..check import compare, require_finite
from ..display import headless
from ..params import (
    DEVICE,
    DTYPE,
    OUTPUT_DIR,
    PRESET,
    REPEATS,
    RESULTS_PATH,
    SEED,
    VAE_DTYPE,
    WARMUP,
    WEIGHTS,
    Param,
    ParameterError,
    boolean,
    integer,
    name_list,
    number,
)
from ..pipelines.solvers import SampleRun, StepPoint
from ..presets import dtype_name
from ..runconfig import WORKLOAD, NotebookSpec, RunConfig
from ..runconfig import validate as _validate
from ..variants.builtin import warm_up
from ..variants.ladder import apply_stack
from ..workloads import E2ESize
from ..world.weights import file_sha256, is_world_preset, weights_path
from .common import compile_backend, variant_stack
from .step_notes import timing_noise_note, widest_equal_work

NOTEBOOK = "03_step_reduction"


def _quiet(progress: bool) -> bool:
    """tqdm's `disable`: off when asked, and in headless report runs (wmbook.run), whose TQDM_DISABLE an explicit
    `disable=False` would override."""
    return not progress or headless()


def _solvers(v, ctx):
    axis = ctx["workload"].step_axis()
    if v == "auto":
        return tuple(axis.solvers)
    items = name_list(v, ctx)
    bad = [s for s in items if s not in axis.solvers]
    if not items or bad:
        raise ParameterError(f"solvers={v!r} is not allowed for workload {ctx['workload'].name!r}; allowed values: "
                             f"'auto' or a comma-separated subset of {list(axis.solvers)}")
    return tuple(dict.fromkeys(items))


def _steps(v, ctx):
    return ctx["workload"].step_axis().parse_steps(v, ctx["preset"], ctx["_name"])


def _shifts(v, ctx):
    return ctx["workload"].step_axis().parse_shifts(v, ctx["preset"], ctx["_name"])


def _eta(v, ctx):
    return ctx["workload"].step_axis().parse_eta(v, ctx["preset"], ctx["_name"])


def _cross_check(cfg: RunConfig) -> None:
    axis = cfg.workload.step_axis()
    if cfg.options.blocks:
        if axis.has_passes:
            raise ParameterError(f"blocks={cfg.options.blocks!r} applies to streaming workloads only; for workload "
                                 f"{cfg.workload.name!r} leave it at 0")
        cfg.workload.check_e2e(cfg.preset, "blocks", E2ESize(blocks=cfg.options.blocks), cfg.device)


SPEC = NotebookSpec(NOTEBOOK, (
    WORKLOAD, PRESET, WEIGHTS, DEVICE, DTYPE, VAE_DTYPE,
    Param("solvers", "auto", _solvers, "auto: every solver of the workload (wma: ddim, dpmsolver++, unipc; mg2: "
          "renoise, euler, unipc); or a comma-separated subset"),
    Param("sampling_steps", "auto", _steps, "auto: the workload's grid (wma: DDIM 50,30,20,16,10,5 and 20,10,5 for "
          "the others, every count down to 1 at a tiny preset; mg2: 8 evenly spaced steps, 1000,750,500,250;"
          "1000,666,333;1000,500;1000); wma: comma-separated counts per pass; mg2: step lists separated by ';'"),
    Param("shifts", "auto", _shifts, "mg2: extra flow-matching shifts for the reference solver; auto: 3,8 | none | "
          "comma-separated numbers; wma: auto only"),
    Param("split_passes", True, boolean, "wma: also sweep each pass alone (DDIM, the other at full steps; counts up "
          "to 20); no effect for mg2"),
    Param("eta", "auto", _eta, "wma: the DDIM eta of every DDIM point; auto: the preset's (1: fresh noise every "
          "step, as upstream); 0 makes DDIM deterministic; mg2: auto only"),
    Param("blocks", 0, integer(0), "mg2: blocks per generation; 0: the preset's default"),
    Param("quality_budget_db", 0.2, number(0.0, 100.0), "knee with ground truth: PSNR loss against the full-step "
          "run's PSNR allowed"),
    Param("agent_budget_px", 2.0, number(0.0, 1e6), "knee with ground truth: also an agent-position error at most this "
          "many px above the full-step run's; 0: not part of the budget"),
    Param("deviation_budget_db", 30.0, number(0.0, 200.0), "knee without ground truth: the smallest PSNR of a point's "
          "frames against the full-step run's frames (solver error)"),
    Param("quality_cases", 2, integer(1), "held-out episodes per point (trained world presets only)"),
    Param("base", "none", variant_stack("none", empty=False), "none: the eager pipeline at dtype; or a variant stack "
          "(e.g. notebook 06's best) applied to the fp32 reference, dtype then is the stack's"),
    Param("compile_backend", "auto", compile_backend, "for a base stack with compile; auto: inductor on a GPU, "
          "aot_eager on a CPU"),
    WARMUP.with_default(1), REPEATS.with_default(3), OUTPUT_DIR, RESULTS_PATH, SEED),
    workload_params=False, cross_check=_cross_check,
    # the trained presets: the frames against ground truth and the shipped step count
    set_runs=({"workload": "mg2", "preset": "world-mg2"}, {"workload": "wma", "preset": "world-wma"}),
    quick={"quality_cases": 1, "repeats": 2})


def validate(**params) -> RunConfig:
    """Check every notebook-03 parameter before any heavy work; errors name the parameter and allowed values."""
    return _validate(SPEC, **params)


# --- the sweep -------------------------------------------------------------------------------------------------


def axis(cfg: RunConfig):
    return cfg.workload.step_axis()


def points(cfg: RunConfig) -> list[StepPoint]:
    """Every point of the sweep, the full-step reference first."""
    ax, o = axis(cfg), cfg.options
    ref = ax.reference(cfg.preset, o.eta)
    pts = ax.points(cfg.preset, o.solvers, o.sampling_steps, o.shifts, o.split_passes, o.eta)
    return [ref] + [p for p in dict.fromkeys(pts) if p != ref]


def points_table(cfg: RunConfig) -> pd.DataFrame:
    ax = axis(cfg)
    rows = [{"curve": p.group, "point": p.label, "solver": p.solver, ax.forwards_label: ax.forwards(p),
             "sampling kwargs": json.dumps(ax.kwargs(p))} for p in points(cfg)]
    return pd.DataFrame(rows)


def build(cfg: RunConfig):
    """(pipeline, inputs): the eager pipeline at the run's dtypes, or the fp32 reference with the `base` stack."""
    wl = cfg.workload
    if cfg.options.base is None:
        pipe = wl.pipeline(cfg.preset, cfg.device, cfg.dtype, cfg.vae_dtype, cfg.seed)
    else:
        ref = wl.reference_pipeline(cfg.preset, cfg.device, cfg.seed)
        pipe, _ = apply_stack(ref, wl, cfg.options.base, cfg.device, cfg.options.compile_backend)
    return pipe, axis(cfg).prepare(pipe, cfg.seed, cfg.options.blocks)


@dataclass
class PointResult:
    point: StepPoint
    forwards: int
    metric: Samples  # the workload's metric over the timed runs (s per iteration, or FPS)
    run_ms: Samples  # whole run, device events
    frames: torch.Tensor
    actions: torch.Tensor | None
    deviation: dict = field(default_factory=dict)  # psnr, rel_l2 of frames (and action_rel_l2) vs the full-step run
    quality: dict | None = None  # psnr, ssim, agent_err_px (mean over held-out cases)


@dataclass
class Sweep:
    cfg: RunConfig
    reference: PointResult
    results: list[PointResult]
    quality_note: str = ""
    copy_last: dict | None = None  # the copy-last-frame baseline's quality
    weights_sha256: str | None = None  # a trained world preset's weights file (shipped or `weights`)
    dtype: str = ""  # the pipeline's denoiser dtype (a base stack sets its own)

    @property
    def axis(self):
        return axis(self.cfg)

    @property
    def has_quality(self) -> bool:
        return self.reference.quality is not None


def round_order(n: int, rep: int, seed: int = 0) -> list[int]:
    """The order of the points in round `rep` of a sweep: as listed in round 0, a seeded shuffle in later rounds."""
    order = list(range(n))
    if rep:
        np.random.default_rng([seed, rep]).shuffle(order)
    return order


@torch.no_grad()
def run_sweep(cfg: RunConfig, pipe, inputs, progress: bool = True) -> Sweep:
    """Warm-up (`warmup` untimed runs of the full-step reference, then runs of the shortest point until the graphs a
    run calls once are captured: builtin.warm_up; every point runs the same shapes), then `repeats`
    rounds over all points, one timed run of each point per round (device events; round-robin, so a drift of the
    machine's speed spreads over every point instead of favouring the last ones), the points in the listed order in
    the first round and in a seeded shuffle of it in each later one, so that an effect of a point's place in the round
    shows as its spread rather than as a bias of one point. A seeded run repeats its outputs exactly: the first
    round's are kept, each checked finite. Then each point's deviation from the full-step run."""
    ax = axis(cfg)
    pts = points(cfg)
    shortest = min(pts, key=ax.forwards)  # the same shapes: it finishes capturing the graphs a run calls once
    with tqdm(total=cfg.warmup, desc="warm-up", leave=False, disable=_quiet(progress)) as bar:
        warm_up(pipe, lambda: (ax.run(pipe, inputs, pts[0]), bar.update()), cfg.warmup,
                again=lambda: (ax.run(pipe, inputs, shortest), bar.update()))
    runs: dict[int, list[SampleRun]] = {i: [] for i in range(len(pts))}
    with tqdm(total=len(pts) * cfg.repeats, desc="sweep points x repeats", disable=_quiet(progress)) as bar:
        for rep in range(cfg.repeats):
            for i in round_order(len(pts), rep, cfg.seed):
                p = pts[i]
                r = ax.run(pipe, inputs, p)
                if rep == 0:
                    require_finite({"frames": r.frames, "actions": r.actions}, f"{p.label} ({cfg.preset.name})")
                else:  # keep the outputs of the first round only
                    r.frames = r.actions = None
                runs[i].append(r)
                bar.update()
    out = [PointResult(p, ax.forwards(p), Samples([r.value for r in runs[i]], ax.unit),
                       Samples([r.run_ms for r in runs[i]], "ms"), runs[i][0].frames, runs[i][0].actions)
           for i, p in enumerate(pts)]
    ref = out[0]
    for r in out:
        r.deviation = deviation(r, ref)
        finest = max((x for x in out if x.point.group == r.point.group), key=lambda x: x.forwards)
        r.deviation["psnr_vs_finest"] = compare(r.frames, finest.frames, frames=True, data_range=2.0).psnr
    return Sweep(cfg, ref, out, dtype=dtype_name(getattr(pipe, "dtype", cfg.dtype)))


def deviation(r: PointResult, ref: PointResult) -> dict:
    """Frames (PSNR, rel-L2) and actions (rel-L2, max abs) of a point against the full-step run (wmbook.check)."""
    c = compare(r.frames, ref.frames, frames=True, data_range=2.0)
    d = {"psnr": c.psnr, "rel_l2": c.rel_l2, "max_abs": c.max_abs}
    if r.actions is not None and ref.actions is not None:
        a = compare(r.actions, ref.actions)
        d |= {"action_rel_l2": a.rel_l2, "action_max_abs": a.max_abs}
    return d


# --- quality against ground truth (trained world presets) ----------------------------------------------------


def world_eval():
    """wmbook.world.eval, or (None, why not)."""
    try:
        from ..world import eval as weval  # noqa: PLC0415  optional: a broken wmbook.world.eval skips the section
    except Exception as e:  # noqa: BLE001 - not there yet, or broken: the section says why and skips
        return None, f"wmbook.world.eval is not available ({type(e).__name__}: {e})"
    return weval, ""


@torch.no_grad()
def quality(cfg: RunConfig, pipe, sweep: Sweep, progress: bool = True) -> str:
    """Each point's quality against ground truth on `quality_cases` held-out episodes (mean), and the copy-last-frame
    baseline, filled into the sweep; returns a sentence saying what was done or why it was skipped."""
    weval, why = world_eval()
    if weval is None:
        sweep.quality_note = f"Quality against ground truth skipped: {why}."
    elif not weval.is_world_preset(cfg.preset.name):
        sweep.quality_note = (f"Quality against ground truth skipped: `{cfg.preset.name}` is not a trained world "
                              f"preset (random weights: there is no ground truth to compare with).")
    else:
        ax = axis(cfg)
        kw = {"num_blocks": cfg.options.blocks} if cfg.options.blocks else {}  # streaming workloads only
        cases = [weval.heldout_case(cfg.workload, pipe, cfg.seed + 1000 + i, **kw)
                 for i in range(cfg.options.quality_cases)]
        base = [weval.score(weval.copy_last(c), c) for c in cases]
        sweep.copy_last = {k: float(np.mean([b[k] for b in base])) for k in base[0]}
        for r in tqdm(sweep.results, desc="quality", disable=_quiet(progress)):
            scores = [weval.score(weval.predict(cfg.workload, pipe, c, **ax.kwargs(r.point)), c) for c in cases]
            r.quality = {k: float(np.mean([s[k] for s in scores])) for k in scores[0]}
        w = cfg.options.get("weights")  # a WeightsFile (its SHA-256 taken at validation) or None: the shipped file
        sweep.weights_sha256 = (w.sha256 if w is not None else
                                file_sha256(weights_path(cfg.preset)) if is_world_preset(cfg.preset) else None)
        sweep.quality_note = (f"Quality against ground truth: {len(cases)} held-out episode(s) of `{cfg.preset.name}` "
                              f"(seeds {cfg.seed + 1000}...), mean per point"
                              + (f", with the weights `{w}`, not the shipped file." if w is not None else
                                 f", with the shipped weights (sha256 {sweep.weights_sha256[:16]})."
                                 if sweep.weights_sha256 else "."))
    return sweep.quality_note


# --- tables ----------------------------------------------------------------------------------------------------


def table(sweep: Sweep) -> pd.DataFrame:
    """One row per point: forwards, time (median, p20, p80), speedup over the full-step run, deviation, quality."""
    ax, ref = sweep.axis, sweep.reference
    rows = []
    for r in sweep.results:
        m = r.metric
        speed = m.median / ref.metric.median if ax.higher_is_better else ref.metric.median / m.median
        row = {"curve": r.point.group, "point": r.point.label, "forwards": r.forwards,
               f"{ax.metric} median": m.median, f"{ax.metric} p20": m.p20, f"{ax.metric} p80": m.p80,
               "speedup": speed, "psnr vs full (dB)": r.deviation.get("psnr"),
               "rel-L2 vs full": r.deviation.get("rel_l2"),
               "psnr vs curve's finest (dB)": r.deviation.get("psnr_vs_finest")}
        if "action_rel_l2" in r.deviation:
            row["actions rel-L2 vs full"] = r.deviation["action_rel_l2"]
        if r.quality is not None:
            row |= {"PSNR vs truth (dB)": r.quality.get("psnr"), "SSIM": r.quality.get("ssim"),
                    "agent error (px)": r.quality.get("agent_err_px"),
                    # positive: the point is closer to the truth than the full-step run (fewer steps can blur toward it)
                    "PSNR change vs full steps (dB)": r.quality["psnr"] - ref.quality["psnr"]}
        rows.append(row)
    return pd.DataFrame(rows)


def _within(sweep: Sweep, r: PointResult) -> bool:
    o = sweep.cfg.options
    if sweep.has_quality:
        ok = r.quality["psnr"] >= sweep.reference.quality["psnr"] - o.quality_budget_db
        if o.agent_budget_px > 0:  # NaN (no visible agent) fails
            ok = ok and r.quality["agent_err_px"] <= sweep.reference.quality["agent_err_px"] + o.agent_budget_px
        return ok
    return r.deviation["psnr"] >= o.deviation_budget_db


def criterion(sweep: Sweep) -> str:
    o = sweep.cfg.options
    if sweep.has_quality:
        s = f"PSNR against ground truth within {o.quality_budget_db:g} dB of the full-step run"
        return s + (f", agent error within {o.agent_budget_px:g} px of it" if o.agent_budget_px > 0 else "")
    return f"frames within {o.deviation_budget_db:g} dB PSNR of the full-step run's (solver error)"


def knee_table(sweep: Sweep) -> pd.DataFrame:
    """Per curve: the point with the fewest forwards that meets the budget (ties: the faster), or none."""
    tab = table(sweep)
    ax = sweep.axis
    rows = []
    for group in dict.fromkeys(r.point.group for r in sweep.results):
        idx = [i for i, r in enumerate(sweep.results) if r.point.group == group]
        ok = [i for i in idx if _within(sweep, sweep.results[i])]
        row = {"curve": group, "points": len(idx), "criterion": criterion(sweep)}
        if ok:
            best = min(ok, key=lambda i: (sweep.results[i].forwards, -tab.loc[i, "speedup"]))
            t = tab.loc[best]
            row |= {"knee": t["point"], "forwards": int(t["forwards"]), f"{ax.metric}": t[f"{ax.metric} median"],
                    "speedup": t["speedup"], "psnr vs full (dB)": t["psnr vs full (dB)"]}
            if sweep.has_quality:
                row["PSNR change vs full steps (dB)"] = t["PSNR change vs full steps (dB)"]
        else:
            row["knee"] = "none within budget"
        rows.append(row)
    return pd.DataFrame(rows)


# --- figure ----------------------------------------------------------------------------------------------------


def plot_frontier(sweep: Sweep):
    """Speed against deviation (and against quality with ground truth), one line per curve, the knee starred."""
    import matplotlib.pyplot as plt  # noqa: PLC0415  heavy: matplotlib.pyplot

    tab = table(sweep)
    knees = set(knee_table(sweep).get("knee", pd.Series(dtype=str)))
    panels = [("psnr vs full (dB)", "PSNR of frames vs the full-step run (dB)")]
    if sweep.has_quality:
        panels.append(("PSNR vs truth (dB)", "PSNR vs ground truth (dB)"))
    fig, axes = plt.subplots(1, len(panels), figsize=(6.2 * len(panels), 4.2), squeeze=False)
    finite = tab["psnr vs full (dB)"].replace([np.inf], np.nan)
    top = max(np.nanmax(finite) if finite.notna().any() else 0.0, sweep.cfg.options.deviation_budget_db)
    cap = top + 5.0  # where identical frames (PSNR inf: the full-step run itself) are drawn
    for (col, ylabel), ax in zip(panels, axes[0]):
        labelled = set()  # one forwards label per spot: the curves' points of equal work sit on top of each other
        for group, g in tab.groupby("curve", sort=False):
            g = g.sort_values(["forwards", "speedup"], ascending=[False, True])
            y = g[col].replace([np.inf], cap)
            ax.plot(g["speedup"], y, marker="o", label=group)
            for _, row in g.iterrows():
                yy = cap if row[col] == np.inf else row[col]
                spot = (row["forwards"], round(float(np.log(max(row["speedup"], 1e-9))) * 8), round(float(yy)))
                if spot not in labelled:
                    labelled.add(spot)
                    ax.annotate(str(row["forwards"]), (row["speedup"], yy), fontsize=7, xytext=(3, 3),
                                textcoords="offset points")
                if row["point"] in knees:
                    ax.plot(row["speedup"], yy, marker="*", ms=15, color="k", ls="none")
        if col == "psnr vs full (dB)":
            ax.axhline(cap, color="0.7", lw=0.8, ls=":")
            ax.text(ax.get_xlim()[1], cap, "identical to the full-step run ", fontsize=7, va="bottom", ha="right")
            if not sweep.has_quality:
                ax.axhline(sweep.cfg.options.deviation_budget_db, color="r", lw=1, ls="--", label="budget")
        else:
            ax.axhline(sweep.reference.quality["psnr"] - sweep.cfg.options.quality_budget_db, color="r", lw=1,
                       ls="--", label="budget")
            if sweep.copy_last is not None:
                ax.axhline(sweep.copy_last["psnr"], color="0.5", lw=1, ls="-.", label="copy last frame")
        ax.set_xlabel(f"speedup over the full-step run ({sweep.axis.metric_label})")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"Speed-quality frontier, {sweep.cfg.workload.name} `{sweep.cfg.preset.name}`\n(numbers: "
                 f"{sweep.axis.forwards_label}; star: knee)", fontsize=10)
    fig.tight_layout()
    return fig


# --- rows and interpretation -------------------------------------------------------------------------------------


def _variant(p: StepPoint) -> str:
    return f"steps:{p.label}"


def result_rows(sweep: Sweep) -> list[dict]:
    """Per point: the time metric (median, spread), speedup, deviation and quality; per curve: the knee. Each row's
    params carry the sampling keyword arguments (`sampling`) and the base stack, so a later notebook can stack it."""
    cfg, ax = sweep.cfg, sweep.axis
    tab = table(sweep)
    base = "+".join(v.name for v in cfg.options.base) if cfg.options.base else "eager"
    run_params = cfg.params() | {"dtype": sweep.dtype or dtype_name(cfg.dtype)}
    if sweep.weights_sha256:  # which weights the quality columns are of (the shipped file changes between runs)
        run_params["weights_sha256"] = sweep.weights_sha256
    common = dict(notebook=NOTEBOOK, workload=cfg.workload.name, preset=cfg.preset.name, warmup=cfg.warmup,
                  repeats=cfg.repeats)
    rows = []
    for i, r in enumerate(sweep.results):
        params = run_params | {"sampling": ax.kwargs(r.point), "curve": r.point.group, "base": base,
                                 "forwards": r.forwards, "reference": i == 0}
        kw = dict(common, variant=_variant(r.point), params=params)
        rows.append(results_store.make_row(metric=ax.metric, value=r.metric.median, unit=ax.unit, timing=r.metric,
                                           **kw))
        vals = {"speedup_vs_full": (tab.loc[i, "speedup"], "x"), "forwards": (r.forwards, "count"),
                "psnr_vs_full": (r.deviation["psnr"], "dB"), "rel_l2_vs_full": (r.deviation["rel_l2"], "ratio")}
        if "action_rel_l2" in r.deviation:
            vals["action_rel_l2_vs_full"] = (r.deviation["action_rel_l2"], "ratio")
        if r.quality is not None:
            vals |= {"psnr_gt": (r.quality.get("psnr"), "dB"), "ssim_gt": (r.quality.get("ssim"), "ratio"),
                     "agent_err_px": (r.quality.get("agent_err_px"), "px")}
        for m, (v, u) in vals.items():  # psnr_vs_full of the full-step run itself: inf (identical frames)
            rows.append(results_store.make_row(metric=m, value=float("nan") if v is None else float(v), unit=u, **kw))
    for _, k in knee_table(sweep).iterrows():
        if k["knee"] == "none within budget":
            continue
        r = next(x for x in sweep.results if x.point.label == k["knee"])
        params = run_params | {"sampling": ax.kwargs(r.point), "curve": k["curve"], "base": base,
                                 "criterion": k["criterion"]}
        kw = dict(common, variant=f"knee:{k['curve']}", params=params)
        rows.append(results_store.make_row(metric=ax.metric, value=r.metric.median, unit=ax.unit, timing=r.metric,
                                           **kw))
        rows.append(results_store.make_row(metric="knee_speedup", value=float(k["speedup"]), unit="x", **kw))
        rows.append(results_store.make_row(metric="knee_forwards", value=float(k["forwards"]), unit="count", **kw))
    return rows


def equal_work_spread(sweep: Sweep) -> dict | None:
    """The largest time ratio between two points that do the same work: the same denoiser forwards (and, for the
    UNet, the same steps in each pass), so only the solvers' own arithmetic differs, which is tiny next to a forward.
    Their times should agree; how far they do not is the run's timing noise at the scale of whole points (a
    launch-bound small model on a busy or slow host), a yardstick for the speedups between points.
    None when no two points do equal work. Else {"ratio", "forwards", "fast": (label, median), "slow": ...}."""
    items = [((r.forwards, r.point.steps if r.point.shift is None else None), r.forwards, r.point.label,
              r.metric.median) for r in sweep.results]
    return widest_equal_work(items, sweep.axis.higher_is_better)


def _quality_text(q: dict) -> str:
    """'17.96 dB PSNR, SSIM 0.236, agent error 14.2 px': the quality metrics a point (or the copy-last baseline) has."""
    parts = [f"{q['psnr']:.2f} dB PSNR"]
    if q.get("ssim") is not None:
        parts.append(f"SSIM {q['ssim']:.3f}")
    if q.get("agent_err_px") is not None:
        parts.append(f"agent error {q['agent_err_px']:.1f} px")
    return ", ".join(parts)


def interpret(sweep: Sweep) -> str:
    """Sentences computed from the measured numbers."""
    cfg, ax, ref = sweep.cfg, sweep.axis, sweep.reference
    dev = str(cfg.device) if cfg.device.type == "cpu" else torch.cuda.get_device_name(cfg.device)
    stack = (f"the `{' + '.join(v.name for v in cfg.options.base)}` stack" if cfg.options.base
             else f"the eager {sweep.dtype} pipeline")
    lines = [f"On {dev} ({stack}), the full-step run (`{ref.point.label}`, {ref.forwards} {ax.forwards_label}) gives "
             f"{ref.metric.median:.3g} {ax.unit} ({ax.metric_label}; p20 {ref.metric.p20:.3g}, p80 "
             f"{ref.metric.p80:.3g})."]
    if not sweep.has_quality:
        lines.append(f"`{cfg.preset.name}` has random weights: the deviations below are **solver error** (how far "
                     f"fewer steps or another solver move the sample from the full-step run's), not image quality; "
                     f"a point that keeps the frames close can still be a bad image, and one that moves them can be "
                     f"a good one. {sweep.quality_note}")
    else:
        lines.append(f"{sweep.quality_note} The full-step run scores {_quality_text(ref.quality)} against the truth"
                     + (f" (copying the last frame: {_quality_text(sweep.copy_last)})." if sweep.copy_last else "."))
        errs = [r.quality.get("agent_err_px") for r in sweep.results if r is not ref]
        better = [e for e in errs if e is not None and e < ref.quality.get("agent_err_px", np.nan)]
        if len(better) > len(errs) / 2:  # the reference is not the best tracker: the budget is relative to it
            lines.append(f"More steps do not track the agent better here: {len(better)} of {len(errs)} fewer-step "
                         f"points keep it closer than the full-step run's {ref.quality['agent_err_px']:.1f} px ("
                         + (f"these weights ship at {cfg.preset.sample_steps} steps a pass, chosen on other episodes; "
                            if getattr(cfg.preset, "sample_steps", 0) else "")
                         + "a stochastic sampler draws fresh noise at each of the full run's steps). The budget is "
                           "measured from the full-step run, so it is loose on agent error for this preset.")
    if ax.stochastic(cfg.preset, cfg.options.eta):
        lines.append("The reference sampler is stochastic (fresh noise every step: DDIM with eta > 0, or the causal "
                     "DiT's re-noising): another step count draws other noise, so its frames move even where the "
                     "solver error itself is small; the deterministic solvers' column against their own finest point "
                     "shows solver error proper." + (" `eta=0` makes DDIM deterministic." if ax.has_passes else ""))
    kt = knee_table(sweep)
    for _, k in kt.iterrows():
        if k["knee"] == "none within budget":
            lines.append(f"- **{k['curve']}**: no point meets the budget ({k['criterion']}).")
            continue
        if k["knee"] == ref.point.label:
            lines.append(f"- **{k['curve']}**: the knee is the full-step run itself: no point with fewer forwards "
                         f"meets the budget ({k['criterion']}).")
            continue
        s = (f"- **{k['curve']}**: knee at `{k['knee']}` ({int(k['forwards'])} forwards): {k['speedup']:.2f}x the "
             f"full-step run's speed, frames at {k['psnr vs full (dB)']:.1f} dB PSNR from the full-step run's")
        if sweep.has_quality:
            r = next(x for x in sweep.results if x.point.label == k["knee"])
            s += (f", PSNR against the truth {k['PSNR change vs full steps (dB)']:+.2f} dB from the full-step run's "
                  f"(positive: closer to the truth), agent error "
                  f"{r.quality.get('agent_err_px', float('nan')):.1f} px (full-step run: "
                  f"{ref.quality.get('agent_err_px', float('nan')):.1f} px"
                  f"{'' if cfg.options.agent_budget_px > 0 else '; not part of the budget'})")
        lines.append(s + ".")
    shipped = getattr(cfg.preset, "sample_steps", 0)
    if sweep.has_quality and shipped:
        tab = table(sweep).set_index("point")
        at = next((r for r in sweep.results if r.point.group == ax.solvers[0] and r.point.steps == (shipped, shipped)),
                  None)
        if at is not None:
            t = tab.loc[at.point.label]
            lines.append(f"The weights ship at `{at.point.label}` (`sample_steps` {shipped}, chosen before this run on "
                         f"other episodes: data/weights/README.md): {_quality_text(at.quality)} against the truth, "
                         f"{t['speedup']:.2f}x the full-step run's speed.")
    if cfg.device.type == "cpu":
        lines.append("Times on a CPU at a tiny preset say nothing about a GPU; the GPU run is what counts.")
    else:
        lines += _vs_fp32_eager(sweep, dev)
    lines.append("Only the number of denoiser forwards changes between points at equal solver: time scales with it "
                 "(the decode and conditioning do not), so a point's speedup is at most the ratio of forwards.")
    noise = timing_noise_note(equal_work_spread(sweep), ax.unit)
    if noise:
        lines.append(noise)
    return "\n\n".join(lines)


def _vs_fp32_eager(sweep: Sweep, device_name: str, path=None) -> list[str]:
    """A sentence comparing the sweep with notebook 01's stored fp32 eager run of the same preset on the same GPU
    model (the issue's yardstick: the full-step fp32 eager iteration), when the results store has one."""
    cfg, ax = sweep.cfg, sweep.axis
    df = results_store.read(path, notebook="01_baseline_profiling", workload=cfg.workload.name,
                            preset=cfg.preset.name, variant="eager", metric=ax.metric, device_name=device_name)
    df = df[[results_store.params_of(r).get("dtype") == "fp32" for _, r in df.iterrows()]]
    if not len(df):
        return []
    base = df.sort_values("timestamp").iloc[-1]
    b = float(base["median"])
    pts = [sweep.reference, *(r for r in sweep.results if r is not sweep.reference)]
    times = ", ".join(f"`{r.point.label}` {(r.metric.median / b if ax.higher_is_better else b / r.metric.median):.1f}x"
                      for r in pts[:8])
    return [f"Against notebook 01's fp32 eager run on this GPU model ({b:.3g} {ax.unit}, commit {base['git_commit']}, "
            f"{base['timestamp'][:10]}): {times}{' ...' if len(pts) > 8 else ''} (speed only: the quality budget is "
            f"judged against this sweep's full-step run)."]


def stored_knee(workload: str, preset: str, curve: str | None = None, path=None) -> dict | None:
    """The sampling keyword arguments of the latest stored knee (`knee:<curve>` rows of this notebook) for a workload
    and preset, to stack on: {'curve', 'sampling', 'speedup', 'criterion', 'timestamp'}, or None when there is none.
    curve None: the reference solver's curve (the first solver of the workload's axis)."""
    ax = workloads.get(workload).step_axis()
    curve = ax.solvers[0] if curve is None else curve
    df = results_store.read(path, notebook=NOTEBOOK, workload=workload, preset=preset, variant=f"knee:{curve}",
                            metric="knee_speedup")
    if not len(df):
        return None
    row = df.sort_values("timestamp").iloc[-1]
    params = results_store.params_of(row)
    return {"curve": curve, "sampling": params.get("sampling"), "speedup": float(row["value"]),
            "criterion": params.get("criterion"), "timestamp": row["timestamp"]}
