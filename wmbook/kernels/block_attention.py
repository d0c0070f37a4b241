"""Attention of a block of queries over a window of keys, no mask: the causal DiT's self-attention with its KV cache
(a block of 3 latent frames attends to the cached frames and to itself, every key visible: the block-causal mask
is in which keys the cache holds, not in a mask) and its cross-attention to the image tokens.

One program takes BLOCK_M queries of one (batch, head) and walks the keys in tiles of BLOCK_N with an online
softmax (running maximum and sum in fp32, the output rescaled when the maximum grows), so the [Lq, Lk] scores never
leave the chip: q read once, k and v once per query tile, o written once. Full key tiles run without masks; the last,
partial tile (the window's 5280 keys at mg2-universal are 82.5 tiles of 64) masks its missing keys to -inf.

Layout: [B, L, H, D] as the models' attention() takes it (any strides for B, L and H; D contiguous). q and k/v may
have different lengths (Lq, Lk); the SDPA scale 1/sqrt(D); D <= 256. fp32 inputs take the products in IEEE fp32,
bf16/fp16 run on the tensor cores with fp32 accumulation and P cast to the input dtype for P.V (as flash attention
does).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from . import check_dtype, interpreting, next_pow2, runs_triton

try:
    import triton
    import triton.language as tl
except ImportError:  # the custom op falls back to the reference
    triton = None

MAX_HEAD_DIM = 256
LOG2E = 1.4426950408889634


if triton is not None:

    @triton.jit
    def _attend_tile(acc, l_i, m_i, q, k_base, v_base, start, LK, skl, svl, offs_n, offs_d, dmask, qk_scale,
                     MASKED: tl.constexpr, EVEN_D: tl.constexpr, IEEE: tl.constexpr):
        """One tile of BLOCK_N keys folded into the running (acc, l_i, m_i) of a query tile; m_i is the running
        maximum of the unscaled scores (the scale is applied inside exp2, one multiply-add a score)."""
        n = start + offs_n
        if MASKED:
            kmask = (n < LK)[:, None] & dmask[None, :]
            k = tl.load(k_base + n[:, None] * skl + offs_d[None, :], mask=kmask, other=0.0)
            v = tl.load(v_base + n[:, None] * svl + offs_d[None, :], mask=kmask, other=0.0)
        elif EVEN_D:  # a whole tile of a head dim that fills the block: unpredicated loads
            k = tl.load(k_base + n[:, None] * skl + offs_d[None, :])
            v = tl.load(v_base + n[:, None] * svl + offs_d[None, :])
        else:
            k = tl.load(k_base + n[:, None] * skl + offs_d[None, :], mask=dmask[None, :], other=0.0)
            v = tl.load(v_base + n[:, None] * svl + offs_d[None, :], mask=dmask[None, :], other=0.0)
        if IEEE:
            s = tl.dot(q.to(tl.float32), tl.trans(k.to(tl.float32)), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(k))
        if MASKED:
            s = tl.where((n < LK)[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.math.exp2((m_i - m_new) * qk_scale)
        p = tl.math.exp2(s * qk_scale - (m_new * qk_scale)[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None]
        if IEEE:
            acc = tl.dot(p, v.to(tl.float32), acc, input_precision="ieee")
        else:
            acc = tl.dot(p.to(v.dtype), v, acc)
        return acc, l_i, m_new

    @triton.jit
    def _block_attention_kernel(
        q_ptr, k_ptr, v_ptr, o_ptr,  # q/o [B, Lq, H, D], k/v [B, Lk, H, D]; D contiguous
        H, LQ, LK, D, qk_scale,  # qk_scale: log2(e)/sqrt(D) (the softmax in base 2)
        sqb, sql, sqh, skb, skl, skh, svb, svl, svh, sob, sol, soh,  # element strides of B, L, H
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_D: tl.constexpr,
        IEEE: tl.constexpr,  # the products in fp32 (not TF32): fp32 inputs, and bf16 in Triton's CPU interpreter
        FULL_TILES: tl.constexpr,  # Lk // BLOCK_N: a compile-time trip count (a cache holds a few key lengths)
        EVEN_D: tl.constexpr,  # D == BLOCK_D
    ):
        pid_m = tl.program_id(0)
        bh = tl.program_id(1).to(tl.int64)
        b, h = bh // H, bh % H
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = tl.arange(0, BLOCK_N)
        offs_d = tl.arange(0, BLOCK_D)
        dmask = offs_d < D
        qmask = (offs_m < LQ)[:, None] & dmask[None, :]
        q = tl.load(q_ptr + b * sqb + h * sqh + offs_m[:, None] * sql + offs_d[None, :], mask=qmask, other=0.0)
        k_base = k_ptr + b * skb + h * skh
        v_base = v_ptr + b * svb + h * svh
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        for t in range(0, FULL_TILES):
            acc, l_i, m_i = _attend_tile(acc, l_i, m_i, q, k_base, v_base, t * BLOCK_N, LK, skl, svl, offs_n, offs_d,
                                         dmask, qk_scale, MASKED=False, EVEN_D=EVEN_D, IEEE=IEEE)
        if FULL_TILES * BLOCK_N < LK:
            acc, l_i, m_i = _attend_tile(acc, l_i, m_i, q, k_base, v_base, FULL_TILES * BLOCK_N, LK, skl, svl,
                                         offs_n, offs_d, dmask, qk_scale, MASKED=True, EVEN_D=EVEN_D, IEEE=IEEE)
        acc = acc / l_i[:, None]
        tl.store(o_ptr + b * sob + h * soh + offs_m[:, None] * sol + offs_d[None, :],
                 acc.to(o_ptr.dtype.element_ty), mask=qmask)


def _check(q, k, v):
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_dtype(name, t)
        if t.dim() != 4:
            raise ValueError(f"{name} must be [B, L, H, D], got {tuple(t.shape)}")
    b, _, h, d = q.shape
    if k.shape != v.shape or k.shape[0] != b or k.shape[2] != h or k.shape[3] != d or k.dtype != q.dtype \
            or v.dtype != q.dtype:
        raise ValueError(f"k and v must be [B, Lk, H, D] of q's B, H, D and dtype (q {tuple(q.shape)} {q.dtype}); got "
                         f"k {tuple(k.shape)} {k.dtype}, v {tuple(v.shape)} {v.dtype}")


def supported(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask=None) -> bool:
    """Whether block_attention takes this call: no mask, q [B, Lq, H, D] and k/v [B, Lk, H, D] of one dtype, Lk >= 1,
    D <= 256 and contiguous."""
    return (mask is None and q.dim() == 4 and k.dim() == 4 and k.shape == v.shape
            and k.shape[0] == q.shape[0] and k.shape[2] == q.shape[2] and k.shape[3] == q.shape[3]
            and k.shape[1] >= 1 and k.dtype == q.dtype == v.dtype
            and q.dtype in (torch.float32, torch.bfloat16, torch.float16) and q.shape[3] <= MAX_HEAD_DIM
            and all(t.stride(3) == 1 for t in (q, k, v)))


def block_attention_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """SDPA (no mask, scale 1/sqrt(D)) on [B, L, H, D], in q's dtype: what the models' attention() runs."""
    _check(q, k, v)
    return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)).transpose(1, 2)


def block_attention_bytes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> int:
    """q, k and v read once, o written once."""
    return (2 * q.numel() + k.numel() + v.numel()) * q.element_size()


def block_attention_flops(q: torch.Tensor, k: torch.Tensor) -> int:
    """The two matrix products' multiply-adds counted as 2 FLOPs: 4 * B * H * Lq * Lk * D."""
    b, lq, h, d = q.shape
    return 4 * b * h * lq * k.shape[1] * d


