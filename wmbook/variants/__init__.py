"""Named optimizations ("variants") applied to a reference pipeline, by name, from a registry.

A variant is a transform of a freshly built reference pipeline applied from outside (never a copy of the model
code, never a flag inside it): it changes weights' dtype, flips a backend flag, swaps modules or one method of
a module (wmbook.variants.swaps), or compiles parts of the model. What it acts on it asks the workload object
(`ctx.workload.denoiser(pipe)`, `.compile_regions(pipe)`, `.conv_layouts(pipe)`, ...). A variant that needs a
workload feature (a KV cache, action modules) says so in `requires`; it applies to the workloads that have it.

Variants stack: a ladder row applies every variant of the rows above it plus its own. Process-wide switches
(TF32, cuDNN benchmark, attention backend) are restored between rows by `GlobalFlags`.

    from wmbook import variants
    wl = workloads.get("mg2")
    variants.known(wl)                                 # names that apply to a workload
    vs = variants.resolve(["tf32", "bf16"], wl)        # checks every name before any work; groups expand
    for v in vs: v.apply(pipe, ctx)

Every variant passes the correctness gate (wmbook.check) against the fp32 reference before its time counts;
`tolerance` names the per-dtype tolerance the gate uses once the variant is in effect.
"""

from . import builtin  # noqa: F401  (registers the built-in variants)
from .registry import (
                       FAMILIES,
                       GROUPS,
                       INDUCTOR_KEYS,
                       REGISTRY,
                       GlobalFlags,
                       UnknownVariantError,
                       Variant,
                       VariantContext,
                       get,
                       hygiene_parts,
                       known,
                       mixed_cudnn_search,
                       parse_labelled_stack,
                       register,
                       register_group,
                       resolve,
                       tolerance_for,
)

__all__ = ["FAMILIES", "GROUPS", "GlobalFlags", "INDUCTOR_KEYS", "REGISTRY", "UnknownVariantError", "Variant",
           "VariantContext", "get", "hygiene_parts", "known", "mixed_cudnn_search", "parse_labelled_stack", "register",
           "register_group", "resolve", "tolerance_for"]
