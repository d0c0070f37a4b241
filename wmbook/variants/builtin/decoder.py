"""The streaming decoder: caches in place, channels-last, compiled and captured steps, the tiny stand-in."""

from __future__ import annotations

import os

import torch

from ...graphs import GraphedCallable
from .. import swaps
from ..registry import VariantContext, register
from .compile import raise_recompile_limit_for_regions
from .graphs import memset_kernels


def refuse_after_compile(name: str, owner, attr: str, keeps: str) -> None:
    """ValueError naming variant `name` where the decode step `owner.attr` is compiled (vae-compile) or captured
    (vae-cuda-graphs) already: such a step keeps `keeps` it was made with, so the variant must come before them."""
    if getattr(owner, "compiled_step", False) or isinstance(getattr(owner, attr, None), GraphedCallable):
        raise ValueError(f"{name} must come before vae-compile and vae-cuda-graphs: a compiled or captured {keeps}")


def buffered_decoder(decoder):
    """The streaming decoder with its causal caches kept in place (swapped in once)."""
    from ..vae_stream import BufferedStreamingDecoder  # noqa: PLC0415  heavy: diffusers (variants.vae_stream)

    if not isinstance(decoder, BufferedStreamingDecoder):
        if getattr(decoder, "compiled_step", False):
            raise ValueError("vae-stream-buffers (or vae-cuda-graphs, which brings it) must come before vae-compile: "
                             "the compiled step was made from the decoder without buffers")
        swaps.swap_class(decoder, BufferedStreamingDecoder).use_buffers()
    return decoder


@register("vae-stream-buffers", family="decoder", requires=("streaming_decoder",),
          description="the streaming Wan decoder's causal caches kept in place: one preallocated, zero-bordered input "
                      "window per causal convolution (input written once, convolved without padding, past frames moved "
                      "to the front) instead of a clone, two concatenations and an F.pad copy per convolution and "
                      "frame")
def _vae_stream_buffers(pipe, ctx: VariantContext):
    buffered_decoder(ctx.workload.streaming_decoder(pipe))
    ctx.notes["vae-stream-buffers"] = "decoder causal caches in preallocated input windows"


@register("vae-channels-last", family="decoder", requires=("streaming_decoder",),
          description="the streaming decoder in channels_last_3d (NDHWC): its 3-D convolution weights, its input and, "
                      "with vae-stream-buffers, every causal convolution's input window")
def _vae_channels_last(pipe, ctx: VariantContext):
    dec = ctx.workload.streaming_decoder(pipe)
    if hasattr(dec, "use_channels_last"):  # a stand-in decoder of 2-D convolutions (vae-tiny) sets its own layout
        ctx.notes["vae-channels-last"] = f"{dec.use_channels_last()} decoder convolution weights in channels-last"
        return
    n = swaps.to_memory_format(dec.vae.decoder, torch.channels_last_3d)
    n += swaps.to_memory_format(dec.vae.decoder, torch.channels_last)  # the resamplers' 2-D convolutions
    swaps.swap_class(dec, swaps.FramesInMemoryFormat)
    dec.memory_format = torch.channels_last_3d
    if hasattr(dec, "windows"):
        dec.use_buffers(torch.channels_last_3d)
    ctx.notes["vae-channels-last"] = f"{n} decoder convolution weights in channels-last"


@register("vae-block-step", family="decoder", requires=("streaming_decoder",),
          description="the streaming Wan decoder's step given a steady block's latent frames in one call (the stream's "
                      "first latent frame and the call after it as before): the same causal convolutions over the same "
                      "past frames, a third of the calls, each convolution over 3x the frames; with vae-stream-buffers "
                      "the block's windows are set up before the first steady call (outside a compiled or captured "
                      "step)")
def _vae_block_step(pipe, ctx: VariantContext):
    dec = ctx.workload.streaming_decoder(pipe)
    if not hasattr(dec, "step_calls"):
        raise ValueError(f"vae-block-step needs the Wan decoder's streaming step; {type(dec).__name__} decodes a "
                         "block in one call already")
    swaps.swap_class(dec, swaps.BlockStep)
    ctx.notes["vae-block-step"] = "a steady block's latent frames decoded in one step call"


