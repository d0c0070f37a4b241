"""Notebook 03 end to end with papermill on the tiny presets of both workloads (what `make report` runs on a CPU)."""

from __future__ import annotations

import json

import nbformat
import pandas as pd
import pytest

from wmbook.params import ParameterError
from wmbook.run import run_notebooks


@pytest.mark.slow
def test_notebook_03_tiny_mg2_and_wma(tmp_path):
    results = tmp_path / "results.csv"
    runs = run_notebooks(["03_step_reduction"], out=tmp_path / "r", progress=False, workloads=["mg2", "wma"],
                         parameters={"results_path": str(results), "output_dir": str(tmp_path / "a"), "repeats": 2})
    assert [r.status for r in runs] == ["ok", "ok"], [r.error for r in runs]
    df = pd.read_csv(results)
    mg2, wma = df[df["workload"] == "mg2"], df[df["workload"] == "wma"]
    assert (mg2["preset"] == "tiny").all() and (wma["preset"] == "tiny-wma").all()
    assert {"fps", "speedup_vs_full", "psnr_vs_full", "rel_l2_vs_full", "forwards"} <= set(mg2["metric"])
    assert {"iteration_s", "action_rel_l2_vs_full", "knee_speedup"} <= set(wma["metric"])
    fps = mg2[(mg2["metric"] == "fps") & mg2["variant"].str.startswith("steps:")]
    assert (fps["n"] == 2).all() and (fps["value"] > 0).all()
    ref = fps[fps["params"].map(lambda s: json.loads(s)["reference"])]
    assert list(ref["variant"]) == ["steps:renoise [1000,666,333] shift 5"]
    for r in runs:
        text = "\n".join(str(o.get("text", o.get("data", {}).get("text/markdown", "")))
                         for c in nbformat.read(r.executed_path, as_version=4).cells if c.cell_type == "code"
                         for o in c.get("outputs", []))
        assert "Quality against ground truth skipped" in text and "solver error" in text
        # a report run is quiet: no progress bars or warnings in the rendered notebook
        stderr = [o["text"] for c in nbformat.read(r.executed_path, as_version=4).cells if c.cell_type == "code"
                  for o in c.get("outputs", []) if o.get("name") == "stderr"]
        assert not stderr, stderr[:3]


def test_notebook_03_tiny_wma_short_sweep(tmp_path):
    """`make test`'s case of notebook 03 (every solver of both workloads is slow): wma on the tiny preset, DDIM at 3
    and 1 steps a pass against the full-step run, labelled as solver error (random weights)."""
    results = tmp_path / "results.csv"
    runs = run_notebooks(["03_step_reduction"], out=tmp_path / "r", progress=False,
                         parameters={"workload": "wma", "solvers": "ddim", "sampling_steps": "3,1",
                                     "split_passes": False, "repeats": 1, "warmup": 0, "results_path": str(results),
                                     "output_dir": str(tmp_path / "a")})
    assert runs[0].status == "ok", runs[0].error
    df = pd.read_csv(results)
    assert (df["preset"] == "tiny-wma").all() and {"iteration_s", "knee_speedup"} <= set(df["metric"])
    it = df[df["metric"] == "iteration_s"]
    assert len(it) >= 2 and (it["value"] > 0).all()
    text = "\n".join(str(o.get("text", o.get("data", {}).get("text/markdown", "")))
                     for c in nbformat.read(runs[0].executed_path, as_version=4).cells if c.cell_type == "code"
                     for o in c.get("outputs", []))
    assert "solver error" in text


def test_notebook_03_rejects_bad_parameter_before_work(tmp_path):
    with pytest.raises(ParameterError, match="solvers='ddim' is not allowed for workload 'mg2'"):
        run_notebooks(["03_step_reduction"], out=tmp_path / "r", progress=False,
                      parameters={"solvers": "ddim", "results_path": str(tmp_path / "r.csv")})
    assert not (tmp_path / "r").exists() and not (tmp_path / "r.csv").exists()
