"""The results rows of notebooks 01, 02 and 04 on the tiny presets equal those of the code before the redesign
("workloads as objects"), wherever the definitions did not change.

tests/data/rows_tiny_before_redesign.csv was written by the pre-redesign code (commit 17fce5b) with the same
recipe as below: fixed ceilings, seed 0, one thread. Compared exactly: the set of (notebook, workload, preset, metric)
rows, units, gate verdicts, and every value that does not depend on timing or on floating-point kernels (FLOP counts,
floors at the given ceilings, counts, the whole breakdown of the committed H100 trace fixture: float64 sums, to 1e-9).
The ladder's gate errors (relative L2 against fp32) and the PSNR of its decoded frames are statistics of bf16
rounding, and which bf16 kernels run depends on the CPU (oneDNN picks AVX512-BF16, AMX or VNNI code from the
instructions the CPU really has, which `torch.backends.cpu.get_cpu_capability()` does not tell apart): they are
compared within one bf16 unit roundoff (`BF16_U`, see `_same_bf16_error`), the most two CPUs rounding the same bf16
operations differently can disagree about them by, and far less than what separates bf16 from fp16 or fp32.
Intended changes, checked explicitly: the `hygiene` variant is now four variants (one ladder row each; their sum is
the old row), and the end-to-end metric's unit is the metric's unit (`frames/s`, `ms`), where the old rows wrote the
metric's name.
"""

import math
from pathlib import Path

import pandas as pd
import pytest
import torch

from wmbook.studies import baseline, breakdown
from wmbook.studies import compile as compile_study

pytestmark = pytest.mark.numerics  # rerun with oneDNN and ATen held to older ISAs: `make test-isa`

BEFORE = Path(__file__).parent / "data" / "rows_tiny_before_redesign.csv"
BF16_U = torch.finfo(torch.bfloat16).eps / 2  # bf16's unit roundoff, 2**-8
TRACE = Path(__file__).parent / "data" / "trace_tiny_h100.json.gz"
CEILINGS = {"gemm_tflops": 1.0, "copy_gbps": 10.0, "sdpa_tflops": 0.5, "device_name": "cpu"}
TIMING_FREE = ("_tflop", "_floor_ms", "gemm_ceiling_tflops", "unet_forwards_per_iteration")
HYGIENE = {"mg2": "norm-input-dtype + kv-slot-write + action-hoist + cross-kv-prefill", "wma": "norm-input-dtype"}


def _same_bf16_error(got: float, want: float) -> bool:
    """Two relative errors of bf16 results (rel L2 against fp32) within one bf16 unit roundoff of each other."""
    return abs(got - want) <= BF16_U


def _same_bf16_psnr(got: float, want: float) -> bool:
    """Two PSNRs of bf16 results whose RMSEs over the data range, the errors they stand for, are within one bf16 unit
    roundoff; inf (bit-equal frames) only equals inf."""
    if math.isinf(got) or math.isinf(want):
        return got == want
    return _same_bf16_error(10 ** (-got / 20), 10 ** (-want / 20))


@pytest.fixture(autouse=True, scope="module")
def _one_thread(one_thread):
    """Every test of this module on one thread (tests/conftest.py)."""


@pytest.fixture(scope="module")
def before():
    return pd.read_csv(BEFORE, dtype={"gate": str}, keep_default_na=False, na_values=[""])


def _frame(rows) -> pd.DataFrame:
    return pd.DataFrame(rows)[["notebook", "workload", "preset", "variant", "metric", "unit", "value"] +
                              [c for c in ("gate", "rel_l2_vs_fp32") if c in pd.DataFrame(rows)]]


# metrics added after the redesign on purpose (each with its reason); every other row must stay as it was
ADDED_SINCE = {"01_baseline_profiling": {"vae_floor_ms", "vae_decode_over_floor"}}  # the decoder's own FLOP floor


