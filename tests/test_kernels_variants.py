"""Notebook 05's integration: the triton-fused and vae-triton-fused variants equal the reference models (the kernels
run in Triton's interpreter on the CPU), the kernel cases of both workloads pass their gate, the fp8 variant says why
it cannot run here."""

import copy
import dataclasses
import importlib.machinery
import importlib.util

import pytest
import torch

from wmbook import workloads
from wmbook.studies import kernels as study
from wmbook.variants import REGISTRY
from wmbook.variants.ladder import apply_stack
from wmbook.variants.registry import VariantContext
from wmbook.workloads import E2ESize

CPU = torch.device("cpu")
# the kernels run where they really run: CUDA on a GPU host (there the CPU has no interpreter and the ops would fall
# back to their references, so a test on the CPU would not test the kernels), else the CPU under the interpreter
DEV = torch.device("cuda") if torch.cuda.is_available() else CPU


def _flat(out):
    ts = out if isinstance(out, (list, tuple)) else [out]
    return torch.cat([t.flatten().float() for t in ts if isinstance(t, torch.Tensor)])


@pytest.fixture(autouse=True)
def _no_tf32():
    """Full fp32 on CUDA: cuDNN convolutions default to TF32, whose rounding turns the kernels' 1e-7 differences into
    1e-3 at the output (seen on the H100), hiding what this file checks at 1e-5."""
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


@pytest.fixture(scope="module", params=["mg2", "wma"])
def ref(request):
    wl = workloads.get(request.param)
    p = wl.presets[wl.tiny_preset]
    if wl.name == "wma":  # 2 frames, 1 ResBlock a level: every kind of fused site, a fraction of the interpreter time
        p = dataclasses.replace(p, frames=2, num_res_blocks=1)
    return wl, wl.reference_pipeline(p, DEV)


def test_triton_fused_equals_reference(ref, request):
    wl, pipe = ref
    if wl.name == "wma":  # 45-80 s in the interpreter; `make test` has the wma swaps in the tests below
        from conftest import SLOW_REASON, slow_enabled

        if not slow_enabled(request.config):
            pytest.skip(SLOW_REASON)
    base, _ = apply_stack(pipe, wl, ["norm-input-dtype"], DEV)
    fused, ctx = apply_stack(pipe, wl, ["norm-input-dtype", "triton-fused"], DEV)
    a, b = _flat(wl.forward_probe(base).forward()), _flat(wl.forward_probe(fused).forward())
    assert ((a - b).norm() / a.norm()).item() < 1e-5, ctx.notes
    note = ctx.notes["triton-fused"]
    assert ("DiT blocks" in note) if wl.name == "mg2" else ("ResBlocks with the time-embedding add fused" in note)
    if wl.name == "wma":  # both self-attentions of every temporal transformer on the short-sequence kernel
        from wmbook.models.wma.unet import TemporalTransformer

        n = 2 * sum(len(t.transformer_blocks) for t in wl.denoiser(fused).modules()
                    if isinstance(t, TemporalTransformer))
        assert n and f"{n} temporal self-attentions on short_attention" in note, note
    # the swaps really call the kernels' ops: a model without them differs from one with a poisoned op
    from wmbook.variants import fused as fmod

    assert any(isinstance(m, fmod.FusedGroupNormSiLU) for m in wl.denoiser(fused).modules()) or \
        any(type(m).__name__.startswith("FusedDiTBlock") for m in wl.denoiser(fused).modules())


