"""tools/attn_bench.py: the attention calls it times at a preset's real shapes, and one call's rows (SDPA and our
Triton kernel, gated against fp32) on a CPU under Triton's interpreter."""

from __future__ import annotations

import pytest
import torch
from conftest import load_tool

from wmbook.presets import PRESETS


@pytest.fixture(scope="module")
def bench():
    return load_tool("attn_bench")


def test_calls_follow_the_preset(bench):
    """mg2-universal: 880 tokens a latent frame, 3 frames a block, a 6-frame window, 257 image tokens (i2v)."""
    assert bench.calls(PRESETS["mg2-universal"]) == [("self, 3 frames cached", 2640, 2640),
                                                    ("self, 6 frames cached", 2640, 5280),
                                                    ("cross, context", 2640, 257)]


def test_one_call_rows_are_gated(bench, monkeypatch):
    monkeypatch.setattr(bench, "TILES", bench.TILES[:1])
    rows = bench._bench_call("x", 20, 40, 2, 32, torch.Generator().manual_seed(0), 2, torch.device("cpu"))
    by = {r["kernel"]: r for r in rows}
    assert set(by) == {name for name, _ in bench.SDPA} | {"triton 128x64 w8 s3"}
    for name in ("sdpa (its choice)", "triton 128x64 w8 s3"):  # what runs on a CPU
        assert by[name]["gate"] == "pass" and by[name]["rel_l2_vs_fp32"] < bench.BF16_BUDGET, by[name]
        assert by[name]["median_ms"] > 0
    assert by["sdpa cudnn"].get("error")  # a backend this CPU lacks is a row with its reason, not a time


def test_refuses_bad_repeats_before_anything_else(bench, capsys):
    with pytest.raises(SystemExit) as e:
        bench.main(["--repeats", "0"])
    assert e.value.code == 2 and "--repeats=0 is not allowed" in capsys.readouterr().err


def test_fp8_quantization_is_per_tensor_and_within_e4m3_rounding(bench):
    """q, k and v for cuDNN's fp8 attention: the largest magnitude maps to 448, and dequantized (times the descale)
    every element is within e4m3's rounding of the input: 2^-4 of its magnitude above the normal range, the
    subnormal step (2^-9 of the scale) below it."""
    x = torch.randn(1, 40, 2, 16, generator=torch.Generator().manual_seed(3)) * 5
    x8, ds = bench._to_fp8(x)
    assert x8.dtype == torch.float8_e4m3fn and ds.shape == (1, 1, 1, 1)
    assert float(x8.float().abs().max()) == bench.E4M3_MAX
    back = x8.float() * ds
    step = 2.0**-9 * float(ds)  # e4m3's subnormal spacing, in x's units
    assert bool(((back - x).abs() <= x.abs() * 2.0**-4 + step).all())
