"""A torch.profiler Chrome trace parsed once into linked tables (in the manner of HolisticTraceAnalysis).

    trace = Trace.load("run.json.gz")      # or a .json path, a chrome-trace dict, or a Trace (returned as is)
    trace.labels, trace.ops, trace.runtime_calls, trace.device_activities, trace.source

Tables (pandas DataFrames with a RangeIndex; a link is the row position in another table, -1 when absent;
times in microseconds of the trace clock):

- `labels`: host ranges of `wmbook.profiling.label` (`user_annotation`, ProfilerStep#N left out):
  name, start_us, end_us, duration_us, pid, tid, parent (enclosing label on the same thread), depth, path
  ("outer/inner/name").
- `ops`: host operators (`cpu_op`): name, start_us, end_us, duration_us, pid, tid, external_id, input_dims,
  input_types, concrete_inputs, parent (enclosing op on the same thread), label (innermost label holding
  its start on its thread).
- `runtime_calls`: CUDA runtime and driver calls: name, start_us, duration_us, end_us, pid, tid, correlation,
  label.
- `device_activities`: kernels, memcpys and memsets: name, kind ("kernel", "gpu_memcpy", "gpu_memset"),
  start_us, duration_us, end_us, stream, correlation, external_id, bytes, launch_us, launch_pid, launch_tid,
  op, label.

Links: each device activity -> its launch call (same correlation id; launch_us/pid/tid are that call's) ->
the op that launched it (first op with the activity's External id) -> the innermost label open on the
launching thread at launch time (`label`). Without a matching launch call the op's start stands in.

This module parses and links; what the numbers mean is `wmbook.profiling.analysis`.
"""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

LABELS_COLUMNS = ["name", "start_us", "end_us", "duration_us", "pid", "tid", "parent", "depth", "path"]
OPS_COLUMNS = ["name", "start_us", "end_us", "duration_us", "pid", "tid", "external_id", "input_dims", "input_types",
              "concrete_inputs", "parent", "label"]
RUNTIME_CALLS_COLUMNS = ["name", "start_us", "duration_us", "end_us", "pid", "tid", "correlation", "label"]
DEVICE_ACTIVITIES_COLUMNS = ["name", "kind", "start_us", "duration_us", "end_us", "stream", "correlation",
                             "external_id", "bytes", "launch_us", "launch_pid", "launch_tid", "op", "label"]
DEVICE_KINDS = ("kernel", "gpu_memcpy", "gpu_memset")
NEST_EPS_US = 0.002  # trace ts and dur are rounded to ns separately, so a child's end can pass its parent's by ~1 ns


def load_trace(path) -> dict:
    """A Chrome trace as a dict, from .json or .json.gz."""
    p = Path(path)
    opener = gzip.open if p.suffix == ".gz" else open
    with opener(p, "rt") as f:
        return json.load(f)


# ---------------------------------------------------------------------------------------------------------
# nesting of host intervals


