"""UnifoLM-WMA interaction pipeline: schedules, DDIM update vs upstream, determinism, CFG, sections, labels, params;
the conditioning variants (the encoders captured, compiled, the VAE encoder in bf16)."""

import copy
import gzip
import json
import math
import re
from fractions import Fraction

import numpy as np
import pytest
import torch

from wmbook import workloads
from wmbook.check import PRECISION_BUDGET_REL_L2, compare
from wmbook.graphs import GraphedCallable
from wmbook.pipelines.ddim import (
    WMAInteractionPipeline,
    check_run_params,
    ddim_table,
    ddim_update,
    dynamic_rescale,
    head_scheduler,
    video_scheduler,
)
from wmbook.presets import ALL_PRESETS, PRESETS, WMA_PRESETS, WMAPreset, get_preset
from wmbook.profiling import label_table, profile
from wmbook.profiling.sections import SectionTimer
from wmbook.studies import baseline as baseline_study
from wmbook.variants import REGISTRY
from wmbook.variants.registry import VariantContext


@pytest.fixture(autouse=True, scope="module")
def _one_thread(one_thread):
    """Every test of this module on one thread (tests/conftest.py)."""


@pytest.fixture(scope="module")
def pipe():
    return WMAInteractionPipeline("tiny-wma", device="cpu", dtype="fp32", seed=0)


@pytest.fixture(scope="module")
def inputs(pipe):
    return pipe.prepare(seed=3)


# --- presets ------------------------------------------------------------------------------------------


def test_presets_of_both_workloads():
    assert set(ALL_PRESETS) == set(PRESETS) | set(WMA_PRESETS) and "tiny" in PRESETS
    assert isinstance(get_preset("wma"), WMAPreset) and get_preset("tiny").name == "tiny"
    wf = workloads.for_preset
    assert wf("wma").name == wf("tiny-wma").name == "wma" and wf("self-forcing").name == "mg2"
    assert workloads.get("wma").tiny_preset == "tiny-wma" and workloads.get("mg2").tiny_preset == "tiny"
    assert baseline_study.validate(workload="wma", device="cpu").preset.name == "tiny-wma"
    with pytest.raises(ValueError, match="allowed values.*tiny-wma.*wma"):
        get_preset("wma2")
    with pytest.raises(ValueError, match="allowed values"):
        workloads.for_preset("wma2")
    p = get_preset("wma")
    assert (p.default_steps, p.ddim_eta, p.guidance_scale, p.guidance_rescale) == (50, 1.0, 1.0, 0.7)
    assert p.latent_shape == (4, 16, 40, 64) and p.n_obs_steps == 2 and not p.tiny and get_preset("tiny-wma").tiny
    assert p.with_(default_steps=20).default_steps == 20 and p.default_steps == 50
    assert p.to_dict()["channel_mult"] == (1, 2, 4, 4)
    with pytest.raises(Exception):
        p.frames = 8  # frozen


# --- schedules ------------------------------------------------------------------------------------------


def _upstream_alphas_cumprod() -> np.ndarray:
    """Upstream register_schedule: LDM 'linear' betas (sqrt-linspace squared), then rescale_zero_terminal_snr."""
    betas = np.linspace(0.00085**0.5, 0.012**0.5, 1000, dtype=np.float64) ** 2
    abar = np.sqrt(np.cumprod(1 - betas))
    a0, at = abar[0], abar[-1]
    abar = (abar - at) * a0 / (a0 - at)
    return abar**2


def test_video_scheduler_matches_upstream():
    p = get_preset("wma")
    s = video_scheduler(p)
    s.set_timesteps(50)
    ts = [int(t) for t in s.timesteps]
    assert ts == list(range(999, 0, -20))  # upstream 'uniform_trailing': 999, 979, ..., 19
    assert float(s.alphas_cumprod[-1]) == 0.0  # zero terminal SNR
    np.testing.assert_allclose(s.alphas_cumprod.double().numpy(), _upstream_alphas_cumprod(), rtol=1e-5, atol=1e-7)
    assert s.config.prediction_type == "v_prediction" and s.config.timestep_spacing == "trailing"
    assert float(s.final_alpha_cumprod) == float(s.alphas_cumprod[0])  # upstream's last step lands on alpha_bar[0]
    h = head_scheduler(p)
    assert h.config.beta_schedule == "squaredcos_cap_v2" and h.config.clip_sample
    assert h.config.prediction_type == "epsilon"


