"""One GEMM for the causal DiT self-attention's q, k and v projections (variant `fused-qkv`, notebook 05).

Each self-attention projects its input three times with three [C, C] weights; the fused projection multiplies once
by their concatenation [3C, C] and splits the result: one kernel launch and one read of the input instead of three,
and a GEMM three times wider, which keeps more of the GPU busy at the DiT's few thousand tokens a block. Each output
element is the same dot product, so the result differs from the three GEMMs only by the order in which the GEMM
library accumulates (gate: the precision in effect).

The fused weight is made once; q, k and v keep their modules as views of it (no copy), so a variant that calls them
still works. Notebook 05's fused q/k RMSNorm + RoPE kernel (`triton-fused`) reads the fused projection when it is
there, whichever of the two variants comes first.
"""

from __future__ import annotations

import torch
from torch import nn

from ..models.causal_wan import CausalWanSelfAttention, WanCrossAttention, apply_rope
from ..profiling.labels import detail_label as dl
from .swaps import swap_class


class FusedQKVSelfAttention:
    """CausalWanSelfAttention with q, k and v from one GEMM (`self.qkv`); otherwise the reference's forward."""

    def forward(self, x, cos, sin, kv_cache, start_token=None, mask=None):
        b, s = x.shape[:2]
        n, d = self.num_heads, self.head_dim
        with dl("DiT_SelfAttn_QKV_RoPE"):
            q, k, v = self.qkv(x).split(self.dim, dim=-1)
            q = apply_rope(self.norm_q(q).view(b, s, n, d), cos, sin)  # [B, L, H, D]
            k = apply_rope(self.norm_k(k).view(b, s, n, d), cos, sin)
            v = v.reshape(b, s, n, d)
        return self.attend(q, k, v, kv_cache, start_token, mask)


def _fused_linear(parts: list[nn.Linear]) -> nn.Linear:
    """One linear whose weight (and bias) is the concatenation of `parts`' along the output dimension."""
    w = torch.cat([p.weight.detach() for p in parts], dim=0)
    has_bias = all(p.bias is not None for p in parts)
    out = nn.Linear(w.shape[1], w.shape[0], bias=has_bias, device=w.device, dtype=w.dtype)
    with torch.no_grad():
        out.weight.copy_(w)
        if has_bias:
            out.bias.copy_(torch.cat([p.bias.detach() for p in parts]))
    out.requires_grad_(False)
    return out


def fuse_qkv(model: nn.Module) -> int:
    """Give every causal self-attention of `model` (not the cross-attentions: their k and v read the context) a fused
    q/k/v projection; returns how many. q, k and v become views of the fused weight."""
    n = 0
    for m in model.modules():
        if not isinstance(m, CausalWanSelfAttention) or isinstance(m, WanCrossAttention) or hasattr(m, "qkv"):
            continue
        if any(p.bias is None for p in (m.q, m.k, m.v)) and any(p.bias is not None for p in (m.q, m.k, m.v)):
            continue  # a bias on some projections only: nothing to concatenate it with
        qkv = _fused_linear([m.q, m.k, m.v])
        m.qkv = qkv
        for j, name in enumerate(("q", "k", "v")):  # the three projections as views of the fused one
            lin = getattr(m, name)
            sl = slice(j * m.dim, (j + 1) * m.dim)
            lin.weight = nn.Parameter(qkv.weight[sl], requires_grad=False)
            if lin.bias is not None:
                lin.bias = nn.Parameter(qkv.bias[sl], requires_grad=False)
        # notebook 05's fused q/k norm + RoPE forward reads `qkv` itself; any other gets the fused forward
        if not any(c.__name__ == "FusedQKNormRoPE" for c in type(m).__mro__):
            swap_class(m, FusedQKVSelfAttention)
        n += 1
    return n
