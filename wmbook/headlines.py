"""What the reports show of a notebook's stored rows, for any notebook: which run stands for each notebook, workload
and preset (`published_runs`), a few numbers that answer its question (`headline`) and the three findings a report
opens with (`findings`). Each notebook's own knowledge is in its study's report module (wmbook.studies.report_for);
this module only dispatches.
"""

from __future__ import annotations

import pandas as pd

from . import results
from .rows import Findings, latest_runs
from .studies import REPORTS, report_for


def _report(run: pd.DataFrame):
    notebooks = set(run["notebook"])
    if len(notebooks) != 1:
        raise ValueError(f"a report reads the rows of one notebook; got {sorted(notebooks)}")
    return report_for(run["notebook"].iloc[0])


def headline(run: pd.DataFrame) -> dict[str, str]:
    """A few numbers that answer a run's notebook question, from its results rows (any device; one notebook):
    {header: formatted value}. Unknown notebooks (or no rows) give {}."""
    if run is None or not len(run):
        return {}
    rep = _report(run)
    if rep is None:
        return {}
    try:
        return {k: v for k, v in rep.headline(run.reset_index(drop=True)).items() if v not in (None, "", "-")}
    except (KeyError, IndexError, ValueError, TypeError) as e:
        return {"note": f"no headline ({type(e).__name__}: {e})"}


def findings(run: pd.DataFrame) -> Findings | None:
    """The three findings (headline number, goal met or missed, what to read next) of a run's rows; None when its
    notebook has none or the rows cannot give them."""
    if run is None or not len(run):
        return None
    rep = _report(run)
    if rep is None or not hasattr(rep, "findings"):
        return None
    try:
        found = rep.findings(run.reset_index(drop=True))
    except (KeyError, IndexError, ValueError, TypeError, ZeroDivisionError):
        return None
    if found is not None and "device_kind" in run and (run["device_kind"] != "cuda").all():
        found.goal += " (A CPU run at a tiny preset checks the code paths; its numbers say nothing about a GPU.)"
    return found


def published_runs(df: pd.DataFrame) -> dict[tuple[str, str, str], pd.DataFrame]:
    """{(notebook, workload, preset): rows} of the GPU runs the published tables show: the latest run per notebook,
    workload and preset, unless the notebook's report module selects otherwise (`runs`: notebook 04 run in parts,
    notebook 06's decoder table). Runs marked cut (results.mark_cut) are left out, runs marked partial
    (results.mark_partial) give only such tables."""
    df = results.without_cut(df)
    out = {}
    for nb in REPORTS:
        rep = report_for(nb)
        if hasattr(rep, "runs"):
            out |= rep.runs(df)
            continue
        for r in latest_runs(df, nb):
            key = (nb, r["workload"].iloc[0], r["preset"].iloc[0])
            if key not in out or r["timestamp"].max() > out[key]["timestamp"].max():
                out[key] = r.drop(columns=["dtype"], errors="ignore")
    return out


__all__ = ["findings", "headline", "published_runs"]
