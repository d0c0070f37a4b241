"""Profiling: labels, torch.profiler wrapper, trace analysis."""

from .labels import label, labelled, labels_enabled, set_labels  # noqa: F401
