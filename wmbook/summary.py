"""A workload's results in one view, from the stored rows: eager -> compile and precision (04) -> fused kernels (05)
-> static caches and CUDA graphs (06) -> fewer steps (03), each stage the workload's summary metric at that
notebook's best gated row, with its speedup over eager, its quality and the row it comes from; one cumulative bar
chart per workload (as PyTorch's "Accelerating Generative AI" posts draw theirs); the README's results at a glance.

Each stage comes from its study's report module (`stage`); this module only orders and compares them.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass

import pandas as pd

from . import results, workloads
from .rows import Stage, fmt, latest_runs
from .studies import REPORTS, report_for


@dataclass
class SummaryRow:
    stage: Stage
    key: tuple[str, str, str]  # (notebook, workload, preset) of the run it comes from
    device: str
    speedup: float  # over the eager stage in the same metric (NaN without one)


def _value_text(s: Stage) -> str:
    return f"{fmt(s.value)} {s.metric_label}"


def _candidate_runs(df: pd.DataFrame, notebook: str, rep) -> list[pd.DataFrame]:
    if hasattr(rep, "runs"):
        return list(rep.runs(df).values())
    return latest_runs(df, notebook)  # per dtype: notebook 01's eager stage picks its own


def stages(df: pd.DataFrame, wl) -> list[SummaryRow]:
    """The summary of workload `wl` at its real preset from `df` (one device's GPU rows, cut runs left out)."""
    df = results.without_cut(df)
    found = []
    for nb in REPORTS:
        rep = report_for(nb)
        if not hasattr(rep, "stage"):
            continue
        for run in _candidate_runs(df, nb, rep):
            if run["workload"].iloc[0] != wl.name or run["preset"].iloc[0] != wl.real_preset:
                continue
            got = rep.stage(run.reset_index(drop=True), wl)
            for i, s in enumerate(got if isinstance(got, list) else [got] if got is not None else []):
                s.preset = wl.real_preset
                found.append((rep.STAGE[0], i, s, (nb, wl.name, wl.real_preset), str(run["device_name"].iloc[0])))
            if got:
                break
    found.sort(key=lambda t: (t[0], t[1]))
    eager = found[0][2] if found and found[0][0] == 0 else None
    eager_run = None
    if eager is not None:
        nb = eager.notebook
        eager_run = next(r for r in _candidate_runs(df, nb, report_for(nb))
                         if r["workload"].iloc[0] == wl.name and r["preset"].iloc[0] == wl.real_preset
                         and report_for(nb).stage(r.reset_index(drop=True), wl))
    return [SummaryRow(s, key, device, _speedup(s, wl, eager, eager_run)) for _, _, s, key, device in found]


def _speedup(s: Stage, wl, eager: Stage | None, eager_run: pd.DataFrame | None) -> float:
    """The stage's value over the eager stage's value of the same metric (any of its stored names; the eager run's
    row of the eager variant when the eager stage shows another metric)."""
    if eager is None:
        return math.nan
    m = next((m for m in wl.summary_metrics if s.metric in m.names), None)
    if m is None:
        return math.nan
    if eager.metric in m.names:
        return m.speedup(s.value, eager.value)
    base = eager_run[eager_run["metric"].isin(m.names) & (eager_run["variant"] == eager.row)]
    return m.speedup(s.value, float(base["value"].iloc[-1])) if len(base) else math.nan


def best(rows: list[SummaryRow]) -> SummaryRow | None:
    """The fastest cumulative stage past eager (the best single-GPU stack whose quality holds); by value where the
    device has no eager run to compare with."""
    cands = [r for r in rows if r.stage.cumulative and not (r is rows[0] and r.speedup == 1.0)]
    if not cands:
        return None
    if all(r.speedup == r.speedup for r in cands):
        return max(cands, key=lambda r: r.speedup)
    return max(cands, key=lambda r: r.stage.value if r.stage.higher_is_better else -r.stage.value)


def chart_svg(rows: list[SummaryRow], title: str) -> str:
    """One cumulative bar chart: the speedup over eager of each cumulative stage, its value beside it; inline SVG (no
    fonts embedded, no network). '' when fewer than two stages have a speedup."""
    bars = [r for r in rows if r.stage.cumulative and r.speedup == r.speedup]
    if len(bars) < 2:
        return ""
    import matplotlib  # noqa: PLC0415  heavy: matplotlib, only to draw

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415  heavy: matplotlib.pyplot

    with plt.rc_context({"svg.fonttype": "none", "font.size": 9}):
        fig, ax = plt.subplots(figsize=(6.4, 0.42 * len(bars) + 0.9))
        labels = [r.stage.label for r in bars][::-1]
        vals = [r.speedup for r in bars][::-1]
        ax.barh(labels, vals, color=["#4477aa" if i else "#bbbbbb" for i in range(len(bars))][::-1])
        for y, r in enumerate(bars[::-1]):
            ax.text(r.speedup, y, f"  {speedup_text(r.speedup)}  ({_value_text(r.stage)})", va="center", fontsize=8)
        ax.set_xlim(0, max(vals) * 1.6)
        ax.set_xlabel("speedup over eager (same metric)")
        ax.set_title(title, fontsize=10, loc="left")
        for side in ("top", "right"):
            ax.spines[side].set_visible(False)
        fig.tight_layout()
        buf = io.StringIO()
        # no date and fixed element ids: the same rows give the same page, so a regenerated index differs only where
        # its numbers do
        with plt.rc_context({"svg.hashsalt": "wmbook"}):
            fig.savefig(buf, format="svg", metadata={"Date": None})
        plt.close(fig)
    svg = buf.getvalue()
    return svg[svg.index("<svg"):]


def speedup_text(x: float) -> str:
    return fmt(x, "{:.2f}x" if x < 10 else "{:.0f}x")


def table_rows(rows: list[SummaryRow], link_for=None) -> list[dict]:
    """The summary as table rows: stage, value, speedup over eager, quality, the row it comes from, report."""
    out = []
    for r in rows:
        s = r.stage
        note = "" if s.cumulative else f" ({s.note or 'not stacked'})"
        out.append({"stage": s.label, "value": _value_text(s), "speedup over eager": speedup_text(r.speedup) + note,
                    "quality": s.quality, "row": s.row if s.row.count(" + ") < 1 else "+ " + s.row.split(" + ")[-1],
                    "report": (link_for(r.key) if link_for else None) or ""})
    return out


def glance_rows(df: pd.DataFrame, devices: list[str], link_for=None) -> list[dict]:
    """The README's results at a glance: per workload and device (the reference device first) eager, the best
    single-GPU stack, its speedup and quality, the device and the report."""
    out = []
    for wl in workloads.all_workloads():
        for dev in devices:
            rows = stages(results.of_device(df, dev), wl)
            if not rows:
                continue
            b, first = best(rows), rows[0]
            if b is None:
                continue
            # a folder that holds a set shows only its commit's rows: the eager run may exist outside it
            eager = _value_text(first.stage) if first.speedup == 1.0 else f"no {wl.eager_dtype} eager run published"
            out.append({"workload": f"`{wl.name}` ({wl.real_preset})", "eager": eager,
                        "best single-GPU stack": f"{_value_text(b.stage)}: {b.stage.label}",
                        "speedup": speedup_text(b.speedup), "quality": b.stage.quality, "device": dev,
                        "report": (link_for(dev, b.key) if link_for else "") or "-"})
    return out
