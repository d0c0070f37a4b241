"""torch.compile in a workload's scope (regional or whole), its modes and dynamic shapes."""

from __future__ import annotations

import logging

import torch
from torch._inductor.cudagraph_utils import cudagraphs_log

from ..registry import VariantContext, register

REGIONAL_RECOMPILE_LIMIT = 64


def raise_recompile_limit_for_regions() -> int:
    """The regions share their class's code; every distinct block shape (the UNet's channel widths, the DiT's
    blocks with and without action modules) is one cache entry of it: past the default limit of 8 dynamo would
    silently run the remaining blocks eagerly. Raised process-wide (GlobalFlags restores it); returns the limit."""
    from ..compile import get_recompile_limit, recompile_limit_name  # noqa: PLC0415  heavy: pandas (variants.compile)

    lim = max(get_recompile_limit(), REGIONAL_RECOMPILE_LIMIT)
    setattr(torch._dynamo.config, recompile_limit_name(), lim)
    return lim


_MODE_SUFFIX = {"default": "", "max-autotune-no-cudagraphs": "-max-autotune", "reduce-overhead": "-reduce-overhead"}


def compile_variant(scope: str, mode: str = "default", dynamic: bool = False) -> str:
    """The registered name of a compile variant."""
    return f"compile-{scope}" + ("-dynamic" if dynamic else "") + _MODE_SUFFIX[mode]


def _compile(scope: str, mode: str, dynamic: bool):
    def apply(pipe, ctx: VariantContext):
        from ..compile import CompileSpec, apply_compile  # noqa: PLC0415  heavy: pandas (variants.compile)

        if scope == "regional":
            ctx.notes["recompile_limit"] = f"recompile limit {raise_recompile_limit_for_regions()}"
        spec = CompileSpec(scope=scope, mode=mode, dynamic=dynamic, backend=ctx.compile_backend)
        regions = ctx.workload.compile_regions(pipe) if scope == "regional" else None
        ctx.notes[f"compile:{spec.name}"] = apply_compile(ctx.workload.compile_target(pipe), spec, regions=regions)
        ctx.compile_spec = spec
        if mode == "reduce-overhead":
            _new_cudagraph_step_per_forward(ctx.workload.denoiser(pipe))
            _note_cudagraph_skips(ctx.notes)

    return apply


_SKIP_NOTES: list = []  # the notes of the latest reduce-overhead row (inductor's skip messages go there)


class _CudagraphSkips(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        msg = record.getMessage()
        if _SKIP_NOTES and "skipping cudagraphs" in msg:
            reason = msg.split("skipping cudagraphs", 1)[1].strip(" :")
            _SKIP_NOTES[0]["reduce-overhead"] = f"inductor skipped its CUDA graphs {reason}: this row runs without them"


def _note_cudagraph_skips(notes: dict) -> None:
    """inductor may decline to capture (mutated inputs, CPU tensors, dynamic shapes) and say so only in a log line:
    the reason goes into the row's notes, which the ladder reads after the row's first calls, so a reduce-overhead
    row that ran without graphs says so beside its time."""
    _SKIP_NOTES[:] = [notes]
    if not any(isinstance(h, _CudagraphSkips) for h in cudagraphs_log.handlers):
        cudagraphs_log.addHandler(_CudagraphSkips())


for _scope, _mode, _dyn in (("regional", "default", False), ("regional", "default", True),
                            ("regional", "max-autotune-no-cudagraphs", False), ("whole", "default", False),
                            ("whole", "max-autotune-no-cudagraphs", False), ("regional", "reduce-overhead", False),
                            ("whole", "reduce-overhead", False)):
    register(compile_variant(_scope, _mode, _dyn), family="compile", gpu_only=_mode == "reduce-overhead",
             description=f"torch.compile, {_scope}, mode={_mode}, dynamic={_dyn}"
                         + (" (inductor's CUDA graphs: compare with cuda-graphs)"
                            if _mode == "reduce-overhead" else ""))(_compile(_scope, _mode, _dyn))


def _new_cudagraph_step_per_forward(model: torch.nn.Module) -> None:
    """reduce-overhead's pitfall: a graph's outputs are overwritten by its next replay. Every denoiser forward
    starts a new cudagraph-trees step (torch.compiler.cudagraph_mark_step_begin) and hands out copies of its
    outputs, so nothing the pipeline keeps (latents, the gate's reference outputs) is overwritten under it."""
    inner = model.forward

    def forward(*args, **kwargs):
        torch.compiler.cudagraph_mark_step_begin()
        out = inner(*args, **kwargs)
        return torch.utils._pytree.tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, out)

    model.forward = forward
