"""Matrix-Game-2 action conditioning: mouse temporal self-attention + keyboard cross-attention.

Parameter names follow upstream `ActionModule`. Actions come at pixel-frame rate: 1 + 4(N-1)
frames for N latent frames. Latent frame i sees the window of `windows_size * 4` raw action frames
ending before pixel frame 4i (the sequence is front-padded with copies of its first frame).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

from .attention import attention, block_causal_frame_mask
from .kv_cache import KVCache


class HeadRMSNorm(nn.Module):
    """RMSNorm over the head dim. Upstream's action-module norm keeps a `weight` it never applies."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps)


def time_rope(x: torch.Tensor, start: int, dims: int, theta: float) -> torch.Tensor:
    """RoPE over the frame index on the first `dims` channels of x [N, F, H, D] (adjacent pairs);
    upstream's (t, h, w) split with h = w = 0 leaves the other channels unrotated."""
    f = x.shape[1]
    inv = 1.0 / torch.pow(theta, torch.arange(0, dims, 2, device=x.device, dtype=torch.float64) / dims)
    ang = torch.outer(torch.arange(start, start + f, device=x.device, dtype=torch.float64), inv)  # [F, dims/2]
    cos, sin = torch.cos(ang).float()[None, :, None, :], torch.sin(ang).float()[None, :, None, :]
    rot = x[..., :dims].float().unflatten(-1, (-1, 2))
    x0, x1 = rot[..., 0], rot[..., 1]
    rot = torch.stack([x0 * cos - x1 * sin, x0 * sin + x1 * cos], dim=-1).flatten(-2)
    return torch.cat([rot.type_as(x), x[..., dims:]], dim=-1)


def action_windows(cond: torch.Tensor, start_frame: int, num_frames: int, ratio: int, window: int) -> torch.Tensor:
    """cond [B, N_pix, C] -> [B, F, window*ratio, C]: raw frames [ratio*(i-window), ratio*i) per latent i."""
    pad_t = ratio * window
    padded = torch.cat([cond[:, :1].expand(-1, pad_t, -1), cond], dim=1)
    frames = torch.arange(start_frame, start_frame + num_frames, device=cond.device)
    idx = ratio * frames[:, None] + torch.arange(pad_t, device=cond.device)[None, :]  # padded coords
    if int(idx.max()) >= padded.shape[1]:
        raise ValueError(f"action sequence has {cond.shape[1]} frames; latent frame {start_frame + num_frames - 1} "
                         f"needs at least {ratio * (start_frame + num_frames - 1)}")
    return padded[:, idx]


@dataclass
class ActionCache:
    mouse: KVCache | None  # per spatial location: batch B*S, one token per latent frame
    keyboard: KVCache | None  # batch B, one token per latent frame

    def nbytes(self) -> int:
        return sum(c.nbytes() for c in (self.mouse, self.keyboard) if c is not None)


