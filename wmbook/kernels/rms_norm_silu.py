"""The Wan VAE's channel RMS norm (diffusers' WanRMS_norm) then SiLU, in one pass.

Unfused (the reference model, WanRMS_norm then nn.SiLU): an fp32 copy of x, F.normalize over the channels, a cast
back, the multiplies by sqrt(C) and gamma, the add of the bias and the SiLU, each a pass over the [B, C, (T,) H, W]
activation. Fused: x read once, the result written once, the norm of each position's C values in fp32.

Both memory formats: channels-first (contiguous: a position's C values are H*W*T apart) and channels-last
(torch.channels_last for 4-D, torch.channels_last_3d for 5-D: a position's C values contiguous, the fast case); the
result keeps the input's. One program normalizes a tile of positions x all C channels (C <= 16384).
"""

from __future__ import annotations

import torch

from . import check_dtype, define_op, is_channels_last, launch, next_pow2, runs_triton

try:
    import triton
    import triton.language as tl
except ImportError:  # the custom op falls back to the reference
    triton = None


if triton is not None:

    @triton.jit
    def _rms_norm_silu_kernel(
        x_ptr,  # [B, C, *S], dense in its memory format
        gamma_ptr,  # [C]
        bias_ptr,  # [C] (HAS_BIAS), else unused
        out_ptr,  # like x (same strides), x's dtype
        C,  # channels
        S,  # spatial positions (the product of the dims after C)
        scale,  # sqrt(C)
        eps,  # F.normalize's floor on the norm
        HAS_BIAS: tl.constexpr,
        CHANNELS_LAST: tl.constexpr,
        BLOCK_S: tl.constexpr,
        BLOCK_C: tl.constexpr,
    ):
        b = tl.program_id(1).to(tl.int64)
        s = tl.program_id(0) * BLOCK_S + tl.arange(0, BLOCK_S)
        c = tl.arange(0, BLOCK_C)
        m = (s < S)[:, None] & (c < C)[None, :]
        if CHANNELS_LAST:  # [BLOCK_S, BLOCK_C] contiguous along c
            off = b * C * S + s[:, None] * C + c[None, :]
        else:  # contiguous along s
            off = b * C * S + c[None, :] * S + s[:, None]
        x = tl.load(x_ptr + off, mask=m, other=0.0).to(tl.float32)
        inv = scale / tl.maximum(tl.sqrt(tl.sum(x * x, axis=1)), eps)  # [BLOCK_S]
        g = tl.load(gamma_ptr + c, mask=c < C, other=0.0).to(tl.float32)
        y = x * inv[:, None] * g[None, :]
        if HAS_BIAS:
            y += tl.load(bias_ptr + c, mask=c < C, other=0.0).to(tl.float32)[None, :]
        y = y * tl.sigmoid(y)
        tl.store(out_ptr + off, y.to(out_ptr.dtype.element_ty), mask=m)


def _bias_tensor(bias: torch.Tensor | float | None) -> torch.Tensor | None:
    """WanRMS_norm's bias: a tensor, or 0.0 (its value without bias) / None for none."""
    if bias is None or isinstance(bias, torch.Tensor):
        return bias
    if isinstance(bias, (int, float)) and bias == 0:
        return None
    raise ValueError(f"bias must be a [C] tensor, 0 or None, got {bias!r}")


def _check(x, gamma, bias):
    if x.dim() < 3:
        raise ValueError(f"x must be [B, C, *spatial] ([B, C, T, H, W] or [B, C, H, W]), got {tuple(x.shape)}")
    c = x.shape[1]
    for name, t in (("x", x), ("gamma", gamma)) + ((("bias", bias),) if bias is not None else ()):
        check_dtype(name, t)
        if name != "x" and (t.dim() < 1 or t.shape[0] != c or t.numel() != c):
            raise ValueError(f"{name} must be [C] or [C, 1, ...] with C={c}, got {tuple(t.shape)}")


