"""Self-attention over short sequences, many per program: the video UNet's temporal attention (16 frames at each of
the latent grid's thousands of positions, per head).

SDPA's kernels tile the queries by 64 or 128 rows and give each (sequence, head) its own program: at 16 frames a
program works on a tile three quarters empty, and the UNet's top level launches 2560 positions x 5 heads of them,
each loading three 2 KB blocks and storing one. Here one program runs PROBLEMS sequences of one head in turn, each
whole in registers: q, k and v [L, D] loaded once, the [L, L] scores and their softmax in fp32, P.V, o stored once.
What it must move is q, k and v read once and o written once.

Layout: [B, L, H, D] as the UNet's attention takes it (any strides for B, L and H; D contiguous). No mask, the SDPA
scale 1/sqrt(D), L <= 128, D <= 256; fp32 inputs take the products in IEEE fp32, bf16/fp16 on the tensor cores with
fp32 accumulation.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from . import check_dtype, define_op, interpreting, launch, next_pow2, runs_triton

try:
    import triton
    import triton.language as tl
except ImportError:  # the custom op falls back to the reference
    triton = None

MAX_LEN, MAX_HEAD_DIM = 128, 256


if triton is not None:

    @triton.jit
    def _short_attention_kernel(
        q_ptr, k_ptr, v_ptr, o_ptr,  # [B, L, H, D], D contiguous
        NB, L, D, scale,
        sqb, sql, sqh, skb, skl, skh, svb, svl, svh, sob, sol, soh,  # element strides of B, L, H
        PROBLEMS: tl.constexpr,  # sequences per program
        BLOCK_L: tl.constexpr,
        BLOCK_D: tl.constexpr,
        IEEE: tl.constexpr,  # the products in fp32 (not TF32): fp32 inputs, and bf16 in Triton's CPU interpreter
    ):
        h = tl.program_id(1).to(tl.int64)
        rows = tl.arange(0, BLOCK_L)
        cols = tl.arange(0, BLOCK_D)
        m = (rows < L)[:, None] & (cols < D)[None, :]
        keys = (rows < L)[None, :]
        for i in range(PROBLEMS):
            b = tl.program_id(0).to(tl.int64) * PROBLEMS + i
            mb = m & (b < NB)
            q = tl.load(q_ptr + b * sqb + h * sqh + rows[:, None] * sql + cols[None, :], mask=mb, other=0.0)
            k = tl.load(k_ptr + b * skb + h * skh + rows[:, None] * skl + cols[None, :], mask=mb, other=0.0)
            v = tl.load(v_ptr + b * svb + h * svh + rows[:, None] * svl + cols[None, :], mask=mb, other=0.0)
            if IEEE:
                s = tl.dot(q.to(tl.float32), tl.trans(k.to(tl.float32)), input_precision="ieee")
            else:
                s = tl.dot(q, tl.trans(k))
            s = tl.where(keys, s * scale, float("-inf"))
            p = tl.exp(s - tl.max(s, axis=1)[:, None])
            p = p / tl.sum(p, axis=1)[:, None]
            if IEEE:
                o = tl.dot(p, v.to(tl.float32), input_precision="ieee")
            else:
                o = tl.dot(p.to(v.dtype), v)
            tl.store(o_ptr + b * sob + h * soh + rows[:, None] * sol + cols[None, :], o.to(o_ptr.dtype.element_ty),
                     mask=mb)


def _check(q, k, v):
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_dtype(name, t)
        if t.dim() != 4:
            raise ValueError(f"{name} must be [B, L, H, D], got {tuple(t.shape)}")
    if k.shape != q.shape or v.shape != q.shape or k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(f"q, k and v must have one shape and dtype (self-attention), got {tuple(q.shape)} "
                         f"{tuple(k.shape)} {tuple(v.shape)}, {q.dtype} {k.dtype} {v.dtype}")


def supported(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask=None) -> bool:
    """Whether short_attention takes this call: unmasked self-attention of one shape and dtype, L <= 128, D <= 256,
    D contiguous."""
    return (mask is None and q.dim() == 4 and k.shape == q.shape and v.shape == q.shape
            and k.dtype == q.dtype == v.dtype and q.dtype in (torch.float32, torch.bfloat16, torch.float16)
            and q.shape[1] <= MAX_LEN and q.shape[3] <= MAX_HEAD_DIM
            and all(t.stride(3) == 1 for t in (q, k, v)))


def short_attention_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """SDPA (no mask, scale 1/sqrt(D)) on [B, L, H, D], in q's dtype: what the UNet's attention() runs."""
    _check(q, k, v)
    return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)).transpose(1, 2)


def short_attention_bytes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> int:
    """q, k and v read once, o written once."""
    return 4 * q.numel() * q.element_size()


def short_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, problems: int = 8) -> torch.Tensor:
    """The Triton launcher: [B, L, H, D] -> o [B, L, H, D] (contiguous); `problems` sequences per program."""
    _check(q, k, v)
    if not supported(q, k, v):
        raise ValueError(f"short_attention takes L <= {MAX_LEN}, D <= {MAX_HEAD_DIM} with D contiguous; got "
                         f"{tuple(q.shape)} with strides {q.stride()}")
    if isinstance(problems, bool) or not isinstance(problems, int) or problems < 1:
        raise ValueError(f"problems={problems!r} is not allowed; allowed values: an integer >= 1")
    nb, length, heads, d = q.shape
    o = torch.empty_like(q, memory_format=torch.contiguous_format)
    if o.numel() == 0:
        return o
    block_l, block_d = max(16, next_pow2(length)), max(16, next_pow2(d))
    problems = min(problems, nb)
    launch(_short_attention_kernel)[(triton.cdiv(nb, problems), heads)](
        q, k, v, o, nb, length, d, 1.0 / math.sqrt(d), *q.stride()[:3], *k.stride()[:3], *v.stride()[:3],
        *o.stride()[:3], PROBLEMS=problems, BLOCK_L=block_l, BLOCK_D=block_d,
        # Triton's CPU interpreter gets bf16 tl.dot wrong (triton 3.x: errors of 1e10): there bf16 is multiplied in fp32
        IEEE=q.dtype == torch.float32 or (interpreting() and q.dtype == torch.bfloat16),
        num_warps=4 if block_l * block_d <= 4096 else 8)
    return o


@define_op("wmbook::short_attention")
def short_attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """The op torch.compile sees (define_op): the Triton kernel where it runs and takes the call, else SDPA."""
    if runs_triton(q.device) and triton is not None and supported(q, k, v):
        return short_attention(q, k, v)
    return short_attention_ref(q, k, v).contiguous()


@short_attention_op.register_fake
def _(q, k, v):
    return q.new_empty(q.shape)


__all__ = ["MAX_HEAD_DIM", "MAX_LEN", "short_attention", "short_attention_bytes", "short_attention_op",
           "short_attention_ref", "supported"]
