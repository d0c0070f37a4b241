"""Where the device time of a short trace goes (notebook 04's per-category columns, tools/compare_compile.py)."""

from __future__ import annotations

import pandas as pd

from ..trace import Trace
from .labels import label_device_times, label_table
from .launches import union_ms
from .region import activities


def kernel_summary(trace, calls: int = 1, top: int = 20) -> dict[str, pd.DataFrame]:
    """Per call of a trace of `calls` calls: `kernels` (the `top` kernel names by total time: ms, count, category,
    mean_us, share), `categories` (ms, kernels, share per category; the one category rule of analyze, enclosing
    SDPA/convolution ops included) and `labels` (per label name: ms = self_ms, total_ms, share of ms, source;
    device time per LABEL_DEVICE_TIME_DEFINITION; compiled regions keep their labels only where Dynamo traced
    them). `categories.attrs["busy_ms"]` is the GPU busy time per call (trace_busy_ms / calls).

    On a trace without device activity `kernels` and `categories` are empty (busy_ms 0) and `labels` holds host
    time (source 'cpu')."""
    trace = Trace.load(trace)
    K = activities(trace)
    if not len(K):
        cats = pd.DataFrame()
        cats.attrs["busy_ms"] = 0.0
        return {"kernels": pd.DataFrame(), "categories": cats, "labels": _host_labels(trace, calls)}
    total = float(K["duration_us"].sum()) / 1e3 / calls
    g = K.groupby("name").agg(ms=("duration_us", "sum"), count=("duration_us", "size"), category=("category", "first"))
    g["ms"] = g["ms"] / 1e3 / calls
    g["count"] = g["count"] / calls
    g["mean_us"] = g["ms"] * 1e3 / g["count"]
    g["share"] = g["ms"] / total
    kernels = g.sort_values("ms", ascending=False).head(top).reset_index()
    kernels["name"] = kernels["name"].str.slice(0, 90)
    c = K.groupby("category")["duration_us"].agg(["sum", "size"]).rename(columns={"sum": "ms", "size": "kernels"})
    c["ms"] = c["ms"] / 1e3 / calls
    c["kernels"] = c["kernels"] / calls
    c["share"] = c["ms"] / total
    cats = c.sort_values("ms", ascending=False).reset_index()
    cats.attrs["busy_ms"] = union_ms(K["start_us"].to_numpy(float), K["end_us"].to_numpy(float)) / calls
    dev = label_device_times(trace)
    lab = pd.DataFrame({"ms": dev["self_us"] / 1e3 / calls, "self_ms": dev["self_us"] / 1e3 / calls,
                        "total_ms": dev["total_us"] / 1e3 / calls})
    lab = lab[lab["total_ms"] > 0]
    lab["share"] = lab["ms"] / total
    lab["source"] = "gpu"
    lab = lab.rename_axis("label_name").sort_values("ms", ascending=False, kind="stable").reset_index()
    return {"kernels": kernels, "categories": cats, "labels": lab}


def _host_labels(trace: Trace, calls: int) -> pd.DataFrame:
    cols = ["label_name", "ms", "self_ms", "total_ms", "share", "source"]
    lt = label_table(trace)
    if not len(lt):
        return pd.DataFrame(columns=cols)
    top = lt.loc[lt["depth"] == 0, "cpu_total_ms"].sum()
    out = pd.DataFrame({"label_name": lt["label"], "ms": lt["cpu_self_ms"] / calls,
                        "self_ms": lt["cpu_self_ms"] / calls, "total_ms": lt["cpu_total_ms"] / calls})
    out["share"] = out["ms"] / (top / calls) if top > 0 else float("nan")
    out["source"] = "cpu"
    return out.sort_values("ms", ascending=False, kind="stable").reset_index(drop=True)[cols]


def kernel_account(trace, top: int = 20) -> dict:
    """kernel_summary of a one-call trace as plain data (a tool's JSON): `gpu_busy_ms`, `categories_ms` (category ->
    ms, longest first) and `top` (the `top` longest kernels as records: name, ms, count, category)."""
    ks = kernel_summary(trace, top=top)
    cats, kernels = ks["categories"], ks["kernels"]
    by_cat = dict(zip(cats["category"], (float(x) for x in cats["ms"]))) if len(cats) else {}
    top_rows = kernels[["name", "ms", "count", "category"]].to_dict("records") if len(kernels) else []
    return {"gpu_busy_ms": float(cats.attrs["busy_ms"]), "categories_ms": by_cat, "top": top_rows}


def format_account(account: dict, top_kernels: bool = True) -> str:
    """kernel_account's result as printed lines: GPU busy and ms per category, then (`top_kernels`) the longest
    kernels."""
    lines = [f"  GPU busy {account['gpu_busy_ms']:.2f} ms; by category (ms): "
             + ", ".join(f"{k} {v:.2f}" for k, v in account["categories_ms"].items())]
    if top_kernels and account["top"]:
        lines.append(pd.DataFrame(account["top"]).to_string(max_colwidth=90))
    return "\n".join(lines)
