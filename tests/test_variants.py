"""Variant registry, the transforms on tiny presets, the ladder gate, the cumulative ladder, compile fix."""

import pytest
import torch

from wmbook import check, variants
from wmbook.variants import GlobalFlags, UnknownVariantError, VariantContext, resolve, tolerance_for
from wmbook.variants.ladder import (apply_stack, build_reference, effective, end_to_end, forward_probe, op_counts, run_ladder,
                                    vae_table)

CPU = torch.device("cpu")


@pytest.fixture(autouse=True, scope="module")
def _one_thread(one_thread):
    """Every test of this module on one thread (tests/conftest.py)."""


@pytest.fixture(scope="module")
def mg2_ref():
    return build_reference("mg2", "tiny", CPU)


@pytest.fixture(scope="module")
def wma_ref():
    return build_reference("wma", "tiny-wma", CPU)


def _applied(ref, workload, names):
    return apply_stack(ref, workload, names, CPU, compile_backend="eager")


def test_registry_names_and_errors():
    mg2 = variants.known("mg2")
    for n in ("tf32", "bf16", "fp16", "autocast-bf16", "vae-bf16", "hygiene", "attn-flash", "channels-last",
              "cudnn-benchmark", "compile-regional", "compile-whole", "compile-regional-max-autotune"):
        assert n in mg2
    with pytest.raises(UnknownVariantError, match=r"'turbo' is not known for workload 'mg2'; known variants: \["):
        resolve(["bf16", "turbo"], "mg2")
    with pytest.raises(ValueError, match="more than once"):
        resolve(["bf16", "bf16"], "wma")
    with pytest.raises(ValueError, match="needs a CUDA device"):
        resolve(["fp16"], "mg2", CPU)
    with pytest.raises(ValueError, match="workload='sd'"):
        variants.known("sd")
    assert tolerance_for(resolve(["tf32", "bf16", "hygiene"], "mg2")) == "bf16"
    assert tolerance_for(resolve(["hygiene"], "mg2")) == "fp32"
    with pytest.raises(ValueError, match="already registered"):
        variants.register("bf16", family="precision", description="x")(lambda p, c: None)


def test_global_flags_restore():
    flags = GlobalFlags()
    from wmbook.models.attention import get_attention_backend

    pipe_ctx = VariantContext("mg2", CPU)
    variants.get("tf32").apply(None, pipe_ctx)
    variants.get("cudnn-benchmark").apply(None, pipe_ctx)
    variants.get("attn-math").apply(None, pipe_ctx)
    assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.benchmark
    assert get_attention_backend() == "math"
    flags.restore()
    assert torch.backends.cuda.matmul.allow_tf32 == flags.matmul_tf32
    assert torch.backends.cudnn.benchmark == flags.cudnn_benchmark and get_attention_backend() == "auto"


def test_precision_transforms(mg2_ref, wma_ref):
    p, _ = _applied(mg2_ref, "mg2", ["bf16"])
    assert p.dtype == torch.bfloat16 and next(p.model.parameters()).dtype == torch.bfloat16
    assert next(p.clip.parameters()).dtype == torch.bfloat16 and p.vae_dtype == torch.float32  # VAE apart
    assert next(mg2_ref.model.parameters()).dtype == torch.float32  # the reference is untouched
    p, _ = _applied(wma_ref, "wma", ["vae-bf16"])
    assert p.vae_dtype == torch.bfloat16 and next(p.vae.parameters()).dtype == torch.bfloat16
    p, _ = _applied(mg2_ref, "mg2", ["autocast-bf16"])
    assert next(p.model.parameters()).dtype == torch.float32
    out = forward_probe(p, "mg2").forward()
    assert torch.isfinite(out).all()


def test_hygiene_removes_host_reads_and_keeps_outputs(mg2_ref):
    counts = op_counts(mg2_ref, "mg2", {"eager": [], "hygiene": ["hygiene"]}, device=CPU)
    reads = "host reads (aten::_local_scalar_dense)"
    assert counts.loc["eager", reads] > 0 and counts.loc["hygiene", reads] == 0
    casts = counts[["aten::to", "aten::_to_copy", "aten::copy_"]].sum(axis=1)
    assert casts["hygiene"] < casts["eager"]
    p, ctx = _applied(mg2_ref, "mg2", ["hygiene"])
    assert p.model.hoist_action_inputs and p.prefill_cross and "norm modules" in ctx.notes["hygiene"]
    a = end_to_end(mg2_ref, "mg2", num_blocks=3)
    b = end_to_end(p, "mg2", num_blocks=3)
    res = check.compare(b["latents"], a["latents"], dtype="fp32")
    assert res.passed, res  # same function in fp32 (hoisting, prefill, fused norms)


