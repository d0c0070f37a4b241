"""Interleaved timing of several variant stacks of one workload in one process (GPU): which is faster, with
the host noise of the machine spread evenly over all of them.

    PYTHONPATH=$PWD python3 tools/compare_compile.py mg2 "bf16,hygiene" "bf16,hygiene,compile-regional" \
        "bf16,hygiene,compile-whole" [--rounds 5 --repeats 10]

Each stack is applied to its own copy of the fp32 reference and warmed up (compiled); then `rounds` rounds
time every stack's steady forward (`repeats` CUDA-event timings each, after 2 warm-up calls), in turn. Prints
per stack the median of all timings with p20-p80, the GPU busy time of one forward and host launch time
(the forward's return without a sync), as a table; --json PATH also writes it.
"""

from __future__ import annotations

import argparse
import json

import torch

from wmbook import workloads
from wmbook.bench import Samples, host_launch_ms, time_fn, time_once
from wmbook.errors import command
from wmbook.profiling.breakdown import kernel_summary, profile_calls
from wmbook.variants import GlobalFlags, mixed_cudnn_search, resolve
from wmbook.variants.ladder import apply_stack


@command("compare_compile.py")
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("workload", choices=workloads.names())
    ap.add_argument("stacks", nargs="+", help="comma-separated variant names, one stack per argument")
    ap.add_argument("--preset", default=None, help="default: the workload's real-shape preset")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--json", default=None)
    ap.add_argument("--kernels", type=int, default=0, metavar="N",
                    help="also profile one forward per stack and print its N longest kernels, categories, labels")
    a = ap.parse_args(argv)
    stacks = [[n.strip() for n in s.split(",") if n.strip()] for s in a.stacks]
    if why := mixed_cudnn_search(stacks):
        ap.error(f"stacks: {why}")
    if not torch.cuda.is_available():
        ap.error("needs a CUDA device")
    dev = torch.device("cuda")
    wl = workloads.get(a.workload)
    preset = a.preset or wl.real_preset
    for s in stacks:
        resolve(s, wl, dev)  # unknown names fail here, before any model is built
    ref = wl.reference_pipeline(wl.presets[preset], dev)
    flags = GlobalFlags()
    probes = []
    for s in stacks:
        pipe, _ = apply_stack(ref, wl, s, dev, compile_backend="inductor")
        probe = wl.forward_probe(pipe)
        with torch.no_grad():
            first_s = time_once(probe.forward, dev) / 1e3
        print(f"{'+'.join(s)}: first call {first_s:.1f} s", flush=True)
        probes.append((pipe, probe))
    # process-wide flags (TF32, attention backend, recompile limit) set by any stack stay on for all of them:
    # compare stacks that differ in per-model transforms (precision, hygiene, layout, compile)
    times = [[] for _ in stacks]
    with torch.no_grad():
        for _ in range(a.rounds):
            for i, (_, probe) in enumerate(probes):
                times[i] += time_fn(probe.forward, warmup=2, repeats=a.repeats, device=dev).values
        rows = []
        for s, (_, probe), ts in zip(stacks, probes, times):
            host = host_launch_ms(probe.forward, dev)
            tm = Samples(ts, "ms")
            # one profiled pair of forwards: the busy time and (with --kernels) where it goes
            ks = kernel_summary(profile_calls(probe.forward, dev, calls=2), calls=2, top=max(a.kernels, 1))
            row = {"stack": "+".join(s), "median_ms": tm.median, "p20": tm.p20, "p80": tm.p80, "n": tm.n,
                   "gpu_busy_ms": ks["categories"].attrs["busy_ms"], "host_launch_ms": host}
            if a.kernels:
                row.update({k: v.to_dict("records") for k, v in ks.items()})
                print(f"--- {row['stack']}: kernels per forward", flush=True)
                for k, v in ks.items():
                    print(v.to_string(float_format=lambda x: f"{x:.3f}"), flush=True)
            rows.append(row)
    flags.restore()
    w = max(len(r["stack"]) for r in rows)
    print(f"{'stack':{w}s}  median_ms (p20-p80, n)      gpu_busy_ms  host_launch_ms")
    for r in rows:
        print(f"{r['stack']:{w}s}  {r['median_ms']:8.2f} ({r['p20']:.2f}-{r['p80']:.2f}, {r['n']})"
              f"  {r['gpu_busy_ms']:10.2f}  {r['host_launch_ms']:10.2f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"workload": a.workload, "preset": preset, "device": torch.cuda.get_device_name(),
                       "torch": torch.__version__, "rounds": a.rounds, "repeats": a.repeats, "rows": rows}, f,
                      indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
