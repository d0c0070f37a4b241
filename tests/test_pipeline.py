"""Labelled streaming pipeline: schedule, determinism, label hierarchy, parameter validation."""

import gzip
import json
import re

import pytest
import torch

from wmbook.pipelines.causal import CausalStreamingPipeline, warped_timesteps
from wmbook.profiling import label_table, profile, set_labels
from wmbook.studies import baseline


@pytest.fixture(scope="module")
def pipe():
    return CausalStreamingPipeline("tiny", device="cpu", dtype="fp32", seed=0)


def test_warped_schedule_matches_shift5_flow_matching():
    # sigma' = 5 s / (1 + 4 s) with s = step / 1000 (diffusers FlowMatchEulerDiscreteScheduler, shift 5)
    for steps in ([1000, 666, 333], [1000, 750, 500, 250]):
        got = warped_timesteps(steps, shift=5.0)
        want = [1000 * (5 * s / 1000) / (1 + 4 * s / 1000) for s in steps]
        assert got == pytest.approx(want, abs=0.01)
    with pytest.raises(ValueError):
        warped_timesteps([1200])


def test_seeded_generation_is_deterministic_and_shaped(pipe):
    a_in = pipe.prepare(3, seed=7)
    a = pipe.generate(a_in, progress=False)
    b = pipe.generate(pipe.prepare(3, seed=7), progress=False)
    c = pipe.generate(pipe.prepare(3, seed=8), progress=False)
    assert torch.equal(a.frames, b.frames)
    assert not torch.equal(a.frames, c.frames)
    assert a.frames.shape == (1, 3, 1 + 4 * 8, 64, 64)  # 9 latent frames -> 33 pixel frames
    assert a.frames_per_block == [9, 12, 12]
    assert a.frames.abs().max() <= 1.0 and torch.isfinite(a.frames).all()
    assert len(a.forward_ms) == 3 and all(len(f) == 4 for f in a.forward_ms)  # 3 steps + refresh
    m = a.metrics()
    assert m["fps"] == pytest.approx(24 / sum(a.block_ms[1:]) * 1e3)


def test_label_hierarchy_in_trace(pipe, tmp_path):
    res = profile(lambda: pipe.run(2, export_path=tmp_path / "v.gif", progress=False), wait=0, warmup=0, active=1,
                  out_dir=tmp_path, name="t")
    with gzip.open(res.trace_path, "rt") as f:
        names = {e.get("name") for e in json.load(f)["traceEvents"]}
    for want in ["1_Data_Preparation", "1.1_Image_Loading_Resize", "1.2_VAE_Encode_FirstFrame",
                 "1.3_Condition_Preparation", "1.4_CLIP_Visual_Context", "1.5_Noise_Sampling",
                 "1.6_Action_Conditions_Setup", "2_Pipeline_Inference", "2.1_KV_Cache_Initialization",
                 "2.3_Block_0", "2.3_Block_1", "2.3.1_Update_KV_Cache", "2.3.1_VAE_Decode", "Generator_Forward",
                 "Generator_Forward_Final", "Scheduler_AddNoise", "DiffusionModel_Forward", "Flow_to_X0_Conversion",
                 "VAE_Decode_Frame_0", "3_Video_Postprocessing", "4_Video_Export"]:
        assert want in names, want
    steps = sorted(n for n in names if n and re.match(r"^2\.3\.0_Denoising_Step_\d+_t\d+$", n))
    assert steps == ["2.3.0_Denoising_Step_0_t1000", "2.3.0_Denoising_Step_1_t909", "2.3.0_Denoising_Step_2_t714"]
    df = label_table(res.trace_path)
    row = df.set_index("label").loc["2_Pipeline_Inference"]
    assert row["cpu_self_ms"] <= row["cpu_total_ms"]
    assert (tmp_path / "v.gif").stat().st_size > 0


def test_labels_off_emit_nothing(pipe, tmp_path):
    set_labels(False)
    try:
        res = profile(lambda: pipe.generate(pipe.prepare(1), progress=False), wait=0, warmup=0, active=1,
                      out_dir=tmp_path, name="off")
    finally:
        set_labels(True)
    with gzip.open(res.trace_path, "rt") as f:
        names = {e.get("name") for e in json.load(f)["traceEvents"]}
    assert "2_Pipeline_Inference" not in names and "DiffusionModel_Forward" not in names


