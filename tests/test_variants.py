"""Variant registry, the transforms on tiny presets, the ladder gate, the cumulative ladder, compile fix."""

import copy

import pytest
import torch

from wmbook import check, variants, workloads
from wmbook.variants import GlobalFlags, UnknownVariantError, VariantContext, resolve, tolerance_for
from wmbook.variants.ladder import LadderSettings, apply_stack, effective, run_ladder
from wmbook.variants.tables import op_counts, vae_table
from wmbook.workloads import E2ESize

CPU = torch.device("cpu")
MG2, WMA = workloads.get("mg2"), workloads.get("wma")


def end_to_end(pipe, wl, blocks=3):
    return wl.end_to_end(pipe, 0, E2ESize(blocks=blocks, ddim_steps=3))


@pytest.fixture(autouse=True, scope="module")
def _one_thread(one_thread):
    """Every test of this module on one thread (tests/conftest.py)."""


@pytest.fixture(scope="module")
def mg2_ref():
    return MG2.reference_pipeline(MG2.presets["tiny"], CPU)


@pytest.fixture(scope="module")
def wma_ref():
    return WMA.reference_pipeline(WMA.presets["tiny-wma"], CPU)


def _applied(ref, workload, names):
    return apply_stack(ref, workload, names, CPU, compile_backend="eager")


def test_registry_names_and_errors():
    mg2 = variants.known(workloads.get("mg2"))
    for n in ("tf32", "bf16", "fp16", "autocast-bf16", "vae-bf16", "norm-input-dtype", "kv-slot-write", "action-hoist",
              "cross-kv-prefill", "attn-flash", "channels-last", "cudnn-benchmark", "compile-regional", "compile-whole",
              "compile-regional-max-autotune"):
        assert n in mg2
    # the hygiene group: one variant per change, those the workload has the features for
    assert variants.hygiene_parts(workloads.get("mg2")) == ["norm-input-dtype", "kv-slot-write", "action-hoist",
                                                            "cross-kv-prefill"]
    assert variants.hygiene_parts(WMA) == ["norm-input-dtype"]
    assert [v.name for v in resolve(["bf16", "hygiene"], workloads.get("wma"))] == ["bf16", "norm-input-dtype"]
    with pytest.raises(UnknownVariantError, match="'kv-slot-write' is not known for workload 'wma'"):
        resolve(["kv-slot-write"], workloads.get("wma"))
    with pytest.raises(UnknownVariantError, match=r"'turbo' is not known for workload 'mg2'; known variants: \["):
        resolve(["bf16", "turbo"], workloads.get("mg2"))
    with pytest.raises(ValueError, match="more than once"):
        resolve(["bf16", "bf16"], workloads.get("wma"))
    with pytest.raises(ValueError, match="needs a CUDA device"):
        resolve(["fp16"], workloads.get("mg2"), CPU)
    with pytest.raises(TypeError, match=r"workload='mg2' is not allowed here; pass the Workload object"):
        variants.known("mg2")  # names are resolved once, by the caller that holds the workload
    assert tolerance_for(resolve(["tf32", "bf16", "hygiene"], workloads.get("mg2"))) == "bf16"
    assert tolerance_for(resolve(["hygiene"], workloads.get("mg2"))) == "fp32"
    with pytest.raises(ValueError, match="already registered"):
        variants.register("bf16", family="precision", description="x")(lambda p, c: None)


def test_global_flags_restore():
    flags = GlobalFlags()
    from wmbook.models.attention import get_attention_backend

    pipe_ctx = VariantContext(MG2, CPU)
    variants.get("tf32").apply(None, pipe_ctx)
    variants.get("cudnn-benchmark").apply(None, pipe_ctx)
    variants.get("attn-math").apply(None, pipe_ctx)
    assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.benchmark
    assert get_attention_backend() == "math"
    flags.restore()
    assert torch.backends.cuda.matmul.allow_tf32 == flags.matmul_tf32
    assert torch.backends.cudnn.benchmark == flags.cudnn_benchmark and get_attention_backend() == "auto"