def test_wma_hygiene_and_channels_last(wma_ref):
    ref_out = forward_probe(wma_ref, "wma").forward()
    p, ctx = _applied(wma_ref, "wma", ["hygiene", "channels-last"])
    from wmbook.models.wma.layers import GroupNorm32

    assert all(m.fused for m in p.model.modules() if isinstance(m, GroupNorm32))
    conv = next(m for m in p.model.diffusion_model.modules() if isinstance(m, torch.nn.Conv2d))
    assert conv.weight.is_contiguous(memory_format=torch.channels_last) and not conv.weight.is_contiguous()
    assert p.model.diffusion_model.channels_last and "convolution weights" in ctx.notes["channels-last"]
    out = forward_probe(p, "wma").forward()
    assert check.compare(list(out), list(ref_out), dtype="fp32").passed


def test_gate_budget_and_no_less_accurate():
    torch.manual_seed(0)
    ref = torch.randn(1000, dtype=torch.float64)
    noise = torch.randn(1000, dtype=torch.float64)
    eager = ref + 0.01 * noise  # rel_l2 ~ 1e-2: a bf16-like error
    g = check.ladder_gate(eager, ref, dtype="bf16")
    assert g.passed and g.anchor_rel_l2 is None and g.allowed_rel_l2 == check.PRECISION_BUDGET_REL_L2["bf16"]
    other = ref + 0.0105 * torch.randn(1000, dtype=torch.float64)  # as accurate, but rounded differently
    g2 = check.ladder_gate(other, ref, dtype="bf16", same_precision_ref=eager, anchor_rel_l2=g.vs_fp32.rel_l2)
    assert g2.passed and not g2.vs_same_precision.passed  # the seed criterion would reject it
    worse = ref + 0.02 * noise
    assert not check.ladder_gate(worse, ref, dtype="bf16", anchor_rel_l2=g.vs_fp32.rel_l2).passed
    assert not check.ladder_gate(ref + 0.05 * noise, ref, dtype="bf16").passed  # over the bf16 budget
    nan = ref.clone()
    nan[3] = float("nan")
    assert not check.ladder_gate(nan, ref, dtype="bf16").passed
    exact = check.ladder_gate(ref + 1e-9 * noise, ref, dtype="fp32", anchor_rel_l2=0.0)
    assert exact.passed and exact.allowed_rel_l2 == check.PRECISION_BUDGET_REL_L2["fp32"]
    with pytest.raises(ValueError, match="anchor_rel_l2"):
        check.ladder_gate(ref, ref, anchor_rel_l2=-1.0)


def test_effective_stack_keeps_the_last_compile():
    vs = resolve(["bf16", "compile-regional", "hygiene", "compile-regional-dynamic"], "mg2")
    assert [v.name for v in effective(vs)] == ["bf16", "hygiene", "compile-regional-dynamic"]


def test_ladder_rows_gate_and_recompile_fix(mg2_ref):
    lad = run_ladder("mg2", "tiny", ["bf16", "hygiene", "compile-regional"], device=CPU, reference=mg2_ref,
                     warmup=1, repeats=2, e2e_repeats=1, compile_backend="eager",
                     ceilings={"gemm_tflops": 1.0})
    t = lad.table()
    assert t["gate"].tolist() == ["reference", "pass", "pass", "pass"]
    assert t["stack"].iloc[-1] == "bf16 + hygiene + compile-regional"
    assert t["speedup"].iloc[0] == pytest.approx(1.0) and (t["speedup"] > 0).all()
    assert t["x_floor"].notna().all() and t["psnr_db"].iloc[1] > 30
    last = t.iloc[-1]
    assert last["recompiles"] == 0  # the steady end-to-end runs after the warming one
    assert last["first_call_s"] > 0 and last["e2e_metric"] == "fps"
    assert 0 < t["rel_l2_vs_fp32"].iloc[1] <= 0.03


def _warm_then_steady(ref, names, num_blocks):
    """Compile monitors of a first (warming) and a second end-to-end mg2 run of a fresh copy with `names`."""
    from wmbook.variants.compile import CompileMonitor, reset_compile_state

    reset_compile_state()
    flags = GlobalFlags()
    pipe, _ = _applied(ref, "mg2", names)
    try:
        with CompileMonitor() as warm:
            end_to_end(pipe, "mg2", num_blocks=num_blocks)
        with CompileMonitor() as steady:
            end_to_end(pipe, "mg2", num_blocks=num_blocks)
    finally:
        flags.restore()
    return warm, steady


