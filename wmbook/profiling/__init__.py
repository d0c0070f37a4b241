"""Profiling: labels, torch.profiler wrapper, trace analysis."""

from .labels import detail_enabled, detail_label, label, labelled, labels_enabled, set_labels  # noqa: F401
from .profiler import (  # noqa: F401
    ProfileResult,
    block_table,
    label_table,
    load_trace,
    profile,
    stage_table,
)