def test_global_flags_restore_what_a_library_turns_on_in_inductor():
    """torchao's quantization configs switch inductor's coordinate-descent tuning (and more) on process-wide by
    default; GlobalFlags puts those settings back, so no later row compiles with them."""
    import torch._inductor.config as ic

    before = (ic.coordinate_descent_tuning, ic.coordinate_descent_check_all_directions, ic.triton.unique_kernel_names)
    flags = GlobalFlags()
    ic.coordinate_descent_tuning = ic.coordinate_descent_check_all_directions = True
    ic.triton.unique_kernel_names = not before[2]
    flags.restore()
    assert (ic.coordinate_descent_tuning, ic.coordinate_descent_check_all_directions,
            ic.triton.unique_kernel_names) == before


def test_precision_transforms(mg2_ref, wma_ref):
    p, _ = _applied(mg2_ref, "mg2", ["bf16"])
    assert p.dtype == torch.bfloat16 and next(p.model.parameters()).dtype == torch.bfloat16
    assert next(p.clip.parameters()).dtype == torch.bfloat16 and p.vae_dtype == torch.float32  # VAE apart
    assert next(mg2_ref.model.parameters()).dtype == torch.float32  # the reference is untouched
    p, _ = _applied(wma_ref, "wma", ["vae-bf16"])
    assert p.vae_dtype == torch.bfloat16 and next(p.vae.parameters()).dtype == torch.bfloat16
    p, _ = _applied(mg2_ref, "mg2", ["autocast-bf16"])
    assert next(p.model.parameters()).dtype == torch.float32
    out = MG2.forward_probe(p).forward()
    assert torch.isfinite(out).all()


def test_hygiene_parts_each_change_one_thing_and_keep_outputs(mg2_ref):
    """Each hygiene variant: the one change it names, applied from outside (the reference untouched), and the
    same function in fp32."""
    from wmbook.models.causal_wan import WanLayerNorm, WanRMSNorm
    from wmbook.variants import swaps

    stacks, stack = {"eager": []}, []
    for part in variants.hygiene_parts(workloads.get("mg2")):
        stack = stack + [part]
        stacks[part] = stack
    counts = op_counts(mg2_ref, "mg2", stacks, device=CPU)
    reads = "host reads (aten::_local_scalar_dense)"
    casts = counts[["aten::to", "aten::_to_copy", "aten::copy_"]].sum(axis=1)
    assert casts["norm-input-dtype"] < casts["eager"]  # no fp32 round trip per norm
    assert counts.loc["kv-slot-write", reads] == counts.loc["eager", reads] > 0  # the host read is in the actions
    assert counts.loc["action-hoist", reads] == 0  # ... which action-hoist windows without one
    p, ctx = _applied(mg2_ref, "mg2", ["hygiene"])
    assert isinstance(p.model, swaps.KVSlotWrites) and isinstance(p.model, swaps.HoistedActionInputs)
    assert isinstance(p, swaps.CrossKVPrefill) and "norm modules" in ctx.notes["norm-input-dtype"]
    norms = [m for m in p.model.modules() if isinstance(m, (WanRMSNorm, WanLayerNorm))]
    assert norms and all(isinstance(m, (swaps.RMSNormInputDtype, swaps.LayerNormInputDtype)) for m in norms)
    assert not any(isinstance(m, swaps.RMSNormInputDtype) for m in mg2_ref.model.modules())  # from outside
    assert type(mg2_ref.model).__name__ == "CausalWanModel"
    a = end_to_end(mg2_ref, MG2)
    b = end_to_end(p, MG2)
    res = check.compare(b.latents, a.latents, dtype="fp32")
    assert res.passed, res  # same function in fp32 (slot writes, hoisting, prefill, norms on the input dtype)
    assert "k" in p.init_cache(p.prepare(2)).cross[0]  # filled before the first forward
    assert "k" not in mg2_ref.init_cache(mg2_ref.prepare(2)).cross[0]


def test_swap_helpers():
    from wmbook.variants.swaps import of_type, replace_modules, swap_class, with_mixin

    class Loud:
        def forward(self, x):
            return super().forward(x) * 2

    net = torch.nn.Sequential(torch.nn.ReLU(), torch.nn.Sequential(torch.nn.ReLU(), torch.nn.Tanh()))
    assert replace_modules(net, of_type(torch.nn.ReLU), with_mixin(Loud)) == 2
    x = torch.tensor([-1.0, 2.0])
    assert torch.equal(net[0](x), torch.tensor([0.0, 4.0])) and isinstance(net[1][0], Loud)
    relu = net[0]
    assert swap_class(relu, Loud) is relu and type(relu).__mro__.count(Loud) == 1  # never twice
    assert type(swap_class(torch.nn.ReLU(), Loud)) is type(relu)  # one combined class per pair


