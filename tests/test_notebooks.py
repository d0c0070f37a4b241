"""Notebook 01 end to end with papermill on the tiny preset (what `make report` does on a CPU)."""

import papermill as pm
import pandas as pd

from wmbook.run import run_notebooks


def test_parameters_cell_parses():
    params = pm.inspect_notebook("notebooks/01_baseline_profiling.ipynb")
    for name in ("preset", "device", "dtype", "num_blocks", "warmup", "repeats", "profile", "output_dir",
                 "results_path", "seed"):
        assert name in params, name


def test_notebook_01_tiny_end_to_end(tmp_path):
    results = tmp_path / "results.csv"
    runs = run_notebooks(["01_baseline_profiling"], out=tmp_path / "report", progress=False,
                         parameters={"preset": "tiny", "num_blocks": 3, "warmup": 0, "repeats": 2,
                                     "results_path": str(results), "output_dir": str(tmp_path / "art")})
    assert runs[0].status == "ok", runs[0].error
    assert (tmp_path / "report" / "index.html").exists()
    assert (tmp_path / "art" / "01_baseline_trace.json.gz").stat().st_size > 0
    df = pd.read_csv(results)
    assert {"fps", "dit_forward_ms", "vae_share", "stage_share:2_Pipeline_Inference"} <= set(df["metric"])
    assert (df["preset"] == "tiny").all() and df.loc[df.metric == "fps", "value"].iloc[0] > 0


def test_notebook_01_rejects_bad_parameter(tmp_path):
    runs = run_notebooks(["01_baseline_profiling"], out=tmp_path / "report", progress=False,
                         parameters={"dtype": "int8", "results_path": str(tmp_path / "r.csv")})
    assert runs[0].status == "failed" and "dtype='int8'" in runs[0].error
    assert not (tmp_path / "r.csv").exists()  # nothing written before the check failed
