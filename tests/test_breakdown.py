"""Trace breakdown: categories, label tree, per-forward split, launches/syncs, roofline, suggestions.

The fixture `tests/data/trace_tiny_h100.json.gz` is a real torch.profiler trace of the `tiny` preset
(2 blocks, bf16, fine DiT labels, shapes recorded) taken on an H100 with `tools/record_trace.py`.
"""

import gzip
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from wmbook.profiling import label, profile, set_labels
from wmbook.profiling.analysis import (
    CATEGORIES,
    LABEL_DEVICE_TIME_DEFINITION,
    activity_categories,
    classify,
    format_account,
    kernel_account,
    kernel_summary,
    label_table,
    label_tree,
    op_bytes,
    op_flops,
    stage_table,
    top_level_labels,
    trace_busy_ms,
    work,
)
from wmbook.profiling.breakdown import analyze
from wmbook.profiling.collect import device_busy_ms
from wmbook.profiling.trace import Trace

FIXTURE = Path(__file__).parent / "data" / "trace_tiny_h100.json.gz"
CEIL = {"gemm_tflops": 801.0, "copy_gbps": 3008.0, "sdpa_tflops": 690.0}


@pytest.fixture(scope="module")
def raw():
    with gzip.open(FIXTURE, "rt") as f:
        return json.load(f)


@pytest.fixture(scope="module")
def trace(raw):
    return Trace.load(raw)


@pytest.fixture(scope="module")
def bd(trace):
    return analyze(trace, region="2_Pipeline_Inference", ceilings=CEIL)


def _region_device_events(raw, region):
    """Independent recount: device activities whose launch call ran inside a host range named `region`."""
    ev = raw["traceEvents"]
    ranges = [(e["ts"], e["ts"] + e["dur"], e["tid"]) for e in ev
              if e.get("cat") == "user_annotation" and e.get("name") == region]
    corr = set()
    for e in ev:
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and e.get("ph") == "X":
            if any(a <= e["ts"] <= b and e["tid"] == tid for a, b, tid in ranges):
                corr.add(e["args"]["correlation"])
    return [e for e in ev if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
            and e.get("args", {}).get("correlation") in corr]


def test_categories_reconcile_with_gpu_busy_time_of_region(raw, bd):
    dev = _region_device_events(raw, "2_Pipeline_Inference")
    busy_ms = sum(e["dur"] for e in dev) / 1e3
    assert bd.source == "gpu"
    assert set(bd.categories["category"]) == set(CATEGORIES)
    total = bd.categories["ms"].sum()
    assert total == pytest.approx(busy_ms, rel=0.01)  # the 1 % reconciliation
    assert bd.stats["busy_ms"] == pytest.approx(busy_ms, rel=0.01)
    # every device activity counted once: categories' counts = independent count
    assert int(bd.categories["kernels"].sum()) == len(dev)
    # single stream: the union of kernel intervals equals their sum (nothing double counted)
    assert bd.stats["busy_union_ms"] == pytest.approx(total, rel=0.01)
    assert bd.categories["share"].sum() == pytest.approx(1.0, abs=1e-9)
    # the whole trace holds more work than the region (data prep, export)
    whole = analyze(raw, region=None)
    assert whole.stats["busy_ms"] > bd.stats["busy_ms"]


def test_label_tree_self_plus_children_is_total(bd):
    t = bd.label_tree
    root = t[t["depth"] == 0]
    assert root["label"].tolist() == ["2_Pipeline_Inference"]
    assert float(root["total_ms"].iloc[0]) == pytest.approx(bd.stats["busy_ms"], rel=1e-9)
    kids = t.groupby("parent_path")["total_ms"].sum()
    for _, r in t.iterrows():
        child = float(kids.get(r["path"], 0.0))
        assert r["self_ms"] + child == pytest.approx(r["total_ms"], rel=1e-9, abs=1e-9), r["path"]
    blocks = t[t["label"].str.match(r"^2\.3_Block_\d+$")]
    assert len(blocks) == 2 and (blocks["total_ms"] > 0).all()


def test_forward_split_covers_every_forward(bd):
    fs = bd.forward_split
    assert fs.attrs["forwards"] == 8  # 2 blocks x (3 denoising steps + cache refresh)
    t = bd.label_tree
    fwd_total = t.loc[t["label"] == "DiffusionModel_Forward", "total_ms"].sum()
    assert (fs["ms_per_forward"].sum() * 8) == pytest.approx(fwd_total, rel=1e-6)
    assert fs["share"].sum() == pytest.approx(1.0)
    # the fine labels are measured, and the action modules and attention are among them
    assert {"DiT_Action", "DiT_Attention", "DiT_FFN", "DiT_Norm_Modulation", "DiT_SelfAttn_QKV_RoPE"} <= set(
        fs["fine_label"])
    assert fs.set_index("fine_label").loc["untagged", "share"] < 0.05
    assert bd.stats["kernels_per_forward"] == pytest.approx(fs["kernels_per_forward"].sum(), rel=1e-9)


