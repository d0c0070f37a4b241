"""Notebook 07's figures of the ladder and the scaling sweep (wmbook.studies.motion re-exports them)."""

from __future__ import annotations

import numpy as np
import pandas as pd

__all__ = ["plot_ladder", "plot_scaling"]


def plot_ladder(lad, ax=None):
    """A MotionLadder's ms per step of every row (log scale), p20-p80 whiskers, the bytes floor as a line; failed or
    interpreted rows hatched."""
    import matplotlib.pyplot as plt  # noqa: PLC0415  heavy: matplotlib.pyplot

    if ax is None:
        _, ax = plt.subplots(figsize=(8, 3.2))
    names = [r.name.split(" + ")[-1] if r.stack else "eager" for r in lad.rows]
    med = np.array([r.fetch.median for r in lad.rows])
    err = np.array([[r.fetch.median - r.fetch.p20 for r in lad.rows], [r.fetch.p80 - r.fetch.median for r in lad.rows]])
    colors = ["#228833" if r.counts else "#BBBBBB" for r in lad.rows]
    bars = ax.bar(range(len(med)), med, yerr=err, color=colors, capsize=3)
    for b, r in zip(bars, lad.rows):
        if not r.counts:
            b.set_hatch("//")
    ax.axhline(lad.reference.floor_ms, color="#CC3311", ls="--", lw=1, label="bytes floor (copy bandwidth)")
    ax.set_yscale("log")
    ax.set_xticks(range(len(med)), [f"+ {n}" if i else n for i, n in enumerate(names)], rotation=20, ha="right")
    ax.set_ylabel("ms per step")
    ax.set_title(f"The fetch, one variant at a time ({lad.reference.num_envs} robots)")
    ax.legend(loc="upper right", fontsize=8)
    return ax


def plot_scaling(scaling: pd.DataFrame, ax=None):
    """ms per step against robots (log-log), one line per stack, the bytes floor dashed."""
    import matplotlib.pyplot as plt  # noqa: PLC0415  heavy: matplotlib.pyplot

    if ax is None:
        _, ax = plt.subplots(figsize=(6.5, 3.6))
    for stack, g in scaling.groupby("stack", sort=False):
        g = g.sort_values("num_envs")
        ax.errorbar(g["num_envs"], g["fetch ms"], yerr=[g["fetch ms"] - g["p20"], g["p80"] - g["fetch ms"]],
                    marker="o", ms=3, capsize=2, label=stack.split(" + ")[-1])
    f = scaling.drop_duplicates("num_envs").sort_values("num_envs")
    ax.plot(f["num_envs"], f["bytes floor ms"], "k--", lw=1, label="bytes floor")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("robots (num_envs)")
    ax.set_ylabel("ms per step")
    ax.set_title("Scaling: cost per step against robots")
    ax.legend(fontsize=7, ncol=2)
    return ax
