"""Where each kernel runs in a workload, at that workload's shapes: the unfused op sequence the model runs today (its
own modules), the fused kernel, the fp32 reference and the bytes, on seeded inputs (notebook 05's kernel table).

A workload lists its cases (`Workload.kernel_cases(preset)`); the builders here know the models' code paths:

    dit_cases(...)       the causal DiT block: adaLN modulate, gated residual + adaLN, q/k RMSNorm + RoPE
    unet_cases(...)      the video UNet's ResBlocks: GroupNorm + SiLU (+ the time embedding), spatial and temporal;
                         its temporal self-attention (short sequences)
    wan_decoder_cases()  the Wan VAE decoder's residual blocks: RMS norm + SiLU
    sd_decoder_cases()   the SD VAE decoder's residual blocks: GroupNorm + SiLU
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F
from diffusers.models.autoencoders.autoencoder_kl_wan import WanRMS_norm

from ..models.attention import attention
from ..models.causal_wan import WanLayerNorm, WanRMSNorm, apply_rope, rope_cos_sin, rope_inv_freqs
from ..models.wma.layers import GroupNorm32
from . import adaln
from . import gated_residual_adaln as gra
from . import group_norm_silu as gns
from . import qk_norm_rope as qkr
from . import rms_norm_silu as rns
from . import short_attention as sa


def _set_params(module: torch.nn.Module, **values: torch.Tensor) -> None:
    """Move `module` to the values' device and dtype and copy them into its parameters of those names (the eager
    sequence is the module's own call on the case's inputs)."""
    first = next(iter(values.values()))
    module.to(device=first.device, dtype=first.dtype)
    with torch.no_grad():
        for name, v in values.items():
            getattr(module, name).copy_(v)


@dataclass
class KernelCase:
    """One call site of a fused kernel. make(device, dtype, seed) -> inputs (a dict); eager(**inputs): the model's own
    unfused op sequence; fused(**inputs): the kernel's launcher; ref(**inputs): fp32 reference; nbytes(**inputs): the
    fewest bytes the op must move. Outputs are a tensor or a tuple of tensors."""

    kernel: str
    site: str
    shape: tuple
    make: Callable[[torch.device, torch.dtype, int], dict]
    eager: Callable
    fused: Callable
    ref: Callable
    nbytes: Callable
    dtype: torch.dtype = torch.bfloat16
    note: str = ""
    layout: str = "contiguous"
    extra: dict = field(default_factory=dict)


def _gen(device, seed):
    g = torch.Generator(device="cpu").manual_seed(seed)
    return lambda *shape, dtype=torch.float32, scale=1.0: (torch.randn(*shape, generator=g) * scale).to(device, dtype)


# --- the causal DiT block ----------------------------------------------------------------------------------------
def dit_cases(dim: int, num_heads: int, grid: tuple[int, int, int], eps: float = 1e-6, batch: int = 1,
              where: str = "causal DiT block") -> list[KernelCase]:
    """adaLN modulate (norm1/norm2), gated residual + the next adaLN (self-attention residual then norm3), q/k RMSNorm +
    3-D RoPE, at [batch, f * h * w, dim] for one block's token grid (f, h, w) (fp32 modulation, as upstream Wan)."""
    f, gh, gw = grid
    b, n, c = batch, f * gh * gw, dim
    d = c // num_heads

    def mod(h, shift, scale):  # the block's per-frame modulate (CausalWanAttentionBlock.forward)
        return (h.unflatten(1, (f, -1)) * (1 + scale) + shift).flatten(1, 2)

    def make_adaln(device, dtype, seed):
        r = _gen(device, seed)
        return dict(x=r(b, n, c, dtype=dtype), shift=r(b, f, 1, c, scale=0.1), scale=r(b, f, 1, c, scale=0.1))

    norm = WanLayerNorm(c, eps)

    def eager_adaln(x, shift, scale):
        return mod(norm(x), shift, scale)

    def make_gra(device, dtype, seed):
        r = _gen(device, seed)
        return dict(x=r(b, n, c, dtype=dtype), y=r(b, n, c, dtype=dtype), gate=r(b, f, 1, c, scale=0.1),
                    shift=r(b, f, 1, c, scale=0.1), scale=r(b, f, 1, c, scale=0.1))

    def eager_gra(x, y, gate, shift, scale):
        x = x + (y.unflatten(1, (f, -1)) * gate).flatten(1, 2)
        return x, mod(norm(x), shift, scale)

    rms = WanRMSNorm(c, eps)

    def make_qkr(device, dtype, seed):
        r = _gen(device, seed)
        cos, sin = rope_cos_sin(rope_inv_freqs(d), f, gh, gw, 0, device)
        inputs = dict(x=r(b, n, c, dtype=dtype), weight=(1 + r(c, scale=0.1)).to(dtype), cos=cos, sin=sin)
        _set_params(rms, weight=inputs["weight"])  # the module's own weight: the eager sequence is the model's call
        return inputs

    def eager_qkr(x, weight, cos, sin):
        return apply_rope(rms(x).view(b, n, num_heads, d), cos, sin)

    shape = (b, n, c)
    return [
        KernelCase("adaln_modulate", f"{where}: norm1 / norm2 + per-frame modulate", shape, make_adaln, eager_adaln,
                   lambda **k: adaln.adaln_modulate(**k, eps=eps), lambda **k: adaln.adaln_modulate_ref(**k, eps=eps),
                   adaln.adaln_modulate_bytes),
        KernelCase("gated_residual_adaln", f"{where}: x + gate * attn(x), then the next norm + modulate", shape,
                   make_gra, eager_gra, lambda **k: gra.gated_residual_adaln(**k, eps=eps),
                   lambda **k: gra.gated_residual_adaln_ref(**k, eps=eps), gra.gated_residual_adaln_bytes),
        KernelCase("qk_norm_rope", f"{where}: q / k RMSNorm + 3-D RoPE ({num_heads} heads of {d})", shape, make_qkr,
                   eager_qkr, lambda **k: qkr.qk_norm_rope(**k, num_heads=num_heads, eps=eps),
                   lambda **k: qkr.qk_norm_rope_ref(**k, num_heads=num_heads, eps=eps), qkr.qk_norm_rope_bytes),
    ]


