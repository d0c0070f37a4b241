"""Layout: cuDNN's algorithm search, channels-last weights and activations, the action head's 1-D convolutions
as GEMMs."""

from __future__ import annotations

import torch

from .. import swaps
from ..registry import VariantContext, register


# PyTorch keeps the cuDNN plan it first chose for a convolution (keyed by shapes, dtype, layout, alignment and the
# tf32/determinism switches, not by this one) for the rest of the process, however it chose it: the switch speeds up
# only the convolutions first run after it, so a stack turns it on before its reduced-precision convolutions first
# run. It changes no traced code, so a ladder row adding it is built on the row before (denoiser=False).
@register("cudnn-benchmark", family="layout", denoiser=False,
          description="torch.backends.cudnn.benchmark: cuDNN times its algorithms once per shape and keeps the fastest "
                      "(for the shapes first run after it is on)")
def _cudnn_benchmark(pipe, ctx: VariantContext):
    torch.backends.cudnn.benchmark = True
    ctx.notes["cudnn-benchmark"] = ("cuDNN benchmark on: convolution shapes first run from here on are timed; "
                                    "those run before keep the algorithm cuDNN picked then")


@register("channels-last", family="layout",
          description="channels-last (NHWC / NDHWC) convolution weights, and activations where the workload says, "
                      "for its conv-heavy parts (the VAE decoder; the UNet)")
def _channels_last(pipe, ctx: VariantContext):
    n = 0
    for layout in ctx.workload.conv_layouts(pipe):
        n += swaps.to_memory_format(layout.module, layout.memory_format)
        if layout.inputs:
            swaps.inputs_in_memory_format(layout.module, layout.memory_format)
    ctx.notes["channels-last"] = f"{n} convolution weights in channels-last"


@register("temporal-channels-last", family="layout", requires=("unet",),
          description="the video UNet's temporal conv blocks in channels_last_3d (NDHWC): their Conv3d weights, and "
                      "each ResBlock's [B, C, T, h, w] view of its activation made contiguous in that layout (of a "
                      "channels-last activation it already is: no copy in or out, where NCDHW copies it both ways)")
def _temporal_channels_last(pipe, ctx: VariantContext):
    from ...models.wma.unet import ResBlock  # noqa: PLC0415  heavy: models.wma (diffusers)

    blocks = [m for m in ctx.workload.denoiser(pipe).modules()
              if isinstance(m, ResBlock) and m.temporal_conv is not None]
    n = 0
    for b in blocks:
        b.temporal_format = torch.channels_last_3d
        n += swaps.to_memory_format(b.temporal_conv, torch.channels_last_3d)
    ctx.notes["temporal-channels-last"] = f"{len(blocks)} temporal conv blocks, {n} Conv3d weights in channels_last_3d"


@register("head-conv-gemm", family="kernels", requires=("unet",),
          description="the action and state heads' 1-D convolutions (ConditionalUnet1D: a few rows of batch x length, "
                      "up to 2048 channels) as GEMMs over their unfolded windows, the transposed ones as a GEMM and an "
                      "overlap-add (F.fold): cuBLAS instead of cuDNN's convolution kernels; the same sums")
def _head_conv_gemm(pipe, ctx: VariantContext):
    from ...models.wma.action_head import ConditionalUnet1D  # noqa: PLC0415  heavy: models.wma (diffusers)

    heads = [m for m in ctx.workload.denoiser(pipe).modules() if isinstance(m, ConditionalUnet1D)]
    if not heads:
        raise ValueError(f"head-conv-gemm found no 1-D UNet head in the {ctx.workload.name} denoiser")
    counts: dict[str, int] = {}
    for h in heads:
        for k, v in swaps.conv1d_as_gemm(h).items():
            counts[k] = counts.get(k, 0) + v
    ctx.notes["head-conv-gemm"] = f"{len(heads)} heads: " + ", ".join(f"{v} {k}" for k, v in counts.items())


@register("upsample-fold", family="kernels", requires=("unet",),
          description="the UNet's nearest 2x upsamplings and the 3 x 3 convolution after each (its up path) as one "
                      "stride-2 transposed convolution of the low-resolution input (4 x 4 taps, sums of the "
                      "original's): 4/9 of those convolutions' multiply-adds and no upsampled tensor; the same outputs "
                      "up to the order of additions (vae-upsample-fold does the same in the decoders)")
def _upsample_fold(pipe, ctx: VariantContext):
    from ...models.wma.unet import Upsample  # noqa: PLC0415  heavy: models.wma (diffusers)
    from ..upsample_fold import fold_upsample_convs  # noqa: PLC0415

    n = fold_upsample_convs(ctx.workload.denoiser(pipe), also=(Upsample,))
    if not n:
        raise ValueError(f"upsample-fold found no nearest upsampling + 3 x 3 convolution in the {ctx.workload.name} "
                         "denoiser")
    ctx.notes["upsample-fold"] = f"{n} UNet upsampling + 3 x 3 convolution pairs as stride-2 transposed convolutions"
