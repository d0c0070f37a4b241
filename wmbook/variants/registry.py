"""The variant registry: what a variant is, how one registers, how names resolve against a workload."""


from __future__ import annotations

import argparse
import operator
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch._inductor.config as inductor_config

from ..models import attention as attn

FAMILIES = ("precision", "hygiene", "attention", "layout", "kernels", "compile", "graphs", "decoder")
_TOL_ORDER = ("fp32", "tf32", "bf16", "fp16", "fp8")  # looser to the right


class UnknownVariantError(ValueError):
    """A variant name that is not registered (or does not apply to the workload); the message lists the known ones."""


@dataclass
class VariantContext:
    """What a variant may need beyond the pipeline, and where it notes what it did."""

    workload: Any  # wmbook.workloads.Workload
    device: torch.device
    compile_backend: str = "inductor"  # what the compile variants hand torch.compile
    notes: dict = field(default_factory=dict)  # variant name -> what it changed
    compile_spec: Any = None  # the CompileSpec a compile variant applied (wmbook.variants.compile)


@dataclass(frozen=True)
class Variant:
    name: str
    family: str
    description: str
    apply: Callable[[Any, VariantContext], None]  # (pipeline, context) -> None, in place
    requires: frozenset[str] = frozenset()  # workload features it needs (wmbook.workloads.Workload.features)
    tolerance: str | None = None  # dtype key of wmbook.check.TOLERANCES once this variant is in; None: unchanged
    gpu_only: bool = False
    frames_judged: bool = True  # False: its frames cannot be compared with the reference's (random-weight stand-in)
    # False: it leaves the denoiser's forward as it was (the decoder, the conditioning encoders, the order of the
    # passes), so a ladder row adding it is built on the row before's pipeline, its compiled and captured denoiser kept
    denoiser: bool = True

    def __str__(self) -> str:  # a stack prints as the names it was given by (a results row's params)
        return self.name

    def applies_to(self, workload) -> bool:
        return self.requires <= workload.features

    def check_device(self, device: torch.device) -> None:
        if self.gpu_only and device.type != "cuda":
            raise ValueError(f"variant {self.name!r} needs a CUDA device; on {device.type} leave it out")


REGISTRY: dict[str, Variant] = {}
# every variant here acts on a world-model pipeline: workloads without a denoiser (the motion workload has its own
# variants, wmbook.motion.variants) get none of them
WORLD_MODEL = frozenset({"denoiser"})
GROUPS: dict[str, tuple[str, ...]] = {}  # a name that stands for several variants, in order


def register(name: str, *, family: str, description: str, requires=(), tolerance: str | None = None,
             gpu_only: bool = False, frames_judged: bool = True, denoiser: bool | None = None):
    """Decorator registering `fn(pipe, ctx)` as the variant `name`. `denoiser`: whether it changes the denoiser's
    forward (Variant.denoiser); default: every family but the decoder's."""
    if family not in FAMILIES:
        raise ValueError(f"family={family!r} is not allowed; allowed values: {list(FAMILIES)}")
    if tolerance is not None and tolerance not in _TOL_ORDER:
        raise ValueError(f"tolerance={tolerance!r} is not allowed; allowed values: {list(_TOL_ORDER)}")

    def deco(fn):
        if name in REGISTRY or name in GROUPS:
            raise ValueError(f"variant {name!r} is already registered")
        REGISTRY[name] = Variant(name=name, family=family, description=description, apply=fn,
                                 requires=frozenset(requires) | WORLD_MODEL, tolerance=tolerance, gpu_only=gpu_only,
                                 frames_judged=frames_judged,
                                 denoiser=family != "decoder" if denoiser is None else denoiser)
        return fn

    return deco


def register_group(name: str, members: tuple[str, ...]) -> None:
    """`name` stands for `members` (those that apply to the workload) wherever a list of variants is given."""
    GROUPS[name] = tuple(members)


def _workload(workload):
    """`workload` as given: a Workload object (what the callers hold) or None; a name is refused, since resolving it
    here would tie the variants to the workloads package that uses them."""
    if workload is None or hasattr(workload, "features"):
        return workload
    raise TypeError(f"workload={workload!r} is not allowed here; pass the Workload object "
                    f"(wmbook.workloads.get({workload!r}))")


def known(workload=None, family: str | None = None) -> list[str]:
    """Registered variant names, optionally only those that apply to `workload` (a Workload) and
    belong to `family`."""
    wl = _workload(workload)
    return [n for n, v in REGISTRY.items()
            if (wl is None or v.applies_to(wl)) and (family is None or v.family == family)]


def hygiene_parts(workload) -> list[str]:
    """The dtype/host-sync hygiene variants that apply to `workload`, in ladder order (the group `hygiene`)."""
    return known(workload, family="hygiene")


def get(name: str, workload=None) -> Variant:
    """The variant `name` (UnknownVariantError lists the known names, for `workload` if given)."""
    wl = _workload(workload)
    v = REGISTRY.get(name)
    if v is None or (wl is not None and not v.applies_to(wl)):
        where = f" for workload {wl.name!r}" if wl is not None else ""
        raise UnknownVariantError(f"variant {name!r} is not known{where}; known variants: {known(wl)}"
                                  f"{'; groups: ' + str(sorted(GROUPS)) if GROUPS else ''}")
    return v


