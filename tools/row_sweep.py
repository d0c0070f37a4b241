"""Sweep the DiT row kernels' launch settings (token rows per program, warps) on a GPU, at the mg2 workload's call
sites of notebook 05's kernel table, against torch.compile of the model's op sequence.

adaln_modulate and gated_residual_adaln run one program per token row by default (2640 programs of 4 warps at
mg2-universal: 41% and 58% of the H100's copy bandwidth at f3df044). Several rows per program put more bytes in flight
per program and fewer programs in the tail wave; which setting wins is a measurement, not a guess, so the launchers
keep their one-row default until this sweep says otherwise. On the H100 at 665a961 it kept it
(data/reports/h100/row_sweep-mg2-665a961.csv): adaln_modulate 12.9 us (12.6-13.3) at 1 row / 4 warps, the next best
13.2 (2 rows / 8 warps), compile 16.5; gated_residual_adaln 17.8 (17.5-18.4), next 17.9 (2 rows / 8 warps), compile
24.1; 8 rows per program was slower than compile for adaln_modulate at every warp count. Every setting is gated
against the fp32 reference like notebook 05 before its time counts; times are CUDA-graph replays with the L2
flushed (notebook 05's timing, after bench.spin_up), median with p20-p80. Prints the table per call site, sorted
by time, and writes it as CSV.

    PYTHONPATH=$PWD python3 tools/row_sweep.py --out /tmp/row_sweep.csv
    PYTHONPATH=$PWD python3 tools/row_sweep.py --quick        # 4 settings (a smoke run, e.g. the CPU interpreter)
"""

from __future__ import annotations

import itertools
import sys

import pandas as pd
import torch

from wmbook.errors import command
from wmbook.kernels import check_rows, next_pow2
from wmbook.studies.kernels import sweep_cli, sweep_sites

KERNELS = ("adaln_modulate", "gated_residual_adaln")
ROWS = (1, 2, 4, 8)
WARPS = (2, 4, 8, 16)


def settings(quick: bool, channels: int) -> list[dict]:
    """(rows, num_warps) pairs whose block fits check_rows at this width."""
    grid = itertools.product(ROWS[:2] if quick else ROWS, WARPS[1:3] if quick else WARPS)
    out = []
    for rows, warps in grid:
        try:
            check_rows(rows, next_pow2(channels))
        except ValueError:
            continue
        out.append(dict(rows=rows, num_warps=warps))
    return out


def sweep(workload: str, preset: str | None, device: torch.device, quick: bool, rep_ms: float,
          site: str | None = None) -> pd.DataFrame:
    return sweep_sites(workload, preset, device, KERNELS, lambda case: settings(quick, case.shape[-1]),
                       lambda case, inputs, s: lambda: case.fused(**inputs, **s), _name, rep_ms, site)


def _name(s: dict) -> str:
    return f"rows {s['rows']}, warps {s['num_warps']}"


@command("row_sweep.py")
def main(argv=None) -> int:
    return sweep_cli(sweep, __doc__, ["mg2"], "4 settings instead of the full grid", argv)


if __name__ == "__main__":
    sys.exit(main())
