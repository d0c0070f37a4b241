"""Notebook 01 end to end with papermill on the tiny preset (what `make report` does on a CPU)."""

import ast
import dataclasses
from pathlib import Path

import pandas as pd
import papermill as pm
import pytest
import torch

from wmbook import studies
from wmbook.params import ParameterError
from wmbook.run import run_notebooks

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"


@pytest.mark.parametrize("notebook", sorted(studies.MODULES))
def test_parameters_cell_is_the_validators_spec(notebook):
    """One source of parameters: the notebook's parameters cell holds exactly the names and defaults its
    NotebookSpec validates (what the runner checks `-p` names and values against)."""
    params = pm.inspect_notebook(f"notebooks/{notebook}.ipynb")
    cell = {k: ast.literal_eval(v["default"]) for k, v in params.items()}
    assert cell == studies.spec_for(notebook).defaults()


# notebook 01 end to end on the tiny preset, its report in Chromium where installed: tests/test_report_render.py
# (test_notebook_01_tiny_end_to_end_and_its_report)


def test_notebook_01_rejects_bad_parameter(tmp_path):
    """The runner refuses before a kernel starts. Run without it (papermill directly, as JupyterLab would), the
    notebook's own validation cell refuses before any work: tests/test_hostile_inputs.py runs papermill so (one kernel
    start is enough: the cell calls the same validator as the runner)."""
    params = {"dtype": "int8", "results_path": str(tmp_path / "r.csv")}
    with pytest.raises(ParameterError, match="dtype='int8' is not allowed"):
        run_notebooks(["01_baseline_profiling"], out=tmp_path / "report", progress=False, parameters=params)
    assert not (tmp_path / "report").exists() and not (tmp_path / "r.csv").exists()


def test_notebook_02_tiny_end_to_end(tmp_path):
    results = tmp_path / "results.csv"
    art = tmp_path / "art"
    runs = run_notebooks(["02_bottleneck_breakdown"], out=tmp_path / "report", progress=False,
                         parameters={"preset": "tiny", "num_blocks": 2, "warmup": 0, "overhead_pairs": 2,
                                     "results_path": str(results), "output_dir": str(art)})
    assert runs[0].status == "ok", runs[0].error
    assert (art / "02_breakdown_trace.json.gz").stat().st_size > 0
    reports = sorted((art / "session").glob("*.json"))
    assert len(reports) == 1 and len(sorted((art / "session").glob("*.html"))) == 1
    import json

    rep = json.loads(reports[0].read_text())
    assert rep["breakdown"]["summary"]["busy_ms"] > 0 and rep["overhead"]["overhead_frac"] is not None
    df = pd.read_csv(results)
    assert {"category_share:convolution", "forward_ms", "profiling_overhead"} <= set(df["metric"])
    shares = df[df["metric"].str.startswith("category_share:")]["value"]
    assert abs(shares.sum() - 1.0) < 1e-6


def test_notebook_02_rejects_bad_parameter_before_work(tmp_path):
    with pytest.raises(ParameterError, match="profiling_config='loud'"):
        run_notebooks(["02_bottleneck_breakdown"], out=tmp_path / "report", progress=False,
                      parameters={"profiling_config": "loud", "results_path": str(tmp_path / "r.csv"),
                                  "output_dir": str(tmp_path / "art")})
    assert not any((tmp_path / d).exists() for d in ("r.csv", "art", "report"))