def parse_labelled_stack(text: str) -> tuple[str, list[str]]:
    """'LABEL=variant,variant,...' (a tool's --stack) -> (label, names); the names are not resolved here. A bad form
    raises argparse.ArgumentTypeError, which argparse shows as the option's error."""
    label, sep, names = text.partition("=")
    if not sep or not label.strip() or not names.strip():
        raise argparse.ArgumentTypeError(f"--stack {text!r} is not allowed; allowed values: "
                                         "'LABEL=variant,variant,...'")
    return label.strip(), [n.strip() for n in names.split(",") if n.strip()]


def resolve(names, workload, device: torch.device | str | None = None) -> list[Variant]:
    """Check a list of names (all of them, before any work): known, applicable, no repeats, runnable here.
    A group name expands to its members that apply to the workload. Variants already resolved (a RunConfig's
    stacks) are checked the same way and pass through as they are, so resolving a stack twice looks up nothing."""
    if isinstance(names, (str, Variant)):
        names = [names]
    try:
        names = list(names)
    except TypeError:
        raise ValueError(f"variants must be a list of names, got {names!r}") from None
    wl = _workload(workload)
    expanded = []
    for n in names:
        if isinstance(n, Variant):
            expanded.append(n.name)
        elif not isinstance(n, str):
            raise ValueError(f"variant names must be strings, got {n!r}")
        elif n in GROUPS:
            expanded += [m for m in GROUPS[n] if wl is None or REGISTRY[m].applies_to(wl)]
        else:
            expanded.append(n)
    given = {n.name: n for n in names if isinstance(n, Variant)}
    out = [given[n] if n in given and (wl is None or given[n].applies_to(wl)) else get(n, wl) for n in expanded]
    dup = sorted({n for n in expanded if expanded.count(n) > 1})
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
        self.matmul_tf32 = torch.backends.cuda.matmul.allow_tf32
        self.cudnn_tf32 = torch.backends.cudnn.allow_tf32
        self.precision = torch.get_float32_matmul_precision()
        self.cudnn_benchmark = torch.backends.cudnn.benchmark
        self.attention = attn.get_attention_backend() if hasattr(attn, "get_attention_backend") else None
        from .compile import get_recompile_limit  # noqa: PLC0415  heavy: pandas (variants.compile)

        self.recompile_limit = get_recompile_limit()
        self.inductor = {k: operator.attrgetter(k)(inductor_config) for k in INDUCTOR_KEYS}

    def restore(self) -> None:
        torch.backends.cuda.matmul.allow_tf32 = self.matmul_tf32
        torch.backends.cudnn.allow_tf32 = self.cudnn_tf32
        torch.set_float32_matmul_precision(self.precision)
        torch.backends.cudnn.benchmark = self.cudnn_benchmark
        if self.attention is not None:
            attn.set_attention_backend(self.attention)
        from .compile import recompile_limit_name  # noqa: PLC0415  heavy: pandas (variants.compile)

        setattr(torch._dynamo.config, recompile_limit_name(), self.recompile_limit)
        for k, v in self.inductor.items():
            _set_dotted(inductor_config, k, v)


def mixed_cudnn_search(stacks) -> str:
    """Why stacks measured in one process cannot differ in `cudnn-benchmark` ("" when they do not): cuDNN's first
    pick per convolution shape holds for the process (the variant says why), so the later stacks would run the first
    one's algorithms. `stacks`: lists of variant names or Variants."""
    searched = {any(getattr(v, "name", v) == "cudnn-benchmark" for v in s) for s in stacks}
    if len(searched) < 2:
        return ""
    return ("cudnn-benchmark is in some stacks and not in others; cuDNN keeps the algorithm it first picked for a "
            "convolution shape for the whole process, so compare them in separate runs")


# inductor settings a library may switch on process-wide when a variant calls it (torchao's
# recommended_inductor_config_setter, run by its quantization configs unless set_inductor_config=False)
INDUCTOR_KEYS = ("coordinate_descent_tuning", "coordinate_descent_check_all_directions", "force_fuse_int_mm_with_mul",
                 "fx_graph_cache", "triton.unique_kernel_names")


def _set_dotted(obj, key: str, value) -> None:
    *head, last = key.split(".")
    for part in head:
        obj = getattr(obj, part)
    setattr(obj, last, value)


def effective(stack: list) -> list:
    """The variants a row applies: a later compile variant replaces an earlier one (one compile per model)."""
    last = max((i for i, v in enumerate(stack) if v.family == "compile"), default=None)
    return [v for i, v in enumerate(stack) if v.family != "compile" or i == last]


def apply_variants(pipe, workload, stack: list, device: torch.device, compile_backend: str = "inductor"):
    """Resolved variants applied to `pipe` in place, in order, the effective compile only: their VariantContext."""
    ctx = VariantContext(workload=workload, device=device, compile_backend=compile_backend)
    for v in effective(stack):
        v.apply(pipe, ctx)
    return ctx


__all__ = ["FAMILIES", "GROUPS", "GlobalFlags", "REGISTRY", "UnknownVariantError", "Variant", "VariantContext",
           "apply_variants", "effective", "get", "hygiene_parts", "known", "register", "register_group", "resolve",
           "tolerance_for"]