def test_vae_triton_fused_frames_equal_reference(ref):
    from wmbook import variants

    wl, pipe = ref
    # a decode nobody reads (the WMA decision pass's) skipped on both sides: the interpreted kernels are the test's time
    skip = [n for n in ("skip-unused-decode",) if n in variants.known(wl)]
    base, _ = apply_stack(pipe, wl, skip, DEV)
    dec, ctx = apply_stack(pipe, wl, [*skip, "vae-triton-fused"], DEV)
    if wl.name == "mg2":  # a first and a steady block: the streaming decoder's calls differ
        size = E2ESize(blocks=2, ddim_steps=2)
        a, b = wl.end_to_end(base, 0, size).frames.float(), wl.end_to_end(dec, 0, size).frames.float()
    else:  # the SD VAE decodes frame by frame, each alike: one frame of the world pass's latents
        z = wl.decoder_latents(base, 0, E2ESize())[:, :, :1]
        a, b = wl.decode(base, z).float(), wl.decode(dec, z).float()
    assert ((a - b).norm() / a.norm()).item() < 1e-5
    assert int(ctx.notes["vae-triton-fused"].split()[0]) > 0
    if wl.name == "wma":  # the SD decoder's head (conv_norm_out, conv_act) at full resolution too
        assert type(dec.vae.decoder.conv_norm_out).__name__ == "FusedGroupNormSiLU"


def test_fused_kernel_really_runs(ref, monkeypatch):
    """Poison the kernel launchers: the fused model's output must change (the swap is not a silent no-op)."""
    wl, pipe = ref
    fused, _ = apply_stack(pipe, wl, ["triton-fused"], DEV)
    from wmbook.kernels import adaln, group_norm_silu, short_attention

    targets = [(adaln, "adaln_modulate")] if wl.name == "mg2" else [(group_norm_silu, "group_norm_silu"),
                                                                    (short_attention, "short_attention")]
    for target in targets:
        with monkeypatch.context() as m:
            m.setattr(*target, lambda *a, **k: (_ for _ in ()).throw(RuntimeError(f"{target[1]} called")))
            with pytest.raises(RuntimeError, match=f"{target[1]} called"):
                wl.forward_probe(fused).forward()


def test_kernel_cases_pass_their_gate_at_tiny_shapes(ref):
    wl, _ = ref
    cfg = study.validate(workload=wl.name, preset=wl.tiny_preset, device=DEV.type, rep_ms=5)
    tab = study.kernel_table(cfg, None)
    assert len(tab) >= 3 and set(tab["gate"]) == {"pass"}, tab
    assert (tab["rel_l2 fused"] < 1e-2).all()
    assert ("fused GB/s" in tab.columns) == (DEV.type == "cuda")  # timings on a GPU only


def test_low_precision_rows_say_why_not_on_cpu():
    from wmbook import variants
    from wmbook.variants.builtin import fp8_unavailable, sage_unavailable

    assert "CUDA" in fp8_unavailable(CPU) and "CUDA" in sage_unavailable(CPU)
    cfg = study.validate(workload="mg2", preset="tiny", device="cpu")
    steps, note = [v.name for v in study.kernel_steps(cfg)], study.fp8_note(cfg)
    assert "fp8" not in steps and "attn-sage" not in steps
    assert "fp8-static row left out" in note and "attn-sage row left out" in note
    assert steps == ["triton-fused", "ffn-gelu-epilogue", "action-norm-rope", "fused-qkv", "vae-triton-fused",
                     "attn-triton"]  # heads': wma
    assert [v.name for v in study.kernel_steps(study.validate(workload="wma", preset="tiny-wma", device="cpu"))] == \
        ["triton-fused", "norm-conv-bias", "head-conv-gemm", "upsample-fold", "frames-norm-triton", "vae-triton-fused",
         "vae-norm-conv-bias"]
    assert cfg.options.ladder is False  # auto: GPU only
    assert "attn-sage" in variants.known(workloads.get("wma")) and variants.get("attn-sage").tolerance == "fp8"


def test_attn_triton_row_comes_after_the_low_precision_rows(monkeypatch):
    """Our attention kernel is the ladder's last row (no row above runs on it), after fp8-static where that runs."""
    monkeypatch.setattr(study, "_low_precision", lambda device: {"attn-sage": "not here", "fp8-static": None})
    cfg = study.validate(workload="mg2", preset="tiny", device="cpu")
    assert [v.name for v in study.kernel_steps(cfg)][-2:] == ["fp8-static", "attn-triton"]


