"""The streaming Wan decoder's causal convolutions on their input windows (wmbook.variants.vae_stream), in Triton.

A causal convolution's window is [B, C, past + T, H + 2*ph, W + 2*pw] in channels_last_3d with a zero border, so the
convolution needs no padding and every tap of an output position reads C contiguous values:

    window_conv(win, weight_kc, bias, kernel)   implicit GEMM: M = B*T*H*W output positions, N = C_out,
                                                K = kt*kh*kw*C_in (tap-major), fp32 accumulation, bias in the epilogue
    window_conv_fp8(win_q, x_scale, weight_nk,  the same on e4m3 tensor cores: the window quantized per tensor, the
                    w_scale, bias, kernel)      weight per output channel (quantize_window_fp8, weight_nk_fp8), the
                                                scales applied in the epilogue (what fp8 convolutions could save)
    norm_silu_into(x, gamma, bias, win)         SiLU(RMS norm over channels of x) written straight into the window's
                                                interior (the copy an unfused step makes into the window disappears)
    shift_window(win, t)                        the window's last `past` frames moved to its front, frame by frame
                                                (channels-last: a frame is one contiguous block)

Why: in the compiled step, inductor turns each in-place write into a window into a fresh copy of the whole window and
writes the carried frames back at the end (on the H200 at mg2-universal 7.5 ms of copies and 7.5 ms of norms per
steady block of 12 frames, beside 46.7 ms of convolutions); and cuDNN runs the head's 96 -> 3 convolution at ~24
TFLOP/s (its output channels fill 3 of a tile's 32 columns). The weight goes in as [K, C_out] (`weight_kc`), arranged
once.
"""

from __future__ import annotations

import torch

from . import check_dtype, interpreting, is_channels_last, next_pow2, runs_triton
from .rms_norm_silu import rms_norm_silu_ref

try:
    import triton
    import triton.language as tl
except ImportError:  # the reference paths below run instead
    triton = None


