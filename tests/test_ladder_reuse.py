"""Ladder rows whose variant leaves the denoiser as it was are built on the row before's pipeline: the compiled and
captured denoiser is kept (no second compile), and the row measures what a fresh build of its stack measures."""

import pytest
import torch

from wmbook import workloads
from wmbook.variants import registry
from wmbook.variants.ladder import LadderSettings, run_ladder
from wmbook.workloads import E2ESize

CPU = torch.device("cpu")
MG2 = workloads.get("mg2")
BUILT_ON = "built on the row before"
# the denoiser compiled, then rows that touch only the decoder and the order of the passes
STEPS = ["bf16", "compile-regional", "vae-stream-buffers", "vae-channels-last", "decode-first", "stream-frames"]
# as short as a row allows: the tests read which rows are built on which and their errors, not their times
SETTINGS = LadderSettings(warmup=0, repeats=1, e2e=E2ESize(blocks=2), e2e_repeats=1, compile_backend="eager")


@pytest.fixture(autouse=True, scope="module")
def _one_thread(one_thread):
    """Every test of this module on one thread (tests/conftest.py)."""


@pytest.fixture(scope="module")
def mg2_ref():
    return MG2.reference_pipeline(MG2.presets["tiny"], CPU)


def _resets(monkeypatch):
    """Count the compile-state resets (each compiled row built afresh starts with one)."""
    import wmbook.variants.ladder as ladder_mod

    calls = []
    real = ladder_mod.reset_compile_state
    monkeypatch.setattr(ladder_mod, "reset_compile_state", lambda: (calls.append(1), real())[1])
    return calls


def test_which_variants_leave_the_denoiser_as_it_was():
    keep = {n for n, v in registry.REGISTRY.items() if not v.denoiser}
    assert {"vae-stream-buffers", "vae-channels-last", "vae-compile", "vae-cuda-graphs", "vae-bf16",
            "conditioning-cuda-graphs", "vae-encoder-bf16", "conditioning-compile",
            "decode-first", "stream-frames", "skip-unused-decode", "skip-unused-encode",
            "constant-conditioning", "cudnn-benchmark"} <= keep
    assert not keep & {"bf16", "compile-regional", "cuda-graphs", "static-caches", "decode-overlap", "tf32",
                       "skip-unused-heads", "ring-kv-cache", "triton-fused"}
    assert all(registry.REGISTRY[n].family in ("decoder", "precision", "graphs", "layout") for n in keep)


@pytest.mark.parametrize("steps", [
    # make test's case: one decoder row and one frame-order row on the compiled row
    ["bf16", "compile-regional", "vae-stream-buffers", "stream-frames"],
    pytest.param(STEPS, marks=pytest.mark.slow)])
def test_decoder_rows_build_on_the_compiled_row_and_measure_what_a_fresh_build_does(mg2_ref, monkeypatch, steps):
    resets = _resets(monkeypatch)
    lad = run_ladder("mg2", "tiny", steps, device=CPU, reference=mg2_ref, settings=SETTINGS)
    notes = [r.note for r in lad.rows]
    assert [BUILT_ON in n for n in notes] == [False, False, False] + [True] * (len(steps) - 2)
    assert len(resets) == 1  # the compiled row; the rows after it keep its compiled denoiser
    assert all(r.gate == "pass" for r in lad.rows[1:]) and all(r.recompiles == 0 for r in lad.rows[2:])
    # the same stack built afresh as one row: the same forward error and the same frames
    fresh = run_ladder("mg2", "tiny", steps, device=CPU, reference=mg2_ref, settings=SETTINGS, from_row=len(steps))
    last, whole = lad.rows[-1], fresh.rows[-1]
    assert BUILT_ON not in whole.note and len(resets) == 2
    assert last.rel_l2_vs_fp32 == pytest.approx(whole.rel_l2_vs_fp32, rel=1e-6, abs=1e-9)
    assert last.psnr_db == pytest.approx(whole.psnr_db, rel=1e-6)
    assert last.decoder == whole.decoder and last.stack == whole.stack


