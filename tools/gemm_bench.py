"""The causal DiT's linear layers at a preset's real shapes, GEMM by GEMM (GPU): cuBLAS (F.linear) against the wave
linear (`wmbook.kernels.wave_linear`: a Triton GEMM with tiles that fill the SMs in whole waves), at its chosen tiles
and at every other tile shape it knows, on the same inputs.

    PYTHONPATH=$PWD python3 tools/gemm_bench.py [--preset mg2-universal] [--repeats 50] [--json gemm.json]

The GEMMs: a block's rows (its latent frames' tokens) through the 1536-wide projections (q, k, v, o of the
self-attention, q and o of the cross-attention), q, k and v as one fused projection, and the feed-forward's two
GEMMs. Each kernel: median (p20-p80) of `repeats` CUDA-event timings after warm-up, and the same call inside a CUDA
graph (GRAPH_CALLS of it captured, replayed back to back: its cost in a captured forward), TFLOP/s, the tile slots
its waves use (wave efficiency: cuBLAS's tiles are not known here, so its row leaves it out), and its error against
fp32 (relative L2; a kernel over bf16's budget is marked and its time does not count).
"""

from __future__ import annotations

import json

import torch
import torch.nn.functional as F

from wmbook.bench import dit_bench_args, time_fn, time_in_graph
from wmbook.check import compare
from wmbook.errors import command
from wmbook.kernels import wave_linear as wl

# a bf16 GEMM's output against fp32: sums in fp32, the output rounded once (2^-9 relative on average); 4e-3 leaves
# room for that and fails a wrong kernel by orders of magnitude
BF16_BUDGET = 4e-3
GRAPH_CALLS = 8  # calls of one kernel per captured graph (time_in_graph)


def gemms(preset) -> list[tuple[str, int, int, int]]:
    """(label, rows M, in K, out N) of the DiT's linear layers for one block at a causal-Wan preset."""
    per_frame = (preset.height // 16) * (preset.width // 16)  # VAE stride 8, patch 2
    m, d = per_frame * preset.num_frame_per_block, preset.dim
    return [("projection (q, k, v, o)", m, d, d), ("fused q, k, v", m, d, 3 * d),
            ("feed-forward up", m, d, preset.ffn_dim), ("feed-forward down", m, preset.ffn_dim, d)]


def _row(label, kernel, fn, want, flops, repeats, dev, tiles=None, m=0, n=0):
    rel = compare(fn(), want).rel_l2
    t = time_fn(fn, warmup=5, repeats=repeats, device=dev)
    row = {"gemm": label, "kernel": kernel, "median_ms": t.median, "p20": t.p20, "p80": t.p80,
           "tflops": flops / t.median / 1e9, "rel_l2_vs_fp32": rel, "gate": "pass" if rel < BF16_BUDGET else "fail"}
    if tiles is not None:
        row["wave_efficiency"] = wl.wave_efficiency(m, n, tiles[0], tiles[1], wl.sm_count(dev))
    g = time_in_graph(fn, GRAPH_CALLS, device=dev)
    if g is not None:
        row |= {"graph_ms": g.median, "graph_p20": g.p20, "graph_p80": g.p80, "graph_tflops": flops / g.median / 1e9}
    return row


def bench_gemm(label: str, m: int, k: int, n: int, gen: torch.Generator, repeats: int, dev: torch.device) -> list:
    """One GEMM's rows: cuBLAS, the wave linear at its chosen tiles, then at each other tile shape."""
    x = torch.randn(m, k, generator=gen, device=dev).to(torch.bfloat16)
    w = (torch.randn(n, k, generator=gen, device=dev) / k ** 0.5).to(torch.bfloat16)
    b = torch.randn(n, generator=gen, device=dev).to(torch.bfloat16)
    want = F.linear(x.float(), w.float(), b.float())
    flops = 2.0 * m * k * n
    chosen = wl.choose_tiles(m, n, wl.sm_count(dev))
    rows = [_row(label, "cuBLAS (F.linear)", lambda: F.linear(x, w, b), want, flops, repeats, dev)]
    for t in (chosen, *(t for t in wl.TILES if t != chosen)):
        name = f"wave {t[0]}x{t[1]}x{t[2]} w{t[3]} s{t[4]}" + (" (chosen)" if t == chosen else "")
        try:
            rows.append(_row(label, name, lambda t=t: wl.wave_linear(x, w, b, tiles=t), want, flops, repeats, dev,
                             tiles=t, m=m, n=n))
        except Exception as e:  # noqa: BLE001 - a tile shape this GPU or Triton refuses is a row with its reason
            rows.append({"gemm": label, "kernel": name, "error": f"{type(e).__name__}: {str(e)[:200]}"})
    return rows


@command("gemm_bench.py")
def main(argv=None) -> int:
    a, p, dev = dit_bench_args(__doc__, argv)
    gen = torch.Generator(device=dev).manual_seed(0)
    rows = []
    print(f"{torch.cuda.get_device_name()} ({wl.sm_count(dev)} SMs), torch {torch.__version__}, preset {a.preset}, "
          f"bf16, bias in the epilogue", flush=True)
    for label, m, k, n in gemms(p):
        for r in bench_gemm(label, m, k, n, gen, a.repeats, dev):
            rows.append(r)
            head = f"{label} [{m}x{k}] x [{k}x{n}]"
            if "error" in r:
                print(f"{head:42s} {r['kernel']:32s} not run: {r['error']}", flush=True)
                continue
            graph = (f" | in a graph {r['graph_ms']:.4f} ms ({r['graph_p20']:.4f}-{r['graph_p80']:.4f})"
                     f" {r['graph_tflops']:6.1f} TFLOP/s" if "graph_ms" in r else "")
            waves = f" waves {r['wave_efficiency']:.2f}" if "wave_efficiency" in r else ""
            print(f"{head:42s} {r['kernel']:32s} {r['median_ms']:8.4f} ms ({r['p20']:.4f}-{r['p80']:.4f})"
                  f" {r['tflops']:7.1f} TFLOP/s{graph}{waves}  rel {r['rel_l2_vs_fp32']:.2e} {r['gate']}", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "preset": a.preset,
                       "repeats": a.repeats, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