# --- GroupNorm + SiLU: the video UNet and the SD VAE ------------------------------------------------------------
def _gn_case(site: str, shape: tuple, groups: int, eps: float, add: bool, channels_last: bool, fp32_stats: bool,
             dtype: torch.dtype = torch.bfloat16, note: str = "") -> KernelCase:
    c = shape[1]
    gn = GroupNorm32(groups, c, eps=eps) if fp32_stats else torch.nn.GroupNorm(groups, c, eps=eps)
    fmt = (torch.channels_last if len(shape) == 4 else torch.channels_last_3d) if channels_last else None

    def make(device, dt, seed):
        r = _gen(device, seed)
        x = r(*shape, dtype=dt)
        if fmt is not None:
            x = x.contiguous(memory_format=fmt)
        inputs = dict(x=x, weight=(1 + r(c, scale=0.1)).to(dt), bias=r(c, scale=0.1).to(dt),
                      add=r(shape[0], c, dtype=dt) if add else None)
        _set_params(gn, weight=inputs["weight"], bias=inputs["bias"])  # the module's own parameters
        return inputs

    def eager(x, weight, bias, add):  # ResBlock: h + emb[:, :, None, None], then out_layers' GroupNorm32 and SiLU
        if add is not None:
            x = x + add.reshape(*add.shape, *([1] * (x.dim() - 2)))
        return F.silu(gn(x))

    return KernelCase("group_norm_silu", site, shape, make, eager,
                      lambda x, weight, bias, add: gns.group_norm_silu(x, weight, bias, groups, eps, add),
                      lambda x, weight, bias, add: gns.group_norm_silu_ref(x, weight, bias, groups, eps, add),
                      lambda x, weight, bias, add: gns.group_norm_silu_bytes(x, weight, bias, add),
                      dtype=dtype, note=note, layout="channels-last" if channels_last else "contiguous",
                      extra={"num_groups": groups, "eps": eps})


