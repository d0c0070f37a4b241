"""Static state and CUDA graphs of the denoiser (notebook 06)."""

from __future__ import annotations

import torch

from ...graphs import GraphedCallable
from .. import swaps
from ..registry import VariantContext, register


@register("static-caches", family="graphs", requires=("kv_cache",),
          description="the caches of a generation allocated once and reset and refilled in place for the next "
                      "(same addresses every generation: what a CUDA-graph replay needs)")
def _static_caches(pipe, ctx: VariantContext):
    ctx.notes["static-caches"] = ctx.workload.static_caches(pipe)


@register("ring-kv-cache", family="graphs", requires=("kv_cache",),
          description="self-attention and action KV caches as rings of the window's size, written through a device "
                      "index tensor: no eviction copy, and every block once the ring is full has the same shapes and "
                      "addresses whatever its write position (one graph for all of them)")
def _ring_kv_cache(pipe, ctx: VariantContext):
    swaps.swap_class(pipe, swaps.RingCachePipeline)
    ctx.notes["ring-kv-cache"] = "KV caches as rings of the attention window"


@register("cuda-graphs", family="graphs", gpu_only=True,
          description="the workload's graph targets captured in CUDA graphs (static input/output buffers, one memory "
                      "pool, warm-up before capture) and replayed: the denoiser forward (and, for the UNet, the DDIM "
                      "update of video and heads), one launch instead of thousands per forward")
def _cuda_graphs(pipe, ctx: VariantContext):
    pool = torch.cuda.graph_pool_handle()
    wrapped = []
    for t in ctx.workload.graph_targets(pipe):
        g = GraphedCallable(getattr(t.owner, t.attr), name=t.name, key_fn=t.key_fn, pool=pool, device=ctx.device)
        setattr(t.owner, t.attr, g)
        wrapped.append(g)
    pipe.graphed = wrapped  # what graphed_callables(pipe) reports on
    ctx.notes["cuda-graphs"] = "graphs of " + ", ".join(g.name for g in wrapped)


def graphed_callables(pipe) -> list:
    """The GraphedCallables the cuda-graphs variant put into a pipeline (their table() says what was captured)."""
    return list(getattr(pipe, "graphed", []))
