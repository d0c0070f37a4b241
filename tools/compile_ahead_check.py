"""Whether the stacks compiled ahead (wmbook.variants.compile_ahead) are read from the cache by the process that then
compiles them, as a ladder's rows do: the stacks compiled side by side in processes of their own, into an empty cache,
then each applied here and its first forward timed, with inductor's cache counters.

    PYTHONPATH=$PWD python3 tools/compile_ahead_check.py wma tiny-wma bf16,channels-last,compile-whole \
        bf16,channels-last,triton-fused,compile-whole

A stack whose `fxgraph_cache_miss` is above 0 compiled again here: the processes' graphs were not this process's.
Inductor on a CPU compiles C++ (minutes for the tiny UNet on 2 cores); on a GPU the real presets. --json PATH also
writes the numbers. The cache is a temporary folder, removed at the end.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from wmbook import workloads
from wmbook.atomic import atomic_write_text
from wmbook.errors import command
from wmbook.variants import compile_ahead as ca
from wmbook.variants import resolve
from wmbook.variants.compile import inductor_cache_dir, reset_compile_state
from wmbook.variants.ladder import apply_stack


@command("compile_ahead_check.py")
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("workload", choices=workloads.names())
    ap.add_argument("preset")
    ap.add_argument("stacks", nargs="+", help="comma-separated variant names, one argument a stack")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    from torch._dynamo.utils import counters  # noqa: PLC0415

    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    wl = workloads.get(a.workload)
    if a.preset not in wl.presets:
        ap.error(f"preset={a.preset!r} is not allowed; allowed values: {sorted(wl.presets)}")
    stacks = [[n.strip() for n in s.split(",") if n.strip()] for s in a.stacks]
    for s in stacks:  # unknown names fail here, before any process starts
        resolve(s, wl, dev)
    out = {"workload": a.workload, "preset": a.preset, "device": str(dev), "stacks": []}
    with inductor_cache_dir():  # an empty one, which the processes inherit
        t = time.perf_counter()
        ahead = ca.compile_ahead(wl, a.preset, stacks, dev, processes=len(stacks), backend="inductor")
        out["ahead_s"], out["ahead"] = time.perf_counter() - t, ahead.runs
        print(f"{ahead.summary()}; wall {out['ahead_s']:.1f} s", flush=True)
        ref = wl.reference_pipeline(wl.presets[a.preset], dev, 0)
        for s in stacks:
            reset_compile_state()  # only the on-disk cache carries over, as between two ladder rows
            counters.clear()
            pipe, _ = apply_stack(ref, wl, s, dev, "inductor")
            probe = wl.forward_probe(pipe, 0)
            t = time.perf_counter()
            with torch.no_grad():
                probe.forward()
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            first = time.perf_counter() - t
            inductor = {k: int(v) for k, v in counters["inductor"].items() if k.startswith("fxgraph_cache")}
            out["stacks"].append({"stack": s, "first_call_s": first, **inductor})
            print(f"{','.join(s)}: first call {first:.1f} s here ({ahead.first_call_s(s):.1f} s in its process); "
                  + ", ".join(f"{k} {v}" for k, v in sorted(inductor.items())), flush=True)
            del pipe, probe
    if a.json:  # whole or not at all
        atomic_write_text(a.json, json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
