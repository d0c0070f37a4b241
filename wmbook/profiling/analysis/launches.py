"""Busy time, GPU idle and kernel launches of a region; the GPU busy time of a whole trace."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from ..trace import Trace
from .forward import FORWARD_LABEL, forward_count, in_forward
from .region import Region, activities, runtime_calls, select, work

SHORT_KERNEL_US = 10.0  # kernels shorter than this are launch-latency sized on current GPUs
LAUNCH_CALLS = frozenset({"cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx",
                          "cudaLaunchCooperativeKernel", "cudaGraphLaunch"})
LAUNCH_STATS = (
    "busy_ms", "busy_union_ms", "gpu_span_ms", "idle_ms", "idle_share", "host_ms", "busy_over_host", "kernels",
    "memcpy_memset", "launch_calls", "launch_host_ms", "forwards", "kernels_per_forward", "short_kernel_share",
    "short_kernel_time_share", "kernel_mean_us", "kernel_median_us",
)  # fmt: skip


def union_ms(starts: np.ndarray, ends: np.ndarray) -> float:
    """Length in ms of the union of [start, end) intervals in us (overlaps counted once)."""
    if len(starts) == 0:
        return 0.0
    order = np.argsort(starts)
    s, e = starts[order], ends[order]
    total, cs, ce = 0.0, s[0], e[0]
    for a, b in zip(s[1:], e[1:]):
        if a > ce:
            total += ce - cs
            cs, ce = a, b
        else:
            ce = max(ce, b)
    return (total + ce - cs) / 1e3


def trace_busy_ms(trace) -> float:
    """GPU busy time of a whole trace: the union of its kernels, copies and sets (overlaps counted once)."""
    K = Trace.load(trace).device_activities
    return union_ms(K["start_us"].to_numpy(float), K["end_us"].to_numpy(float))


def busy_ms(trace, region: str | Region | None = None) -> float:
    """Summed time of the region's work (device activities, or aten self time without device activity), ms."""
    trace = Trace.load(trace)
    return float(work(trace, region)["duration_us"].sum()) / 1e3


def host_ms(trace, region: str | Region | None = None) -> float:
    """Host time of the region: its label ranges summed (whole trace: first op start to last op end)."""
    trace = Trace.load(trace)
    reg = region if isinstance(region, Region) else select(trace, region)
    L, O = trace.labels, trace.ops
    if reg.name:
        names = L["name"].tolist()
        return float(L.loc[[i for i in range(len(L)) if names[i] == reg.name], "duration_us"].sum()) / 1e3
    return (float(O["end_us"].max() - O["start_us"].min()) / 1e3) if len(O) else float("nan")


def launch_numbers(trace, region: str | Region | None = None, forward_label: str = FORWARD_LABEL) -> dict:
    """The numbers of `launch_stats` as a dict, in its order."""
    trace = Trace.load(trace)
    reg = region if isinstance(region, Region) else select(trace, region)
    busy = busy_ms(trace, reg)
    n_fwd = forward_count(trace, reg, forward_label)
    host = host_ms(trace, reg)
    out = {"busy_ms": busy, "forwards": n_fwd, "host_ms": host}
    K = activities(trace, reg)
    if trace.source == "gpu" and len(K):
        union = union_ms(K["start_us"].to_numpy(float), K["end_us"].to_numpy(float))
        # GPU span per occurrence of the region, so gaps between occurrences don't count as idle
        occ = K["label"].map(lambda i: reg.anchor[i] if reg.name is not None else 0)
        span = float(sum((g["end_us"].max() - g["start_us"].min()) for _, g in K.groupby(occ))) / 1e3
        kern = K[K["kind"] == "kernel"]
        d = kern["duration_us"].to_numpy(float)
        short = d < SHORT_KERNEL_US
        R = runtime_calls(trace, reg)
        launches = R[R["name"].isin(LAUNCH_CALLS)]
        in_fwd = in_forward(trace, K["label"].to_numpy(np.int64), forward_label)
        out.update(
            busy_union_ms=union, gpu_span_ms=span, idle_ms=max(0.0, span - union),
            idle_share=max(0.0, span - union) / span if span > 0 else float("nan"),
            kernels=int(len(kern)), memcpy_memset=int(len(K) - len(kern)),
            launch_calls=int(len(launches)), launch_host_ms=float(launches["duration_us"].sum()) / 1e3,
            kernels_per_forward=((float(in_fwd[(K["kind"] == "kernel").to_numpy()].sum()) / n_fwd) if n_fwd
                                 else float("nan")),
            short_kernel_share=float(short.mean()) if len(d) else float("nan"),
            short_kernel_time_share=float(d[short].sum() / d.sum()) if d.sum() > 0 else float("nan"),
            kernel_mean_us=float(d.mean()) if len(d) else float("nan"),
            kernel_median_us=float(np.median(d)) if len(d) else float("nan"),
            busy_over_host=(union / host) if host and host > 0 else float("nan"),
        )
    else:
        out.update(busy_union_ms=busy, gpu_span_ms=float("nan"), idle_ms=float("nan"), idle_share=float("nan"),
                   kernels=0, memcpy_memset=0, launch_calls=0, launch_host_ms=0.0,
                   kernels_per_forward=float("nan"), short_kernel_share=float("nan"),
                   short_kernel_time_share=float("nan"), kernel_mean_us=float("nan"),
                   kernel_median_us=float("nan"), busy_over_host=float("nan"))
    return out


