"""Named optimizations of the motion fetch, applied from outside to a fresh `MotionDataTerm` (the reference), in
ladder order. A small registry of its own: these act on a motion term, not on a denoiser pipeline, so they are not
in wmbook.variants (whose transforms need a denoiser, its regions and its decoder).

    stack = resolve(["packed-gather", "contiguous-layout"], device)   # every name checked before any work
    term = apply_stack(stack, library, num_envs=4096)                  # a new term over the same library

Each ladder row is the previous row plus one variant; one that replaces what earlier ones did says so in `supersedes`
(the row's effective stack leaves those out). Every row passes the correctness gate (against the float64 reference,
wmbook.studies.motion) before its time counts.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Callable

import torch

from ..graphs import GraphedCallable
from ..kernels import interpreting, runs_triton
from .fetch import MotionDataTerm, get_motion_state_fused, get_motion_state_grouped, get_motion_state_packed, no_label
from .library import MotionLibrary


class UnknownMotionVariantError(ValueError):
    """A name that is not a motion variant; the message lists the known ones."""


@dataclass
class MotionContext:
    """What a variant may need beyond the term, and where it notes what it did."""

    device: torch.device
    compile_backend: str = "inductor"
    notes: dict = field(default_factory=dict)  # variant name -> what it changed, or why it could not


@dataclass(frozen=True)
class MotionVariant:
    name: str
    description: str
    apply: Callable[[MotionDataTerm, MotionContext], None]
    gpu_only: bool = False
    needs: tuple[str, ...] = ()  # variants that must be in the stack before it
    supersedes: tuple[str, ...] = ()  # earlier variants whose effect it replaces

    def __str__(self) -> str:  # a stack prints as the names it was given by (a results row's params)
        return self.name

    def check_device(self, device: torch.device) -> None:
        if self.gpu_only and device.type != "cuda":
            raise ValueError(f"variant {self.name!r} needs a CUDA device; on {device.type} leave it out")


REGISTRY: dict[str, MotionVariant] = {}  # in ladder order


def register(name: str, *, description: str, gpu_only: bool = False, needs=(), supersedes=()):
    """Decorator registering `fn(term, ctx)` as the motion variant `name` (the ladder follows registration order)."""

    def deco(fn):
        if name in REGISTRY:
            raise ValueError(f"motion variant {name!r} is already registered")
        REGISTRY[name] = MotionVariant(name, description, fn, gpu_only, tuple(needs), tuple(supersedes))
        return fn

    return deco


@register("packed-gather", description="one packed table (a row per frame, the fields side by side): both frames of "
          "every query in one gather, fields as views of the gathered rows; the reference's math")
def _packed_gather(term: MotionDataTerm, ctx: MotionContext) -> None:
    term.library.packed()  # built once per library, outside the timed calls
    term.get_motion_state = get_motion_state_packed


@register("contiguous-layout", needs=("packed-gather",),
          description="the table's rows grouped by the math applied (vectors, joint values, quaternions), one lerp and "
          "one slerp over contiguous blocks, the results written in place into the term's output rows (no store copy)")
def _contiguous_layout(term: MotionDataTerm, ctx: MotionContext) -> None:
    term.library.grouped()
    term.use_output_rows()
    term.get_motion_state = get_motion_state_grouped


@register("fused-quat", needs=("contiguous-layout",),
          description="the transforms fused: the root's rotation matrix once per query applied to every vector in one "
          "batched matmul, every body's relative rotation in one quaternion product")
def _fused_quat(term: MotionDataTerm, ctx: MotionContext) -> None:
    term.get_motion_state = get_motion_state_fused


@register("compile", description="torch.compile of the whole fetch (prepare_query, the state, the stores; the stage "
          "labels left out: a labelled range breaks the graph)")
def _compile(term: MotionDataTerm, ctx: MotionContext) -> None:
    term.stage = no_label
    term._fetch = torch.compile(term._fetch, backend=ctx.compile_backend, dynamic=False)
    ctx.notes["compile"] = f"backend {ctx.compile_backend}"


def _triton_fetch(term: MotionDataTerm, loop_i32: torch.Tensor, kernel: bool):
    from .kernel import motion_fetch, motion_fetch_ref  # noqa: PLC0415  heavy: triton kernel module

    lib = term.library
    args = (lib.grouped(), lib.start, lib.num_frames, lib.length, lib.dt, loop_i32, term.motion_ids,
            term.episode_times, term.frame_offsets, lib.num_joints, lib.num_bodies)
    if kernel:
        motion_fetch(*args, out=term.out)
    else:
        term.out.copy_(motion_fetch_ref(*args))
    return term.state


@register("triton", needs=("contiguous-layout",), supersedes=("fused-quat", "compile"),
          description="the whole fetch as one Triton kernel (query times, frame blend, gather, lerp, slerp, "
          "transform), writing the output rows in place: one launch per step")
def _triton(term: MotionDataTerm, ctx: MotionContext) -> None:
    kernel = runs_triton(ctx.device)
    if term.library.dtype != torch.float32:
        raise ValueError(f"variant 'triton' reads an fp32 table; the library is {term.library.dtype}")
    term._fetch = functools.partial(_triton_fetch, term, term.library.loop.to(torch.int32), kernel)
    term.stage = no_label
    if not kernel:
        ctx.notes["triton"] = "no CUDA device and no Triton interpreter: ran the kernel's torch reference"
    elif ctx.device.type == "cpu" and interpreting():
        ctx.notes["triton"] = "Triton's CPU interpreter: checks the kernel, its time is not a speed"


@register("cuda-graph", gpu_only=True, description="the per-step fetch captured as a CUDA graph (wmbook.graphs: two "
          "eager calls, then capture; the term's tensors keep their addresses, so a replay needs no input copies)")
def _cuda_graph(term: MotionDataTerm, ctx: MotionContext) -> None:
    term._fetch = GraphedCallable(term._fetch, name="motion fetch", warmup=2, clone_outputs=False, device=ctx.device)


def known(device: torch.device | None = None) -> list[str]:
    """The motion variants in ladder order (those that run on `device`, when given)."""
    return [n for n, v in REGISTRY.items() if device is None or not v.gpu_only or torch.device(device).type == "cuda"]


def _needs(name: str) -> list[str]:
    """What `name` needs before it, what those need included, in ladder order."""
    out = []
    for m in REGISTRY[name].needs:
        out += [x for x in [*_needs(m), m] if x not in out]
    return out


def resolve(names, device: torch.device | str | None = None) -> list[MotionVariant]:
    """Check a list of names (all of them, before any work): known, no repeats, what each needs before it, runnable
    on `device`."""
    if isinstance(names, (str, MotionVariant)):
        names = [names]
    names = [str(n) if isinstance(n, MotionVariant) else n for n in names]  # resolved ones are checked the same way
    out = []
    for i, n in enumerate(names):
        v = REGISTRY.get(n)
        if v is None:
            raise UnknownMotionVariantError(f"variant {n!r} is not known; known variants: {known()}")
        missing = [m for m in _needs(n) if m not in names[:i]]
        if missing:
            raise ValueError(f"variant {n!r} needs {missing} before it in the stack")
        if n in names[:i]:
            raise ValueError(f"variant {n!r} is listed more than once")
        if device is not None:
            v.check_device(torch.device(device))
        out.append(v)
    return out


def effective(stack) -> list[str]:
    """The names of a stack whose effect is still there (a later variant's `supersedes` removes earlier ones)."""
    names = [v.name if isinstance(v, MotionVariant) else v for v in stack]
    gone = {s for n in names for s in REGISTRY[n].supersedes}
    return [n for n in names if n not in gone]


def apply_stack(stack, library: MotionLibrary, num_envs: int, frames_per_env: int = 1, step_dt: float = 0.02,
                ctx: MotionContext | None = None) -> MotionDataTerm:
    """A new term over `library` with the variants of `stack` (names or MotionVariants) applied in order."""
    vs = resolve(stack, library.device)
    ctx = ctx or MotionContext(device=library.device)
    term = MotionDataTerm(library, num_envs, frames_per_env, step_dt)
    for v in vs:
        v.apply(term, ctx)
    return term


__all__ = ["MotionContext", "MotionVariant", "REGISTRY", "UnknownMotionVariantError", "apply_stack", "effective",
           "known", "register", "resolve"]