def rms_norm_silu_ref(x: torch.Tensor, gamma: torch.Tensor, bias: torch.Tensor | float | None = None,
                      eps: float = 1e-12) -> torch.Tensor:
    """x [B, C, *S], gamma/bias [C, 1, ...] -> SiLU((F.normalize(x, dim=1) * sqrt(C) * gamma + bias) in fp32, cast to
    x's dtype)."""
    bias = _bias_tensor(bias)
    _check(x, gamma, bias)
    c = x.shape[1]
    bcast = (c, *([1] * (x.dim() - 2)))
    y = torch.nn.functional.normalize(x.float(), dim=1, eps=eps) * c**0.5 * gamma.float().reshape(bcast)
    if bias is not None:
        y = y + bias.float().reshape(bcast)
    return torch.nn.functional.silu(y.to(x.dtype))


def rms_norm_silu_bytes(x: torch.Tensor, gamma: torch.Tensor, bias: torch.Tensor | float | None = None) -> int:
    """x read and the output written once, gamma and bias read once."""
    bias = _bias_tensor(bias)
    params = sum(t.numel() * t.element_size() for t in (gamma,) + ((bias,) if bias is not None else ()))
    return 2 * x.numel() * x.element_size() + params


def rms_norm_silu(x: torch.Tensor, gamma: torch.Tensor, bias: torch.Tensor | float | None = None,
                  eps: float = 1e-12) -> torch.Tensor:
    """The Triton launcher (one program per tile of positions of one batch element; all C channels in one block)."""
    bias = _bias_tensor(bias)
    _check(x, gamma, bias)
    b, c = x.shape[:2]
    if c > 16384:
        raise ValueError(f"rms_norm_silu keeps a position's channels in one block: C={c} > 16384")
    cl = is_channels_last(x)
    if not cl:
        x = x.contiguous()
    s = x.numel() // max(1, b * c)
    out = torch.empty_like(x)  # x's strides: channels-last stays channels-last
    if x.numel() == 0:
        return out
    block_c = next_pow2(c)
    # channels-first: at least 16 positions per channel row, so each load of a row is a full sector or more
    block_s = min(next_pow2(s), max(1 if cl else 16, 8192 // block_c))
    tile = block_s * block_c
    g = gamma.reshape(c).contiguous()
    bb = bias.reshape(c).contiguous() if bias is not None else g  # g: a pointer never read
    launch(_rms_norm_silu_kernel)[(triton.cdiv(s, block_s), b)](
        x, g, bb, out, c, s, c**0.5, eps, HAS_BIAS=bias is not None, CHANNELS_LAST=cl, BLOCK_S=block_s, BLOCK_C=block_c,
        num_warps=4 if tile <= 4096 else 8 if tile <= 16384 else 16)
    return out


@define_op("wmbook::rms_norm_silu")
def rms_norm_silu_op(x: torch.Tensor, gamma: torch.Tensor, bias: torch.Tensor | None, eps: float) -> torch.Tensor:
    """The op torch.compile sees (define_op): the Triton kernel where it runs, else the reference (in x's layout)."""
    if runs_triton(x.device) and triton is not None:
        return rms_norm_silu(x, gamma, bias, eps)
    fmt = (torch.channels_last if x.dim() == 4 else torch.channels_last_3d) if is_channels_last(x) else None
    out = rms_norm_silu_ref(x, gamma, bias, eps)
    return out.contiguous(memory_format=fmt) if fmt is not None else out.contiguous()


@rms_norm_silu_op.register_fake
def _(x, gamma, bias, eps):
    if is_channels_last(x):
        return torch.empty_like(x)  # the launcher's and the fallback's layout
    return x.new_empty(x.shape)  # contiguous


__all__ = ["rms_norm_silu", "rms_norm_silu_bytes", "rms_norm_silu_op", "rms_norm_silu_ref"]
