"""What runs where: the decode on a second stream, heads and decodes an iteration does not use."""

from __future__ import annotations

from .. import swaps
from ..registry import VariantContext, register


@register("decode-overlap", family="graphs", requires=("streaming_decoder",), gpu_only=True,
          description="block k decoded on a second CUDA stream while the DiT denoises block k+1 (events order the "
                      "streams; the next block needs block k's caches, not its pixels)")
def _decode_overlap(pipe, ctx: VariantContext):
    if getattr(ctx.workload.streaming_decoder(pipe), "compiled_step", False):
        raise ValueError("decode-overlap cannot follow vae-compile: the compiled decoder step run on a second CUDA "
                         "stream does not give the frames it gives on the main stream (the latents are equal), and "
                         "with the denoiser and the decoder captured each fills the GPU alone, so the overlap buys "
                         "no time (tools/first_frame_account.py --extra decode-overlap measures both); leave out one "
                         "of them")
    swaps.swap_class(pipe, swaps.DecodeOverlap)
    ctx.notes["decode-overlap"] = "decode on a second stream"


@register("decode-first", family="graphs", requires=("streaming_decoder", "kv_cache"), denoiser=False,
          description="each block decoded before its cache-refresh forward (which only the next block needs): the "
                      "same frames, one forward sooner; the first frame of a stream most of all")
def _decode_first(pipe, ctx: VariantContext):
    swaps.swap_class(pipe, swaps.DecodeBeforeRefresh)
    ctx.notes["decode-first"] = "each block's frames decoded before its cache refresh"


@register("stream-frames", family="graphs", requires=("streaming_decoder", "kv_cache"), denoiser=False,
          description="each latent frame's pixel frames handed out as soon as they are decoded, not when the block's "
                      "last one is: the stream's first frame after one latent frame's decode (with decode-first, "
                      "before the block's cache refresh too); the same frames")
def _stream_frames(pipe, ctx: VariantContext):
    swaps.swap_class(pipe, swaps.FramesPerLatentFrame)
    ctx.notes["stream-frames"] = "each latent frame's pixel frames handed out as soon as they are decoded"


@register("skip-unused-heads", family="graphs", requires=("ddim", "unet"),
          description="each pass runs only the head it is read for: the decision pass its action head (its states "
                      "are not read), the world-model pass its state head (its actions are not read); half the heads' "
                      "forwards of an iteration, the same actions, states, latents and frames")
def _skip_unused_heads(pipe, ctx: VariantContext):
    from ...models.wma.action_head import ConditionalUnet1D  # noqa: PLC0415  heavy: models.wma (diffusers)

    unet = getattr(ctx.workload.denoiser(pipe), "diffusion_model", None)
    heads = [getattr(unet, "action_unet", None), getattr(unet, "state_unet", None)]
    if not all(isinstance(h, ConditionalUnet1D) for h in heads):
        raise ValueError(f"skip-unused-heads needs the action and state heads; the {ctx.workload.name} denoiser has "
                         "none")
    for h in heads:
        swaps.swap_class(h, swaps.SkippableHead)
    swaps.swap_class(pipe, swaps.SkipUnusedHeads)
    ctx.notes["skip-unused-heads"] = "decision pass: action head only; world-model pass: state head only"


@register("skip-unused-decode", family="graphs", requires=("ddim",), denoiser=False,
          description="the decision pass's video is not decoded (only its action chunk is used; the world-model pass "
                      "decodes the iteration's frames)")
def _skip_unused_decode(pipe, ctx: VariantContext):
    swaps.swap_class(pipe, swaps.SkipUnusedDecode)
    ctx.notes["skip-unused-decode"] = "decision pass not decoded"


@register("skip-unused-encode", family="graphs", requires=("ddim",), denoiser=False,
          description="only the observed frame whose latent is kept (the last) is VAE-encoded; the others' posterior "
                      "noise is still drawn, so every latent, action and frame is upstream's")
def _skip_unused_encode(pipe, ctx: VariantContext):
    swaps.swap_class(pipe, swaps.EncodeKeptFrame)
    ctx.notes["skip-unused-encode"] = "only the kept observed frame encoded"


@register("constant-conditioning", family="graphs", requires=("ddim",), denoiser=False,
          description="the conditioning that is the same every iteration computed once: the instruction's and the "
                      "empty prompt's text tokens and the zero image's tokens (the same tokens)")
def _constant_conditioning(pipe, ctx: VariantContext):
    swaps.swap_class(pipe, swaps.ConstantConditioning)
    ctx.notes["constant-conditioning"] = "text tokens and the zero image's tokens computed once"
