"""Notebook 05's stored rows as the reports show them: headline, published table, findings and the summary's fused
kernels stage (wmbook.studies.kernels measures; this reads the rows back)."""

from __future__ import annotations

import math

import pandas as pd

from .. import results
from ..rows import (
    Findings,
    Stage,
    device_label,
    fmt,
    fmt_spread,
    fmt_value,
    ladder_stage,
    latest_runs,
    md_table,
    metric_row,
    number,
    row_of,
    summary_best,
    workload_of,
)

NOTEBOOK = "05_triton_kernels"
STAGE = (2, "+ fused Triton kernels (05)")


def graph_timed(rows: pd.DataFrame) -> bool:
    """Whether notebook 05 timed these kernel rows as CUDA-graph replays (runs before that used do_bench)."""
    return "note" in rows.columns and rows["note"].astype(str).str.startswith("cuda-graph").all()


def _ratios(run: pd.DataFrame) -> list[tuple[float, float]]:
    """(eager / fused, compile / fused) time per call site."""
    out = []
    for _, f in run[run["metric"] == "fused_us"].iterrows():
        e, c = row_of(run, "eager_us", f["variant"]), row_of(run, "compile_us", f["variant"])
        fv = number(f["value"])
        out.append((number(e["value"]) / fv if e is not None and fv else math.nan,
                    number(c["value"]) / fv if c is not None and fv else math.nan))
    return out


def headline(run: pd.DataFrame) -> dict:
    fused = run[run["metric"] == "fused_us"]
    out = {}
    if len(fused):
        ratios = _ratios(run)
        out["call sites"] = str(len(fused))
        eg, cg = [a for a, _ in ratios if a == a], [b for _, b in ratios if b == b]
        if eg:
            out["fused vs eager"] = f"{min(eg):.2f}x-{max(eg):.2f}x"
        if cg:
            out["fused vs torch.compile"] = f"{min(cg):.2f}x-{max(cg):.2f}x"
        gb = pd.to_numeric(run[run["metric"] == "fused_gbps"]["value"], errors="coerce").dropna()
        if len(gb):
            out["fused GB/s (best)"] = fmt(gb.max(), "{:,.0f}")
    best, m = summary_best(run, workload_of(run))
    if best is not None:
        v = best["variant"]
        e2e = metric_row(run, m, v)
        out |= {"best row": v.split(" + ")[-1], "forward ms (best row)": fmt_spread(best),
                f"{m.label if m else 'end to end'} (best row)": fmt(e2e["value"] if e2e is not None else None)}
    return out


def published(df: pd.DataFrame) -> list[str]:
    """Per workload and preset its latest run's kernel table (GB/s of eager, torch.compile and the fused kernel at each
    call site; the kernel's time with its spread)."""
    parts = []
    for r in latest_runs(df, NOTEBOOK):
        fused = r[r["metric"] == "fused_us"]
        if not len(fused):
            continue
        rows = [{"call site": f["variant"].removeprefix("kernel:"), "gate": f.get("gate", ""),
                 "fused us": fmt_spread(f, "{:.1f}"),
                 **{f"{i} GB/s": fmt_value(r, f"{i}_gbps", "{:,.0f}", f["variant"]) for i in ("eager", "compile",
                                                                                              "fused")}}
                for _, f in fused.iterrows()]
        how = "CUDA-graph replay" if graph_timed(fused) else "do_bench"
        parts.append(f"\n**05 · fused Triton kernels, {r['workload'].iloc[0]} / {r['preset'].iloc[0]}** "
                     f"({device_label(r)}; {how} with the L2 flushed, median (p20-p80); GB/s of the bytes the op must "
                     f"move)\n")
        parts.append(md_table(rows))
    return parts


def _base_given(run: pd.DataFrame) -> bool:
    """Whether the run's ladder built on a `base` given as a parameter (its rows' params), not on notebook 04's best
    stack."""
    return "params" in run and len(run) > 0 and results.params_of(run.iloc[0]).get("base") not in (None, "auto")


def findings(run: pd.DataFrame) -> Findings:
    wl = workload_of(run)
    ratios = _ratios(run)
    cg = [b for _, b in ratios if b == b]
    if cg:
        won = sum(b > 1.0 for b in cg)
        head = (f"Fused kernels against torch.compile's kernels for the same ops: **{min(cg):.2f}x to "
                f"{max(cg):.2f}x** faster across {len(cg)} call sites.")
        goal = (f"Beat torch.compile at every call site: **{'met' if won == len(cg) else 'missed'}** ({won} of "
                f"{len(cg)}).")
    else:
        head, goal = "No kernel table in this run.", "No kernel goal is judged by this run."
    best, m = summary_best(run, wl)
    if best is not None and m is not None:
        v = best["variant"]
        e2e = metric_row(run, m, v)
        where = "On the run's own base stack (its `base` parameter)" if _base_given(run) else \
            "On notebook 04's best stack"
        head += (f" {where}, `{v.split(' + ')[-1]}` gives {m.label} "
                 f"{fmt(e2e['value'] if e2e is not None else None)} (forward {fmt_spread(best)} ms).")
    return Findings(head, goal, "Read the kernel table (GB/s against the copy ceiling per call site); then CUDA "
                    "graphs on top of these kernels.", [("the kernel table", "#Each-kernel"), ("the ladder", "#Ladder"),
                                                   ("06 · CUDA graphs", "06_cuda_graphs")])


def stage(run: pd.DataFrame, wl) -> Stage | None:
    return ladder_stage(run, wl, STAGE[1], NOTEBOOK)