def test_rows_built_on_the_row_before_keep_its_global_switches(mg2_ref, monkeypatch):
    import wmbook.variants.ladder as ladder_mod

    real, seen = ladder_mod._measure, []

    def measure(ref, wl, stack, *args, base=None, **kwargs):
        seen.append((stack[-1].name if stack else "-", base is not None, torch.get_float32_matmul_precision(),
                     torch.backends.cudnn.benchmark))
        return real(ref, wl, stack, *args, base=base, **kwargs)

    monkeypatch.setattr(ladder_mod, "_measure", measure)
    before, search = torch.get_float32_matmul_precision(), torch.backends.cudnn.benchmark
    assert not search
    run_ladder("mg2", "tiny", ["tf32", "cudnn-benchmark", "vae-stream-buffers", "bf16"], device=CPU,
               reference=mg2_ref, settings=SETTINGS)
    # tf32's switch is on when its row's pipeline takes cuDNN's search and then the decoder row, the search's switch
    # for the decoder row too; bf16 builds afresh from switches restored
    assert seen == [("-", False, before, False), ("tf32", False, before, False),
                    ("cudnn-benchmark", True, "high", False), ("vae-stream-buffers", True, "high", True),
                    ("bf16", False, before, False)]
    assert torch.get_float32_matmul_precision() == before and not torch.backends.cudnn.benchmark


def test_kept_first_row_is_not_built_on_and_a_failed_row_ends_the_chain(mg2_ref, monkeypatch):
    # notebook 06 keeps the first measured row's pipeline (keep=True, from_row > 1): the row after it builds afresh
    settings = LadderSettings(warmup=0, repeats=1, e2e=E2ESize(blocks=2), e2e_repeats=1, compile_backend="eager",
                              keep=True)
    boom = registry.Variant(name="test-decoder-boom", family="decoder", description="raises", requires=frozenset(
        {"denoiser"}), apply=lambda pipe, ctx: (_ for _ in ()).throw(RuntimeError("boom")), denoiser=False)
    monkeypatch.setitem(registry.REGISTRY, boom.name, boom)
    lad = run_ladder("mg2", "tiny", ["bf16", "vae-stream-buffers", "test-decoder-boom", "vae-channels-last",
                                     "decode-first"], device=CPU, reference=mg2_ref, settings=settings, from_row=2)
    assert [r.variant for r in lad.rows] == ["fp32 eager (reference)", "bf16 + vae-stream-buffers",
                                             "+ test-decoder-boom", "+ vae-channels-last", "+ decode-first"]
    assert lad.rows[1].pipeline is not None and BUILT_ON not in lad.rows[1].note
    assert lad.rows[2].gate == "error" and "boom" in lad.rows[2].note
    assert BUILT_ON not in lad.rows[3].note and BUILT_ON in lad.rows[4].note  # after the failure: afresh, then on it
    assert lad.rows[4].gate == "pass" and lad.rows[4].pipeline is not None and lad.rows[3].pipeline is None


@pytest.mark.slow  # two compiled ladders; make test runs on_first_row through notebook 06's tiny case
def test_on_first_row_sees_the_kept_first_row_then_the_next_row_builds_on_it(mg2_ref, monkeypatch):
    """With on_first_row (notebook 06 profiles the base row's generation there), a kept first measured row's pipeline
    is handed over as measured, then the next row is built on it (one compile), and only the latest row's pipeline is
    kept; the rows measure what they measure without the callback."""
    settings = LadderSettings(warmup=1, repeats=1, e2e=E2ESize(blocks=3), e2e_repeats=1, compile_backend="eager",
                              keep=True)
    steps = ["bf16", "compile-regional", "vae-stream-buffers", "vae-channels-last"]
    seen = []

    def first(lad):
        r = lad.rows[-1]
        seen.append((r.variant, r.pipeline is not None, type(r.pipeline.decoder).__name__))

    resets = _resets(monkeypatch)
    lad = run_ladder("mg2", "tiny", steps, device=CPU, reference=mg2_ref, settings=settings, from_row=2,
                     on_first_row=first)
    assert seen == [("bf16 + compile-regional", True, "StreamingWanDecoder")]  # as measured: no buffers yet
    assert [BUILT_ON in r.note for r in lad.rows] == [False, False, True, True] and len(resets) == 1
    assert [r.pipeline is not None for r in lad.rows] == [False, False, False, True]
    kept = run_ladder("mg2", "tiny", steps, device=CPU, reference=mg2_ref, settings=settings, from_row=2)
    assert [BUILT_ON in r.note for r in kept.rows] == [False, False, False, True]  # the row after it builds afresh
    for a, b in zip(lad.rows, kept.rows):
        assert a.variant == b.variant and a.gate == b.gate and a.psnr_db == pytest.approx(b.psnr_db, rel=1e-6)


