"""Why a compiled forward's wall time can sit far above its GPU busy time: one variant stack, compiled once,
timed plain, inside a CompileMonitor, and after a torch.profiler session (GPU only).

    PYTHONPATH=$PWD python3 tools/host_overhead.py mg2 "tf32,bf16,hygiene,action-attn-fused,compile-regional"

Prints per condition the median forward ms (p20-p80) and the host time of one call returning without a sync.
"""

from __future__ import annotations

import argparse
import json

import torch

from wmbook import workloads
from wmbook.bench import host_launch_ms, time_fn, time_once
from wmbook.errors import command
from wmbook.profiling.breakdown import device_busy_ms
from wmbook.variants import GlobalFlags, resolve
from wmbook.variants.compile_monitor import CompileMonitor
from wmbook.variants.ladder import apply_stack


@command("host_overhead.py")
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("workload", choices=workloads.names())
    ap.add_argument("stack", help="comma-separated variant names")
    ap.add_argument("--preset", default=None)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        ap.error("needs a CUDA device")
    dev = torch.device("cuda")
    names = [n.strip() for n in a.stack.split(",") if n.strip()]
    vs = resolve(names, a.workload, dev)
    wl = workloads.get(a.workload)
    preset = a.preset or wl.real_preset
    ref = wl.reference_pipeline(wl.presets[preset], dev)
    flags = GlobalFlags()
    pipe, _ = apply_stack(ref, a.workload, vs, dev, compile_backend="inductor")
    del ref
    probe = wl.forward_probe(pipe)
    rows = []

    def measure(cond):
        with torch.no_grad():
            tm = time_fn(probe.forward, warmup=3, repeats=a.repeats, device=dev)
            host = host_launch_ms(probe.forward, dev)
        rows.append({"condition": cond, "median_ms": tm.median, "p20": tm.p20, "p80": tm.p80, "host_ms": host})
        print(f"{cond:40s} {tm.median:8.2f} ({tm.p20:.2f}-{tm.p80:.2f})  host {host:.2f} ms", flush=True)

    with torch.no_grad():
        print(f"first call {time_once(probe.forward, dev) / 1e3:.1f} s", flush=True)
    measure("plain")
    with CompileMonitor():
        measure("inside CompileMonitor")
    measure("plain again")
    with torch.no_grad():
        busy = device_busy_ms(probe.forward, dev)
    print(f"GPU busy {busy:.2f} ms", flush=True)
    measure("after a profiler session")
    measure("after a profiler session, again")
    flags.restore()
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"stack": names, "preset": preset, "gpu_busy_ms": busy, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
