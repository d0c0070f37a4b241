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

from wmbook.errors import command
from wmbook.kernels import group_norm_silu as gns
from wmbook.studies.kernels import sweep_cli, sweep_sites

TILES = (2048, 4096, 8192)
PROGRAMS = (528, 1056, 2112, 4224, 8448)  # past 2112: the SD VAE decoder's activations of hundreds of MB
BLOCK_C = (64,)  # the launcher's default (128 and 1024, every channel of a position, were slower at 9931fae)
WARPS = (4, 8)
STATS = ("chan", "shifted")  # the channels-last statistics kernel (group_norm_silu._group_norm_silu_cl)
CF_BLOCKS = (512, 1024, 2048, 4096)  # channels-first: elements of a group loaded at once
CF_PROGRAMS = (512, 1024, 2048, 4096)


def settings(quick: bool, layout: str = "channels-last") -> list[dict]:
    """The grid at a call site: channels-first (block, programs, warps); channels-last (tile, programs, channel
    block, warps, statistics kernel)."""
    if layout != "channels-last":
        grid = itertools.product(CF_BLOCKS[1:3] if quick else CF_BLOCKS, CF_PROGRAMS[1:2] if quick else CF_PROGRAMS,
                                 WARPS[:1] if quick else WARPS)
        return [dict(block=bl, programs=p, num_warps=w) for bl, p, w in grid]
    grid = itertools.product(TILES[:2] if quick else TILES, PROGRAMS[1:3] if quick else PROGRAMS,
                             BLOCK_C, WARPS, STATS)
    return [dict(tile=t, programs=p, max_block_c=c, num_warps=w, stats=st) for t, p, c, w, st in grid]


def _runner(case, inputs, s):
    """The setting's launcher call: channels-last sites through the channels-last launcher, the others (contiguous)
    through the channels-first one."""
    cl = case.layout == "channels-last"
    launcher = gns._group_norm_silu_cl if cl else gns._group_norm_silu_cf
    x = inputs["x"] if cl else inputs["x"].contiguous()
    w, b, add, groups, eps = (inputs["weight"], inputs["bias"], inputs["add"], case.extra["num_groups"],
                              case.extra["eps"])
    return lambda: launcher(x, w, b, groups, eps, add, torch.empty_like(x), **s)


def sweep(workload: str, preset: str | None, device: torch.device, quick: bool, rep_ms: float,
          site: str | None = None) -> pd.DataFrame:
    return sweep_sites(workload, preset, device, ("group_norm_silu",), lambda case: settings(quick, case.layout),
                       _runner, _name, rep_ms, site)


def _name(s: dict) -> str:
    if "tile" not in s:
        return f"block {s['block']}, programs {s['programs']}, warps {s['num_warps']}"
    return (f"tile {s['tile']}, programs {s['programs']}, block_c <= {s['max_block_c']}, warps {s['num_warps']}, "
            f"stats {s['stats']}")


@command("gn_sweep.py")
def main(argv=None) -> int:
    return sweep_cli(sweep, __doc__, ["wma"], "a few settings a site instead of the full grid", argv)


if __name__ == "__main__":
    sys.exit(main())