def test_idle_launches_and_syncs(raw, bd):
    s = bd.stats
    assert 0 < s["idle_share"] < 1
    assert s["idle_ms"] == pytest.approx(s["gpu_span_ms"] - s["busy_union_ms"])
    assert s["kernels"] + s["memcpy_memset"] == int(bd.categories["kernels"].sum())
    assert 0 <= s["short_kernel_share"] <= 1
    # .item() calls inside the region, counted from the raw trace
    ev = raw["traceEvents"]
    reg = [(e["ts"], e["ts"] + e["dur"]) for e in ev if e.get("name") == "2_Pipeline_Inference"
           and e.get("cat") == "user_annotation"]
    items = sum(1 for e in ev if e.get("name") == "aten::item" and e.get("cat") == "cpu_op"
                and any(a <= e["ts"] <= b for a, b in reg))
    reads = sum(1 for e in ev if e.get("name") == "aten::_local_scalar_dense" and e.get("cat") == "cpu_op"
                and any(a <= e["ts"] <= b for a, b in reg))
    syncs = bd.syncs.set_index("call")
    assert items > 0 and syncs.loc["aten::item", "count"] == items
    assert s["host_reads"] == reads >= items  # each .item() reads once; int(tensor) reads without aten::item
    assert s["syncs"] == syncs.loc["cudaStreamSynchronize", "count"] >= reads
    assert 0 < s["syncs_in_forward"] <= reads and s["syncs_per_forward"] == s["syncs_in_forward"] / 8
    hot = bd.cpu_hotspots
    assert {"aten::copy_", "aten::to"} & set(hot["name"])
    assert (bd.casts["count"] > 0).all()


def test_roofline_uses_recorded_shapes_and_measured_ceilings(bd):
    rf = bd.roofline.set_index("category")
    for cat in ("GEMM/linear", "attention", "convolution"):
        assert rf.at[cat, "gflop"] > 0 and rf.at[cat, "tflops"] > 0
        assert rf.at[cat, "frac_of_ceiling"] == pytest.approx(rf.at[cat, "tflops"] / rf.at[cat, "ceiling_tflops"])
    assert rf.at["attention", "ceiling_tflops"] == CEIL["sdpa_tflops"]
    assert rf.at["GEMM/linear", "ceiling_tflops"] == CEIL["gemm_tflops"]
    assert rf.at["copy/cast", "gbps"] > 0


def test_a_forward_account_rates_its_matrix_work_against_the_gemm_ceiling():
    """Notebook 06's account of its best row: the kernel categories of one profiled forward (from a replayed graph,
    whose profile names no operators) with the model's FLOPs per category: the H200's DiT forward, 7.44 TFLOP of
    GEMMs in 10.84 ms is 686 TFLOP/s, 87% of a 788 TFLOP/s ceiling."""
    from wmbook.profiling.analysis.roofline import account_sentence, category_account

    cats = {"GEMM/linear": 10.84, "attention": 5.10, "normalization": 2.13, "elementwise/activation": 1.45,
            "copy/cast": 0.60, "memcpy/memset": 0.0}
    acc = category_account(cats, {"GEMM/linear": 7.4355e12, "attention": 2.6944e12, "convolution": 1.2e9},
                           {"gemm_tflops": 788.0})
    assert list(acc.index) == ["GEMM/linear", "attention", "normalization", "elementwise/activation", "copy/cast"]
    assert acc.at["GEMM/linear", "tflops"] == pytest.approx(686, abs=1)
    assert acc.at["GEMM/linear", "frac_of_gemm_ceiling"] == pytest.approx(686 / 788, abs=2e-3)
    assert acc.at["attention", "tflops"] == pytest.approx(528, abs=1) and math.isnan(acc.at["copy/cast", "tflops"])
    assert acc["share"].sum() == pytest.approx(1.0)
    text = account_sentence("One forward of `x`", acc)
    assert text.startswith("One forward of `x` spends its 20.1 ms of GPU time: GEMM/linear 10.8 ms (54%) at 686 "
                           "TFLOP/s, 87% of the measured GEMM ceiling; attention 5.1 ms (25%) at 528 TFLOP/s, 67% of "
                           "the measured GEMM ceiling; normalization 2.13 ms (11%);"), text
    assert text.endswith("The kernels without matrix work take 4.18 ms of it."), text
    # no ceiling measured: the rates alone; no FLOPs known: the times alone; nothing timed (a CPU run): nothing
    assert "ceiling" not in account_sentence("y", category_account(cats, {"GEMM/linear": 7.4355e12}))
    assert "TFLOP/s" not in account_sentence("y", category_account(cats)) and "without matrix" not in \
        account_sentence("y", category_account(cats))
    assert account_sentence("y", category_account({})) == ""


