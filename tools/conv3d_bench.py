"""Is the streaming Wan decoder's time its 3-D convolutions' algorithm choice? Every causal convolution of one steady
latent frame (shapes recorded on meta tensors with vae-stream-buffers), timed as cuDNN's conv3d on the channels-last
input window against the same arithmetic as three 2-D convolutions over the window's frames (a channels-last 3-D
window's frames are channels-last 2-D images: no copy) summed, and as our Triton implicit GEMM on the same window
(wmbook.kernels.window_conv, the best of a few tile shapes), at the achieved TFLOP/s.

    PYTHONPATH=$PWD python3 tools/conv3d_bench.py --preset mg2-universal --dtype bf16
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


@command("conv3d_bench.py")
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="mg2-universal")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"])
    ap.add_argument("--repeats", type=int, default=20)
    a = ap.parse_args(argv)
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
        rows.append({"C_in": ci, "C_out": co, "kernel": "x".join(map(str, k)), "frames": frames,
                     "H": h - 2 * (k[1] // 2), "W": w - 2 * (k[2] // 2), "count": n, "conv3d ms": m3,
                     "3x conv2d ms": m2, "conv3d TFLOP/s": flops / m3 / 1e9, "conv2d TFLOP/s": flops / m2 / 1e9,
                     "rel err": err, "triton ms": mt, "triton TFLOP/s": flops / mt / 1e9, "triton rel err": terr,
                     "triton tile": cfg})
    t = pd.DataFrame(rows)
    t["conv3d ms total"] = t["conv3d ms"] * t["count"]
    t["conv2d ms total"] = t["3x conv2d ms"] * t["count"]
    t["triton ms total"] = t["triton ms"] * t["count"]
    best = t[["conv3d ms", "triton ms"]].min(axis=1) * t["count"]
    with pd.option_context("display.width", 250, "display.max_columns", 30, "display.precision", 3):
        print(t.to_string(index=False))
    print(f"per steady latent frame: conv3d {t['conv3d ms total'].sum():.2f} ms, as 2-D convolutions "
          f"{t['conv2d ms total'].sum():.2f} ms, each shape on the faster of cuDNN and the Triton window kernel "
          f"{best.sum():.2f} ms ({torch.cuda.get_device_name()}, {a.dtype}, cudnn.benchmark on)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
