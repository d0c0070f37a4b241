"""Host side of a region: host-device syncs, CPU hotspots (aten ops by self time) and dtype casts."""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..trace import Trace
from .forward import FORWARD_LABEL, forward_count, in_forward
from .region import Region, activities, ops, runtime_calls, select

SYNC_RUNTIME = frozenset({"cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize",
                          "cudaMemcpy", "cuStreamSynchronize", "cuCtxSynchronize"})
SYNC_OPS = frozenset({"aten::item", "aten::_local_scalar_dense"})
CAST_OPS = ("aten::copy_", "aten::to", "aten::_to_copy")
HOTSPOTS = 25


def _reg(trace, region):
    trace = Trace.load(trace)
    return trace, (region if isinstance(region, Region) else select(trace, region))


def syncs(trace, region: str | Region | None = None) -> pd.DataFrame:
    """Synchronizing runtime calls, host reads of device values (aten::item, _local_scalar_dense) and device-to-host
    copies of the region: call, kind (runtime, aten, device), count, host_ms."""
    trace, reg = _reg(trace, region)
    R, O = runtime_calls(trace, reg), ops(trace, reg)
    rows = []
    for nm, g in R[R["name"].isin(SYNC_RUNTIME)].groupby("name"):
        rows.append({"call": nm, "kind": "runtime", "count": int(len(g)),
                     "host_ms": float(g["duration_us"].sum()) / 1e3})
    for nm, g in O[O["name"].isin(SYNC_OPS)].groupby("name"):
        rows.append({"call": nm, "kind": "aten", "count": int(len(g)), "host_ms": float(g["duration_us"].sum()) / 1e3})
    if trace.source == "gpu":
        K = activities(trace, reg)
        d2h = K[(K["kind"] == "gpu_memcpy") & K["name"].str.contains("DtoH", na=False)]
        if len(d2h):
            rows.append({"call": "Memcpy DtoH", "kind": "device", "count": int(len(d2h)), "host_ms": float("nan")})
    return pd.DataFrame(rows, columns=["call", "kind", "count", "host_ms"])


def _ops_in_forward(trace: Trace, O: pd.DataFrame, forward_label: str) -> np.ndarray:
    return in_forward(trace, O["label"].to_numpy(np.int64), forward_label) if len(O) else np.zeros(0, bool)


def sync_numbers(trace, region: str | Region | None = None, forward_label: str = FORWARD_LABEL) -> dict:
    """host_reads (every .item()/int()/float() of a tensor runs aten::_local_scalar_dense once), syncs (waits: on a
    GPU the explicit synchronize calls, else the reads), syncs_in_forward and syncs_per_forward."""
    trace, reg = _reg(trace, region)
    R, O = runtime_calls(trace, reg), ops(trace, reg)
    n_fwd = forward_count(trace, reg, forward_label)
    n_reads = int((O["name"] == "aten::_local_scalar_dense").sum()) if len(O) else 0
    n_sync_calls = int(R["name"].isin(SYNC_RUNTIME - {"cudaMemcpy"}).sum()) if len(R) else 0
    fwd = _ops_in_forward(trace, O, forward_label)
    in_fwd = int((O[fwd]["name"] == "aten::_local_scalar_dense").sum()) if len(O) else 0
    return {"host_reads": n_reads, "syncs": n_sync_calls if trace.source == "gpu" else n_reads,
            "syncs_in_forward": in_fwd, "syncs_per_forward": in_fwd / n_fwd if n_fwd else float("nan")}


def cpu_hotspots(trace, region: str | Region | None = None, forward_label: str = FORWARD_LABEL,
                 top: int = HOTSPOTS) -> pd.DataFrame:
    """The `top` aten ops of the region by host self time: name, count, cpu_self_ms, cpu_total_ms, per_forward."""
    trace, reg = _reg(trace, region)
    O = ops(trace, reg)
    if not len(O):
        return pd.DataFrame(columns=["name", "count", "cpu_self_ms", "cpu_total_ms", "per_forward"])
    n_fwd = forward_count(trace, reg, forward_label)
    hs = O[O["name"].str.startswith("aten::")].groupby("name").agg(
        count=("duration_us", "size"), cpu_self_ms=("self_us", "sum"), cpu_total_ms=("duration_us", "sum"))
    hs[["cpu_self_ms", "cpu_total_ms"]] /= 1e3
    out = hs.sort_values("cpu_self_ms", ascending=False).head(top).reset_index()
    out["per_forward"] = out["count"] / n_fwd if n_fwd else float("nan")
    return out


def casts(trace, region: str | Region | None = None, forward_label: str = FORWARD_LABEL) -> pd.DataFrame:
    """aten::copy_/to/_to_copy calls of the region: op, count, cpu_ms (host total), per_forward (inside forwards)."""
    trace, reg = _reg(trace, region)
    O = ops(trace, reg)
    if not len(O):
        return pd.DataFrame(columns=["op", "count", "cpu_ms", "per_forward"])
    n_fwd = forward_count(trace, reg, forward_label)
    fwd = _ops_in_forward(trace, O, forward_label)
    rows = []
    for nm in CAST_OPS:
        sel = O["name"] == nm
        rows.append({"op": nm, "count": int(sel.sum()), "cpu_ms": float(O.loc[sel, "duration_us"].sum()) / 1e3,
                     "per_forward": float((sel.to_numpy() & fwd).sum()) / n_fwd if n_fwd else float("nan")})
    return pd.DataFrame(rows)


def aten_ops_per_forward(trace, region: str | Region | None = None, forward_label: str = FORWARD_LABEL) -> float:
    """aten ops started inside the region's forwards, per forward."""
    trace, reg = _reg(trace, region)
    O = ops(trace, reg)
    n_fwd = forward_count(trace, reg, forward_label)
    if not len(O) or not n_fwd:
        return float("nan")
    aten = O["name"].str.startswith("aten::").to_numpy()
    return float((aten & _ops_in_forward(trace, O, forward_label)).sum()) / n_fwd