def _upstream_update(p, ac, ts, j, x, v, noise, eta):
    """Upstream p_sample_ddim (v-pred, DynamiCrafter's pred-x0 rescale) in exact rational arithmetic.

    The schedule values are the float32 table read exactly; only the three square roots of the formula are
    rounded (to float64), after the exact subtraction 1 - a_prev - sigma^2, so nothing here can cancel.
    """
    t = ts[j]
    prev = ts[j + 1] if j + 1 < len(ts) else None
    a_t = Fraction(ac[t])
    a_prev = Fraction(ac[prev]) if prev is not None else Fraction(ac[0])
    sigma2 = Fraction(eta) ** 2 * (1 - a_prev) / (1 - a_t) * (1 - a_t / a_prev)
    r = Fraction(dynamic_rescale(p, prev)) / Fraction(dynamic_rescale(p, t)) if prev is not None else 1
    direction = 1 - a_prev - sigma2
    assert direction >= 0  # exactly: the float formula's negative residue is rounding alone
    sq = lambda q: math.sqrt(q)  # noqa: E731
    out = []
    for xi, vi, ni in zip(x.tolist(), v.tolist(), noise.tolist()):
        xi, vi = Fraction(xi), Fraction(vi)
        x0 = Fraction(sq(a_t)) * xi - Fraction(sq(1 - a_t)) * vi
        e_t = Fraction(sq(a_t)) * vi + Fraction(sq(1 - a_t)) * xi
        out.append(float(Fraction(sq(a_prev)) * x0 * r + Fraction(sq(direction)) * e_t
                         + Fraction(sq(sigma2)) * Fraction(ni)))
    return torch.tensor(out, dtype=torch.float64)


@pytest.mark.parametrize("steps", [50, 30, 16])
@pytest.mark.parametrize("eta", [1.0, 0.5, 0.0])
def test_ddim_update_equals_upstream_formula(steps, eta):
    """ddim_update == upstream p_sample_ddim at every step, the zero-SNR first step included (finite, exact)."""
    p = get_preset("wma")
    s = video_scheduler(p)
    table = ddim_table(p, s, steps, eta)
    ts = list(table.timesteps)
    assert ts[0] == 999 and len(ts) == steps
    ac = s.alphas_cumprod.double().tolist()
    g = torch.Generator().manual_seed(steps)
    for j in range(steps):
        x, v = (torch.randn(6, generator=g, dtype=torch.float64) for _ in range(2))
        noise = torch.randn(6, generator=torch.Generator().manual_seed(j), dtype=torch.float64)
        got, _ = ddim_update(table, j, x, v, torch.Generator().manual_seed(j))
        assert torch.isfinite(got).all(), f"step {j} (t={ts[j]}) not finite"
        want = _upstream_update(p, ac, ts, j, x, v, noise if eta > 0 else torch.zeros(6), eta)
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12, msg=f"step {j} (t={ts[j]})")
    # first step: a_t = 0 exactly, so at eta 1 the direction term vanishes exactly (not sqrt of a rounding)
    assert table.sqrt_alpha[0] == 0.0 and (table.eps_coef[0] == 0.0) == (eta == 1.0)


def test_ddim_update_equals_diffusers_step_where_it_is_well_conditioned():
    """Away from the zero-SNR step, ddim_update == diffusers' DDIMScheduler.step + the pred-x0 rescale (fp32).

    At t=999 diffusers evaluates sqrt(1 - a_prev - std^2) with two equal float32 numbers; the sign of the
    rounding residue depends on the last bit of alpha_bar (NaN with some torch builds), so that step is not
    compared: ddim_update is checked there against the exact formula above.
    """
    p = get_preset("wma")
    s = video_scheduler(p)
    table = ddim_table(p, s, 50, 1.0)
    g = torch.Generator().manual_seed(0)
    for j, t in enumerate(table.timesteps):
        if t == 999:
            continue
        x, v, noise = (torch.randn(2, 3, generator=g) for _ in range(3))
        out = s.step(v, t, x, eta=1.0, variance_noise=noise)
        prev = table.timesteps[j + 1] if j + 1 < len(table) else None
        r = dynamic_rescale(p, prev) / dynamic_rescale(p, t) if prev is not None else 1.0
        want = out.prev_sample + (r - 1.0) * math.sqrt(float(s.alphas_cumprod[prev] if prev is not None
                                                             else s.final_alpha_cumprod)) * out.pred_original_sample
        got, x0 = ddim_update(table, j, x, v, None, noise=noise)
        torch.testing.assert_close(x0, out.pred_original_sample, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5, msg=f"t={t}")


