"""Tests for the torch.profiler wrapper and the trace label breakdown."""

import gzip
import json
import math
import os

import pytest
import torch

from wmbook.profiling import (
    block_table,
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

    stages = stage_table(df)
    assert stages["label"].tolist() == ["1_Data_Preparation", "2_Pipeline_Inference"]
    assert stages["share"].sum() == pytest.approx(1.0)
    blocks = block_table(df)
    assert blocks["block"].tolist() == [0, 0] and blocks["t"].tolist()[1] == 1000

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


def test_label_table_self_time_arithmetic():
    # host: A [0,100) holds B [10,40) and C [50,90); C holds D [60,70). Times in us.
    # E on another thread overlaps A but is not nested in it.
    # device (stream 7), innermost label only: B [20,45), C [55,95) around D [70,80).
    trace = {
        "traceEvents": [
            _x("A", 0, 100),
            _x("B", 10, 30),
            _x("C", 50, 40),
            _x("D", 60, 10),
            _x("E", 5, 20, tid=2),
            _x("ProfilerStep#0", 0, 200),
            _x("B", 20, 25, cat="gpu_user_annotation", tid=7),
            _x("C", 55, 40, cat="gpu_user_annotation", tid=7),
            _x("D", 70, 10, cat="gpu_user_annotation", tid=7),
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
    # device: A spans 20..95 = 75, minus B (25) and C (40) -> 10 of gap
    assert df.loc["A", "gpu_total_ms"] == pytest.approx(0.075)
    assert df.loc["A", "gpu_self_ms"] == pytest.approx(0.010)
    assert df.loc["C", "gpu_total_ms"] == pytest.approx(0.040)
    assert df.loc["C", "gpu_self_ms"] == pytest.approx(0.030)
    assert df.loc["B", "gpu_self_ms"] == pytest.approx(0.025)
    assert math.isnan(df.loc["E", "gpu_total_ms"])

    st = stage_table(label_table({"traceEvents": [_x("1_Prep", 0, 30), _x("2_Inf", 30, 90)]}))
    assert st["share"].tolist() == pytest.approx([0.25, 0.75])


def test_label_table_matches_device_ranges_by_external_id_and_device_only():
    trace = {
        "traceEvents": [
            _x("S", 0, 10, ext=1),
            _x("S", 20, 10, ext=2),
            # second occurrence launched no work on stream 7 before the first; ids decide
            _x("S", 25, 4, cat="gpu_user_annotation", tid=7, ext=2),
            _x("S", 12, 6, cat="gpu_user_annotation", tid=8, ext=1),
            # device-only ranges nest among themselves
            _x("G", 100, 10, cat="gpu_user_annotation", tid=9),
            _x("H", 102, 3, cat="gpu_user_annotation", tid=9),
        ]
    }
    df = label_table(trace).set_index("label")
    assert df.loc["S", "count"] == 2 and df.loc["S", "gpu_total_ms"] == pytest.approx(0.010)
    assert df.loc["G", "gpu_self_ms"] == pytest.approx(0.007)
    assert df.loc["H", "parent"] == "G" and math.isnan(df.loc["G", "cpu_total_ms"])


def test_block_table_prefers_gpu():
    trace = {
        "traceEvents": [
            _x("2_Pipeline_Inference", 0, 1000),
            _x("2.3_Block_1", 500, 400),
            _x("2.3.1_Denoising_Step_0_t1000", 500, 100),
            _x("2.3.1_Denoising_Step_1_t750", 600, 100),
            _x("2.3_Block_0", 0, 400),
            _x("2.3.0_Denoising_Step_0_t1000", 0, 100),
            _x("2.3_Block_0", 50, 300, cat="gpu_user_annotation", tid=7),
        ]
    }
    bt = block_table(label_table(trace))
    assert bt["label"].tolist() == [
        "2.3_Block_0", "2.3.0_Denoising_Step_0_t1000",
        "2.3_Block_1", "2.3.1_Denoising_Step_0_t1000", "2.3.1_Denoising_Step_1_t750",
    ]  # fmt: skip
    assert bt["ms"].tolist() == pytest.approx([0.3, 0.1, 0.4, 0.1, 0.1])
    assert bt["source"].tolist()[:2] == ["gpu", "cpu"]
    assert block_table(label_table(trace), prefer="cpu")["ms"].tolist()[0] == pytest.approx(0.4)
    with pytest.raises(ValueError, match="prefer"):
        block_table(label_table(trace), prefer="tpu")
    assert bt["t"].tolist()[-1] == 750 and bt["step"].tolist()[-1] == 1
