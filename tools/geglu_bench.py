"""The wma UNet's GEGLU feed-forwards at the preset's real shapes (GPU): the projection by cuBLAS then value x
GELU(gate) as inductor fuses it (what notebook 06's compiled stack runs) against `wmbook.kernels.geglu_linear` (one
Triton GEMM with the GELU and the product in its epilogue) at each of its tiles, on the same inputs.

    PYTHONPATH=$PWD python3 tools/geglu_bench.py [--preset wma] [--repeats 30] [--json geglu.json]

The shapes: one feed-forward per attention level of the UNet (a pass's frames' tokens at that level; the spatial and
the temporal transformers' feed-forwards have the same rows and widths). Each kernel: median (p20-p80) of the call
inside a CUDA graph (several calls captured, replayed back to back: its cost in a captured forward), and its error
against the fp32 reference (relative L2); a kernel over bf16's budget is marked and its time does not count.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from wmbook import presets
from wmbook.bench import spin_up, time_in_graph
from wmbook.check import compare
from wmbook.kernels import geglu_linear as gl

BF16_BUDGET = 4e-3  # a bf16 output against fp32: sums in fp32, the output rounded once (2^-9 on average)


def shapes(preset) -> list[tuple[str, int, int, int]]:
    """(label, rows M, in K, value width N) of the feed-forward at each attention level."""
    h, w = preset.latent_hw
    out = []
    for level, mult in enumerate(preset.channel_mult):
        ds = 2 ** level
        if ds not in preset.attention_resolutions:
            continue
        dim = preset.model_channels * mult
        m = preset.frames * (h // ds) * (w // ds)
        out.append((f"level {level} ({h // ds}x{w // ds} x {preset.frames} frames)", m, dim, 4 * dim))
    return out


def unfused(x, weight, bias):
    value, gate = F.linear(x, weight, bias).chunk(2, dim=-1)
    return value * F.gelu(gate)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="wma", choices=sorted(presets.WMA_PRESETS))
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.repeats < 1:
        ap.error(f"--repeats={args.repeats} is not allowed; allowed values: an integer >= 1")
    if not torch.cuda.is_available():
        print("geglu_bench: needs a CUDA device", file=sys.stderr)
        return 2
    preset = presets.get_preset(args.preset)
    dev = torch.device("cuda")
    compiled = torch.compile(unfused)
    rows = []
    gen = torch.Generator(device=dev).manual_seed(0)
    for label, m, k, n in shapes(preset):
        x = torch.randn(m, k, device=dev, generator=gen).bfloat16()
        weight = (torch.randn(2 * n, k, device=dev, generator=gen) / k ** 0.5).bfloat16()
        bias = (torch.randn(2 * n, device=dev, generator=gen) * 0.1).bfloat16()
        ref = gl.geglu_linear_ref(x.float(), weight.float(), bias.float())
        kernels = {"cuBLAS + inductor's GELU x value": lambda: compiled(x, weight, bias)}
        for tiles in gl.TILES:
            label_t = f"geglu_linear {tiles}" + (" (default)" if tiles == gl.TILES[0] else "")
            kernels[label_t] = (lambda t=tiles: gl.geglu_linear(x, weight, bias, tiles=t))
        floor_bytes = gl.geglu_linear_bytes(x, weight, bias)
        for name, fn in kernels.items():
            err = compare(fn().float(), ref).rel_l2
            spin_up(dev)
            s = time_in_graph(fn, 8, rounds=args.repeats, device=dev)
            flops = 2 * m * k * 2 * n
            row = {"shape": label, "M": m, "K": k, "N": n, "kernel": name, "ms": s.median, "p20": s.p20,
                   "p80": s.p80, "tflops": flops / s.median / 1e9, "rel_l2": err, "within_budget": err <= BF16_BUDGET,
                   "floor_bytes": floor_bytes}
            rows.append(row)
            mark = "" if row["within_budget"] else "  OVER BUDGET (time does not count)"
            print(f"{label:38s} {name:40s} {s.median * 1e3:8.1f} us ({s.p20 * 1e3:.1f}-{s.p80 * 1e3:.1f}) "
                  f"{row['tflops']:6.0f} TFLOP/s  rel-L2 {err:.2e}{mark}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