def test_ddim_table_refuses_eta_outside_the_unit_interval():
    p = get_preset("tiny-wma")
    with pytest.raises(ValueError, match=r"eta=1.5 .*allowed values: a number in \[0, 1\]"):
        ddim_table(p, video_scheduler(p), 10, 1.5)
    with pytest.raises(ValueError, match="eta=1.5 .*allowed values: a finite number in \\[0.0, 1.0\\]"):
        check_run_params(p, eta=1.5)


# --- the iteration ------------------------------------------------------------------------------------


def test_iteration_shapes_and_determinism(pipe, inputs):
    p = pipe.preset
    a = pipe.run_iteration(inputs, progress=False)
    b = pipe.run_iteration(pipe.prepare(seed=3), progress=False)
    c = pipe.run_iteration(pipe.prepare(seed=4), progress=False)
    ra, rb, rc = a.reference(), b.reference(), c.reference()
    assert set(ra) == {"decision_latents", "decision_frames", "actions", "world_latents", "world_frames", "states"}
    assert all(torch.equal(ra[k], rb[k]) for k in ra)
    assert all(not torch.equal(ra[k], rc[k]) for k in ("world_latents", "actions", "states"))
    assert ra["world_latents"].shape == (1, *p.latent_shape)
    assert ra["world_frames"].shape == (1, 3, p.frames, p.height, p.width)
    assert ra["actions"].shape == (1, p.horizon, p.agent_action_dim)
    assert ra["actions"].abs().max() <= 1.0 + 1e-6  # the heads' scheduler clips its x0 to [-1, 1]
    assert all(torch.isfinite(t).all() for t in ra.values())
    assert a.timesteps == [999, 666, 332] and a.unet_forwards == 2 * p.default_steps
    assert len(a.decision.step_ms) == len(a.world.forward_ms) == p.default_steps
    parts = a.conditioning_ms + a.decision.pass_ms + a.world.pass_ms + a.save_ms
    assert parts == pytest.approx(a.iteration_ms, rel=1e-6)
    assert sum(a.world.step_ms) == pytest.approx(a.world.sampling_ms, rel=1e-6)
    assert a.world.sampling_ms + a.world.decode_ms <= a.world.pass_ms * (1 + 1e-6)


def test_world_pass_uses_decision_actions(pipe, inputs, monkeypatch):
    """The world-model pass's action tokens come from the decision pass's actions (not zeros)."""
    seen = []
    orig = pipe.model.embed_action

    def spy(actions, zero=False):
        seen.append((actions.clone(), zero))
        return orig(actions, zero)

    monkeypatch.setattr(pipe.model, "embed_action", spy)
    out = pipe.run_iteration(inputs, progress=False, decode_decision=False)
    assert [z for _, z in seen] == [True, False]
    assert torch.equal(seen[0][0], inputs.actions) and torch.equal(seen[1][0], out.decision.actions)
    assert out.decision.frames is None and "decision_frames" not in out.reference()


def _sections(pipe, inputs, **kw):
    timer = SectionTimer(pipe.device)
    with timer.attached():
        out = pipe.run_iteration(inputs, progress=False, **kw)
    return out, timer.table()


def test_cfg_doubles_the_forwards(pipe, inputs):
    steps = pipe.preset.default_steps
    one, t1 = _sections(pipe, inputs)
    two, t2 = _sections(pipe, inputs, guidance_scale=2.0)
    count = lambda t: int(t.loc[t["section"] == "UNet_Forward", "count"].sum())  # noqa: E731
    assert count(t1) == 2 * steps and count(t2) == 4 * steps
    assert one.forwards_per_step == 1 and two.forwards_per_step == 2
    assert not torch.equal(one.world.latents, two.world.latents)


