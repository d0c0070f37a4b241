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

`short_cross_attention` is the same kernel with a query length of its own and keys shared by consecutive query
sequences: Matrix-Game-2's action modules (3 query frames against at most 6 cached key frames at each of the 880
locations of a frame, per head; the keyboard's keys one sequence per batch item, shared by all its locations). There
inductor's fused multiply-reduce (`action-attn-fused`) recomputes the query's norm and rotation for every key in a
reduction kernel of its own; here each (location, head) problem is loaded once and its keys are not copied per
location.
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
        q_ptr, k_ptr, v_ptr, o_ptr,  # q, o [B, LQ, H, D]; k, v [B // KDIV, LK, H, D]; D contiguous
        NB, LQ, LK, KDIV, D, scale,
        sqb, sql, sqh, skb, skl, skh, svb, svl, svh, sob, sol, soh,  # element strides of B, L, H
        PROBLEMS: tl.constexpr,  # sequences per program
        BLOCK_L: tl.constexpr,
        BLOCK_D: tl.constexpr,
        IEEE: tl.constexpr,  # the products in fp32 (not TF32): fp32 inputs, and bf16 in Triton's CPU interpreter
    ):
        h = tl.program_id(1).to(tl.int64)
        rows = tl.arange(0, BLOCK_L)
        cols = tl.arange(0, BLOCK_D)
        mq = (rows < LQ)[:, None] & (cols < D)[None, :]
        mk = (rows < LK)[:, None] & (cols < D)[None, :]
        keys = (rows < LK)[None, :]
        for i in range(PROBLEMS):
            b = tl.program_id(0).to(tl.int64) * PROBLEMS + i
            kb = b // KDIV  # the key sequence this query sequence attends to
            q = tl.load(q_ptr + b * sqb + h * sqh + rows[:, None] * sql + cols[None, :], mask=mq & (b < NB), other=0.0)
            k = tl.load(k_ptr + kb * skb + h * skh + rows[:, None] * skl + cols[None, :], mask=mk & (b < NB),
                        other=0.0)
            v = tl.load(v_ptr + kb * svb + h * svh + rows[:, None] * svl + cols[None, :], mask=mk & (b < NB),
                        other=0.0)
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
                     mask=mq & (b < NB))


if triton is not None:

    @triton.jit
    def _short_cross_attention_kernel(
        q_ptr, k_ptr, v_ptr, o_ptr,  # q, o [B, LQ, H, D]; k, v [B // KDIV, LK, H, D]; D contiguous
        LQ, LK, KDIV, H, D, scale,
        sqb, sql, sqh, skb, skl, skh, svb, svl, svh, sob, sol, soh,  # element strides of B, L, H
        BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
    ):
        # one query sequence, BLOCK_H heads: a few frames each, so no tensor-core tile (16 rows at least) would be
        # more than a fifth full; the products broadcast in fp32 registers instead ([Q, K, H, D] per program)
        b = tl.program_id(0).to(tl.int64)
        kb = b // KDIV  # the key sequence this query sequence attends to
        iq = tl.arange(0, BLOCK_Q)
        ik = tl.arange(0, BLOCK_K)
        ih = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
        d = tl.arange(0, BLOCK_D)
        hd = (ih < H)[None, :, None] & (d < D)[None, None, :]
        mq = (iq < LQ)[:, None, None] & hd
        mk = (ik < LK)[:, None, None] & hd
        q = tl.load(q_ptr + b * sqb + iq[:, None, None] * sql + ih[None, :, None] * sqh + d[None, None, :], mask=mq,
                    other=0.0).to(tl.float32)
        k = tl.load(k_ptr + kb * skb + ik[:, None, None] * skl + ih[None, :, None] * skh + d[None, None, :], mask=mk,
                    other=0.0).to(tl.float32)
        v = tl.load(v_ptr + kb * svb + ik[:, None, None] * svl + ih[None, :, None] * svh + d[None, None, :], mask=mk,
                    other=0.0).to(tl.float32)
        s = tl.sum(q[:, None, :, :] * k[None, :, :, :], axis=3) * scale  # [Q, K, H]
        s = tl.where((ik < LK)[None, :, None], s, float("-inf"))
        p = tl.exp(s - tl.max(s, axis=1)[:, None, :])
        p = p / tl.sum(p, axis=1)[:, None, :]
        o = tl.sum(p[:, :, :, None] * v[None, :, :, :], axis=1)  # [Q, H, D]
        tl.store(o_ptr + b * sob + iq[:, None, None] * sol + ih[None, :, None] * soh + d[None, None, :],
                 o.to(o_ptr.dtype.element_ty), mask=mq)


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
    _check_problems(problems)
    return _launch(q, k, v, problems)


def _check_problems(problems) -> None:
    if isinstance(problems, bool) or not isinstance(problems, int) or problems < 1:
        raise ValueError(f"problems={problems!r} is not allowed; allowed values: an integer >= 1")