def test_static_fp8_linear_matches_its_linear_within_e4m3_and_saturates_beyond_its_range():
    from wmbook.variants.fp8_static import StaticFP8Linear

    torch.manual_seed(0)
    lin = torch.nn.Linear(64, 48).to(torch.bfloat16)
    x = torch.randn(5, 7, 64, dtype=torch.bfloat16)
    q = StaticFP8Linear(lin, float(x.abs().amax()))
    ref, got = lin(x).float(), q(x).float()
    assert got.shape == ref.shape == (5, 7, 48)
    # e4m3 keeps 3 mantissa bits: unit roundoff 2^-4 on each operand, a few percent on a dot product's result
    assert ((got - ref).norm() / ref.norm()).item() < 0.08
    assert torch.isfinite(q(100 * x).float()).all()  # beyond the calibrated range: saturated, never inf
    with pytest.raises(ValueError, match="input_amax"):
        StaticFP8Linear(lin, 0.0)
    # a strided input (a view of a transposed tensor, as an attention module passes) gives what a contiguous one does
    xt = x.transpose(0, 1).contiguous().transpose(0, 1)
    assert not xt.is_contiguous() and torch.equal(q(xt), q(x))
    # every buffer on the linear's device, without a .to() after construction (the variant swaps linears in place)
    meta = StaticFP8Linear(torch.nn.Linear(64, 48, device="meta", dtype=torch.bfloat16), 1.0)
    assert {b.device.type for b in meta.buffers()} == {"meta"}


def test_fp8_static_variant_calibrates_once_and_stays_within_the_fp8_budget():
    from wmbook import variants
    from wmbook.variants.fp8_static import StaticFP8Linear

    wl = workloads.get("mg2")
    pipe = wl.reference_pipeline(wl.presets["tiny"], CPU)
    ref = _flat(wl.forward_probe(pipe).forward())
    f8, ctx = apply_stack(pipe, wl, ["bf16", "fp8-static"], CPU)
    model = wl.denoiser(f8)
    n = sum(isinstance(m, StaticFP8Linear) for m in model.modules())
    assert n > 0 and f"{n} of" in ctx.notes["fp8-static"] and "calibrated on 2-block run" in ctx.notes["fp8-static"]
    err = ((_flat(wl.forward_probe(f8).forward()) - ref).norm() / ref.norm()).item()
    # e4m3's error, a few percent a GEMM: here every GEMM, 64 wide ones included, is in fp8 (on a GPU only those of
    # >= 256 features); the bf16 row of this preset is at about 1e-2
    assert err < 0.15, err
    assert variants.get("fp8-static").tolerance == "fp8"
    with pytest.raises(ValueError, match="apply bf16 first"):
        apply_stack(pipe, wl, ["fp8-static"], CPU)


def test_fp8_static_calibrates_a_compiled_stack_in_eager():
    """On a stack that compiled the denoiser, the calibration run compiles nothing: compiling through the hooks would
    cost one whole-model compile for the calibration and another after the swap (minutes each at wma)."""
    from torch._dynamo.utils import counters

    wl = workloads.get("mg2")
    pipe = wl.reference_pipeline(wl.presets["tiny"], CPU)
    torch._dynamo.reset()
    counters.clear()
    f8, ctx = apply_stack(pipe, wl, ["bf16", "compile-whole", "fp8-static"], CPU, compile_backend="eager")
    assert "calibrated on" in ctx.notes["fp8-static"]
    assert counters["stats"]["unique_graphs"] == 0  # the calibration generation ran, compiled nothing
    wl.forward_probe(f8).forward()
    assert counters["stats"]["unique_graphs"] > 0  # the compile is still there for the row's own calls
    torch._dynamo.reset()


