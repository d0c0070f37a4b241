"""The wma world-model pass's decode alone: a pass's latent frames decoded as one batch (what `vae-batch-frames` calls)
by decoder stacks side by side, against the fp32 decoder's frames and the decode's FLOP floor.

    PYTHONPATH=$PWD python3 tools/frame_decode_bench.py --rounds 10 --kernels 12 --json decode.json
    python3 tools/frame_decode_bench.py --stack "mine=cudnn-benchmark,vae-decoder-bf16,vae-compile" --stack ...

Default stacks: the bf16 decoder compiled and captured, without and with `vae-upsample-fold`,
then with its GroupNorm + SiLU pairs as our Triton kernels too (`vae-triton-fused`, inside the compiled step), then
with each of those kernels adding the bias of the convolution before it (`vae-norm-conv-bias`: notebook 06's decoder).
Every stack decodes the same seeded latents; `--warmup` calls (compile, capture) are not timed, then the stacks take
turns, `--rounds` calls each, timed with device events. Medians with p20-p80; one more call of each stack profiled for
its kernels by category. The floors count the reference decoder's FLOPs: a stack that computes fewer (the fold) can
pass 100% of the convolutions' floor.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import torch

from wmbook import device as wdev
from wmbook import variants, workloads
from wmbook.bench import DeviceTimer, Samples
from wmbook.check import compare
from wmbook.errors import command
from wmbook.profiling.analysis import kernels
from wmbook.profiling.collect import profile_calls

BASE = "cudnn-benchmark,vae-decoder-bf16"
DEFAULT_STACKS = (f"bf16 decoder, compiled, captured={BASE},vae-compile,vae-cuda-graphs",
                  f"+ vae-upsample-fold={BASE},vae-upsample-fold,vae-compile,vae-cuda-graphs",
                  f"+ vae-triton-fused={BASE},vae-upsample-fold,vae-triton-fused,vae-compile,vae-cuda-graphs",
                  f"+ vae-norm-conv-bias={BASE},vae-upsample-fold,vae-triton-fused,vae-norm-conv-bias,vae-compile,"
                  "vae-cuda-graphs",
                  f"+ vae-attn-gemm={BASE},vae-upsample-fold,vae-triton-fused,vae-norm-conv-bias,vae-attn-gemm,"
                  "vae-compile,vae-cuda-graphs")


@command("frame_decode_bench.py")
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="wma")
    ap.add_argument("--frames", type=int, default=None, help="frames of the batch (default: the preset's pass)")
    ap.add_argument("--stack", type=variants.parse_labelled_stack, action="append", help="LABEL=variants (repeatable)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--kernels", type=int, default=0, metavar="N", help="print each stack's N longest kernels")
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args(argv)
    wl = workloads.get("wma")
    if a.preset not in wl.presets:
        ap.error(f"--preset {a.preset!r} is not allowed; allowed values: {sorted(wl.presets)}")
    if a.warmup < 0 or a.rounds < 1 or (a.frames is not None and a.frames < 1):
        ap.error("--warmup must be >= 0, --rounds >= 1, --frames >= 1")
    stacks = dict(a.stack or [variants.parse_labelled_stack(s) for s in DEFAULT_STACKS])
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    resolved = {k: variants.resolve(v, wl, dev) for k, v in stacks.items()}  # every name checked before the work
    preset = wl.presets[a.preset]
    frames = a.frames or preset.frames
    ceilings = wdev.measure_ceilings(dev, quick=dev.type != "cuda")
    ref = wl.reference_pipeline(preset, dev)
    lat = torch.randn(frames, preset.latent_channels, *preset.latent_hw,
                      generator=torch.Generator().manual_seed(0)).to(dev)
    with torch.no_grad():
        want = wl.decoder_bench(ref).decode_step(lat).float()  # the fp32 decoder, eager
    benches = {}
    for label, vs in resolved.items():
        bench = wl.decoder_bench(ref)
        ctx = variants.VariantContext(workload=wl, device=dev)
        for v in vs:
            v.apply(bench, ctx)
        benches[label] = (bench, ctx)
    del ref
    times = {k: [] for k in benches}
    out = {}
    with torch.no_grad():
        for label, (bench, _) in benches.items():
            for _ in range(a.warmup):
                bench.decode_step(lat)
            out[label] = compare(bench.decode_step(lat).float(), want, dtype="fp32", frames=True).psnr
        for _ in range(a.rounds):
            for label, (bench, _) in benches.items():
                timer = DeviceTimer(dev)
                timer.mark("start")
                bench.decode_step(lat)
                timer.mark("end")
                times[label].append(timer.elapsed_ms("start", "end"))
    flops = wl.decoder_flops(preset)
    fl = wdev.floor_ms(flops["steady_block"] * frames, ceilings) if ceilings.get("gemm_tflops") else math.nan
    conv_fl = wdev.floor_ms(flops["steady_block_conv"] * frames, ceilings) if ceilings.get("gemm_tflops") else math.nan
    print(f"{ceilings.get('device_name', dev)} | {preset.name} | {frames} frames a call | FLOP floor {fl:.3g} ms "
          f"(convolutions {conv_fl:.3g})")
    report = {"device": ceilings.get("device_name", str(dev)), "preset": preset.name, "frames": frames,
              "floor_ms": fl, "conv_floor_ms": conv_fl, "stacks": {}}
    for label, (bench, ctx) in benches.items():
        s = Samples(times[label], "ms")
        row = {"stack": stacks[label], "median_ms": s.median, "p20_ms": s.p20, "p80_ms": s.p80,
               "ms_per_frame": s.median / frames, "psnr_db_vs_fp32": out[label], "x_floor": s.median / fl,
               "notes": "; ".join(str(x) for x in ctx.notes.values())}
        with torch.no_grad():
            tr = profile_calls(lambda b=bench: b.decode_step(lat), dev)
        if tr is not None:
            acc = kernels.kernel_account(tr, top=max(a.kernels, 1))
            row["gpu_busy_ms"], row["categories_ms"] = acc["gpu_busy_ms"], acc["categories_ms"]
            conv = row["categories_ms"].get("convolution", math.nan)
            row["conv_pct_of_floor"] = 100 * conv_fl / conv if conv == conv and conv > 0 else math.nan
        report["stacks"][label] = row
        busy, conv = row.get("gpu_busy_ms", math.nan), row.get("categories_ms", {}).get("convolution", math.nan)
        print(f"{label}: {s.median:.2f} ms ({s.p20:.2f}-{s.p80:.2f}), {row['ms_per_frame']:.3f} ms a frame, "
              f"{row['x_floor']:.2f}x floor, {out[label]:.2f} dB vs fp32; GPU busy {busy:.2f} ms, conv {conv:.2f} ms "
              f"({row.get('conv_pct_of_floor', math.nan):.0f}% of its floor)")
        if tr is not None:
            print(kernels.format_account(acc, top_kernels=a.kernels > 0))
    if a.json:
        a.json.write_text(json.dumps(report, indent=1, default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main())