@pytest.mark.slow
def test_notebooks_01_and_02_wma_tiny(tmp_path):
    results = tmp_path / "results.csv"
    params = {"workload": "wma", "preset": "tiny-wma", "ddim_steps": 3, "warmup": 0, "results_path": str(results)}
    runs = run_notebooks(["01_baseline_profiling"], out=tmp_path / "r1", progress=False,
                         parameters=params | {"repeats": 2, "output_dir": str(tmp_path / "a1")})
    assert runs[0].status == "ok", runs[0].error
    runs = run_notebooks(["02_bottleneck_breakdown"], out=tmp_path / "r2", progress=False,
                         parameters=params | {"overhead_pairs": 2, "output_dir": str(tmp_path / "a2")})
    assert runs[0].status == "ok", runs[0].error
    df = pd.read_csv(results)
    nb1 = df[df["notebook"] == "01_baseline_profiling"]
    assert {"iteration_s", "ddim_step_ms", "unet_forward_over_floor", "vae_decode_share",
            "stage_share:2_Decision_Pass"} <= set(nb1["metric"])
    assert (df["workload"] == "wma").all() and (df["preset"] == "tiny-wma").all()
    nb2 = df[df["notebook"] == "02_bottleneck_breakdown"]
    assert abs(nb2[nb2["metric"].str.startswith("category_share:")]["value"].sum() - 1.0) < 1e-6
    assert (tmp_path / "a1" / "iteration").is_dir()  # saved results of the profiled iteration


def test_workload_parameters_are_routed_and_checked():
    from wmbook.studies import baseline, breakdown

    assert baseline.validate(workload="wma", preset="tiny-wma", ddim_steps=3).options.ddim_steps == 3
    assert baseline.validate(workload="mg2", preset="tiny", num_blocks=2).options.num_blocks == 2
    assert breakdown.validate(workload="wma", device="cpu").options.region == "WMA_Interaction_Iteration"
    with pytest.raises(ValueError, match=r"num_blocks=2 applies to workload \['mg2'\] only"):
        baseline.validate(workload="wma", preset="tiny-wma", num_blocks=2)
    with pytest.raises(ValueError, match="ddim_steps=5"):
        baseline.validate(workload="mg2", preset="tiny", ddim_steps=5)
    with pytest.raises(ValueError, match="workload='sd'"):
        baseline.validate(workload="sd")
    with pytest.raises(ValueError, match="preset='tiny' is not allowed"):
        baseline.validate(workload="wma", preset="tiny")


@pytest.mark.slow
def test_notebook_04_tiny_mg2_and_wma(tmp_path):
    results = tmp_path / "results.csv"
    common = {"repeats": 2, "warmup": 1, "e2e_repeats": 1, "compile_backend": "eager",
              "results_path": str(results)}
    runs = run_notebooks(["04_compile_autocast"], out=tmp_path / "r1", progress=False,
                         parameters=common | {"workload": "mg2", "preset": "tiny", "recompile_blocks": 3,
                                              "compile_table": "reference,hygiene", "output_dir": str(tmp_path / "a1")})
    assert runs[0].status == "ok", runs[0].error
    runs = run_notebooks(["04_compile_autocast"], out=tmp_path / "r2", progress=False,
                         parameters=common | {"workload": "wma", "preset": "tiny-wma", "sections": "hygiene,ladder",
                                              "ladder": "bf16,hygiene,channels-last,compile-regional",
                                              "e2e_ddim_steps": 1, "output_dir": str(tmp_path / "a2")})
    assert runs[0].status == "ok", runs[0].error
    df = pd.read_csv(results)
    mg2 = df[df["workload"] == "mg2"]
    fwd = mg2[mg2["metric"] == "forward_ms"]
    last = ("tf32 + bf16 + norm-input-dtype + kv-slot-write + action-hoist + cross-kv-prefill + action-attn-fused + "
            "compile-regional")
    assert {"fp32-eager", last} <= set(fwd["variant"])
    assert (fwd["gate"].isin(["pass", "reference"])).all()
    rec = mg2[(mg2["metric"] == "steady_run_recompiles")].set_index("variant")["value"]
    assert rec["compile:regional, after hygiene"] == 0
    steady = mg2[mg2["metric"] == "steady_forward_ms"]  # median with its spread over `repeats` forwards
    assert len(steady) == 2 and (steady["p20"] <= steady["value"]).all() and (steady["value"] <= steady["p80"]).all()
    assert (mg2[mg2["metric"] == "x_floor"]["value"] > 0).all()
    wma = df[(df["workload"] == "wma") & (df["metric"] == "ddim_step_ms")]
    assert len(wma) == 5 and (wma["unit"] == "ms").all()  # reference + bf16, norm-input-dtype, channels-last, compile