def nest_intervals(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Order (by start, outer first) and parent index (in that order) of intervals on one thread."""
    order = np.lexsort((-(ends - starts), starts))
    e = ends[order]
    parent = np.full(len(order), -1, dtype=np.int64)
    stack: list[int] = []
    for i in range(len(order)):
        while stack and not (e[i] <= e[stack[-1]] + NEST_EPS_US):
            stack.pop()
        parent[i] = stack[-1] if stack else -1
        stack.append(i)
    return order, parent


def innermost(starts: np.ndarray, ends: np.ndarray, parent: np.ndarray, queries: np.ndarray) -> np.ndarray:
    """For nested intervals (sorted by start, outer first, parent indices) the innermost one holding each
    query time, or -1. Sweep over queries sorted by time."""
    out = np.full(len(queries), -1, dtype=np.int64)
    if len(starts) == 0 or len(queries) == 0:
        return out
    order = np.argsort(queries, kind="stable")
    nxt = 0
    cur = -1
    n = len(starts)
    for qi in order:
        q = queries[qi]
        while nxt < n and starts[nxt] <= q:
            cur = nxt
            nxt += 1
        c = cur  # climb to the innermost interval that still holds q
        while c != -1 and ends[c] < q:
            c = parent[c]
        out[qi] = c
    return out


class _Lane:
    """Nested host intervals of one (pid, tid) with innermost-lookup."""

    def __init__(self, idx: np.ndarray, starts: np.ndarray, ends: np.ndarray):
        order, parent = nest_intervals(starts, ends)
        self.idx = idx[order]  # row positions in the owner's table
        self.starts = starts[order]
        self.ends = ends[order]
        self.parent = parent

    def lookup(self, times: np.ndarray) -> np.ndarray:
        loc = innermost(self.starts, self.ends, self.parent, times)
        return np.where(loc >= 0, self.idx[np.maximum(loc, 0)], -1)

    def parents_global(self, n_total: int) -> np.ndarray:
        out = np.full(n_total, -1, dtype=np.int64)
        out[self.idx] = np.where(self.parent >= 0, self.idx[np.maximum(self.parent, 0)], -1)
        return out


def _lanes(df: pd.DataFrame) -> tuple[dict, np.ndarray]:
    """Lanes per thread and the parent array of `df` (host intervals with start_us/end_us/pid/tid)."""
    parent = np.full(len(df), -1, dtype=np.int64)
    lanes = {}
    if not len(df):
        return lanes, parent
    for key, g in df.groupby(["pid", "tid"], sort=False):
        lane = _Lane(g.index.to_numpy(), g["start_us"].to_numpy(float), g["end_us"].to_numpy(float))
        lanes[key] = lane
        p = lane.parents_global(len(df))
        m = p >= 0
        parent[m] = p[m]
    return lanes, parent


def _label_of(label_lanes: dict, df: pd.DataFrame, time_col: str, pid_col: str = "pid",
              tid_col: str = "tid") -> np.ndarray:
    """Innermost label open on each row's thread at its `time_col`, -1 when none."""
    out = np.full(len(df), -1, dtype=np.int64)
    if not len(df) or not label_lanes:
        return out
    for (pid, tid), g in df.groupby([pid_col, tid_col], sort=False, dropna=False):
        t = g[time_col].to_numpy(float)
        ok = ~np.isnan(t)
        res = np.full(len(g), -1, dtype=np.int64)
        lane = label_lanes.get((pid, tid))
        if lane is not None:
            res[ok] = lane.lookup(t[ok])
        out[df.index.get_indexer(g.index)] = res
    return out


def topo_order(parent: np.ndarray) -> list[int]:
    """Indices with every parent before its children."""
    return list(np.argsort(depths(parent), kind="stable"))


def depths(parent: np.ndarray) -> np.ndarray:
    """Number of ancestors of each row of a parent array."""
    depth = np.zeros(len(parent), dtype=np.int64)
    for i in range(len(parent)):
        d, p = 0, parent[i]
        while p >= 0:
            d += 1
            p = parent[p]
        depth[i] = d
    return depth


def ancestors_named(parent: np.ndarray, names: list[str], wanted: set) -> np.ndarray:
    """For each row, the index of its nearest ancestor-or-self whose name is in `wanted` (-1 if none)."""
    out = np.full(len(parent), -1, dtype=np.int64)
    for i in topo_order(parent):
        if names[i] in wanted:
            out[i] = i
        elif parent[i] >= 0:
            out[i] = out[parent[i]]
    return out


# ---------------------------------------------------------------------------------------------------------
# the trace


class Trace:
    """One parsed trace: labels, ops, runtime_calls and device_activities, linked (module docstring)."""

    def __init__(self, labels: pd.DataFrame, ops: pd.DataFrame, runtime_calls: pd.DataFrame,
                 device_activities: pd.DataFrame, metadata: dict | None = None):
        self.labels = labels
        self.ops = ops
        self.runtime_calls = runtime_calls
        self.device_activities = device_activities
        self.metadata = dict(metadata or {})  # the trace's top-level keys other than traceEvents
        self._memo: dict = {}

    @property
    def source(self) -> str:
        """'gpu' when the trace holds device activity (kernels, memcpy, memset), else 'cpu'."""
        return "gpu" if len(self.device_activities) else "cpu"

    @property
    def record_shapes(self):
        """The trace's record_shapes flag (None when it does not say)."""
        return self.metadata.get("record_shapes")

    def memo(self, key, compute):
        """compute() once per trace and key: derived columns several analyses share (categories, self time)."""
        if key not in self._memo:
            self._memo[key] = compute()
        return self._memo[key]

    def __repr__(self) -> str:
        return (f"Trace(source={self.source!r}, labels={len(self.labels)}, ops={len(self.ops)}, "
                f"runtime_calls={len(self.runtime_calls)}, device_activities={len(self.device_activities)})")

    @classmethod
    def load(cls, trace) -> "Trace":
        """A Trace from a path (.json or .json.gz), a chrome-trace dict, or a Trace (returned as is)."""
        if isinstance(trace, cls):
            return trace
        if isinstance(trace, dict):
            return cls.from_dict(trace)
        return cls.from_dict(load_trace(trace))

    @classmethod
    def from_dict(cls, trace: dict) -> "Trace":
        """Parse a chrome-trace dict (see the module docstring for the tables)."""
        events = trace.get("traceEvents", []) if isinstance(trace, dict) else []
        labels, ops, runtime, acts = [], [], [], []
        for e in events:
            if e.get("ph") != "X" or "ts" in e and "name" not in e:
                continue
            cat = e.get("cat")
            ts = float(e.get("ts", 0.0))
            dur = float(e.get("dur", 0.0))
            args = e.get("args") or {}
            if cat == "user_annotation":
                if str(e["name"]).startswith("ProfilerStep#"):
                    continue
                labels.append((e["name"], ts, ts + dur, dur, e.get("pid"), e.get("tid")))
            elif cat == "cpu_op":
                ops.append((e["name"], ts, ts + dur, dur, e.get("pid"), e.get("tid"), args.get("External id"),
                            args.get("Input Dims"), args.get("Input type"), args.get("Concrete Inputs")))
            elif cat in ("cuda_runtime", "cuda_driver"):
                runtime.append((e["name"], ts, dur, ts + dur, e.get("pid"), e.get("tid"), args.get("correlation")))
            elif cat in DEVICE_KINDS:
                acts.append((e["name"], cat, ts, dur, ts + dur, args.get("stream", e.get("tid")),
                             args.get("correlation"), args.get("External id"), args.get("bytes")))
        L = pd.DataFrame(labels, columns=LABELS_COLUMNS[:6])
        O = pd.DataFrame(ops, columns=OPS_COLUMNS[:10])
        R = pd.DataFrame(runtime, columns=RUNTIME_CALLS_COLUMNS[:7])
        K = pd.DataFrame(acts, columns=DEVICE_ACTIVITIES_COLUMNS[:9])

        label_lanes, L["parent"] = _lanes(L)
        par = L["parent"].to_numpy(np.int64)
        L["depth"] = depths(par)
        paths = [""] * len(L)
        names = L["name"].tolist()
        for i in topo_order(par):
            paths[i] = names[i] if par[i] < 0 else paths[par[i]] + "/" + names[i]
        L["path"] = paths

        _, O["parent"] = _lanes(O)
        O["label"] = _label_of(label_lanes, O, "start_us")
        R["label"] = _label_of(label_lanes, R, "start_us")

        # device activity -> launch call (correlation) -> launching op (External id) and label
        corr_launch = dict(zip(R["correlation"], zip(R["start_us"], R["pid"], R["tid"]))) if len(R) else {}
        ext_op = {}
        for i, x in zip(O.index, O["external_id"]):
            if x is not None and not (isinstance(x, float) and math.isnan(x)):
                ext_op.setdefault(x, i)  # first op with that id (the one the launch sits in)
        launch_us, lpid, ltid, op_idx = [], [], [], []
        for corr, ext in zip(K["correlation"], K["external_id"]):
            oi = ext_op.get(ext, -1)
            op_idx.append(oi)
            hit = corr_launch.get(corr)
            if hit is not None:
                launch_us.append(hit[0])
                lpid.append(hit[1])
                ltid.append(hit[2])
            elif oi >= 0:
                launch_us.append(O.at[oi, "start_us"])
                lpid.append(O.at[oi, "pid"])
                ltid.append(O.at[oi, "tid"])
            else:
                launch_us.append(np.nan)
                lpid.append(None)
                ltid.append(None)
        K["launch_us"] = np.asarray(launch_us, dtype=float)
        K["launch_pid"], K["launch_tid"] = lpid, ltid
        K["op"] = np.asarray(op_idx, dtype=np.int64)
        K["label"] = _label_of(label_lanes, K, "launch_us", "launch_pid", "launch_tid")
        meta = {k: v for k, v in trace.items() if k != "traceEvents"} if isinstance(trace, dict) else {}
        return cls(L, O, R, K, meta)


__all__ = ["Trace", "load_trace", "ancestors_named", "depths", "innermost", "nest_intervals", "topo_order"]
