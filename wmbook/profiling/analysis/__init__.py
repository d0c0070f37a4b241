"""Trace analysis, one function per question, each taking a `wmbook.profiling.trace.Trace` (or anything
`Trace.load` accepts) and returning a DataFrame:

    categories      the one category rule: activity_categories, op_categories, classify, CATEGORIES
    time_by_category  category_times, unclassified
    region          select (a region of a trace), work (the rows every time table sums), activities, ops
    labels          label_tree, label_table, stage_table, label_device_times, LABEL_DEVICE_TIME_DEFINITION
    forward         forward_split, forward_categories, part_categories, decode_ms, generated_units
    launches        launch_stats, trace_busy_ms, busy_ms, host_ms, idle_gaps
    host            syncs, cpu_hotspots, casts
    roofline        roofline, op_flops, op_bytes
    kernels         kernel_summary, kernel_account, format_account
    suggestions     suggest (from a Breakdown)

`wmbook.profiling.breakdown.analyze` composes them into a Breakdown.
"""

from .categories import CATEGORIES, activity_categories, classify, classify_cpu_op, op_categories  # noqa: F401
from .forward import (  # noqa: F401
    DECODE_LABEL_RE,
    DIT_FINE_LABELS,
    FORWARD_LABEL,
    decode_ms,
    forward_categories,
    forward_split,
    generated_units,
    part_categories,
)
from .host import (  # noqa: F401
    CAST_OPS,
    SYNC_OPS,
    SYNC_RUNTIME,
    aten_ops_per_forward,
    casts,
    cpu_hotspots,
    sync_numbers,
    syncs,
)
from .kernels import format_account, kernel_account, kernel_summary  # noqa: F401
from .labels import (  # noqa: F401
    LABEL_COLUMNS,
    LABEL_DEVICE_TIME_DEFINITION,
    label_device_times,
    label_table,
    label_tree,
    stage_table,
    top_level_labels,
)
from .launches import (  # noqa: F401
    LAUNCH_CALLS,
    SHORT_KERNEL_US,
    busy_ms,
    format_idle_gaps,
    host_ms,
    idle_gaps,
    launch_numbers,
    launch_stats,
    trace_busy_ms,
    union_ms,
)
from .region import Region, activities, ops, runtime_calls, select, work  # noqa: F401
from .roofline import op_bytes, op_flops, roofline  # noqa: F401
from .suggestions import NOTEBOOKS, suggest  # noqa: F401
from .time_by_category import category_table, category_times, unclassified, unclassified_table  # noqa: F401
