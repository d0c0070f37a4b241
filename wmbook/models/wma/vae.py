"""The SD-style VAE of UnifoLM-WMA-0 as diffusers' `AutoencoderKL`, encoded and decoded one frame at a time.

Upstream `first_stage_config` (LDM AutoencoderKL: ch 128, ch_mult [1, 2, 4, 4], 2 res blocks, z 4, no attention
except the mid block's) is diffusers' SD VAE layout; latents are scaled by 0.18215. `perframe_ae=True`
upstream: every frame is its own encode / decode call, which is what the pipeline labels per frame.
Real weights: `vae.load_state_dict(...)` in diffusers names (diffusers' `convert_ldm_vae_checkpoint` turns an
LDM `first_stage_model.*` state dict into them); not done here.
"""

from __future__ import annotations

import torch
from diffusers import AutoencoderKL

from ...presets import WMAPreset
from ...world.codec import build_frame_codec, parse_codec


def sd_vae_config(p: WMAPreset) -> dict:
    n = len(p.vae_block_out_channels)
    return dict(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * n,
                up_block_types=("UpDecoderBlock2D",) * n, block_out_channels=tuple(p.vae_block_out_channels),
                layers_per_block=p.vae_layers_per_block, latent_channels=p.latent_channels,
                norm_num_groups=p.vae_norm_groups, scaling_factor=p.scale_factor, sample_size=p.height)


def build_sd_vae(p: WMAPreset, dtype: torch.dtype = torch.float32, device="cpu", seed: int = 0) -> AutoencoderKL:
    """Seeded random-weight AutoencoderKL, initialised on `device`, eval, no grad; the CPU RNG is left untouched.
    A preset with `vae = 's2d<N>'` (the world presets) gets the lossless space-to-depth codec (wmbook.world.codec)."""
    codec = getattr(p, "vae", None)
    if codec is not None and str(codec).startswith("s2d"):
        s = parse_codec(codec)
        if s is None or 3 * s * s != p.latent_channels:
            raise ValueError(f"vae={codec!r} needs latent_channels = 3 * N^2; preset {p.name!r} has "
                             f"{p.latent_channels}")
        return build_frame_codec(s, p.scale_factor, dtype=dtype, device=device)
    with torch.random.fork_rng(devices=[]), torch.device(device):
        torch.manual_seed(seed)
        vae = AutoencoderKL(**sd_vae_config(p))
    torch.nn.Module.to(vae, dtype=dtype)  # plain Module.to: no "keep in fp32" warning from ModelMixin
    return vae.eval().requires_grad_(False)


@torch.no_grad()
def encode_frame(vae: AutoencoderKL, image: torch.Tensor, scale: float, generator=None) -> torch.Tensor:
    """[B, 3, H, W] in [-1, 1] -> scaled posterior sample [B, 4, H/8, W/8] (upstream get_first_stage_encoding)."""
    z = vae.encode(image.to(vae.dtype)).latent_dist.sample(generator=generator)
    return z * scale


@torch.no_grad()
def decode_frame(vae: AutoencoderKL, latent: torch.Tensor, scale: float) -> torch.Tensor:
    """[B, 4, h, w] scaled latent -> [B, 3, 8h, 8w] (upstream decode_core with perframe_ae), in the decoder's dtype
    (the VAE's, unless its decoding half alone was cast: vae-decoder-bf16)."""
    dtype = next((w.dtype for w in vae.decoder.parameters()), vae.dtype)  # a world preset's decoder may be Identity
    return vae.decode(latent.to(dtype) / scale).sample
