"""vae-upsample-fold: a nearest 2x upsampling and its 3 x 3 convolution as one stride-2 transposed convolution.

On a CPU: the fold against the pair it replaces (fp32 within rounding, bf16 within bf16's), in both layouts and at
odd sizes; the modules it folds and refuses; the variant on both workloads' tiny decoders and its place before the
compiled step. On a GPU: the compiled, captured steps with the fold against the eager ones.
"""

from __future__ import annotations

import pytest
import torch
from conftest import _mg2_decoder_bench, _stream
from torch import nn
from torch.nn import functional as F

from wmbook import variants, workloads
from wmbook.variants.ladder import apply_stack
from wmbook.variants.upsample_fold import NearestUpConv, fold_upsample_convs

GPU = pytest.mark.skipif(not torch.cuda.is_available(), reason="the compiled, captured steps need a CUDA device")


@pytest.fixture(autouse=True, scope="module")
def _one_thread(one_thread):
    """Every test of this module on one thread (tests/conftest.py)."""


def _rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


@pytest.mark.parametrize("mode", ["nearest", "nearest-exact"])
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("bias", [True, False])
def test_fold_equals_upsampling_then_convolution(mode, channels_last, bias):
    """At odd sizes (the borders' zero padding is where a wrong tap would show), in fp32: within fp32 rounding of a
    few dozen products a value; the output keeps the input's layout."""
    g = torch.Generator().manual_seed(0)
    conv = nn.Conv2d(8, 6, 3, padding=1, bias=bias)
    x = torch.randn(3, 8, 5, 7, generator=g)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    conv, x = conv.to(memory_format=fmt), x.contiguous(memory_format=fmt)
    with torch.no_grad():
        want = conv(F.interpolate(x, scale_factor=2, mode=mode))
        fold = NearestUpConv(conv)
        got = fold(x)
    assert got.shape == (3, 6, 10, 14)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert fold.conv.weight.is_contiguous(memory_format=fmt)


def test_fold_in_bf16_is_within_bf16_rounding_of_fp32():
    """The folded taps are sums rounded once to bf16: its output is as far from the fp32 pair's as the bf16 pair's is
    (both a few bf16 roundings: relative L2 under 1e-2, bf16's epsilon 2**-8 times a few)."""
    g = torch.Generator().manual_seed(1)
    conv = nn.Conv2d(64, 32, 3, padding=1)
    x = torch.randn(2, 64, 9, 11, generator=g)
    with torch.no_grad():
        want = conv(F.interpolate(x, scale_factor=2, mode="nearest"))
        half = conv.to(torch.bfloat16)
        pair = half(F.interpolate(x.bfloat16(), scale_factor=2, mode="nearest"))
        fold = NearestUpConv(half)(x.bfloat16())
    assert fold.dtype == torch.bfloat16
    assert _rel_l2(pair, want) < 1e-2 and _rel_l2(fold, want) < 1e-2


def test_fold_refuses_what_it_does_not_reproduce():
    for conv in (nn.Conv2d(4, 4, 3, padding=1, stride=2), nn.Conv2d(4, 4, 1), nn.Conv2d(4, 4, 3, padding=1, groups=2),
                 nn.Conv2d(4, 4, 3, padding=1, padding_mode="reflect")):
        with pytest.raises(ValueError, match="3 x 3 convolution of stride 1 and padding 1"):
            NearestUpConv(conv)
    fold = NearestUpConv(nn.Conv2d(4, 4, 3, padding=1))
    with pytest.raises(ValueError, match="output_size"):
        fold(torch.randn(1, 4, 3, 3), output_size=(7, 7))
    # a bilinear upsampling, a factor of 3 and a pair with something between are left alone
    seqs = nn.ModuleList([nn.Sequential(nn.Upsample(scale_factor=2, mode="bilinear"), nn.Conv2d(4, 4, 3, padding=1)),
                          nn.Sequential(nn.Upsample(scale_factor=3), nn.Conv2d(4, 4, 3, padding=1)),
                          nn.Sequential(nn.Upsample(scale_factor=2), nn.SiLU(), nn.Conv2d(4, 4, 3, padding=1))])
    assert fold_upsample_convs(seqs) == 0


