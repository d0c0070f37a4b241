"""The `motion` workload as a third Workload: which notebooks run for it (and which never do), its parameters and
their errors, the object's answers; notebook 07's parameters checked before any work."""

from __future__ import annotations

import pytest
import torch

from wmbook import published, workloads
from wmbook import run as wmrun
from wmbook.params import ParameterError
from wmbook.runconfig import notebook_parameters
from wmbook.studies import baseline
from wmbook.studies import motion as study


def test_each_notebook_runs_only_for_the_workloads_it_supports():
    """`make report` (WORKLOADS=all): the world-model notebooks for mg2 and wma, notebook 07 for motion only."""
    nbs = wmrun.resolve_notebooks(["01", "07"])
    jobs = notebook_parameters(nbs, {}, workloads.names())
    assert [(p.stem, w) for p, w, _ in jobs] == [("01_baseline_profiling", "mg2"), ("01_baseline_profiling", "wma"),
                                                  ("07_motion_data_loading", "motion")]
    assert [(p.stem, w) for p, w, _ in notebook_parameters(nbs, {}, ["wma"])] == [("01_baseline_profiling", "wma")]
    assert [(p.stem, w) for p, w, _ in notebook_parameters(nbs, {}, None)] == [("01_baseline_profiling", None),
                                                                                ("07_motion_data_loading", None)]
    with pytest.raises(ParameterError, match=r"none of notebook\(s\) 07_motion_data_loading runs for workload\(s\) "
                                             r"\['mg2'\]; they run for \{'07_motion_data_loading': \['motion'\]\}"):
        notebook_parameters(wmrun.resolve_notebooks(["07"]), {}, ["mg2"])
    # a preset names its workload: `wmbook run --preset tiny` leaves notebook 07 out, `--preset tiny-motion` keeps it
    assert [p.stem for p, _, _ in notebook_parameters(nbs, {"preset": "tiny"})] == ["01_baseline_profiling"]
    assert [p.stem for p, _, _ in notebook_parameters(nbs[1:], {"preset": "tiny-motion"})] == ["07_motion_data_loading"]
    with pytest.raises(ParameterError, match=r"none of notebook\(s\) 07_motion_data_loading runs for preset 'tiny' "
                                             r"\(workload 'mg2'\)"):
        notebook_parameters(nbs[1:], {"preset": "tiny"})
    with pytest.raises(ParameterError, match=r"workload='motion' is not allowed for notebook 01_baseline_profiling; "
                                             r"allowed values: \['mg2', 'wma'\]"):
        baseline.validate(workload="motion")
    with pytest.raises(ParameterError, match=r"workload='wma' is not allowed for notebook 07_motion_data_loading; "
                                             r"allowed values: \['motion'\]"):
        study.validate(workload="wma")
    # one notebook's workload parameters never leak into another's parameters cell
    assert "num_envs" not in baseline.SPEC.defaults() and "num_blocks" not in study.SPEC.defaults()
    assert {"num_envs", "frames_per_env"} <= set(study.SPEC.defaults())


def test_published_tables_leave_out_workloads_without_notebook_01(tmp_path):
    assert "motion" not in published.markdown(tmp_path / "none.csv")


def test_published_table_of_notebook_07(tmp_path):
    from wmbook import bench, results

    common = dict(notebook="07_motion_data_loading", workload="motion", preset="g1-4096", params={}, warmup=5,
                  repeats=50)
    rows = [results.make_row(variant="eager", metric="fetch_ms", value=1.5, unit="ms", gate="reference", **common),
            results.make_row(variant="triton", metric="fetch_ms", value=0.015, unit="ms", gate="pass", **common),
            results.make_row(variant="triton", metric="speedup", value=100.0, unit="x", **common),
            results.make_row(variant="triton", metric="loop_fetch_ms", value=0.009, unit="ms",
                             timing=bench.Samples([0.008, 0.009, 0.010], "ms"), **common),
            results.make_row(variant="triton", metric="loop_x_bytes_floor", value=1.8, unit="x", **common),
            results.make_row(variant="-", metric="bytes_floor_ms", value=0.005, unit="ms", **common),
            results.make_row(variant="eager", metric="scaling_fetch_ms", value=2.0, unit="ms", num_envs=65536,
                             **common)]
    for r in rows:
        r["device_kind"] = "cuda"
    results.append(rows, tmp_path / "r.csv")
    md = published.markdown(tmp_path / "r.csv")
    assert "**07 · motion-data loading, g1-4096**" in md and "bytes floor 5.0 us" in md
    assert "| triton | pass | 15.0 | 100.0x |" in md and "| 9.0 (8.4-9.6) | 1.8 |" in md  # the loop rate, spread
    assert "| stack | 65536 robots, us |" in md and "| eager | 2000.0 |" in md


