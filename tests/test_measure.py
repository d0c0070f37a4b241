"""Tests for bench, check, results and device."""

import json
import math
import os

import numpy as np
import pandas as pd
import pytest
import torch

from wmbook import bench, check, device, results

# ---- bench ---------------------------------------------------------------------------------


def test_time_fn_counts_calls_and_orders_stats():
    calls = []
    t = bench.time_fn(lambda: calls.append(1), warmup=2, repeats=7, device="cpu")
    assert len(calls) == 9
    assert t.n == 7 and len(t.values) == 7 and t.unit == "ms"
    assert t.min <= t.p20 <= t.median <= t.p80 <= t.p95 <= t.max
    assert set(t.summary()) >= {"median", "p20", "p80", "p95", "mean", "std", "min", "max", "n"}
    assert "ms (p20" in str(t) and "n=7" in str(t)


def test_time_fn_runs_before_each_timed_call_outside_the_timing():
    # notebook 05 flushes the L2 this way before each timed graph replay: called once per timed call, not timed
    import time

    calls = []
    s = bench.time_fn(lambda: None, warmup=2, repeats=5, device="cpu", before=lambda: (calls.append(1),
                                                                                        time.sleep(0.02)))
    assert len(calls) == 5 and s.n == 5 and s.max < 15.0


def test_samples_percentiles_exact_and_unit():
    t = bench.Samples([5.0, 1.0, 3.0, 2.0, 4.0], "frames/s")
    assert str(t).startswith("3 frames/s (p20 1.8")
    assert t.median == 3.0
    assert t.p20 == pytest.approx(1.8)
    assert t.p80 == pytest.approx(4.2)
    assert t.mean == 3.0 and t.min == 1.0 and t.max == 5.0


@pytest.mark.parametrize("kw", [{"warmup": -1}, {"repeats": 0}])
def test_time_fn_rejects_bad_counts(kw):
    with pytest.raises(ValueError):
        bench.time_fn(lambda: None, device="cpu", **kw)


def test_time_back_to_back_counts_calls_and_divides_per_call():
    import time

    calls = []

    def fn():
        calls.append(1)
        time.sleep(0.002)

    t = bench.time_back_to_back(fn, calls=5, rounds=3, warmup=2, device="cpu")
    assert len(calls) == 2 + 5 * 3 and t.n == 3 and t.unit == "ms"
    assert 2.0 <= t.median < 50  # per call, not per round (5 calls of >= 2 ms)
    for kw in ({"calls": 0}, {"rounds": 0}, {"warmup": -1}, {"calls": True}):
        with pytest.raises(ValueError, match=f"{next(iter(kw))}=.*allowed values"):
            bench.time_back_to_back(fn, device="cpu", **kw)


def test_time_once_and_device_timer_cpu():
    assert bench.time_once(lambda: sum(range(1000)), "cpu") >= 0
    import time

    assert 20 <= bench.host_launch_ms(lambda: time.sleep(0.02), "cpu") < 2000
    dt = bench.DeviceTimer("cpu")
    dt.mark("a")
    sum(range(10000))
    dt.mark("b")
    dt.synchronize()
    assert dt.elapsed_ms("a", "b") >= 0
    assert dt.names == ["a", "b"]
    with pytest.raises(ValueError):
        dt.elapsed_ms("a", "zzz")


def test_stream_metrics_exact():
    # block 0 is warm-up-ish (excluded); steady blocks 1..3: 300 ms, 4+4+4 frames
    m = bench.stream_metrics([500.0, 100.0, 120.0, 80.0], [1, 4, 4, 4], first_frame_ms=42.0)
    assert m["fps"] == pytest.approx(12 / 0.3)
    assert m["bps"] == pytest.approx(3 / 0.3)
    assert m["first_frame_ms"] == 42.0
    assert m["block_ms_median"] == 100.0
    assert m["block_ms_p20"] == pytest.approx(88.0)
    assert m["block_ms_p80"] == pytest.approx(112.0)
    assert m["steady_blocks"] == 3 and m["steady_frames"] == 12


def test_stream_metrics_fallback_to_all_blocks():
    m = bench.stream_metrics([200.0], [1], first_frame_ms=200.0, steady_from=1)
    assert m["fps"] == pytest.approx(5.0)
    assert m["steady_from"] == 0
    with pytest.raises(ValueError):
        bench.stream_metrics([1.0, 2.0], [4], first_frame_ms=1.0)


# ---- check ---------------------------------------------------------------------------------


def test_compare_identical_passes():
    ref = torch.randn(4, 8)
    r = check.compare(ref.clone(), ref)
    assert r.passed and r.max_abs == 0 and r.rel_l2 == 0 and r.nan_count == 0
    assert "PASS" in str(r)


def test_bf16_noise_passes_bf16_fails_fp32():
    g = torch.Generator().manual_seed(0)
    ref = torch.randn(64, 256, generator=g)
    out = ref.bfloat16().float()
    assert check.compare(out, ref, dtype="bf16").passed
    assert check.compare(out, ref, dtype=torch.bfloat16).passed
    r = check.compare(out, ref, dtype="fp32")
    assert not r.passed
    assert r.ref_scale == pytest.approx(ref.abs().max().item())
    assert r.max_rel == pytest.approx(r.max_abs / r.ref_scale)
    with pytest.raises(check.CorrectnessError, match="latents"):
        check.gate(out, ref, dtype="fp32", what="latents")
    assert check.gate(out, ref, dtype="bf16").passed


def test_nan_never_passes_and_lists_concat():
    ref = [torch.zeros(3), torch.ones(2, 2)]
    out = [torch.zeros(3), torch.ones(2, 2)]
    assert check.compare(out, ref).passed
    out[1][0, 0] = float("nan")
    r = check.compare(out, ref, dtype="bf16", max_rel=1.0, mean_rel=1.0)
    assert not r.passed and r.nan_count == 1


