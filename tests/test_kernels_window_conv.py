"""The decoder's window kernels (wmbook.kernels.window_conv) against aten: the implicit-GEMM convolution of a padded
channels-last window, RMS norm + SiLU written into a window's interior, and the frame shift (on a GPU, or the Triton
interpreter on a CPU)."""

from __future__ import annotations

import pytest

triton = pytest.importorskip("triton")  # on a CPU, TRITON_INTERPRET=1 (conftest): kernels run in the interpreter

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from wmbook.kernels import window_conv as wc  # noqa: E402

DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")
CL = torch.channels_last_3d


def _rand(shape, dtype, seed, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * scale).to(DEV, dtype)


def _tol(dtype, k):
    """fp32: accumulation-order error of a K-long dot product; bf16: one rounding of the output (the inputs are the
    same bf16 values, accumulated in fp32 by both)."""
    if dtype == torch.float32:
        return dict(rtol=1e-4, atol=1e-4 * k**0.5)
    return dict(rtol=1.6e-2, atol=1.6e-2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("cin,cout,kernel,t,h,w", [
    (16, 3, (3, 3, 3), 2, 5, 7),  # the head: 3 output channels in a 16-wide tile
    (32, 48, (3, 3, 3), 1, 4, 6),  # one frame; output channels not a power of two
    (64, 16, (3, 1, 1), 2, 3, 3),  # the temporal upsampler's kernel
    (48, 40, (3, 3, 3), 3, 6, 5),  # K steps of 16
])
def test_window_conv_matches_conv3d(dtype, cin, cout, kernel, t, h, w):
    kt, kh, kw = kernel
    win = _rand((1, cin, t + kt - 1, h + kh - 1, w + kw - 1), dtype, 0).contiguous(memory_format=CL)
    weight = _rand((cout, cin, *kernel), dtype, 1, scale=0.1)
    bias = _rand((cout,), dtype, 2)
    y = wc.window_conv(win, wc.weight_kc(weight), bias, kernel)
    ref = F.conv3d(win.double(), weight.double(), bias.double())  # float64: cuDNN's fp32 may run in TF32
    assert y.shape == ref.shape and y.is_contiguous(memory_format=CL)
    torch.testing.assert_close(y.double(), ref, **_tol(dtype, cin * kt * kh * kw))


def test_window_conv_batch_and_no_bias():
    win = _rand((2, 16, 4, 4, 5), torch.float32, 3).contiguous(memory_format=CL)
    weight = _rand((8, 16, 3, 3, 3), torch.float32, 4, scale=0.1)
    y = wc.window_conv(win, wc.weight_kc(weight), None, (3, 3, 3))
    ref = F.conv3d(win.double(), weight.double())
    torch.testing.assert_close(y.double(), ref, **_tol(torch.float32, 16 * 27))


def test_window_conv_refuses_bad_input():
    win = _rand((1, 16, 4, 4, 5), torch.float32, 3)
    weight = wc.weight_kc(_rand((8, 16, 3, 3, 3), torch.float32, 4))
    with pytest.raises(ValueError, match="channels_last_3d"):
        wc.window_conv(win, weight, None, (3, 3, 3))  # channels-first
    with pytest.raises(ValueError, match="rows"):
        wc.window_conv(win.contiguous(memory_format=CL), weight, None, (3, 1, 1))
    odd = _rand((1, 12, 4, 4, 5), torch.float32, 5).contiguous(memory_format=CL)
    if wc.runs_triton(DEV):
        with pytest.raises(ValueError, match="multiple of 16"):
            wc.window_conv(odd, wc.weight_kc(_rand((8, 12, 3, 3, 3), torch.float32, 6)), None, (3, 3, 3))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [False, True])
def test_norm_silu_into_writes_the_interior_only(dtype, bias):
    wan = pytest.importorskip("diffusers.models.autoencoders.autoencoder_kl_wan")
    c, t, h, w = 40, 2, 3, 5
    norm = wan.WanRMS_norm(c, images=False, bias=bias)
    with torch.no_grad():
        norm.gamma.copy_(_rand(norm.gamma.shape, torch.float32, 7))
        if bias:
            norm.bias.copy_(_rand(norm.bias.shape, torch.float32, 8))
    norm = norm.to(DEV, dtype)
    x = _rand((1, c, t, h, w), dtype, 9, scale=3).contiguous(memory_format=CL)
    win = torch.full((1, c, 2 + t, h + 2, w + 2), 7.0, dtype=dtype, device=DEV).contiguous(memory_format=CL)
    wc.norm_silu_into(x, norm.gamma, norm.bias if bias else None, win)
    ref = F.silu(norm(x.float() if dtype == torch.float32 else x).float())
    inner = win[:, :, 2:, 1:1 + h, 1:1 + w]
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=3e-2, atol=3e-2)
    torch.testing.assert_close(inner.float(), ref, **tol)
    outside = win.clone()
    outside[:, :, 2:, 1:1 + h, 1:1 + w] = 7.0
    assert bool((outside == 7.0).all()), "the past frames or the border were written"


