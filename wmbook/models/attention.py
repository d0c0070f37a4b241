"""The one attention entry point of the reference models (later notebooks swap its backend)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Scaled dot-product attention on [B, L, H, D] tensors.

    mask: bool, True = attend, broadcastable to [B, H, Lq, Lk]: [Lq, Lk] (block-causal frames) or
    [B, 1, 1, Lk] (a per-sample key mask, as the WMA action cross-attention passes). A swapped-in
    backend must accept both.
    """
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask)
    return out.transpose(1, 2)


def block_causal_frame_mask(num_frames: int, frames_per_block: int, window: int, device=None,
                            num_key_frames: int | None = None) -> torch.Tensor:
    """[F, F] bool: query frame i sees key frame j iff j is before the end of i's block and, with a
    window (in frames, -1 = none), no more than `window` frames before that end."""
    fq = torch.arange(num_frames, device=device)
    fk = torch.arange(num_frames if num_key_frames is None else num_key_frames, device=device)
    end = (fq // frames_per_block + 1) * frames_per_block  # exclusive end of the query's block
    allowed = fk[None, :] < end[:, None]
    if window != -1:
        allowed &= fk[None, :] >= (end[:, None] - window)
    return allowed