def test_psnr_and_bad_input():
    ref = torch.zeros(100)
    out = torch.full((100,), 0.02)
    r = check.compare(out, ref, frames=True, dtype="bf16")
    assert r.psnr == pytest.approx(10 * math.log10(4 / 0.0004))
    assert not r.passed  # ref_scale 0 with nonzero diff -> infinite relative error
    with pytest.raises(ValueError, match="fp32"):
        check.compare(ref, ref, dtype="int8")
    with pytest.raises(ValueError):
        check.compare(torch.zeros(3), torch.zeros(4))


# ---- results -------------------------------------------------------------------------------


def _row(variant, value, **kw):
    return results.make_row(
        notebook="01", workload="causal", preset="tiny", variant=variant, metric="fps",
        value=value, unit="frames/s", params={"steps": 4}, warmup=1, repeats=3, **kw,
    )  # fmt: skip


def test_make_row_has_metadata():
    row = _row("eager", 1.5, timing=bench.Samples([1.0, 2.0, 3.0]), note="x")
    for col in ("device_name", "torch", "git_commit", "timestamp", "run_id", "python", "hostname", "host_cpu"):
        assert col in row
    assert row["host_cpu"] == f"{results._cpu_name()} x{os.cpu_count()}" and row["host_cpu"].split(" x")[0]
    import diffusers
    import transformers

    # the libraries whose numerics the rows depend on, as installed (a number traces to its library)
    assert row["diffusers"] == diffusers.__version__ and row["transformers"] == transformers.__version__
    assert row["numpy"] == np.__version__
    assert row["median"] == 2.0 and row["n"] == 3 and row["note"] == "x"
    assert json.loads(row["params"]) == {"steps": 4}
    assert list(row)[: len(results.COLUMNS)] == results.COLUMNS


def test_append_and_read(tmp_path):
    path = tmp_path / "r" / "results.csv"
    empty = results.read(path)
    assert empty.empty and list(empty.columns) == results.COLUMNS
    results.append(_row("eager", 1.0), path=path)
    results.append([_row("compile", 2.0, extra_col=7), _row("graphs", 3.0)], path=path)
    df = results.read(path)
    assert len(df) == 3 and "extra_col" in df.columns
    assert results.read(path, variant="compile")["value"].tolist() == [2.0]
    assert len(results.read(path, variant=["eager", "graphs"])) == 2
    assert results.params_of(df.iloc[0]) == {"steps": 4}
    with pytest.raises(ValueError):
        results.read(path, nope=1)


def test_env_override(tmp_path, monkeypatch):
    monkeypatch.setenv("WMBOOK_RESULTS", str(tmp_path / "x.csv"))
    assert results.default_path() == tmp_path / "x.csv"
    assert results.append(pd.DataFrame([_row("eager", 1.0)])) == tmp_path / "x.csv"
    assert len(results.read()) == 1


def test_interrupted_write_leaves_file_intact(tmp_path, monkeypatch):
    path = tmp_path / "results.csv"
    results.append(_row("eager", 1.0, git_note="0123456"), path=path)
    before = path.read_bytes()

    def broken(df, f):
        f.write("timestamp,run_id\npartial")
        raise KeyboardInterrupt

    monkeypatch.setattr(results, "_write_csv", broken)
    with pytest.raises(KeyboardInterrupt):
        results.append(_row("compile", 2.0), path=path)
    assert path.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["results.csv", "results.csv.lock"]
    monkeypatch.undo()
    results.append(_row("compile", 2.0), path=path)
    assert path.read_bytes().startswith(before)  # old rows rewritten byte-for-byte ("0123456" kept)


def test_out_of_memory_during_write_leaves_file_intact(tmp_path, monkeypatch):
    """A CUDA out-of-memory error (or any exception) in the middle of an append loses nothing already written."""
    path = tmp_path / "results.csv"
    results.append(_row("eager", 1.0), path=path)
    before = path.read_bytes()

    def oom(df, f):
        f.write("timestamp,run_id\npartial")
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(results, "_write_csv", oom)
    with pytest.raises(torch.OutOfMemoryError):
        results.append(_row("compile", 2.0), path=path)
    assert path.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["results.csv", "results.csv.lock"]


# ---- device --------------------------------------------------------------------------------


def test_measure_ceilings_quick_cpu(tmp_path):
    cache = tmp_path / "c.json"
    c = device.measure_ceilings("cpu", quick=True, cache_path=cache)
    assert c["gemm_tflops"] > 0 and c["copy_gbps"] > 0 and c["dtype"] == "fp32"
    assert cache.exists() and json.loads(cache.read_text())["gemm_tflops"] == c["gemm_tflops"]
    assert device.measure_ceilings("cpu", quick=True, cache_path=cache) == c  # from cache
    assert device.floor_ms(2e12, {"gemm_tflops": 1.0}) == pytest.approx(2000.0)
    with pytest.raises(ValueError):
        device.floor_ms(1.0, {})


def test_environment_cpu():
    env = device.environment("cpu")
    assert env["cpu_count"] >= 1 and "torch" in env and "cudnn" in env


def test_spin_up_is_a_no_op_on_cpu_and_checks_ms():
    from wmbook.bench import spin_up

    assert spin_up("cpu", 100.0) == 0.0
    for bad in (-1, True, "100", 1e6):
        with pytest.raises(ValueError, match=r"ms=.* allowed values: a number in \[0, 10000\]"):
            spin_up("cpu", bad)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_spin_up_keeps_the_gpu_busy_for_the_time_asked():
    from wmbook.bench import spin_up

    assert 50.0 <= spin_up("cuda", 50.0) < 1000.0
