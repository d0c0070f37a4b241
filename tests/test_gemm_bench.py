"""tools/gemm_bench.py: the GEMMs it times at a preset's real shapes, and one GEMM's rows (cuBLAS and the wave linear,
gated against fp32) on a CPU under Triton's interpreter."""

from __future__ import annotations

import pytest
import torch
from conftest import load_tool

from wmbook.presets import PRESETS

pytest.importorskip("triton")


@pytest.fixture(scope="module")
def bench():
    return load_tool("gemm_bench")


def test_gemms_follow_the_preset(bench):
    """mg2-universal: 880 tokens a latent frame, 3 frames a block, width 1536, feed-forward 8960."""
    assert bench.gemms(PRESETS["mg2-universal"]) == [("projection (q, k, v, o)", 2640, 1536, 1536),
                                                    ("fused q, k, v", 2640, 1536, 4608),
                                                    ("feed-forward up", 2640, 1536, 8960),
                                                    ("feed-forward down", 2640, 8960, 1536)]


def test_one_gemm_rows_are_gated(bench, monkeypatch):
    monkeypatch.setattr(bench.wl, "TILES", bench.wl.TILES[:2])
    rows = bench.bench_gemm("x", 40, 32, 24, torch.Generator().manual_seed(0), 2, torch.device("cpu"))
    assert [r["kernel"] for r in rows][0] == "cuBLAS (F.linear)" and len(rows) == 3
    assert sum("(chosen)" in r["kernel"] for r in rows) == 1
    for r in rows:
        assert r["gate"] == "pass" and r["rel_l2_vs_fp32"] < bench.BF16_BUDGET and r["median_ms"] > 0, r
    assert all(0 < r["wave_efficiency"] <= 1 for r in rows[1:])


def test_refuses_bad_repeats_before_anything_else(bench, capsys):
    with pytest.raises(SystemExit) as e:
        bench.main(["--repeats", "0"])
    assert e.value.code == 2 and "--repeats=0 is not allowed" in capsys.readouterr().err
