"""Gated residual add of the causal DiT, then the next adaLN modulate of the new residual stream, in one pass.

Unfused (the reference model): y * gate per frame, the add into x, then (the next block's norm1, or norm2) an fp32
copy of the sum, layer_norm, a cast back, the multiply by (1 + scale) and the add of shift, each a pass over the
[B, L, C] activation. Fused: x and y read once, the new residual stream and the modulated activation written once,
statistics in fp32 over the residual as stored (in x's dtype, as the model normalizes it).
"""

from __future__ import annotations

import torch

from . import (
    check_dtype,
    check_rows,
    define_op,
    launch,
    modulation_frames,
    modulation_strides,
    next_pow2,
    row_warps,
    runs_triton,
)

try:
    import triton
    import triton.language as tl
except ImportError:  # the custom op falls back to the reference
    triton = None


if triton is not None:
    from .adaln import _norm_modulate_rows

    @triton.jit
    def _gated_residual_adaln_kernel(
        x_ptr,  # [rows, C], rows = B * L, contiguous: the residual stream
        y_ptr,  # [rows, C], contiguous: the branch output (attention or FFN) to gate in
        gate_ptr,  # [B, F, C] at strides (gate_sb, gate_sf, 1): the gate of each (batch, frame)
        shift_ptr,  # [B, F, C] at strides (mod_sb, mod_sf, 1): the next adaLN's shift
        scale_ptr,  # [B, F, C], shift's strides: the next adaLN's scale
        x_out_ptr,  # [rows, C], x's dtype: x + gate * y
        h_out_ptr,  # [rows, C], x's dtype: LayerNorm(x + gate * y) * (1 + scale) + shift
        C,  # channels
        rows_per_frame,  # S: tokens of one latent frame
        F,  # frames
        gate_sb,  # the gate's batch stride (elements)
        gate_sf,  # its frame stride
        mod_sb,  # shift's and scale's batch stride (0 for a modulation shared by every frame: norm3 as an adaLN)
        mod_sf,  # their frame stride
        n_rows,  # B * L
        eps,
        BLOCK_C: tl.constexpr,
        ROWS: tl.constexpr,  # token rows per program, each normalized on its own
    ):
        rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
        rm = rows < n_rows
        frame = rows // rows_per_frame  # b * F + f: rows of one batch element are its frames in order
        bi, fi = (frame // F).to(tl.int64), frame % F
        gm = bi * gate_sb + fi * gate_sf
        mod = bi * mod_sb + fi * mod_sf
        cols = tl.arange(0, BLOCK_C)
        m = rm[:, None] & (cols < C)[None, :]
        off = rows.to(tl.int64)[:, None] * C + cols[None, :]
        x = tl.load(x_ptr + off, mask=m, other=0.0).to(tl.float32)
        y = tl.load(y_ptr + off, mask=m, other=0.0).to(tl.float32)
        g = tl.load(gate_ptr + gm[:, None] + cols[None, :], mask=m, other=0.0).to(tl.float32)
        xn = (x + g * y).to(x_out_ptr.dtype.element_ty)
        tl.store(x_out_ptr + off, xn, mask=m)
        # statistics of the residual as stored, like the model's norm of x
        h = _norm_modulate_rows(xn.to(tl.float32), m, mod[:, None] + cols[None, :], shift_ptr, scale_ptr, C, eps)
        tl.store(h_out_ptr + off, h.to(h_out_ptr.dtype.element_ty), mask=m)


def _check(x, y, gate, shift, scale):
    """The number of frames F of the modulation, after checking every shape and dtype."""
    f = modulation_frames(x, gate=gate, shift=shift, scale=scale)
    check_dtype("y", y)
    if y.shape != x.shape:
        raise ValueError(f"y must be [B, L, C] like x {tuple(x.shape)}, got {tuple(y.shape)}")
    return f


def gated_residual_adaln_ref(x: torch.Tensor, y: torch.Tensor, gate: torch.Tensor, shift: torch.Tensor,
                             scale: torch.Tensor, eps: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor]:
    """x, y [B, L, C], gate/shift/scale [B, F, 1, C] (or [B, F, C]) -> (x + gate * y, LayerNorm(that) * (1 + scale)
    + shift) per frame, in fp32, each cast to x's dtype."""
    f = _check(x, y, gate, shift, scale)
    b, n, c = x.shape

    def per_frame(t):  # [B, F, 1, C] fp32
        return t.float().reshape(b, f, 1, c)

    x_new = (x.float().reshape(b, f, n // f, c) + per_frame(gate) * y.float().reshape(b, f, n // f, c))
    x_new = x_new.reshape(b, n, c).to(x.dtype)  # the residual stream as stored; the norm reads it back
    h = torch.nn.functional.layer_norm(x_new.float(), (c,), eps=eps).view(b, f, n // f, c)
    h = h * (1 + per_frame(scale)) + per_frame(shift)
    return x_new, h.view(b, n, c).to(x.dtype)


def gated_residual_adaln_bytes(x: torch.Tensor, y: torch.Tensor, gate: torch.Tensor, shift: torch.Tensor,
                               scale: torch.Tensor) -> int:
    """x and y read once, the new residual and the modulated activation written once, the modulation read once."""
    act = 3 * x.numel() * x.element_size() + y.numel() * y.element_size()
    return act + sum(t.numel() * t.element_size() for t in (gate, shift, scale))


def gated_residual_adaln(x: torch.Tensor, y: torch.Tensor, gate: torch.Tensor, shift: torch.Tensor,
                         scale: torch.Tensor, eps: float = 1e-6, rows: int = 1,
                         num_warps: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The Triton launcher: `rows` token rows per program (a power of two; 1 by default: one program per row), each
    row in one block (C <= 16384); tools/row_sweep.py sweeps rows and num_warps on a GPU (on the H100 it kept the
    default: data/reports/h100/row_sweep-mg2-665a961.csv)."""
    f = _check(x, y, gate, shift, scale)
    b, n, c = x.shape
    if c > 16384:
        raise ValueError(f"gated_residual_adaln keeps a row in one block: C={c} > 16384")
    block = next_pow2(c)
    check_rows(rows, block)
    x2 = x.contiguous().view(b * n, c)
    y2 = y.contiguous().view(b * n, c)
    x_out = torch.empty_like(x2)
    h_out = torch.empty_like(x2)
    # read in place: chunks of the block's modulation sum, or norm3's adaLN expanded over batch and frames
    (g,), gsb, gsf = modulation_strides(b, f, c, gate)
    (sh, sc), sb, sf = modulation_strides(b, f, c, shift, scale)
    launch(_gated_residual_adaln_kernel)[(-(-(b * n) // rows),)](
        x2, y2, g, sh, sc, x_out, h_out, c, n // f, f, gsb, gsf, sb, sf, b * n, eps, BLOCK_C=block, ROWS=rows,
        num_warps=num_warps or row_warps(block, rows))
    return x_out.view(b, n, c), h_out.view(b, n, c)


@define_op("wmbook::gated_residual_adaln")
def gated_residual_adaln_op(x: torch.Tensor, y: torch.Tensor, gate: torch.Tensor, shift: torch.Tensor,
                            scale: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The op torch.compile sees (define_op): the Triton kernel where it runs, else the reference."""
    if runs_triton(x.device) and triton is not None:
        return gated_residual_adaln(x, y, gate, shift, scale, eps)
    return gated_residual_adaln_ref(x, y, gate, shift, scale, eps)


@gated_residual_adaln_op.register_fake
def _(x, y, gate, shift, scale, eps):
    return x.new_empty(x.shape), x.new_empty(x.shape)  # contiguous, like the launcher's and the reference's


__all__ = ["gated_residual_adaln", "gated_residual_adaln_bytes", "gated_residual_adaln_op",
           "gated_residual_adaln_ref"]
