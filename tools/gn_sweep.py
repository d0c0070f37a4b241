"""Sweep the GroupNorm + SiLU launchers' settings on a GPU, at the group_norm_silu call sites of a workload's kernel
table, against torch.compile of the model's op sequence: the channels-last launcher's (tile, programs, channel block,
warps) at its channels-last sites, the channels-first launcher's (block, programs, warps) at the others (the wma
temporal block and the SD VAE, where the kernel was 0.86x and 0.81x compile on the H100 at f3df044).

Every setting is gated against the fp32 reference like notebook 05 (relative L2 within the dtype's tolerance) before
its time counts; times are medians with p20-p80 of CUDA-graph replays with the L2 flushed (notebook 05's timing,
after bench.spin_up). Prints the
table sorted by time per call site and writes it as CSV.

    PYTHONPATH=$PWD python3 tools/gn_sweep.py --workload wma --out /tmp/gn_sweep.csv
    PYTHONPATH=$PWD python3 tools/gn_sweep.py --quick        # a few settings a site (a smoke run, e.g. the CPU
                                                             # interpreter)
"""

from __future__ import annotations

import itertools
import sys

import pandas as pd
import torch

from wmbook import workloads
from wmbook.kernels import group_norm_silu as gns
from wmbook.studies.kernels import GATE_REL_L2, _bench, _rel_l2, sweep_cli

TILES = (1024, 2048, 4096, 8192)
PROGRAMS = (264, 528, 1056, 2112)
BLOCK_C = (64, 128, 1024)  # 1024: every channel of a position in one block (the UNet's 320 -> 512, masked)
WARPS = (4, 8)
CF_BLOCKS = (512, 1024, 2048, 4096)  # channels-first: elements of a group loaded at once
CF_PROGRAMS = (512, 1024, 2048, 4096)


def settings(quick: bool, layout: str = "channels-last") -> list[dict]:
    if layout != "channels-last":
        grid = itertools.product(CF_BLOCKS[1:3] if quick else CF_BLOCKS, CF_PROGRAMS[1:2] if quick else CF_PROGRAMS,
                                 WARPS[:1] if quick else WARPS)
        return [dict(block=bl, programs=p, num_warps=w) for bl, p, w in grid]
    grid = itertools.product(TILES[1:3] if quick else TILES, PROGRAMS[1:3] if quick else PROGRAMS,
                             BLOCK_C[:1] if quick else BLOCK_C, WARPS if quick else WARPS)
    return [dict(tile=t, programs=p, max_block_c=c, num_warps=w) for t, p, c, w in grid]


def sweep(workload: str, preset: str | None, device: torch.device, quick: bool, rep_ms: float) -> pd.DataFrame:
    wl = workloads.get(workload)
    p = wl.presets[preset or (wl.real_preset if device.type == "cuda" else wl.tiny_preset)]
    cases = [c for c in wl.kernel_cases(p) if c.kernel == "group_norm_silu"]
    if not cases:
        raise SystemExit(f"no group_norm_silu call site in {workload}/{p.name}'s kernel table")
    gpu = device.type == "cuda"
    rows = []
    for case in cases:
        inputs = case.make(device, case.dtype, 0)
        groups, eps = case.extra["num_groups"], case.extra["eps"]
        with torch.inference_mode():
            ref = case.ref(**inputs)
            tol = max(2 * _rel_l2(case.eager(**inputs), ref), GATE_REL_L2.get(case.dtype, 1e-2))
            base = {"site": case.site, "shape": "x".join(map(str, case.shape)), "layout": case.layout,
                    "MB": case.nbytes(**inputs) / 1e6}
            if gpu:
                compiled = torch.compile(case.eager, dynamic=False)
                compiled(**inputs)
                med, p20, p80, _ = _bench(lambda: compiled(**inputs), rep_ms, device)
                rows.append(base | {"setting": "torch.compile", "us": med * 1e3, "p20": p20 * 1e3, "p80": p80 * 1e3,
                                    "rel_l2": _rel_l2(compiled(**inputs), ref), "gate": "reference"})
                torch._dynamo.reset()
            launcher = gns._group_norm_silu_cl if case.layout == "channels-last" else gns._group_norm_silu_cf
            for s in settings(quick, case.layout):
                x, w, b, add = inputs["x"], inputs["weight"], inputs["bias"], inputs["add"]
                x = x if case.layout == "channels-last" else x.contiguous()

                def run(s=s, x=x):
                    return launcher(x, w, b, groups, eps, add, torch.empty_like(x), **s)

                try:
                    err = _rel_l2(run(), ref)
                except Exception as e:  # noqa: BLE001  (a setting Triton cannot compile is a finding, not a crash)
                    rows.append(base | {"setting": _name(s), "gate": f"error: {type(e).__name__}: {e}"[:200]})
                    continue
                row = base | {"setting": _name(s), "rel_l2": err, "gate": "pass" if err <= tol else "FAIL"}
                if gpu and row["gate"] == "pass":
                    med, p20, p80, _ = _bench(run, rep_ms, device)
                    row |= {"us": med * 1e3, "p20": p20 * 1e3, "p80": p80 * 1e3}
                rows.append(row)
        del inputs, ref
    return pd.DataFrame(rows)


def _name(s: dict) -> str:
    if "tile" not in s:
        return f"block {s['block']}, programs {s['programs']}, warps {s['num_warps']}"
    return f"tile {s['tile']}, programs {s['programs']}, block_c <= {s['max_block_c']}, warps {s['num_warps']}"


def main(argv=None) -> int:
    return sweep_cli(sweep, __doc__, ["wma"], "a few settings a site instead of the full grid", argv)


if __name__ == "__main__":
    sys.exit(main())