def test_section_table_accounting(pipe, inputs, tmp_path):
    out, t = _sections(pipe, inputs, save_dir=tmp_path)
    rows = t.set_index("path")
    for path, r in rows.iterrows():
        kids = rows[rows["parent"] == path]
        if len(kids):  # self + children == total (self is clamped at 0, so allow event resolution)
            assert r["self_ms"] + kids["total_ms"].sum() == pytest.approx(r["total_ms"], rel=1e-6, abs=1e-3), path
    it = rows.loc["WMA_Interaction_Iteration"]
    phases = ["1_Conditioning_Prep", "2_Decision_Pass", "3_World_Model_Pass", "4_Save_Results"]
    total = sum(rows.loc[f"WMA_Interaction_Iteration/{ph}", "total_ms"] for ph in phases)
    assert total == pytest.approx(it["total_ms"], rel=0.02)
    step = rows.loc["WMA_Interaction_Iteration/2_Decision_Pass/2.1_DDIM_Sampling/DDIM_Step_*"]
    assert step["count"] == pipe.preset.default_steps
    frames = rows.loc["WMA_Interaction_Iteration/3_World_Model_Pass/3.2_Decode_First_Stage/VAE_Decode_Frame_*"]
    assert frames["count"] == pipe.preset.frames
    assert {"decision", "world_model", "actions_states"} <= set(out.paths)
    saved = np.load(out.paths["actions_states"])["actions"]
    assert saved.shape == (1, pipe.preset.horizon, pipe.preset.agent_action_dim)


def test_label_hierarchy_in_trace(pipe, inputs, tmp_path):
    res = profile(lambda: pipe.run_iteration(inputs, progress=False, save_dir=tmp_path / "out"), wait=0, warmup=0,
                  active=1, out_dir=tmp_path, name="wma", activities=["cpu"])
    with gzip.open(res.trace_path, "rt") as f:
        names = {e.get("name") for e in json.load(f)["traceEvents"]}
    for want in ["WMA_Interaction_Iteration", "1_Conditioning_Prep", "1.1_Image_Embedding",
                 "1.2_VAE_Encode_Observation", "VAE_Encode_Frame_1", "1.3_Text_Embedding", "1.4_State_Action_Embedding",
                 "2_Decision_Pass", "2.1_DDIM_Sampling", "DDIM_Step_0_t999", "DDIM_Step_2_t332", "UNet_Forward",
                 "DDIM_Update", "2.2_Decode_First_Stage", "VAE_Decode_Frame_0", "VAE_Decode_Frame_3",
                 "3_World_Model_Pass", "3.0_Action_Embedding", "3.1_DDIM_Sampling", "3.2_Decode_First_Stage",
                 "4_Save_Results"]:
        assert want in names, want
    df = label_table(res.trace_path).set_index("label")
    assert df.loc["2.1_DDIM_Sampling", "parent"] == "2_Decision_Pass"
    assert df.loc["3.1_DDIM_Sampling", "parent"] == "3_World_Model_Pass"
    assert re.match(r"DDIM_Step_\d+_t\d+$", df.loc["UNet_Forward", "parent"])
    assert df.loc["1_Conditioning_Prep", "parent"] == "WMA_Interaction_Iteration"


# --- parameters ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("kw,match", [
    ({"ddim_steps": 0}, "ddim_steps=0.*allowed values"),
    ({"ddim_steps": 1001}, "ddim_steps=1001"),
    ({"ddim_steps": 2.5}, "ddim_steps=2.5"),
    ({"guidance_scale": 0.5}, "guidance_scale=0.5.*allowed values"),
    ({"guidance_rescale": 1.5}, "guidance_rescale=1.5"),
    ({"eta": -1.0}, "eta=-1.0"),
    ({"eta": math.nan}, "eta=nan"),
    ({"decode_decision": "yes"}, "decode_decision='yes'"),
])
def test_bad_run_parameters_rejected_before_work(pipe, inputs, monkeypatch, kw, match):
    def boom(*a, **k):
        raise AssertionError("work started before the parameters were checked")

    monkeypatch.setattr(pipe, "condition", boom)
    with pytest.raises(ValueError, match=match):
        pipe.run_iteration(inputs, progress=False, **kw)


