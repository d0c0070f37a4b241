"""Gated residual + adaLN kernel against its reference (on a GPU, or the Triton interpreter on a CPU), and its
custom op."""

from __future__ import annotations

import pytest

triton = pytest.importorskip("triton")  # on a CPU, TRITON_INTERPRET=1 (conftest): kernels run in the interpreter

import torch  # noqa: E402

from wmbook.kernels import gated_residual_adaln as gra  # noqa: E402
from wmbook.models.causal_wan import WanLayerNorm  # noqa: E402

DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # a GPU where there is one, else the interpreter
TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.bfloat16: dict(rtol=2e-2, atol=2e-2)}




def _inputs(b, f, s, c, dtype, mod_dtype=None):
    g = torch.Generator().manual_seed(c + s + f)
    mod_dtype = mod_dtype or dtype
    x = (torch.randn(b, f * s, c, generator=g) * 3 + 1).to(DEV, dtype)
    y = torch.randn(b, f * s, c, generator=g).to(DEV, dtype)
    gate = torch.randn(b, f, 1, c, generator=g).to(DEV, mod_dtype)
    shift = torch.randn(b, f, 1, c, generator=g).to(DEV, mod_dtype)
    scale = (torch.randn(b, f, 1, c, generator=g) * 0.1).to(DEV, mod_dtype)
    return x, y, gate, shift, scale


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("b,f,s,c", [(1, 3, 5, 96), (2, 2, 7, 100), (1, 1, 1, 33), (2, 1, 13, 48), (1, 3, 4, 1536)])
def test_gated_residual_adaln_matches_reference(poisoned, dtype, b, f, s, c):
    x, y, gate, shift, scale = _inputs(b, f, s, c, dtype)
    x_new, h = gra.gated_residual_adaln(x, y, gate, shift, scale)
    assert x_new.dtype == h.dtype == dtype and x_new.shape == h.shape == x.shape
    x_ref, h_ref = gra.gated_residual_adaln_ref(x, y, gate, shift, scale)
    torch.testing.assert_close(x_new, x_ref, **TOL[dtype])
    torch.testing.assert_close(h, h_ref, **TOL[dtype])
    # the reference equals the model's unfused sequence: x + gated(y, gate), then modulate(norm(x), shift, scale)
    x_model = x + (y.unflatten(1, (f, -1)) * gate).flatten(1, 2)
    h_model = (WanLayerNorm(c, 1e-6).to(DEV)(x_model).unflatten(1, (f, -1)) * (1 + scale) + shift).flatten(1, 2)
    torch.testing.assert_close(x_ref, x_model, **TOL[dtype])
    torch.testing.assert_close(h_ref, h_model, **TOL[dtype])


def test_gated_residual_adaln_fp32_modulation_bf16_stream(poisoned):
    """The model's time modulation may stay fp32 while the stream is bf16: outputs in the stream's dtype."""
    x, y, gate, shift, scale = _inputs(1, 2, 3, 40, torch.bfloat16, mod_dtype=torch.float32)
    x_new, h = gra.gated_residual_adaln(x, y, gate.squeeze(2), shift, scale)  # [B, F, C] modulation works too
    x_ref, h_ref = gra.gated_residual_adaln_ref(x, y, gate, shift, scale)
    assert x_new.dtype == h.dtype == torch.bfloat16
    torch.testing.assert_close(x_new, x_ref, **TOL[torch.bfloat16])
    torch.testing.assert_close(h, h_ref, **TOL[torch.bfloat16])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gated_residual_adaln_reads_chunked_modulation_in_place(poisoned, dtype):
    """The DiT block's modulation: six chunks of one [B, F, 6, C] sum (frame stride 6C, batch stride 6FC). The kernel
    reads them where they are (no copy) and gives what it gives on contiguous copies; mixed strides fall back to
    contiguous copies, with the same result."""
    from wmbook.kernels import modulation_strides

    b, f, s, c = 2, 3, 5, 96
    x, y, *_ = _inputs(b, f, s, c, dtype)
    g = torch.Generator().manual_seed(1)
    e = torch.randn(b, f, 6, c, generator=g).to(DEV, dtype)
    chunks = e.chunk(6, dim=2)  # [B, F, 1, C] views
    gate, shift, scale = chunks[2], chunks[3], chunks[4]
    views, sb, sf = modulation_strides(b, f, c, gate, shift, scale)
    assert (sb, sf) == (6 * f * c, 6 * c) and all(v.data_ptr() == t.data_ptr() for v, t in zip(views, chunks[2:5]))
    got = gra.gated_residual_adaln(x, y, gate, shift, scale)
    want = gra.gated_residual_adaln(x, y, gate.contiguous(), shift.contiguous(), scale.contiguous())
    for a_, b_ in zip(got, want):
        torch.testing.assert_close(a_, b_, rtol=0, atol=0)
    for a_, r in zip(got, gra.gated_residual_adaln_ref(x, y, gate, shift, scale)):
        torch.testing.assert_close(a_, r, **TOL[dtype])
    _, sb, sf = modulation_strides(b, f, c, shift.contiguous(), scale)  # mixed strides: copies
    assert (sb, sf) == (f * c, c)
    mixed = gra.gated_residual_adaln(x, y, gate, shift.contiguous(), scale)
    for a_, b_ in zip(mixed, want):
        torch.testing.assert_close(a_, b_, rtol=0, atol=0)
    # norm3 as an adaLN: one [1, 1, 1, C] shift/scale expanded over batch and frames (strides 0), read in place
    n3s, n3c = torch.randn(2, 1, 1, 1, c, generator=g).to(DEV, torch.float32).unbind(0)
    views, sb, sf = modulation_strides(b, f, c, n3s.expand(b, f, 1, c), n3c.expand(b, f, 1, c))
    assert (sb, sf) == (0, 0) and views[0].data_ptr() == n3s.data_ptr()
    got = gra.gated_residual_adaln(x, y, gate, n3s.expand(b, f, 1, c), n3c.expand(b, f, 1, c))
    want = gra.gated_residual_adaln(x, y, gate.contiguous(), n3s.expand(b, f, 1, c).contiguous(),
                                    n3c.expand(b, f, 1, c).contiguous())
    for a_, b_ in zip(got, want):
        torch.testing.assert_close(a_, b_, rtol=0, atol=0)