def _launch(q, k, v, problems: int) -> torch.Tensor:
    nb, lq, heads, d = q.shape
    lk = k.shape[1]
    o = torch.empty_like(q, memory_format=torch.contiguous_format)
    if o.numel() == 0:
        return o
    block_l, block_d = max(16, next_pow2(max(lq, lk))), max(16, next_pow2(d))
    problems = min(problems, nb)
    launch(_short_attention_kernel)[(triton.cdiv(nb, problems), heads)](
        q, k, v, o, nb, lq, lk, nb // k.shape[0], d, 1.0 / math.sqrt(d), *q.stride()[:3], *k.stride()[:3],
        *v.stride()[:3], *o.stride()[:3], PROBLEMS=problems, BLOCK_L=block_l, BLOCK_D=block_d,
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


# --- queries of a length of their own, keys shared by consecutive query sequences (the action modules) ------------


def _check_cross(q, k, v):
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_dtype(name, t)
        if t.dim() != 4:
            raise ValueError(f"{name} must be [B, L, H, D], got {tuple(t.shape)}")
    if (v.shape != k.shape or k.dtype != q.dtype or v.dtype != q.dtype or k.shape[2:] != q.shape[2:]
            or k.shape[0] < 1 or q.shape[0] % k.shape[0]):
        raise ValueError(f"q [B, Lq, H, D] and k, v [Bk, Lk, H, D] must share H, D and dtype, k and v one shape, Bk "
                         f"dividing B; got q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}, "
                         f"{q.dtype} {k.dtype} {v.dtype}")


def supported_cross(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask=None) -> bool:
    """Whether short_cross_attention takes this call: no mask, q [B, Lq, H, D] and k, v [Bk, Lk, H, D] of one dtype
    with Bk dividing B, Lq and Lk <= 128, D <= 256, D contiguous."""
    return (mask is None and q.dim() == 4 and k.dim() == 4 and v.shape == k.shape
            and k.shape[2:] == q.shape[2:] and k.shape[0] >= 1 and q.shape[0] % k.shape[0] == 0
            and k.dtype == q.dtype == v.dtype and q.dtype in (torch.float32, torch.bfloat16, torch.float16)
            and max(q.shape[1], k.shape[1]) <= MAX_LEN and q.shape[3] <= MAX_HEAD_DIM
            and all(t.stride(3) == 1 for t in (q, k, v)))


def short_cross_attention_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """SDPA in fp32 (no mask, scale 1/sqrt(D)) with each key sequence repeated for the B // Bk query sequences it
    serves, in q's dtype: what models.attention.small_attention computes for these calls."""
    _check_cross(q, k, v)
    rep = q.shape[0] // k.shape[0]
    k, v = (t.float().repeat_interleave(rep, dim=0).transpose(1, 2) for t in (k, v))
    return F.scaled_dot_product_attention(q.float().transpose(1, 2), k, v).transpose(1, 2).to(q.dtype)


def short_cross_attention_bytes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> int:
    """q and the shared k, v read once, o written once."""
    return (2 * q.numel() + k.numel() + v.numel()) * q.element_size()


def short_cross_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_h: int = 4) -> torch.Tensor:
    """The Triton launcher: q [B, Lq, H, D], k, v [Bk, Lk, H, D] -> o [B, Lq, H, D] (contiguous); query sequence b
    attends to key sequence b // (B // Bk); a program takes one query sequence and `block_h` heads, in fp32."""
    _check_cross(q, k, v)
    if not supported_cross(q, k, v):
        raise ValueError(f"short_cross_attention takes Lq, Lk <= {MAX_LEN}, D <= {MAX_HEAD_DIM} with D contiguous; "
                         f"got q {tuple(q.shape)}, k {tuple(k.shape)} with strides {q.stride()}, {k.stride()}")
    if block_h not in (1, 2, 4, 8, 16):
        raise ValueError(f"block_h={block_h!r} is not allowed; allowed values: 1, 2, 4, 8, 16")
    nb, lq, heads, d = q.shape
    lk = k.shape[1]
    o = torch.empty_like(q, memory_format=torch.contiguous_format)
    if o.numel() == 0:
        return o
    block_q, block_k, block_d = next_pow2(lq), next_pow2(lk), next_pow2(d)
    block_h = min(block_h, next_pow2(heads))
    launch(_short_cross_attention_kernel)[(nb, triton.cdiv(heads, block_h))](
        q, k, v, o, lq, lk, nb // k.shape[0], heads, d, 1.0 / math.sqrt(d), *q.stride()[:3], *k.stride()[:3],
        *v.stride()[:3], *o.stride()[:3], BLOCK_Q=block_q, BLOCK_K=block_k, BLOCK_H=block_h, BLOCK_D=block_d,
        num_warps=4 if block_q * block_k * block_h * block_d <= 8192 else 8)
    return o


@define_op("wmbook::short_cross_attention")
def short_cross_attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """The op torch.compile sees (define_op): the Triton kernel where it runs and takes the call, else the fp32
    reference."""
    if runs_triton(q.device) and triton is not None and supported_cross(q, k, v):
        return short_cross_attention(q, k, v)
    return short_cross_attention_ref(q, k, v).contiguous()


@short_cross_attention_op.register_fake
def _(q, k, v):
    return q.new_empty(q.shape)


__all__ = ["MAX_HEAD_DIM", "MAX_LEN", "short_attention", "short_attention_bytes", "short_attention_op",
           "short_attention_ref", "short_cross_attention", "short_cross_attention_bytes", "short_cross_attention_op",
           "short_cross_attention_ref", "supported", "supported_cross"]