@register("vae-window-kernels", family="decoder", requires=("streaming_decoder",),
          description="the streaming Wan decoder's steps on its input windows with kernels of our own: each RMS "
                      "norm + SiLU written by one Triton kernel straight into the next causal convolution's window, "
                      "the carried frames moved with one copy a window, the head's 3-channel convolution an implicit "
                      "GEMM in Triton; the other convolutions cuDNN's. Eager, for vae-cuda-graphs (not with "
                      "vae-compile, whose window writes it replaces); needs vae-channels-last first. A comparison row: "
                      "the compiled step is faster (its other fusions outweigh its whole-window copies)")
def _vae_window_kernels(pipe, ctx: VariantContext):
    from ..vae_stream import WindowKernelDecoder  # noqa: PLC0415  heavy: diffusers (variants.vae_stream)

    dec = ctx.workload.streaming_decoder(pipe)
    if hasattr(dec, "decoder_step"):
        raise ValueError("vae-window-kernels runs the Wan decoder's causal convolutions; the stand-in decoder "
                         "(vae-tiny) has none")
    if getattr(dec, "compiled_step", False) or hasattr(dec, "regions"):
        raise ValueError("vae-window-kernels replaces what vae-compile compiles: use one of them (vae-window-kernels "
                         "with vae-cuda-graphs)")
    if getattr(dec, "head_gemm", False):
        raise ValueError("vae-window-kernels runs the head in Triton, vae-head-gemm as a GEMM: use one of them")
    buffered_decoder(dec)
    swaps.swap_class(dec, WindowKernelDecoder).use_window_kernels()
    ctx.notes["vae-window-kernels"] = "decoder norms written into the convolution windows, head convolution in Triton"


@register("vae-head-gemm", family="decoder", requires=("streaming_decoder",),
          description="the streaming Wan decoder's head convolution (96 -> 3 channels, 3 x 3 x 3) as one GEMM of its "
                      "window's channels by every tap's weights and a sum of the products' shifted slices: the window "
                      "read once instead of once per tap; before vae-compile, which compiles it")
def _vae_head_gemm(pipe, ctx: VariantContext):
    from ..vae_stream import HeadGemmDecoder  # noqa: PLC0415  heavy: diffusers (variants.vae_stream)

    dec = ctx.workload.streaming_decoder(pipe)
    if hasattr(dec, "decoder_step"):
        raise ValueError("vae-head-gemm runs the Wan decoder's head; the stand-in decoder (vae-tiny) has none")
    if getattr(dec, "compiled_step", False) or hasattr(dec, "regions") or hasattr(dec, "weights_kc"):
        raise ValueError("vae-head-gemm must come before vae-compile, vae-compile-regional and vae-window-kernels: "
                         "each runs the head its own way")
    swaps.swap_class(buffered_decoder(dec), HeadGemmDecoder)
    ctx.notes["vae-head-gemm"] = "decoder head convolution as one GEMM and a sum of shifted slices"


@register("vae-upsample-fold", family="decoder", requires=("frame_decoder",),
          description="the decoder's nearest 2x upsamplings and the 3 x 3 convolution after each as one stride-2 "
                      "transposed convolution of the low-resolution input (4 x 4 taps, sums of the original's): each "
                      "output reads 2 x 2 inputs instead of 3 x 3 (4/9 of those convolutions' multiply-adds) and the "
                      "upsampled tensor is never written; the same outputs up to the order of additions. Before "
                      "vae-compile and vae-cuda-graphs")
def _vae_upsample_fold(pipe, ctx: VariantContext):
    from ..upsample_fold import fold_upsample_convs  # noqa: PLC0415

    if "streaming_decoder" in ctx.workload.features:
        owner, attr = ctx.workload.streaming_decoder(pipe), "decode_frame"
        if hasattr(owner, "decoder_step"):
            raise ValueError("vae-upsample-fold folds the Wan decoder's resamplers; the stand-in decoder (vae-tiny) "
                             "has none")
    else:
        owner, attr = pipe, "decode_step"
    refuse_after_compile("vae-upsample-fold", owner, attr, "step keeps the modules it was made with")
    n = fold_upsample_convs(owner.vae.decoder)
    ctx.notes["vae-upsample-fold"] = (f"{n} decoder upsampling + 3 x 3 convolution pairs as stride-2 transposed "
                                      "convolutions" if n else "no nearest-upsampling convolution in this decoder")