def test_fp8_is_the_last_row_where_both_low_precision_rows_run(monkeypatch):
    """fp8 is the slowest row to build (14.4 minutes at mg2-universal on the H100): last, so a run cut by its time
    limit has every other row stored."""
    monkeypatch.setattr(study, "_low_precision", lambda device: {"attn-sage": None, "fp8-static": None})
    gpu = dataclasses.replace(study.validate(workload="wma", preset="tiny-wma", device="cpu"),
                              device=torch.device("cuda"))  # the rows a GPU gets (fp8 is GPU-only)
    steps = study.kernel_steps(gpu)
    assert [v.name for v in steps] == ["triton-fused", "norm-conv-bias", "head-conv-gemm", "upsample-fold",
                                       "frames-norm-triton", "vae-triton-fused", "vae-norm-conv-bias", "attn-sage",
                                       "fp8-static"]


@pytest.mark.skipif(not torch.cuda.is_available() or importlib.util.find_spec("sageattention") is None,
                    reason="SageAttention needs a CUDA GPU and the sageattention package (the quant-attn extra)")
def test_sage_attention_row_on_gpu():
    """attn-sage on the tiny DiT in bf16: it runs SageAttention for the self-attention calls and stays within the
    quantized tolerance of the bf16 SDPA model (the ladder's gate decides at the real shapes)."""
    from wmbook.models import attention as attn

    dev = torch.device("cuda")
    wl = workloads.get("mg2")
    # head dim 64 and 64 tokens a frame (128 x 128 pixels): what SageAttention takes (the tiny preset's head dim 16
    # and 16 tokens a frame would all fall back to SDPA)
    tiny = wl.presets["tiny"]
    preset = tiny.with_(height=128, width=128, dim=128, num_heads=2,
                        action=dataclasses.replace(tiny.action, img_hidden_size=128))
    pipe = wl.reference_pipeline(preset, dev)
    from wmbook.variants import GlobalFlags

    flags = GlobalFlags()  # the attention backend is process-wide: back to SDPA afterwards
    try:
        base, _ = apply_stack(pipe, wl, ["bf16"], dev)
        a = _flat(wl.forward_probe(base).forward())  # before attn-sage switches the backend
        sage, ctx = apply_stack(pipe, wl, ["bf16", "attn-sage"], dev)
        b = _flat(wl.forward_probe(sage).forward())
        counts = attn.sage_call_counts()
    finally:
        flags.restore()
    assert counts.get("sage", 0) > 0, counts
    assert ((a - b).norm() / a.norm()).item() < 0.1, ctx.notes


@pytest.mark.skipif(not torch.cuda.is_available(), reason="fp8 GEMMs need a CUDA GPU with FP8 tensor cores")
def test_fp8_variant_within_budget_on_gpu():
    from wmbook.variants.builtin import fp8_unavailable

    dev = torch.device("cuda")
    if fp8_unavailable(dev):
        pytest.skip(fp8_unavailable(dev))
    wl = workloads.get("mg2")
    preset = wl.presets[wl.real_preset].with_(name="mg2-2-layers", num_layers=2)  # real widths: fp8 GEMM shapes
    pipe = wl.reference_pipeline(preset, dev)
    bf, _ = apply_stack(pipe, wl, ["bf16"], dev)
    f8, ctx = apply_stack(pipe, wl, ["bf16", "fp8"], dev)
    ref_out = _flat(wl.forward_probe(pipe).forward())
    err = ((_flat(wl.forward_probe(f8).forward()) - ref_out).norm() / ref_out.norm()).item()
    assert err < 0.1, (err, ctx.notes)


