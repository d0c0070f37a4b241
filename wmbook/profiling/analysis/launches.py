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


def idle_gaps(trace, long_us: float = 20.0, top: int = 10) -> dict:
    """Where the GPU waits inside a trace: the gaps of its device timeline (every stream's kernels, copies and sets
    merged) between the first activity's start and the last one's end. Gaps shorter than `long_us` are the ones
    between back-to-back kernels (a graph replay's or a launch queue's); longer ones are the GPU waiting for the
    host. Returns {span_ms, busy_ms, idle_ms, gaps, short_idle_ms, long_idle_ms, long_gaps, long_us, top (DataFrame of
    the `top` longest gaps: us, at_ms from the start, before, after, label path of the activity after), memsets
    (DataFrame per name of the kernel launched next on a memset's stream: memsets, memset_ms)}."""
    if not (isinstance(long_us, (int, float)) and not isinstance(long_us, bool) and long_us > 0):
        raise ValueError(f"long_us={long_us!r} is not allowed; allowed values: a number > 0 (microseconds)")
    if isinstance(top, bool) or not isinstance(top, int) or top < 0:
        raise ValueError(f"top={top!r} is not allowed; allowed values: an integer >= 0")
    t = Trace.load(trace)
    K = t.device_activities.sort_values(["start_us", "end_us"]).reset_index(drop=True)
    empty_top = pd.DataFrame(columns=["us", "at_ms", "before", "after", "label"])
    empty_sets = pd.DataFrame(columns=["memsets", "memset_ms"]).rename_axis("next kernel")
    if not len(K):
        return {"span_ms": 0.0, "busy_ms": 0.0, "idle_ms": 0.0, "gaps": 0, "short_idle_ms": 0.0, "long_idle_ms": 0.0,
                "long_gaps": 0, "long_us": float(long_us), "top": empty_top, "memsets": empty_sets}
    s, e = K["start_us"].to_numpy(float), K["end_us"].to_numpy(float)
    reach = np.maximum.accumulate(e)  # the timeline is busy up to reach[i] once activity i has started
    gap = s[1:] - reach[:-1]
    at = np.nonzero(gap > 0)[0]  # a gap between activity i's reach and activity i + 1's start
    g = gap[at]
    span = float(reach[-1] - s[0]) / 1e3
    idle = float(g.sum()) / 1e3
    long = g >= long_us
    paths = t.labels["path"].tolist() if len(t.labels) else []
    lab = K["label"].to_numpy()

    def path(i):
        j = int(lab[i]) if lab[i] == lab[i] else -1
        return paths[j] if 0 <= j < len(paths) else ""

    # the activity that ended last before a gap is the one whose end is its reach
    ends_at = {float(v): i for i, v in enumerate(e)}
    order = np.argsort(-g, kind="stable")[:top]
    rows = [{"us": float(g[k]), "at_ms": float(reach[at[k]] - s[0]) / 1e3,
             "before": K.at[ends_at.get(float(reach[at[k]]), int(at[k])), "name"],
             "after": K.at[int(at[k]) + 1, "name"],
             "label": path(int(at[k]) + 1)} for k in order]
    # memsets: which kernel comes next on the same stream (what asked for the set, as far as order tells)
    nxt = []
    for _, Ks in K.groupby("stream", sort=False):
        kinds, names = Ks["kind"].tolist(), Ks["name"].tolist()
        durs = Ks["duration_us"].to_numpy(float)
        for i, kind in enumerate(kinds):
            if kind == "gpu_memset":
                follower = next((names[j] for j in range(i + 1, len(kinds)) if kinds[j] == "kernel"), "(none)")
                nxt.append((follower, durs[i]))
    sets = (pd.DataFrame(nxt, columns=["next kernel", "us"]).groupby("next kernel")["us"].agg(["count", "sum"])
            .rename(columns={"count": "memsets", "sum": "memset_ms"}).assign(memset_ms=lambda d: d["memset_ms"] / 1e3)
            .sort_values("memsets", ascending=False) if nxt else empty_sets)
    return {"span_ms": span, "busy_ms": span - idle, "idle_ms": idle, "gaps": int(len(g)),
            "short_idle_ms": float(g[~long].sum()) / 1e3, "long_idle_ms": float(g[long].sum()) / 1e3,
            "long_gaps": int(long.sum()), "long_us": float(long_us),
            "top": pd.DataFrame(rows, columns=empty_top.columns) if rows else empty_top,
            "memsets": sets}


def format_idle_gaps(gaps: dict) -> str:
    """idle_gaps' result as text: the totals, the longest gaps and the memsets by the kernel after them (names cut
    to fit a line)."""
    lines = [f"GPU span {gaps['span_ms']:.2f} ms, busy {gaps['busy_ms']:.2f}, idle {gaps['idle_ms']:.2f} in "
             f"{gaps['gaps']} gaps: {gaps['short_idle_ms']:.2f} ms in gaps under {gaps['long_us']:g} us, "
             f"{gaps['long_idle_ms']:.2f} ms in {gaps['long_gaps']} longer ones"]
    if len(gaps["top"]):
        top = gaps["top"].assign(**{c: gaps["top"][c].str.slice(0, 60) for c in ("before", "after", "label")})
        lines += ["longest gaps:", top.to_string(float_format=lambda v: f"{v:.1f}")]
    if len(gaps["memsets"]):
        sets = gaps["memsets"].head(10)
        sets.index = sets.index.str.slice(0, 100)
        lines += ["memsets by the kernel after them on their stream:",
                  sets.to_string(float_format=lambda v: f"{v:.3f}")]
    return "\n".join(lines)
