"""Profiling: labels, section timing, torch.profiler wrapper, trace breakdown, monitors, sessions, reports."""

from .labels import detail_enabled, detail_label, label, labelled, labels_enabled, set_labels  # noqa: F401
from .profiler import (  # noqa: F401
    ProfileResult,
    block_table,
    label_table,
    load_trace,
    profile,
    stage_table,
)
from .sections import SectionTimer, collapse_indices  # noqa: F401
from .config import ProfilingConfig, load_config  # noqa: F401
from .monitor import ResourceMonitor, live_view  # noqa: F401
from .session import (  # noqa: F401
    ProfilingSession,
    add_profiling_event,
    current_session,
    measure_overhead,
    profile_block_computation,
    profile_diffusion_step,
    profile_method,
    profile_model_parameters,
    profile_session,
    rank_info,
    set_profiling,
)
from .report import load_report  # noqa: F401
from .aggregate import aggregate_reports  # noqa: F401
