"""Notebook 01's stored rows as the reports show them: headline, published table, findings and the summary's eager
stage (wmbook.studies.baseline measures; this reads the rows back)."""

from __future__ import annotations

import pandas as pd

from .. import workloads
from ..rows import (
    Findings,
    Stage,
    device_label,
    fmt,
    fmt_spread,
    fmt_value,
    latest_runs,
    md_table,
    number,
    row_of,
    run_dtype,
    workload_of,
)

NOTEBOOK = "01_baseline_profiling"
STAGE = (0, "eager")  # the summary's first stage: the reference, at the precision upstream runs it


def headline(run: pd.DataFrame) -> dict:
    out = {}
    for header, metric, spec, spread in workload_of(run).published_columns or ():
        row = row_of(run, metric)
        if row is not None:
            out[header] = fmt_spread(row, spec) if spread else fmt(row["value"], spec)
    return out


def published(df: pd.DataFrame) -> list[str]:
    """Per workload with a notebook-01 table (Workload.published_columns): its latest run per preset and dtype."""
    parts = []
    runs = latest_runs(df, NOTEBOOK)
    for i, wl in enumerate([w for w in workloads.all_workloads() if w.published_columns]):
        rows = []
        for r in runs:
            if r["workload"].iloc[0] != wl.name:
                continue
            row = {"preset": r["preset"].iloc[0], "dtype": r["dtype"].iloc[0]}
            for header, metric, spec, spread in wl.published_columns:
                row[header] = fmt_spread(row_of(r, metric), spec) if spread else fmt_value(r, metric, spec)
            rows.append(row | {"device": device_label(r)})
        parts.append(("\n" if i else "") + f"**01 · baseline, {wl.published_title}\n")
        parts.append(md_table(rows))
    return parts


def _main(run: pd.DataFrame):
    """(header, metric, row) of the workload's first published column: its end-to-end number."""
    header, metric, spec, _ = workload_of(run).published_columns[0]
    return header, spec, row_of(run, metric)


def findings(run: pd.DataFrame) -> Findings:
    wl = workload_of(run)
    header, spec, main = _main(run)
    floor = next(((h, m) for h, m, _, _ in wl.published_columns if m.endswith("_over_floor")), None)
    dtype = run_dtype(run) or "?"
    head = f"Eager {dtype} at `{run['preset'].iloc[0]}`: **{fmt_spread(main, spec)} {header}**"
    if floor is not None and row_of(run, floor[1]) is not None:
        head += f"; one {wl.forward_name} takes {fmt_value(run, floor[1], '{:.1f}')}x its FLOP floor"
    rt = wl.goals.get("real_time_fps")
    if rt and main is not None and wl.metric.higher_is_better:
        v = number(main["value"])
        goal = (f"Real time ({rt:g} {header}): **{'met' if v >= rt else 'missed'}**, "
                f"{v:.3g} against {rt:g}.")
    else:
        goal = ("No target here: this is the baseline that notebooks 04 and 06 measure their targets against.")
    return Findings(head + ".", goal, "Next: where the time goes, operator by operator.",
                    [("the interpretation", "#Interpretation"),
                     ("02 · bottleneck breakdown", "02_bottleneck_breakdown")])


def stage(run: pd.DataFrame, wl) -> Stage | None:
    """The eager stage: the run at the precision upstream runs the model (Workload.eager_dtype)."""
    if (run_dtype(run) or wl.eager_dtype) != wl.eager_dtype:
        return None
    for m in wl.summary_metrics:
        row = next((row_of(run, name) for name in m.names if row_of(run, name) is not None), None)
        if row is not None:
            return Stage(f"eager {wl.eager_dtype}", NOTEBOOK, row["metric"], m.label, number(row["value"]),
                         m.higher_is_better, "reference", "eager")
    return None