def _frames_norm_case(site: str, batch: int, channels: int, frames: int, hw: tuple[int, int], groups: int,
                      channels_last: bool) -> KernelCase:
    """The temporal transformer's input GroupNorm (statistics over a sample's frames, no SiLU): x [B, C, T, h, w] as
    the model makes it from its [(B T), C, h, w] activation (a channels_last_3d view of a channels-last one)."""
    shape = (batch, channels, frames, *hw)
    gn = torch.nn.GroupNorm(groups, channels, eps=1e-6)

    def make(device, dt, seed):
        r = _gen(device, seed)
        x4 = r(batch * frames, channels, *hw, dtype=dt)
        if channels_last:
            x4 = x4.contiguous(memory_format=torch.channels_last)
        inputs = dict(x=x4.unflatten(0, (batch, frames)).transpose(1, 2), weight=(1 + r(channels, scale=0.1)).to(dt),
                      bias=r(channels, scale=0.1).to(dt))
        _set_params(gn, weight=inputs["weight"], bias=inputs["bias"])
        return inputs

    return KernelCase("group_norm", site, shape, make, lambda x, weight, bias: gn(x.contiguous()),
                      lambda x, weight, bias: gns.group_norm_silu(x, weight, bias, groups, 1e-6, silu=False),
                      lambda x, weight, bias: gns.group_norm_silu_ref(x, weight, bias, groups, 1e-6, silu=False),
                      lambda x, weight, bias: gns.group_norm_silu_bytes(x, weight, bias),
                      layout="channels-last" if channels_last else "contiguous",
                      extra={"num_groups": groups, "eps": 1e-6})


