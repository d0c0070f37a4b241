"""One module per notebook: its parameters (a NotebookSpec), tables, figures, results rows and interpretation.

None of them branches on a workload's name: they ask the workload object (wmbook.workloads). The notebooks call
these functions, one per cell.

    01_baseline_profiling    wmbook.studies.baseline
    02_bottleneck_breakdown  wmbook.studies.breakdown
    03_step_reduction        wmbook.studies.steps
    04_compile_autocast      wmbook.studies.compile
    05_triton_kernels        wmbook.studies.kernels
    06_cuda_graphs           wmbook.studies.graphs
    07_motion_data_loading   wmbook.studies.motion (the `motion` workload)
"""

from __future__ import annotations

import importlib

MODULES = {
    "01_baseline_profiling": "wmbook.studies.baseline",
    "02_bottleneck_breakdown": "wmbook.studies.breakdown",
    "03_step_reduction": "wmbook.studies.steps",
    "04_compile_autocast": "wmbook.studies.compile",
    "05_triton_kernels": "wmbook.studies.kernels",
    "06_cuda_graphs": "wmbook.studies.graphs",
    "07_motion_data_loading": "wmbook.studies.motion",
}


def spec_for(notebook: str):
    """The NotebookSpec of a notebook (by its file stem), or None for a notebook without one."""
    mod = MODULES.get(notebook)
    return importlib.import_module(mod).SPEC if mod else None