def test_notebook_04_tiny_short_ladder(tmp_path):
    """`make test`'s case of notebook 04 (the full runs of both workloads, compile included, are slow): the wma tiny
    preset, a two-row ladder gated against the fp32 reference, timed, stored with spreads, the stack picker's trial."""
    results = tmp_path / "results.csv"
    runs = run_notebooks(["04_compile_autocast"], out=tmp_path / "r", progress=False,
                         parameters={"workload": "wma", "preset": "tiny-wma", "sections": "ladder",
                                     "ladder": "bf16,norm-input-dtype", "repeats": 2, "warmup": 1, "e2e_repeats": 1,
                                     "e2e_ddim_steps": 1, "compile_backend": "eager", "results_path": str(results),
                                     "output_dir": str(tmp_path / "a")})
    assert runs[0].status == "ok", runs[0].error
    df = pd.read_csv(results)
    step = df[df["metric"] == "ddim_step_ms"]
    assert list(step["gate"]) == ["reference", "pass", "pass"] and (step["value"] > 0).all()
    fwd = df[df["metric"] == "forward_ms"]  # median with its spread over `repeats` forwards
    assert (fwd["n"] == 2).all() and (fwd["p20"] <= fwd["value"]).all() and (fwd["value"] <= fwd["p80"]).all()


def test_notebook_04_default_ladders():
    from wmbook.studies import compile as ca

    modes = "default,max-autotune-no-cudagraphs"  # max-autotune means nothing off a GPU
    def names(cfg, attention=None):  # the ladder is resolved Variants
        return [v.name for v in ca.default_ladder(cfg, attention)]

    mg2 = names(ca.validate(workload="mg2", device="cpu", compile_modes=modes))
    wma = names(ca.validate(workload="wma", device="cpu"))
    hyg = ["norm-input-dtype", "kv-slot-write", "action-hoist", "cross-kv-prefill"]
    assert mg2 == ["tf32", "bf16", *hyg, "action-attn-fused", "compile-regional"]
    assert wma == ["tf32", "bf16", "norm-input-dtype", "channels-last", "temporal-channels-last",
                   "compile-whole"]  # the UNet compiles whole
    # on a GPU cuDNN's algorithm search comes first: cuDNN keeps its first pick for a convolution shape
    gpu = dataclasses.replace(ca.validate(workload="wma", device="cpu"), device=torch.device("cuda"))
    assert names(gpu)[:2] == ["cudnn-benchmark", "tf32"]
    assert names(ca.validate(workload="mg2", device="cpu"), "math")[-3] == "attn-math"
    assert "attn-flash" not in names(ca.validate(workload="mg2", device="cpu"), "flash")  # CUDA only
    with pytest.raises(ValueError, match="e2e_blocks=5 is not allowed for preset 'tiny-sf'"):
        ca.validate(workload="mg2", preset="tiny-sf", device="cpu", e2e_blocks=5)
    # the compile table by default: the workload's configurations (each a cold compile), `dynamic` never on a CPU
    assert ca.validate(workload="mg2", device="cpu").options.compile_table == ("reference", "hygiene", "whole",
                                                                               "max-autotune")
    assert ca.validate(workload="wma", device="cpu").options.compile_table == ("hygiene", "whole")
    assert "dynamic" in ca.validate(workload="wma", device="cpu", compile_table="all").options.compile_table


def test_notebook_04_rejects_unknown_variant_before_work(tmp_path):
    with pytest.raises(ParameterError, match="ladder='bf16,turbo' is not allowed: variant 'turbo' is not known"):
        run_notebooks(["04_compile_autocast"], out=tmp_path / "r", progress=False,
                      parameters={"ladder": "bf16,turbo", "results_path": str(tmp_path / "r.csv"),
                                  "output_dir": str(tmp_path / "art")})
    assert not any((tmp_path / d).exists() for d in ("r.csv", "art", "r"))


