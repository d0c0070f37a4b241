"""Named optimizations ("variants") applied to a reference pipeline, by name, from a registry.

A variant is a transform of a freshly built reference pipeline (never a copy of the model code): it changes
weights' dtype, flips a backend flag, swaps a code path switch, or compiles parts of the model. Variants
stack: a ladder row applies every variant of the rows above it plus its own. Process-wide switches
(TF32, cuDNN benchmark, attention backend) are restored between rows by `GlobalFlags`.

    from wmbook import variants
    variants.known("mg2")                       # names that apply to a workload
    vs = variants.resolve(["tf32", "bf16"], "mg2")  # checks every name before any work
    for v in vs: v.apply(pipe, ctx)

Every variant passes the correctness gate (wmbook.check) against the fp32 reference before its time counts;
`tolerance` names the per-dtype tolerance the gate uses once the variant is in effect.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch

WORKLOADS = ("mg2", "wma")
FAMILIES = ("precision", "hygiene", "attention", "layout", "compile")
_TOL_ORDER = ("fp32", "tf32", "bf16", "fp16")  # looser to the right


class UnknownVariantError(ValueError):
    """A variant name that is not registered (or does not apply to the workload); the message lists the known ones."""


@dataclass
class VariantContext:
    """What a variant may need beyond the pipeline, and where it notes what it did."""

    workload: str
    device: torch.device
    notes: dict = field(default_factory=dict)  # variant name -> what it changed / measured (compile records, ...)


@dataclass(frozen=True)
class Variant:
    name: str
    family: str
    description: str
    apply: Callable[[Any, VariantContext], None]  # (pipeline, context) -> None, in place
    workloads: tuple[str, ...] = WORKLOADS
    tolerance: str | None = None  # dtype key of wmbook.check.TOLERANCES once this variant is in; None: unchanged
    gpu_only: bool = False

    def check_device(self, device: torch.device) -> None:
        if self.gpu_only and device.type != "cuda":
            raise ValueError(f"variant {self.name!r} needs a CUDA device; on {device.type} leave it out")


REGISTRY: dict[str, Variant] = {}


def register(name: str, *, family: str, description: str, workloads=WORKLOADS, tolerance: str | None = None,
             gpu_only: bool = False):
    """Decorator registering `fn(pipe, ctx)` as the variant `name`."""
    if family not in FAMILIES:
        raise ValueError(f"family={family!r} is not allowed; allowed values: {list(FAMILIES)}")
    if tolerance is not None and tolerance not in _TOL_ORDER:
        raise ValueError(f"tolerance={tolerance!r} is not allowed; allowed values: {list(_TOL_ORDER)}")
    bad = [w for w in workloads if w not in WORKLOADS]
    if bad:
        raise ValueError(f"workloads {bad} are not allowed; allowed values: {list(WORKLOADS)}")

    def deco(fn):
        if name in REGISTRY:
            raise ValueError(f"variant {name!r} is already registered")
        REGISTRY[name] = Variant(name=name, family=family, description=description, apply=fn,
                                 workloads=tuple(workloads), tolerance=tolerance, gpu_only=gpu_only)
        return fn

    return deco


def _load_all() -> None:
    """Import the modules that register variants (lazily, so importing wmbook.variants stays cheap)."""
    from . import builtin  # noqa: F401


def known(workload: str | None = None) -> list[str]:
    """Registered variant names, optionally only those that apply to `workload`."""
    _load_all()
    if workload is not None and workload not in WORKLOADS:
        raise ValueError(f"workload={workload!r} is not allowed; allowed values: {list(WORKLOADS)}")
    return [n for n, v in REGISTRY.items() if workload is None or workload in v.workloads]


def get(name: str, workload: str | None = None) -> Variant:
    """The variant `name` (UnknownVariantError lists the known names, for `workload` if given)."""
    _load_all()
    v = REGISTRY.get(name)
    if v is None or (workload is not None and workload not in v.workloads):
        where = f" for workload {workload!r}" if workload else ""
        raise UnknownVariantError(f"variant {name!r} is not known{where}; known variants: {known(workload)}")
    return v


def resolve(names, workload: str, device: torch.device | str | None = None) -> list[Variant]:
    """Check a list of names (all of them, before any work): known, applicable, no repeats, runnable here."""
    if isinstance(names, str):
        names = [names]
    try:
        names = list(names)
    except TypeError:
        raise ValueError(f"variants must be a list of names, got {names!r}") from None
    out = []
    for n in names:
        if not isinstance(n, str):
            raise ValueError(f"variant names must be strings, got {n!r}")
        out.append(get(n, workload))
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ValueError(f"variants {dup} are listed more than once")
    if device is not None:
        for v in out:
            v.check_device(torch.device(device))
    return out


def tolerance_for(vs) -> str:
    """The loosest tolerance key among the variants in effect (fp32 when none changes precision)."""
    keys = [v.tolerance for v in vs if v.tolerance] or ["fp32"]
    return max(keys, key=_TOL_ORDER.index)


class GlobalFlags:
    """Snapshot of the process-wide switches variants touch; `restore()` puts them back."""

    def __init__(self):
        from ..models import attention as attn

        self.matmul_tf32 = torch.backends.cuda.matmul.allow_tf32
        self.cudnn_tf32 = torch.backends.cudnn.allow_tf32
        self.precision = torch.get_float32_matmul_precision()
        self.cudnn_benchmark = torch.backends.cudnn.benchmark
        self.attention = attn.get_attention_backend() if hasattr(attn, "get_attention_backend") else None
        from .compile import get_recompile_limit

        self.recompile_limit = get_recompile_limit()

    def restore(self) -> None:
        from ..models import attention as attn

        torch.backends.cuda.matmul.allow_tf32 = self.matmul_tf32
        torch.backends.cudnn.allow_tf32 = self.cudnn_tf32
        torch.set_float32_matmul_precision(self.precision)
        torch.backends.cudnn.benchmark = self.cudnn_benchmark
        if self.attention is not None:
            attn.set_attention_backend(self.attention)
        from .compile import recompile_limit_name

        setattr(torch._dynamo.config, recompile_limit_name(), self.recompile_limit)


__all__ = ["FAMILIES", "GlobalFlags", "REGISTRY", "UnknownVariantError", "Variant", "VariantContext", "WORKLOADS",
           "get", "known", "register", "resolve", "tolerance_for"]
