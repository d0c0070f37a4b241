"""Notebook 03's stored rows as the reports show them: headline, published tables, findings and the summary's
fewer-steps stage (wmbook.studies.steps measures; wmbook.studies.step_notes says what a run's rows say of their
timing noise and weights)."""

from __future__ import annotations

import json

import pandas as pd

from .. import results as results_store
from ..rows import Findings, Stage, device_label, fmt, fmt_spread, fmt_value, latest_runs, md_table, number, row_of
from .step_notes import EQUAL_WORK_TOLERANCE, equal_work_spread_rows, timing_noise_note, weights_note

NOTEBOOK = "03_step_reduction"
STAGE = (4, "fewer steps (03)")
POINT_METRICS = {"fps": "FPS", "iteration_s": "s / iteration"}


def _points(run: pd.DataFrame) -> pd.DataFrame:
    return run[~run["variant"].str.startswith("knee:") & run["metric"].isin(tuple(POINT_METRICS))]


def _knees(run: pd.DataFrame) -> pd.DataFrame:
    return run[run["variant"].str.startswith("knee:") & (run["metric"] == "knee_speedup")]


def _base(run: pd.DataFrame) -> str:
    """The pipeline the sweep ran on: 'eager' or the stack of notebooks 04-06 under it (params 'base')."""
    p = results_store.params_of(run.iloc[0]) if len(run) else {}
    base = p.get("base")
    return " + ".join(base) if isinstance(base, (list, tuple)) and base else (base or "eager")


def _has_truth(run: pd.DataFrame) -> bool:
    return bool((run["metric"] == "psnr_gt").any())


def _knee_point(run: pd.DataFrame, knee) -> str | None:
    """The point variant a knee row stands for (matched on the sampling arguments and curve)."""
    kp = results_store.params_of(knee)
    for _, pt in _points(run).iterrows():
        p = results_store.params_of(pt)
        if json.dumps(p.get("sampling"), sort_keys=True) == json.dumps(kp.get("sampling"), sort_keys=True) \
                and p.get("curve", "") == kp.get("curve", ""):
            return pt["variant"]
    return None


def _full_point(run: pd.DataFrame):
    pts = _points(run)
    full = [r for _, r in pts.iterrows() if results_store.params_of(r).get("reference")]
    return full[0] if full else (pts.iloc[0] if len(pts) else None)


def _fastest_point(run: pd.DataFrame):
    """The point of the sweep with the best time (highest FPS, fewest s / iteration), whatever its quality: the time a
    reader reaches at fewer steps on that pipeline; findings give it where it runs fewer forwards than the knee."""
    pts = _points(run)
    if not len(pts):
        return None
    t = pd.to_numeric(pts["value"], errors="coerce")
    if t.isna().all():
        return None
    return pts.loc[t.idxmax() if pts["metric"].iloc[0] == "fps" else t.idxmin()]


def _forwards(run: pd.DataFrame, variant) -> float:
    r = row_of(run, "forwards", variant) if variant is not None else None
    return number(r["value"]) if r is not None else float("nan")


def headline(run: pd.DataFrame) -> dict:
    """The reference curve's knee (the first knee row: the workload's reference solver) and the fastest knee."""
    knees = _knees(run)
    if not len(knees):
        return {"knee": "none within budget"} if (run["metric"] == "speedup_vs_full").any() else {}
    first = knees.iloc[0]
    best = knees.loc[pd.to_numeric(knees["value"]).idxmax()]
    out = {f"knee ({first['variant'].removeprefix('knee:')})":
           f"{fmt(first['value'], '{:.2f}x')}, {fmt_value(run, 'knee_forwards', '{:.0f}', first['variant'])} forwards"}
    if best["variant"] != first["variant"]:
        out[f"fastest knee ({best['variant'].removeprefix('knee:')})"] = fmt(best["value"], "{:.2f}x")
    if not _has_truth(run):
        out["what it measures"] = "solver error (random weights), not image quality"
    eq = equal_work_spread_rows(run)
    if eq is not None and eq["ratio"] > EQUAL_WORK_TOLERANCE:
        out["timing noise"] = (f"equal-work points {eq['ratio']:.2f}x apart: speedups closer than that are not "
                               f"resolved")
    out["weights"] = weights_note(run, short=True)
    return out


