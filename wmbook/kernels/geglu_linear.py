"""GEGLU's projection and gate as one Triton GEMM: y = (x Wa^T + ba) * GELU(x Wg^T + bg).

Why it exists: the video UNet's feed-forward (upstream `FeedForward(glu=True)`) projects every token to twice the inner
width, writes that [tokens, 2 x inner] output, and a pointwise kernel reads it back to multiply one half by the GELU of
the other. At the wma shape the top level's 40,960 tokens make that the widest activation of the block: inductor's
`gelu_mul` kernels took 5.3 ms of an iteration's 219 ms of GPU work on the H200 (80 calls of the two largest shapes;
NOTES.md). Here each output tile accumulates both halves' columns in two fp32 accumulators from one read of x, and the
epilogue writes only the product: the 2 x inner output is never written or read. Whether that beats cuBLAS's GEMM
and inductor's kernel at these shapes is what `tools/wma_iteration_account.py` says, with a stack with and one without
`geglu-gemm`; the variant joins no notebook's default rows before it does.

The contract of wmbook.kernels: `_geglu_linear_kernel`, `geglu_linear` (the launcher), `geglu_linear_ref` (plain
torch), `geglu_linear_bytes`, and the op `wmbook::geglu_linear` (define_op) that the variant `geglu-gemm` calls.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from . import check_dtype, define_op, interpreting, launch, runs_triton
from .wave_linear import GROUP_M

try:
    import triton
    import triton.language as tl
except ImportError:  # optional: without triton the op runs its reference
    triton = None

# (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages) per output tile: two fp32 accumulators of BLOCK_M x BLOCK_N, so
# half the tile a one-accumulator GEMM holds in registers. The first is the default: on the H200 it was the fastest
# of these at each of the wma UNet's feed-forward shapes (tools/geglu_bench.py), so no autotuning at the first call
# (it compiled every tile for every K, minutes inside a whole-UNet compile).
TILES = ((128, 128, 64, 8, 3), (128, 64, 64, 4, 4), (128, 64, 64, 8, 4), (64, 128, 64, 4, 4), (256, 64, 64, 8, 3))

if triton is not None:
    from .wave_linear import grouped_tile

    @triton.jit
    def _geglu_linear_kernel(
        x_ptr,  # [M, K] rows of the input
        w_ptr,  # [2N, K] the projection's weight, nn.Linear's layout: rows [0, N) the value, [N, 2N) the gate
        b_ptr,  # [2N] its bias
        y_ptr,  # [M, N] the output
        M, N, K,
        sxm, sxk, swn, swk, sym, syn,  # element strides
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_K: tl.constexpr,
        GROUP: tl.constexpr,
        K_TILES: tl.constexpr,  # cdiv(K, BLOCK_K): a compile-time trip count (a model has a few K)
        IEEE: tl.constexpr,  # the products in fp32 (not TF32): fp32 inputs, and bf16 in Triton's CPU interpreter
    ):
        offs_m, offs_n, am, wn = grouped_tile(M, N, BLOCK_M, BLOCK_N, GROUP)
        offs_k = tl.arange(0, BLOCK_K)
        x_ptrs = x_ptr + am[:, None].to(tl.int64) * sxm + offs_k[None, :] * sxk
        wa_ptrs = w_ptr + wn[None, :].to(tl.int64) * swn + offs_k[:, None] * swk
        # the gate's rows follow the value's; a scalar argument may arrive as a Python int (specialized), so the
        # 64-bit offset is made on the block
        wg_ptrs = w_ptr + (wn[None, :] + N).to(tl.int64) * swn + offs_k[:, None] * swk
        acc_a = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for kt in range(0, K_TILES):
            kmask = offs_k < K - kt * BLOCK_K
            a = tl.load(x_ptrs, mask=kmask[None, :], other=0.0)
            wa = tl.load(wa_ptrs, mask=kmask[:, None], other=0.0)
            wg = tl.load(wg_ptrs, mask=kmask[:, None], other=0.0)
            if IEEE:
                a = a.to(tl.float32)
                acc_a = tl.dot(a, wa.to(tl.float32), acc_a, input_precision="ieee")
                acc_g = tl.dot(a, wg.to(tl.float32), acc_g, input_precision="ieee")
            else:
                acc_a = tl.dot(a, wa, acc_a)
                acc_g = tl.dot(a, wg, acc_g)
            x_ptrs += BLOCK_K * sxk
            wa_ptrs += BLOCK_K * swk
            wg_ptrs += BLOCK_K * swk
        nmask = offs_n < N
        acc_a += tl.load(b_ptr + offs_n, mask=nmask, other=0.0).to(tl.float32)[None, :]
        acc_g += tl.load(b_ptr + N + offs_n, mask=nmask, other=0.0).to(tl.float32)[None, :]
        y = acc_a * (0.5 * acc_g * (1.0 + tl.math.erf(acc_g * 0.7071067811865476)))  # GELU, the exact (erf) form
        y_ptrs = y_ptr + offs_m[:, None].to(tl.int64) * sym + offs_n[None, :] * syn
        tl.store(y_ptrs, y.to(y_ptr.dtype.element_ty), mask=(offs_m < M)[:, None] & nmask[None, :])


def _check(x, weight, bias):
    check_dtype("x", x)
    if weight.dim() != 2 or weight.shape[0] % 2 or x.shape[-1] != weight.shape[1] or weight.dtype != x.dtype:
        raise ValueError(f"weight must be [2N, K] (value rows, then gate rows) with x's K and dtype (x "
                         f"{tuple(x.shape)} {x.dtype}); got {tuple(weight.shape)} {weight.dtype}")
    if bias.shape != (weight.shape[0],) or bias.dtype != x.dtype:
        raise ValueError(f"bias must be [2N] = [{weight.shape[0]}] of x's dtype {x.dtype}; got "
                         f"{tuple(bias.shape)} {bias.dtype}")


def geglu_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, *,
                 tiles: tuple[int, int, int, int, int] | None = None) -> torch.Tensor:
    """GEGLU(x) = value * GELU(gate), (value, gate) = F.linear(x, weight, bias).chunk(2, -1), by _geglu_linear_kernel:
    x [..., K], weight [2N, K], bias [2N], one dtype (fp32, bf16, fp16); the output [..., N] contiguous, accumulated
    in fp32 and rounded once. `tiles`: a TILES entry (default: the first)."""
    _check(x, weight, bias)
    if tiles is not None and tiles not in TILES:
        raise ValueError(f"tiles={tiles!r} is not allowed; allowed values: one of {list(TILES)}")
    if x.shape[-1] == 0:  # no products: the bias alone decides (and rows of no elements cannot be reshaped)
        return geglu_linear_ref(x, weight, bias)
    x2 = x.reshape(-1, x.shape[-1])
    m, k = x2.shape
    n = weight.shape[0] // 2
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0 or n == 0:
        return y.reshape(*x.shape[:-1], n)
    args = (x2, weight, bias, y, m, n, k, *x2.stride(), *weight.stride(), *y.stride())
    # Triton's CPU interpreter gets bf16 tl.dot wrong (triton 3.x): there bf16 is multiplied in fp32
    ieee = x.dtype == torch.float32 or interpreting()
    # the interpreter runs each program's tile as numpy arrays: few programs of mid-sized tiles are quickest there
    bm, bn, bk, warps, stages = (64, 64, 32, 4, 1) if interpreting() else (tiles or TILES[0])
    grid = (triton.cdiv(m, bm) * triton.cdiv(n, bn),)
    launch(_geglu_linear_kernel)[grid](*args, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP=GROUP_M,
                                       K_TILES=triton.cdiv(k, bk), IEEE=ieee, num_warps=warps, num_stages=stages)
    return y.reshape(*x.shape[:-1], n)


def geglu_linear_ref(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """The projection in fp32, value * GELU(gate) in fp32, rounded to x's dtype once."""
    a, g = F.linear(x.float(), weight.float(), bias.float()).chunk(2, dim=-1)
    return (a * F.gelu(g)).to(x.dtype)


def geglu_linear_bytes(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> int:
    """The fewest bytes the op moves: x, the weight and the bias read once, the output written once."""
    m = x.numel() // x.shape[-1]
    return (x.numel() + weight.numel() + bias.numel() + m * weight.shape[0] // 2) * x.element_size()


@define_op("wmbook::geglu_linear")
def geglu_linear_op(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """The op torch.compile sees (define_op): the Triton kernel where it runs, else the reference."""
    if runs_triton(x.device) and triton is not None:
        return geglu_linear(x, weight, bias)
    return geglu_linear_ref(x, weight, bias).contiguous()


@geglu_linear_op.register_fake
def _(x, weight, bias):
    return x.new_empty((*x.shape[:-1], weight.shape[0] // 2))


__all__ = ["TILES", "geglu_linear", "geglu_linear_bytes", "geglu_linear_op", "geglu_linear_ref"]
