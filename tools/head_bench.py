"""How much GPU time do the wma action and state heads take, and does `head-conv-gemm` (their 1-D convolutions as
GEMMs) cut it? Notebook 02 at c045e2c (H100, eager bf16) put 16.1 ms of a 98 ms UNet forward in UNet_Action_Head,
11.1 ms of it convolution, for about 0.3 TFLOP (wmbook.models.wma.flops): tens of times its FLOP and weight-read
floors. torch.compile keeps cuDNN for convolutions, so the compiled, captured forward of notebook 06 likely pays it too.

On one GPU at a wma preset: the two heads of notebook 04's layout stack (bf16, channels-last, cuDNN benchmark; no
torch.compile of the whole UNet, which takes minutes) with and without head-conv-gemm, each eager and with each head
compiled; per row the heads' GPU time (CUDA-graph replays, the L2 flushed: notebook 05's timing, median and p20-p80),
their relative L2 against the fp32 heads on the same inputs, and the top kernels of one eager call by device time.
Then the whole UNet forward's GPU time for the layout stack, + head-conv-gemm, + triton-fused (its GroupNorm + SiLU
and temporal-attention kernels), + both, each gated by its relative L2 against the fp32 reference forward.

    PYTHONPATH=$PWD python3 tools/head_bench.py --out /tmp/head_bench.csv
"""

from __future__ import annotations

import argparse
import sys

import pandas as pd
import torch

from wmbook import check, workloads
from wmbook.errors import command
from wmbook.variants.ladder import apply_stack

LAYOUT = ["tf32", "bf16", "norm-input-dtype", "channels-last", "temporal-channels-last", "cudnn-benchmark"]


def head_inputs(wl, pipe) -> dict:
    """{head name: its positional arguments} of one forward probe (the inputs the UNet hands each head)."""
    from wmbook.models.wma.action_head import ConditionalUnet1D

    seen, hooks = {}, []
    for name, m in pipe.model.named_modules():
        if isinstance(m, ConditionalUnet1D):
            hooks.append(m.register_forward_pre_hook(lambda mod, args, name=name: seen.__setitem__(name, args)))
    try:
        with torch.no_grad():
            wl.forward_probe(pipe).forward()
    finally:
        for h in hooks:
            h.remove()
    return seen


def _cast(args, dtype):
    """The floating tensors of `args` (and of its lists: the UNet features) in `dtype`."""
    def one(a):
        if isinstance(a, list):
            return [one(t) for t in a]
        return a.to(dtype) if torch.is_tensor(a) and a.is_floating_point() else a
    return tuple(one(a) for a in args)


def top_kernels(fn, n: int = 8) -> pd.DataFrame:
    """The `n` kernels of one call of fn with the most device time (wmbook.profiling's trace and kernel summary)."""
    from wmbook.profiling import profile_calls
    from wmbook.profiling.analysis.kernels import kernel_summary

    fn()
    return kernel_summary(profile_calls(fn), top=n)["kernels"]


@command("head_bench.py")
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="wma")
    ap.add_argument("--rep-ms", type=float, default=300.0)
    ap.add_argument("--no-compile", action="store_true", help="leave out the compiled rows")
    ap.add_argument("--no-forward", dest="forward", action="store_false",
                    help="leave out the whole-forward rows (layout stack, + head-conv-gemm, + triton-fused, + both)")
    ap.add_argument("--out", default=None, help="CSV path")
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("head_bench needs a CUDA device", file=sys.stderr)
        return 2
    from wmbook.studies.kernels import _bench

    dev = torch.device("cuda")
    wl = workloads.get("wma")
    ref = wl.reference_pipeline(wl.presets[a.preset], dev)
    ref_heads = {n: m for n, m in ref.model.named_modules() if type(m).__name__ == "ConditionalUnet1D"}
    rows = []
    for label, stack in (("cuDNN (layout stack)", LAYOUT), ("head-conv-gemm", LAYOUT + ["head-conv-gemm"])):
        pipe, ctx = apply_stack(ref, wl, stack, dev)
        inputs = head_inputs(wl, pipe)
        heads = {n: m for n, m in pipe.model.named_modules() if n in inputs}
        with torch.no_grad():
            want = {n: ref_heads[n](*_cast(inputs[n], torch.float32)) for n in inputs}
        for compiled in ((False,) if a.no_compile else (False, True)):
            run = {n: (torch.compile(m) if compiled else m) for n, m in heads.items()}

            @torch.no_grad()
            def both():
                return [run[n](*inputs[n]) for n in inputs]

            got = dict(zip(inputs, both()))
            rel = max(check.compare(got[n], want[n]).rel_l2 for n in inputs)
            med, p20, p80, how = _bench(both, a.rep_ms, dev)
            rows.append({"heads": label, "compiled": compiled, "GPU ms": med, "p20": p20, "p80": p80,
                         "rel_l2 vs fp32": rel, "timing": how, "note": ctx.notes.get("head-conv-gemm", "")})
            if not compiled:
                print(f"\ntop kernels, {label}, eager:")
                print(top_kernels(both).to_string(index=False))
        del pipe
        torch.cuda.empty_cache()
    df = pd.DataFrame(rows)
    print(f"\n{torch.cuda.get_device_name(dev)}, torch {torch.__version__}, preset {a.preset}: both heads of one UNet "
          f"forward")
    print(df.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    fwd = forward_rows(wl, ref, dev, a.rep_ms) if a.forward else pd.DataFrame()
    if len(fwd):
        print("\nthe whole UNet forward (GPU time, eager stacks captured in a graph; no torch.compile):")
        print(fwd.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    if a.out:
        pd.concat([df.assign(part="heads"), fwd.assign(part="forward")], ignore_index=True).to_csv(a.out, index=False)
    return 0


def forward_rows(wl, ref, dev, rep_ms: float) -> pd.DataFrame:
    """The whole UNet forward (both heads) of the layout stack, + head-conv-gemm, + triton-fused (the GroupNorm + SiLU
    and temporal-attention kernels), + both: GPU ms per forward as graph replays with the L2 flushed, and the
    forward's relative L2 against the fp32 reference's."""
    from wmbook.studies.kernels import _bench

    with torch.no_grad():
        want = wl.forward_probe(ref).forward()
    rows = []
    for label, extra in (("layout stack", []), ("+ head-conv-gemm", ["head-conv-gemm"]),
                         ("+ triton-fused", ["triton-fused"]), ("+ both", ["triton-fused", "head-conv-gemm"])):
        pipe, _ = apply_stack(ref, wl, LAYOUT + extra, dev)
        probe = wl.forward_probe(pipe)
        with torch.no_grad():
            rel = max(check.compare(g, w).rel_l2 for g, w in zip(probe.forward(), want))
            med, p20, p80, how = _bench(probe.forward, rep_ms, dev)
        rows.append({"forward": label, "GPU ms": med, "p20": p20, "p80": p80, "rel_l2 vs fp32": rel, "timing": how})
        del pipe, probe
        torch.cuda.empty_cache()
    return pd.DataFrame(rows)


if __name__ == "__main__":
    sys.exit(main())
