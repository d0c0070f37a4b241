"""The built-in variants, one module per family, registered in this order when wmbook.variants is imported:
precision, dtype/host-sync hygiene (one variant per change), attention, layout, fused kernels and fp8, compile, static
state and CUDA graphs, the streaming decoder, and what runs where.

Each function takes a freshly built reference pipeline and the VariantContext and changes the pipeline in place,
from outside: what it acts on comes from the workload object (`ctx.workload`), how it changes behaviour from
wmbook.variants.swaps. None of them branches on a workload's name.
"""

# the import order is the registry's order (wmbook.variants.known lists variants in it)
# isort: off
from . import precision  # noqa: F401
from . import hygiene  # noqa: F401
from . import attention  # noqa: F401
from . import layout  # noqa: F401
from . import kernels  # noqa: F401
from . import compile  # noqa: F401
from . import graphs  # noqa: F401
from . import decoder  # noqa: F401
from . import passes  # noqa: F401
# isort: on
from .attention import sage_unavailable
from .compile import REGIONAL_RECOMPILE_LIMIT, _note_cudagraph_skips, compile_variant, raise_recompile_limit_for_regions
from .decoder import buffered_decoder
from .graphs import captures, graph_calls, graphed_callables, warm_up
from .kernels import fp8_static_unavailable, fp8_unavailable

__all__ = ["REGIONAL_RECOMPILE_LIMIT", "_note_cudagraph_skips", "buffered_decoder", "captures", "compile_variant",
           "fp8_static_unavailable", "fp8_unavailable", "graph_calls", "graphed_callables",
           "raise_recompile_limit_for_regions", "sage_unavailable", "warm_up"]
