"""What notebook 03's stored rows say about themselves, for the published README block, the index and the notebook's
interpretation: the timing noise of a run (how far apart points doing equal work ran) and whether its quality columns
are of the weights shipped now."""

from __future__ import annotations

import pandas as pd

from .. import results as results_store
from ..presets import ALL_PRESETS
from ..rows import workload_of
from ..world.weights import file_sha256, is_world_preset, weights_path

EQUAL_WORK_TOLERANCE = 1.15  # points of equal work whose times differ by more than this: the run says so


def widest_equal_work(items, higher_is_better: bool) -> dict | None:
    """items: (work key, forwards, label, median) per point -> the widest time ratio within a key, as
    {"ratio", "forwards", "fast": (label, median), "slow": ...} (None when no key has two points)."""
    groups: dict = {}
    for key, fw, label, med in items:
        groups.setdefault(key, []).append((fw, label, float(med)))
    worst = None
    for rs in groups.values():
        if len(rs) < 2:
            continue
        rs = sorted(rs, key=lambda x: x[2], reverse=higher_is_better)  # fastest first (FPS up, s per iteration down)
        (fw, fl, fm), (_, sl, sm) = rs[0], rs[-1]
        ratio = fm / sm if higher_is_better else sm / fm
        if worst is None or ratio > worst["ratio"]:
            worst = {"ratio": ratio, "forwards": fw, "fast": (fl, fm), "slow": (sl, sm)}
    return worst


def equal_work_spread_rows(rows: pd.DataFrame) -> dict | None:
    """equal_work_spread from a stored run's rows (its point rows are used: metric fps or iteration_s, not a knee,
    `params` holding the point's forwards and sampling keywords): what the published block and the index say."""
    points = rows[~rows["variant"].str.startswith("knee:") & rows["metric"].isin(("fps", "iteration_s"))]
    if not len(points):
        return None
    items = []
    # the median of the timed runs; a row stored without timing stats carries its value only
    med = pd.to_numeric(points["median"], errors="coerce").fillna(pd.to_numeric(points["value"], errors="coerce"))
    points = points.assign(median=med)
    for _, r in points.iterrows():
        p = results_store.params_of(r)
        if p.get("forwards") is None:  # a row that does not say its work is compared with none
            continue
        smp = p.get("sampling") or {}
        passes = (smp.get("decision_steps"), smp.get("world_steps")) if "world_steps" in smp else None
        items.append(((p.get("forwards"), passes), p.get("forwards"), r["variant"].removeprefix("steps:"),
                      r["median"]))
    if not items:
        return None
    metric = points["metric"].iloc[0]  # the workload's own metric says which way is faster
    higher = next((m.higher_is_better for m in workload_of(points).summary_metrics if metric in m.names), True)
    return widest_equal_work(items, higher_is_better=higher)


def timing_noise_note(eq: dict | None, unit: str) -> str:
    """The sentence a run with equal-work points further apart than EQUAL_WORK_TOLERANCE gets ('' otherwise)."""
    if eq is None or eq["ratio"] <= EQUAL_WORK_TOLERANCE:
        return ""
    return (f"**Timing noise:** points doing the same work ({eq['forwards']} forwards) should take about the same "
            f"time, yet `{eq['fast'][0]}` ran at {eq['fast'][1]:.3g} {unit} and `{eq['slow'][0]}` at "
            f"{eq['slow'][1]:.3g} {unit}, {eq['ratio']:.2f}x apart: the host's timing noise at the scale of whole "
            f"points, or a solver's own per-step overhead (its scheduler's host work), which this run cannot tell "
            f"apart. Either way, speedups (the knees' included) closer than {eq['ratio']:.2f}x are not resolved by "
            f"this run; more `repeats`, or a quieter host, would say which.")


def weights_note(rows: pd.DataFrame, short: bool = False) -> str:
    """For a trained world preset's rows with quality against ground truth: '' when they record the SHA-256 of the
    weights shipped now (`weights_sha256`; the stored rows from before it was recorded have it backfilled from git);
    otherwise the sentence saying their quality columns are of other weights, or do not say which, and where the
    runs are listed. short=True: the clause alone (an index headline)."""
    if not len(rows) or not (rows["metric"] == "psnr_gt").any():
        return ""
    preset = ALL_PRESETS.get(rows["preset"].iloc[0])
    if preset is None or not is_world_preset(preset):
        return ""
    path = weights_path(preset)
    shipped = file_sha256(path) if path.is_file() else None
    shas = {None if sha is None else "now" if sha == shipped else f"sha256 {sha[:16]}"
            for sha in (results_store.params_of(r).get("weights_sha256") for _, r in rows.iterrows())}
    if shas == {"now"}:
        return ""
    which = ", ".join(sorted(x for x in shas if x not in (None, "now")))
    which = (f"were scored on other weights ({which})" if which else "do not say which weights they scored") + (
        "; some rows do not say which" if which and None in shas else "")
    if short:
        return f"quality columns {which}, not the file shipped now"
    return (f"**Other weights:** these rows' quality columns {which}, not the `{preset.name}` file shipped now "
            f"({'sha256 ' + shipped[:16] if shipped else 'missing'}). `data/weights/README.md` lists each run and "
            f"when it shipped.")
