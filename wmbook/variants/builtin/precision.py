"""Precision: TF32, bf16/fp16 weights, autocast, the VAE's dtypes."""

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


class _Bf16Encode:
    """An SD VAE's `_encode` (image -> its posterior's moments) with the encoder in bf16 and the moments in fp32: the
    posterior's sample draws its noise in the moments' dtype, so an fp32 sample keeps upstream's noise draw (and
    EncodeKeptFrame's draws for the frames it skips) while the encoder's convolutions and norms run in bf16."""

    def __init__(self, vae):
        self.vae = vae

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        h = self.vae.encoder(x.to(torch.bfloat16))
        q = self.vae.quant_conv
        return (h if q is None else q(h.to(q.weight.dtype))).float()


@register("vae-encoder-bf16", family="precision", requires=("ddim",), denoiser=False,
          description="the SD VAE encoder (the observed frame's latent) in bf16, its posterior's moments and sample in "
                      "fp32 (the same noise draw); before conditioning-compile and conditioning-cuda-graphs")
def _vae_encoder_bf16(pipe, ctx: VariantContext):
    vae = getattr(pipe, "vae", None)
    if not callable(getattr(vae, "_encode", None)) or not hasattr(vae, "encoder"):
        raise ValueError("vae-encoder-bf16 needs a diffusers SD VAE (AutoencoderKL) with an encoder; "
                         f"{type(pipe).__name__} has {type(vae).__name__}")
    if "_encode" in vae.__dict__:  # a compiled, captured or already cast encode
        raise ValueError("vae-encoder-bf16 must come before conditioning-compile and conditioning-cuda-graphs, and "
                         "only once: a compiled or captured encode keeps the fp32 weights it was made with")
    vae.encoder.to(torch.bfloat16)
    vae._encode = _Bf16Encode(vae)
    ctx.notes["vae-encoder-bf16"] = "SD VAE encoder in bf16, its posterior in fp32"