def published(df: pd.DataFrame) -> list[str]:
    """Per workload, preset and pipeline (eager, or a stack of notebooks 04-06: the sweep on the fast pipeline is a
    result of its own, not an older version of the eager one) its latest run: every point of the sweep (time with
    spread, speedup, deviation from the full-step output, quality against ground truth where the preset has it) and
    the knee of each curve."""
    parts = []
    for r in latest_runs(df, NOTEBOOK, by="base"):
        params = [json.loads(p) if p else {} for p in r["params"]]
        r = r.assign(_sampling=[json.dumps(p.get("sampling"), sort_keys=True) for p in params],
                     _curve=[p.get("curve", "") for p in params], _ref=[bool(p.get("reference")) for p in params],
                     _criterion=[p.get("criterion", "-") for p in params])
        points = _points(r)
        if not len(points):
            continue
        label = POINT_METRICS[points["metric"].iloc[0]]
        has_gt = _has_truth(r)
        rows = []
        for _, pt in points.iterrows():
            v = pt["variant"]
            row = {"point": v.removeprefix("steps:") + (" (full steps)" if pt["_ref"] else ""),
                   "forwards": fmt_value(r, "forwards", "{:.0f}", v), label: fmt_spread(pt, "{:.3g}"),
                   "speedup": fmt_value(r, "speedup_vs_full", "{:.2f}x", v),
                   "PSNR vs full (dB)": fmt_value(r, "psnr_vs_full", "{:.1f}", v)}
            if has_gt:
                row |= {"PSNR vs truth (dB)": fmt_value(r, "psnr_gt", "{:.2f}", v),
                        "SSIM vs truth": fmt_value(r, "ssim_gt", "{:.3f}", v),
                        "agent error (px)": fmt_value(r, "agent_err_px", "{:.1f}", v)}
            rows.append(row)
        knees = []
        for _, k in _knees(r).iterrows():
            same = points[(points["_sampling"] == k["_sampling"]) & (points["_curve"] == k["_curve"])]
            knees.append({"curve": k["variant"].removeprefix("knee:"),
                          "knee point": same["variant"].iloc[0].removeprefix("steps:") if len(same) else "-",
                          "forwards": fmt_value(r, "knee_forwards", "{:.0f}", k["variant"]),
                          "speedup": fmt(k["value"], "{:.2f}x"), "criterion": k["_criterion"]})
        crit = "quality against ground truth" if has_gt else "deviation from the full-step output (solver error)"
        parts.append(f"\n**03 · step reduction, {r['workload'].iloc[0]} / {r['preset'].iloc[0]}** ({device_label(r)}; "
                     f"on the `{_base(r).replace(' + ', '+')}` pipeline; {label} median (p20-p80); knee by {crit})\n")
        parts.append(md_table(rows))
        for note in (timing_noise_note(equal_work_spread_rows(points), points["unit"].iloc[0]), weights_note(r)):
            if note:
                parts.append("\n" + note + "\n")
        if knees:
            parts.append(f"\n**03 · knees, {r['preset'].iloc[0]}**\n")
            parts.append(md_table(knees))
    return parts


def _quality(run: pd.DataFrame, variant: str) -> str:
    if _has_truth(run):
        return (f"PSNR {fmt_value(run, 'psnr_gt', '{:.2f}', variant)} dB, SSIM "
                f"{fmt_value(run, 'ssim_gt', '{:.3f}', variant)}, agent error "
                f"{fmt_value(run, 'agent_err_px', '{:.1f}', variant)} px against the truth")
    return f"frames {fmt_value(run, 'psnr_vs_full', '{:.1f}', variant)} dB from the full-step run's"