class ActionModule(nn.Module):
    def __init__(self, cfg, local_attn_size: int = -1, frames_per_block: int = 3):
        super().__init__()
        self.cfg = cfg
        self.local_attn_size = local_attn_size
        self.frames_per_block = frames_per_block
        c_img, r, w = cfg.img_hidden_size, cfg.vae_time_compression_ratio, cfg.windows_size
        self.keyboard_embed = nn.Sequential(nn.Linear(cfg.keyboard_dim_in, cfg.hidden_size), nn.SiLU(),
                                            nn.Linear(cfg.hidden_size, cfg.hidden_size))
        c = cfg.mouse_hidden_dim
        self.mouse_mlp = nn.Sequential(nn.Linear(cfg.mouse_dim_in * r * w + c_img, c), nn.GELU(approximate="tanh"),
                                       nn.Linear(c, c), nn.LayerNorm(c))
        self.t_qkv = nn.Linear(c, 3 * c, bias=cfg.qkv_bias)
        self.img_attn_q_norm = HeadRMSNorm(c // cfg.heads_num)
        self.img_attn_k_norm = HeadRMSNorm(c // cfg.heads_num)
        self.proj_mouse = nn.Linear(c, c_img, bias=cfg.qkv_bias)
        ck = cfg.keyboard_hidden_dim
        self.key_attn_q_norm = HeadRMSNorm(ck // cfg.heads_num)
        self.key_attn_k_norm = HeadRMSNorm(ck // cfg.heads_num)
        self.mouse_attn_q = nn.Linear(c_img, ck, bias=cfg.qkv_bias)
        self.keyboard_attn_kv = nn.Linear(cfg.hidden_size * w * r, 2 * ck, bias=cfg.qkv_bias)
        self.proj_keyboard = nn.Linear(ck, c_img, bias=cfg.qkv_bias)

    def init_cache(self, batch, frame_seqlen, capacity_frames, device, dtype) -> ActionCache:
        cfg = self.cfg
        win = self.local_attn_size if self.local_attn_size != -1 else capacity_frames
        hm, hk = cfg.mouse_hidden_dim // cfg.heads_num, cfg.keyboard_hidden_dim // cfg.heads_num
        return ActionCache(
            mouse=KVCache(batch * frame_seqlen, capacity_frames, cfg.heads_num, hm, dtype, device, window=win),
            keyboard=KVCache(batch, capacity_frames, cfg.heads_num, hk, dtype, device, window=win),
        )

    def forward(self, x, grid, actions: dict, *, start_frame: int, cache: ActionCache | None = None):
        # x [B, F*S, C]; actions {"mouse": [B, N_pix, 2], "keyboard": [B, N_pix, 4]}
        cfg = self.cfg
        f, s = grid[0], grid[1] * grid[2]
        b, _, cdim = x.shape
        nh, r, w = cfg.heads_num, cfg.vae_time_compression_ratio, cfg.windows_size
        mask = None
        if cache is None:  # full sequence: block-causal window over frames
            mask = block_causal_frame_mask(f, self.frames_per_block, self.local_attn_size, x.device)

        # mouse: per spatial location, temporal self-attention over latent frames
        mouse = action_windows(actions["mouse"].to(x.dtype), start_frame, f, r, w).flatten(2)  # [B, F, 12*2]
        hs = x.view(b, f, s, cdim).transpose(1, 2).reshape(b * s, f, cdim)  # [B*S, F, C]
        mouse = mouse[:, None].expand(b, s, f, mouse.shape[-1]).reshape(b * s, f, -1)
        g = self.mouse_mlp(torch.cat([hs, mouse], dim=-1))  # [B*S, F, c]
        q, k, v = self.t_qkv(g).view(b * s, f, 3, nh, -1).unbind(2)  # [B*S, F, H, D]
        q = time_rope(self.img_attn_q_norm(q).to(v.dtype), start_frame, cfg.rope_dim_list[0], cfg.rope_theta)
        k = time_rope(self.img_attn_k_norm(k).to(v.dtype), start_frame, cfg.rope_dim_list[0], cfg.rope_theta)
        if cache is not None:
            k, v = cache.mouse.update(k, v, start_frame)
        att = attention(q, k, v, mask=mask).flatten(2)  # [B*S, F, c]
        att = att.view(b, s, f, -1).transpose(1, 2).reshape(b, f * s, -1)
        x = x + self.proj_mouse(att)

        # keyboard: every token attends to per-frame keyboard tokens
        kb = self.keyboard_embed(actions["keyboard"].to(x.dtype))  # [B, N_pix, hidden]
        kb = action_windows(kb, start_frame, f, r, w).flatten(2)  # [B, F, 12*hidden]
        kk, kv = self.keyboard_attn_kv(kb).view(b, f, 2, nh, -1).unbind(2)  # [B, F, H, D]
        q = self.mouse_attn_q(x).view(b, f * s, nh, -1)
        q = self.key_attn_q_norm(q).to(kv.dtype)
        kk = self.key_attn_k_norm(kk).to(kv.dtype)
        q = q.view(b, f, s, nh, -1).transpose(1, 2).reshape(b * s, f, nh, -1)
        q = time_rope(q, start_frame, cfg.rope_dim_list[0], cfg.rope_theta)
        kk = time_rope(kk, start_frame, cfg.rope_dim_list[0], cfg.rope_theta)
        if cache is not None:
            kk, kv = cache.keyboard.update(kk, kv, start_frame)
        nk = kk.shape[1]
        kk = kk[:, None].expand(b, s, nk, nh, -1).reshape(b * s, nk, nh, -1)
        kv = kv[:, None].expand(b, s, nk, nh, -1).reshape(b * s, nk, nh, -1)
        att = attention(q, kk, kv, mask=mask).flatten(2)  # [B*S, F, ck]
        att = att.view(b, s, f, -1).transpose(1, 2).reshape(b, f * s, -1)
        return x + self.proj_keyboard(att)

