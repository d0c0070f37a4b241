"""A fixed, lossless space-to-depth codec standing in for the VAEs of the world presets.

Choice: the real pipelines decode with a Wan VAE (8x spatial, 4x temporal, 16 channels) and an SD VAE (8x spatial,
4 channels); with random weights either gives no image quality, and training one would cost the budget of the world
model itself. The world presets instead use a *deterministic, exactly invertible* codec with the same interfaces
(no weights, no training, no download):

- video (mg2, Wan-VAE interface): a latent frame holds its 4 pixel frames stacked in channels, each pixel-unshuffled
  by `spatial` (pixel (c, y, x) of slot j -> channel ((j * 3 + c) * s + y % s) * s + x % s at (y // s, x // s)):
  C = 4 * 3 * s^2 channels at H/s x W/s. As in the Wan VAE, latent frame 0 is pixel frame 0 alone (copied into all
  4 slots; decoding it returns the mean of the slots), latent frame k >= 1 holds pixel frames 4k-3 .. 4k. Decoding
  is causal per latent frame, so the streaming decoder's per-frame step (`decode_frame`) keeps working;
- frame (wma, SD-VAE interface): one frame pixel-unshuffled by `spatial`: C = 3 * s^2 channels at H/s x W/s.

Latents are pixels in [-1, 1] times a fixed scale (2.0 in the presets: the DiT's latents are `(z - 0) / 0.5`
through the Wan VAE's latents_mean / latents_std convention, the UNet's `z * 2.0` through the SD scale_factor), so
their spread is closer to the unit-variance latents the noise schedules were made for. Powers of two keep the round
trip exact: decode(encode(x)) == x bit for bit in fp32 (the first latent frame returns the mean of 4 equal slots).
"""

from __future__ import annotations

import re
from types import SimpleNamespace

import torch
import torch.nn as nn
import torch.nn.functional as F

CODEC_RE = re.compile(r"^s2d(\d+)$")


def parse_codec(name: str) -> int | None:
    """'s2d4' -> 4 (the spatial factor); any other name -> None."""
    m = CODEC_RE.match(str(name))
    return int(m.group(1)) if m else None


def video_codec_config(name: str, scale: float = 2.0) -> dict:
    """The `wan_vae_config` entry of a space-to-depth video codec ('s2d4': 4x spatial, 4x temporal)."""
    s = parse_codec(name)
    if s is None or s < 1:
        raise ValueError(f"codec={name!r} is not allowed; allowed values: 's2d<N>' with N >= 1 (e.g. 's2d4')")
    return {"codec": "space_to_depth", "spatial": s, "temporal": 4, "z_dim": 4 * 3 * s * s, "scale": scale}


class _Dist:
    """What `vae.encode(x).latent_dist` gives: a point mass (mode == sample; a generator is accepted, unused)."""

    def __init__(self, z):
        self.z = z

    def mode(self):
        return self.z

    def sample(self, generator=None):
        return self.z