def test_notebook_06_says_where_its_best_rows_forward_goes(monkeypatch):
    """At the real shape notebook 06's interpretation follows its FPS goal with the account of the best gated row's
    forward, its matrix work rated by the DiT's own FLOP count against the measured GEMM ceiling."""
    from types import SimpleNamespace

    import pandas as pd

    from wmbook import workloads
    from wmbook.presets import get_preset
    from wmbook.studies import graphs as study

    e2e = pd.DataFrame({"gate": ["pass", "pass"], "frames judged": [True, True], "fps": [80.0, 90.5]},
                       index=pd.Index(["a", "a + b"], name="row"))
    monkeypatch.setattr(study, "e2e_table", lambda lad: e2e)
    monkeypatch.setattr(study, "forward_table", lambda lad: pd.DataFrame())
    rows = [SimpleNamespace(variant=v, note="", categories=c) for v, c in
            (("fp32", {}), ("a", {"GEMM/linear": 12.0}), ("a + b", {"GEMM/linear": 10.84, "normalization": 2.13}))]
    lad = SimpleNamespace(rows=rows, failures=lambda: [], categories=lambda: pd.DataFrame())
    cfg = SimpleNamespace(workload=workloads.get("mg2"), preset=get_preset("mg2-universal"), tiny=False)
    text = study.interpret(cfg, lad, ceilings={"gemm_tflops": 788.0})
    assert "The best gated row, `a + b`, streams at 90.5 FPS" in text
    assert ("One forward of `a + b` spends its 13 ms of GPU time: GEMM/linear 10.8 ms (84%) at 686 TFLOP/s, 87% of "
            "the measured GEMM ceiling; normalization 2.13 ms (16%).") in text, text
    assert "TFLOP/s" not in study.interpret(cfg, SimpleNamespace(**{**vars(lad), "rows": rows[:2]}))


def test_suggestions_ranked_and_point_at_notebooks(bd):
    sg = bd.suggestions
    assert len(sg) >= 3
    assert sg["rank"].tolist() == list(range(1, len(sg) + 1))
    assert (np.diff(sg["estimated_saving_ms"].to_numpy()) <= 1e-12).all()
    assert sg["notebook"].str.match(r"^0[3-6]_").all()
    # tiny shapes on an H100 are launch bound: idle and launch findings point to CUDA graphs
    top = sg.iloc[0]
    assert top["notebook"] == "06_cuda_graphs"


def test_json_round_trip(bd):
    d = json.loads(bd.to_json())
    assert d["region"] == "2_Pipeline_Inference"
    assert d["summary"]["top_categories"][0]["ms"] == pytest.approx(bd.categories["ms"].iloc[0])
    assert set(d["tables"]) >= {"categories", "label_tree", "forward_split", "roofline", "suggestions"}


def test_bad_region_lists_allowed_labels(raw):
    with pytest.raises(ValueError, match=r"region='nope'.*1_Data_Preparation"):
        analyze(raw, region="nope")
    assert "2_Pipeline_Inference" in top_level_labels(raw)


def _k(name, ts, dur, corr, ext):
    return {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": ts, "dur": dur,
            "args": {"correlation": corr, "External id": ext, "stream": 7}}


def _op(name, ts, dur, ext, tid=1):
    return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur,
            "args": {"External id": ext}}


def _rt(ts, corr, name="cudaLaunchKernel"):
    return {"ph": "X", "cat": "cuda_runtime", "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": 1,
            "args": {"correlation": corr}}


def test_unknown_kernels_land_in_other_and_are_listed():
    ev = [
        {"ph": "X", "cat": "user_annotation", "name": "R", "pid": 1, "tid": 1, "ts": 0, "dur": 100},
        _op("aten::mystery_op", 10, 5, ext=1), _rt(11, 101), _k("my_strange_kernel", 20, 4, 101, 1),
        _op("aten::scaled_dot_product_attention", 30, 20, ext=2),
        _op("aten::bmm", 31, 5, ext=3), _rt(32, 102), _k("cutlass_gemm_bf16", 40, 6, 102, 3),
        _op("aten::add", 60, 5, ext=4), _rt(61, 103), _k("vectorized_elementwise_kernel", 70, 2, 103, 4),
    ]
    bd = analyze({"traceEvents": ev}, region="R")
    cat = bd.categories.set_index("category")
    assert cat.at["other", "ms"] == pytest.approx(0.004)
    assert cat.at["attention", "ms"] == pytest.approx(0.006)  # bmm inside SDPA belongs to attention
    assert cat.at["elementwise/activation", "ms"] == pytest.approx(0.002)
    assert bd.unclassified["name"].tolist() == ["my_strange_kernel"]
    assert bd.unclassified["op_name"].tolist() == ["aten::mystery_op"]
    assert bd.stats["idle_ms"] == pytest.approx((72 - 20 - 12) / 1e3)


