"""q/k RMSNorm over the full width, then the 3-D rotary embedding per head, in one pass.

Unfused (the reference model): an fp32 copy of the projection, its mean square, the scaling, a cast back, the weight,
then (apply_rope) another fp32 copy, the pair rotation, a stack and a cast back, each a pass over the [B, L, C]
activation. Fused: the projection read once and the roped [B, L, H, D] output written once, all math in fp32.
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
    def _qk_norm_rope_kernel(
        x_ptr,  # [rows, C], rows = B * L, contiguous: the q or k projection, C = H * D
        w_ptr,  # [C]: the RMSNorm weight
        cos_ptr,  # [L, D/2], contiguous: the rotary cos of each token and channel pair
        sin_ptr,  # [L, D/2]
        out_ptr,  # [rows, C] = [B, L, H, D], x's dtype
        C,  # channels, H * D
        L,  # tokens of one batch element (the rows of cos and sin)
        HALF_D,  # D/2: channel pairs of one head
        eps,
        BLOCK_C: tl.constexpr,
    ):
        row = tl.program_id(0)
        tok = row % L  # the token's position in its batch element: its rotary angles
        cols = tl.arange(0, BLOCK_C)
        m = cols < C
        x = tl.load(x_ptr + row * C + cols, mask=m, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + cols, mask=m, other=0.0).to(tl.float32)
        rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / C + eps)
        xn = x * rstd * w
        x0, x1 = tl.split(tl.reshape(xn, (BLOCK_C // 2, 2)))  # adjacent channel pairs (even, odd)
        pairs = tl.arange(0, BLOCK_C // 2)
        mp = pairs < C // 2
        j = pairs % HALF_D  # the pair's index within its head
        cs = tl.load(cos_ptr + tok * HALF_D + j, mask=mp, other=0.0).to(tl.float32)
        sn = tl.load(sin_ptr + tok * HALF_D + j, mask=mp, other=0.0).to(tl.float32)
        out = tl.reshape(tl.join(x0 * cs - x1 * sn, x0 * sn + x1 * cs), (BLOCK_C,))  # interleaved back
        tl.store(out_ptr + row * C + cols, out.to(out_ptr.dtype.element_ty), mask=m)


def _check(x, weight, cos, sin, num_heads):
    """The head dim D, after checking every shape and dtype."""
    if x.dim() != 3:
        raise ValueError(f"x must be [B, L, C], got {tuple(x.shape)}")
    for name, t in (("x", x), ("weight", weight), ("cos", cos), ("sin", sin)):
        check_dtype(name, t)
    b, n, c = x.shape
    if num_heads < 1 or c % num_heads or (c // num_heads) % 2:
        raise ValueError(f"num_heads must divide C={c} into heads of even head_dim; got num_heads={num_heads}")
    d = c // num_heads
    if tuple(weight.shape) != (c,):
        raise ValueError(f"weight must be [C]=[{c}], got {tuple(weight.shape)}")
    for name, t in (("cos", cos), ("sin", sin)):
        if t.dim() not in (2, 3) or t.shape[0] != n or t.shape[-1] != d // 2 or t.numel() != n * d // 2:
            raise ValueError(f"{name} must be [L, 1, D/2]=[{n}, 1, {d // 2}], got {tuple(t.shape)}")
    return d


def qk_norm_rope_ref(x: torch.Tensor, weight: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, num_heads: int,
                     eps: float = 1e-6) -> torch.Tensor:
    """x [B, L, C], weight [C], cos/sin [L, 1, D/2] -> apply_rope(RMSNorm(x).view(B, L, H, D), cos, sin) [B, L, H, D]
    in fp32, cast to x's dtype."""
    d = _check(x, weight, cos, sin, num_heads)
    b, n, c = x.shape
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps) * weight.float()
    xp = xf.view(b, n, num_heads, d // 2, 2)
    x0, x1 = xp[..., 0], xp[..., 1]
    cs, sn = cos.float().reshape(n, 1, d // 2), sin.float().reshape(n, 1, d // 2)
    return torch.stack([x0 * cs - x1 * sn, x0 * sn + x1 * cs], dim=-1).flatten(-2).to(x.dtype)


def qk_norm_rope_bytes(x: torch.Tensor, weight: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> int:
    """x read and the output written once, the weight and the rotary tables read once."""
    return 2 * x.numel() * x.element_size() + sum(t.numel() * t.element_size() for t in (weight, cos, sin))


def qk_norm_rope(x: torch.Tensor, weight: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, num_heads: int,
                 eps: float = 1e-6) -> torch.Tensor:
    """The Triton launcher (one program per token row; the row fits one block: C <= 16384)."""
    d = _check(x, weight, cos, sin, num_heads)
    b, n, c = x.shape
    if c > 16384:
        raise ValueError(f"qk_norm_rope keeps a row in one block: C={c} > 16384")
    x2 = x.contiguous().view(b * n, c)
    out = torch.empty_like(x2)
    w = weight.contiguous()
    cs = cos.reshape(n, d // 2).contiguous()
    sn = sin.reshape(n, d // 2).contiguous()
    block = next_pow2(max(c, 2))
    launch(_qk_norm_rope_kernel)[(b * n,)](x2, w, cs, sn, out, c, n, d // 2, eps, BLOCK_C=block,
                                           num_warps=4 if block <= 2048 else 8)
    return out.view(b, n, num_heads, d)


@define_op("wmbook::qk_norm_rope")
def qk_norm_rope_op(x: torch.Tensor, weight: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, num_heads: int,
                    eps: float) -> torch.Tensor:
    """The op torch.compile sees (define_op): the Triton kernel where it runs, else the reference."""
    if runs_triton(x.device) and triton is not None:
        return qk_norm_rope(x, weight, cos, sin, num_heads, eps)
    return qk_norm_rope_ref(x, weight, cos, sin, num_heads, eps)


@qk_norm_rope_op.register_fake
def _(x, weight, cos, sin, num_heads, eps):
    b, n, c = x.shape
    return x.new_empty(b, n, num_heads, c // num_heads)


__all__ = ["qk_norm_rope", "qk_norm_rope_bytes", "qk_norm_rope_op", "qk_norm_rope_ref"]