@pytest.mark.parametrize("kw,match", [
    ({"preset": "mg3"}, "preset='mg3'.*allowed values"),
    ({"dtype": "int8"}, "dtype='int8'.*allowed values"),
    ({"vae_dtype": "fp64"}, "vae_dtype='fp64'.*allowed values"),
    ({"repeats": 0}, "repeats=0.*integer >= 1"),
    ({"warmup": -1}, "warmup=-1"),
    ({"num_blocks": 2.5}, "num_blocks=2.5"),
    ({"device": "tpu"}, "device='tpu'.*allowed values"),
    ({"preset": "mg2-universal", "device": "cpu"}, "needs a GPU"),
    ({"preset": "tiny-sf", "num_blocks": 5}, "num_blocks=5 is not allowed for preset 'tiny-sf': at most 3 blocks"),
    ({"num_blockz": 2}, r"unknown parameter\(s\) \['num_blockz'\].*allowed names: .*'num_blocks'"),
    ({"ddim_steps": 5}, r"ddim_steps=5 applies to workload \['wma'\] only; for workload 'mg2' leave it at 0"),
    ({"workload": "sd"}, "workload='sd' is not allowed; allowed values: \\['mg2', 'wma'\\]"),
    ({"profile": "yes"}, "profile='yes'"),
])
def test_bad_parameters_rejected_before_work(kw, match):
    with pytest.raises(ValueError, match=match):
        baseline.validate(**kw)


def test_baseline_dtype_auto_is_the_workloads_eager_precision():
    """Notebook 01's run is the eager baseline: on a GPU its `auto` dtype is the one upstream runs (wma fp32, not the
    bf16 the later notebooks' `auto` means); on a CPU fp32; an explicit dtype is kept."""
    import torch

    from wmbook import params, workloads

    for name, want in (("mg2", torch.bfloat16), ("wma", torch.float32)):
        ctx = {"_name": "dtype", "device": torch.device("cuda"), "workload": workloads.get(name)}
        assert params.EAGER_DTYPE.check("auto", ctx) is want
        assert params.EAGER_DTYPE.check("bf16", ctx) is torch.bfloat16
        assert params.EAGER_DTYPE.check("auto", ctx | {"device": torch.device("cpu")}) is torch.float32
    assert baseline.validate(workload="wma", device="cpu").dtype is torch.float32


def test_baseline_result_tables(pipe):
    cfg = baseline.validate(preset="tiny", device="cpu", num_blocks=3, warmup=0, repeats=2)
    assert cfg.options.num_blocks == 3 and cfg.preset.name == "tiny" and cfg.dtype == torch.float32
    inputs = pipe.prepare(3)
    res = baseline.run_benchmark(pipe, inputs, cfg, {"gemm_tflops": 1.0, "device_name": "cpu"})
    s = res.summary()
    assert s["fps"].n == 2 and s["dit_forward_ms"].n == 2 * 2 * 4  # 2 runs x 2 steady blocks x 4 forwards
    bt = res.block_table()
    assert list(bt["pixel_frames"]) == [9, 12, 12]
    assert (bt["denoise_ms"] + bt["cache_refresh_ms"] + bt["vae_decode_ms"] <= bt["block_ms"] * 1.0001).all()
    assert 0 < s["vae_share"] < 1
    text = baseline.interpret(cfg, res)
    assert "FPS" in text and "floor" in text
    table = baseline.summary_table(res)
    assert table.loc["fps", "unit"] == "frames/s" and table.loc["dit_forward_ms", "n"] == 16
    assert table.loc["vae_share", "unit"] == "fraction" and table.loc["vae_share", "n"] != table.loc["vae_share", "n"]


@pytest.mark.parametrize("name", ["tiny", "tiny-sf"])
def test_bf16_generation_runs(name):
    """The GPU default dtype on the CPU: catches mixed-dtype bugs before a GPU run does."""
    p = CausalStreamingPipeline(name, device="cpu", dtype="bf16")
    out = p.generate(p.prepare(2), progress=False)
    assert out.frames.dtype == torch.bfloat16 and torch.isfinite(out.frames.float()).all()


def test_detail_labels_only_when_asked(pipe, tmp_path):
    names = {}
    for detail in (False, True):
        set_labels(True, detail=detail)
        try:
            inputs = pipe.prepare(1)
            res = profile(lambda: pipe.generate(inputs, progress=False), wait=0, warmup=0, active=1,
                          out_dir=tmp_path, name=f"d{int(detail)}")
        finally:
            set_labels(True, detail=False)
        with gzip.open(res.trace_path, "rt") as f:
            names[detail] = {e.get("name") for e in json.load(f)["traceEvents"]}
    fine = {"DiT_Embeddings", "DiT_Norm_Modulation", "DiT_SelfAttn_QKV_RoPE", "DiT_KV_Cache_Update",
            "DiT_Attention", "DiT_CrossAttn", "DiT_Action", "DiT_FFN", "DiT_Head"}
    assert fine <= names[True]
    assert not (fine & names[False])