def default_tiles(d: int, dtype: torch.dtype) -> tuple[int, int, int, int]:
    """(block_m, block_n, num_warps, num_stages) for head dim d: 128 queries a program on 8 warps and 64 keys a tile
    with 3 stages in flight for the 16-bit types at D <= 128 (the shape flash attention kernels use on Hopper); fp32
    and larger heads take smaller tiles (registers and shared memory)."""
    bd = max(16, next_pow2(d))
    if dtype == torch.float32 or bd > 128:
        return 64, 32, 4, 2
    return 128, 64, 8 if bd == 128 else 4, 3


def block_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_m: int | None = None,
                    block_n: int | None = None, num_warps: int | None = None, num_stages: int | None = None
                    ) -> torch.Tensor:
    """The Triton launcher: q [B, Lq, H, D], k/v [B, Lk, H, D] -> o [B, Lq, H, D] (contiguous). Tile sizes default to
    `default_tiles`; pass them to compare tiles (each a power of two >= 16)."""
    _check(q, k, v)
    if not supported(q, k, v):
        raise ValueError(f"block_attention takes D <= {MAX_HEAD_DIM} with D contiguous and Lk >= 1; got q "
                         f"{tuple(q.shape)} strides {q.stride()}, k {tuple(k.shape)} strides {k.stride()}")
    nb, lq, heads, d = q.shape
    dm, dn, dw, ds = default_tiles(d, q.dtype)
    block_m, block_n = block_m or dm, block_n or dn
    for name, val in (("block_m", block_m), ("block_n", block_n)):
        if isinstance(val, bool) or not isinstance(val, int) or val < 16 or val & (val - 1):
            raise ValueError(f"{name}={val!r} is not allowed; allowed values: a power of two >= 16")
    o = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if o.numel() == 0:
        return o
    if interpreting():  # Triton's CPU interpreter runs every tile in numpy: small tiles keep the tests quick
        block_m, block_n = min(block_m, max(16, next_pow2(lq))), min(block_n, 16)
    _block_attention_kernel[(triton.cdiv(lq, block_m), nb * heads)](
        q, k, v, o, heads, lq, k.shape[1], d, LOG2E / math.sqrt(d), *q.stride()[:3], *k.stride()[:3],
        *v.stride()[:3], *o.stride()[:3], BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=max(16, next_pow2(d)),
        # Triton's CPU interpreter gets bf16 tl.dot wrong (triton 3.x: errors of 1e10): there bf16 is multiplied in fp32
        IEEE=q.dtype == torch.float32 or (interpreting() and q.dtype == torch.bfloat16),
        FULL_TILES=k.shape[1] // block_n, EVEN_D=d == max(16, next_pow2(d)), num_warps=num_warps or dw,
        num_stages=num_stages or ds)
    return o


# An opaque custom op, unlike the other kernels' triton_ops (define_op): torch.compile calls it and never copies the
# kernel into its own code. Copied by inductor (torch 2.11, triton 3.6, H200) the kernel did not compile (Triton's
# check of the P.V product's accumulator failed), where the same kernel launched by this launcher compiles and
# passes its tests; an opaque op runs exactly the kernel that tools/attn_bench.py times.
@torch.library.custom_op("wmbook::block_attention", mutates_args=())
def block_attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """The op torch.compile sees: the Triton kernel where it runs and takes the call, else SDPA."""
    if runs_triton(q.device) and triton is not None and supported(q, k, v):
        return block_attention(q, k, v)
    return block_attention_ref(q, k, v).contiguous()


@block_attention_op.register_fake
def _(q, k, v):
    return q.new_empty(q.shape)


__all__ = ["MAX_HEAD_DIM", "block_attention", "block_attention_bytes", "block_attention_flops", "block_attention_op",
           "block_attention_ref", "default_tiles", "supported"]
