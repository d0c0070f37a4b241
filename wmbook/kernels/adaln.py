"""adaLN modulate of the causal DiT: LayerNorm without affine, then per-frame (1 + scale) * x + shift, in one pass.

Unfused (the reference model): an fp32 copy of x, layer_norm, a cast back, the multiply by (1 + scale) and the add of
shift, each a pass over the [B, L, C] activation. Fused: x read once, the result written once, statistics in fp32.
"""

from __future__ import annotations

import torch

from . import check_rows, define_op, launch, modulation_frames, modulation_strides, next_pow2, row_warps, runs_triton

try:
    import triton
    import triton.language as tl
except ImportError:  # the custom op falls back to the reference
    triton = None


if triton is not None:

    @triton.jit
    def _norm_modulate_rows(x, m, moff, shift_ptr, scale_ptr, C, eps):
        """LayerNorm (no affine, fp32 statistics) of each row of the fp32 block x [ROWS, BLOCK_C] (masked by m), then
        (1 + scale) * . + shift with the modulation at element offsets moff (each row its frame's); shared with
        gated_residual_adaln."""
        mean = tl.sum(x, axis=1) / C
        d = tl.where(m, x - mean[:, None], 0.0)
        rstd = 1.0 / tl.sqrt(tl.sum(d * d, axis=1) / C + eps)
        sc = tl.load(scale_ptr + moff, mask=m, other=0.0).to(tl.float32)
        sh = tl.load(shift_ptr + moff, mask=m, other=0.0).to(tl.float32)
        return d * rstd[:, None] * (1.0 + sc) + sh

    @triton.jit
    def _adaln_modulate_kernel(
        x_ptr,  # [rows, C], rows = B * L, contiguous
        shift_ptr,  # [B, F, C] at strides (mod_sb, mod_sf, 1): the modulation of each (batch, frame)
        scale_ptr,  # [B, F, C], the same strides
        out_ptr,  # [rows, C], x's dtype
        n_rows,  # B * L
        C,  # channels
        rows_per_frame,  # S: tokens of one latent frame
        F,  # frames
        mod_sb,  # the modulation's batch stride (elements)
        mod_sf,  # its frame stride
        eps,
        BLOCK_C: tl.constexpr,
        ROWS: tl.constexpr,  # token rows per program, each normalized on its own
    ):
        rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
        rm = rows < n_rows
        frame = rows // rows_per_frame  # b * F + f: rows of one batch element are its frames in order
        mod = (frame // F).to(tl.int64) * mod_sb + (frame % F) * mod_sf
        cols = tl.arange(0, BLOCK_C)
        m = rm[:, None] & (cols < C)[None, :]
        off = rows.to(tl.int64)[:, None] * C + cols[None, :]
        x = tl.load(x_ptr + off, mask=m, other=0.0).to(tl.float32)
        y = _norm_modulate_rows(x, m, mod[:, None] + cols[None, :], shift_ptr, scale_ptr, C, eps)
        tl.store(out_ptr + off, y.to(out_ptr.dtype.element_ty), mask=m)


def adaln_modulate_ref(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """x [B, L, C], shift/scale [B, F, 1, C] (or [B, F, C]) -> LayerNorm(x) * (1 + scale) + shift per frame, in fp32,
    cast to x's dtype."""
    f = modulation_frames(x, shift=shift, scale=scale)
    b, n, c = x.shape
    h = torch.nn.functional.layer_norm(x.float(), (c,), eps=eps).view(b, f, n // f, c)
    y = h * (1 + scale.float().reshape(b, f, 1, c)) + shift.float().reshape(b, f, 1, c)
    return y.view(b, n, c).to(x.dtype)


def adaln_modulate_bytes(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> int:
    """x read and the output written once, the modulation read once."""
    return 2 * x.numel() * x.element_size() + (shift.numel() + scale.numel()) * shift.element_size()


def adaln_modulate(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor, eps: float = 1e-6, rows: int = 1,
                   num_warps: int | None = None) -> torch.Tensor:
    """The Triton launcher: `rows` token rows per program (a power of two; 1 by default: one program per row), each
    row in one block (C <= 16384); tools/row_sweep.py sweeps rows and num_warps on a GPU (on the H100 it kept the
    default: data/reports/h100/row_sweep-mg2-665a961.csv)."""
    f = modulation_frames(x, shift=shift, scale=scale)
    b, n, c = x.shape
    if c > 16384:
        raise ValueError(f"adaln_modulate keeps a row in one block: C={c} > 16384")
    block = next_pow2(c)
    check_rows(rows, block)
    x2 = x.contiguous().view(b * n, c)
    out = torch.empty_like(x2)
    (sh, sc), sb, sf = modulation_strides(b, f, c, shift, scale)  # read in place (chunks of one tensor)
    launch(_adaln_modulate_kernel)[(-(-(b * n) // rows),)](x2, sh, sc, out, b * n, c, n // f, f, sb, sf, eps,
                                                           BLOCK_C=block, ROWS=rows,
                                                           num_warps=num_warps or row_warps(block, rows))
    return out.view(b, n, c)


@define_op("wmbook::adaln_modulate")
def adaln_modulate_op(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor, eps: float) -> torch.Tensor:
    """The op torch.compile sees (define_op): the Triton kernel where it runs, else the reference."""
    if runs_triton(x.device) and triton is not None:
        return adaln_modulate(x, shift, scale, eps)
    return adaln_modulate_ref(x, shift, scale, eps)


@adaln_modulate_op.register_fake
def _(x, shift, scale, eps):
    # contiguous, like the launcher's and the reference's output (empty_like would keep a strided x's strides: the H100
    # run of notebook 05 met such an x inside the compiled DiT block, and the stride check failed)
    return x.new_empty(x.shape)


__all__ = ["adaln_modulate", "adaln_modulate_bytes", "adaln_modulate_op", "adaln_modulate_ref"]
