"""Plots of a Breakdown (matplotlib is imported only when one is drawn). Breakdown.plot_* call these."""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..frontend import num


def _ax(ax, figsize=(7, 3.2)):
    import matplotlib.pyplot as plt  # noqa: PLC0415  heavy: matplotlib.pyplot

    if ax is None:
        _, ax = plt.subplots(figsize=figsize)
    return ax


def plot_categories(bd, ax=None):
    ax = _ax(ax)
    df = bd.categories[bd.categories["ms"] > 0].iloc[::-1]
    ax.barh(df["category"], df["ms"], color="tab:blue")
    for y, (v, s) in enumerate(zip(df["ms"], df["share"])):
        ax.text(v, y, f" {s:.0%}", va="center", fontsize=8)
    ax.set_xlabel(f"{bd.basis} time, ms ({bd.region or 'whole trace'})")
    ax.set_title("Time by operator category")
    return ax


def plot_label_tree(bd, ax=None, max_depth: int = 3, min_share: float = 0.01):
    """Icicle chart: one row per depth, each label a bar as wide as its total device time."""
    ax = _ax(ax, figsize=(11, 1.0 + 0.9 * (max_depth + 1)))
    t = bd.label_tree
    if not len(t):
        ax.set_axis_off()
        return ax
    import matplotlib.pyplot as plt  # noqa: PLC0415  heavy: matplotlib.pyplot

    roots = t[t["depth"] == 0]
    total = float(roots["total_ms"].sum())
    cmap = plt.get_cmap("tab20")
    children = {k: g.sort_values("total_ms", ascending=False) for k, g in t.groupby("parent_path")}

    def draw(path, x0, depth, color_i):
        row = t[t["path"] == path].iloc[0]
        w = float(row["total_ms"])
        if depth > max_depth or w <= 0:
            return
        ax.barh(-depth, w, left=x0, height=0.9, color=cmap(color_i % 20), edgecolor="white", linewidth=0.5)
        fits = int(w / total * 150)  # characters of fontsize 7 that fit in the bar (11 in wide axes)
        if fits >= 4:
            text = str(row["label"])
            text = text if len(text) <= fits else text[: fits - 1] + "…"
            ax.text(x0 + w / 2, -depth, text, ha="center", va="center", fontsize=7)
        x = x0
        for i, (_, c) in enumerate(children.get(path, pd.DataFrame()).iterrows()):
            if c["total_ms"] / total < min_share:
                x += c["total_ms"]
                continue
            draw(c["path"], x, depth + 1, color_i * 3 + i + 1)
            x += c["total_ms"]

    x = 0.0
    for i, (_, r) in enumerate(roots.sort_values("total_ms", ascending=False).iterrows()):
        draw(r["path"], x, 0, i)
        x += r["total_ms"]
    ax.set_yticks([-d for d in range(max_depth + 1)], [f"depth {d}" for d in range(max_depth + 1)])
    ax.set_xlabel(f"{bd.basis} time, ms")
    ax.set_title("Label tree (width = total time; labels under 1% hidden)")
    return ax


def plot_forward_split(bd, ax=None):
    ax = _ax(ax)
    df = bd.forward_split.iloc[::-1]
    ax.barh(df["fine_label"], df["ms_per_forward"], color="tab:orange")
    ax.set_xlabel(f"{bd.basis} ms per forward")
    ax.set_title(f"Inside one forward ({bd.forward_split.attrs.get('forwards', 0)} forwards)")
    return ax


def plot_roofline(bd, ax=None):
    """Log-log achieved throughput vs arithmetic intensity, with the measured compute and copy roofs."""
    ax = _ax(ax, figsize=(6, 4))
    rf = bd.roofline.dropna(subset=["intensity_flop_per_byte"])
    ceil = (bd.ceilings or {}).get("gemm_tflops")
    bw = (bd.ceilings or {}).get("copy_gbps")
    xs = np.logspace(-2, 4, 200)
    if ceil and bw:
        roof = np.minimum(ceil * 1e12, xs * bw * 1e9) / 1e12
        ax.plot(xs, roof, "k-", lw=1, label=f"roof: {_sig(ceil)} TFLOP/s, {_sig(bw)} GB/s (measured)")
    for _, r in rf.iterrows():
        if r["tflops"] == r["tflops"]:
            y = r["tflops"]
        elif r["gbps"] == r["gbps"]:
            y = r["gbps"] * 1e9 * r["intensity_flop_per_byte"] / 1e12
        else:
            continue
        # each category named in the legend: annotations beside the points overlap where points cluster
        ax.scatter([r["intensity_flop_per_byte"]], [y], s=30 + 4 * r["ms"] ** 0.5, zorder=3,
                   label=f"{r['category']} ({_sig(y)} TFLOP/s)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity, FLOP/byte (memory-bound categories placed at 0.25)")
    ax.set_ylabel("achieved TFLOP/s")
    ax.set_title("Roofline")
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)
    return ax


def _sig(x) -> str:
    """3 significant digits, no scientific notation for everyday magnitudes (0.1 TFLOP/s is not '0')."""
    return num(x, 3)


