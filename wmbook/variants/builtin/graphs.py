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
        g = GraphedCallable(getattr(t.owner, t.attr), name=t.name, key_fn=t.key_fn, pool=pool, device=ctx.device,
                            memset_kernels=memset_kernels(pipe))
        setattr(t.owner, t.attr, g)
        wrapped.append(g)
    pipe.graphed = [*getattr(pipe, "graphed", []), *wrapped]  # what graphed_callables(pipe) reports on
    ctx.notes["cuda-graphs"] = "graphs of " + ", ".join(g.name for g in wrapped)


@register("conditioning-compile", family="graphs", requires=("ddim",), denoiser=False,
          description="the iteration's conditioning encoders compiled by torch.compile: the current frame's image "
                      "tokens (CLIP's ViT-H tower, then the resampler) and the SD VAE encoder up to its posterior's "
                      "moments (its GroupNorms, activations and copies fused; eagerly each is a kernel of its own); "
                      "before conditioning-cuda-graphs, which then captures the compiled code")
def _conditioning_compile(pipe, ctx: VariantContext):
    vae = _conditioning_vae(pipe, "conditioning-compile")
    if isinstance(pipe.image_tokens, GraphedCallable) or isinstance(vae._encode, GraphedCallable):
        raise ValueError("conditioning-compile must come before conditioning-cuda-graphs: a captured graph replays "
                         "the kernels it was captured with")
    pipe.image_tokens = torch.compile(pipe.image_tokens, backend=ctx.compile_backend, dynamic=False)
    vae._encode = torch.compile(vae._encode, backend=ctx.compile_backend, dynamic=False)
    ctx.notes["conditioning-compile"] = f"image tokens and VAE encoder compiled ({ctx.compile_backend})"


def _conditioning_vae(pipe, name: str):
    """The pipeline's SD VAE, checked to have what the conditioning variants wrap (ValueError naming `name`)."""
    vae = getattr(pipe, "vae", None)
    if not callable(getattr(vae, "_encode", None)) or not callable(getattr(pipe, "image_tokens", None)):
        raise ValueError(f"{name} needs a pipeline with image_tokens and a diffusers SD VAE (AutoencoderKL._encode); "
                         f"{type(pipe).__name__} with {type(vae).__name__} has not")
    return vae


@register("conditioning-cuda-graphs", family="graphs", requires=("ddim",), gpu_only=True, denoiser=False,
          description="the iteration's conditioning encoders captured in CUDA graphs: the current frame's image tokens "
                      "(CLIP's ViT-H tower, then the resampler) and the SD VAE encoder up to its posterior's moments; "
                      "the posterior sample stays eager, drawn from the iteration's generator as before. Eagerly these "
                      "are many small launches an iteration, which the GPU waits for")
def _conditioning_cuda_graphs(pipe, ctx: VariantContext):
    vae = _conditioning_vae(pipe, "conditioning-cuda-graphs")
    # a pool of their own: the denoiser's graphs replay while these tensors are still read (the conditioning lives
    # for the whole iteration)
    pool = torch.cuda.graph_pool_handle() if ctx.device.type == "cuda" else None
    tokens = GraphedCallable(pipe.image_tokens, name="image tokens", pool=pool, device=ctx.device,
                             memset_kernels=memset_kernels(pipe))
    # the encoder up to the moments: diffusers' encode builds the posterior from what _encode returns, and its sample
    # draws from a generator made anew every iteration, which a captured graph cannot take
    encoder = GraphedCallable(vae._encode, name="VAE encoder", pool=pool, device=ctx.device,
                              memset_kernels=memset_kernels(pipe))
    pipe.image_tokens, vae._encode = tokens, encoder
    pipe.graphed = [*getattr(pipe, "graphed", []), tokens, encoder]
    ctx.notes["conditioning-cuda-graphs"] = "graphs of the image tokens and the VAE encoder"