def test_interpretation_says_when_a_row_saves_gpu_time_but_not_wall_time():
    # the H100 rows of notebook 05 at mg2-universal (b50f9e1): the kernels took 0.7 ms of GPU time off a forward whose
    # wall time is launch-bound, and added launches
    from wmbook.bench import Samples
    from wmbook.variants.ladder import LadderRow

    def row(name, ms, busy, launches):
        return LadderRow(stack=[], tolerance="bf16", forward=Samples([ms] * 3), flops=1.0, gpu_busy_ms=busy,
                         launches=launches, e2e_value=30.0, gate="pass", variant=name)

    base, fused = row("base", 31.95, 23.15, 1235), row("+ triton-fused", 34.67, 22.46, 1370)
    text = study._launch_bound(base, fused)
    assert "saves 0.69 ms of GPU time but not wall time, +135 launches" in text and "1.38x" in text
    assert study._launch_bound(base, row("+ faster", 30.0, 22.46, 1235)) == ""  # saves wall time too
    # neither forward launch-bound: no clause
    assert study._launch_bound(row("bound by GPU", 23.5, 23.15, 6), row("+ x", 23.6, 23.0, 6)) == ""
    # the H100 rows of notebook 05 at wma (c69a80a): a base at 1.16x whose row became launch-bound itself
    text = study._launch_bound(row("base", 67.35, 58.15, 2548), row("+ triton-fused", 107.81, 53.61, 2598))
    assert "saves 4.54 ms of GPU time but not wall time, +50 launches" in text, text
    assert "wall 2.01x its GPU busy time; the base's 1.16x" in text, text


@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="the ops are triton_ops traced by inductor only on a CUDA GPU")
@pytest.mark.parametrize("compile_step", ["compile-whole", "compile-regional"])
def test_triton_fused_under_compile_on_gpu(ref, compile_step):
    """The fused ops traced by inductor inside the whole denoiser, in the ladders' order (compile, then
    triton-fused): it compiles and matches the eager fused model. At 5880f6e the real wma UNet failed this way on the
    H100 (an inductor KeyError in its scheduler) while every op compiled alone (tests/test_kernels_ops.py)."""
    wl, pipe = ref
    # notebook 06's base for wma holds temporal-channels-last: the GroupNorm kernels then see NDHWC inputs too
    stack = ["bf16", "norm-input-dtype", "channels-last", *(["temporal-channels-last"] if wl.name == "wma" else [])]
    eager, _ = apply_stack(pipe, wl, [*stack, "triton-fused"], DEV)
    a = _flat(wl.forward_probe(eager).forward())
    torch._dynamo.reset()
    comp, _ = apply_stack(pipe, wl, [*stack, compile_step, "triton-fused"], DEV, "inductor")
    b = _flat(wl.forward_probe(comp).forward())
    assert torch.isfinite(b).all()
    assert ((a - b).norm() / a.norm()).item() < 3e-2


def test_fp8_leaves_inductors_settings_alone(monkeypatch):
    """torchao's float8 config turns on inductor's coordinate-descent tuning process-wide unless told not to (its
    recommended_inductor_config_setter, never restored): every later compile in the process would benchmark each
    kernel's launch configurations. The fp8 variant asks it not to, and quantizes only the large bf16 linears. A
    stand-in torchao (the CPU has no FP8 path) records what the variant asks for."""
    import sys
    import types

    import torch._inductor.config as inductor_config

    from wmbook import variants
    from wmbook.variants import VariantContext
    from wmbook.variants.builtin import kernels as builtin  # where the fp8 variant and its availability check live

    asked, quantized = {}, []

    class Config:
        def __init__(self, granularity=None, set_inductor_config=True):
            asked.update(granularity=granularity, set_inductor_config=set_inductor_config)
            if set_inductor_config:  # what torchao does with the default
                inductor_config.coordinate_descent_tuning = True

    def quantize_(model, config, filter_fn):
        quantized.extend(n for n, m in model.named_modules() if filter_fn(m, n))

    fake = types.ModuleType("torchao.quantization")
    fake.Float8DynamicActivationFloat8WeightConfig, fake.PerRow, fake.quantize_ = Config, object, quantize_
    top = types.ModuleType("torchao")
    for m in (top, fake):
        m.__spec__ = importlib.machinery.ModuleSpec(m.__name__, None)
    monkeypatch.setitem(sys.modules, "torchao", top)
    monkeypatch.setitem(sys.modules, "torchao.quantization", fake)
    monkeypatch.setattr(builtin, "fp8_unavailable", lambda device: None)
    monkeypatch.setattr(inductor_config, "coordinate_descent_tuning", False)

    # a stand-in denoiser: two linears large enough for fp8 GEMMs, one too small, one still fp32
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 256),
                                torch.nn.Linear(256, 8)).to(torch.bfloat16).append(torch.nn.Linear(256, 256))
    ctx = VariantContext(workload=types.SimpleNamespace(denoiser=lambda pipe: model), device=CPU)
    variants.get("fp8").apply(object(), ctx)
    assert asked["set_inductor_config"] is False and inductor_config.coordinate_descent_tuning is False
    assert quantized == ["0", "2"] and ctx.notes["fp8"] == "2 linears in fp8 (row-wise dynamic scales)"