def test_decode_first_gives_the_same_frames_one_forward_sooner(pipe):
    """The decode-first variant decodes each block before its cache-refresh forward: latents and frames bit for bit
    those of the reference order; the first frame arrives before the first block ends (its refresh comes after), each
    block still accounts for all its forwards and its decode."""
    from wmbook import variants, workloads
    from wmbook.variants import swaps
    from wmbook.variants.ladder import apply_stack

    wl = workloads.get("mg2")
    assert "decode-first" in variants.known(wl) and "decode-first" not in variants.known(workloads.get("wma"))
    first, _ = apply_stack(pipe, wl, ["decode-first"], torch.device("cpu"))
    assert isinstance(first, swaps.DecodeBeforeRefresh) and not pipe.decode_before_refresh
    with torch.no_grad():
        a = pipe.generate(pipe.prepare(3, seed=0), progress=False)
        b = first.generate(first.prepare(3, seed=0), progress=False)
    assert torch.equal(a.latents, b.latents) and torch.equal(a.frames, b.frames)
    n = len(pipe.sampling_timesteps(None, None)) + 1  # the steps and the refresh
    for out in (a, b):
        assert [len(f) for f in out.forward_ms] == [n] * 3 and len(out.decode_ms) == 3
        for bi in (1, 2):  # a block's parts are its time (the first block's also holds the cache's initialization)
            assert sum(out.forward_ms[bi]) + out.decode_ms[bi] == pytest.approx(out.block_ms[bi], rel=0.05)
    assert b.first_frame_ms < b.block_ms[0]  # the refresh of block 0 comes after its frames
    assert a.first_frame_ms == pytest.approx(a.block_ms[0])
    # another rank's decode (notebook 08's stage split: on_block, decode=False) gets the latents as early
    calls = []

    def refresh(orig):
        def f(bi, *args, **kw):
            calls.append(("refresh", bi))
            return orig(bi, *args, **kw)
        return f

    lat = []
    for p_, order in ((first, ["block", "refresh"]), (pipe, ["refresh", "block"])):
        calls.clear()
        p_.refresh_cache = refresh(p_.refresh_cache)
        with torch.no_grad():
            lat.append(p_.generate(p_.prepare(2, seed=0), decode=False, progress=False,
                                   on_block=lambda bi, x0: calls.append(("block", bi))).latents)
        del p_.refresh_cache
        assert [c for c, bi in calls if bi == 0] == order
    assert torch.equal(*lat)


def test_stream_frames_hands_out_each_latent_frames_pixels_as_soon_as_they_are_decoded(pipe):
    """The stream-frames variant: on_frames gets each latent frame's pixel frames (the stream's first latent frame
    decodes to one frame, every later one to four), their concatenation is the block's frames bit for bit, and the
    first frame is marked at the first piece (before the block's decode ends); alone and after decode-first. Without
    it, on_frames gets each block's frames whole."""
    from wmbook import variants, workloads
    from wmbook.variants.ladder import apply_stack

    wl = workloads.get("mg2")
    cpu = torch.device("cpu")
    assert "stream-frames" in variants.known(wl) and "stream-frames" not in variants.known(workloads.get("wma"))
    k = pipe.preset.num_frame_per_block
    with torch.no_grad():
        whole = []
        a = pipe.generate(pipe.prepare(2, seed=0), progress=False, on_frames=whole.append)
        assert [f.shape[2] for f in whole] == a.frames_per_block and torch.equal(torch.cat(whole, 2), a.frames)
        for stack in (["stream-frames"], ["decode-first", "stream-frames"]):
            early, _ = apply_stack(pipe, wl, stack, cpu)
            pieces = []
            b = early.generate(early.prepare(2, seed=0), progress=False, on_frames=pieces.append)
            assert torch.equal(a.latents, b.latents) and torch.equal(a.frames, b.frames)
            assert [p.shape[2] for p in pieces] == [1] + [4] * (2 * k - 1)
            assert torch.equal(torch.cat(pieces, 2), b.frames)
            assert 0 < b.first_frame_ms < b.block_ms[0] - b.decode_ms[0] / k  # before the block's decode ends
    assert not pipe.stream_frames
