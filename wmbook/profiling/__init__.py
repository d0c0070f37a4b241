"""Profiling: labels, section timing, collecting traces (collect), parsing them (trace), analysing them (analysis,
breakdown), monitors, sessions, reports."""

from .aggregate import aggregate_reports, aggregate_sessions, group_reports  # noqa: F401
from .analysis import LABEL_DEVICE_TIME_DEFINITION, kernel_summary, label_table, stage_table, trace_busy_ms  # noqa: F401
from .collect import ProfileResult, device_busy_ms, profile, profile_calls  # noqa: F401
from .config import ProfilingConfig, load_config  # noqa: F401
from .decorators import (  # noqa: F401
    add_profiling_event,
    profile_block_computation,
    profile_diffusion_step,
    profile_method,
    profile_model_parameters,
    profile_session,
)
from .labels import detail_enabled, detail_label, label, labelled, labels_enabled, set_labels  # noqa: F401
from .liveview import LiveView, live_view  # noqa: F401
from .monitor import ResourceMonitor  # noqa: F401
from .overhead import label_timing_cost_us, measure_overhead  # noqa: F401
from .report import load_report  # noqa: F401
from .sections import SectionTimer, collapse_indices  # noqa: F401
from .session import ProfilingSession, current_session, rank_info, set_profiling  # noqa: F401
from .trace import Trace, load_trace  # noqa: F401
