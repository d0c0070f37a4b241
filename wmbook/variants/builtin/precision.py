"""Precision: TF32, bf16/fp16 weights, autocast, the decoder's dtype."""

from __future__ import annotations

import torch

from ..registry import VariantContext, register


@register("tf32", family="precision", tolerance="tf32",
          description="TF32 tensor-core math for fp32 matmuls and convolutions (off by default in PyTorch)")
def _tf32(pipe, ctx: VariantContext):
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    torch.set_float32_matmul_precision("high")
    ctx.notes["tf32"] = "matmul.allow_tf32, cudnn.allow_tf32, float32_matmul_precision=high"


def _weights_to(pipe, ctx: VariantContext, dtype: torch.dtype) -> None:
    """Denoiser and conditioning encoders in `dtype` (the VAE keeps its own dtype: see the vae-* variants)."""
    ctx.workload.denoiser(pipe).to(dtype)
    for m in ctx.workload.conditioning_modules(pipe):
        m.to(dtype)
    pipe.dtype = dtype


@register("bf16", family="precision", tolerance="bf16",
          description="bf16 weights and activations for the denoiser and the conditioning encoders")
def _bf16(pipe, ctx: VariantContext):
    _weights_to(pipe, ctx, torch.bfloat16)


@register("fp16", family="precision", tolerance="fp16", gpu_only=True,
          description="fp16 weights and activations for the denoiser and the conditioning encoders")
def _fp16(pipe, ctx: VariantContext):
    _weights_to(pipe, ctx, torch.float16)


@register("autocast-bf16", family="precision", tolerance="bf16",
          description="fp32 weights, the denoiser forward under torch.autocast(bf16)")
def _autocast_bf16(pipe, ctx: VariantContext):
    model = ctx.workload.denoiser(pipe)
    inner = model.forward
    dev = ctx.device.type

    def forward(*args, **kwargs):
        with torch.autocast(dev, dtype=torch.bfloat16):
            return inner(*args, **kwargs)

    model.forward = forward


def _vae_to(dtype):
    def apply(pipe, ctx: VariantContext):
        ctx.workload.set_vae(pipe, pipe.vae.to(dtype))

    return apply


for _name, _dt in (("vae-fp32", torch.float32), ("vae-bf16", torch.bfloat16), ("vae-fp16", torch.float16)):
    register(_name, family="precision", gpu_only=_dt == torch.float16, denoiser=False,
             description=f"VAE decoder in {_name[4:]} (quality measured as PSNR of the decoded frames)")(_vae_to(_dt))