def launch_stats(trace, region: str | Region | None = None, forward_label: str = FORWARD_LABEL) -> pd.DataFrame:
    """Busy (summed and union), GPU span and idle, host time, kernel and launch counts, launches per forward and
    kernel-size statistics of the region: one `value` per `statistic` (LAUNCH_STATS). Idle = GPU span of each
    region occurrence minus the union of its activities."""
    s = launch_numbers(trace, region, forward_label)
    return pd.DataFrame({"value": {k: s[k] for k in LAUNCH_STATS}}).rename_axis("statistic")


def steady_idle(trace, unit: str, skip: int = 1) -> dict:
    """GPU idle inside the steady units of a run (a streaming generation's blocks). `unit` is a regular expression
    that names a unit's label (fully matched, e.g. ``2\\.3_Block_\\d+``); its occurrences in time order are the units,
    the first `skip` of them (the first block: other shapes, the first frame) left out. A unit's GPU window runs from
    the start of the first kernel launched inside its label to the start of the next unit's first kernel (the last
    unit's: to the end of its last kernel), so work that spills past the label (a decode on a second stream) counts
    where the GPU runs it. GPU busy is the union of every kernel and copy, on every stream, inside the windows.
    Returns {units, steady_units, span_ms, busy_ms, idle_ms, idle_share, unit_idle_share (list)}; idle_share is NaN
    when there is no steady unit or no device timeline."""
    if isinstance(skip, bool) or not isinstance(skip, int) or skip < 0:
        raise ValueError(f"skip={skip!r} is not allowed; allowed values: an integer >= 0")
    rx = re.compile(unit)
    t = Trace.load(trace)
    L = t.labels
    occ = L[[bool(rx.fullmatch(str(n))) for n in L["name"]]].sort_values("start_us")
    K = t.device_activities
    nan = float("nan")
    out = {"units": int(len(occ)), "steady_units": 0, "span_ms": nan, "busy_ms": nan, "idle_ms": nan,
           "idle_share": nan, "unit_idle_share": []}
    if not len(occ) or not len(K):
        return out
    starts, ends = occ["start_us"].to_numpy(float), occ["end_us"].to_numpy(float)
    launch = K["launch_us"].to_numpy(float)
    ks, ke = K["start_us"].to_numpy(float), K["end_us"].to_numpy(float)
    which = np.searchsorted(starts, launch, side="right") - 1
    ok = (which >= 0) & ~np.isnan(launch)
    ok[ok] &= launch[ok] <= ends[which[ok]]
    first = np.full(len(occ), np.nan)
    last = np.full(len(occ), np.nan)
    for u in np.unique(which[ok]):
        sel = ok & (which == u)
        first[u], last[u] = ks[sel].min(), ke[sel].max()
    spans, busys = [], []
    for u in range(skip, len(occ)):
        if np.isnan(first[u]):
            continue
        nxt = first[u + 1:][~np.isnan(first[u + 1:])]
        a, b = first[u], (nxt[0] if len(nxt) else last[u])
        if b <= a:
            continue
        s, e = np.clip(ks, a, b), np.clip(ke, a, b)
        keep = e > s
        spans.append((b - a) / 1e3)
        busys.append(union_ms(s[keep], e[keep]))
    if not spans:
        return out
    span, busy = float(sum(spans)), float(sum(busys))
    out.update(steady_units=len(spans), span_ms=span, busy_ms=busy, idle_ms=max(0.0, span - busy),
               idle_share=max(0.0, span - busy) / span,
               unit_idle_share=[max(0.0, s - b) / s for s, b in zip(spans, busys)])
    return out
