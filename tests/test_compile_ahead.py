"""Compiling a ladder's stacks ahead (wmbook.variants.compile_ahead): which stacks, the processes, their failures."""

from __future__ import annotations

import json
import math
import subprocess
from types import SimpleNamespace

import pytest
import torch

from wmbook import workloads
from wmbook.variants import compile_ahead as ca
from wmbook.variants.ladder import LadderRow, LadderSettings, _afresh
from wmbook.workloads import E2ESize

CPU = torch.device("cpu")


def _v(name, family="precision", denoiser=True):
    return SimpleNamespace(name=name, family=family, denoiser=denoiser)


BF16, COMPILE = _v("bf16"), _v("compile-whole", "compile")
FUSED, VAE, FP8 = _v("triton-fused", "kernels"), _v("vae-x", "decoder", denoiser=False), _v("fp8", "quant")


def _planned(steps, from_row, comparisons=None, keep_first=False):
    return ca.planned(steps, from_row, comparisons or {}, lambda s, i, b: _afresh(s, i, from_row, b, keep_first))


def test_planned_are_the_stacks_the_ladder_compiles_afresh_each_once():
    steps = [BF16, COMPILE, FUSED, VAE, FP8]
    got = _planned(steps, 2, {"04's best alone": [BF16, COMPILE]})
    # row 2 (the base) and every row that changes the denoiser; the decoder row goes on the row before's pipeline;
    # the comparison row is the base's stack: compiled once
    assert [[v.name for v in s] for s in got] == [["bf16", "compile-whole"], ["bf16", "compile-whole", "triton-fused"],
                                                  ["bf16", "compile-whole", "triton-fused", "vae-x", "fp8"]]
    # a kept first row (notebook 06 without on_first_row): the row after it builds afresh
    kept = _planned([BF16, COMPILE, VAE], 2, keep_first=True)
    assert [len(s) for s in kept] == [2, 3]
    assert _planned([BF16, FUSED], 1) == []  # nothing compiled: nothing to compile ahead


def test_ahead_marks_a_row_with_its_cold_first_call_or_why_not():
    ahead = ca.Ahead(3, runs={"bf16,compile-whole": {"ok": True, "first_call_s": 151.25},
                              "bf16,compile-whole,fp8": {"ok": False, "error": "exit code 1"}})
    row = LadderRow(stack=[], tolerance="bf16", forward=None, flops=0.0, note="built")
    ahead.mark(row, [BF16, COMPILE])
    assert row.compiled_ahead_s == 151.25 and "cold first call 151.2 s" in row.note and row.note.startswith("built; ")
    failed = LadderRow(stack=[], tolerance="bf16", forward=None, flops=0.0)
    ahead.mark(failed, ["bf16", "compile-whole", "fp8"])
    assert math.isnan(failed.compiled_ahead_s) and "its first call here is a cold compile" in failed.note
    other = LadderRow(stack=[], tolerance="bf16", forward=None, flops=0.0)
    ahead.mark(other, [BF16])
    assert other.note == "" and math.isnan(other.compiled_ahead_s)
    assert "1 of 2 compiled stacks" in ahead.summary() and "no more for" not in ahead.summary()
    assert ca.Ahead(1, fewer="2 cores").summary().endswith("(no more for 2 cores)")
    ahead.runs["bf16"] = {"ok": True, "first_call_s": 3.0, "e2e_error": "OutOfMemoryError: CUDA out of memory"}
    e2e = LadderRow(stack=[], tolerance="bf16", forward=None, flops=0.0)
    ahead.mark(e2e, [BF16])
    assert e2e.compiled_ahead_s == 3.0 and "end-to-end run there failed (OutOfMemoryError" in e2e.note


@pytest.mark.parametrize("bad", [-1, 1.5, True, "some", None])
def test_bad_process_counts_are_refused_naming_the_parameter(bad):
    with pytest.raises(ValueError, match=r"compile_ahead=.*allowed values: 'auto' or an integer >= 0"):
        ca.check_processes(bad)
    with pytest.raises(ValueError, match="compile_ahead="):
        LadderSettings(compile_ahead=bad)


def test_the_notebooks_check_compile_ahead_before_any_work():
    from wmbook.params import ParameterError
    from wmbook.studies import graphs, kernels

    for study in (kernels, graphs):
        assert study.validate(workload="wma", device="cpu").options.compile_ahead == "auto"
        with pytest.raises(ParameterError, match="compile_ahead='all' is not allowed"):
            study.validate(workload="wma", device="cpu", compile_ahead="all")


