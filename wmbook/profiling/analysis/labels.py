"""Time per label: the label tree of a region (notebook 02), the label and stage tables (notebook 01), and the one
definition of a label's device time they share (`LABEL_DEVICE_TIME_DEFINITION`).
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from ..trace import Trace
from .region import Region, select, work

LABEL_DEVICE_TIME_DEFINITION = (
    "A label's device time is the summed duration of the device activities (kernels, memcpy, memset) launched "
    "while that label was open on the launching host thread; `total` includes activities launched under nested "
    "labels, `self` excludes them. An activity is launched under the label that is innermost on the host thread "
    "of its launch call (matched by correlation id) when that call runs; it counts once for every label open "
    "around that call, so overlapping activities on several streams are summed, not merged. On a trace without "
    "device activity the label tables report host time instead and say so in their `source` column."
)
"""The definition of a label's device time used by label_tree, label_table/stage_table and kernel_summary."""

LABEL_COLUMNS = [
    "label", "count", "cpu_total_ms", "cpu_self_ms", "gpu_total_ms", "gpu_self_ms", "depth", "parent", "source",
]  # fmt: skip
STAGE_RE = re.compile(r"^\d+_")
_PREFER = ("gpu", "cpu")


def top_level_labels(trace) -> list[str]:
    """Names of the outermost labels of a trace (the allowed `region` values of a whole run)."""
    L = Trace.load(trace).labels
    return sorted(set(L.loc[L["parent"] < 0, "name"]))


# ---------------------------------------------------------------------------------------------------------
# the label tree of a region


def label_tree(trace, region: str | Region | None = None) -> pd.DataFrame:
    """Self and total time per label path, rooted at the region (or the trace's top level).

    Device time per LABEL_DEVICE_TIME_DEFINITION (CPU self time of aten ops on a trace without device activity).
    Columns: path (from the region label down), label, parent_path, depth, count (occurrences), self_ms,
    total_ms, kernels (device activities in total). With region=None, activities launched outside every label
    form a last root row `(unlabelled)`. self_ms + the children's total_ms = total_ms for every row.
    """
    trace = Trace.load(trace)
    reg = region if isinstance(region, Region) else select(trace, region)
    L = trace.labels
    frame = work(trace, reg)
    cols = ["path", "label", "parent_path", "depth", "count", "self_ms", "total_ms", "kernels"]
    if not len(L) or not len(frame):
        return pd.DataFrame(columns=cols)
    paths = L["path"].tolist()
    if reg.name is not None:
        # strip the part above the region so every path starts at the region label
        def rel(i):
            r = reg.anchor[i]
            if r < 0:
                return None
            base = paths[r]
            prefix = base[: len(base) - len(L.at[r, "name"])]
            return paths[i][len(prefix):]

        rpaths = [rel(i) for i in range(len(L))]
    else:
        rpaths = paths
    self_ms: dict = {}
    kcount: dict = {}
    unl = 0.0
    nunl = 0
    for i, d in zip(frame["label"].to_numpy(np.int64), frame["duration_us"].to_numpy(float) / 1e3):
        pth = rpaths[i] if i >= 0 else None
        if pth is None:
            unl += d
            nunl += 1
            continue
        self_ms[pth] = self_ms.get(pth, 0.0) + d
        kcount[pth] = kcount.get(pth, 0) + 1
    occ: dict = {}
    for pth in rpaths:
        if pth is not None:
            occ[pth] = occ.get(pth, 0) + 1
    total = dict.fromkeys(occ, 0.0)
    ktot = dict.fromkeys(occ, 0)
    for pth, v in self_ms.items():
        parts = pth.split("/")
        for j in range(1, len(parts) + 1):
            a = "/".join(parts[:j])
            if a in total:
                total[a] += v
                ktot[a] += kcount[pth]
    rows = []
    for pth in set(occ):
        parts = pth.split("/")
        rows.append({"path": pth, "label": parts[-1], "parent_path": "/".join(parts[:-1]), "depth": len(parts) - 1,
                     "count": occ[pth], "self_ms": self_ms.get(pth, 0.0), "total_ms": total[pth],
                     "kernels": ktot[pth]})
    if reg.name is None and nunl:
        rows.append({"path": "(unlabelled)", "label": "(unlabelled)", "parent_path": "", "depth": 0, "count": 0,
                     "self_ms": unl, "total_ms": unl, "kernels": nunl})
    out = pd.DataFrame(rows, columns=cols)
    return out.sort_values(["depth", "total_ms"], ascending=[True, False]).reset_index(drop=True)


# ---------------------------------------------------------------------------------------------------------
# per label name: host and device time (notebook 01, kernel_summary)


