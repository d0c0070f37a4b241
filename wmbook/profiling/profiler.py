"""Old home of the torch.profiler wrapper and the label tables, kept for existing imports.

The wrapper (`profile`, `ProfileResult`) lives in `wmbook.profiling.collect`, trace loading in
`wmbook.profiling.trace`, and `label_table`/`stage_table` in `wmbook.profiling.analysis.labels`.
"""

from .analysis.labels import LABEL_COLUMNS, STAGE_RE, label_table, stage_table  # noqa: F401
from .collect import KEY_AVERAGE_COLUMNS, ProfileResult, profile  # noqa: F401
from .trace import load_trace  # noqa: F401
