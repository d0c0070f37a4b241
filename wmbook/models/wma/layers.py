"""Small layers shared by the UnifoLM-WMA modules: fp32 GroupNorm, timestep embeddings, Perceiver attention.

Shapes in comments: B batch, T frames, N tokens, C channels, H heads, D head dim.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..attention import attention


class GroupNorm32(nn.GroupNorm):
    """GroupNorm computed in fp32 whatever the model dtype (upstream `normalization()` / GroupNormSpecific)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight.float() if self.weight is not None else None
        b = self.bias.float() if self.bias is not None else None
        return F.group_norm(x.float(), self.num_groups, w, b, self.eps).type(x.dtype)


def timestep_embedding(timesteps: torch.Tensor, dim: int, max_period: float = 10000.0) -> torch.Tensor:
    """LDM sinusoidal embedding [cos | sin] of t [B] -> [B, dim] (float32)."""
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(half, dtype=torch.float32, device=timesteps.device) / half)
    args = timesteps[:, None].float() * freqs[None]
    emb = torch.cat([torch.cos(args), torch.sin(args)], dim=-1)
    if dim % 2:
        emb = torch.cat([emb, torch.zeros_like(emb[:, :1])], dim=-1)
    return emb


def sinusoidal_pos_emb(x: torch.Tensor, dim: int) -> torch.Tensor:
    """Diffusion-policy SinusoidalPosEmb: [sin | cos] of x [B] with log(10000)/(half-1) spacing -> [B, dim]."""
    half = dim // 2
    scale = math.log(10000.0) / (half - 1)
    freqs = torch.exp(torch.arange(half, device=x.device, dtype=torch.float32) * -scale)
    args = x.float()[:, None] * freqs[None]
    return torch.cat([args.sin(), args.cos()], dim=-1)


class PerceiverAttention(nn.Module):
    """Latents attend to [inputs, latents] (IP-Adapter / Flamingo Perceiver); upstream names."""

    def __init__(self, dim: int, dim_head: int = 64, heads: int = 8):
        super().__init__()
        self.dim_head, self.heads = dim_head, heads
        inner = dim_head * heads
        self.norm1 = nn.LayerNorm(dim)
        self.norm2 = nn.LayerNorm(dim)
        self.to_q = nn.Linear(dim, inner, bias=False)
        self.to_kv = nn.Linear(dim, inner * 2, bias=False)
        self.to_out = nn.Linear(inner, dim, bias=False)

    def forward(self, x: torch.Tensor, latents: torch.Tensor) -> torch.Tensor:
        # x [B, N_in, C] inputs; latents [B, N_q, C]
        x = self.norm1(x)
        latents = self.norm2(latents)
        b, n = latents.shape[:2]
        q = self.to_q(latents).view(b, n, self.heads, self.dim_head)  # [B, N_q, H, D]
        k, v = self.to_kv(torch.cat([x, latents], dim=1)).chunk(2, dim=-1)
        k = k.view(b, -1, self.heads, self.dim_head)
        v = v.view(b, -1, self.heads, self.dim_head)
        # upstream scales q and k by D^-1/4 each and takes the softmax in fp32: same as SDPA's D^-1/2
        return self.to_out(attention(q, k, v).flatten(2))


def perceiver_feed_forward(dim: int, mult: int = 4, approximate: str = "none") -> nn.Sequential:
    """LayerNorm -> Linear (no bias) -> GELU -> Linear (no bias); indices as upstream (0, 1, 3 hold weights)."""
    inner = int(dim * mult)
    return nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, inner, bias=False), nn.GELU(approximate=approximate),
                         nn.Linear(inner, dim, bias=False))


class MLPProjector(nn.Module):
    """State / action vector -> context token: Linear -> GELU(tanh) -> Linear (upstream `gelu-mlp`)."""

    def __init__(self, input_dim: int, output_dim: int):
        super().__init__()
        self.projector = nn.Sequential(nn.Linear(input_dim, output_dim), nn.GELU(approximate="tanh"),
                                       nn.Linear(output_dim, output_dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.projector(x)