@register("graph-memset-kernels", family="graphs", gpu_only=True, denoiser=False,
          description="the small memsets in the captured graphs (the 4-byte counters cuBLAS's persistent GEMMs, "
                      "cuDNN's attention and some of its convolutions zero before each launch) replaced by kernel "
                      "nodes writing the same bytes before the graphs are instantiated (in a profile the GPU idles a "
                      "few microseconds around a memset node, under one around a kernel node); every graph of the "
                      "pipeline, those made by the graph variants before it (captured ones captured again) and after "
                      "it; the kernels and what they compute are unchanged")
def _graph_memset_kernels(pipe, ctx: VariantContext):
    graphed = graphed_callables(pipe)
    again = [g.name for g in graphed if g.captured]
    for g in graphed:
        g.memset_kernels = True
        if g.captured:  # a graph is rewritten before it is instantiated: capture it again (after its warm-up calls)
            g.reset()
    pipe.memset_kernels = True  # the graph variants after this one read it (memset_kernels(pipe))
    ctx.notes["graph-memset-kernels"] = (f"small memsets as kernel nodes in {len(graphed)} graphed callables"
                                         + (f" ({len(again)} captured again)" if again else "")
                                         + (" and those made later" if graphed else " made later"))


def memset_kernels(pipe) -> bool:
    """Whether graph-memset-kernels is in the pipeline's stack (a graph variant passes it to its GraphedCallables)."""
    return bool(getattr(pipe, "memset_kernels", False))


def graphed_callables(pipe) -> list:
    """The GraphedCallables the cuda-graphs variant put into a pipeline (their table() says what was captured)."""
    return list(getattr(pipe, "graphed", []))


def graph_calls(pipe) -> dict:
    """{(callable, resets, signature): (eager calls, replays)} of a pipeline's CUDA graphs so far (`resets`: the
    callable's GraphedCallable.resets, after which its signatures count from zero again)."""
    return {(r["callable"], g.resets, r["signature"]): (r["eager calls"], r["replays"])
            for g in graphed_callables(pipe) for r in g.table().to_dict("records") if "replays" in r}


def captures(pipe, before: dict | None = None) -> list:
    """GraphedCallable.table() of each of a pipeline's graphs; with `before` (graph_calls of the pipeline earlier),
    the eager calls and replays counted since (all of them for a graph dropped and captured again in between, as
    graph-memset-kernels does)."""
    graphed = graphed_callables(pipe)
    tables = [g.table() for g in graphed]
    for g, t in zip(graphed, tables) if before else []:
        for k, col in enumerate(("eager calls", "replays")):
            if col in t:
                t[col] = [v - before.get((c, g.resets, s), (0, 0))[k]
                          for c, s, v in zip(t["callable"], t["signature"], t[col])]
    return tables


def warm_up(pipe, run, n: int = 1, again=None) -> int:
    """`n` untimed runs of `pipe` before timed ones (`run()`; none when `n` is 0), the last followed by more (`again()`,
    default `run()`: a shorter run of the same shapes will do) while an input signature of the pipeline's CUDA graphs
    that the run before used is still warming up (GraphedCallable.warming), at most the graphed callables' largest
    warm-up count more. A graph is captured at its warm-up count + 1'th call, so one called once a run (a wma
    iteration's conditioning and decode, a stream's first-frame decode) would otherwise run eagerly and be captured
    inside the timed runs after a single warm-up run. Returns the runs made."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"n={n!r} is not allowed; allowed values: an integer >= 0 (untimed runs)")
    for _ in range(n - 1):
        run()
    if n == 0:
        return 0
    graphed = [g for g in graphed_callables(pipe) if g.disabled_reason is None]
    calls, fn = 0, run
    for _ in range(1 + max((g.warmup for g in graphed), default=0)):
        before = [g.warming() for g in graphed]
        fn()
        calls, fn = calls + 1, again or run
        if not any(c > b.get(k, 0) for g, b in zip(graphed, before) for k, c in g.warming().items()):
            break
    return n - 1 + calls