def test_compile_of_reference_code_recompiles_and_the_fix_does_not(mg2_ref):
    from wmbook.variants.builtin import compile_regions

    ref_warm, _ = _warm_then_steady(mg2_ref, ["compile-regional"], 3)
    fix_warm, fix_steady = _warm_then_steady(mg2_ref, ["hygiene", "compile-regional"], 3)
    assert ref_warm.graph_breaks["reason"].str.contains("item").any()  # the host read in action_windows
    assert ref_warm.recompiles["guard"].str.contains("start_frame").any()  # Python ints guarded per block
    assert not fix_warm.graph_breaks["reason"].str.contains("item").any()
    assert ref_warm.graph_breaks["reason"].str.contains("disable").any()  # KV writes with their position
    assert fix_warm.summary()["graph_breaks"] == 0  # begin() prepared the cache slots: the writes trace
    assert fix_warm.summary()["recompiles"] < ref_warm.summary()["recompiles"]
    assert fix_steady.summary()["recompiles"] == 0
    assert compile_regions(mg2_ref, "mg2") == list(mg2_ref.model.blocks)


def test_whole_model_compile_after_hygiene_does_not_guard_on_start_frame(mg2_ref):
    """What depends on the Python int start_frame is built outside the compiled frame: a whole-model compile
    compiles each shape once (first block, growing window) and never recompiles for the block's start frame
    (before, 7 blocks hit the recompile limit of 8 and the model ran eagerly from then on)."""
    warm, steady = _warm_then_steady(mg2_ref, ["hygiene", "compile-whole"], 7)
    rec = warm.recompiles
    assert not rec["guard"].astype(str).str.contains("start_frame").any(), rec["guard"].tolist()
    assert warm.summary()["recompile_limit_hits"] == 0
    assert steady.summary()["recompiles"] == 0


def test_action_attn_fused_matches_sdpa_and_compiles_clean(mg2_ref):
    from wmbook.models.action import ActionModule
    from wmbook.models.attention import attention, small_attention

    torch.manual_seed(0)
    q, k, v = torch.randn(5, 3, 2, 8), torch.randn(5, 6, 2, 8), torch.randn(5, 6, 2, 8)
    mask = torch.tensor([[True] * 4 + [False] * 2] * 3)
    for m in (None, mask):
        torch.testing.assert_close(small_attention(q, k, v, m), attention(q, k, v, m), atol=1e-5, rtol=1e-5)
    # K/V shared by all query rows broadcast (leading dim 1) equals the expanded copy
    qb = q.view(1, 5, 3, 2, 8)
    torch.testing.assert_close(small_attention(qb, k[:1, None], v[:1, None]).view(5, 3, 2, 8),
                               attention(q, k[:1].expand(5, -1, -1, -1), v[:1].expand(5, -1, -1, -1)),
                               atol=1e-5, rtol=1e-5)
    p, ctx = _applied(mg2_ref, "mg2", ["hygiene", "action-attn-fused"])
    mods = [m for m in p.model.modules() if isinstance(m, ActionModule)]
    assert mods and all(m.fused_small_attention for m in mods) and "1 action modules" in ctx.notes["action-attn-fused"]
    h, _ = _applied(mg2_ref, "mg2", ["hygiene"])
    a, b = end_to_end(h, "mg2", num_blocks=3), end_to_end(p, "mg2", num_blocks=3)
    res = check.compare(b["latents"], a["latents"], dtype="fp32")
    assert res.passed, res  # same function in fp32, with the KV caches and the rolling window
    warm, steady = _warm_then_steady(mg2_ref, ["hygiene", "action-attn-fused", "compile-regional"], 3)
    assert warm.summary()["graph_breaks"] == 0 and steady.summary()["recompiles"] == 0
    with pytest.raises(UnknownVariantError):
        resolve(["action-attn-fused"], "wma")


def test_vae_table_reports_psnr(wma_ref):
    t = vae_table(wma_ref, "wma", ("fp32", "bf16"), device=CPU, repeats=1, ddim_steps=2)
    assert t["vae_dtype"].tolist() == ["fp32", "bf16"]
    assert t["psnr_db"].iloc[0] == float("inf") and 20 < t["psnr_db"].iloc[1] < 200
    with pytest.raises(ValueError, match="fp16"):
        vae_table(wma_ref, "wma", ("fp16",), device=CPU)