@pytest.mark.slow
def test_notebook_06_tiny_mg2_and_wma(tmp_path):
    """On a CPU notebook 06 checks the static and ring caches and measures the base, cache and CPU decoder rows
    (capture needs a GPU and says so) and the decoder table; both workloads, tiny presets."""
    results = tmp_path / "results.csv"
    common = {"repeats": 2, "warmup": 1, "e2e_repeats": 1, "compile_backend": "eager", "results_path": str(results)}
    runs = run_notebooks(["06_cuda_graphs"], out=tmp_path / "r", progress=False, workloads=["mg2", "wma"],
                         parameters=common)
    assert [r.status for r in runs] == ["ok", "ok"], [r.error for r in runs]
    df = pd.read_csv(results)
    mg2 = df[df["workload"] == "mg2"]
    assert {"forward_ms", "fps", "first_frame_ms", "run_s"} <= set(mg2["metric"])
    ladder = mg2[mg2["metric"] == "forward_ms"]
    assert ladder["variant"].str.endswith("static-caches").any() and set(ladder["gate"].dropna()) == {"pass"}
    assert ladder["variant"].str.endswith("ring-kv-cache").any()
    assert ladder["variant"].str.contains("vae-channels-last").any()  # the decoder's CPU rows
    tiny = ladder[ladder["variant"].str.endswith("vae-tiny + vae-channels-last + vae-compile")]  # the stand-in row:
    assert len(tiny) == 1 and set(tiny["gate"]) == {"pass"}  # the denoiser's output gated, its frames not judged
    assert not ((mg2["metric"] == "psnr_db") & mg2["variant"].str.contains("vae-tiny")).any()
    assert ((mg2["metric"] == "fps") & mg2["variant"].str.contains("vae-tiny")).any()
    dec = mg2[mg2["metric"] == "decoder_ms_per_block"]
    assert set(dec["gate"]) == {"reference", "pass", "needs real weights"}, dec[["variant", "gate"]]
    assert {"forward_ms", "ddim_step_ms", "run_s"} <= set(df[df["workload"] == "wma"]["metric"])
    wdec = df[(df["workload"] == "wma") & (df["metric"] == "decoder_ms_per_block")]  # the SD VAE's table, per frame
    assert list(wdec["variant"]) == ["decoder: fp32", "decoder: vae-bf16"] and wdec["gate"].iloc[0] == "reference"


def test_notebook_06_tiny_mg2(tmp_path):
    """`make test`'s case of notebook 06 (both workloads with the decoder tables are slow): mg2 on the tiny preset, the
    static and ring caches checked against fresh ones and measured, capture said to need a GPU."""
    results = tmp_path / "results.csv"
    runs = run_notebooks(["06_cuda_graphs"], out=tmp_path / "r", progress=False,
                         parameters={"workload": "mg2", "repeats": 2, "warmup": 1, "e2e_repeats": 1,
                                     "compile_backend": "eager", "decoder_table": False,
                                     "steps": "static-caches,ring-kv-cache", "results_path": str(results),
                                     "output_dir": str(tmp_path / "a")})
    assert runs[0].status == "ok", runs[0].error
    df = pd.read_csv(results)
    ladder = df[df["metric"] == "forward_ms"]
    assert (ladder["variant"].str.endswith("static-caches").any()
            and ladder["variant"].str.endswith("ring-kv-cache").any())
    assert set(ladder["gate"].dropna()) == {"pass"} and {"fps", "first_frame_ms"} <= set(df["metric"])
    assert len(ladder) == 3 and not (df["metric"] == "decoder_ms_per_block").any()  # base, + static, + ring