def label_device_times(trace) -> pd.DataFrame:
    """Per label name: self_us and total_us of device time (LABEL_DEVICE_TIME_DEFINITION) and the number of
    activities in total. An activity counts once for a name even where labels of that name nest. Activities
    launched outside every label form the row `(unlabelled)`. Empty on a trace without device activity."""
    trace = Trace.load(trace)
    K = trace.device_activities
    cols = ["self_us", "total_us", "activities"]
    if not len(K):
        return pd.DataFrame(columns=cols, dtype=float).rename_axis("label")
    L = trace.labels
    names = L["name"].tolist()
    parent = L["parent"].to_numpy(np.int64)
    per = K.groupby("label")["duration_us"].agg(["sum", "size"])  # per innermost label occurrence
    self_us: dict = {}
    total_us: dict = {}
    n_total: dict = {}
    for i, (s, n) in zip(per.index.to_numpy(np.int64), per.to_numpy()):
        if i < 0:
            self_us["(unlabelled)"] = total_us["(unlabelled)"] = float(s)
            n_total["(unlabelled)"] = int(n)
            continue
        self_us[names[i]] = self_us.get(names[i], 0.0) + float(s)
        seen = set()
        j = i
        while j >= 0:
            if names[j] not in seen:
                seen.add(names[j])
                total_us[names[j]] = total_us.get(names[j], 0.0) + float(s)
                n_total[names[j]] = n_total.get(names[j], 0) + int(n)
            j = parent[j]
    keys = list(dict.fromkeys(names + (["(unlabelled)"] if "(unlabelled)" in total_us else [])))
    return pd.DataFrame({"self_us": [self_us.get(k, 0.0) for k in keys],
                         "total_us": [total_us.get(k, 0.0) for k in keys],
                         "activities": [n_total.get(k, 0) for k in keys]}, index=pd.Index(keys, name="label"))


def label_table(trace_or_path, prefix_filter=None) -> pd.DataFrame:
    """Per label name: count, host total/self ms, device total/self ms, depth and parent of its first occurrence.

    Host (cpu_*): total = summed durations of the label's ranges; self = total minus the directly nested labels
    (same thread). Device (gpu_*): LABEL_DEVICE_TIME_DEFINITION (0 for a label that launched nothing); NaN on a
    trace without device activity, where `source` is 'cpu' (else 'gpu'). ProfilerStep#N ranges are left out.
    Rows in order of first occurrence. prefix_filter: str or tuple of str.
    """
    trace = Trace.load(trace_or_path)
    L = trace.labels
    if not len(L):
        return pd.DataFrame({c: pd.Series(dtype=object) for c in LABEL_COLUMNS})
    child = L.loc[L["parent"] >= 0].groupby("parent")["duration_us"].sum()
    host = L.assign(self_us=L["duration_us"].to_numpy(float) - child.reindex(L.index, fill_value=0.0).to_numpy())
    first = host.sort_values("start_us", kind="stable").drop_duplicates("name")
    agg = host.groupby("name", sort=False).agg(count=("name", "size"), cpu_total_us=("duration_us", "sum"),
                                                cpu_self_us=("self_us", "sum"))
    names = L["name"].tolist()
    df = pd.DataFrame({
        "label": first["name"].to_numpy(),
        "count": agg.loc[first["name"], "count"].to_numpy(),
        "cpu_total_ms": agg.loc[first["name"], "cpu_total_us"].to_numpy() / 1e3,
        "cpu_self_ms": agg.loc[first["name"], "cpu_self_us"].to_numpy() / 1e3,
        "depth": first["depth"].to_numpy(),
        "parent": [names[p] if p >= 0 else "" for p in first["parent"].to_numpy(np.int64)],
    })
    if trace.source == "gpu":
        dev = label_device_times(trace)
        df["gpu_total_ms"] = dev.loc[df["label"], "total_us"].to_numpy() / 1e3
        df["gpu_self_ms"] = dev.loc[df["label"], "self_us"].to_numpy() / 1e3
    else:
        df["gpu_total_ms"] = df["gpu_self_ms"] = float("nan")
    df["source"] = trace.source
    if prefix_filter is not None:
        prefixes = (prefix_filter,) if isinstance(prefix_filter, str) else tuple(prefix_filter)
        df = df[df["label"].str.startswith(prefixes)]
    return df[LABEL_COLUMNS].reset_index(drop=True)


def _ms(df: pd.DataFrame, prefer: str) -> tuple[pd.Series, pd.Series]:
    if prefer not in _PREFER:
        raise ValueError(f"prefer must be one of {_PREFER}, got {prefer!r}")
    first, second = ("gpu", "cpu") if prefer == "gpu" else ("cpu", "gpu")
    a = df[f"{first}_total_ms"].astype(float)
    ms = a.where(a.notna(), df[f"{second}_total_ms"].astype(float))
    source = a.notna().map({True: first, False: second})
    return ms, source


def stage_table(df: pd.DataFrame, prefer: str = "gpu") -> pd.DataFrame:
    """Top-level stages (labels like '1_Data_Preparation') of a label_table: ms (`prefer` side, else the other),
    source (the side used), cpu_ms, gpu_ms and share of the stages' sum.

    Device time per LABEL_DEVICE_TIME_DEFINITION: host-heavy stages (image loading, export) launch little device
    work and show little device time; use prefer="cpu" for wall-clock shares. On a trace without device activity
    every stage falls back to host time (source 'cpu').
    """
    st = df[df["label"].astype(str).str.match(STAGE_RE)]
    ms, source = _ms(st, prefer)
    out = pd.DataFrame({"label": st["label"], "ms": ms, "source": source, "cpu_ms": st["cpu_total_ms"].astype(float),
                        "gpu_ms": st["gpu_total_ms"].astype(float)})
    total = out["ms"].sum()
    out["share"] = out["ms"] / total if total > 0 else float("nan")
    return out.reset_index(drop=True)