@pytest.mark.parametrize("compiled", [
    False,  # make test's case: the chain of pass rows; keeping a compiled denoiser is the mg2 decoder rows' case
    pytest.param(True, marks=pytest.mark.slow)])  # two whole-UNet compiles: minutes on a slow 2-core box
def test_wma_pass_rows_build_on_the_row_before(monkeypatch, compiled):
    wma = workloads.get("wma")
    ref = wma.reference_pipeline(wma.presets["tiny-wma"], CPU)
    steps = ["bf16", "compile-whole", "skip-unused-decode", "skip-unused-encode", "constant-conditioning"]
    if not compiled:
        steps.remove("compile-whole")
    settings = LadderSettings(warmup=0, repeats=1, e2e=E2ESize(ddim_steps=2), e2e_repeats=1, compile_backend="eager")
    resets = _resets(monkeypatch)
    lad = run_ladder("wma", "tiny-wma", steps, device=CPU, reference=ref, settings=settings)
    first = len(steps) - 2  # the first pass row's place (the reference is row 0)
    assert [BUILT_ON in r.note for r in lad.rows] == [i >= first for i in range(len(steps) + 1)]
    assert len(resets) == int(compiled) and all(r.gate == "pass" for r in lad.rows[1:])
    fresh = run_ladder("wma", "tiny-wma", steps, device=CPU, reference=ref, settings=settings, from_row=len(steps))
    assert lad.rows[-1].rel_l2_vs_fp32 == pytest.approx(fresh.rows[-1].rel_l2_vs_fp32, rel=1e-6, abs=1e-9)
    assert lad.rows[-1].psnr_db == pytest.approx(fresh.rows[-1].psnr_db, rel=1e-6)


@pytest.mark.parametrize("keep", [True, pytest.param(False, marks=pytest.mark.slow)])
def test_the_stacks_compiled_ahead_are_the_ones_the_rows_compile(mg2_ref, monkeypatch, keep):
    """wmbook.variants.compile_ahead plans from the ladder's own rule which rows build afresh: on a GPU its
    processes compile exactly the stacks the rows then compile (here the plan is handed a stand-in result)."""
    import wmbook.variants.ladder as ladder_mod
    from wmbook.variants import compile_ahead as ca

    compiled, plans = [], []
    real_apply = ladder_mod.apply_stack

    def apply_stack(ref, wl, stack, device, backend="inductor"):
        if any(v.family == "compile" for v in stack):
            compiled.append(ca.Ahead.key(stack))
        return real_apply(ref, wl, stack, device, backend)

    def for_ladder(wl, preset, steps, from_row, comparisons, device, settings, builds_afresh):
        plans.extend(ca.Ahead.key(s) for s in ca.planned(steps, from_row, comparisons, builds_afresh))
        return ca.Ahead(2, runs={k: {"ok": True, "first_call_s": 7.0} for k in plans})

    monkeypatch.setattr(ladder_mod, "apply_stack", apply_stack)
    monkeypatch.setattr(ladder_mod, "for_ladder", for_ladder)
    settings = LadderSettings(warmup=0, repeats=1, e2e=E2ESize(blocks=2), e2e_repeats=1, compile_backend="eager",
                              keep=keep)
    steps = ["bf16", "compile-regional", "vae-stream-buffers", "static-caches"]
    lad = run_ladder("mg2", "tiny", steps, device=CPU, reference=mg2_ref, settings=settings, from_row=2,
                     comparisons={"the base again": ["bf16", "compile-regional"]})
    assert plans == list(dict.fromkeys(compiled)) and len(plans) == (3 if keep else 2)
    marked = [r.variant for r in lad.rows if r.compiled_ahead_s == 7.0]
    assert len(marked) == len(compiled) and all("compiled ahead" in r.note for r in lad.rows
                                                if r.compiled_ahead_s == 7.0)