def _vae_compile(mode: str):
    def apply(pipe, ctx: VariantContext):
        dec = ctx.workload.streaming_decoder(pipe) if "streaming_decoder" in ctx.workload.features else None
        if hasattr(dec, "regions"):
            raise ValueError("vae-compile and vae-compile-regional both compile the decoder: use one of them")
        if hasattr(dec, "weights_kc"):
            raise ValueError("vae-compile after vae-window-kernels: the window kernels replace what it compiles; use "
                             "one of them")
        step = ctx.workload.decoder_step(pipe)
        eager = getattr(step.owner, step.attr)
        compiled = torch.compile(eager, mode=None if mode == "default" else mode, backend=ctx.compile_backend,
                                 dynamic=False)
        if step.compiled is None:
            setattr(step.owner, step.attr, compiled)
        else:
            def decode_step(*args, **kwargs):  # the calls the workload says to compile; the others stay eager
                return (compiled if step.compiled(args) else eager)(*args, **kwargs)

            setattr(step.owner, step.attr, decode_step)
        step.owner.compiled_step = True
        ctx.notes[f"vae-compile:{mode}"] = f"decoder step compiled ({mode}, {ctx.compile_backend})"

    return apply


for _mode, _suffix in (("default", ""), ("max-autotune-no-cudagraphs", "-max-autotune")):
    register(f"vae-compile{_suffix}", family="decoder", requires=("frame_decoder",),
             description=f"torch.compile of the decoder's per-frame step (mode={_mode}; a streaming decoder's steady "
                         f"frames); the first decode pays the compilation")(_vae_compile(_mode))


@register("vae-compile-regional", family="decoder", requires=("streaming_decoder",),
          description="torch.compile of the streaming Wan decoder's regions for its steady frames: each residual "
                      "block, the head (norm + SiLU + conv_out) and the other causal convolutions, with their cache "
                      "windows as arguments (vae-stream-buffers comes with it), so blocks of one shape share a "
                      "compiled graph: a compile per distinct block shape instead of the whole step's; the attention "
                      "and the resamplers' 2-D convolutions stay eager")
def _vae_compile_regional(pipe, ctx: VariantContext):
    from ..vae_stream import RegionalCompiledDecoder  # noqa: PLC0415  heavy: diffusers (variants.vae_stream)

    dec = ctx.workload.streaming_decoder(pipe)
    if hasattr(dec, "decoder_step"):
        raise ValueError("vae-compile-regional compiles the Wan decoder's blocks; the stand-in decoder (vae-tiny) has "
                         "none: use vae-compile")
    if getattr(dec, "compiled_step", False):
        raise ValueError("vae-compile-regional and vae-compile both compile the decoder: use one of them")
    if getattr(dec, "head_gemm", False):
        raise ValueError("vae-compile-regional compiles the head as conv_out; vae-head-gemm runs it as a GEMM: use one "
                         "of them")
    buffered_decoder(dec)
    swaps.swap_class(dec, RegionalCompiledDecoder).compile_regions(backend=ctx.compile_backend)
    # one compiled graph per distinct block shape (and layout): more than dynamo's default of 8 for one function
    limit = raise_recompile_limit_for_regions()
    ctx.notes["vae-compile-regional"] = (f"decoder residual blocks, head and causal convolutions compiled as regions "
                                         f"({ctx.compile_backend}; recompile limit {limit})")


@register("vae-cuda-graphs", family="decoder", requires=("frame_decoder",), gpu_only=True,
          description="the decoder's per-frame step captured in CUDA graphs, in a memory pool of their own (decode may "
                      "overlap the denoiser); a streaming decoder first gets its caches in fixed buffers "
                      "(vae-stream-buffers) and one graph per phase (its first frame, its second, the steady ones)")
def _vae_cuda_graphs(pipe, ctx: VariantContext):
    step = ctx.workload.decoder_step(pipe)
    if step.make_static is not None:
        step.make_static(pipe)
    g = GraphedCallable(getattr(step.owner, step.attr), name="decoder step", device=ctx.device,
                        pool=torch.cuda.graph_pool_handle(), memset_kernels=memset_kernels(pipe))
    setattr(step.owner, step.attr, g)
    pipe.graphed = [*getattr(pipe, "graphed", []), g]
    ctx.notes["vae-cuda-graphs"] = "decoder step graphed"