def test_classify_by_kernel_and_op_names():
    assert classify("sm90_xmma_gemm_bf16bf16_bf16f32", None) == "GEMM/linear"
    assert classify("nvjet_tst_128x256_64x4_2x1_v_bz_coopA_TNT", None) == "GEMM/linear"
    assert classify("flash_fwd_kernel", None) == "attention"
    assert classify("pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits>",
                    "aten::_flash_attention_forward") == "attention"
    assert classify("cutlass_80_tensorop_s16816gemm", "aten::addmm") == "GEMM/linear"
    assert classify("cudnn::implicit_convolve_sgemm", "aten::cudnn_convolution") == "convolution"
    assert classify("vectorized_layer_norm_kernel", "aten::native_layer_norm") == "normalization"
    assert classify("unrolled_elementwise_kernel<direct_copy_kernel_cuda>", "aten::copy_") == "copy/cast"
    assert classify("reduce_kernel<512, 1>", "aten::mean") == "reduction"
    assert classify("Memcpy HtoD (Pageable -> Device)", None, cat="gpu_memcpy") == "memcpy/memset"
    assert classify("some_kernel_nobody_knows", "aten::weird") == "other"


@pytest.mark.parametrize("name, want", [
    # inductor names a kernel after the aten ops it fused: the bias add after a cuDNN convolution and the GroupNorm
    # statistics of a convolution's output are not convolution work (they were, by the first matching name rule)
    ("triton_poi_fused_convolution_3", "elementwise/activation"),
    ("triton_poi_fused__to_copy_add_convolution_silu_4", "elementwise/activation"),
    ("triton_red_fused_convolution_native_group_norm_0", "normalization"),
    ("triton_per_fused_native_layer_norm_12", "normalization"),
    ("triton_per_fused__softmax_2", "reduction"),
    ("triton_red_fused_mean_1", "reduction"),
    ("triton_poi_fused__to_copy_clone_5", "copy/cast"),
    ("triton_poi_fused_cat_7", "copy/cast"),
    ("triton_poi_fused_add_mul_0", "elementwise/activation"),
    ("triton_tem_fused_convolution_1", "convolution"),
    ("triton_tem_fused_addmm_2", "GEMM/linear"),
    # wmbook's own kernels (compiled: no launching op) and ops (eager: the launching op)
    ("_gn_cl_apply_kernel", "normalization"),
    ("_group_norm_silu_stats_kernel", "normalization"),
    ("_adaln_modulate_kernel", "normalization"),
    ("_gated_residual_adaln_kernel", "normalization"),
    ("_qk_norm_rope_kernel", "normalization"),
])
def test_classify_inductor_and_wmbook_kernels(name, want):
    from wmbook.profiling.analysis.categories import inductor_category

    assert classify(name, None) == want
    assert (inductor_category(name) is None) == (not name.startswith("triton_"))


def test_classify_wmbook_ops_by_launching_op():
    """Every op the package defines has its category as the launching op of an eager call: the norms with their fused
    epilogues are normalization, the attentions attention, the GEGLU GEMM a GEMM. A new op must be given its category
    here."""
    import re
    from pathlib import Path

    src = Path(__file__).resolve().parents[1] / "wmbook" / "kernels"
    ops = {m for f in src.glob("*.py") for m in re.findall(r'define_op\("(wmbook::\w+)"\)', f.read_text())}
    assert len(ops) >= 6, ops
    other = {"wmbook::short_attention": "attention", "wmbook::block_attention": "attention",
             "wmbook::geglu_linear": "GEMM/linear"}
    for op in ops:
        assert classify("any_kernel_name", op) == other.get(op, "normalization"), op
    assert classify("_short_attention_kernel", None) == "attention"
    assert classify("_block_attention_kernel", None) == "attention"
    assert classify("_geglu_linear_kernel", None) == "GEMM/linear"
    assert classify("any_kernel_name", "wmbook::something_else") == "other"


def test_op_flops_and_bytes():
    assert op_flops("aten::mm", [[64, 32], [32, 16]]) == 2 * 64 * 32 * 16
    assert op_flops("aten::addmm", [[16], [64, 32], [32, 16]]) == 2 * 64 * 32 * 16
    assert op_flops("aten::bmm", [[4, 64, 32], [4, 32, 16]]) == 2 * 4 * 64 * 32 * 16
    # q [1, 2, 10, 8], k/v [1, 2, 20, 8]: QK^T and PV
    assert op_flops("aten::scaled_dot_product_attention", [[1, 2, 10, 8], [1, 2, 20, 8], [1, 2, 20, 8]]) == \
        2 * 2 * 10 * 20 * 8 * 2
    # conv2d x [1, 3, 8, 8], w [4, 3, 3, 3], stride 1, pad 1 -> out 8x8
    conc = ["", "", "", "[1, 1]", "[1, 1]", "[1, 1]", "False", "[0, 0]", "1"]
    assert op_flops("aten::convolution", [[1, 3, 8, 8], [4, 3, 3, 3]], conc) == 2 * 4 * 64 * 3 * 9
    assert op_bytes([[10, 10], [10, 10]], ["float", "float"], "aten::copy_") == 800
    assert op_bytes([[10, 10], [10, 10]], ["float", "c10::BFloat16"], "aten::add") == 400 + 200 + 400
    assert op_bytes([[], []], ["Scalar", "Scalar"]) is None