def test_motion_parameters_are_checked_with_their_allowed_values():
    cfg = study.validate(device="cpu")
    assert (cfg.workload.name, cfg.preset.name, cfg.options.num_envs, cfg.options.frames_per_env) == \
        ("motion", "tiny-motion", 64, 2)
    assert cfg.options.scaling_envs == (64, 256, 1024) and study.ladder_steps(cfg)[-1].name == "triton"
    assert study.validate(device="cpu", num_envs=100, scaling_envs="512, 32").options.scaling_envs == (32, 512)
    bad = [(dict(steps="packed-gather,turbo"), r"steps='packed-gather,turbo' is not allowed: variant 'turbo' is not "
                                               r"known; known variants: \['packed-gather'"),
           (dict(steps="cuda-graph"), "variant 'cuda-graph' needs a CUDA device"),
           (dict(steps="fused-quat"), r"'fused-quat' needs \['packed-gather', 'contiguous-layout'\] before it"),
           (dict(scaling_envs="64,0"), r"scaling_envs='64,0' is not allowed; allowed values: 'auto'"),
           (dict(num_envs=-1), r"num_envs=-1 is not allowed; allowed values: an integer >= 0"),
           (dict(preset="g1-4096"), r"preset='g1-4096' is a real-shape preset and needs a GPU"),
           (dict(preset="tiny"), r"preset='tiny' is not allowed for workload 'motion'; allowed values: "
                                 r"\['auto', 'tiny-motion', 'g1-4096'\]"),
           (dict(profile_active=0), r"profile_active=0 is not allowed; allowed values: an integer >= 1"),
           (dict(num_blocks=2), r"unknown parameter\(s\) \['num_blocks'\]")]
    for kw, msg in bad:
        with pytest.raises(ParameterError, match=msg):
            study.validate(device="cpu", **kw)


def test_the_workload_object():
    wl = workloads.get("motion")
    assert workloads.for_preset("g1-4096") is wl and "motion" in wl.features and "denoiser" not in wl.features
    term = wl.reference_pipeline(wl.presets[wl.tiny_preset], torch.device("cpu"))
    (target,) = wl.graph_targets(term)
    assert getattr(target.owner, target.attr) == term._fetch
    probe = wl.forward_probe(term)
    assert probe.forward().dof_pos.shape == (64, 2, 29) and probe.flops > 0
    flops = wl.forward_flops(wl.presets["g1-4096"])
    assert flops["total"] == pytest.approx(sum(v for k, v in flops.items() if k != "total"))
    assert wl.default_ladder(torch.device("cpu")) == ["packed-gather", "contiguous-layout", "fused-quat", "compile",
                                                       "triton"]
    with pytest.raises(ValueError, match="runs in fp32"):
        wl.pipeline(wl.presets["tiny-motion"], "cpu", torch.bfloat16, torch.bfloat16)


def test_world_model_variants_do_not_apply_to_the_motion_workload():
    """The variant registry acts on world-model pipelines: the motion workload (no denoiser) gets none of it."""
    from wmbook import variants

    assert (variants.known(workloads.get("motion")) == [] and "tf32" in variants.known(workloads.get("mg2"))
            and "triton-fused" in variants.known(workloads.get("wma")))


def test_top_operations_names_the_gpu_annotation_of_a_range_apart():
    """On a GPU key_averages lists a record_function range twice, as its CPU range and as its GPU annotation (no CPU
    time): the table keeps both, the second named as the annotation, so every row label is unique."""
    import types

    import pandas as pd

    from wmbook.studies import motion as mstudy

    kernel = "void at::native::index_elementwise_kernel<128, 4, " + "x" * 200 + ">"
    rows = pd.DataFrame({"name": ["fetch", "fetch", "aten::index", "ProfilerStep#1", kernel],
                         "count": [10, 10, 40, 10, 40], "cpu_time_total_us": [900.0, 0.0, 300.0, 1000.0, 0.0],
                         "self_cpu_time_total_us": [100.0, 0.0, 300.0, 10.0, 0.0],
                         "device_time_total_us": [500.0, 480.0, 200.0, 0.0, 100.0],
                         "self_device_time_total_us": [0.0, 480.0, 200.0, 0.0, 100.0]})
    prof = types.SimpleNamespace(key_averages=lambda: rows)
    cfg = types.SimpleNamespace(options=types.SimpleNamespace(profile_active=10),
                                device=types.SimpleNamespace(type="cuda"))
    out = mstudy.top_operations(prof, cfg)
    assert list(out.index)[:3] == ["fetch", "fetch (GPU annotation)", "aten::index"] and out.index.is_unique
    assert len(out.index[3]) == 90 and out.index[3].startswith("void at::native::index_elementwise_kernel<128, 4, xx")
    assert out.index[3].endswith("...")  # a templated kernel's name cut: the numbers stay on the page
    assert out.loc["fetch (GPU annotation)", "device ms / step"] == 0.048
