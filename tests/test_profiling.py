"""Tests for the torch.profiler wrapper and the trace label breakdown."""

import gzip
import json
import os

import pytest
import torch

from wmbook.profiling import (
    kernel_summary,
    label,
    label_table,
    labels_enabled,
    load_trace,
    profile,
    set_labels,
    stage_table,
)


def _step():
    with label("1_Data_Preparation"):
        with label("1.1_X"):
            torch.ones(8, 8).sum()
    with label("2_Pipeline_Inference"):
        with label("2.3_Block_0"):
            with label("2.3.0_Denoising_Step_0_t1000"):
                torch.randn(32, 32) @ torch.randn(32, 32)


@pytest.fixture
def labels_on():
    before = labels_enabled()
    set_labels(True)
    yield
    set_labels(before)


def test_profile_writes_gzip_trace_with_labels(tmp_path, labels_on):
    calls = []

    def step():
        calls.append(1)
        _step()

    res = profile(step, wait=1, warmup=1, active=2, out_dir=tmp_path, name="t", activities=["cpu"])
    assert len(calls) == 4
    assert res.trace_path == tmp_path / "t.json.gz"
    assert os.listdir(tmp_path) == ["t.json.gz"]  # no temp or uncompressed files left
    with gzip.open(res.trace_path, "rt") as f:
        trace = json.load(f)
    assert "traceEvents" in trace
    assert load_trace(res.trace_path)["traceEvents"] == trace["traceEvents"]

    df = res.label_table()
    by = df.set_index("label")
    assert {"1_Data_Preparation", "1.1_X", "2.3_Block_0", "2.3.0_Denoising_Step_0_t1000"} <= set(by.index)
    assert by.loc["2.3_Block_0", "count"] == 2  # two active steps
    assert (df["cpu_self_ms"] <= df["cpu_total_ms"] + 1e-9).all()
    assert by.loc["1.1_X", "parent"] == "1_Data_Preparation" and by.loc["1.1_X", "depth"] == 1
    assert by.loc["2.3.0_Denoising_Step_0_t1000", "depth"] == 2
    assert by.loc["1_Data_Preparation", "depth"] == 0

    # a CPU-only trace: no device time, host time instead, and the table says so
    assert (df["source"] == "cpu").all() and df["gpu_total_ms"].isna().all()
    stages = stage_table(df)
    assert stages["label"].tolist() == ["1_Data_Preparation", "2_Pipeline_Inference"]
    assert stages["share"].sum() == pytest.approx(1.0)
    assert (stages["source"] == "cpu").all()
    assert by.loc["2.3.0_Denoising_Step_0_t1000", "parent"] == "2.3_Block_0"
    assert by.loc["2.3.0_Denoising_Step_0_t1000", "count"] == 2
    host = kernel_summary(res.trace_path)["labels"].set_index("label_name")
    assert ((host["source"] == "cpu").all()
            and host.loc["1.1_X", "total_ms"] == pytest.approx(by.loc["1.1_X", "cpu_total_ms"]))

    ka = res.key_averages()
    assert {"name", "count", "cpu_time_total_us", "device_time_total_us"} <= set(ka.columns)
    assert "1.1_X" in set(ka["name"])
    assert label_table(res.trace_path, prefix_filter="2.3")["label"].str.startswith("2.3").all()


def test_disabled_labels_emit_nothing(tmp_path, labels_on):
    set_labels(False)
    res = profile(_step, out_dir=tmp_path, activities=["cpu"])
    events = load_trace(res.trace_path)["traceEvents"]
    names = [e["name"] for e in events if e.get("cat") == "user_annotation"]
    assert not [n for n in names if not n.startswith("ProfilerStep#")]
    assert label_table(res.trace_path).empty


def test_profile_rejects_bad_args(tmp_path):
    with pytest.raises(ValueError, match="active"):
        profile(_step, active=0, out_dir=tmp_path)
    with pytest.raises(ValueError, match="steps"):
        profile(_step, steps=1, warmup=1, active=1, out_dir=tmp_path)
    with pytest.raises(ValueError, match="activities"):
        profile(_step, out_dir=tmp_path, activities=["tpu"])


def _x(name, ts, dur, cat="user_annotation", tid=1, ext=None):
    e = {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": tid}
    if ext is not None:
        e["args"] = {"External id": ext}
    return e


def _launch(ts, corr, tid=1):
    return {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": ts, "dur": 1, "pid": 1, "tid": tid,
            "args": {"correlation": corr}}


def _kernel(ts, dur, corr, name="k", cat="kernel", stream=7):
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 0, "tid": stream,
            "args": {"correlation": corr, "stream": stream}}


