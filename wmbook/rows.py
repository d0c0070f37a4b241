"""Reading stored results rows for reports: which run stands for a notebook, one metric's row of a run, the best
gated row, and the formatting every published table and report uses (median with its p20-p80 spread, '-' for a
value that is missing, NaN or infinite).

The study modules (wmbook.studies.*_report) build their headlines, published tables and findings from these; the
generic renderers (wmbook.headlines, wmbook.published, wmbook.render) reach the studies through their registry.
"""

from __future__ import annotations

import json
import math

import pandas as pd

from . import results, workloads

PASSED = ("pass", "reference", "")  # gates whose rows count


def latest_runs(df: pd.DataFrame, notebook: str, by: str = "dtype") -> list[pd.DataFrame]:
    """The latest GPU run of `notebook` per workload, preset and the run parameter `by` (the dtype; notebook 08: the
    layout; notebook 03: the pipeline under the sweep), leaving out runs marked partial (results.mark_partial; cut
    runs are left out by the callers, results.without_cut). Each frame gains a column `by` (from params)."""
    d = df[(df["notebook"] == notebook) & (df["device_kind"] == "cuda")]
    d = d[~d["run_id"].isin(results.partial_runs(df))].copy()
    if not len(d):
        return []
    d[by] = [_hashable(json.loads(p).get(by, "")) if p else "" for p in d["params"]]
    last = d.sort_values("timestamp").groupby(["workload", "preset", by])["run_id"].last()
    return [d[d["run_id"] == r] for r in last.tolist()]


def _hashable(v):
    """A run parameter as a group key: lists and dicts (a stack of variants, say) as their JSON text."""
    return json.dumps(v, sort_keys=True) if isinstance(v, (list, dict)) else v


def latest_decoder_run(df: pd.DataFrame, workload: str, preset: str) -> pd.DataFrame | None:
    """The rows of the latest GPU run of notebook 06 at `workload`/`preset` that has a decoder table, partial runs
    (results.mark_partial) included; None when no run has one."""
    d = df[(df["notebook"] == "06_cuda_graphs") & (df["device_kind"] == "cuda") & (df["workload"] == workload)
           & (df["preset"] == preset)]
    d = d[d["run_id"].isin(d.loc[d["metric"] == "decoder_ms_per_block", "run_id"])]
    if not len(d):
        return None
    return d[d["run_id"] == d.sort_values("timestamp")["run_id"].iloc[-1]]


def workload_of(run: pd.DataFrame):
    """The Workload object a run's rows are of."""
    return workloads.get(run["workload"].iloc[0])


def row_of(run: pd.DataFrame, metric: str, variant: str | None = None):
    """The last row of `metric` in a run (of `variant` when given), None when there is none."""
    r = run[run["metric"] == metric]
    if variant is not None:
        r = r[r["variant"] == variant]
    return r.iloc[-1] if len(r) else None


def number(x) -> float:
    """A stored value as a float; NaN when it is not a number."""
    try:
        return float(x)
    except (TypeError, ValueError):
        return math.nan


def fmt(x, spec: str = "{:.3g}") -> str:
    """A value formatted with `spec`; '-' when it is missing, NaN or infinite (a PSNR of identical frames)."""
    x = number(x)
    return "-" if not math.isfinite(x) else spec.format(x)


def fmt_value(run: pd.DataFrame, metric: str, spec: str = "{:.3g}", variant: str | None = None) -> str:
    """The formatted value of one metric of a run, '-' when the run has none."""
    r = row_of(run, metric, variant)
    return "-" if r is None else fmt(r["value"], spec)


def fmt_spread(row, spec: str = "{:.3g}", sep: str = "-") -> str:
    """'median (p20-p80)' of a stored row, the median alone when no spread was stored, '-' for no row."""
    if row is None:
        return "-"
    s = fmt(row["value"], spec)
    if fmt(row.get("p20")) != "-" and s != "-":
        s += f" ({fmt(row['p20'], spec)}{sep}{fmt(row['p80'], spec)})"
    return s


def scaled(row, factor: float):
    """A copy of a stored row with its value and spread multiplied by `factor` (ms -> us)."""
    row = row.copy()
    for c in ("value", "p20", "p80"):
        if c in row and number(row[c]) == number(row[c]):
            row[c] = number(row[c]) * factor
    return row


def commit_label(commit) -> str:
    commit = str(commit or "?")
    return commit[:7] if len(commit) == 40 else commit


def device_label(run: pd.DataFrame) -> str:
    """'<device>, torch <version>, commit <short hash>' of a run."""
    r = run.iloc[0]
    return f"{r['device_name']}, torch {r['torch']}, commit {commit_label(r['git_commit'])}"


def md_table(rows: list[dict]) -> str:
    """Markdown table of dicts (their keys are the header)."""
    if not rows:
        return "_no GPU rows yet_\n"
    cols = list(rows[0])
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    out += ["| " + " | ".join(str(r[c]) for c in cols) + " |" for r in rows]
    return "\n".join(out) + "\n"


def gate_of(run: pd.DataFrame) -> pd.Series:
    return run["gate"].fillna("") if "gate" in run else pd.Series("", index=run.index)


