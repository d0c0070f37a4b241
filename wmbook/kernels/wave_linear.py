"""A linear layer (y = x W^T + b) as one Triton GEMM whose tiles fill the GPU's SMs in whole waves.

Why it exists: a GEMM's output tiles run in waves of one tile per SM, so a shape whose tile count sits just past a
multiple of the SM count leaves most SMs idle in its last wave. cuBLAS runs the causal DiT's 1536-wide projections at
mg2-universal (2640 rows, 1536 x 1536) with 128 x 240 tiles: 147 of them on the H200's 132 SMs, two waves for 1.1
waves of work; `choose_tiles` picks 128 x 256 (126 tiles, one wave). Measured (`tools/gemm_bench.py`, H200; NOTES.md):
the wave count is not what holds that GEMM back. In a CUDA graph cuBLAS's kernel takes 17.9 us (696 TFLOP/s, 88% of
the measured GEMM ceiling) and this kernel 20.4 us at its best tiles; of the DiT's four GEMM shapes it is faster only
for the feed-forward's down-projection (96.2 against 98.3 us). It stays a comparison row of that tool, not a variant.

The contract of wmbook.kernels: `_wave_linear_kernel`, `wave_linear` (the launcher), `wave_linear_ref` (plain torch).
No torch.library op: no variant puts it in a model.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from . import check_dtype, interpreting

try:
    import triton
    import triton.language as tl
except ImportError:  # optional: without triton the op runs its reference
    triton = None

# (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages): 128 x 256 and 256 x 128 are the largest tiles whose fp32
# accumulator 8 warps hold in registers; the smaller ones for shapes where a large tile pads too much
TILES = ((128, 256, 64, 8, 3), (256, 128, 64, 8, 3), (128, 128, 64, 8, 4), (128, 128, 64, 4, 4), (64, 128, 64, 4, 4))
GROUP_M = 8  # tiles of GROUP_M row blocks run together, sharing their columns of W in the L2

if triton is not None:

    @triton.jit
    def grouped_tile(M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP: tl.constexpr):
        """This program's output tile of an [M, N] GEMM, tiles of GROUP row blocks running together (they share
        their columns of W in the L2): its row and column offsets, and the rows and columns it reads, those past the
        edge reading row/column 0 again (in bounds, never stored: no load masks)."""
        pid = tl.program_id(0)
        grid_m = tl.cdiv(M, BLOCK_M)
        grid_n = tl.cdiv(N, BLOCK_N)
        width = GROUP * grid_n
        first_m = (pid // width) * GROUP
        rows = min(grid_m - first_m, GROUP)
        pid_m = first_m + (pid % width) % rows
        pid_n = (pid % width) // rows
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        am = tl.max_contiguous(tl.multiple_of(offs_m % M, BLOCK_M), BLOCK_M)
        wn = tl.max_contiguous(tl.multiple_of(offs_n % N, BLOCK_N), BLOCK_N)
        return offs_m, offs_n, am, wn

    @triton.jit
    def _wave_linear_kernel(
        x_ptr,  # [M, K] rows of the input
        w_ptr,  # [N, K] the weight, nn.Linear's layout
        b_ptr,  # [N] the bias (read only when HAS_BIAS)
        y_ptr,  # [M, N] the output
        M, N, K,
        sxm, sxk, swn, swk, sym, syn,  # element strides
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_K: tl.constexpr,
        GROUP: tl.constexpr,
        HAS_BIAS: tl.constexpr,
        K_TILES: tl.constexpr,  # cdiv(K, BLOCK_K): a compile-time trip count (a model has a few K)
        EVEN_K: tl.constexpr,  # K % BLOCK_K == 0: no mask in the main loop
        IEEE: tl.constexpr,  # the products in fp32 (not TF32): fp32 inputs, and bf16 in Triton's CPU interpreter
    ):
        offs_m, offs_n, am, wn = grouped_tile(M, N, BLOCK_M, BLOCK_N, GROUP)
        offs_k = tl.arange(0, BLOCK_K)
        x_ptrs = x_ptr + am[:, None].to(tl.int64) * sxm + offs_k[None, :] * sxk
        w_ptrs = w_ptr + wn[None, :].to(tl.int64) * swn + offs_k[:, None] * swk
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for kt in range(0, K_TILES):
            if EVEN_K:
                a = tl.load(x_ptrs)
                b = tl.load(w_ptrs)
            else:
                kmask = offs_k < K - kt * BLOCK_K
                a = tl.load(x_ptrs, mask=kmask[None, :], other=0.0)
                b = tl.load(w_ptrs, mask=kmask[:, None], other=0.0)
            if IEEE:
                acc = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
            else:
                acc = tl.dot(a, b, acc)
            x_ptrs += BLOCK_K * sxk
            w_ptrs += BLOCK_K * swk
        if HAS_BIAS:
            acc += tl.load(b_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
        y_ptrs = y_ptr + offs_m[:, None].to(tl.int64) * sym + offs_n[None, :] * syn
        tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=(offs_m < M)[:, None] & (offs_n < N)[None, :])


def wave_efficiency(m: int, n: int, block_m: int, block_n: int, sms: int) -> float:
    """The share of the SMs' tile slots a GEMM's output does useful work in: its tiles over the waves' slots (one tile
    per SM a wave), times the share of each tile inside the output (edge tiles pad)."""
    tm, tn = math.ceil(m / block_m), math.ceil(n / block_n)
    tiles = tm * tn
    return tiles / (math.ceil(tiles / sms) * sms) * (m * n) / (tm * block_m * tn * block_n)


def choose_tiles(m: int, n: int, sms: int) -> tuple[int, int, int, int, int]:
    """The TILES entry with the best wave_efficiency for an [m, n] output on `sms` SMs (ties: the larger tile, then
    the first listed)."""
    for name, v in (("m", m), ("n", n), ("sms", sms)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name}={v!r} is not allowed; allowed values: an integer >= 1")
    return max(TILES, key=lambda t: (round(wave_efficiency(m, n, t[0], t[1], sms), 6), t[0] * t[1], -TILES.index(t)))


def sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 1


def _check(x, weight, bias):
    check_dtype("x", x)
    if weight.dim() != 2 or x.shape[-1] != weight.shape[1] or weight.dtype != x.dtype:
        raise ValueError(f"weight must be [N, K] with x's K and dtype (x {tuple(x.shape)} {x.dtype}); got "
                         f"{tuple(weight.shape)} {weight.dtype}")
    if bias is not None and (bias.shape != (weight.shape[0],) or bias.dtype != x.dtype):
        raise ValueError(f"bias must be [N] = [{weight.shape[0]}] of x's dtype {x.dtype}; got "
                         f"{tuple(bias.shape)} {bias.dtype}")


def wave_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
                tiles: tuple[int, int, int, int, int] | None = None) -> torch.Tensor:
    """F.linear(x, weight, bias) by _wave_linear_kernel: x [..., K], weight [N, K], bias [N] or None, one dtype (fp32,
    bf16, fp16); the output [..., N] contiguous, accumulated in fp32 and rounded once. `tiles`: a TILES entry (default:
    choose_tiles for the call's rows on this device)."""
    _check(x, weight, bias)
    if tiles is not None and tiles not in TILES:
        raise ValueError(f"tiles={tiles!r} is not allowed; allowed values: one of {list(TILES)}")
    x2 = x.reshape(-1, x.shape[-1])
    m, k = x2.shape
    n = weight.shape[0]
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0 or n == 0:
        return y.reshape(*x.shape[:-1], n)
    if k == 0:
        return (y.zero_() if bias is None else y.copy_(bias.expand(m, n))).reshape(*x.shape[:-1], n)
    bm, bn, bk, warps, stages = tiles or choose_tiles(m, n, sm_count(x.device))
    if interpreting():  # Triton's CPU interpreter runs every tile in numpy: small tiles keep the tests quick
        bm, bn, bk = 32, 32, 16
    grid = (triton.cdiv(m, bm) * triton.cdiv(n, bn),)
    _wave_linear_kernel[grid](
        x2, weight, bias if bias is not None else weight, y, m, n, k, *x2.stride(), *weight.stride(), *y.stride(),
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP=GROUP_M, HAS_BIAS=bias is not None, K_TILES=triton.cdiv(k, bk),
        EVEN_K=k % bk == 0,
        # Triton's CPU interpreter gets bf16 tl.dot wrong (triton 3.x): there bf16 is multiplied in fp32
        IEEE=x.dtype == torch.float32 or interpreting(), num_warps=warps, num_stages=stages)
    return y.reshape(*x.shape[:-1], n)


def wave_linear_ref(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear in fp32, rounded to x's dtype once."""
    return F.linear(x.float(), weight.float(), None if bias is None else bias.float()).to(x.dtype)


__all__ = ["TILES", "choose_tiles", "sm_count", "wave_efficiency", "wave_linear", "wave_linear_ref"]