def unet_cases(model_channels: int, latent_hw: tuple[int, int], frames: int, groups: int, batch: int = 1,
               channels_last: bool = True, head_channels: int = 64) -> list[KernelCase]:
    """The UNet's ResBlocks at the top level (the largest activations): out_layers' GroupNorm + SiLU with the time
    embedding added first (frames folded into the batch, channels-last as notebook 04's stack runs them), and the
    temporal conv block's GroupNorm + SiLU over [B, C, T, h, w]; the temporal transformer's GroupNorm over the frames
    (no SiLU) and its self-attention over the T frames of each of the h x w positions."""
    h, w = latent_hw
    bt = batch * frames
    heads = max(1, model_channels // head_channels)
    return [
        _gn_case("video UNet ResBlock: h + emb, GroupNorm + SiLU", (bt, model_channels, h, w), groups, 1e-5, True,
                 channels_last, True),
        _gn_case("video UNet ResBlock: in_layers GroupNorm + SiLU", (bt, model_channels, h, w), groups, 1e-5, False,
                 channels_last, True),
        _gn_case("video UNet temporal conv block: GroupNorm + SiLU", (batch, model_channels, frames, h, w), groups,
                 1e-5, False, False, False),
        _frames_norm_case("video UNet temporal transformer: GroupNorm over the frames", batch, model_channels, frames,
                          (h, w), groups, channels_last),
        _short_attention_case("video UNet temporal transformer: self-attention over the frames",
                              (batch * h * w, frames, heads, min(head_channels, model_channels))),
    ]


def unet_level_cases(model_channels: int, channel_mult: tuple[int, ...], latent_hw: tuple[int, int], frames: int,
                     groups: int, batch: int = 1) -> list[KernelCase]:
    """GroupNorm + SiLU at every level of the UNet as notebook 06's stack runs it (channels-last): a ResBlock's
    h + emb site (frames folded into the batch) and the temporal conv block's (one sample's frames, channels_last_3d).
    The levels below the top have activations of a few MB, where a launch's fixed cost is much of a call's time
    (tools/gn_sweep.py --levels)."""
    h, w = latent_hw
    cases = []
    for i, mult in enumerate(channel_mult):
        ch, hw = model_channels * mult, (max(1, h >> i), max(1, w >> i))
        cases += [_gn_case(f"video UNet level {i} ResBlock: h + emb, GroupNorm + SiLU", (batch * frames, ch, *hw),
                           groups, 1e-5, True, True, True),
                  _gn_case(f"video UNet level {i} temporal conv block: GroupNorm + SiLU", (batch, ch, frames, *hw),
                           groups, 1e-5, False, True, False)]
    return cases


def _short_attention_case(site: str, shape: tuple) -> KernelCase:
    """Self-attention over short sequences [B, L, H, D] (bf16): the model's attention() (SDPA) against the kernel."""
    def make(device, dt, seed):
        r = _gen(device, seed)
        return dict(q=r(*shape, dtype=dt), k=r(*shape, dtype=dt), v=r(*shape, dtype=dt))

    return KernelCase("short_attention", site, shape, make, lambda q, k, v: attention(q, k, v),
                      lambda q, k, v: sa.short_attention(q, k, v),
                      lambda q, k, v: sa.short_attention_ref(q.float(), k.float(), v.float()),
                      lambda q, k, v: sa.short_attention_bytes(q, k, v), layout="[B, L, H, D]")


def sd_decoder_cases(height: int, width: int, channels: int = 128, groups: int = 32,
                     frames: int | None = None) -> list[KernelCase]:
    """The SD VAE decoder's last up-block (the largest activation): GroupNorm + SiLU at full resolution. One frame in
    fp32 (the workload's own VAE); with `frames`, also as notebook 06's stack runs it (vae-decoder-bf16,
    vae-batch-frames, channels-last): a pass's frames as one bf16 channels-last batch, where the kernels' launch
    settings meet activations of hundreds of MB instead of the UNet's tens."""
    cases = [_gn_case("SD VAE decoder ResnetBlock: GroupNorm + SiLU (fp32)", (1, channels, height, width), groups,
                      1e-6, False, False, True, dtype=torch.float32)]
    if frames:
        cases.append(_gn_case("SD VAE decoder ResnetBlock, a pass's frames batched: GroupNorm + SiLU",
                              (frames, channels, height, width), groups, 1e-6, False, True, True))
    return cases


# --- the Wan VAE decoder: RMS norm + SiLU ---------------------------------------------------------------------------
def wan_decoder_cases(latent_hw: tuple[int, int], base_dim: int = 96) -> list[KernelCase]:
    """diffusers' WanRMS_norm followed by SiLU (WanResidualBlock) in the streaming decode of one latent frame: the
    middle block at latent resolution (4 x base_dim channels, 1 frame) and the last up-block at full resolution
    (base_dim channels, 4 frames)."""
    h, w = latent_hw
    shapes = [("Wan VAE decoder middle block: RMS norm + SiLU", (1, 4 * base_dim, 1, h, w)),
              ("Wan VAE decoder last up-block: RMS norm + SiLU", (1, base_dim, 4, 8 * h, 8 * w))]
    out = []
    for site, shape in shapes:
        c = shape[1]
        norm = WanRMS_norm(c, images=False)

        def make(device, dt, seed, shape=shape, c=c, norm=norm):
            r = _gen(device, seed)
            inputs = dict(x=r(*shape, dtype=dt), gamma=(1 + r(c, 1, 1, 1, scale=0.1)).to(dt), bias=None)
            _set_params(norm, gamma=inputs["gamma"])  # set here, not in the timed call (breaks compile's graph)
            return inputs

        def eager(x, gamma, bias, norm=norm):  # diffusers' WanRMS_norm (channel-first, no bias), then SiLU
            return F.silu(norm(x))

        out.append(KernelCase("rms_norm_silu", site, shape, make, eager,
                              lambda x, gamma, bias: rns.rms_norm_silu(x, gamma, bias),
                              lambda x, gamma, bias: rns.rms_norm_silu_ref(x, gamma, bias),
                              lambda x, gamma, bias: rns.rms_norm_silu_bytes(x, gamma, bias)))
    return out


__all__ = ["KernelCase", "dit_cases", "sd_decoder_cases", "unet_cases", "wan_decoder_cases"]