def test_notebook_07_tiny_motion(tmp_path):
    """Notebook 07 on a CPU: the profiler recipe and the stage breakdown, the ladder gated against float64 (the
    Triton kernel in the interpreter, CUDA graphs skipped and said so), the scaling points, the rows."""
    results = tmp_path / "results.csv"
    runs = run_notebooks(["07_motion_data_loading"], out=tmp_path / "r", progress=False, workloads=["mg2", "motion"],
                         parameters={"repeats": 5, "warmup": 1, "profile_warmup": 1, "profile_active": 2,
                                     "scaling_envs": "64,256", "results_path": str(results),
                                     "output_dir": str(tmp_path / "art")})
    assert [(r.name, r.status) for r in runs] == [("07_motion_data_loading-motion", "ok")], [r.error for r in runs]
    assert (tmp_path / "art" / "07_motion_fetch_trace.json.gz").stat().st_size > 0
    df = pd.read_csv(results)
    assert (df["workload"] == "motion").all() and (df["preset"] == "tiny-motion").all()
    fetch = df[df["metric"] == "fetch_ms"]
    assert fetch["variant"].tolist()[0] == "eager" and fetch["variant"].str.endswith("triton").any()
    assert set(fetch["gate"]) == {"reference", "pass"} and (fetch["p20"] <= fetch["p80"]).all()
    assert {"stage_share:interpolation", "bytes_floor_ms", "copy_gbps", "speedup"} <= set(df["metric"])
    assert sorted(set(df.loc[df["metric"] == "scaling_fetch_ms", "num_envs"])) == [64, 256]
    loop = df[df["metric"] == "loop_fetch_ms"].set_index("variant")  # every timed row also back to back
    assert set(loop.index) == set(fetch["variant"]) - {v for v in fetch["variant"] if v.endswith("triton")}, loop
    assert (loop["p20"] <= loop["p80"]).all() and (loop["value"] > 0).all()  # the interpreted kernel: no loop rate


def test_notebook_05_tiny_mg2_and_wma(tmp_path):
    """On a CPU notebook 05 checks every kernel at the workload's (tiny) call sites in Triton's interpreter against the
    fp32 reference and the model's own op sequence; no timings, no ladder (said so); both workloads."""
    runs = run_notebooks(["05_triton_kernels"], out=tmp_path / "r", progress=False, workloads=["mg2", "wma"],
                         parameters={"results_path": str(tmp_path / "results.csv"), "output_dir": str(tmp_path / "a")})
    assert [r.status for r in runs] == ["ok", "ok"], [r.error for r in runs]
    import nbformat

    for r in runs:
        # printed text and the tables (wmbook.display renders them as HTML)
        text = "\n".join(str(o.get("text", "")) + str(o.get("data", {}).get("text/plain", ""))
                         + str(o.get("data", {}).get("text/html", ""))
                         for c in nbformat.read(r.executed_path, as_version=4).cells if c.cell_type == "code"
                         for o in c.get("outputs", []))
        assert "pass" in text and "FAIL" not in text and "ladder rows left out" in text and "on a CPU" in text
    assert "rms_norm_silu" in text or "group_norm_silu" in text


@pytest.mark.slow
def test_notebook_08_tiny_dit_pipeline_on_gloo(tmp_path):
    """Notebook 08 at mg2 on a CPU: three gloo ranks started by torchrun (two DiT stages, one decoder), the DiT
    pipeline against the single-process run (the stage split's own run: tests/test_distributed.py). `make test`'s
    shorter cases: the notebook's stage split (test_rows_house) and the DiT pipeline's job
    (test_distributed)."""
    results = tmp_path / "results.csv"
    runs = run_notebooks(["08_multi_gpu"], out=tmp_path / "report", progress=False, workloads=["mg2"],
                         parameters={"layout": "dit-pipeline", "nproc": 3, "blocks": 2, "repeats": 1,
                                     "results_path": str(results), "output_dir": str(tmp_path / "art")})
    assert runs[0].status == "ok", runs[0].error
    df = pd.read_csv(results)
    split = df[df["variant"] == "dit-pipeline x3"].set_index("metric")
    assert split.loc["frames_bit_equal", "value"] == 1.0 and split.loc["fps", "gate"] == "pass"
    assert {"busy_ms:rank0", "idle_ms:rank2", "wire_one_way_ms", "bound_fps"} <= set(split.index)
    assert df.loc[(df["variant"] == "one GPU") & (df["metric"] == "fps"), "value"].iloc[0] > 0
    assert len(list((tmp_path / "art" / "jobs").glob("dit-pipeline-*/sessions/*_rank2.json"))) == 1