@pytest.mark.parametrize("workload", ["mg2", "wma"])
def test_notebook_01_rows(before, workload, tmp_path):
    cfg = baseline.validate(workload=workload, device="cpu", warmup=0, repeats=1, output_dir=str(tmp_path),
                            results_path=str(tmp_path / "r.csv"))
    pipe, inputs = baseline.build(cfg)
    res = baseline.run_benchmark(pipe, inputs, cfg, CEILINGS)
    stages, _, _ = baseline.profile_stages(pipe, inputs, cfg)
    after = _frame(baseline.result_rows(cfg, res, stages))
    old = before[(before["notebook"] == "01_baseline_profiling") & (before["workload"] == workload)]
    added = set(after["metric"]) & ADDED_SINCE.get("01_baseline_profiling", set())
    after = after[~after["metric"].isin(added)]
    assert sorted(after["metric"]) == sorted(old["metric"])
    assert dict(zip(after["metric"], after["unit"])) == dict(zip(old["metric"], old["unit"]))
    a, b = after.set_index("metric")["value"], old.set_index("metric")["value"]
    fixed = [m for m in b.index if m.endswith(TIMING_FREE) or m in TIMING_FREE]
    assert len(fixed) >= 3
    for m in fixed:
        assert float(a[m]) == pytest.approx(float(b[m]), rel=1e-9), m


def test_notebook_02_rows_from_the_trace_fixture(before, tmp_path):
    cfg = breakdown.validate(workload="mg2", device="cpu", trace=str(TRACE), measure_overhead=False,
                             output_dir=str(tmp_path), results_path=str(tmp_path / "r.csv"))
    bd = breakdown.breakdown(TRACE, cfg, {"gemm_tflops": 802.0, "sdpa_tflops": 691.0, "copy_gbps": 3000.0})
    after = _frame(breakdown.result_rows(cfg, bd)).set_index("metric")
    old = before[before["notebook"] == "02_bottleneck_breakdown"].set_index("metric")
    assert sorted(after.index) == sorted(old.index)
    for m in old.index:
        assert float(after.loc[m, "value"]) == pytest.approx(float(old.loc[m, "value"]), rel=1e-9, abs=1e-12), m
        assert after.loc[m, "unit"] == old.loc[m, "unit"]


@pytest.mark.parametrize("workload,steps", [("mg2", ["bf16", "hygiene", "action-attn-fused"]),
                                            pytest.param("wma", ["bf16", "hygiene", "channels-last"],
                                                         marks=pytest.mark.slow)])
def test_notebook_04_ladder_rows(before, workload, steps, tmp_path):
    cfg = compile_study.validate(workload=workload, device="cpu", sections="ladder", warmup=0, repeats=1,
                                 e2e_repeats=1, output_dir=str(tmp_path), results_path=str(tmp_path / "r.csv"))
    lad = compile_study.run_ladder(compile_study.reference(cfg), cfg, steps, CEILINGS)
    after = _frame(compile_study.result_rows(cfg, ladder=lad))
    old = before[(before["notebook"] == "04_compile_autocast") & (before["workload"] == workload)].copy()
    old["variant"] = old["variant"].str.replace("hygiene", HYGIENE[workload], regex=False)
    metric = cfg.workload.metric
    old.loc[old["metric"] == metric.name, "unit"] = metric.unit  # the intended unit fix
    for (variant, m), g in old.groupby(["variant", "metric"]):
        hit = after[(after["variant"] == variant) & (after["metric"] == m)]
        assert len(hit) == 1, (variant, m)
        row, was = hit.iloc[0], g.iloc[0]
        assert row["unit"] == was["unit"], (variant, m)
        if m == "forward_ms":  # the gate: its verdict and error against fp32 are not timings
            assert row["gate"] == was["gate"], variant
            assert _same_bf16_error(float(row["rel_l2_vs_fp32"]), float(was["rel_l2_vs_fp32"])), variant
        if m == "psnr_db":
            assert _same_bf16_psnr(float(row["value"]), float(was["value"])), variant
    # the new rows between: one per hygiene variant, each gated
    parts = HYGIENE[workload].split(" + ")
    gates = after[after["metric"] == "forward_ms"].set_index("variant")["gate"]
    assert len(gates) == 1 + len(steps) - 1 + len(parts) and set(gates.iloc[1:]) == {"pass"}
    assert torch.get_num_threads() == 1