@pytest.mark.parametrize("kw,match", [
    ({"preset": "tiny"}, "preset='tiny'.*allowed values.*tiny-wma"),
    ({"preset": "wma", "device": "cpu"}, "needs a GPU"),
    ({"dtype": "int8"}, "dtype='int8'.*allowed values"),
    ({"vae_dtype": "fp64"}, "vae_dtype='fp64'"),
    ({"dtype": "fp16", "device": "cpu"}, "fp16"),
    ({"ddim_steps": -1}, "ddim_steps=-1"),
    ({"ddim_steps": 5000}, "ddim_steps=5000"),
    ({"guidance_scale": 0.0}, "guidance_scale=0.0"),
    ({"repeats": 0}, "repeats=0.*integer >= 1"),
    ({"warmup": -1}, "warmup=-1"),
    ({"profile": "yes"}, "profile='yes'"),
    ({"device": "tpu"}, "device='tpu'.*allowed values"),
    ({"num_blocks": 2}, r"num_blocks=2 applies to workload \['mg2'\] only; for workload 'wma' leave it at 0"),
])
def test_bad_notebook_parameters_rejected(kw, match):
    with pytest.raises(ValueError, match=match):
        baseline_study.validate(workload="wma", **kw)


def test_pipeline_rejects_a_causal_preset():
    with pytest.raises(ValueError, match="not a UnifoLM-WMA preset"):
        WMAInteractionPipeline("tiny", device="cpu")
    assert check_run_params(get_preset("wma")) == (50, 1.0, 0.7, 1.0)


# --- notebook-01 logic -----------------------------------------------------------------------------------


def test_baseline_wma_end_to_end(pipe, inputs, tmp_path):
    cfg = baseline_study.validate(workload="wma", device="cpu", warmup=0, repeats=2, output_dir=str(tmp_path))
    steps = cfg.options.ddim_steps
    assert cfg.preset.name == "tiny-wma" and steps == 3 and cfg.vae_dtype == torch.float32
    assert cfg.results_path.name == "results-tiny.csv" and cfg.results_path.parent.name == "results"
    res = baseline_study.run_benchmark(pipe, inputs, cfg, {"gemm_tflops": 1.0, "device_name": "cpu"})
    s = res.summary()
    assert s["iteration_s"].n == 2 and s["ddim_step_ms"].n == 2 * 2 * steps and s["iteration_s"].unit == "s"
    assert 0 < s["sampling_share"] < 1 and 0 < s["vae_decode_share"] < 1 and 0 < s["conditioning_share"] < 1
    assert s["unet_forward_over_floor"] > 1
    pt = res.phase_table()
    assert pt["share"].sum() == pytest.approx(1.0, abs=1e-6)
    assert len(res.step_table()) == 2 * steps
    assert res.sections["section"].str.contains("UNet_Forward").any()
    rows = baseline_study.result_rows(cfg, res)
    assert {r["workload"] for r in rows} == {"wma"} and {r["preset"] for r in rows} == {"tiny-wma"}
    assert {"iteration_s", "unet_forward_ms", "unet_floor_ms", "vae_decode_share"} <= {r["metric"] for r in rows}
    assert {r["unit"] for r in rows if r["metric"] == "iteration_s"} == {"s"}
    text = baseline_study.interpret(cfg, res)
    assert "floor" in text and "76 s per iteration" in text and "tiny-preset" in text
    mt = baseline_study.model_table(pipe, inputs, cfg)
    assert mt.loc["DDIM steps per pass", "value"] == 3
    out = cfg.workload.run_callable(pipe, inputs, cfg)()
    assert out.paths["world_model"].parent == tmp_path / "iteration" and out.ddim_steps == 3


def test_skip_unused_encode_and_constant_conditioning_change_nothing(pipe, inputs):
    """skip-unused-encode encodes only the kept observed frame yet leaves the generator where upstream's loop leaves
    it (the dropped frames' posterior draws are still taken); constant-conditioning encodes the text once per
    instruction. Two iterations of each equal the plain pipeline's bit for bit."""
    import copy

    from wmbook.variants.ladder import apply_stack

    wl = workloads.get("wma")
    images = inputs.observation_images
    assert images.shape[2] >= 2  # a dropped frame to skip
    skip, _ = apply_stack(pipe, wl, ["skip-unused-encode"], torch.device("cpu"))
    g1, g2 = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
    torch.testing.assert_close(skip.encode_observation(images, g2), pipe.encode_observation(images, g1), rtol=0, atol=0)
    assert torch.equal(g1.get_state(), g2.get_state())

    const, _ = apply_stack(pipe, wl, ["constant-conditioning"], torch.device("cpu"))
    calls = []
    text = const.text
    const.text = lambda prompts: calls.append(prompts) or text(prompts)
    want = copy.deepcopy(pipe).run_iteration(inputs, ddim_steps=2, progress=False)
    for p in (skip, const):
        for _ in range(2):
            got = p.run_iteration(inputs, ddim_steps=2, progress=False)
            assert torch.equal(got.world.frames, want.world.frames)
            assert torch.equal(got.decision.actions, want.decision.actions)
    assert len(calls) == 2  # the instruction and the empty prompt, once
    zero = torch.zeros(1, 3, *images.shape[-2:])
    assert const.embed_zero_image(zero) is const.embed_zero_image(zero)


