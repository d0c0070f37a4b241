"""One module per notebook: its parameters (a NotebookSpec), tables, figures, results rows and interpretation; and
beside it a light `*_report` module that reads the notebook's stored rows back: which runs stand for it (`runs`, when
not simply the latest), its headline numbers (`headline`), its published tables (`published`), the three findings a
report opens with (`findings`) and its stage of a workload's summary (`stage`, `STAGE`). The renderers
(wmbook.headlines, wmbook.published, wmbook.render, wmbook.summary) reach them through `report_for` only.

None of them branches on a workload's name: they ask the workload object (wmbook.workloads). The notebooks call
these functions, one per cell.

    01_baseline_profiling    wmbook.studies.baseline
    02_bottleneck_breakdown  wmbook.studies.breakdown
    03_step_reduction        wmbook.studies.steps
    04_compile_autocast      wmbook.studies.compile
    05_triton_kernels        wmbook.studies.kernels
    06_cuda_graphs           wmbook.studies.graphs
    07_motion_data_loading   wmbook.studies.motion (the `motion` workload)
    08_multi_gpu             wmbook.studies.multi_gpu (several processes: wmbook.distributed)

Reports: baseline_report, breakdown_report, steps_report (+ step_notes), compile_report, kernels_report,
graphs_report, motion_report, multi_gpu_report.
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
    "08_multi_gpu": "wmbook.studies.multi_gpu",
}


def spec_for(notebook: str):
    """The NotebookSpec of a notebook (by its file stem), or None for a notebook without one."""
    mod = MODULES.get(notebook)
    return importlib.import_module(mod).SPEC if mod else None


def set_keys() -> list[tuple[str, str, str]]:
    """(notebook, workload, preset) of every run of a full published set (what `wmbook regenerate` plans, without
    checking parameters against a device): each notebook at each workload it runs for, at the workload's real preset,
    then the runs its study adds (NotebookSpec.set_runs)."""
    keys = []
    for nb in MODULES:
        spec = spec_for(nb)
        keys += [(nb, wl.name, wl.real_preset) for wl in spec.workloads()]
        keys += [(nb, x["workload"], x["preset"]) for x in spec.set_runs]
    return list(dict.fromkeys(keys))


REPORTS = {
    "01_baseline_profiling": "wmbook.studies.baseline_report",
    "02_bottleneck_breakdown": "wmbook.studies.breakdown_report",
    "03_step_reduction": "wmbook.studies.steps_report",
    "04_compile_autocast": "wmbook.studies.compile_report",
    "05_triton_kernels": "wmbook.studies.kernels_report",
    "06_cuda_graphs": "wmbook.studies.graphs_report",
    "07_motion_data_loading": "wmbook.studies.motion_report",
    "08_multi_gpu": "wmbook.studies.multi_gpu_report",
}


def report_for(notebook: str):
    """The module that reads a notebook's stored rows back (headline, published, findings, stage), or None."""
    mod = REPORTS.get(notebook)
    return importlib.import_module(mod) if mod else None