def test_label_table_self_time_arithmetic():
    # host: A [0,100) holds B [10,40) and C [50,90); C holds D [60,70). Times in us.
    # E on another thread overlaps A but is not nested in it.
    # device (stream 7): kernels launched in A (before B), B, C (outside D), D; a memcpy launched in C.
    # Where a kernel runs does not matter (D's runs after C closed), only where it was launched.
    trace = {
        "traceEvents": [
            _x("A", 0, 100),
            _x("B", 10, 30),
            _x("C", 50, 40),
            _x("D", 60, 10),
            _x("E", 5, 20, tid=2),
            _x("ProfilerStep#0", 0, 200),
            _launch(2, 1), _kernel(20, 5, 1),  # A self: 5
            _launch(12, 2), _kernel(30, 25, 2),  # B: 25
            _launch(52, 3), _kernel(60, 30, 3),  # C self: 30
            _launch(55, 4), _kernel(95, 10, 4, name="Memcpy HtoD", cat="gpu_memcpy"),  # C self: 10
            _launch(65, 5), _kernel(120, 10, 5),  # D: 10, runs after C closed
            _x("D", 70, 10, cat="gpu_user_annotation", tid=7),  # device annotations do not count
            {"ph": "i", "cat": "user_annotation", "name": "ignored", "ts": 1},
        ]
    }
    df = label_table(trace).set_index("label")
    assert list(df.index) == ["A", "E", "B", "C", "D"]  # order of first host occurrence
    assert df.loc["A", "cpu_total_ms"] == pytest.approx(0.100)
    assert df.loc["A", "cpu_self_ms"] == pytest.approx(0.030)  # 100 - 30 - 40
    assert df.loc["C", "cpu_self_ms"] == pytest.approx(0.030)  # 40 - 10
    assert df.loc["D", "cpu_self_ms"] == pytest.approx(0.010)
    assert df.loc["E", "cpu_self_ms"] == pytest.approx(0.020) and df.loc["E", "depth"] == 0
    assert df.loc["D", "parent"] == "C" and df.loc["D", "depth"] == 2
    assert df.loc["A", "parent"] == ""
    assert (df["source"] == "gpu").all()
    # device: summed durations of what was launched inside; total includes nested labels, self does not
    assert df.loc["A", "gpu_total_ms"] == pytest.approx(0.080)  # 5 + 25 + 30 + 10 + 10
    assert df.loc["A", "gpu_self_ms"] == pytest.approx(0.005)
    assert df.loc["C", "gpu_total_ms"] == pytest.approx(0.050)  # 30 + 10 (memcpy) + D's 10
    assert df.loc["C", "gpu_self_ms"] == pytest.approx(0.040)
    assert df.loc["B", "gpu_self_ms"] == pytest.approx(0.025) == df.loc["B", "gpu_total_ms"]
    assert df.loc["D", "gpu_total_ms"] == pytest.approx(0.010)
    assert df.loc["E", "gpu_total_ms"] == 0.0  # launched nothing
    assert df.loc["A", "gpu_self_ms"] + df.loc[["B", "C"], "gpu_total_ms"].sum() == pytest.approx(
        df.loc["A", "gpu_total_ms"])

    st = stage_table(label_table({"traceEvents": [_x("1_Prep", 0, 30), _x("2_Inf", 30, 90)]}))
    assert st["share"].tolist() == pytest.approx([0.25, 0.75])


def test_label_table_credits_the_launching_thread_and_each_occurrence():
    trace = {
        "traceEvents": [
            _x("S", 0, 10),
            _x("S", 20, 10),
            _launch(2, 1), _kernel(25, 4, 1),  # launched by the first S, runs during the second: first S's
            _launch(22, 2), _kernel(40, 6, 2),
            _launch(5, 3, tid=2), _kernel(50, 3, 3),  # thread 2 has no label open: unlabelled, not S
            # nested labels of one name count each activity once
            _x("N", 100, 50), _x("N", 110, 10), _launch(112, 4), _kernel(130, 7, 4),
            # device-only ranges (no host range) are not labels
            _x("G", 100, 10, cat="gpu_user_annotation", tid=9),
        ]
    }
    df = label_table(trace).set_index("label")
    assert df.loc["S", "count"] == 2 and df.loc["S", "gpu_total_ms"] == pytest.approx(0.010)
    assert df.loc["N", "gpu_total_ms"] == pytest.approx(0.007) and df.loc["N", "gpu_self_ms"] == pytest.approx(0.007)
    assert "G" not in df.index
    lab = kernel_summary(trace)["labels"].set_index("label_name")
    assert lab.loc["(unlabelled)", "ms"] == pytest.approx(0.003) and lab.loc["S", "total_ms"] == pytest.approx(0.010)


def test_stage_table_prefers_a_side_and_falls_back():
    trace = {
        "traceEvents": [
            _x("1_Prep", 0, 100),
            _x("2_Inference", 100, 300),
            _x("2.1_Step", 150, 100),
            _launch(160, 1), _kernel(170, 60, 1),
            _launch(260, 2), _kernel(270, 20, 2),
        ]
    }
    df = label_table(trace)
    st = stage_table(df)
    assert st["label"].tolist() == ["1_Prep", "2_Inference"]  # stages only: labels named <digit>_...
    assert st["ms"].tolist() == pytest.approx([0.0, 0.08]) and st["source"].tolist() == ["gpu", "gpu"]
    assert st["share"].tolist() == pytest.approx([0.0, 1.0])
    cpu = stage_table(df, prefer="cpu")
    assert cpu["ms"].tolist() == pytest.approx([0.1, 0.3]) and cpu["share"].tolist() == pytest.approx([0.25, 0.75])
    with pytest.raises(ValueError, match="prefer"):
        stage_table(df, prefer="tpu")
    # without device activity every stage falls back to host time
    host = stage_table(label_table({"traceEvents": [e for e in trace["traceEvents"] if e["cat"] == "user_annotation"]}))
    assert host["source"].tolist() == ["cpu", "cpu"] and host["ms"].tolist() == pytest.approx([0.1, 0.3])