def findings(run: pd.DataFrame) -> Findings:
    knees, full = _knees(run), _full_point(run)
    truth = _has_truth(run)
    first = knees.iloc[0] if len(knees) else None
    point = _knee_point(run, first) if first is not None else None
    full_v = full["variant"] if full is not None else None
    links = [("the knees", "#The-knee"), ("the frontier", "#The-speed-quality")]
    if first is None or point is None or point == full_v:
        head = (f"No step count with fewer forwards than the full-step run (`{str(full_v).removeprefix('steps:')}`) "
                f"keeps {'the quality' if truth else 'the frames'} within the budget"
                + ("" if truth else ": with random weights this measures **solver error**, how far fewer steps move "
                   "the sample, not image quality") + ".")
        goal = ("Quality budget at fewer steps: **missed** on this preset" if truth else
                "Quality budget: **not judged** on random weights (a trained world preset is where quality is "
                "measured: `world-mg2`, `world-wma`)") + "."
    else:
        head = (f"Knee of the reference solver: **`{point.removeprefix('steps:')}`, "
                f"{fmt(first['value'], '{:.2f}x')}** the full-step run's speed "
                f"({fmt_value(run, 'knee_forwards', '{:.0f}', first['variant'])} forwards; {_quality(run, point)}).")
        goal = (f"Quality budget ({results_store.params_of(first).get('criterion', 'the notebook criterion')}): "
                f"**met** at {fmt(first['value'], '{:.2f}x')}"
                + ("" if truth else "; on random weights that is solver error, not image quality") + ".")
        if truth and full_v is not None:
            goal += f" Full steps: {_quality(run, full_v)}."
    fastest = _fastest_point(run)
    if fastest is not None and _forwards(run, fastest["variant"]) < _forwards(run, point or full_v):
        v = fastest["variant"]
        head += (f" Fastest point measured: `{v.removeprefix('steps:')}`, **{fmt_spread(fastest, '{:.3g}')} "
                 f"{POINT_METRICS[fastest['metric']]}**, {fmt_value(run, 'speedup_vs_full', '{:.2f}x', v)} the "
                 f"full-step run ({fmt_value(run, 'forwards', '{:.0f}', v)} forwards; {_quality(run, v)}).")
    eq = equal_work_spread_rows(run)
    if eq is not None and eq["ratio"] > EQUAL_WORK_TOLERANCE:
        head += f" Equal-work points ran {eq['ratio']:.2f}x apart: closer speedups are not resolved."
    return Findings(head, goal, "Read the frontier (speed against quality per solver) and the knee table; then "
                    "stack the knee on the fastest pipeline.", links + [("06 · CUDA graphs", "06_cuda_graphs")])


def stage(run: pd.DataFrame, wl) -> Stage | None:
    """The reference solver's knee: on the stack of notebooks 04-06 a stage of the summary; on the eager pipeline a
    speedup of its own (not stacked)."""
    knees, full = _knees(run), _full_point(run)
    if full is None:
        return None
    first = knees.iloc[0] if len(knees) else None
    point = (_knee_point(run, first) if first is not None else None) or full["variant"]
    row = row_of(run, full["metric"], point)
    m = next(m for m in wl.summary_metrics if full["metric"] in m.names) if any(
        full["metric"] in m.names for m in wl.summary_metrics) else None
    if m is None or row is None:
        return None
    truth = _has_truth(run)
    quality = (_quality(run, point) if point != full["variant"] else
               ("no fewer steps within budget" + ("" if truth else " (random weights: solver error)")))
    base = _base(run)
    return Stage(STAGE[1], NOTEBOOK, full["metric"], m.label, number(row["value"]), m.higher_is_better, quality,
                 point.removeprefix("steps:"), cumulative=base != "eager" and point != full["variant"],
                 note=("on the eager pipeline: " if base == "eager" else "")
                 + f"{fmt(first['value'] if first is not None else 1, '{:.2f}x')} its full-step run")
