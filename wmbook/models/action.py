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


def time_rope_tables(start: int, num_frames: int, dims: int, theta: float, device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin [1, F, 1, dims/2] of the frame-index RoPE for latent frames start .. start+F-1 (float32)."""
    inv = 1.0 / torch.pow(theta, torch.arange(0, dims, 2, device=device, dtype=torch.float64) / dims)
    ang = torch.outer(torch.arange(start, start + num_frames, device=device, dtype=torch.float64), inv)  # [F, dims/2]
    return torch.cos(ang).float()[None, :, None, :], torch.sin(ang).float()[None, :, None, :]


def apply_time_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE over the frame index on the first 2*cos.shape[-1] channels of x [N, F, H, D] (adjacent pairs);
    upstream's (t, h, w) split with h = w = 0 leaves the other channels unrotated."""
    dims = 2 * cos.shape[-1]
    rot = x[..., :dims].float().unflatten(-1, (-1, 2))
    x0, x1 = rot[..., 0], rot[..., 1]
    rot = torch.stack([x0 * cos - x1 * sin, x0 * sin + x1 * cos], dim=-1).flatten(-2)
    return torch.cat([rot.type_as(x), x[..., dims:]], dim=-1)


def action_windows(cond: torch.Tensor, start_frame: int, num_frames: int, ratio: int, window: int,
                   sync_check: bool = True) -> torch.Tensor:
    """cond [B, N_pix, ...] -> [B, F, window*ratio, ...]: raw frames [ratio*(i-window), ratio*i) per latent i.

    sync_check=True checks the bound on the device-built index (a host read, like upstream's `.item()`s);
    False checks it with host integers (no sync).
    """
    pad_t = ratio * window
    padded = torch.cat([cond[:, :1].expand(-1, pad_t, *cond.shape[2:]), cond], dim=1)
    frames = torch.arange(start_frame, start_frame + num_frames, device=cond.device)
    idx = ratio * frames[:, None] + torch.arange(pad_t, device=cond.device)[None, :]  # padded coords
    top = int(idx.max()) if sync_check else ratio * (start_frame + num_frames - 1) + pad_t - 1
    if top >= padded.shape[1]:
        raise ValueError(f"action sequence has {cond.shape[1]} frames; latent frame {start_frame + num_frames - 1} "
                         f"needs at least {ratio * (start_frame + num_frames - 1)}")
    return padded[:, idx]


@dataclass
class ActionInputs:
    """What every action module of one forward needs from the raw actions: the same for all 15 modules."""

    mouse: torch.Tensor  # [B, F, window*ratio*mouse_dim] raw mouse windows
    keyboard: torch.Tensor  # [B, F, window*ratio, keyboard_dim] raw keyboard windows (each module embeds them)
    cos: torch.Tensor  # [1, F, 1, rope_dims/2] frame-index RoPE tables
    sin: torch.Tensor
    mask: torch.Tensor | None  # [F, F] block-causal frame mask (full-sequence forward only)


def prepare_action_inputs(actions: dict, start_frame: int, num_frames: int, cfg, dtype, *, frames_per_block: int,
                          local_attn_size: int, cached: bool, sync_check: bool = True) -> ActionInputs:
    """Windows, RoPE tables and mask of one forward (latent frames start_frame .. start_frame+F-1)."""
    r, w = cfg.vae_time_compression_ratio, cfg.windows_size
    dev = actions["mouse"].device
    mouse = action_windows(actions["mouse"].to(dtype), start_frame, num_frames, r, w, sync_check).flatten(2)
    keyboard = action_windows(actions["keyboard"].to(dtype), start_frame, num_frames, r, w, sync_check)
    cos, sin = time_rope_tables(start_frame, num_frames, cfg.rope_dim_list[0], cfg.rope_theta, dev)
    mask = None if cached else block_causal_frame_mask(num_frames, frames_per_block, local_attn_size, dev)
    return ActionInputs(mouse=mouse, keyboard=keyboard, cos=cos, sin=sin, mask=mask)


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

    def forward(self, x, grid, actions: dict | None = None, *, start_frame: int | None = None,
                cache: ActionCache | None = None, inputs: ActionInputs | None = None):
        # x [B, F*S, C]; actions {"mouse": [B, N_pix, 2], "keyboard": [B, N_pix, 4]} or precomputed `inputs`
        cfg = self.cfg
        f, s = grid[0], grid[1] * grid[2]
        b, _, cdim = x.shape
        nh = cfg.heads_num
        if inputs is None:  # reference: every module windows the raw actions itself, like upstream
            inputs = prepare_action_inputs(actions, start_frame, f, cfg, x.dtype,
                                           frames_per_block=self.frames_per_block,
                                           local_attn_size=self.local_attn_size, cached=cache is not None)
        mask = inputs.mask

        # mouse: per spatial location, temporal self-attention over latent frames
        hs = x.view(b, f, s, cdim).transpose(1, 2).reshape(b * s, f, cdim)  # [B*S, F, C]
        mouse = inputs.mouse[:, None].expand(b, s, f, inputs.mouse.shape[-1]).reshape(b * s, f, -1)
        g = self.mouse_mlp(torch.cat([hs, mouse], dim=-1))  # [B*S, F, c]
        q, k, v = self.t_qkv(g).view(b * s, f, 3, nh, -1).unbind(2)  # [B*S, F, H, D]
        q = self.norm_rope(q, self.img_attn_q_norm, inputs, v.dtype)
        k = self.norm_rope(k, self.img_attn_k_norm, inputs, v.dtype)
        if cache is not None:
            k, v = cache.mouse.update(k, v, start_frame)
        att = self.mouse_attention(q, k, v, mask)  # [B*S, F, c]
        att = att.view(b, s, f, -1).transpose(1, 2).reshape(b, f * s, -1)
        x = x + self.proj_mouse(att)

        # keyboard: every token attends to per-frame keyboard tokens (embedding is per frame, so embedding the
        # windowed raw actions equals windowing the embedded sequence)
        kb = self.keyboard_embed(inputs.keyboard).flatten(2)  # [B, F, 12*hidden]
        kk, kv = self.keyboard_attn_kv(kb).view(b, f, 2, nh, -1).unbind(2)  # [B, F, H, D]
        # the norm is per head and token, so it may follow the move to [B*S, F, H, D]
        q = self.mouse_attn_q(x).view(b, f, s, nh, -1).transpose(1, 2).reshape(b * s, f, nh, -1)
        q = self.norm_rope(q, self.key_attn_q_norm, inputs, kv.dtype)
        kk = self.norm_rope(kk, self.key_attn_k_norm, inputs, kv.dtype)
        if cache is not None:
            kk, kv = cache.keyboard.update(kk, kv, start_frame)
        att = self.keyboard_attention(q, kk, kv, mask, b, s)  # [B*S, F, ck]
        att = att.view(b, s, f, -1).transpose(1, 2).reshape(b, f * s, -1)
        return x + self.proj_keyboard(att)

    def norm_rope(self, x, norm: HeadRMSNorm, inputs: ActionInputs, dtype):
        """An attention's queries or keys x [N, F, H, D]: RMSNorm over the head dim, then the frame-index RoPE."""
        return apply_time_rope(norm(x).to(dtype), inputs.cos, inputs.sin)

    def mouse_attention(self, q, k, v, mask):
        """Temporal attention per spatial location: q [B*S, F, H, D], k/v [B*S, nk, H, D] -> [B*S, F, H*D]."""
        return attention(q, k, v, mask=mask).flatten(2)

    def keyboard_attention(self, q, kk, kv, mask, b: int, s: int):
        """Every location's queries [B*S, F, H, D] against the per-frame keyboard K/V [B, nk, H, D] ->
        [B*S, F, H*D]; upstream repeats the keyboard K/V for every location."""
        nk, nh = kk.shape[1], kk.shape[2]
        kk = kk[:, None].expand(b, s, nk, nh, -1).reshape(b * s, nk, nh, -1)
        kv = kv[:, None].expand(b, s, nk, nh, -1).reshape(b * s, nk, nh, -1)
        return attention(q, kk, kv, mask=mask).flatten(2)