def test_no_compile_ahead_off_a_gpu_or_for_regional_compiles():
    wma, mg2 = workloads.get("wma"), workloads.get("mg2")
    st = LadderSettings(compile_ahead="auto", compile_backend="inductor")
    args = ([BF16, COMPILE, FUSED], 2, {}, CPU, st, lambda s, i, b: True)
    assert ca.for_ladder(wma, "tiny-wma", *args) is None  # a CPU
    gpu_args = ([BF16, COMPILE, FUSED], 2, {}, torch.device("cuda"), st, lambda s, i, b: True)
    assert ca.for_ladder(mg2, "tiny", *gpu_args) is None  # auto: mg2 compiles one DiT block (seconds)
    off = LadderSettings(compile_ahead=0, compile_backend="inductor")
    assert ca.for_ladder(wma, "tiny-wma", [BF16, COMPILE, FUSED], 2, {}, torch.device("cuda"), off,
                         lambda s, i, b: True) is None


def test_a_preset_that_is_not_the_workloads_own_is_not_compiled_ahead():
    wma = workloads.get("wma")
    ahead = ca.compile_ahead(wma, "no-such-preset", [[BF16], [FUSED]], CPU, processes=2)
    assert ahead.processes == 0 and "not the workload's preset" in ahead.skipped


def test_processes_report_each_stack_and_a_failure_without_raising():
    mg2 = workloads.get("mg2")
    ahead = ca.compile_ahead(mg2, mg2.presets["tiny"], [["bf16"], ["no-such-variant"]], CPU, processes=2,
                             backend="aot_eager", e2e=E2ESize(blocks=1, ddim_steps=1), progress=False)
    assert ahead.processes == 2 and ahead.wall_s > 0
    ok, bad = ahead.runs["bf16"], ahead.runs["no-such-variant"]
    assert ok["ok"] and ok["first_call_s"] >= 0 and ok["s"] >= ok["first_call_s"]
    assert not bad["ok"] and "no-such-variant" in bad["error"]
    assert ahead.first_call_s(["bf16"]) == ok["first_call_s"] and math.isnan(ahead.first_call_s(["no-such-variant"]))


def test_a_process_past_its_time_is_stopped_and_named():
    mg2 = workloads.get("mg2")
    ahead = ca.compile_ahead(mg2, "tiny", [["bf16"], ["fp16"]], CPU, processes=2, backend="aot_eager",
                             timeout_s=0.3, progress=False)
    assert all(not r["ok"] and "timeout_s=0" in r["error"] for r in ahead.runs.values())


def test_an_interrupt_stops_every_process(monkeypatch):
    started = []
    real = subprocess.Popen

    def popen(*a, **k):
        started.append(real(*a, **k))
        return started[-1]

    real_sleep, interrupted = ca.time.sleep, []

    def interrupt(s):  # the loop's first wait is interrupted; later sleeps (the stops' own waits) are real
        if not interrupted:
            interrupted.append(s)
            raise KeyboardInterrupt
        real_sleep(s)

    monkeypatch.setattr(ca.subprocess, "Popen", popen)
    monkeypatch.setattr(ca.time, "sleep", interrupt)
    with pytest.raises(KeyboardInterrupt):
        ca.compile_ahead(workloads.get("mg2"), "tiny", [["bf16"], ["fp16"]], CPU, processes=2,
                         backend="aot_eager", progress=False)
    assert len(started) == 2 and all(p.poll() is not None for p in started)


def test_auto_processes_one_per_two_cores_at_most_one_per_stack():
    assert ca.auto_processes(6, CPU, cpus=16) == (6, "")
    assert ca.auto_processes(6, CPU, cpus=4) == (2, "4 cores")
    assert ca.auto_processes(3, CPU, cpus=1) == (1, "1 core")


def test_the_check_tool_reports_each_stack_and_refuses_bad_names_first(tmp_path, capsys):
    from conftest import load_tool

    tool = load_tool("compile_ahead_check")
    out = tmp_path / "check.json"
    assert tool.main(["mg2", "tiny", "bf16", "bf16,static-caches", "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    assert [s["stack"] for s in res["stacks"]] == [["bf16"], ["bf16", "static-caches"]]
    assert all(r["ok"] for r in res["ahead"].values()) and res["ahead_s"] > 0
    with pytest.raises(SystemExit):
        tool.main(["mg2", "no-such-preset", "bf16"])
    assert "preset='no-such-preset' is not allowed" in capsys.readouterr().err
    with pytest.raises(Exception, match="no-such-variant"):
        tool.main(["mg2", "tiny", "bf16", "no-such-variant"])
