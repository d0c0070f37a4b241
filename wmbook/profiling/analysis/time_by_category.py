"""Time by operator category of a region (the one category rule of `categories`), and what landed in `other`."""

from __future__ import annotations

import pandas as pd

from ..trace import Trace
from .categories import CATEGORIES
from .region import Region, work


def category_times(trace, region: str | Region | None = None) -> pd.DataFrame:
    """ms, share, count (`kernels`: device activities, or aten ops on a trace without device activity) and mean_us
    per category of the region's work, every category a row, largest first; they add up to the busy time.
    attrs["source"]: 'gpu' or 'cpu' (CPU self time of aten ops)."""
    trace = Trace.load(trace)
    return category_table(work(trace, region), "duration_us", trace.source)


def unclassified(trace, region: str | Region | None = None) -> pd.DataFrame:
    """The region's work that landed in `other`, by name and launching op: ms and count."""
    trace = Trace.load(trace)
    return unclassified_table(work(trace, region), "duration_us")


def category_table(frame: pd.DataFrame, dur_col: str, source: str) -> pd.DataFrame:
    """ms, share, count and mean per category of a work frame (every category a row, largest first)."""
    busy_ms = float(frame[dur_col].sum()) / 1e3
    g = frame.groupby("category")[dur_col].agg(["sum", "count", "mean"]) if len(frame) else None
    rows = []
    for c in CATEGORIES:
        s = g.loc[c] if g is not None and c in g.index else None
        ms = float(s["sum"]) / 1e3 if s is not None else 0.0
        rows.append({"category": c, "ms": ms, "share": ms / busy_ms if busy_ms > 0 else float("nan"),
                     "kernels": int(s["count"]) if s is not None else 0,
                     "mean_us": float(s["mean"]) if s is not None else float("nan")})
    out = pd.DataFrame(rows).sort_values("ms", ascending=False, kind="stable").reset_index(drop=True)
    out.attrs["source"] = source
    return out


def unclassified_table(frame: pd.DataFrame, dur_col: str) -> pd.DataFrame:
    """Work items that landed in `other`, by name and launching op: ms and count."""
    other = frame[frame["category"] == "other"] if len(frame) else frame
    if not len(other):
        return pd.DataFrame(columns=["name", "op_name", "ms", "count"])
    out = (other.assign(op_name=other.get("op_name", other["name"]))
           .groupby(["name", "op_name"], dropna=False)[dur_col].agg(["sum", "count"])
           .reset_index().rename(columns={"sum": "ms", "count": "count"}))
    out["ms"] /= 1e3
    return out.sort_values("ms", ascending=False).reset_index(drop=True)
