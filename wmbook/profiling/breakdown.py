"""Bottleneck breakdown of a torch.profiler Chrome trace: where the device time of a labelled region goes.

`analyze(trace)` returns a `Breakdown` with, for one region (a label such as `2_Pipeline_Inference`):

- GPU time by operator category (GEMM, attention, convolution, normalization, elementwise, copy/cast,
  reduction, memcpy/memset, other), by the one category rule (`wmbook.profiling.analysis.categories`);
- GPU time by label as a tree (self and total) following the label hierarchy (LABEL_DEVICE_TIME_DEFINITION);
- the split of one denoiser forward by its fine labels (attention, FFN, norms, ...);
- GPU idle time, kernel-launch statistics, host-device syncs and CPU hotspots;
- a roofline table (achieved TFLOP/s and GB/s against the measured ceilings of the device);
- ranked suggestions, each naming the notebook that addresses it.

Accounting rule: a kernel (or memcpy/memset) belongs to the label that was innermost on the launching
host thread when its launch call ran (runtime event matched by correlation id). It is in the region when
that label or one of its ancestors is the region label. GPU busy time = summed kernel durations (each
kernel once); the union of kernel intervals (overlap across streams counted once) is reported beside it,
and idle = GPU span of the region minus that union. Every kernel lands in exactly one category, so the
category table adds up to the busy time.

The trace is parsed once (`wmbook.profiling.trace.Trace`); each table is one function of
`wmbook.profiling.analysis`, and `analyze` composes them. The names below that moved there (and to
`wmbook.profiling.collect`) are re-exported here for existing callers.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pandas as pd

from . import plots
from .analysis import (
    CAST_OPS,
    CATEGORIES,
    DECODE_LABEL_RE,
    DIT_FINE_LABELS,
    FORWARD_LABEL,
    LABEL_DEVICE_TIME_DEFINITION,
    SHORT_KERNEL_US,
    aten_ops_per_forward,
    casts,
    category_times,
    classify,
    classify_cpu_op,
    cpu_hotspots,
    decode_ms,
    forward_categories,
    forward_split,
    generated_units,
    kernel_summary,
    label_tree,
    launch_numbers,
    launch_stats,
    op_bytes,
    op_flops,
    part_categories,
    roofline,
    select,
    suggest,
    sync_numbers,
    syncs,
    top_level_labels,
    trace_busy_ms,
    unclassified,
)
from .analysis.suggestions import NOTEBOOKS  # noqa: F401
from .collect import device_busy_ms, profile_calls
from .jsonable import finite_or_none, jsonable
from .plots import plot_categories, plot_forward_split, plot_label_tree, plot_roofline
from .trace import Trace


@dataclass
class Breakdown:
    """All tables of one region. Times in ms unless a column says otherwise."""

    region: str | None
    source: str  # "gpu" (kernels) or "cpu" (CPU self time of aten ops: a trace without device activity)
    categories: pd.DataFrame
    unclassified: pd.DataFrame
    label_tree: pd.DataFrame
    forward_split: pd.DataFrame
    forward_categories: pd.DataFrame
    part_categories: pd.DataFrame  # category x (denoiser forwards, decoder, rest), ms
    launch_stats: pd.DataFrame
    syncs: pd.DataFrame
    cpu_hotspots: pd.DataFrame
    casts: pd.DataFrame
    roofline: pd.DataFrame
    suggestions: pd.DataFrame
    stats: dict = field(default_factory=dict)
    ceilings: dict | None = None

    @property
    def basis(self) -> str:
        """What the `ms` columns measure: GPU kernel time, or CPU self time when the trace has no device work."""
        return "GPU" if self.source == "gpu" else "CPU self"

    def tables(self) -> dict[str, pd.DataFrame]:
        return {
            "categories": self.categories, "label_tree": self.label_tree, "forward_split": self.forward_split,
            "forward_categories": self.forward_categories, "part_categories": self.part_categories,
            "launch_stats": self.launch_stats,
            "syncs": self.syncs, "cpu_hotspots": self.cpu_hotspots, "casts": self.casts,
            "roofline": self.roofline, "suggestions": self.suggestions, "unclassified": self.unclassified,
        }  # fmt: skip

    def summary(self) -> dict:
        s = dict(self.stats)
        top = self.categories.head(5)
        s["top_categories"] = [
            {"category": c, "ms": float(m), "share": float(sh)}
            for c, m, sh in zip(top["category"], top["ms"], top["share"])
        ]
        rf = self.roofline.set_index("category") if len(self.roofline) else None
        for cat, key in (("GEMM/linear", "gemm"), ("attention", "attention"), ("convolution", "conv")):
            if rf is not None and cat in rf.index:
                s[f"{key}_tflops"] = finite_or_none(rf.at[cat, "tflops"])
                s[f"{key}_frac_of_ceiling"] = finite_or_none(rf.at[cat, "frac_of_ceiling"])
        return s

    def to_dict(self) -> dict:
        """JSON-serialisable: summary plus every table as records."""
        return {
            "region": self.region, "source": self.source, "summary": jsonable(self.summary()),
            "tables": {k: jsonable(v.to_dict(orient="records")) for k, v in self.tables().items()},
            "ceilings": jsonable(self.ceilings),
        }  # fmt: skip

    def to_json(self, **kw) -> str:
        return json.dumps(self.to_dict(), **kw)

    # plots (matplotlib only when asked for)
    def plot_categories(self, ax=None):
        return plots.plot_categories(self, ax)

    def plot_label_tree(self, ax=None, **kw):
        return plots.plot_label_tree(self, ax, **kw)

    def plot_forward_split(self, ax=None):
        return plots.plot_forward_split(self, ax)

    def plot_roofline(self, ax=None):
        return plots.plot_roofline(self, ax)


def analyze(
    trace_or_path,
    *,
    region: str | None = "2_Pipeline_Inference",
    ceilings: dict | None = None,
    forward_label: str = FORWARD_LABEL,
    fine_labels=DIT_FINE_LABELS,
    decode_label_re: str = DECODE_LABEL_RE,
) -> Breakdown:
    """Break down the device time of `region` (a label name; None = the whole trace).

    trace_or_path: a Trace, a chrome-trace dict or a .json/.json.gz path. ceilings: measured device ceilings
    (wmbook.device.measure_ceilings) for the roofline; None leaves the ceiling columns empty. fine_labels: the
    labels that split one `forward_label` range.
    """
    trace = Trace.load(trace_or_path)
    reg = select(trace, region)
    categories = category_times(trace, reg)
    split = forward_split(trace, reg, forward_label, fine_labels)
    launches = launch_numbers(trace, reg, forward_label)
    stats: dict = {"region": region, "source": trace.source, "busy_ms": launches["busy_ms"],
                   "forwards": split.attrs["forwards"],
                   "forward_ms": split.attrs["forward_total_ms"] / split.attrs["forwards"]
                   if split.attrs["forwards"] else float("nan")}
    stats.update({k: v for k, v in launches.items() if k not in ("busy_ms", "forwards")})
    stats.update(sync_numbers(trace, reg, forward_label))
    cast_table = casts(trace, reg, forward_label)
    stats["aten_ops_per_forward"] = aten_ops_per_forward(trace, reg, forward_label)
    stats["casts_per_forward"] = float(cast_table["per_forward"].sum()) if len(cast_table) else float("nan")
    # shares used by suggestions
    busy = stats["busy_ms"]
    stats["decode_ms"] = decode_ms(trace, reg, decode_label_re)
    stats["decode_share"] = stats["decode_ms"] / busy if busy > 0 else float("nan")
    stats["forward_share"] = split.attrs["forward_total_ms"] / busy if busy > 0 else float("nan")
    # forwards per generated unit: per block (causal DiT) or per sampling pass (DDIM two-pass loop)
    units, unit = generated_units(trace, reg)
    stats["forward_unit"] = unit
    n_fwd = stats["forwards"]
    stats["forwards_per_block"] = n_fwd / units if units and n_fwd else float("nan")

    bd = Breakdown(region=region, source=trace.source, categories=categories, unclassified=unclassified(trace, reg),
                   label_tree=label_tree(trace, reg), forward_split=split,
                   forward_categories=forward_categories(trace, reg, forward_label, fine_labels),
                   part_categories=part_categories(trace, reg, forward_label, decode_label_re),
                   launch_stats=launch_stats(trace, reg, forward_label), syncs=syncs(trace, reg),
                   cpu_hotspots=cpu_hotspots(trace, reg, forward_label), casts=cast_table,
                   roofline=roofline(trace, reg, ceilings), suggestions=pd.DataFrame(), stats=stats,
                   ceilings=ceilings)
    bd.suggestions = suggest(bd)
    return bd


__all__ = [
    "Breakdown", "CAST_OPS", "CATEGORIES", "DIT_FINE_LABELS", "FORWARD_LABEL", "LABEL_DEVICE_TIME_DEFINITION",
    "SHORT_KERNEL_US", "analyze", "classify", "classify_cpu_op", "device_busy_ms", "kernel_summary", "op_bytes",
    "op_flops", "plot_categories", "plot_forward_split", "plot_label_tree", "plot_roofline", "profile_calls",
    "suggest", "top_level_labels", "trace_busy_ms",
]  # fmt: skip
