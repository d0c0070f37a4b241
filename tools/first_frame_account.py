"""Where a stream's first frame goes: notebook 06's best stack (its default base and graph steps, full decoder) at a
preset, one fresh stream of one block at a time, each part timed with the pipeline's own device events (KV-cache
initialization, each DiT forward of block 0, its decode) beside the host's wall clock of the same call; then a stream
of `--blocks` blocks for the steady block against which the first one compares.

    python tools/first_frame_account.py --preset mg2-universal --rounds 10 --out first_frame.csv

Warm-up (compiles, graph captures) is excluded: `--warmup` one-block streams run before the timed ones. Medians with
p20-p80 over the rounds; the CSV holds every round.
"""

from __future__ import annotations

import argparse
import csv
import sys
import time
from pathlib import Path

import torch

from wmbook import workloads
from wmbook.bench import Samples
from wmbook.studies import graphs as study06
from wmbook.variants.ladder import apply_stack


def _account(out, wall_ms: float) -> dict:
    row = {"first_frame_ms": out.first_frame_ms, "wall_ms": wall_ms, "decode_ms": out.decode_ms[0]}
    fwd = out.forward_ms[0]
    row["cache_init_ms"] = out.first_frame_ms - sum(fwd) - out.decode_ms[0]
    for j, ms in enumerate(fwd):
        row[f"forward{j}_ms"] = ms
    row["forwards_ms"] = sum(fwd)
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="mg2-universal")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--rounds", type=int, default=10, help="timed one-block streams (>= 3)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed one-block streams first (>= 1)")
    ap.add_argument("--blocks", type=int, default=8, help="blocks of the steady stream (>= 3)")
    ap.add_argument("--out", type=Path, default=None, help="CSV of every round")
    a = ap.parse_args(argv)
    for name, lo in (("rounds", 3), ("warmup", 1), ("blocks", 3)):
        if getattr(a, name) < lo:
            ap.error(f"--{name}={getattr(a, name)} is not allowed; allowed values: an integer >= {lo}")
    cfg = study06.validate(workload="mg2", preset=a.preset, device=a.device)
    wl = workloads.get("mg2")
    stack = [*study06.base_stack(cfg), *study06.graph_steps(cfg)]
    print("stack:", " + ".join(stack), flush=True)
    ref = wl.reference_pipeline(cfg.preset, cfg.device, cfg.seed)
    pipe, _ = apply_stack(ref, wl, stack, cfg.device, cfg.options.compile_backend)
    del ref

    def stream(blocks: int):
        inputs = pipe.prepare(blocks, seed=cfg.seed)
        if cfg.device.type == "cuda":
            torch.cuda.synchronize(cfg.device)
        t0 = time.perf_counter()
        with torch.no_grad():
            out = pipe.generate(inputs, progress=False)
        if cfg.device.type == "cuda":
            torch.cuda.synchronize(cfg.device)
        return out, (time.perf_counter() - t0) * 1e3

    for i in range(a.warmup):
        stream(1)
        print(f"warm-up {i + 1}/{a.warmup}", flush=True)
    rows = []
    for i in range(a.rounds):
        out, wall = stream(1)
        rows.append({"round": i, **_account(out, wall)})
    steady = []  # every block from the third on, of 3 streams
    for run in range(3):
        out, _ = stream(a.blocks)
        for b in range(2, a.blocks):
            steady.append({"run": run, "block": b, "block_ms": out.block_ms[b], "forwards_ms": sum(out.forward_ms[b]),
                           "decode_ms": out.decode_ms[b]})
    keys = [k for k in rows[0] if k != "round"]
    dev = torch.cuda.get_device_name(cfg.device) if cfg.device.type == "cuda" else "cpu"
    print(f"\nfirst frame of a fresh stream, {cfg.preset.name}, {dev}, {a.rounds} rounds: median (p20-p80)")
    for k in keys:
        s = Samples([r[k] for r in rows], "ms")
        print(f"  {k:16s} {s.median:8.2f} ({s.p20:.2f}-{s.p80:.2f})")
    print(f"a steady block (blocks 2-{a.blocks - 1} of 3 streams of {a.blocks}): median (p20-p80)")
    for k in ("block_ms", "forwards_ms", "decode_ms"):
        s = Samples([r[k] for r in steady], "ms")
        print(f"  {k:16s} {s.median:8.2f} ({s.p20:.2f}-{s.p80:.2f})")
    if a.out is not None:
        with a.out.open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=["round", *keys])
            w.writeheader()
            w.writerows(rows)
        with a.out.with_name(a.out.stem + "-steady.csv").open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(steady[0]))
            w.writeheader()
            w.writerows(steady)
    return 0


if __name__ == "__main__":
    sys.exit(main())
