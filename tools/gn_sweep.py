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
    PYTHONPATH=$PWD python3 tools/gn_sweep.py --levels --grid one  # every UNet level: the launcher's default, the
                                                             # three kernels and the one-launch kernel's settings
"""

from __future__ import annotations

import argparse
import functools
import itertools
import sys

import pandas as pd
import torch

from wmbook.errors import command
from wmbook.kernels import group_norm_silu as gns
from wmbook.kernels.cases import unet_level_cases
from wmbook.studies.kernels import sweep_cli, sweep_sites

TILES = (2048, 4096, 8192)
PROGRAMS = (528, 1056, 2112, 4224, 8448)  # past 2112: the SD VAE decoder's activations of hundreds of MB
BLOCK_C = (64,)  # the launcher's default (128 and 1024, every channel of a position, were slower at 9931fae)
WARPS = (4, 8)
STATS = ("chan", "shifted")  # the channels-last statistics kernel (group_norm_silu._group_norm_silu_cl)
CF_BLOCKS = (512, 1024, 2048, 4096)  # channels-first: elements of a group loaded at once
CF_PROGRAMS = (512, 1024, 2048, 4096)


ONE_BLOCK_C = (32, 64, 128)  # the one-launch kernel: channels a program covers at most (whole groups)
ONE_TILES = (1024, 2048, 4096)
GRIDS = ("full", "one", "rule")


def settings(quick: bool, layout: str = "channels-last", grid: str = "full") -> list[dict]:
    """The grid at a call site: channels-first (block, programs, warps); channels-last (tile, programs, channel
    block, warps, statistics kernel) of the three kernels and (max channels, tile, warps) of the one-launch kernel;
    grid "one": at channels-last sites the launcher's default, the three kernels at their defaults and the one-launch
    grid only; "rule": the launcher's default (its size rule) and the three kernels at their defaults only."""
    if grid not in GRIDS:
        raise ValueError(f"grid={grid!r} is not allowed; allowed values: {list(GRIDS)}")
    one = [dict(one=True, max_block_c=c, tile=t, num_warps=w)
           for c, t, w in itertools.product(ONE_BLOCK_C[1:2] if quick else ONE_BLOCK_C,
                                            ONE_TILES[1:2] if quick else ONE_TILES, WARPS[:1] if quick else WARPS)]
    if layout == "channels-last" and grid in ("one", "rule"):
        return [dict(), dict(one_launch=False), *(one if grid == "one" else [])]
    if layout != "channels-last":
        grid = itertools.product(CF_BLOCKS[1:3] if quick else CF_BLOCKS, CF_PROGRAMS[1:2] if quick else CF_PROGRAMS,
                                 WARPS[:1] if quick else WARPS)
        return [dict(block=bl, programs=p, num_warps=w) for bl, p, w in grid]
    grid = itertools.product(TILES[:2] if quick else TILES, PROGRAMS[1:3] if quick else PROGRAMS,
                             BLOCK_C, WARPS[:1] if quick else WARPS, STATS)
    return [dict(tile=t, programs=p, max_block_c=c, num_warps=w, stats=st, one_launch=False)
            for t, p, c, w, st in grid] + one


def _runner(case, inputs, s):
    """The setting's launcher call: channels-last sites through the channels-last launcher, the others (contiguous)
    through the channels-first one."""
    cl = case.layout == "channels-last"
    launcher = gns._group_norm_silu_cl if cl else gns._group_norm_silu_cf
    if s.get("one"):
        launcher, s = gns._group_norm_silu_cl_one, {k: v for k, v in s.items() if k != "one"}
    x = inputs["x"] if cl else inputs["x"].contiguous()
    w, b, add, groups, eps = (inputs["weight"], inputs["bias"], inputs["add"], case.extra["num_groups"],
                              case.extra["eps"])
    return lambda: launcher(x, w, b, groups, eps, add, torch.empty_like(x), **s)


def sweep(workload: str, preset: str | None, device: torch.device, quick: bool, rep_ms: float,
          site: str | None = None, grid: str = "full", levels: bool = False) -> pd.DataFrame:
    """levels: the UNet's sites at every level (kernels.cases.unet_level_cases) instead of the kernel table's."""
    def level_cases(p):
        return unet_level_cases(p.model_channels, tuple(p.channel_mult), p.latent_hw, p.frames, p.norm_groups)

    return sweep_sites(workload, preset, device, ("group_norm_silu",), lambda case: settings(quick, case.layout, grid),
                       _runner, _name, rep_ms, site, level_cases if levels else None)


def _name(s: dict) -> str:
    if not s:
        return "launcher default"
    if s.get("one"):
        return f"one launch: channels <= {s['max_block_c']}, tile {s['tile']}, warps {s['num_warps']}"
    if s == {"one_launch": False}:
        return "three kernels, defaults"
    if "tile" not in s:
        return f"block {s['block']}, programs {s['programs']}, warps {s['num_warps']}"
    return (f"tile {s['tile']}, programs {s['programs']}, block_c <= {s['max_block_c']}, warps {s['num_warps']}, "
            f"stats {s['stats']}")


@command("gn_sweep.py")
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(add_help=False)
    ap.add_argument("--grid", default="full", choices=GRIDS, help="full: every setting; one: at channels-last "
                    "sites the launcher's default, the three kernels' defaults and the one-launch kernel's grid; "
                    "rule: the launcher's default and the three kernels' defaults")
    ap.add_argument("--levels", action="store_true", help="the UNet's sites at every level instead of the kernel "
                    "table's")
    a, rest = ap.parse_known_args(sys.argv[1:] if argv is None else argv)
    return sweep_cli(functools.partial(sweep, grid=a.grid, levels=a.levels), __doc__, ["wma"],
                     "a few settings a site instead of the full grid", rest)


if __name__ == "__main__":
    sys.exit(main())
