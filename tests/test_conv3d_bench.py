"""tools/conv3d_bench.py's fp8 quality check: e4m3 rounding of a tensor (per tensor or per output channel) and the
streaming decoder's PSNR with its convolutions in fp8, on the tiny preset on a CPU; tools/cross_gpu_frames.py's
and compare_compile.py's refusal of stacks that differ in cuDNN's algorithm search."""

from __future__ import annotations

import pytest
import torch
from conftest import load_tool

from wmbook.presets import PRESETS


@pytest.fixture(scope="module")
def bench():
    return load_tool("conv3d_bench")


def test_fake_fp8_rounds_like_e4m3(bench):
    """3 mantissa bits: each value within 2^-4 of itself (relative) where it is a normal e4m3 number after scaling
    (at least 2^-6 of the scale's unit, i.e. amax / 448 * 2^-6), per tensor and per output channel."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(8, 4, 3, 3, 3, generator=g)
    x[0] *= 1e-3
    for per_channel in (False, True):
        q = bench._fake_fp8(x, per_channel)
        assert q.shape == x.shape and q.dtype == torch.float32
        assert not torch.equal(q, x)
    for per_channel, amax in ((True, x.abs().amax(dim=(1, 2, 3, 4), keepdim=True)), (False, x.abs().amax())):
        q = bench._fake_fp8(x, per_channel)
        normal = x.abs() >= amax / 448 * 2.0**-6
        assert float(((q - x).abs() / x.abs())[normal].max()) <= 2.0**-4


def test_decoder_fp8_psnr_rows(bench):
    rows = bench.decoder_fp8_psnr(PRESETS["tiny"], 1, torch.device("cpu"))
    assert [r["decoder"] for r in rows] == ["bf16", "fp8 convolutions, the rest fp32",
                                            "fp8 convolutions, the rest bf16"]
    bf16, fp8 = rows[0], rows[1]
    assert bf16["passes 40 dB"] and bf16["PSNR dB vs fp32"] > fp8["PSNR dB vs fp32"]
    assert 0 < fp8["rel L2"] < 1


@pytest.mark.parametrize("tool, argv", [("cross_gpu_frames", ["--stacks", "tf32,bf16;tf32,bf16,cudnn-benchmark"]),
                                        ("compare_compile", ["wma", "tf32,bf16", "tf32,bf16,cudnn-benchmark"])])
def test_tools_refuse_stacks_that_differ_in_cudnn_search(tool, argv, capsys):
    """cuDNN keeps its first algorithm per convolution shape for the whole process: stacks with and without its search
    in one run would time nothing, so the tools that measure several stacks in one process say so before they build
    anything (on any host)."""
    from wmbook import variants, workloads

    with pytest.raises(SystemExit) as e:
        load_tool(tool).main(argv)
    assert e.value.code == 2
    assert "cudnn-benchmark is in some stacks and not in others" in capsys.readouterr().err
    wma = workloads.get("wma")
    assert variants.mixed_cudnn_search([["bf16"], ["bf16", "cudnn-benchmark"]])
    assert not variants.mixed_cudnn_search([variants.resolve(["bf16", "cudnn-benchmark"], wma), ["cudnn-benchmark"]])
    assert not variants.mixed_cudnn_search([["bf16"], ["tf32"]]) and not variants.mixed_cudnn_search([])