if triton is not None:

    @triton.jit
    def _position(s, T, H, W):
        """A flat index over [B, T, H, W] -> (b, t, h, w)."""
        w = s % W
        r = s // W
        h = r % H
        r = r // H
        return r // T, r % T, h, w

    @triton.jit
    def _window_conv_kernel(
        x_ptr,  # window [B, Tp, Hp, Wp, CIN] (channels_last_3d memory)
        w_ptr,  # [KT*KH*KW*CIN, COUT] row-major, tap-major K; W_NK: [COUT, KT*KH*KW*CIN] (K contiguous)
        b_ptr,  # [COUT] (HAS_BIAS), else unused
        y_ptr,  # [B, T, H, W, COUT] (channels_last_3d memory)
        xs_ptr, ws_ptr,  # SCALED: the window's scale [1] and the weight's per output channel [COUT] (fp32)
        M, T, H, W, Tp, Hp, Wp, COUT,
        CIN: tl.constexpr, KH: tl.constexpr, KW: tl.constexpr, TAPS: tl.constexpr,
        HAS_BIAS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, UPCAST: tl.constexpr,
        PRECISION: tl.constexpr, W_NK: tl.constexpr, SCALED: tl.constexpr,
    ):
        pid_m = tl.program_id(0)
        pid_n = tl.program_id(1)
        m = pid_m.to(tl.int64) * BM + tl.arange(0, BM)
        n = pid_n * BN + tl.arange(0, BN)
        k = tl.arange(0, BK)
        bo, to, ho, wo = _position(m, T, H, W)
        base = ((bo * Tp + to) * Hp + ho) * Wp + wo  # the window position of tap (0, 0, 0)
        m_ok = m < M
        n_ok = n < COUT
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        steps: tl.constexpr = CIN // BK  # BK divides CIN (the launcher's choice): a K step never straddles two taps
        for i in range(0, TAPS * steps):
            tap = i // steps
            c0 = (i - tap * steps) * BK
            dt = tap // (KH * KW)
            dh = (tap // KW) % KH
            dw = tap % KW
            pos = base + (dt * Hp + dh) * Wp + dw
            a = tl.load(x_ptr + pos[:, None] * CIN + (c0 + k)[None, :], mask=m_ok[:, None], other=0.0)
            kk = tap * CIN + c0 + k
            if W_NK:  # e4m3 tensor cores take B with K contiguous
                b = tl.load(w_ptr + n[None, :] * (TAPS * CIN) + kk[:, None], mask=n_ok[None, :], other=0.0)
            else:
                b = tl.load(w_ptr + kk[:, None] * COUT + n[None, :], mask=n_ok[None, :], other=0.0)
            if UPCAST:  # Triton's interpreter: its dot of 16-bit floats is wrong; fp32 products of them are exact
                a = a.to(tl.float32)
                b = b.to(tl.float32)
            acc = tl.dot(a, b, acc, input_precision=PRECISION)
        if SCALED:
            acc *= tl.load(xs_ptr) * tl.load(ws_ptr + n, mask=n_ok, other=0.0)[None, :]
        if HAS_BIAS:
            acc += tl.load(b_ptr + n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
        tl.store(y_ptr + m[:, None] * COUT + n[None, :], acc.to(y_ptr.dtype.element_ty),
                 mask=m_ok[:, None] & n_ok[None, :])

    @triton.jit
    def _norm_silu_into_kernel(
        x_ptr,  # [B, T, H, W, C] (channels_last_3d memory)
        gamma_ptr, bias_ptr,  # [C]
        win_ptr,  # window [B, Tp, Hp, Wp, C]: the result goes to frames past.., rows ph.., columns pw..
        S, T, H, W, Tp, Hp, Wp, C, past, ph, pw, scale, eps,
        HAS_BIAS: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_C: tl.constexpr,
    ):
        s = tl.program_id(0).to(tl.int64) * BLOCK_S + tl.arange(0, BLOCK_S)
        c = tl.arange(0, BLOCK_C)
        m = (s < S)[:, None] & (c < C)[None, :]
        x = tl.load(x_ptr + s[:, None] * C + c[None, :], mask=m, other=0.0).to(tl.float32)
        inv = scale / tl.maximum(tl.sqrt(tl.sum(x * x, axis=1)), eps)
        g = tl.load(gamma_ptr + c, mask=c < C, other=0.0).to(tl.float32)
        y = x * inv[:, None] * g[None, :]
        if HAS_BIAS:
            y += tl.load(bias_ptr + c, mask=c < C, other=0.0).to(tl.float32)[None, :]
        y = y * tl.sigmoid(y)
        b, t, h, w = _position(s, T, H, W)
        pos = ((b * Tp + past + t) * Hp + h + ph) * Wp + w + pw
        tl.store(win_ptr + pos[:, None] * C + c[None, :], y.to(win_ptr.dtype.element_ty), mask=m)


def weight_kc(weight: torch.Tensor) -> torch.Tensor:
    """A conv3d weight [C_out, C_in, kt, kh, kw] as the kernel's [kt*kh*kw*C_in, C_out] (tap-major K), contiguous."""
    if weight.dim() != 5:
        raise ValueError(f"weight must be [C_out, C_in, kt, kh, kw], got {tuple(weight.shape)}")
    co, ci, kt, kh, kw = weight.shape
    return weight.permute(2, 3, 4, 1, 0).reshape(kt * kh * kw * ci, co).contiguous()


def _check_window(win: torch.Tensor, name: str = "win") -> None:
    check_dtype(name, win)
    if win.dim() != 5 or not is_channels_last(win):
        raise ValueError(f"{name} must be a [B, C, T, H, W] tensor in torch.channels_last_3d, got shape "
                         f"{tuple(win.shape)} strides {win.stride()}")


def window_conv_ref(win: torch.Tensor, weight_kc_: torch.Tensor, bias: torch.Tensor | None,
                    kernel: tuple[int, int, int]) -> torch.Tensor:
    """The arithmetic of window_conv with aten's conv3d (no padding), channels-last out."""
    kt, kh, kw = kernel
    ci = win.shape[1]
    w = weight_kc_.reshape(kt, kh, kw, ci, -1).permute(4, 3, 0, 1, 2)
    return torch.nn.functional.conv3d(win, w.to(win.dtype), bias).contiguous(memory_format=torch.channels_last_3d)


def _block_k(cin: int) -> int:
    for bk in (64, 32, 16):
        if cin % bk == 0:
            return bk
    raise ValueError(f"window_conv needs C_in a multiple of 16 (its K steps); got C_in={cin}")


# (BM, BN, warps, stages) per output width: the launcher's fixed choice (no autotuning inside a captured graph)
def _config(cout: int, m: int) -> tuple[int, int, int, int]:
    bn = min(128, max(16, next_pow2(cout)))
    bm = 128 if m >= 128 * 132 else 64
    return bm, bn, 8 if bm * bn >= 128 * 128 else 4, 3


def window_conv(win: torch.Tensor, weight_kc_: torch.Tensor, bias: torch.Tensor | None,
                kernel: tuple[int, int, int], config: tuple[int, int, int, int] | None = None) -> torch.Tensor:
    """win [B, C_in, T + kt - 1, H + kh - 1, W + kw - 1] (channels_last_3d, its border already there) convolved with
    the weight arranged by weight_kc -> [B, C_out, T, H, W] in channels_last_3d. config: (BM, BN, warps, stages)."""
    _check_window(win)
    kt, kh, kw = kernel
    b, ci, tp, hp, wp = win.shape
    if weight_kc_.shape[0] != kt * kh * kw * ci:
        raise ValueError(f"weight_kc has {weight_kc_.shape[0]} rows; kernel {kernel} x C_in {ci} needs "
                         f"{kt * kh * kw * ci}")
    co = weight_kc_.shape[1]
    t, h, w = tp - kt + 1, hp - kh + 1, wp - kw + 1
    if min(t, h, w) < 1:
        raise ValueError(f"window {tuple(win.shape)} is smaller than the kernel {kernel}")
    if not (runs_triton(win.device) and triton is not None):
        return window_conv_ref(win, weight_kc_, bias, kernel)
    y = torch.empty((b, co, t, h, w), dtype=win.dtype, device=win.device, memory_format=torch.channels_last_3d)
    m = b * t * h * w
    bm, bn, warps, stages = config or _config(co, m)
    bk = _block_k(ci)
    _window_conv_kernel[(triton.cdiv(m, bm), triton.cdiv(co, bn))](
        win, weight_kc_, bias if bias is not None else weight_kc_, y, weight_kc_, weight_kc_, m, t, h, w, tp, hp, wp,
        co, CIN=ci, KH=kh, KW=kw, TAPS=kt * kh * kw, HAS_BIAS=bias is not None, BM=bm, BN=bn, BK=bk,
        UPCAST=interpreting(),
        PRECISION="ieee" if win.dtype == torch.float32 else "tf32", W_NK=False, SCALED=False, num_warps=warps,
        num_stages=stages)
    return y


E4M3 = torch.float8_e4m3fn
E4M3_MAX = float(torch.finfo(E4M3).max)  # 448


def quantize_window_fp8(win: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A window in e4m3 with one scale (its largest magnitude mapped to 448): (window in fp8, the scale as a [1] fp32
    tensor, so that window ~= fp8 * scale). Keeps the memory format (a channels-last window stays one)."""
    _check_window(win)
    scale = (win.detach().abs().amax().float() / E4M3_MAX).clamp_min(1e-12).reshape(1)
    return (win.float() / scale).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3), scale


def weight_nk_fp8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A conv3d weight [C_out, C_in, kt, kh, kw] in e4m3 with one scale per output channel: ([C_out, kt*kh*kw*C_in]
    (tap-major K, K contiguous: the layout e4m3 tensor cores read), its scales [C_out] fp32)."""
    if weight.dim() != 5:
        raise ValueError(f"weight must be [C_out, C_in, kt, kh, kw], got {tuple(weight.shape)}")
    w = weight.detach().float().permute(0, 2, 3, 4, 1).reshape(weight.shape[0], -1)
    scale = (w.abs().amax(dim=1) / E4M3_MAX).clamp_min(1e-12)
    return (w / scale[:, None]).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3).contiguous(), scale.contiguous()


def window_conv_fp8_ref(win_q: torch.Tensor, x_scale: torch.Tensor, weight_nk: torch.Tensor, w_scale: torch.Tensor,
                        bias: torch.Tensor | None, kernel: tuple[int, int, int],
                        out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """The arithmetic of window_conv_fp8 on dequantized values in fp32 (each e4m3 value times its scale is exact in
    fp32): what the fp8 kernel computes up to the order of its fp32 accumulation."""
    kt, kh, kw = kernel
    ci = win_q.shape[1]
    w = (weight_nk.float() * w_scale[:, None]).reshape(-1, kt, kh, kw, ci).permute(0, 4, 1, 2, 3)
    y = torch.nn.functional.conv3d(win_q.float() * x_scale, w, None if bias is None else bias.float())
    return y.to(out_dtype).contiguous(memory_format=torch.channels_last_3d)


def window_conv_fp8(win_q: torch.Tensor, x_scale: torch.Tensor, weight_nk: torch.Tensor, w_scale: torch.Tensor,
                    bias: torch.Tensor | None, kernel: tuple[int, int, int], out_dtype: torch.dtype = torch.bfloat16,
                    config: tuple[int, int, int, int] | None = None) -> torch.Tensor:
    """window_conv on e4m3 tensor cores: the window quantized by quantize_window_fp8 (x_scale), the weight by
    weight_nk_fp8 (w_scale per output channel); fp32 accumulation, the scales and the bias in the epilogue, the output
    in out_dtype (channels_last_3d). config: (BM, BN, warps, stages)."""
    if win_q.dtype != E4M3 or weight_nk.dtype != E4M3:
        raise ValueError(f"window_conv_fp8 takes win_q and weight_nk in {E4M3}; got {win_q.dtype} and "
                         f"{weight_nk.dtype} (quantize them with quantize_window_fp8 and weight_nk_fp8)")
    if out_dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise ValueError(f"out_dtype={out_dtype} is not allowed; allowed: float32, bfloat16, float16")
    if win_q.dim() != 5 or not is_channels_last(win_q):
        raise ValueError(f"win_q must be a [B, C, T, H, W] tensor in torch.channels_last_3d, got shape "
                         f"{tuple(win_q.shape)} strides {win_q.stride()}")
    kt, kh, kw = kernel
    b, ci, tp, hp, wp = win_q.shape
    co = weight_nk.shape[0]
    if weight_nk.shape[1] != kt * kh * kw * ci or w_scale.shape != (co,) or x_scale.numel() != 1:
        raise ValueError(f"weight_nk {tuple(weight_nk.shape)}, w_scale {tuple(w_scale.shape)} and x_scale "
                         f"{tuple(x_scale.shape)} do not fit kernel {kernel} x C_in {ci}: need [C_out, "
                         f"{kt * kh * kw * ci}], [C_out] and one value")
    t, h, w = tp - kt + 1, hp - kh + 1, wp - kw + 1
    if min(t, h, w) < 1:
        raise ValueError(f"window {tuple(win_q.shape)} is smaller than the kernel {kernel}")
    if not (runs_triton(win_q.device) and triton is not None):
        return window_conv_fp8_ref(win_q, x_scale, weight_nk, w_scale, bias, kernel, out_dtype)
    if ci % 32:
        raise ValueError(f"window_conv_fp8 needs C_in a multiple of 32 (e4m3 K steps); got C_in={ci}")
    y = torch.empty((b, co, t, h, w), dtype=out_dtype, device=win_q.device, memory_format=torch.channels_last_3d)
    m = b * t * h * w
    bm, bn, warps, stages = config or _config(co, m)
    bk = _block_k(ci)
    xs = x_scale.reshape(1).float().contiguous()
    ws = w_scale.float().contiguous()
    _window_conv_kernel[(triton.cdiv(m, bm), triton.cdiv(co, bn))](
        win_q, weight_nk, bias if bias is not None else ws, y, xs, ws, m, t, h, w, tp, hp, wp, co,
        CIN=ci, KH=kh, KW=kw, TAPS=kt * kh * kw, HAS_BIAS=bias is not None, BM=bm, BN=bn, BK=bk,
        UPCAST=interpreting(), PRECISION="ieee", W_NK=True, SCALED=True, num_warps=warps, num_stages=stages)
    return y


def norm_silu_into(x: torch.Tensor, gamma: torch.Tensor, bias: torch.Tensor | None, win: torch.Tensor,
                   eps: float = 1e-12) -> None:
    """SiLU(F.normalize(x, dim=1) * sqrt(C) * gamma + bias), computed in fp32 (off a GPU: rms_norm_silu_ref's
    arithmetic), written into the interior of `win`
    (frames past.., rows ph.., columns pw..; the past frames and the zero border untouched). x [B, C, T, H, W] in
    channels_last_3d; win [B, C, past + T, H + 2*ph, W + 2*pw] likewise."""
    _check_window(win)
    _check_window(x, "x")
    b, c, t, h, w = x.shape
    wb, wc, tp, hp, wp = win.shape
    past, ph2, pw2 = tp - t, hp - h, wp - w
    if wb != b or wc != c or past < 0 or ph2 < 0 or pw2 < 0 or ph2 % 2 or pw2 % 2:
        raise ValueError(f"window {tuple(win.shape)} cannot hold x {tuple(x.shape)} with an even border")
    if not (runs_triton(x.device) and triton is not None):
        y = rms_norm_silu_ref(x, gamma, bias, eps)
        win[:, :, past:, ph2 // 2:ph2 // 2 + h, pw2 // 2:pw2 // 2 + w].copy_(y)
        return
    s = b * t * h * w
    block_c = next_pow2(c)
    block_s = max(1, min(next_pow2(s), 8192 // block_c))
    tile = block_s * block_c
    g = gamma.reshape(c).contiguous()
    bb = bias.reshape(c).contiguous() if bias is not None else g
    _norm_silu_into_kernel[(triton.cdiv(s, block_s),)](
        x, g, bb, win, s, t, h, w, tp, hp, wp, c, past, ph2 // 2, pw2 // 2, c**0.5, eps,
        HAS_BIAS=bias is not None, BLOCK_S=block_s, BLOCK_C=block_c,
        num_warps=4 if tile <= 4096 else 8)


def shift_window(win: torch.Tensor, t: int) -> None:
    """The last `past` frames of a window that holds `past + t` frames moved to its front, in order (a source frame is
    read before any frame after it is written, so overlapping moves are right)."""
    past = win.shape[2] - t
    if past <= 0:
        return
    if t >= past:  # the source and the destination do not overlap: one copy
        win[:, :, :past].copy_(win[:, :, t:])
        return
    for i in range(past):
        win[:, :, i].copy_(win[:, :, t + i])


__all__ = ["E4M3", "E4M3_MAX", "norm_silu_into", "quantize_window_fp8", "shift_window", "weight_kc", "weight_nk_fp8",
           "window_conv", "window_conv_fp8", "window_conv_fp8_ref", "window_conv_ref"]