@register("vae-batch-frames", family="decoder", requires=("independent_frames",),
          description="a pass's latent frames decoded in one call of the per-frame decode step (a batch of B x T "
                      "images) instead of one call per frame: each frame is decoded alone either way, so the frames "
                      "are the same computation; compiled and captured, it is one graph of the batch's shape")
def _vae_batch_frames(pipe, ctx: VariantContext):
    swaps.swap_class(pipe, swaps.BatchedFrames)
    ctx.notes["vae-batch-frames"] = "a pass's frames decoded as one batch"


@register("vae-decoder-bf16", family="decoder", requires=("independent_frames",),
          description="the SD VAE's decoding half (post_quant_conv and the decoder) in bf16, its encoder as it was: "
                      "the frames are decoded in bf16 while the observation's latent, which conditions the UNet, keeps "
                      "the encoder's precision (vae-bf16 casts both)")
def _vae_decoder_bf16(pipe, ctx: VariantContext):
    refuse_after_compile("vae-decoder-bf16", pipe, "decode_step", "step keeps the fp32 weights it was made with")
    pipe.vae.post_quant_conv.to(torch.bfloat16)  # decode_frame then casts the latent to the decoder's dtype
    pipe.vae.decoder.to(torch.bfloat16)
    ctx.notes["vae-decoder-bf16"] = "SD VAE decoder in bf16, encoder unchanged"


@register("vae-attn-gemm", family="decoder", requires=("independent_frames",),
          description="the SD VAE decoder's single-head mid-block attention (one head of the block's width, 512 at "
                      "wma) as two batched GEMMs around a softmax (diffusers' AttnProcessor) instead of "
                      "scaled_dot_product_attention: no fused SDPA kernel takes a head of more than 256 channels, so "
                      "SDPA falls back to its memory-efficient kernel; the scores (frames x positions^2) are written "
                      "once. Before vae-compile and vae-cuda-graphs")
def _vae_attn_gemm(pipe, ctx: VariantContext):
    from diffusers.models.attention_processor import Attention, AttnProcessor  # noqa: PLC0415  heavy: diffusers

    decoder = getattr(getattr(pipe, "vae", None), "decoder", None)
    if decoder is None:
        raise ValueError(f"vae-attn-gemm needs a diffusers SD VAE (AutoencoderKL) with a decoder; "
                         f"{type(pipe).__name__} has {type(getattr(pipe, 'vae', None)).__name__}")
    refuse_after_compile("vae-attn-gemm", pipe, "decode_step", "decode keeps the attention it was made with")
    layers = [m for m in decoder.modules() if isinstance(m, Attention)]
    for m in layers:
        m.set_processor(AttnProcessor())
    ctx.notes["vae-attn-gemm"] = (f"{len(layers)} SD VAE decoder attention layer(s) as GEMMs and a softmax" if layers
                                  else "no attention in this decoder")


@register("vae-tiny", family="decoder", requires=("streaming_decoder",), frames_judged=False,
          description="a tiny streaming decoder (TAEHV, ~10 M parameters, no 3-D convolutions) in place of the Wan VAE "
                      "decoder; random weights unless WMBOOK_TAEHV_WEIGHTS names a taew2_1.pth-style file, so its "
                      "frames' quality needs real weights")
def _vae_tiny(pipe, ctx: VariantContext):
    from ...models.taehv import (  # noqa: PLC0415  heavy: diffusers (models.taehv)
        StreamingTAEHVDecoder,
        build_taehv,
        load_taehv_decoder,
    )

    path = os.environ.get("WMBOOK_TAEHV_WEIGHTS", "")
    tiny = build_taehv(ctx.workload.decoder_size(pipe), dtype=pipe.vae_dtype, device=ctx.device)
    if path:
        load_taehv_decoder(tiny, path)
    ctx.workload.set_streaming_decoder(pipe, StreamingTAEHVDecoder(tiny))
    ctx.notes["vae-tiny"] = f"TAEHV decoder, {'weights ' + path if path else 'random weights (quality not judged)'}"
