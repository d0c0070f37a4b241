"""fp8-static at the DiT's real widths: accuracy of a 2-layer mg2-universal against fp32 (bf16 and fp8-static rows),
then each linear shape of one forward timed alone (CUDA events, median and p20-p80 of --reps after a warm-up): the
bf16 GEMM, the static-scale fp8 linear (input scaled and cast, then torch._scaled_mm) and its GEMM alone.

    PYTHONPATH=$PWD python3 tools/fp8_static_check.py [--tokens 2640] [--reps 50]
"""

from __future__ import annotations

import argparse
import sys

import torch

from wmbook import check, workloads
from wmbook.bench import time_fn
from wmbook.errors import command
from wmbook.variants.fp8_static import FP8, StaticFP8Linear
from wmbook.variants.ladder import apply_stack


@command("fp8_static_check.py")
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=2640, help="rows of each GEMM (mg2-universal: 880 x 3 a block)")
    ap.add_argument("--reps", type=int, default=50)
    a = ap.parse_args(argv)
    dev = torch.device("cuda")
    wl = workloads.get("mg2")
    preset = wl.presets[wl.real_preset].with_(name="mg2-2-layers", num_layers=2)
    pipe = wl.reference_pipeline(preset, dev)
    ref = wl.forward_probe(pipe).forward()
    for stack in (["bf16"], ["bf16", "fp8-static"]):
        p, ctx = apply_stack(pipe, wl, stack, dev)
        err = check.compare(wl.forward_probe(p).forward(), ref, dtype="fp8").rel_l2
        print(f"{' + '.join(stack)}: relative L2 error against fp32 {err:.4f}; {ctx.notes}", flush=True)
        del p
    d, f = preset.dim, preset.ffn_dim
    print(f"\nper linear, {a.tokens} rows, median (p20-p80) ms over {a.reps} after a warm-up")
    total = {"bf16": 0.0, "fp8 static": 0.0, "scaled_mm alone": 0.0}
    for name, (k, n), count in (("q/k/v/o", (d, d), 4), ("ffn up", (d, f), 1), ("ffn down", (f, d), 1)):
        lin = torch.nn.Linear(k, n, device=dev, dtype=torch.bfloat16)
        x = torch.randn(a.tokens, k, device=dev, dtype=torch.bfloat16)
        q = StaticFP8Linear(lin, float(x.abs().amax())).to(dev)
        xq = (x * q.input_inv_scale).clamp(-448, 448).to(FP8)
        sa = q.input_scale.reshape(1, 1).repeat(a.tokens, 1)
        def timed(fn):
            return time_fn(fn, warmup=5, repeats=a.reps, device=dev)

        rows = {"bf16": timed(lambda: lin(x)), "fp8 static": timed(lambda: q(x)),
                "scaled_mm alone": timed(lambda: torch._scaled_mm(xq, q.weight_fp8.t(), scale_a=sa,
                                                                  scale_b=q.weight_scale, bias=q.bias,
                                                                  out_dtype=torch.bfloat16))}
        for key, s in rows.items():
            total[key] += count * s.median
        print(f"  {name:9s} {k}x{n} (x{count} a layer): " + "; ".join(
            f"{key} {s.median:.3f} ({s.p20:.3f}-{s.p80:.3f})" for key, s in rows.items()), flush=True)
    print("  a layer's linears: " + "; ".join(f"{k} {v:.3f} ms" for k, v in total.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