def test_diffusers_upsample2d_and_the_wan_resampler_fold():
    """The two pairs the decoders hold: diffusers' Upsample2D (the SD VAE) and a nearest-exact nn.Upsample + Conv2d
    in an nn.Sequential (the Wan decoder's resamplers)."""
    from diffusers.models.upsampling import Upsample2D

    g = torch.Generator().manual_seed(2)
    x = torch.randn(2, 8, 6, 5, generator=g)
    mods = nn.ModuleDict({"sd": Upsample2D(8, use_conv=True, out_channels=4),
                          "wan": nn.Sequential(nn.Upsample(scale_factor=(2.0, 2.0), mode="nearest-exact"),
                                               nn.Conv2d(8, 4, 3, padding=1))})
    with torch.no_grad():
        want = {k: m(x) for k, m in mods.items()}
        assert fold_upsample_convs(mods) == 2
        for k, m in mods.items():
            assert isinstance(m, NearestUpConv)
            torch.testing.assert_close(m(x), want[k], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("stack", [["vae-upsample-fold"],
                                   ["vae-stream-buffers", "vae-channels-last", "vae-upsample-fold", "vae-block-step"]])
def test_mg2_stream_with_the_fold_equals_the_reference_decoder(stack):
    """The Wan decoder's resamplers folded, in the reference streaming decoder and in the buffered channels-last block
    step: the frames of two streams (uneven splits) equal the reference's within fp32 rounding."""
    z = torch.randn(1, 16, 8, 8, 8, generator=torch.Generator().manual_seed(1))
    ref = _stream(_mg2_decoder_bench([])[0], z, [3, 3, 2])
    dec, ctx = _mg2_decoder_bench(stack)
    assert ctx.notes["vae-upsample-fold"].startswith(("2 ", "3 "))
    assert not any(type(m).__name__ == "WanUpsample" for m in dec.vae.decoder.modules())
    for split in ([3, 3, 2], [1, 4, 3]):
        torch.testing.assert_close(_stream(dec, z, split), ref, rtol=1e-5, atol=1e-5)


def test_wma_decode_with_the_fold_equals_the_reference():
    """The SD VAE's Upsample2D layers folded, a frame per call and a pass as one batch: the reference's frames within
    fp32 rounding; the encoder untouched."""
    wl = workloads.get("wma")
    dev = torch.device("cpu")
    ref = wl.reference_pipeline(wl.presets["tiny-wma"], dev)
    lat = torch.randn(1, 4, 2, *ref.preset.latent_shape[-2:], generator=torch.Generator().manual_seed(3))
    want = ref.decode(lat)
    for stack in (["vae-upsample-fold"], ["vae-batch-frames", "vae-upsample-fold"]):
        pipe, ctx = apply_stack(ref, wl, stack, dev)
        torch.testing.assert_close(pipe.decode(lat), want, rtol=1e-5, atol=1e-5)
        n = int(ctx.notes["vae-upsample-fold"].split()[0])
        assert n == len(ref.preset.vae_block_out_channels) - 1  # every up block but the last upsamples
        assert not any(isinstance(m, NearestUpConv) for m in pipe.vae.encoder.modules())


def test_fold_comes_before_the_compiled_or_captured_step():
    wl = workloads.get("wma")
    ref = wl.reference_pipeline(wl.presets["tiny-wma"], torch.device("cpu"))
    with pytest.raises(ValueError, match="vae-upsample-fold must come before vae-compile"):
        apply_stack(ref, wl, ["vae-compile", "vae-upsample-fold"], torch.device("cpu"), compile_backend="eager")
    with pytest.raises(ValueError, match="vae-upsample-fold must come before vae-compile"):
        _mg2_decoder_bench(["vae-stream-buffers", "vae-compile", "vae-upsample-fold"])
    with pytest.raises(ValueError, match="stand-in decoder"):
        _mg2_decoder_bench(["vae-tiny", "vae-upsample-fold"])


@GPU
def test_mg2_fold_compiled_and_captured_equals_the_eager_block_step():
    """The fold in the compiled (inductor), captured block step: every stream's frames within TF32's rounding of the
    eager block step's without it (cuDNN's fp32 convolutions run in TF32)."""
    z = torch.randn(1, 16, 12, 8, 8, device="cuda", generator=torch.Generator("cuda").manual_seed(0))
    ref = _stream(_mg2_decoder_bench(["vae-stream-buffers", "vae-block-step"], "cuda")[0], z, [3, 3, 3, 3])
    dec, _ = _mg2_decoder_bench(["vae-stream-buffers", "vae-channels-last", "vae-upsample-fold", "vae-head-gemm",
                         "vae-compile", "vae-cuda-graphs", "vae-block-step"], "cuda", backend="inductor")
    first = _stream(dec, z, [3, 3, 3, 3])
    torch.testing.assert_close(first, ref, rtol=5e-3, atol=5e-3)
    # the first stream's steady calls run before the capture, the replays after it: on the H200 their frames were up
    # to 9e-4 apart (TF32's rounding), so every stream is held to the eager reference's tolerance
    for _ in range(4):
        torch.testing.assert_close(_stream(dec, z, [3, 3, 3, 3]), ref, rtol=5e-3, atol=5e-3)
    assert dec.decode_frame.captured == 3 and not dec.decode_frame.failures, dec.decode_frame.table()


@GPU
def test_wma_fold_in_the_bf16_batched_compiled_captured_decode():
    """notebook 06's wma decoder stack with and without the fold, each against the fp32 decoder: within bf16's rounding
    over the decoder's layers (relative L2 under 3e-2; 1.8e-2 measured for the compiled bf16 step on the H200); the
    fold's replays agree within one bf16 rounding of the frames (torch.testing's bf16 tolerance)."""
    wl = workloads.get("wma")
    dev = torch.device("cuda")
    ref = wl.reference_pipeline(wl.presets["tiny-wma"], dev)
    lat = torch.randn(1, 4, 4, *ref.preset.latent_shape[-2:], device="cuda",
                      generator=torch.Generator("cuda").manual_seed(0))
    want = ref.decode(lat)
    base = ["vae-decoder-bf16", "vae-batch-frames"]
    plain, _ = apply_stack(ref, wl, [*base, "vae-compile", "vae-cuda-graphs"], dev)
    pipe, _ = apply_stack(ref, wl, [*base, "vae-upsample-fold", "vae-compile", "vae-cuda-graphs"], dev)
    first = pipe.decode(lat)
    assert _rel_l2(first, want) < 3e-2 and _rel_l2(plain.decode(lat), want) < 3e-2
    for _ in range(2):
        torch.testing.assert_close(pipe.decode(lat), first)


def test_wma_unet_forward_with_the_fold_equals_the_reference():
    """upsample-fold on the wma UNet's up path: the forward (video, action and state outputs) within fp32 rounding of
    the reference's; every Upsample replaced."""
    from wmbook.models.wma.unet import Upsample

    wl = workloads.get("wma")
    dev = torch.device("cpu")
    ref = wl.reference_pipeline(wl.presets["tiny-wma"], dev)
    pipe, ctx = apply_stack(ref, wl, ["upsample-fold"], dev)
    n = int(ctx.notes["upsample-fold"].split()[0])
    assert n > 0 and not any(isinstance(m, Upsample) for m in wl.denoiser(pipe).modules())
    assert sum(isinstance(m, Upsample) for m in wl.denoiser(ref).modules()) == n
    for a, b in zip(wl.forward_probe(pipe).forward(), wl.forward_probe(ref).forward()):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    assert "upsample-fold" not in variants.known(workloads.get("mg2"))  # the DiT has no upsampling
