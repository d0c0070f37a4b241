"""Notebook 01 (baseline profiling): the eager reference pipeline timed, its tables, figures, rows and prose.

Everything workload-specific (what a run is, its tables, its metric) comes from the workload object; this module
holds what notebook 01 does for any workload.
"""

from __future__ import annotations

import pandas as pd

from .. import results as results_store
from ..bench import Samples
from ..device import floor_ms
from ..params import (
    DEVICE,
    EAGER_DTYPE,
    OUTPUT_DIR,
    PRESET,
    REPEATS,
    RESULTS_PATH,
    SEED,
    VAE_DTYPE,
    WARMUP,
    Param,
    boolean,
)
from ..runconfig import WORKLOAD, NotebookSpec, RunConfig
from ..runconfig import validate as _validate

NOTEBOOK = "01_baseline_profiling"
SPEC = NotebookSpec(NOTEBOOK, (WORKLOAD, PRESET, DEVICE, EAGER_DTYPE, VAE_DTYPE, WARMUP, REPEATS,
                               Param("profile", True, boolean, "stage table from a profiled run and its trace"),
                               OUTPUT_DIR, RESULTS_PATH, SEED),
                    quick={"repeats": 2})


def validate(**params) -> RunConfig:
    """Check every notebook-01 parameter before any heavy work; errors name the parameter and allowed values."""
    return _validate(SPEC, **params)


def build(cfg: RunConfig):
    """(pipeline, inputs) at the configured preset, device and dtypes."""
    return cfg.workload.build(cfg)


def model_table(pipe, inputs, cfg: RunConfig) -> pd.DataFrame:
    return cfg.workload.model_table(pipe, inputs, cfg)


def run_benchmark(pipe, inputs, cfg: RunConfig, ceilings: dict):
    """The eager baseline: warm-up excluded, device-event timing, `repeats` timed runs."""
    return cfg.workload.benchmark(pipe, inputs, cfg, ceilings)


def summary_table(res) -> pd.DataFrame:
    """Every summary metric: median, p20-p80 and count for repeated measurements, the value otherwise."""
    rows = []
    for k, v in res.summary().items():
        if isinstance(v, Samples):
            rows.append({"metric": k, "median": v.median, "p20": v.p20, "p80": v.p80, "n": v.n, "unit": v.unit})
        else:
            rows.append({"metric": k, "median": v, "p20": float("nan"), "p80": float("nan"), "n": float("nan"),
                         "unit": res.units.get(k, "")})
    return pd.DataFrame(rows).set_index("metric")


def floor_table(cfg: RunConfig, ceilings: dict) -> pd.DataFrame:
    """Analytic FLOPs of one steady forward by part, and each part's floor at the measured GEMM ceiling."""
    parts = cfg.workload.forward_flops(cfg.preset)
    df = pd.DataFrame({"GFLOP": {k: v / 1e9 for k, v in parts.items()}})
    df["floor_ms"] = [floor_ms(v, ceilings) for v in parts.values()]
    return df.rename_axis("part")


def plot_overview(cfg: RunConfig, res):
    return cfg.workload.plot_overview(res)


def profile_stages(pipe, inputs, cfg: RunConfig):
    """(stage table, trace path, label or section table) of one profiled run; the stage table's `share` column
    is each top-level stage's share of the labelled time (README: a label's device time)."""
    return cfg.workload.profile_stages(pipe, inputs, cfg)


def plot_stage_shares(stages: pd.DataFrame, ax=None):
    """Horizontal bars: each top-level stage's share of the labelled time."""
    import matplotlib.pyplot as plt  # noqa: PLC0415  heavy: matplotlib.pyplot

    if ax is None:
        _, ax = plt.subplots(figsize=(6, 2.4))
    ax.barh(stages.index[::-1], stages["share"][::-1] * 100, color="#228833")
    ax.set_xlabel("% of labelled time")
    ax.set_title("Top-level stages (profiled run)")
    return ax


def result_rows(cfg: RunConfig, res, stages: pd.DataFrame | None = None, variant: str = "eager") -> list[dict]:
    """Results rows: each summary metric (repeated ones with their spread, in their unit), the GEMM ceiling it
    was judged against, and the stage shares."""
    common = dict(notebook=cfg.notebook, workload=cfg.workload.name, preset=cfg.preset.name, variant=variant,
                  params=cfg.params(), warmup=cfg.warmup, repeats=cfg.repeats)
    rows = []
    for k, v in res.summary().items():
        if isinstance(v, Samples):
            rows.append(results_store.make_row(metric=k, value=v.median, unit=v.unit, timing=v, **common))
        else:
            rows.append(results_store.make_row(metric=k, value=v, unit=res.units[k], **common))
    rows.append(results_store.make_row(metric="gemm_ceiling_tflops", value=res.ceilings.get("gemm_tflops"),
                                       unit="TFLOP/s", **common))
    if stages is not None:
        for name, r in stages.iterrows():
            rows.append(results_store.make_row(metric=f"stage_share:{name}", value=float(r["share"]),
                                               unit="fraction", **common))
    return rows


def interpret(cfg: RunConfig, res, stages: pd.DataFrame | None = None) -> str:
    """Sentences computed from the measured numbers (the workload's, then the stage shares)."""
    lines = cfg.workload.interpret_baseline(cfg, res)
    if stages is not None and len(stages):
        top = stages["share"].idxmax()
        lines.append(f"In the profiled run, `{top}` holds {stages.loc[top, 'share']:.0%} of the labelled time.")
    if cfg.tiny:
        lines.append("These are tiny-preset CPU numbers: they check the code paths, not the speed of the real model.")
    return " ".join(lines)
