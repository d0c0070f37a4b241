"""Which part of a trace a question is about: a region (a label name, or None for the whole trace) and its work.

Accounting rule: a device activity belongs to the label that was innermost on the launching host thread when
its launch call ran (trace.device_activities.label); it is in the region when that label or one of its
ancestors is named `region`. Host ops and runtime calls belong to the label innermost at their start.

`work(trace, region)` is the table every time-accounting question sums: on a trace with device activity, one
row per device activity in the region with its category and `duration_us` (device time); on a trace without,
one row per aten op in the region with its category and host self time as `duration_us`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..trace import Trace, ancestors_named
from .categories import activity_categories, activity_op_names, op_categories


@dataclass
class Region:
    """A region of a trace: its name (None: whole trace) and, per label, the region occurrence holding it."""

    trace: Trace
    name: str | None
    anchor: np.ndarray  # per label: the nearest ancestor-or-self label named `name` (-1: outside; all -1 if None)

    def contains(self, label_idx: np.ndarray) -> np.ndarray:
        """Mask over label indices (-1 = unlabelled): inside the region."""
        label_idx = np.asarray(label_idx, dtype=np.int64)
        if self.name is None:
            return np.ones(len(label_idx), dtype=bool)
        out = np.zeros(len(label_idx), dtype=bool)
        ok = label_idx >= 0
        out[ok] = self.anchor[label_idx[ok]] >= 0
        return out

    def label_inside(self, i: int) -> bool:
        return self.name is None or self.anchor[i] >= 0


def select(trace: Trace, region: str | None) -> Region:
    """The Region `region` of the trace; ValueError naming the allowed values when it is not a label there."""
    L = trace.labels
    names = L["name"].tolist()
    if region is None:
        return Region(trace, None, np.full(len(L), -1, dtype=np.int64))
    if region not in set(names):
        tops = sorted(set(L.loc[L["parent"] < 0, "name"])) if len(L) else []
        raise ValueError(f"region={region!r} is not a label in this trace; allowed values: None (whole trace) "
                         f"or a label, e.g. the top-level ones {tops}")
    anchor = trace.memo(("anchor", region),
                        lambda: ancestors_named(L["parent"].to_numpy(np.int64), names, {region}))
    return Region(trace, region, anchor)


def _in(reg: Region, df: pd.DataFrame) -> pd.DataFrame:
    return df[reg.contains(df["label"].to_numpy(np.int64))].copy() if len(df) else df.copy()


def op_self_us(trace: Trace) -> np.ndarray:
    """Host self time of every op: its duration minus its directly nested ops' (same thread), at least 0."""
    def compute():
        O = trace.ops
        if not len(O):
            return np.zeros(0, dtype=float)
        child = O.loc[O["parent"] >= 0].groupby("parent")["duration_us"].sum()
        return np.clip(O["duration_us"].to_numpy(float) - child.reindex(O.index, fill_value=0.0).to_numpy(), 0.0, None)

    return trace.memo("op_self_us", compute)


def activities(trace: Trace, region: str | Region | None = None) -> pd.DataFrame:
    """Device activities in the region, with `op_name` and `category` (the one category rule)."""
    reg = region if isinstance(region, Region) else select(trace, region)
    K = trace.device_activities.assign(op_name=activity_op_names(trace), category=activity_categories(trace)) \
        if len(trace.device_activities) else trace.device_activities.assign(op_name=[], category=[])
    return _in(reg, K)


def ops(trace: Trace, region: str | Region | None = None) -> pd.DataFrame:
    """Host ops in the region, with `self_us` (host self time)."""
    reg = region if isinstance(region, Region) else select(trace, region)
    O = trace.ops.assign(self_us=op_self_us(trace)) if len(trace.ops) else \
        trace.ops.assign(self_us=pd.Series(dtype=float))
    return _in(reg, O)


def runtime_calls(trace: Trace, region: str | Region | None = None) -> pd.DataFrame:
    """CUDA runtime/driver calls in the region."""
    reg = region if isinstance(region, Region) else select(trace, region)
    return _in(reg, trace.runtime_calls)


def work(trace: Trace, region: str | Region | None = None) -> pd.DataFrame:
    """The time-accounting rows of the region (module docstring): name, op_name, category, label, op, kind,
    duration_us (device time, or host self time of aten ops on a trace without device activity)."""
    reg = region if isinstance(region, Region) else select(trace, region)

    def compute():
        if trace.source == "gpu":
            return activities(trace, reg)
        O = ops(trace, reg)
        cats = op_categories(trace)
        O = O[O["name"].str.startswith("aten::")] if len(O) else O
        return O.assign(duration_us=O["self_us"], op_name=O["name"], op=O.index.to_numpy(np.int64),
                        category=cats[O.index.to_numpy(np.int64)], kind="cpu_op")

    return trace.memo(("work", reg.name), compute).copy(deep=False)
