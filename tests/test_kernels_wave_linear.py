"""The wave linear (a GEMM whose tiles fill the SMs in whole waves) against F.linear in fp32, on a GPU or in the Triton
interpreter on a CPU; and its tile choice."""

from __future__ import annotations

import pytest

triton = pytest.importorskip("triton")  # on a CPU, TRITON_INTERPRET=1 (conftest): kernels run in the interpreter

import torch  # noqa: E402

from wmbook.kernels import wave_linear as wl  # noqa: E402

DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")
# relative L2 against fp32: fp32 accumulates in fp32 (sums of K products, a few units of 2^-24 each); bf16 and fp16
# round the output once (unit roundoff 2^-9 and 2^-12, about 0.6 of it on average) after the same fp32 sums
BUDGET = {torch.float32: 1e-5, torch.bfloat16: 4e-3, torch.float16: 5e-4}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape,n,bias", [
    ((37, 48), 40, True),  # edge tiles in rows and columns, K a whole number of K-tiles
    ((2, 19, 45), 33, False),  # a batch of rows, K with a partial last K-tile, no bias
    ((1, 64), 16, True),  # one row
])
def test_wave_linear_matches_linear(dtype, shape, n, bias):
    g = torch.Generator().manual_seed(sum(shape) + n)
    x = torch.randn(*shape, generator=g).to(DEV, dtype)
    w = (torch.randn(n, shape[-1], generator=g) / shape[-1] ** 0.5).to(DEV, dtype)
    b = torch.randn(n, generator=g).to(DEV, dtype) if bias else None
    out = wl.wave_linear(x, w, b)
    assert out.shape == (*shape[:-1], n) and out.dtype == dtype and out.is_contiguous()
    want = torch.nn.functional.linear(x.double(), w.double(), None if b is None else b.double())
    err = ((out.double() - want).norm() / want.norm()).item()
    assert err < BUDGET[dtype], err


def test_wave_linear_reads_strided_rows_and_a_transposed_weight():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(40, 2, 24, generator=g)[:, 0]  # rows 48 elements apart
    w = torch.randn(24, 20, generator=g).t()  # [N, K] with K strided
    torch.testing.assert_close(wl.wave_linear(x.to(DEV), w.to(DEV)), wl.wave_linear_ref(x, w).to(DEV),
                               rtol=1e-5, atol=1e-5)


def test_tiles_fill_the_waves_of_the_dit_projection():
    """mg2-universal's 1536-wide projection (2640 rows) on the H200's 132 SMs: one wave of 128 x 256 tiles, where
    128 x 240 tiles (cuBLAS's pick) take two waves for 147 tiles."""
    t = wl.choose_tiles(2640, 1536, 132)
    assert t[:2] in ((128, 256), (256, 128))
    assert wl.wave_efficiency(2640, 1536, *t[:2], 132) > 0.9 > 0.55 > wl.wave_efficiency(2640, 1536, 128, 240, 132)


@pytest.mark.parametrize("kwargs,match", [
    (dict(m=0, n=8, sms=132), "m=0"), (dict(m=8, n=True, sms=132), "n=True"), (dict(m=8, n=8, sms=1.5), "sms=1.5")])
def test_choose_tiles_names_a_bad_argument(kwargs, match):
    with pytest.raises(ValueError, match=match):
        wl.choose_tiles(**kwargs)


def test_wave_linear_refuses_mismatched_inputs_and_unknown_tiles():
    x, w = torch.randn(4, 8, device=DEV), torch.randn(6, 8, device=DEV)
    with pytest.raises(ValueError, match="weight must be"):
        wl.wave_linear(x, w.t())
    with pytest.raises(ValueError, match="bias must be"):
        wl.wave_linear(x, w, torch.randn(5, device=DEV))
    with pytest.raises(ValueError, match="tiles="):
        wl.wave_linear(x, w, tiles=(96, 96, 64, 4, 3))