def test_wma_hygiene_and_channels_last(wma_ref):
    from wmbook.models.wma.layers import GroupNorm32
    from wmbook.variants import swaps

    ref_out = WMA.forward_probe(wma_ref).forward()
    p, ctx = _applied(wma_ref, "wma", ["hygiene", "channels-last"])
    assert all(isinstance(m, swaps.GroupNormInputDtype) for m in p.model.modules() if isinstance(m, GroupNorm32))
    unet = p.model.diffusion_model
    conv = next(m for m in unet.modules() if isinstance(m, torch.nn.Conv2d))
    assert conv.weight.is_contiguous(memory_format=torch.channels_last) and not conv.weight.is_contiguous()
    assert len(unet.input_blocks[0]._forward_pre_hooks) == 1 and "convolution weights" in ctx.notes["channels-last"]
    assert not wma_ref.model.diffusion_model.input_blocks[0]._forward_pre_hooks  # the reference untouched
    out = WMA.forward_probe(p).forward()
    assert check.compare(list(out), list(ref_out), dtype="fp32").passed


def test_wma_temporal_channels_last(wma_ref):
    """The temporal conv blocks take their [B, C, T, h, w] input in channels_last_3d (from a channels-last
    activation: no copy), their Conv3d weights too; the output equals the reference at fp32; the fused ResBlock
    (triton-fused) runs the same temporal tail; the reference stays NCDHW. Not a workload with a UNet: not known."""
    from wmbook.models.wma.unet import ResBlock, TemporalConvBlock

    ref_out = WMA.forward_probe(wma_ref).forward()
    from wmbook.variants.fused import FusedResBlock

    assert FusedResBlock.forward.__code__.co_names.count("temporal")  # triton-fused's ResBlock shares the tail
    for stack in (["channels-last", "temporal-channels-last"],):
        p, ctx = _applied(wma_ref, "wma", stack)
        seen = []
        for m in p.model.diffusion_model.modules():
            if isinstance(m, TemporalConvBlock):
                m.register_forward_pre_hook(lambda mod, args: seen.append(args[0]))
        out = WMA.forward_probe(p).forward()
        assert seen and all(t.is_contiguous(memory_format=torch.channels_last_3d) and not t.is_contiguous()
                            for t in seen)
        conv3d = [m for m in p.model.diffusion_model.modules() if isinstance(m, torch.nn.Conv3d)]
        assert conv3d and all(c.weight.is_contiguous(memory_format=torch.channels_last_3d) for c in conv3d)
        blocks = sum(isinstance(m, ResBlock) and m.temporal_conv is not None for m in p.model.modules())
        assert ctx.notes["temporal-channels-last"].startswith(f"{blocks} temporal conv blocks, {4 * blocks} Conv3d")
        assert check.compare(list(out), list(ref_out), dtype="fp32").passed
    assert all(m.temporal_format == torch.contiguous_format for m in wma_ref.model.modules() if isinstance(m, ResBlock))
    assert "temporal-channels-last" not in variants.known(workloads.get("mg2"))