def test_conditioning_cuda_graphs_wraps_the_encoders_and_changes_nothing(pipe, inputs):
    """conditioning-cuda-graphs puts the image tokens and the VAE encoder (up to the posterior's moments) behind
    GraphedCallables; the posterior sample stays eager, so the generator is drawn from as before. On a CPU the graphs
    run eagerly: two iterations equal the plain pipeline's bit for bit, and both callables are listed as graphed."""
    import copy

    from wmbook.graphs import GraphedCallable
    from wmbook.variants import REGISTRY
    from wmbook.variants.builtin.graphs import graphed_callables
    from wmbook.variants.registry import VariantContext

    wl = workloads.get("wma")
    assert REGISTRY["conditioning-cuda-graphs"].gpu_only
    want = copy.deepcopy(pipe).run_iteration(inputs, ddim_steps=2, progress=False)
    graphed = copy.deepcopy(pipe)
    ctx = VariantContext(workload=wl, device=torch.device("cpu"))
    REGISTRY["conditioning-cuda-graphs"].apply(graphed, ctx)
    assert isinstance(graphed.image_tokens, GraphedCallable) and isinstance(graphed.vae._encode, GraphedCallable)
    assert [g.name for g in graphed_callables(graphed)] == ["image tokens", "VAE encoder"]
    for _ in range(2):
        got = graphed.run_iteration(inputs, ddim_steps=2, progress=False)
        assert torch.equal(got.world.frames, want.world.frames)
        assert torch.equal(got.decision.actions, want.decision.actions)
    bad = copy.deepcopy(pipe)
    bad.vae = torch.nn.Identity()
    with pytest.raises(ValueError, match="conditioning-cuda-graphs needs"):
        REGISTRY["conditioning-cuda-graphs"].apply(bad, ctx)


def _apply_conditioning(pipe, names, device=torch.device("cpu"), backend="inductor"):
    p = copy.deepcopy(pipe)
    ctx = VariantContext(workload=workloads.get("wma"), device=device, compile_backend=backend)
    for n in names:
        REGISTRY[n].apply(p, ctx)
    return p, ctx


def _within_bf16(got, want, frames=False):
    """A precision change moves a deep network's output by more than one op's rounding: held to the bf16 budget of
    the relative L2 error (wmbook.check.PRECISION_BUDGET_REL_L2), as the ladder's gate holds its rows."""
    c = compare(got, want, dtype="bf16", frames=frames)
    assert c.nan_count == 0 and c.rel_l2 <= PRECISION_BUDGET_REL_L2["bf16"], c


def test_encoder_bf16_keeps_the_posterior_and_its_noise_in_fp32(pipe, inputs):
    """The encoder's weights are bf16, the moments fp32; the latent the iteration conditions on is the fp32 encoder's
    within the bf16 budget, and the posterior takes as many draws of the same size from the
    iteration's generator (its state after the encode is the fp32 pipeline's)."""
    cast, ctx = _apply_conditioning(pipe, ["vae-encoder-bf16"])
    assert all(p.dtype == torch.bfloat16 for p in cast.vae.encoder.parameters())
    assert cast.vae.quant_conv.weight.dtype == torch.float32 and "bf16" in ctx.notes["vae-encoder-bf16"]
    img = inputs.observation_images[:, :, -1]
    with torch.no_grad():
        want = pipe.vae._encode(img)
        got = cast.vae._encode(img.to(cast.vae.dtype))
    assert got.dtype == torch.float32
    with torch.no_grad():  # the posterior diffusers builds draws its noise in its parameters' dtype
        assert cast.vae.encode(img.to(cast.vae.dtype)).latent_dist.parameters.dtype == torch.float32
    _within_bf16(got, want)
    gen_a, gen_b = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    with torch.no_grad():
        a = pipe.encode_observation(inputs.observation_images, gen_a)
        b = cast.encode_observation(inputs.observation_images, gen_b)
    assert torch.equal(gen_a.get_state(), gen_b.get_state())  # as many draws, of the same size
    _within_bf16(b, a)