def test_interpretation_compares_each_row_with_the_row_before():
    """The ladder is cumulative: each row's sentence compares it with the last row that passed before it, so a row
    is not credited with an earlier row's saving (the H100 run of notebook 05 at mg2-universal, 76c3f7a, credited
    attn-sage, which runs SDPA there, with triton-fused's 1.2 ms); a failed row is skipped as a comparison point."""
    from types import SimpleNamespace

    from wmbook.bench import Samples
    from wmbook.variants.ladder import LadderRow

    def row(name, ms, busy, launches, fps, gate="pass"):
        return LadderRow(stack=[], tolerance="bf16", forward=Samples([ms] * 3), flops=1.0, gpu_busy_ms=busy,
                         launches=launches, e2e_value=fps, gate=gate, variant=name)

    rows = [row("fp32 eager (reference)", 273, 256, 3519, 9.0, "reference"), row("base", 44.7, 23.7, 1235, 28.3),
            row("+ triton-fused", 38.2, 22.4, 1370, 24.9), row("+ bad", 30.0, 20.0, 1370, 40.0, "FAIL"),
            row("+ attn-sage", 61.5, 22.5, 1370, 31.7)]
    lad = SimpleNamespace(rows=rows, failures=lambda: [])
    cfg = SimpleNamespace(workload=SimpleNamespace(metric=SimpleNamespace(label="FPS")))
    text = study.interpret(cfg, None, lad)
    assert "`+ triton-fused` (on the base): forward 44.7 -> 38.2 ms, GPU busy 23.7 -> 22.4" in text, text
    assert "`+ bad` failed the gate (FAIL)" in text
    assert "`+ attn-sage` (on `+ triton-fused`): forward 38.2 -> 61.5 ms, GPU busy 22.4 -> 22.5" in text, text
    assert "saves" not in text.split("`+ attn-sage`")[1]


@pytest.mark.parametrize("stack", [["fused-qkv"],
                                   # fused first, then the kernels: make test runs notebook 05's order, after them
                                   pytest.param(["fused-qkv", "triton-fused"], marks=pytest.mark.slow),
                                   ["triton-fused", "fused-qkv"]])
def test_fused_qkv_is_the_three_projections_in_one_gemm_before_or_after_the_fused_kernels(stack):
    """One GEMM over the concatenated weights computes the same dot products: fp32 rounding from the reference, in
    whichever order it meets notebook 05's fused q/k norm + RoPE (whose forward then reads the fused projection)."""
    from wmbook.variants.qkv import FusedQKVSelfAttention

    wl = workloads.get("mg2")
    pipe = wl.reference_pipeline(wl.presets["tiny"], DEV)
    ref = _flat(wl.forward_probe(pipe).forward())
    fused, ctx = apply_stack(pipe, wl, stack, DEV)
    attns = [m for m in wl.denoiser(fused).modules() if hasattr(m, "qkv")]
    assert attns and f"{len(attns)} self-attentions" in ctx.notes["fused-qkv"]
    a = attns[0]
    assert a.q.weight.data_ptr() == a.qkv.weight.data_ptr()  # q, k, v are views of the fused weight: no copy
    assert a.v.weight.data_ptr() == a.qkv.weight[2 * a.dim:].data_ptr()
    names = [c.__name__ for c in type(a).__mro__]
    assert ("FusedQKNormRoPE" in names) == ("triton-fused" in stack)
    assert isinstance(a, FusedQKVSelfAttention) == (stack == ["fused-qkv"] or stack[0] == "fused-qkv")
    out = _flat(wl.forward_probe(fused).forward())
    # fp32 accumulation in another order (and, with the fused kernels, their fp32 arithmetic): roundoff only
    assert ((out - ref).norm() / ref.norm()).item() < 1e-5