def test_wma_head_conv_gemm(wma_ref):
    """The heads' Conv1d / ConvTranspose1d run as GEMMs (+ fold): every one of them in both heads is swapped, the
    video UNet's convolutions are not, the forward equals the reference's at fp32 and the reference keeps its
    modules. Each GEMM form against torch's module at odd sizes (stride 2, k 1, output padding, no bias), in
    float64 and bf16. Not known for mg2."""
    import copy

    from wmbook.models.wma.action_head import ConditionalUnet1D
    from wmbook.variants import swaps

    g = torch.Generator().manual_seed(0)
    for cin, cout, k, s, pad, bias in ((16, 24, 5, 1, 2, True), (24, 24, 3, 2, 1, True), (33, 17, 1, 1, 0, False)):
        m = torch.nn.Conv1d(cin, cout, k, s, pad, bias=bias).double()
        x = torch.randn(3, cin, 13, generator=g, dtype=torch.float64)
        gm = swaps.swap_class(copy.deepcopy(m), swaps.Conv1dAsGemm)
        torch.testing.assert_close(gm(x), m(x), rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(gm.bfloat16()(x.bfloat16()).float(), m(x).float(), rtol=0.05, atol=0.05)
    for c, k, s, pad, op, bias in ((16, 4, 2, 1, 0, True), (9, 3, 2, 1, 1, False), (8, 5, 3, 2, 0, True)):
        m = torch.nn.ConvTranspose1d(c, c + 3, k, s, pad, output_padding=op, bias=bias).double()
        x = torch.randn(2, c, 7, generator=g, dtype=torch.float64)
        gm = swaps.swap_class(copy.deepcopy(m), swaps.ConvTranspose1dAsGemm)
        torch.testing.assert_close(gm(x), m(x), rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="output_size"):
        gm(x, output_size=[20])

    ref_out = WMA.forward_probe(wma_ref).forward()
    p, ctx = _applied(wma_ref, "wma", ["head-conv-gemm"])
    heads = [m for m in p.model.modules() if isinstance(m, ConditionalUnet1D)]
    convs = [m for h in heads for m in h.modules() if isinstance(m, (torch.nn.Conv1d, torch.nn.ConvTranspose1d))]
    assert len(heads) == 2 and convs
    assert all(isinstance(m, (swaps.Conv1dAsGemm, swaps.ConvTranspose1dAsGemm)) for m in convs)
    n1 = sum(isinstance(m, torch.nn.Conv1d) for m in convs)
    assert ctx.notes["head-conv-gemm"] == f"2 heads: {n1} Conv1d, {len(convs) - n1} ConvTranspose1d"
    assert not any(isinstance(m, (swaps.Conv1dAsGemm, swaps.ConvTranspose1dAsGemm)) for m in wma_ref.model.modules())
    out = WMA.forward_probe(p).forward()
    assert check.compare(list(out), list(ref_out), dtype="fp32").passed
    assert "head-conv-gemm" not in variants.known(workloads.get("mg2"))


def test_wma_skip_unused_heads(wma_ref):
    """Each pass runs only the head it is read for: the decision pass's actions, the world-model pass's states, both
    passes' latents and frames equal the reference's bit for bit; the unread outputs are None; each head runs in one
    pass only; the forward probe (outside a pass) runs both; the CUDA-graph key tells the two passes apart; the
    reference keeps its classes."""
    from wmbook.variants import swaps

    p, ctx = _applied(wma_ref, "wma", ["skip-unused-heads"])
    unet = p.model.diffusion_model
    calls = []
    for name in ("action_unet", "state_unet"):
        getattr(unet, name).register_forward_hook(lambda m, a, o, name=name: calls.append((name, m.skip)))
    ref = wma_ref.run_iteration(wma_ref.prepare(seed=0), ddim_steps=2, progress=False)
    out = p.run_iteration(p.prepare(seed=0), ddim_steps=2, progress=False)
    want, got = ref.reference(), out.reference()
    assert set(got) == set(want)
    for k in want:
        assert torch.equal(got[k], want[k]), k
    assert out.decision.states is None and out.world.actions is None
    assert out.decision.actions is not None and out.world.states is not None
    ran = [n for n, skipped in calls if not skipped]
    assert ran.count("action_unet") == 2 and ran.count("state_unet") == 2  # 2 steps each, one pass each
    assert not unet.action_unet.skip and not unet.state_unet.skip  # reset after the passes
    probe = WMA.forward_probe(p).forward()
    assert all(t.abs().sum() > 0 for t in probe[1:])  # both heads outside a pass
    key = WMA.graph_targets(copy.deepcopy(p))[0].key_fn
    assert key((), {}) == (False, False)
    assert not isinstance(wma_ref.model.diffusion_model.action_unet, swaps.SkippableHead)
    assert ctx.notes["skip-unused-heads"].startswith("decision pass: action head only")
    assert "skip-unused-heads" not in variants.known(workloads.get("mg2"))


def test_skip_unused_heads_under_a_whole_compile_adds_no_graphs():
    """Under torch.compile of a whole model the heads' skip flags stay out of the graphs (dynamo skips
    SkippableHead's dispatch frame): the forward with both heads compiles the trunk's graph and the head's, and the
    forwards with one head skipped (the two passes) compile nothing more, where guarding on the flags compiled the
    UNet twice more (a 7.1-minute row on the H100 at a2935f1). A small trunk with two heads stands in for the UNet (its
    forward ends with the heads, as the UNet's does; tests/test_graphs.py runs the real stack on a GPU)."""
    from torch._dynamo.utils import counters

    from wmbook.variants import swaps

    class Head(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(8, 8)

        def forward(self, sample, feats):
            return self.lin(sample) * feats.mean()

    class Trunk(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.body, self.action_unet, self.state_unet = torch.nn.Linear(8, 8), Head(), Head()

        def forward(self, x, a, s):
            h = self.body(x).relu()
            return h, self.action_unet(a, h), self.state_unet(s, h)

    torch.manual_seed(0)
    m = Trunk()
    args = [torch.randn(4, 8) for _ in range(3)]
    with torch.no_grad():
        want = m(*args)
    for h in (m.action_unet, m.state_unet):
        swaps.swap_class(h, swaps.SkippableHead)
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(m, backend="eager")
    with torch.no_grad():
        both = compiled(*args)
        graphs = counters["stats"]["unique_graphs"]
        assert graphs >= 2  # the trunk up to its heads, the head (both heads share its code)
        m.action_unet.skip = True  # the world-model pass
        world = compiled(*args)
        m.action_unet.skip, m.state_unet.skip = False, True  # the decision pass
        decision = compiled(*args)
    assert counters["stats"]["unique_graphs"] == graphs
    assert all(torch.allclose(x, y) for x, y in zip(both, want))
    assert torch.equal(world[0], both[0]) and torch.equal(world[2], both[2]) and not world[1].any()
    assert torch.equal(decision[1], both[1]) and not decision[2].any()
    torch._dynamo.reset()


@pytest.mark.slow  # two dynamo traces of the whole UNet: over a minute on 2 cores
def test_wma_trunk_graph_is_the_same_whatever_the_heads(wma_ref):
    """Under torch.compile of the whole UNet the trunk (everything before the heads) is one graph and the heads graphs
    of their own (UNetModel.run_heads): a stack that changes only the heads (head-conv-gemm) traces the same trunk
    graph, so its compile is found in the compile cache instead of compiling the whole UNet again; the outputs are the
    eager ones."""
    graphs = []

    def record(gm, example_inputs):
        graphs.append(gm.code)
        return gm.forward

    def compiled_graphs(pipe):
        graphs.clear()
        torch._dynamo.reset()
        probe = WMA.forward_probe(pipe)
        with torch.no_grad():
            want = probe.forward()
        unet = pipe.model.diffusion_model
        unet.compile(backend=record)
        try:
            got = probe.forward()
        finally:
            unet._compiled_call_impl = None
            torch._dynamo.reset()
        for w, g in zip(want, got):
            torch.testing.assert_close(g, w)
        return list(graphs)

    plain = compiled_graphs(copy.deepcopy(wma_ref))
    heads, _ = _applied(wma_ref, "wma", ["head-conv-gemm"])
    gemm = compiled_graphs(heads)
    assert len(plain) >= 2 and len(gemm) >= 2  # the trunk, then the heads' graphs
    assert gemm[0] == plain[0]  # the trunk
    assert gemm[1:] != plain[1:]  # the heads: 1-D convolutions as GEMMs


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


def test_compile_note_says_what_a_slow_compile_did():
    from wmbook.variants.ladder import compile_note

    assert compile_note({"frames_compiled": 3, "recompiles": 0, "recompile_limit_hits": 0, "compile_s": 9.0}) == ""
    assert compile_note({"frames_compiled": 40, "recompiles": 31, "recompile_limit_hits": 2, "compile_s": 812.4}) == \
        "compile: 40 graphs, 31 recompiles, 2 recompile-limit hits, 812 s"


def test_effective_stack_keeps_the_last_compile():
    vs = resolve(["bf16", "compile-regional", "action-hoist", "compile-regional-dynamic"], workloads.get("mg2"))
    assert [v.name for v in effective(vs)] == ["bf16", "action-hoist", "compile-regional-dynamic"]


def test_ladder_rows_gate_and_recompile_fix(mg2_ref):
    settings = LadderSettings(warmup=0, repeats=1, e2e=E2ESize(blocks=2), e2e_repeats=1, compile_backend="eager",
                              ceilings={"gemm_tflops": 1.0})
    lad = run_ladder("mg2", "tiny", ["bf16", "hygiene", "compile-regional"], device=CPU, reference=mg2_ref,
                     settings=settings)
    t = lad.table()
    assert t["gate"].tolist() == ["reference"] + ["pass"] * 6  # the group expands: one row per hygiene variant
    assert t["variant"].tolist()[2:6] == ["+ norm-input-dtype", "+ kv-slot-write", "+ action-hoist",
                                          "+ cross-kv-prefill"]
    assert t["stack"].iloc[-1] == ("bf16 + norm-input-dtype + kv-slot-write + action-hoist + cross-kv-prefill + "
                                   "compile-regional")
    assert t["speedup"].iloc[0] == pytest.approx(1.0) and (t["speedup"] > 0).all()
    assert t["x_floor"].notna().all() and t["psnr_db"].iloc[1] > 30
    last = t.iloc[-1]
    assert last["recompiles"] == 0  # the steady end-to-end runs after the warming one
    assert last["first_call_s"] > 0 and last["e2e_metric"] == "fps"
    assert 0 < t["rel_l2_vs_fp32"].iloc[1] <= 0.03
    r = lad.rows[-1]  # where the row's seconds went, phase by phase, within the whole row's
    assert list(r.phases_s) == ["apply", "first call", "timing", "profile", "end-to-end warm-up", "end-to-end runs"]
    assert r.phases_s["first call"] == pytest.approx(r.first_call_s) and sum(r.phases_s.values()) <= r.row_s


def test_ladder_calls_before_comparisons_between_its_rows_and_the_comparisons(mg2_ref):
    # notebook 06 profiles whole generations there: before torch.compile's own CUDA graphs run in the process
    settings = LadderSettings(warmup=0, repeats=1, e2e=E2ESize(blocks=2), e2e_repeats=1, compile_backend="eager")
    seen, switches = [], []
    before = torch.get_float32_matmul_precision()

    def hook(lad):
        seen.append([r.variant for r in lad.rows])
        switches.append(torch.get_float32_matmul_precision())  # the rows' global switches (tf32) still on

    lad = run_ladder("mg2", "tiny", ["tf32", "bf16"], device=CPU, reference=mg2_ref, settings=settings,
                     comparisons={"tf32 + bf16 + kv-slot-write": ["tf32", "bf16", "kv-slot-write"]},
                     before_comparisons=hook)
    assert seen == [["fp32 eager (reference)", "+ tf32", "+ bf16"]] and switches == ["high"]
    assert [r.variant for r in lad.rows] == [*seen[0], "tf32 + bf16 + kv-slot-write"]
    assert torch.get_float32_matmul_precision() == before  # restored after the ladder


def _warm_then_steady(ref, names, num_blocks):
    """Compile monitors of a first (warming) and a second end-to-end mg2 run of a fresh copy with `names`."""
    from wmbook.variants.compile import reset_compile_state
    from wmbook.variants.compile_monitor import CompileMonitor

    reset_compile_state()
    flags = GlobalFlags()
    pipe, _ = _applied(ref, "mg2", names)
    try:
        with CompileMonitor() as warm:
            end_to_end(pipe, MG2, num_blocks)
        with CompileMonitor() as steady:
            end_to_end(pipe, MG2, num_blocks)
    finally:
        flags.restore()
    return warm, steady


def test_compile_of_reference_code_recompiles_and_the_fix_does_not(mg2_ref):
    ref_warm, _ = _warm_then_steady(mg2_ref, ["compile-regional"], 3)
    fix_warm, fix_steady = _warm_then_steady(mg2_ref, ["hygiene", "compile-regional"], 3)
    assert ref_warm.graph_breaks["reason"].str.contains("item").any()  # the host read in action_windows
    assert ref_warm.recompiles["guard"].str.contains("start_frame").any()  # Python ints guarded per block
    assert not fix_warm.graph_breaks["reason"].str.contains("item").any()
    assert ref_warm.graph_breaks["reason"].str.contains("disable").any()  # KV writes with their position
    assert fix_warm.summary()["graph_breaks"] == 0  # begin() prepared the cache slots: the writes trace
    assert fix_warm.summary()["recompiles"] < ref_warm.summary()["recompiles"]
    assert fix_steady.summary()["recompiles"] == 0
    assert MG2.compile_regions(mg2_ref) == list(mg2_ref.model.blocks)


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
    from wmbook.variants.swaps import SmallActionAttention

    p, ctx = _applied(mg2_ref, "mg2", ["hygiene", "action-attn-fused"])
    mods = [m for m in p.model.modules() if isinstance(m, ActionModule)]
    assert mods and all(isinstance(m, SmallActionAttention) for m in mods)
    assert "1 action modules" in ctx.notes["action-attn-fused"]
    h, _ = _applied(mg2_ref, "mg2", ["hygiene"])
    a, b = end_to_end(h, MG2), end_to_end(p, MG2)
    res = check.compare(b.latents, a.latents, dtype="fp32")
    assert res.passed, res  # same function in fp32, with the KV caches and the rolling window
    warm, steady = _warm_then_steady(mg2_ref, ["hygiene", "action-attn-fused", "compile-regional"], 3)
    assert warm.summary()["graph_breaks"] == 0 and steady.summary()["recompiles"] == 0
    with pytest.raises(UnknownVariantError):
        resolve(["action-attn-fused"], workloads.get("wma"))


def test_vae_table_reports_psnr(wma_ref):
    t = vae_table(wma_ref, "wma", ("fp32", "bf16"), device=CPU, repeats=1, size=E2ESize(ddim_steps=2))
    assert t["vae_dtype"].tolist() == ["fp32", "bf16"]
    assert t["psnr_db"].iloc[0] == float("inf") and 20 < t["psnr_db"].iloc[1] < 200
    with pytest.raises(ValueError, match="fp16"):
        vae_table(wma_ref, "wma", ("fp16",), device=CPU)


def test_ladder_stores_each_row_and_goes_on_past_a_failed_row(mg2_ref, monkeypatch, tmp_path):
    # notebooks 05 and 06 store each row's results through on_row (studies.graphs.store_each_row) as soon as it is
    # done; a later row that fails (here a simulated out-of-memory in its measurement; on the H100 at 5880f6e an
    # inductor error compiling the wma UNet with triton-fused, which ended notebook 06 and lost its later rows) is
    # kept as a row with gate "error" and the error in its note, and the next rows run without its variant
    import wmbook.variants.ladder as ladder_mod
    from wmbook import results
    from wmbook.studies import graphs as study06

    real, stacks = ladder_mod._measure, []

    def measure(ref, wl, stack, *args, **kwargs):
        stacks.append([v.name for v in stack])
        if stack and stack[-1].name == "action-hoist":
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated)\nsecond line")
        return real(ref, wl, stack, *args, **kwargs)

    monkeypatch.setattr(ladder_mod, "_measure", measure)
    path = tmp_path / "results.csv"
    cfg = study06.validate(workload="mg2", preset="tiny", device="cpu", results_path=str(path))
    store, seen = study06.store_each_row(cfg), []
    settings = LadderSettings(warmup=0, repeats=1, e2e=E2ESize(blocks=2), e2e_repeats=1, compile_backend="eager")
    lad = run_ladder("mg2", "tiny", ["bf16", "action-hoist", "kv-slot-write"], device=CPU, reference=mg2_ref,
                     settings=settings, on_row=lambda r: (seen.append(r.variant), store(r)))
    assert stacks == [[], ["bf16"], ["bf16", "action-hoist"], ["bf16", "kv-slot-write"]]
    assert seen == ["+ bf16", "+ action-hoist", "+ kv-slot-write"]  # the reference row is not the ladder's own
    failed = lad.rows[2]
    assert failed.gate == "error" and not failed.counts and failed.speedup != failed.speedup
    assert failed.note == "OutOfMemoryError: CUDA out of memory (simulated) (left out of the later rows)"
    assert lad.rows[3].gate == "pass" and lad.rows[3].forward.median > 0
    df = results.read(path)
    err = df[df["gate"] == "error"]
    assert list(err["variant"]) == ["bf16 + action-hoist"] and err["median"].isna().all()
    assert err["note"].str.contains("OutOfMemoryError").all()
    assert set(df.loc[df["gate"] == "pass", "variant"]) == {"bf16", "bf16 + kv-slot-write"}
    # the reference and the first measured row still raise: nothing to measure the others against
    monkeypatch.setattr(ladder_mod, "_measure", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("boom")))
    with pytest.raises(RuntimeError, match="boom"):
        run_ladder("mg2", "tiny", ["bf16"], device=CPU, reference=mg2_ref, settings=settings)


def test_stack_row_anchors_later_rows_to_the_eager_model_at_its_precision(mg2_ref, monkeypatch):
    # a ladder on top of a known stack (notebooks 05 and 06: from_row > 1) gates its later rows against the eager
    # model at the stack's precision (its precision variants alone), or the stack's own error where that is larger:
    # a compiled stack is more accurate than eager bf16 (inductor skips the model's intermediate roundings), and a
    # kernel rounding where the model rounds must not fail for that (H100, notebook 05, 665a961)
    import wmbook.variants.ladder as ladder_mod

    real, seen = ladder_mod._eager_anchor, []

    def spy(ref, wl, stack, *args):
        seen.append([v.name for v in stack])
        err = real(ref, wl, stack, *args)
        seen.append(err)
        return err

    monkeypatch.setattr(ladder_mod, "_eager_anchor", spy)
    settings = LadderSettings(warmup=0, repeats=1, e2e=E2ESize(blocks=2), e2e_repeats=1, compile_backend="eager")
    lad = run_ladder("mg2", "tiny", ["bf16", "action-hoist", "kv-slot-write"], device=CPU, reference=mg2_ref,
                     settings=settings, from_row=2)
    assert seen[0] == ["bf16", "action-hoist"] and 0 < seen[1] < 0.05  # called with the whole stack row's stack
    eager_bf16 = ladder_mod.apply_stack(mg2_ref, "mg2", ["bf16"], CPU)[0]
    with torch.no_grad():
        ref_out = ladder_mod._outputs(MG2.forward_probe(mg2_ref).forward())
        out = ladder_mod._outputs(MG2.forward_probe(eager_bf16).forward())
    err = check.ladder_gate(out, ref_out, dtype="bf16").vs_fp32.rel_l2
    assert seen[1] == pytest.approx(err, rel=1e-6)  # the precision variants alone, eager
    stack_row, last = lad.rows[1], lad.rows[2]
    anchor = max(stack_row.rel_l2_vs_fp32, err)
    expect = min(last.budget_rel_l2, max(anchor * check.SAME_PRECISION_MAX_RATIO,
                                         check.PRECISION_BUDGET_REL_L2["fp32"]))
    assert last.allowed_rel_l2 == pytest.approx(expect)
    # the reference of a ladder shown from a later row runs end to end once, for its frames (the later rows' PSNR),
    # without a warm-up run and without an end-to-end time of its own
    fp32 = lad.rows[0]
    assert fp32.e2e_value != fp32.e2e_value and fp32.e2e_run_s != fp32.e2e_run_s
    assert stack_row.psnr_db == stack_row.psnr_db and stack_row.e2e_value == stack_row.e2e_value
    with pytest.raises(ValueError, match="e2e='yes'"):
        ladder_mod.measure(mg2_ref, "mg2", [], CPU, settings, None, e2e="yes")


def test_end_to_end_runs_keep_their_spread(mg2_ref):
    """Every timed end-to-end run is kept: the row's metric and run seconds are their medians, the table and the
    results rows carry their p20-p80 (notebook 06's run-time goal compares rows by them)."""
    from wmbook.studies import graphs as study06

    settings = LadderSettings(warmup=0, repeats=1, e2e=E2ESize(blocks=2), e2e_repeats=3, compile_backend="eager")
    lad = run_ladder("mg2", "tiny", ["bf16"], device=CPU, reference=mg2_ref, settings=settings)
    row = lad.rows[-1]
    assert row.e2e_samples.n == 3 and row.e2e_run_samples.n == 3 and row.e2e_run_samples.unit == "s"
    assert row.e2e_value == row.e2e_samples.median and row.e2e_run_s == row.e2e_run_samples.median
    t = lad.table().iloc[-1]
    assert t["e2e_run_s_p20"] <= t["e2e_run_s"] <= t["e2e_run_s_p80"] and t["e2e_p20"] <= t["e2e_value"] <= t["e2e_p80"]
    e = study06.e2e_table(lad).iloc[-1]
    assert e["run s p20"] == row.e2e_run_samples.p20 and e["fps p80"] == row.e2e_samples.p80
    cfg = study06.validate(workload="mg2", preset="tiny", device="cpu")
    assert cfg.options.e2e_repeats == 2  # 0 (auto): 2 on a CPU, 3 on a GPU
    rows = {r["metric"]: r for r in study06.row_results(cfg, row)}
    assert rows["run_s"]["n"] == 3 and rows["run_s"]["p20"] == row.e2e_run_samples.p20
    assert rows["fps"]["n"] == 3 and rows["fps"]["p80"] == row.e2e_samples.p80