def test_cpu_only_trace_falls_back_to_cpu_self_time(tmp_path):
    conv = torch.nn.Conv2d(3, 8, 3, padding=1)
    lin = torch.nn.Linear(64, 64)
    x, y = torch.randn(1, 3, 32, 32), torch.randn(128, 64)

    def step():
        with label("Region"):
            for _ in range(3):
                conv(x)
                lin(y).softmax(-1)

    set_labels(True)
    res = profile(step, warmup=0, out_dir=tmp_path, record_shapes=True, activities=["cpu"])
    bd = analyze(res.trace_path, region="Region", ceilings={"gemm_tflops": 1.0, "copy_gbps": 10.0})
    assert bd.source == "cpu"
    cat = bd.categories.set_index("category")
    assert cat.at["convolution", "ms"] > 0 and cat.at["GEMM/linear", "ms"] > 0
    assert cat.at["GEMM/linear", "kernels"] == 6  # CPU mode counts ops: 3 aten::linear + their 3 aten::addmm
    assert math.isnan(bd.stats["idle_share"])
    rf = bd.roofline.set_index("category")
    assert rf.at["GEMM/linear", "gflop"] == pytest.approx(3 * 2 * 128 * 64 * 64 / 1e9)


def test_trace_busy_ms_is_the_union_of_device_activities(raw, bd):
    """Recounted from the raw JSON: merged [ts, ts+dur) intervals of every kernel/copy/set in the trace."""
    iv = sorted((e["ts"], e["ts"] + e["dur"]) for e in raw["traceEvents"]
                if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"))
    total, (cs, ce) = 0.0, iv[0]
    for a, b in iv[1:]:
        if a > ce:
            total, cs, ce = total + ce - cs, a, b
        else:
            ce = max(ce, b)
    expect = (total + ce - cs) / 1e3
    got = trace_busy_ms(raw)
    assert got == pytest.approx(expect, rel=1e-9)
    assert got > bd.stats["busy_union_ms"]  # the whole trace holds more than the region
    assert trace_busy_ms(FIXTURE) == pytest.approx(got, rel=1e-12)  # from the file too


def test_device_busy_ms_off_cuda_and_bad_calls():
    assert math.isnan(device_busy_ms(lambda: torch.ones(3).sum(), "cpu"))
    with pytest.raises(ValueError, match="calls"):
        device_busy_ms(lambda: None, "cpu", calls=0)


def test_kernel_summary_per_call_by_kernel_category_and_label():
    # two calls; label L holds a GEMM kernel (launched by aten::mm) and a triton kernel; one kernel unlabelled
    def ev(name, cat, ts, dur, **args):
        return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": 1, "args": args}

    events = []
    for c, base in enumerate((0, 1000)):
        events += [
            ev("L", "user_annotation", base, 500),
            ev("aten::mm", "cpu_op", base + 10, 50, **{"External id": 10 + c}),
            ev("cudaLaunchKernel", "cuda_runtime", base + 20, 5, correlation=100 + c),
            ev("cudaLaunchKernel", "cuda_runtime", base + 100, 5, correlation=200 + c),
            ev("cudaLaunchKernel", "cuda_runtime", base + 600, 5, correlation=300 + c),
        ]
        events += [
            {"ph": "X", "cat": "kernel", "name": "sm90_xmma_gemm_bf16", "ts": base + 30, "dur": 300, "pid": 0,
             "tid": 7, "args": {"correlation": 100 + c, "External id": 10 + c, "stream": 7}},
            {"ph": "X", "cat": "kernel", "name": "triton_poi_fused_add_mul_0", "ts": base + 340, "dur": 100,
             "pid": 0, "tid": 7, "args": {"correlation": 200 + c, "stream": 7}},
            {"ph": "X", "cat": "kernel", "name": "triton_poi_fused_add_mul_0", "ts": base + 610, "dur": 100,
             "pid": 0, "tid": 7, "args": {"correlation": 300 + c, "stream": 7}},
        ]
    s = kernel_summary({"traceEvents": events}, calls=2, top=5)
    k = s["kernels"].set_index("name")
    assert k.loc["sm90_xmma_gemm_bf16", "ms"] == pytest.approx(0.3)  # per call
    assert k.loc["triton_poi_fused_add_mul_0", "count"] == 2 and k.loc["triton_poi_fused_add_mul_0", "mean_us"] == 100
    assert k.loc["sm90_xmma_gemm_bf16", "category"] == "GEMM/linear"
    assert s["kernels"]["share"].sum() == pytest.approx(1.0)
    lab = s["labels"].set_index("label_name")["ms"]
    assert lab["L"] == pytest.approx(0.4) and lab["(unlabelled)"] == pytest.approx(0.1)
    assert s["categories"]["ms"].sum() == pytest.approx(0.5)
    busy = trace_busy_ms({"traceEvents": events}) / 2
    assert s["categories"].attrs["busy_ms"] == pytest.approx(busy) == pytest.approx(0.5)
    assert kernel_summary({"traceEvents": []})["kernels"].empty
    # the tools' plain-data form of a one-call trace (their JSON) and its printed lines
    acc = kernel_account({"traceEvents": events}, top=1)
    assert acc["categories_ms"] == pytest.approx({"GEMM/linear": 0.6, "elementwise/activation": 0.4})
    assert acc["gpu_busy_ms"] == pytest.approx(1.0) and [k["name"] for k in acc["top"]] == ["sm90_xmma_gemm_bf16"]
    text = format_account(acc)
    assert "GPU busy 1.00 ms; by category (ms): GEMM/linear 0.60" in text and "sm90_xmma_gemm_bf16" in text
    assert "sm90" not in format_account(acc, top_kernels=False)
    assert kernel_account({"traceEvents": []}) == {"gpu_busy_ms": 0.0, "categories_ms": {}, "top": []}


# --- the numbers of the H100 fixture, recorded before the analysis was split into one function per question -----


def test_fixture_numbers_are_pinned(raw, bd):
    """analyze() on the fixture gives exactly what the single-function breakdown gave (recorded before the split)."""
    s = bd.stats
    assert s["busy_ms"] == pytest.approx(12.174697, rel=1e-9)
    assert s["busy_union_ms"] == pytest.approx(12.174748046875, rel=1e-9)
    assert s["gpu_span_ms"] == pytest.approx(208.4567353515625, rel=1e-9)
    assert s["idle_share"] == pytest.approx(0.9415958039142162, rel=1e-9)
    assert (s["kernels"], s["memcpy_memset"], s["launch_calls"], s["forwards"]) == (5785, 259, 5785, 8)
    assert s["kernels_per_forward"] == pytest.approx(356.375)
    assert (s["host_reads"], s["syncs"], s["syncs_in_forward"]) == (16, 20, 16)
    assert s["aten_ops_per_forward"] == pytest.approx(1507.0) and s["casts_per_forward"] == pytest.approx(211.875)
    assert s["decode_ms"] == pytest.approx(6.966639, rel=1e-9)
    assert s["forward_share"] == pytest.approx(0.418967059303406, rel=1e-9)
    assert (s["forward_unit"], s["forwards_per_block"]) == ("block", 4.0)
    cat = bd.categories.set_index("category")
    expect = {"elementwise/activation": (3.991594, 2626), "copy/cast": (3.274980, 1680),
              "convolution": (2.909045, 891), "reduction": (0.733383, 230), "GEMM/linear": (0.575420, 238),
              "memcpy/memset": (0.272160, 259), "attention": (0.234399, 54), "normalization": (0.183716, 66),
              "other": (0.0, 0)}
    for c, (ms, n) in expect.items():
        assert cat.at[c, "ms"] == pytest.approx(ms, abs=1e-9) and cat.at[c, "kernels"] == n, c
    t = bd.label_tree.set_index("path")
    assert t.at["2_Pipeline_Inference/2.3_Block_0", "total_ms"] == pytest.approx(5.978336, abs=1e-9)
    assert t.at["2_Pipeline_Inference/2.3_Block_1", "total_ms"] == pytest.approx(6.188874, abs=1e-9)
    assert t.at["2_Pipeline_Inference/2.1_KV_Cache_Initialization", "self_ms"] == pytest.approx(0.007487, abs=1e-9)
    assert t.at["2_Pipeline_Inference", "kernels"] == 6044
    fs = bd.forward_split.set_index("fine_label")
    assert fs.at["DiT_Action", "ms_per_forward"] == pytest.approx(0.241488, abs=1e-9)
    assert fs.at["DiT_Action", "kernels_per_forward"] == 148.0
    assert fs.at["DiT_SelfAttn_QKV_RoPE", "share"] == pytest.approx(0.200171855496, rel=1e-9)
    rf = bd.roofline.set_index("category")
    assert rf.at["GEMM/linear", "gflop"] == pytest.approx(0.078083584, rel=1e-9)
    assert rf.at["convolution", "tflops"] == pytest.approx(1.2671298848934949, rel=1e-9)
    assert rf.at["copy/cast", "covered_ms"] == pytest.approx(2.105310, abs=1e-9)
    assert rf.at["elementwise/activation", "gbps"] == pytest.approx(55.535276878176, rel=1e-9)
    summ = bd.summary()
    assert summ["attention_tflops"] == pytest.approx(0.07989331012504318, rel=1e-9)
    assert [c["category"] for c in summ["top_categories"]] == ["elementwise/activation", "copy/cast", "convolution",
                                                               "reduction", "GEMM/linear"]
    sg = bd.suggestions
    assert sg["notebook"].tolist() == ["06_cuda_graphs"] * 2 + ["04_compile_autocast"] * 3 + [
        "05_triton_kernels"] + ["04_compile_autocast"] * 2
    assert sg["estimated_saving_ms"].iloc[0] == pytest.approx(196.524312953125, rel=1e-9)


def test_trace_tables_are_linked(trace):
    assert trace.source == "gpu" and Trace.load(trace) is trace
    K, L, O, R = trace.device_activities, trace.labels, trace.ops, trace.runtime_calls
    assert {"name", "kind", "start_us", "duration_us", "launch_us", "op", "label"} <= set(K.columns)
    assert {"name", "start_us", "end_us", "parent", "depth", "path"} <= set(L.columns)
    assert len(K) == 7687 + 290 + 83 and set(K["kind"]) == {"kernel", "gpu_memcpy", "gpu_memset"}
    # each activity's label is the innermost label around its launch call (same correlation id)
    launch = R.set_index("correlation")["start_us"]
    some = K[K["label"] >= 0].iloc[::500]
    for _, k in some.iterrows():
        t = launch.loc[k["correlation"]]
        assert k["launch_us"] == t
        lab = L.loc[k["label"]]
        assert lab["start_us"] <= t <= lab["end_us"]
        inner = L[(L["start_us"] <= t) & (L["end_us"] >= t) & (L["depth"] > lab["depth"])]
        assert inner.empty
        if k["op"] >= 0:  # the launching op: the first op with the activity's External id
            assert O.at[k["op"], "external_id"] == k["external_id"]
    assert (K["op"] >= 0).mean() > 0.9
    assert Trace.load(FIXTURE).device_activities["duration_us"].sum() == pytest.approx(K["duration_us"].sum())


def test_kernel_summary_uses_the_category_rule_of_analyze(trace):
    """(a) Same activities (the whole trace), same categories: ms and counts per category agree."""
    whole = analyze(trace, region=None).categories.set_index("category")
    ks = kernel_summary(trace)["categories"].set_index("category")
    assert set(ks.index) == set(whole.index[whole["kernels"] > 0])
    for c in ks.index:
        assert ks.at[c, "ms"] == pytest.approx(whole.at[c, "ms"], rel=1e-12)
        assert ks.at[c, "kernels"] == whole.at[c, "kernels"]
    # per activity: the kernel summary's rule and the breakdown's rows are one function
    w = work(trace, None)
    assert (w["category"].to_numpy() == activity_categories(trace)).all()
    # the enclosing-op rule: kernels that the innermost op alone would call elementwise/copy count as convolution
    # because an enclosing convolution op launched them (kernel_summary missed this before it shared the rule)
    K = trace.device_activities.assign(category=activity_categories(trace))
    op_names = trace.ops["name"].tolist()
    innermost = np.array([classify(n, op_names[o] if o >= 0 else None, c)
                          for n, o, c in zip(K["name"], K["op"], K["kind"])])
    moved = (K["category"] == "convolution").to_numpy() & (innermost != "convolution")
    assert moved.sum() > 100
    assert ks.at["convolution", "ms"] > float(K.loc[innermost == "convolution", "duration_us"].sum()) / 1e3


def test_label_table_device_time_is_the_label_tree_total(trace, bd):
    """(b) label_table's gpu_total_ms for a label = the label tree's total for that label (every occurrence)."""
    assert "summed duration" in LABEL_DEVICE_TIME_DEFINITION
    lt = label_table(trace).set_index("label")
    assert (lt["source"] == "gpu").all()
    tree = label_tree(trace, None)
    tree = tree[tree["path"] != "(unlabelled)"]
    for name, row in lt.iterrows():
        rows = tree[tree["label"] == name]
        assert not any(p.split("/").count(name) > 1 for p in rows["path"])  # no label nested in its own name
        assert row["gpu_total_ms"] == pytest.approx(rows["total_ms"].sum(), rel=1e-9, abs=1e-12), name
        assert row["gpu_self_ms"] == pytest.approx(rows["self_ms"].sum(), rel=1e-9, abs=1e-12), name
    # the region's tree says the same
    assert lt.at["2_Pipeline_Inference", "gpu_total_ms"] == pytest.approx(bd.stats["busy_ms"], rel=1e-9)
    t = bd.label_tree.set_index("label")
    assert lt.at["2.3_Block_0", "gpu_total_ms"] == pytest.approx(t.at["2.3_Block_0", "total_ms"], rel=1e-9)
    st = stage_table(label_table(trace)).set_index("label")
    assert st.at["2_Pipeline_Inference", "ms"] == pytest.approx(bd.stats["busy_ms"], rel=1e-9)
    assert st.at["4_Video_Export", "ms"] == 0.0 and st.at["4_Video_Export", "source"] == "gpu"  # launches nothing
    assert st["share"].sum() == pytest.approx(1.0)


def test_self_plus_children_is_total_everywhere(trace):
    """(c) in the whole-trace tree and in label_table (labels that occur once, with children that occur once)."""
    t = label_tree(trace, None)
    kids = t.groupby("parent_path")["total_ms"].sum()
    for _, r in t.iterrows():
        assert r["self_ms"] + float(kids.get(r["path"], 0.0)) == pytest.approx(r["total_ms"], rel=1e-9, abs=1e-9)
    lt = label_table(trace).set_index("label")
    checked = 0
    for name in ("1_Data_Preparation", "2_Pipeline_Inference", "2.3_Block_0", "2.3_Block_1"):
        children = lt[lt["parent"] == name]
        assert (lt.at[name, "count"], (children["count"] == 1).all()) == (1, True)
        assert lt.at[name, "gpu_self_ms"] + children["gpu_total_ms"].sum() == pytest.approx(
            lt.at[name, "gpu_total_ms"], rel=1e-9)
        checked += 1
    assert checked == 4


def test_session_report_draws_the_category_figure_of_a_real_breakdown(bd):
    from wmbook.profiling.report import render_html

    page = render_html({"breakdown": bd.to_dict()})
    assert "Trace breakdown (2_Pipeline_Inference, gpu time)" in page
    assert page.count("data:image/png;base64,") == 1  # categories (Breakdown tables say `ms`)


def test_steady_idle_counts_the_gpu_gaps_inside_steady_blocks_only():
    # three blocks (labels on the host); each block launches two kernels; the first block is left out (skip=1).
    # block 1's window: its first kernel at 1000 to block 2's first kernel at 2000, busy 1000-1400 and 1500-1900
    # (800 of 1000 us); block 2 (the last): 2000 to its last kernel's end 2500, busy 2000-2100 and 2200-2500 (400 of
    # 500). A kernel launched outside every block (at 2600, the trailing decode) is busy time only inside a window.
    def ev(name, cat, ts, dur, tid=1, **args):
        return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": tid, "args": args}

    events, corr = [], 0
    kernels = {0: [(100, 300), (500, 200)], 1: [(1000, 400), (1500, 400)], 2: [(2000, 100), (2200, 300)]}
    for b, ks in kernels.items():
        events.append(ev(f"2.3_Block_{b}", "user_annotation", b * 1000 - 50, 40))
        for i, (ts, dur) in enumerate(ks):
            corr += 1
            events.append(ev("cudaLaunchKernel", "cuda_runtime", b * 1000 - 45 + i, 1, correlation=corr))
            events.append(ev(f"k{corr}", "kernel", ts, dur, tid=7, correlation=corr, stream=7))
    events.append(ev("cudaLaunchKernel", "cuda_runtime", 2590, 1, correlation=99))
    events.append(ev("k99", "kernel", 2600, 300, tid=7, correlation=99, stream=7))
    from wmbook.profiling.analysis.launches import steady_idle

    got = steady_idle({"traceEvents": events}, r"2\.3_Block_\d+", skip=1)
    assert got["units"] == 3 and got["steady_units"] == 2
    assert got["span_ms"] == pytest.approx(1.5)
    assert got["busy_ms"] == pytest.approx(1.2)
    assert got["idle_share"] == pytest.approx(0.3 / 1.5)
    assert got["unit_idle_share"] == pytest.approx([0.2, 0.2])
    every = steady_idle({"traceEvents": events}, r"2\.3_Block_\d+", skip=0)  # block 0: 100-1000, busy 500 of 900
    assert every["steady_units"] == 3 and every["unit_idle_share"][0] == pytest.approx(400 / 900)
    assert math.isnan(steady_idle({"traceEvents": events}, r"Nope_\d+")["idle_share"])
    with pytest.raises(ValueError, match="skip"):
        steady_idle({"traceEvents": events}, r"2\.3_Block_\d+", skip=-1)


def test_idle_gaps_splits_the_device_timeline_gaps_and_names_what_follows_a_memset():
    # stream 7: A 0-100, B 105-200, a memset 201-203, C 300-400; stream 8: D 150-230 (overlaps B and the memset).
    # Merged: gaps of 5 us (A-B) and 70 us (D's end to C); the span 400 us, busy 325.
    def ev(name, cat, ts, dur, stream, corr):
        return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": stream,
                "args": {"correlation": corr, "stream": stream}}

    events = [ev("A", "kernel", 0, 100, 7, 1), ev("B", "kernel", 105, 95, 7, 2),
              ev("Memset", "gpu_memset", 201, 2, 7, 3), ev("C", "kernel", 300, 100, 7, 4),
              ev("D", "kernel", 150, 80, 8, 5)]
    from wmbook.profiling.analysis import format_idle_gaps, idle_gaps

    got = idle_gaps({"traceEvents": events}, long_us=20, top=5)
    assert got["span_ms"] == pytest.approx(0.4) and got["busy_ms"] == pytest.approx(0.325)
    assert got["idle_ms"] == pytest.approx(0.075) and got["gaps"] == 2
    assert got["short_idle_ms"] == pytest.approx(0.005) and got["long_idle_ms"] == pytest.approx(0.070)
    assert got["long_gaps"] == 1
    first = got["top"].iloc[0]
    assert (first["us"], first["before"], first["after"]) == (pytest.approx(70.0), "D", "C")
    assert first["at_ms"] == pytest.approx(0.23)
    assert got["memsets"].loc["C", "memsets"] == 1 and got["memsets"].loc["C", "memset_ms"] == pytest.approx(0.002)
    assert "under 20 us, 0.07 ms in 1 longer ones" in format_idle_gaps(got)
    assert idle_gaps({"traceEvents": []})["gaps"] == 0
    with pytest.raises(ValueError, match="long_us"):
        idle_gaps({"traceEvents": events}, long_us=0)
    with pytest.raises(ValueError, match="top"):
        idle_gaps({"traceEvents": events}, top=-1)