def test_ffn_gelu_epilogue_keeps_the_feed_forward_and_shares_its_weights():
    """Every DiT block's feed-forward swapped, with the block's own linears; on a CPU the reference's arithmetic, so the
    forward is bit-equal; on a GPU the GELU + bias epilogue, within the precision in effect."""
    from wmbook.variants.epilogues import GeluEpilogueFFN

    wl = workloads.get("mg2")
    pipe = wl.reference_pipeline(wl.presets["tiny"], DEV)
    ref = _flat(wl.forward_probe(pipe).forward())
    ups = [m.ffn[0].weight for m in wl.denoiser(pipe).modules() if hasattr(m, "ffn")]
    fused, ctx = apply_stack(pipe, wl, ["ffn-gelu-epilogue"], DEV)
    ffns = [m.ffn for m in wl.denoiser(fused).modules() if hasattr(m, "ffn")]
    assert ffns and all(isinstance(f, GeluEpilogueFFN) for f in ffns)
    assert f"{len(ffns)} feed-forwards" in ctx.notes["ffn-gelu-epilogue"]
    assert len(ffns) == len(ups) and all(torch.equal(f.up.weight, w) for f, w in zip(ffns, ups))
    out = _flat(wl.forward_probe(fused).forward())
    if DEV.type == "cpu":
        assert torch.equal(out, ref)
    else:  # fp32 on a GPU: the epilogue's GELU against the separate kernel's, fp32 roundoff
        assert ((out - ref).norm() / ref.norm()).item() < 1e-4
    with pytest.raises(ValueError, match="no Linear -> GELU"):
        apply_stack(fused, wl, ["ffn-gelu-epilogue"], DEV)  # nothing left to swap


def test_frames_norm_triton_variant_on_the_tiny_unet():
    """Every temporal transformer's norm swapped (the state dict unchanged), its output the reference's within fp32
    rounding, channels-first and channels-last; a second application is refused."""
    from wmbook.models.wma.unet import TemporalTransformer
    from wmbook.pipelines.ddim import WMAInteractionPipeline
    from wmbook.variants.fused import TritonFramesNorm

    wl = workloads.get("wma")
    pipe = WMAInteractionPipeline("tiny-wma", device=DEV, dtype="fp32", seed=0)
    fused = copy.deepcopy(pipe)
    ctx = VariantContext(workload=wl, device=DEV)
    keys = set(pipe.model.state_dict())
    REGISTRY["frames-norm-triton"].apply(fused, ctx)
    pairs = [(a, b) for a, b in zip(pipe.model.modules(), fused.model.modules()) if isinstance(a, TemporalTransformer)]
    assert pairs and all(isinstance(b, TritonFramesNorm) for _, b in pairs)
    assert ctx.notes["frames-norm-triton"].startswith(f"{len(pairs)} temporal")
    assert set(fused.model.state_dict()) == keys
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for a, b in pairs[:2]:
            x = torch.randn(2 * 3, a.norm.num_channels, 4, 5, generator=g).to(DEV)
            for x_in in (x, x.contiguous(memory_format=torch.channels_last)):
                torch.testing.assert_close(b.frames_norm(x_in, 2), a.frames_norm(x_in, 2), rtol=1e-5, atol=1e-5)
                torch.testing.assert_close(b(x_in, 2), a(x_in, 2), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="frames-norm-triton found no temporal transformer left"):
        REGISTRY["frames-norm-triton"].apply(fused, ctx)  # all swapped already