def best_counted(run: pd.DataFrame, metric: str, lower_is_better: bool = True):
    """The row of `metric` whose gate passed (or is the reference) with the best value, else None."""
    d = run[run["metric"] == metric].copy()
    if not len(d):
        return None
    ok = d[gate_of(d).isin(PASSED)]
    d = ok if len(ok) else d
    d["v"] = pd.to_numeric(d["value"], errors="coerce")
    d = d[d["v"].map(lambda v: math.isfinite(v) if v == v else False)]
    if not len(d):
        return None
    return d.loc[d["v"].idxmin() if lower_is_better else d["v"].idxmax()]


def best_row(run: pd.DataFrame, metric_names, higher_is_better: bool, among=None):
    """The gated row (its forward_ms row) that the end-to-end metric ranks best, the first of `metric_names` the
    run stored; `among`: only these variants (e.g. rows whose frames were judged). Without an end-to-end metric the
    fastest forward. None without gated forward rows. Every number a headline or card shows of 'the best row' is
    read from this one variant."""
    ladder = run[(run["metric"] == "forward_ms") & gate_of(run).isin(("pass", "reference"))]
    if among is not None:
        ladder = ladder[ladder["variant"].isin(set(among))]
    if not len(ladder):
        return None
    for name in metric_names:
        e2e = best_counted(run[run["variant"].isin(ladder["variant"])], name, not higher_is_better)
        if e2e is not None:
            return row_of(ladder, "forward_ms", e2e["variant"])
    return best_counted(ladder, "forward_ms")


def psnr_clause(run: pd.DataFrame, variant: str) -> str:
    """'; frames 53.1 dB from the reference's' for a row whose decoded frames were compared, '' otherwise (the
    reference row itself: identical frames)."""
    v = fmt_value(run, "psnr_db", "{:.1f}", variant)
    return "" if v == "-" else f"; frames {v} dB from the reference's"


def run_dtype(run) -> str | None:
    """The dtype a stored run was made with (its params), None when not recorded."""
    if run is None or "params" not in run or not len(run):
        return None
    try:
        return json.loads(run["params"].iloc[0] or "{}").get("dtype") or None
    except (TypeError, ValueError):
        return None


def stack_parts(variant: str) -> list[str]:
    return [p for p in str(variant).split(" + ") if p]


# --------------------------------------------------------------------------- what a study reports from its rows


from dataclasses import dataclass, field  # noqa: E402


@dataclass
class Findings:
    """The three bullets a report opens with: its headline number, the goal met or missed, what to read next.
    Markdown; `next_links` are (text, target notebook stem or '#anchor') pairs the renderer turns into links."""

    headline: str
    goal: str
    next: str
    next_links: list[tuple[str, str]] = field(default_factory=list)

    def bullets(self) -> list[str]:
        return [self.headline, self.goal, self.next]


@dataclass
class Stage:
    """One step of a workload's summary (eager -> 04 -> 05 -> 06 -> 03): the workload's summary metric at the best
    gated row of that notebook's run, the row it comes from and its quality."""

    label: str  # "eager", "+ compile and precision (04)", ...
    notebook: str
    metric: str  # the stored metric name the value is of
    metric_label: str  # "FPS", "s / iteration"
    value: float
    higher_is_better: bool
    quality: str  # "frames 53.1 dB vs fp32", "reference", ...
    row: str  # the row's variant
    cumulative: bool = True  # False: not a step on top of the previous ones (a sweep of the eager model, or one
    # whose knee is its own full-step run): a row of the summary, not a bar of its chart
    note: str = ""
    preset: str = ""


def summary_best(run: pd.DataFrame, wl, among=None):
    """(best gated row, the summary metric that ranked it) by the first of the workload's summary metrics the run
    stored (wma: s / iteration where a run timed iterations, else ms per DDIM step); (fastest forward, None) when it
    stored none. Headlines, findings and the summary all read 'the best row' from here."""
    for m in wl.summary_metrics:
        if run["metric"].isin(m.names).any():
            return best_row(run, m.names, m.higher_is_better, among), m
    return best_row(run, (), True, among), None


def metric_row(run: pd.DataFrame, m, variant: str):
    """A variant's row of metric `m` (any of its stored names), None when it has none."""
    return next((r for n in (m.names if m is not None else ()) if (r := row_of(run, n, variant)) is not None), None)


def ladder_stage(run: pd.DataFrame, wl, label: str, notebook: str, among=None) -> Stage | None:
    """A ladder notebook's summary stage: its best gated row (summary_best), with that row's frames PSNR as its
    quality."""
    best, m = summary_best(run, wl, among)
    e2e = metric_row(run, m, best["variant"]) if best is not None else None
    if e2e is None:
        return None
    psnr = fmt_value(run, "psnr_db", "{:.1f}", best["variant"])
    return Stage(label, notebook, e2e["metric"], m.label, number(e2e["value"]), m.higher_is_better,
                 f"frames {psnr} dB vs fp32" if psnr != "-" else f"gate {best.get('gate', '')}", best["variant"])
