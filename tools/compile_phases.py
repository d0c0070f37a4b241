"""Where a cold compile's time goes: one variant stack of a workload compiled in an empty compile cache, its first
forward timed, and torch's own account of the compile split by phase (dynamo's tracing, AOTAutograd, inductor's
lowering and code generation, the Triton kernels' compilation), with inductor's counters.

    PYTHONPATH=$PWD python3 tools/compile_phases.py wma \
        "tf32,bf16,norm-input-dtype,channels-last,temporal-channels-last,cudnn-benchmark,compile-whole"

The first forward is timed twice over: with an empty cache (cold) and again after the in-process compile state is
reset, with the on-disk cache it filled (warm: what a later run of the same stack pays). The cache is a temporary
folder, removed at the end. --json PATH also writes the numbers.
"""

from __future__ import annotations

import argparse
import json

import torch

from wmbook import workloads
from wmbook.atomic import atomic_write_text
from wmbook.bench import time_once
from wmbook.errors import command
from wmbook.variants import resolve
from wmbook.variants.compile import inductor_cache_dir, reset_compile_state
from wmbook.variants.ladder import apply_stack


def _phases() -> dict[str, float]:
    """torch._dynamo's cumulative seconds per compile function (every function it times), largest first."""
    from torch._dynamo.utils import compilation_time_metrics  # noqa: PLC0415

    return dict(sorted(((k, float(sum(v))) for k, v in compilation_time_metrics.items()), key=lambda kv: -kv[1]))


@command("compile_phases.py")
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("workload", choices=workloads.names())
    ap.add_argument("stack", help="comma-separated variant names (one of them a compile variant)")
    ap.add_argument("--preset", default=None, help="default: the workload's real-shape preset")
    ap.add_argument("--no-warm", action="store_true", help="skip the warm (filled cache) compile")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    wl = workloads.get(a.workload)
    preset = a.preset or (wl.real_preset if dev.type == "cuda" else next(iter(wl.presets)))
    names = [n.strip() for n in a.stack.split(",") if n.strip()]
    resolve(names, wl, dev)  # unknown names fail here, before any model is built
    ref = wl.reference_pipeline(wl.presets[preset], dev)
    out = {"workload": a.workload, "preset": preset, "stack": names, "device": str(dev)}
    from torch._dynamo.utils import compilation_time_metrics, counters  # noqa: PLC0415

    with inductor_cache_dir():  # an empty one, for this run only
        for phase in ("cold",) + (() if a.no_warm else ("warm",)):
            reset_compile_state()  # only the on-disk cache carries over to the warm compile
            compilation_time_metrics.clear()
            counters.clear()
            pipe, _ = apply_stack(ref, wl, names, dev,
                                  compile_backend="inductor" if dev.type == "cuda" else "aot_eager")
            probe = wl.forward_probe(pipe)
            with torch.no_grad():
                first = time_once(probe.forward, dev) / 1e3
            phases = _phases()
            inductor = {k: int(v) for k, v in counters["inductor"].items()}
            out[phase] = {"first_call_s": first, "phases_s": phases, "inductor_counters": inductor}
            print(f"{phase}: first call {first:.1f} s", flush=True)
            for k, v in list(phases.items())[:14]:
                print(f"  {v:8.1f} s  {k}")
            print("  inductor: " + ", ".join(f"{k} {v}" for k, v in sorted(inductor.items()) if v)[:600], flush=True)
            del pipe, probe
    if a.json:  # whole or not at all
        atomic_write_text(a.json, json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