class _Codec(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("_anchor", torch.zeros(()), persistent=False)  # follows .to(device, dtype)
        self.post_quant_conv = nn.Identity()
        self.quant_conv = nn.Identity()

    @property
    def device(self) -> torch.device:
        return self._anchor.device

    @property
    def dtype(self) -> torch.dtype:
        return self._anchor.dtype


class SpaceToDepthVideoDecoder(nn.Module):
    """One latent frame [B, C, 1, h, w] -> pixels [B, 3, T, H, W] (T = 1 for the stream's first frame, else 4).

    The Wan decoder's call signature (feat_cache, feat_idx, first_chunk): no state is needed, so the caches are
    left as they are."""

    def __init__(self, spatial: int, temporal: int = 4):
        super().__init__()
        self.spatial, self.temporal = spatial, temporal

    def forward(self, x, feat_cache=None, feat_idx=None, first_chunk: bool = False):
        b, c, f, h, w = x.shape
        s, r = self.spatial, self.temporal
        if c != r * 3 * s * s:
            raise ValueError(f"expected {r * 3 * s * s} latent channels, got {c}")
        y = x.permute(0, 2, 1, 3, 4).reshape(b * f * r, 3 * s * s, h, w)
        y = F.pixel_shuffle(y, s).view(b, f, r, 3, h * s, w * s)  # [B, F, slot, 3, H, W]
        if first_chunk:  # the stream's first latent frame is one pixel frame, held in every slot
            y = y.mean(dim=2, keepdim=True)
        return y.flatten(1, 2).permute(0, 2, 1, 3, 4).clamp(-1, 1)  # [B, 3, T, H, W]


class SpaceToDepthVideoCodec(_Codec):
    """The Wan-VAE stand-in (see the module docstring): encode / decode and what StreamingWanDecoder reads."""

    def __init__(self, spatial: int = 4, temporal: int = 4, scale: float = 2.0):
        super().__init__()
        z = temporal * 3 * spatial * spatial
        self.config = SimpleNamespace(z_dim=z, latents_mean=[0.0] * z, latents_std=[1.0 / scale] * z, patch_size=None,
                                      spatial=spatial, temporal=temporal, scale=scale, codec="space_to_depth")
        self.decoder = SpaceToDepthVideoDecoder(spatial, temporal)

    def encode(self, x: torch.Tensor):
        """Pixels [B, 3, 1 + 4(F-1), H, W] in [-1, 1] -> `.latent_dist` of raw latents [B, C, F, H/s, W/s]."""
        if x.dim() != 5 or x.shape[1] != 3:
            raise ValueError(f"expected pixels [B, 3, T, H, W]; got {tuple(x.shape)}")
        b, _, t, hh, ww = x.shape
        s, r = self.config.spatial, self.config.temporal
        if (t - 1) % r or hh % s or ww % s:
            raise ValueError(f"pixel frames must be 1 + {r}k and H, W multiples of {s}; got {tuple(x.shape)}")
        first = x[:, :, :1].expand(-1, -1, r, -1, -1)
        y = torch.cat([first, x[:, :, 1:]], dim=2)  # [B, 3, r * F, H, W]
        f = y.shape[2] // r
        y = y.permute(0, 2, 1, 3, 4).reshape(b * f * r, 3, hh, ww)
        y = F.pixel_unshuffle(y, s).view(b, f, r * 3 * s * s, hh // s, ww // s)
        return SimpleNamespace(latent_dist=_Dist(y.permute(0, 2, 1, 3, 4).contiguous()))

    def decode(self, z: torch.Tensor):
        """Raw latents [B, C, F, h, w] -> `.sample` pixels [B, 3, 1 + 4(F-1), H, W]."""
        outs = [self.decoder(z[:, :, i:i + 1], first_chunk=i == 0) for i in range(z.shape[2])]
        return SimpleNamespace(sample=torch.cat(outs, dim=2))


class SpaceToDepthFrameCodec(_Codec):
    """The SD-VAE stand-in: one frame [B, 3, H, W] <-> [B, 3 s^2, H/s, W/s] (unscaled; the pipeline scales)."""

    def __init__(self, spatial: int = 4, scale: float = 2.0):
        super().__init__()
        self.config = SimpleNamespace(latent_channels=3 * spatial * spatial, scaling_factor=scale, spatial=spatial,
                                      codec="space_to_depth")
        self.decoder = nn.Identity()
        self.encoder = nn.Identity()

    def encode(self, x: torch.Tensor):
        if x.dim() != 4 or x.shape[1] != 3:
            raise ValueError(f"expected one frame [B, 3, H, W]; got {tuple(x.shape)}")
        return SimpleNamespace(latent_dist=_Dist(F.pixel_unshuffle(x, self.config.spatial)))

    def decode(self, z: torch.Tensor):
        return SimpleNamespace(sample=F.pixel_shuffle(z, self.config.spatial).clamp(-1, 1))


def build_video_codec(config: dict, dtype=torch.float32, device="cpu") -> SpaceToDepthVideoCodec:
    codec = SpaceToDepthVideoCodec(config["spatial"], config["temporal"], config["scale"])
    nn.Module.to(codec, device=device, dtype=dtype)
    return codec.eval().requires_grad_(False)


def build_frame_codec(spatial: int, scale: float, dtype=torch.float32, device="cpu") -> SpaceToDepthFrameCodec:
    codec = SpaceToDepthFrameCodec(spatial, scale)
    nn.Module.to(codec, device=device, dtype=dtype)
    return codec.eval().requires_grad_(False)
