"""Is the streaming Wan decoder's time its 3-D convolutions' algorithm choice? Every causal convolution of one steady
latent frame (shapes recorded on meta tensors with vae-stream-buffers), timed as cuDNN's conv3d on the channels-last
input window against the same arithmetic as three 2-D convolutions over the window's frames (a channels-last 3-D
window's frames are channels-last 2-D images: no copy) summed, and as our Triton implicit GEMM on the same window
(wmbook.kernels.window_conv, the best of a few tile shapes), at the achieved TFLOP/s; and the same implicit GEMM on
e4m3 tensor cores (window_conv_fp8: the window quantized per tensor, the weight per output channel, scales in the
epilogue), timed without the window's quantization (a kernel that makes the window would write it in fp8) and with it.

Whether the decoder may run its convolutions in fp8 at all is a quality question first: --psnr-blocks N decodes N
blocks of seeded latents with the decoder in fp32, in bf16, and with every convolution's input and weight rounded to
e4m3 (per tensor and per output channel, the products then exact in fp32: the arithmetic of the fp8 kernel), the rest
in fp32 or in bf16, and gives each one's PSNR against fp32 beside the decoder's 40 dB gate.

    PYTHONPATH=$PWD python3 tools/conv3d_bench.py --preset mg2-universal --dtype bf16 [--psnr-blocks 4]
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter

import torch
import torch.nn.functional as F

from wmbook import workloads
from wmbook.bench import time_fn
from wmbook.errors import command


def conv_shapes(preset) -> Counter:
    """(C_in, C_out, kernel, window frames, window H, window W) of every causal convolution of one steady frame."""
    from diffusers import AutoencoderKLWan

    from wmbook.models.vae import StreamingWanDecoder, wan_vae_config
    from wmbook.variants.swaps import swap_class
    from wmbook.variants.vae_stream import BufferedStreamingDecoder

    with torch.device("meta"):
        vae = AutoencoderKLWan(**wan_vae_config(preset.vae))
        z = torch.empty(1, 16, 3, *preset.latent_hw)
    dec = swap_class(StreamingWanDecoder(vae, stage_labels=False), BufferedStreamingDecoder)
    dec.use_buffers()
    seen = Counter()
    inner = dec._window

    def spy(conv, x, phase, shape=None):  # every causal convolution asks for its window once a step
        w = inner(conv, x, phase, shape)
        if phase == 2:
            seen[(conv.in_channels, conv.out_channels, tuple(conv.kernel_size), *w.shape[2:])] += 1
        return w

    dec._window = spy
    dec.decode_block(z)
    return seen


def triton_configs(co: int) -> list[tuple[int, int, int, int]]:
    """(BM, BN, warps, stages) tried for the window kernel at C_out output channels."""
    from wmbook.kernels import next_pow2

    if co < 16:
        return [(64, 16, 4, 3), (128, 16, 4, 3), (128, 16, 4, 4), (256, 16, 8, 3)]
    bns = sorted({min(128, max(16, next_pow2(co))), min(64, max(16, next_pow2(co)))})
    return [(128, bn, w, st) for bn in bns for w in (4, 8) for st in (3, 4)]


def _fake_fp8(x: torch.Tensor, per_channel: bool) -> torch.Tensor:
    """x rounded to e4m3 with one scale per tensor (or per output channel, dim 0) and scaled back, in fp32."""
    from wmbook.kernels.window_conv import E4M3, E4M3_MAX

    xf = x.float()
    amax = xf.abs().amax(dim=tuple(range(1, x.dim())), keepdim=True) if per_channel else xf.abs().amax()
    scale = (amax / E4M3_MAX).clamp_min(1e-12)
    return (xf / scale).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3).float() * scale


def decoder_fp8_psnr(preset, blocks: int, dev) -> list[dict]:
    """PSNR against the fp32 streaming decoder of seeded latents: bf16, and fp8-rounded convolutions (every Conv3d of
    the decoder) with the rest in fp32 and in bf16."""
    import types

    from wmbook.check import compare
    from wmbook.models.vae import StreamingWanDecoder, build_wan_vae, wan_vae_config

    k = preset.num_frame_per_block
    lat = torch.randn(1, 16, blocks * k, *preset.latent_hw, generator=torch.Generator().manual_seed(0))

    def decode(dtype, fp8: bool):
        vae = build_wan_vae(wan_vae_config(preset.vae), dtype=dtype, device=dev, seed=0)
        if fp8:
            for m in vae.decoder.modules():
                if isinstance(m, torch.nn.Conv3d):
                    wq = _fake_fp8(m.weight.detach(), per_channel=True)

                    def conv(self, x, weight, bias, wq=wq):  # the fp8 kernel's products, exact in fp32
                        b = None if bias is None else bias.float()
                        return torch.nn.Conv3d._conv_forward(self, _fake_fp8(x, False), wq, b).to(x.dtype)

                    m._conv_forward = types.MethodType(conv, m)
        dec = StreamingWanDecoder(vae, stage_labels=False)
        with torch.no_grad():
            out = torch.cat([dec.decode_block(lat[:, :, i * k:(i + 1) * k].to(dev)) for i in range(blocks)], 2)
        return out.float().cpu()

    ref = decode(torch.float32, False)
    rows = []
    for label, dtype, fp8 in (("bf16", torch.bfloat16, False), ("fp8 convolutions, the rest fp32", torch.float32, True),
                              ("fp8 convolutions, the rest bf16", torch.bfloat16, True)):
        c = compare(decode(dtype, fp8), ref, dtype="bf16", frames=True)
        rows.append({"decoder": label, "PSNR dB vs fp32": c.psnr, "rel L2": c.rel_l2, "passes 40 dB": c.psnr >= 40})
    return rows


@command("conv3d_bench.py")
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="mg2-universal")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"])
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--psnr-blocks", type=int, default=0, help="also the fp8 decoder's PSNR over this many blocks")
    a = ap.parse_args(argv)
    if a.repeats < 1 or a.psnr_blocks < 0:
        ap.error(f"--repeats must be >= 1 and --psnr-blocks >= 0; got {a.repeats} and {a.psnr_blocks}")
    if not torch.cuda.is_available():
        print("needs a CUDA device")
        return 0
    from wmbook.kernels import window_conv as wk

    dt = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[a.dtype]
    torch.backends.cudnn.benchmark = True
    preset = workloads.get("mg2").presets[a.preset]
    import pandas as pd

    rows = []
    for (ci, co, k, t, h, w), n in conv_shapes(preset).items():
        past = k[0] - 1
        win = torch.randn(1, ci, t, h, w, device="cuda", dtype=dt).contiguous(memory_format=torch.channels_last_3d)
        wt = torch.randn(co, ci, *k, device="cuda", dtype=dt).contiguous(memory_format=torch.channels_last_3d) * 0.05
        frames = t - past
        taps = [wt[:, :, i].contiguous(memory_format=torch.channels_last) for i in range(k[0])]

        def c3():
            return F.conv3d(win, wt)

        def c2():
            x = win[0].transpose(0, 1)  # [T', C, H, W]: channels-last 2-D images, a view
            y = F.conv2d(x[0:frames], taps[0])
            for i in range(1, k[0]):
                y = y + F.conv2d(x[i:i + frames], taps[i])
            return y

        ref = c3().float()
        got = c2().float().transpose(0, 1)[None]
        err = float((got - ref).norm() / ref.norm())
        flops = 2 * ci * co * k[0] * k[1] * k[2] * frames * (h - k[1] + 1) * (w - k[2] + 1)
        m3 = time_fn(c3, warmup=3, repeats=a.repeats).median
        m2 = time_fn(c2, warmup=3, repeats=a.repeats).median
        # the implicit GEMM of our own on the same window (wmbook.kernels.window_conv), its best of a few tile shapes
        mt, cfg, terr = float("nan"), "", float("nan")
        if ci % 16 == 0:
            wkc = wk.weight_kc(wt)
            timed = []
            for c in triton_configs(co):
                try:
                    timed.append((time_fn(lambda c=c: wk.window_conv(win, wkc, None, k, config=c), warmup=3,
                                          repeats=a.repeats).median, c))
                except Exception as e:  # noqa: BLE001 -- a tile shape the device cannot hold (shared memory)
                    print(f"  {ci}->{co} {k} config {c}: {type(e).__name__}: {str(e)[:120]}", flush=True)
            if timed:
                mt, c = min(timed)
                cfg = "BM{}xBN{} w{} s{}".format(*c)
            got_t = wk.window_conv(win, wkc, None, k).float()
            terr = float((got_t - ref).norm() / ref.norm())
        # e4m3 tensor cores (window_conv_fp8), the best of the same tile shapes; its error against the bf16 output
        mf, mq, ferr = float("nan"), float("nan"), float("nan")
        if ci % 32 == 0:
            wq, xs = wk.quantize_window_fp8(win)
            kq, ks = wk.weight_nk_fp8(wt)
            timed = []
            for c in triton_configs(co):
                try:
                    timed.append(time_fn(lambda c=c: wk.window_conv_fp8(wq, xs, kq, ks, None, k, config=c),
                                         warmup=3, repeats=a.repeats).median)
                except Exception as e:  # noqa: BLE001 -- a tile shape the device cannot hold (shared memory)
                    print(f"  fp8 {ci}->{co} {k} config {c}: {type(e).__name__}: {str(e)[:120]}", flush=True)
            if timed:
                mf = min(timed)
            mq = time_fn(lambda: wk.quantize_window_fp8(win), warmup=3, repeats=a.repeats).median
            got_f = wk.window_conv_fp8(wq, xs, kq, ks, None, k).float()
            ferr = float((got_f - ref).norm() / ref.norm())
        rows.append({"C_in": ci, "C_out": co, "kernel": "x".join(map(str, k)), "frames": frames,
                     "H": h - 2 * (k[1] // 2), "W": w - 2 * (k[2] // 2), "count": n, "conv3d ms": m3,
                     "3x conv2d ms": m2, "conv3d TFLOP/s": flops / m3 / 1e9, "conv2d TFLOP/s": flops / m2 / 1e9,
                     "rel err": err, "triton ms": mt, "triton TFLOP/s": flops / mt / 1e9, "triton rel err": terr,
                     "triton tile": cfg, "fp8 ms": mf, "fp8 TFLOP/s": flops / mf / 1e9, "fp8 rel err": ferr,
                     "fp8 + quantize ms": mf + mq})
    t = pd.DataFrame(rows)
    t["conv3d ms total"] = t["conv3d ms"] * t["count"]
    t["conv2d ms total"] = t["3x conv2d ms"] * t["count"]
    t["triton ms total"] = t["triton ms"] * t["count"]
    t["fp8 ms total"] = t["fp8 ms"] * t["count"]
    t["fp8 + quantize ms total"] = t["fp8 + quantize ms"] * t["count"]
    best = t[["conv3d ms", "triton ms"]].min(axis=1) * t["count"]
    with pd.option_context("display.width", 250, "display.max_columns", 30, "display.precision", 3):
        print(t.to_string(index=False))
    print(f"per steady latent frame: conv3d {t['conv3d ms total'].sum():.2f} ms, as 2-D convolutions "
          f"{t['conv2d ms total'].sum():.2f} ms, each shape on the faster of cuDNN and the Triton window kernel "
          f"{best.sum():.2f} ms ({torch.cuda.get_device_name()}, {a.dtype}, cudnn.benchmark on); e4m3 where C_in "
          f"allows it (the rest on cuDNN): {(t['fp8 ms total'].fillna(t['conv3d ms total'])).sum():.2f} ms, "
          f"{(t['fp8 + quantize ms total'].fillna(t['conv3d ms total'])).sum():.2f} ms with the windows' quantization")
    if a.psnr_blocks:
        q = pd.DataFrame(decoder_fp8_psnr(preset, a.psnr_blocks, torch.device("cuda")))
        with pd.option_context("display.width", 250, "display.precision", 4):
            print(f"the streaming decoder over {a.psnr_blocks} blocks of seeded latents, against fp32:")
            print(q.to_string(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