@pytest.mark.parametrize("t", [1, 2, 4])
def test_shift_window_moves_the_last_frames_in_order(t):
    past = 2
    win = torch.arange(past + t, dtype=torch.float32).view(1, 1, -1, 1, 1).expand(1, 3, -1, 2, 2)
    win = win.contiguous(memory_format=CL)
    wc.shift_window(win, t)
    assert win[0, 0, :past, 0, 0].tolist() == [float(t), float(t + 1)]


@pytest.mark.parametrize("cin,cout,kernel,t,h,w,bias", [
    (32, 3, (3, 3, 3), 2, 5, 7, True),  # the head's shape: 3 output channels
    (64, 48, (3, 3, 3), 1, 4, 6, False),  # output channels not a power of two
    (96, 16, (3, 1, 1), 2, 3, 3, True),  # C_in in K steps of 32
])
def test_window_conv_fp8_matches_its_dequantized_arithmetic(cin, cout, kernel, t, h, w, bias):
    """The e4m3 kernel against conv3d of the dequantized window and weight in float64: the same products (an e4m3 value
    times its fp32 scale is exact in fp32), so the difference is the fp32 accumulation order and the output's one
    bf16 rounding."""
    kt, kh, kw = kernel
    win = _rand((1, cin, t + kt - 1, h + kh - 1, w + kw - 1), torch.float32, 10).contiguous(memory_format=CL)
    weight = _rand((cout, cin, *kernel), torch.float32, 11, scale=0.1)
    b = _rand((cout,), torch.float32, 12) if bias else None
    wq, xs = wc.quantize_window_fp8(win)
    assert wq.dtype == wc.E4M3 and wq.is_contiguous(memory_format=CL) and xs.shape == (1,)
    kq, ks = wc.weight_nk_fp8(weight)
    assert kq.shape == (cout, kt * kh * kw * cin) and ks.shape == (cout,)
    y = wc.window_conv_fp8(wq, xs, kq, ks, b, kernel)
    assert y.dtype == torch.bfloat16 and y.is_contiguous(memory_format=CL)
    deq_w = (kq.double() * ks.double()[:, None]).reshape(cout, kt, kh, kw, cin).permute(0, 4, 1, 2, 3)
    ref = F.conv3d(wq.double() * xs.double(), deq_w, None if b is None else b.double())
    torch.testing.assert_close(y.double(), ref, **_tol(torch.bfloat16, cin * kt * kh * kw))
    # and the quantization itself stays within e4m3's rounding (3 mantissa bits) of the fp32 convolution
    full = F.conv3d(win.double(), weight.double(), None if b is None else b.double())
    assert float((y.double() - full).norm() / full.norm()) < 6e-2


def test_window_conv_fp8_refuses_bad_input():
    win = _rand((1, 32, 4, 4, 5), torch.float32, 3).contiguous(memory_format=CL)
    weight = _rand((8, 32, 3, 3, 3), torch.float32, 4)
    wq, xs = wc.quantize_window_fp8(win)
    kq, ks = wc.weight_nk_fp8(weight)
    with pytest.raises(ValueError, match="float8_e4m3fn"):
        wc.window_conv_fp8(win, xs, kq, ks, None, (3, 3, 3))  # not quantized
    with pytest.raises(ValueError, match="out_dtype"):
        wc.window_conv_fp8(wq, xs, kq, ks, None, (3, 3, 3), out_dtype=torch.int8)
    with pytest.raises(ValueError, match="do not fit"):
        wc.window_conv_fp8(wq, xs, kq, ks, None, (3, 1, 1))
    with pytest.raises(ValueError, match="channels_last_3d"):
        wc.window_conv_fp8(wq.contiguous(), xs, kq, ks, None, (3, 3, 3))