def test_encoder_bf16_frames_within_bf16_rounding_and_its_order(pipe, inputs):
    """A whole iteration with the encoder in bf16 gives the fp32 pipeline's frames within the bf16 budget; the variant
    refuses a second application and an encode already compiled or captured, naming what must come first."""
    cast, _ = _apply_conditioning(pipe, ["vae-encoder-bf16"])
    with torch.no_grad():
        want = copy.deepcopy(pipe).run_iteration(inputs, ddim_steps=2, progress=False).world.frames
        got = cast.run_iteration(inputs, ddim_steps=2, progress=False).world.frames
    _within_bf16(got, want, frames=True)
    ctx = VariantContext(workload=workloads.get("wma"), device=torch.device("cpu"))
    with pytest.raises(ValueError, match="vae-encoder-bf16 must come before conditioning-compile"):
        REGISTRY["vae-encoder-bf16"].apply(cast, ctx)
    graphed, _ = _apply_conditioning(pipe, ["conditioning-cuda-graphs"])
    with pytest.raises(ValueError, match="vae-encoder-bf16 must come before"):
        REGISTRY["vae-encoder-bf16"].apply(graphed, ctx)
    bad = copy.deepcopy(pipe)
    bad.vae = torch.nn.Identity()
    with pytest.raises(ValueError, match="vae-encoder-bf16 needs a diffusers SD VAE"):
        REGISTRY["vae-encoder-bf16"].apply(bad, ctx)


def test_conditioning_compile_equals_the_eager_iteration_and_refuses_after_graphs(pipe, inputs):
    """With the encoder in bf16 first and dynamo's `eager` backend (the graphs dynamo captures, run as captured:
    inductor's code generation for them is the GPU test's below), two iterations give the eager stack's frames and
    actions bit for bit; after conditioning-cuda-graphs the variant refuses,
    naming the order."""
    eager, _ = _apply_conditioning(pipe, ["vae-encoder-bf16"])
    compiled, ctx = _apply_conditioning(pipe, ["vae-encoder-bf16", "conditioning-compile"], backend="eager")
    assert "eager" in ctx.notes["conditioning-compile"]
    torch._dynamo.reset()
    with torch.no_grad():
        want = eager.run_iteration(inputs, ddim_steps=2, progress=False)
        for _ in range(2):
            got = compiled.run_iteration(inputs, ddim_steps=2, progress=False)
            assert torch.equal(got.world.frames, want.world.frames)
            assert torch.equal(got.decision.actions, want.decision.actions)
    graphed, _ = _apply_conditioning(pipe, ["conditioning-cuda-graphs"])
    with pytest.raises(ValueError, match="conditioning-compile must come before conditioning-cuda-graphs"):
        REGISTRY["conditioning-compile"].apply(graphed, VariantContext(workload=workloads.get("wma"),
                                                                       device=torch.device("cpu")))
    assert not isinstance(compiled.vae._encode, GraphedCallable)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (inductor's kernels, CUDA graphs)")
def test_conditioning_compiled_and_captured_on_the_gpu():
    """On a GPU, the bf16 stack's conditioning with the encoder in bf16, compiled by inductor and captured: the
    iteration's frames against the fp32 pipeline's, and against the same stack without the
    conditioning variants, within the bf16 budget."""
    dev = torch.device("cuda")
    ref = WMAInteractionPipeline("tiny-wma", device=dev, dtype="fp32", seed=0)
    inputs = ref.prepare(seed=3)
    base = ["bf16", "skip-unused-encode", "constant-conditioning"]
    with torch.no_grad():
        fp32 = ref.run_iteration(inputs, ddim_steps=2, progress=False).world.frames
        plain, _ = _apply_conditioning(ref, base + ["conditioning-cuda-graphs"], device=dev)
        new, _ = _apply_conditioning(
            ref, base + ["vae-encoder-bf16", "conditioning-compile", "conditioning-cuda-graphs"], device=dev)
        for _ in range(3):  # warm-up, capture, replay
            a = plain.run_iteration(inputs, ddim_steps=2, progress=False).world.frames
            b = new.run_iteration(inputs, ddim_steps=2, progress=False).world.frames
    for got in (a, b):
        _within_bf16(got, fp32, frames=True)
    _within_bf16(b, a, frames=True)