def test_gated_residual_adaln_custom_op_and_bad_input():
    x, y, gate, shift, scale = _inputs(1, 2, 3, 40, torch.float32)
    torch.library.opcheck(gra.gated_residual_adaln_op, (x, y, gate, shift, scale, 1e-6))
    x_new, h = gra.gated_residual_adaln_op(x, y, gate, shift, scale, 1e-6)
    x_ref, h_ref = gra.gated_residual_adaln_ref(x, y, gate, shift, scale)
    torch.testing.assert_close(x_new, x_ref, **TOL[torch.float32])
    torch.testing.assert_close(h, h_ref, **TOL[torch.float32])
    with pytest.raises(ValueError, match="x must be"):
        gra.gated_residual_adaln(x[0], y, gate, shift, scale)
    with pytest.raises(ValueError, match="y must be"):
        gra.gated_residual_adaln(x, y[:, :4], gate, shift, scale)
    with pytest.raises(ValueError, match="gate must be"):
        gra.gated_residual_adaln(x, y, torch.randn(1, 4, 1, 40, device=DEV), shift, scale)
    with pytest.raises(ValueError, match="shift must be"):
        gra.gated_residual_adaln(x, y, gate, torch.randn(1, 3, 1, 40, device=DEV), scale)
    with pytest.raises(ValueError, match="scale must be"):
        gra.gated_residual_adaln(x, y, gate, shift, torch.randn(1, 2, 1, 41, device=DEV))
    with pytest.raises(ValueError, match="y has dtype"):
        gra.gated_residual_adaln(x, y.long(), gate, shift, scale)
    with pytest.raises(ValueError, match="16384"):
        big = torch.zeros(1, 1, 16385, device=DEV)
        gra.gated_residual_adaln(big, big, big[:, :, None], big[:, :, None], big[:, :, None])
    # x and y in, the new residual and h out, gate, shift and scale once
    assert gra.gated_residual_adaln_bytes(x, y, gate, shift, scale) == 4 * 240 * 4 + 3 * 80 * 4


@pytest.mark.parametrize("rows", [2, 4, 8])
@pytest.mark.parametrize("b,f,s,c", [(2, 3, 5, 100), (1, 1, 1, 33), (2, 1, 13, 48)])
def test_gated_residual_adaln_several_rows_per_program(poisoned, rows, b, f, s, c):
    # rows per program that do not divide the row count, rows of different frames in one program: equal to one row per
    # program (and to the reference)
    x, y, gate, shift, scale = _inputs(b, f, s, c, torch.float32)
    got = gra.gated_residual_adaln(x, y, gate, shift, scale, rows=rows, num_warps=2)
    one = gra.gated_residual_adaln(x, y, gate, shift, scale)
    ref = gra.gated_residual_adaln_ref(x, y, gate, shift, scale)
    for a, o, r in zip(got, one, ref):
        torch.testing.assert_close(a, o, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(a, r, **TOL[torch.float32])
    with pytest.raises(ValueError, match="rows=5 is not allowed"):
        gra.gated_residual_adaln(x, y, gate, shift, scale, rows=5)
