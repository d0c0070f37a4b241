"""fp8-static at the DiT's real widths: accuracy of a 2-layer mg2-universal against fp32 (bf16 and fp8-static rows),
then each linear shape of one forward timed alone (CUDA events, median and p20-p80 of --reps after a warm-up): the
bf16 GEMM, the static-scale fp8 linear (input scaled and cast, then torch._scaled_mm) and its GEMM alone.

    PYTHONPATH=$PWD python3 tools/fp8_static_check.py [--tokens 2640] [--reps 50]
"""

from __future__ import annotations

import argparse
import sys

import torch

from wmbook import workloads
from wmbook.bench import Samples
from wmbook.errors import command
from wmbook.variants.fp8_static import FP8, StaticFP8Linear
from wmbook.variants.ladder import apply_stack


def _flat(out) -> torch.Tensor:
    if isinstance(out, torch.Tensor):
        return out.float().flatten()
    if isinstance(out, (list, tuple)):
        return torch.cat([_flat(x) for x in out])
    return torch.cat([_flat(getattr(out, f)) for f in out.__dataclass_fields__
                      if isinstance(getattr(out, f), (torch.Tensor, list, tuple))])


def _time(fn, reps: int) -> Samples:
    for _ in range(5):
        fn()
    s = Samples(unit="ms")
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        s.values.append(a.elapsed_time(b))
    return s


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
    ref = _flat(wl.forward_probe(pipe).forward())
    for stack in (["bf16"], ["bf16", "fp8-static"]):
        p, ctx = apply_stack(pipe, wl, stack, dev)
        err = ((_flat(wl.forward_probe(p).forward()) - ref).norm() / ref.norm()).item()
        print(f"{' + '.join(stack)}: relative L2 error against fp32 {err:.4f}; {ctx.notes}", flush=True)
        del p
    d, f = preset.dim, preset.ffn_dim
    print(f"\nper linear, {a.tokens} rows, median (p20-p80) ms over {a.reps} after a warm-up")
    total = {"bf16": 0.0, "fp8 static": 0.0, "scaled_mm alone": 0.0}
    for name, (k, n), count in (("q/k/v/o", (d, d), 4), ("ffn up", (d, f), 1), ("ffn down", (f, d), 1)):
        lin = torch.nn.Linear(k, n, device=dev, dtype=torch.bfloat16)
        x = torch.randn(a.tokens, k, device=dev, dtype=torch.bfloat16)
        q = StaticFP8Linear(lin, float(x.abs().amax())).to(dev)
        xq = (x * q.input_inv_scale.to(x.dtype)).clamp(-448, 448).to(FP8)
        sa = q.input_scale.reshape(1, 1).repeat(a.tokens, 1)
        rows = {"bf16": _time(lambda: lin(x), a.reps), "fp8 static": _time(lambda: q(x), a.reps),
                "scaled_mm alone": _time(lambda: torch._scaled_mm(xq, q.weight_fp8.t(), scale_a=sa,
                                                                  scale_b=q.weight_scale, bias=q.bias,
                                                                  out_dtype=torch.bfloat16), a.reps)}
        for key, s in rows.items():
            total[key] += count * s.median
        print(f"  {name:9s} {k}x{n} (x{count} a layer): " + "; ".join(
            f"{key} {s.median:.3f} ({s.p20:.3f}-{s.p80:.3f})" for key, s in rows.items()), flush=True)
    print("  a layer's linears: " + "; ".join(f"{k} {v:.3f} ms" for k, v in total.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
