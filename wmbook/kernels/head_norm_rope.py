"""RMSNorm over each head (no weight), then the frame-index rotary embedding on the first channel pairs, in one pass:
the queries and keys of Matrix-Game-2's action modules.

Unfused under torch.compile, inductor folds the query's norm and rotation into the reduction that scores it against
each cached key, so a query row is normalized and rotated again for every key (3 query x 6 key frames per location
and head: on the H200 at mg2-universal those score kernels took 38-41 us a call, the attention alone 15 us on an
already normalized query). Here the rows are normalized and rotated once and written out, and the attention reads
them.

Layout: x [N, F, H, D] with any strides for N, F and H and D contiguous (the query is a view of the q/k/v
projection); cos, sin [F, R] in fp32 (R <= D/2 pairs rotated; the rest pass through), the tables of
models.action.time_rope_tables; out [N, F, H, D] contiguous in x's dtype, all math in fp32.
"""

from __future__ import annotations

import torch

from . import check_dtype, define_op, launch, next_pow2, runs_triton

try:
    import triton
    import triton.language as tl
except ImportError:  # the custom op falls back to the reference
    triton = None


if triton is not None:

    @triton.jit
    def _head_norm_rope_kernel(
        x_ptr,  # [N, F, H, D], D contiguous
        cos_ptr, sin_ptr,  # [F, R] fp32, contiguous
        out_ptr,  # [N, F, H, D] contiguous
        ROWS_TOTAL, F, H, R, D, eps,
        sxn, sxf, sxh,  # element strides of N, F, H
        ROWS: tl.constexpr,  # rows (one head of one frame of one sequence) per program
        BLOCK_D: tl.constexpr,  # >= D
    ):
        rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
        h = rows % H
        f = (rows // H) % F
        n = rows // (H * F)
        c = tl.arange(0, BLOCK_D)
        m = (rows < ROWS_TOTAL)[:, None] & (c < D)[None, :]
        # each row's D channels read and written as one contiguous run; the pairs split and joined in registers
        x = tl.load(x_ptr + (n * sxn + f * sxf + h * sxh)[:, None] + c[None, :], mask=m, other=0.0).to(tl.float32)
        x = x * (1.0 / tl.sqrt(tl.sum(x * x, axis=1) / D + eps))[:, None]
        xe, xo = tl.split(tl.reshape(x, (ROWS, BLOCK_D // 2, 2)))  # channels 2p and 2p + 1
        p = tl.arange(0, BLOCK_D // 2)
        mr = (rows < ROWS_TOTAL)[:, None] & (p < R)[None, :]  # pairs past R are not rotated: cos 1, sin 0
        cs = tl.load(cos_ptr + f[:, None] * R + p[None, :], mask=mr, other=1.0)
        sn = tl.load(sin_ptr + f[:, None] * R + p[None, :], mask=mr, other=0.0)
        out = tl.reshape(tl.join(xe * cs - xo * sn, xe * sn + xo * cs), (ROWS, BLOCK_D))
        tl.store(out_ptr + rows[:, None] * D + c[None, :], out.to(out_ptr.dtype.element_ty), mask=m)


def _check(x, cos, sin):
    check_dtype("x", x)
    if x.dim() != 4 or x.shape[-1] % 2:
        raise ValueError(f"x must be [N, F, H, D] with D even, got {tuple(x.shape)}")
    f, d = x.shape[1], x.shape[3]
    for name, t in (("cos", cos), ("sin", sin)):
        if t.dtype != torch.float32:
            raise ValueError(f"{name} has dtype {t.dtype}; allowed: ['torch.float32']")
        if t.dim() != 2 or t.shape[0] != f or t.shape[1] > d // 2 or t.shape != cos.shape:
            raise ValueError(f"{name} must be [F, R] = [{f}, <= {d // 2}] (one shape for cos and sin), got "
                             f"{tuple(t.shape)}")


def head_norm_rope_ref(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """x [N, F, H, D], cos/sin [F, R] -> the first R channel pairs of x * rsqrt(mean(x^2 over D) + eps) rotated by
    frame, in fp32, cast to x's dtype (models.action's HeadRMSNorm then apply_time_rope, without their bf16 roundings
    in between)."""
    _check(x, cos, sin)
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps)
    r = cos.shape[1]
    rot = xf[..., :2 * r].unflatten(-1, (r, 2))
    x0, x1 = rot[..., 0], rot[..., 1]
    cs, sn = cos[None, :, None, :], sin[None, :, None, :]
    rot = torch.stack([x0 * cs - x1 * sn, x0 * sn + x1 * cs], dim=-1).flatten(-2)
    return torch.cat([rot, xf[..., 2 * r:]], dim=-1).to(x.dtype)


def head_norm_rope_bytes(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> int:
    """x read and the output written once, the tables read once."""
    return 2 * x.numel() * x.element_size() + 2 * cos.numel() * 4


def head_norm_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, eps: float = 1e-6,
                   rows: int = 16) -> torch.Tensor:
    """The Triton launcher: `rows` rows (one head of one frame) per program."""
    _check(x, cos, sin)
    if x.stride(3) != 1:
        raise ValueError(f"x's head dim must be contiguous (stride 1), got strides {x.stride()}")
    if isinstance(rows, bool) or not isinstance(rows, int) or rows < 1 or rows & (rows - 1) or rows > 64:
        raise ValueError(f"rows={rows!r} is not allowed; allowed values: 1, 2, 4, 8, 16, 32, 64")
    n, f, h, d = x.shape
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    total = n * f * h
    if total == 0:
        return out
    cs, sn = cos.contiguous(), sin.contiguous()
    launch(_head_norm_rope_kernel)[(triton.cdiv(total, rows),)](
        x, cs, sn, out, total, f, h, cos.shape[1], d, eps, *x.stride()[:3], ROWS=rows,
        BLOCK_D=next_pow2(max(d, 2)), num_warps=4)
    return out


@define_op("wmbook::head_norm_rope")
def head_norm_rope_op(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, eps: float) -> torch.Tensor:
    """The op torch.compile sees (define_op): the Triton kernel where it runs, else the reference."""
    if runs_triton(x.device) and triton is not None and x.stride(3) == 1:
        return head_norm_rope(x, cos, sin, eps)
    return head_norm_rope_ref(x, cos, sin, eps)


@head_norm_rope_op.register_fake
def _(x, cos, sin, eps):
    return x.new_empty(x.shape)


__all__ = ["head_norm_rope", "head_norm_rope_bytes", "head_norm_rope_op", "head_norm_rope_ref"]
