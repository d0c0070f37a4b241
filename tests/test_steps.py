"""Step-count reduction (notebook 03): the solvers of both pipelines, their configuration against the reference
sampler, the defaults' outputs unchanged, and the notebook's parameters (tiny presets, CPU, seconds)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from wmbook.params import ParameterError
from wmbook.pipelines.causal import CausalStreamingPipeline, warped_timesteps
from wmbook.pipelines.ddim import WMAInteractionPipeline, video_scheduler
from wmbook.pipelines.solvers import FLOW_SOLVERS, WMA_SOLVERS, FlowStepper, video_solver
from wmbook.presets import get_preset


@pytest.fixture(scope="module")
def wma():
    pipe = WMAInteractionPipeline("tiny-wma", device="cpu", dtype="fp32")
    return pipe, pipe.prepare(seed=3)


@pytest.fixture(scope="module")
def mg2():
    pipe = CausalStreamingPipeline("tiny", device="cpu", dtype="fp32")
    return pipe, pipe.prepare(2, seed=3)


# --- the UNet world model ---------------------------------------------------------------------------------------


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # diffusers' np.array(tensor) under numpy 2
@pytest.mark.parametrize("solver", WMA_SOLVERS[1:])
@pytest.mark.parametrize("steps", [50, 30, 20, 16, 10, 5, 3, 1])
def test_diffusers_solvers_take_the_reference_timesteps_and_betas(solver, steps):
    """Configured like the reference DDIM: the same trailing timesteps at every count (so the heads step alike), the
    same alpha_bar table except the zero-terminal-SNR end (2^-24 instead of 0), the reference's last alpha_bar[0]."""
    p = get_preset("wma")
    ref = video_scheduler(p)
    ref.set_timesteps(steps)
    s = video_solver(p, solver)
    s.set_timesteps(steps)
    assert s.timesteps.tolist() == ref.timesteps.tolist()
    ac, rac = s.alphas_cumprod.double().numpy(), ref.alphas_cumprod.double().numpy()
    np.testing.assert_array_equal(ac[:-1], rac[:-1])
    assert rac[-1] == 0 and ac[-1] == 2.0**-24  # finite log-SNR at t=999: no NaN
    assert s.config.prediction_type == "v_prediction" and s.config.solver_order == 2
    # the last step ends at alpha_bar[0], as the reference's (set_alpha_to_one=False)
    last = float(s.sigmas[-1])
    assert last**2 == pytest.approx((1 - rac[0]) / rac[0], rel=1e-5)


def test_wma_defaults_unchanged_by_the_new_keywords(wma):
    """The explicit reference settings give the default's outputs bit for bit."""
    pipe, inputs = wma
    n = pipe.preset.default_steps
    a = pipe.run_iteration(inputs, progress=False).reference()
    b = pipe.run_iteration(inputs, progress=False, solver="ddim", decision_steps=n, world_steps=n,
                           ddim_steps=n).reference()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("solver", WMA_SOLVERS)
def test_every_wma_solver_runs_finite_with_separate_pass_steps(wma, solver):
    pipe, inputs = wma
    out = pipe.run_iteration(inputs, progress=False, solver=solver, decision_steps=2, world_steps=4)
    ref = out.reference()
    assert all(torch.isfinite(t).all() for t in ref.values())
    assert len(out.decision.step_ms) == 2 and len(out.world.step_ms) == 4
    assert out.unet_forwards == 6 and out.world.solver == solver
    assert out.world.timesteps == [999, 749, 499, 249] and out.decision.timesteps == [999, 499]


def test_wma_solvers_one_step_from_zero_terminal_snr(wma):
    """One step from t=999 (alpha_bar 0 in the reference): the multistep solvers start from 2^-24, finite."""
    pipe, inputs = wma
    for s in WMA_SOLVERS:
        out = pipe.run_iteration(inputs, progress=False, solver=s, ddim_steps=1, decode_decision=False)
        assert torch.isfinite(out.world.latents).all() and torch.isfinite(out.decision.actions).all()


def test_wma_heads_step_identically_under_every_solver(wma):
    """The heads keep their own DDIM at the same timesteps: the decision pass's actions do not depend on the
    video solver in a pass's first step (same noise, same forward)."""
    pipe, inputs = wma
    acts = [pipe.run_iteration(inputs, progress=False, solver=s, ddim_steps=1, decode_decision=False).decision.actions
            for s in WMA_SOLVERS]
    assert all(torch.equal(acts[0], a) for a in acts[1:])


@pytest.mark.parametrize("kw, match", [
    ({"solver": "euler"}, r"solver='euler' is not allowed; allowed values: \['ddim', 'dpmsolver\+\+', 'unipc'\]"),
    ({"decision_steps": 0}, r"decision_steps=0 is not allowed; allowed values: an integer in \[1, 1000\]"),
    ({"world_steps": 2.5}, r"world_steps=2.5 is not allowed"),
    ({"world_steps": True}, r"world_steps=True is not allowed"),
])
def test_wma_bad_sampling_keywords_rejected_before_work(wma, monkeypatch, kw, match):
    pipe, inputs = wma
    monkeypatch.setattr(pipe, "condition", lambda *a, **k: pytest.fail("work started"))
    with pytest.raises(ValueError, match=match):
        pipe.run_iteration(inputs, progress=False, **kw)


# --- the causal DiT ---------------------------------------------------------------------------------------------


def test_mg2_defaults_unchanged_by_the_new_keywords(mg2):
    pipe, inputs = mg2
    p = pipe.preset
    a = pipe.generate(inputs, progress=False)
    b = pipe.generate(inputs, progress=False, denoising_steps=list(p.denoising_steps), shift=p.shift,
                      solver="renoise")
    assert torch.equal(a.frames, b.frames) and torch.equal(a.latents, b.latents)


def test_renoise_is_diffusers_stochastic_flow_euler():
    """The reference's re-noising step is what diffusers' FlowMatchEulerDiscreteScheduler computes with
    stochastic_sampling=True (same sigmas, same noise)."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    ts = warped_timesteps([1000, 666, 333], 5.0)
    s = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=1.0, stochastic_sampling=True)
    s.set_timesteps(sigmas=[t / 1000 for t in ts])
    x = torch.randn(1, 16, 3, 4, 4, generator=torch.Generator().manual_seed(0))
    x0 = torch.randn(x.shape, generator=torch.Generator().manual_seed(1))
    flow = (x - x0) / s.sigmas[0]
    got = s.step(flow, s.timesteps[0], x, generator=torch.Generator().manual_seed(2)).prev_sample
    eps = torch.randn(x.shape, generator=torch.Generator().manual_seed(2))
    sigma = ts[1] / 1000.0
    torch.testing.assert_close(got, (1 - sigma) * x0 + sigma * eps, rtol=1e-5, atol=1e-5)


def test_flow_steppers_on_the_warped_timesteps():
    ts = warped_timesteps([1000, 750, 500, 250], 5.0)
    for solver in FLOW_SOLVERS[1:]:
        st = FlowStepper(solver, ts)
        np.testing.assert_allclose(st.sched.sigmas[:-1].numpy(), np.array(ts) / 1000, atol=2e-6)
        assert float(st.sched.sigmas[-1]) == 0.0
    # Euler with the model's x0: x0 + s_next / s (x - x0)
    st = FlowStepper("euler", ts)
    x = torch.randn(1, 16, 3, 4, 4, generator=torch.Generator().manual_seed(0))
    x0 = torch.randn(x.shape, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(st.next(0, x, x0), x0 + ts[1] / ts[0] * (x - x0), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("solver", FLOW_SOLVERS)
@pytest.mark.parametrize("steps, shift", [((1000, 750, 500, 250), None), ((1000, 500), 3.0), ((1000,), 8.0)])
def test_every_flow_solver_runs_finite(mg2, solver, steps, shift):
    pipe, inputs = mg2
    out = pipe.generate(inputs, progress=False, solver=solver, denoising_steps=steps, shift=shift)
    assert torch.isfinite(out.frames).all() and torch.isfinite(out.latents).all()
    assert all(len(f) == len(steps) + 1 for f in out.forward_ms)


def test_one_step_is_the_same_forward_for_every_flow_solver(mg2):
    pipe, inputs = mg2
    outs = [pipe.generate(inputs, progress=False, solver=s, denoising_steps=[1000], decode=False).latents
            for s in FLOW_SOLVERS]
    assert all(torch.equal(outs[0], o) for o in outs[1:])


@pytest.mark.parametrize("kw, match", [
    ({"solver": "dpmsolver++"},
     r"solver='dpmsolver\+\+' is not allowed; allowed values: \['renoise', 'euler', 'unipc'\]"),
    ({"denoising_steps": [500, 1000]}, r"denoising_steps=\[500, 1000\] is not allowed; allowed values: a non-empty, "
                                        r"strictly decreasing"),
    ({"denoising_steps": []}, r"denoising_steps=\[\] is not allowed"),
    ({"denoising_steps": "1000"}, r"denoising_steps='1000' is not allowed"),
    ({"denoising_steps": [1001]}, r"denoising_steps=\[1001\] is not allowed"),
    ({"shift": 0}, r"shift=0 is not allowed; allowed values: a finite number > 0"),
])
def test_mg2_bad_sampling_keywords_rejected_before_work(mg2, monkeypatch, kw, match):
    pipe, inputs = mg2
    monkeypatch.setattr(pipe, "init_cache", lambda *a, **k: pytest.fail("work started"))
    with pytest.raises(ValueError, match=match):
        pipe.generate(inputs, progress=False, **kw)


# --- notebook 03's parameters and study --------------------------------------------------------------------------


@pytest.mark.parametrize("kw, match", [
    ({"workload": "wma", "solvers": "ddim,euler"}, r"solvers='ddim,euler' is not allowed for workload 'wma'"),
    ({"workload": "mg2", "solvers": "ddim"}, r"allowed values: 'auto' or a comma-separated subset of \['renoise'"),
    ({"workload": "wma", "sampling_steps": "50,0"}, r"sampling_steps=0 is not allowed"),
    ({"workload": "wma", "sampling_steps": "a,b"}, r"sampling_steps='a,b' is not allowed"),
    ({"workload": "wma", "sampling_steps": 2.5}, r"sampling_steps=2.5 is not allowed"),
    ({"workload": "mg2", "sampling_steps": 1000},
     r"sampling_steps=1000 is not allowed; allowed values: 'auto' or step lists"),
    ({"workload": "mg2", "sampling_steps": "1000,500;500,1000"}, r"sampling_steps=.* is not allowed"),
    ({"workload": "wma", "shifts": "3"}, r"shifts='3' is not allowed for this workload"),
    ({"workload": "mg2", "shifts": "-1"}, r"shifts=-1.0 is not allowed|shifts='-1' is not allowed"),
    ({"workload": "mg2", "eta": 0.0}, r"eta=0.0 is not allowed for this workload"),
    ({"workload": "wma", "eta": 2}, r"eta=2 is not allowed; allowed values: 'auto' or a number in \[0, 1\]"),
    ({"workload": "wma", "blocks": 2}, r"blocks=2 applies to streaming workloads only"),
    ({"workload": "mg2", "quality_budget_db": -1}, r"quality_budget_db=-1 is not allowed"),
    ({"workload": "mg2", "base": "no-such-variant"}, r"no-such-variant"),
    ({"workload": "mg2", "split": True}, r"unknown parameter\(s\) \['split'\]"),
])
def test_notebook_03_bad_parameters_rejected(kw, match):
    from wmbook.studies import steps

    with pytest.raises(ParameterError, match=match):
        steps.validate(device="cpu", **kw)


def test_notebook_03_points():
    from wmbook.studies import steps

    cfg = steps.validate(workload="wma", preset="tiny-wma", device="cpu")
    pts = steps.points(cfg)
    assert pts[0].label == "ddim 3+3" and len(pts) == len(set(pts))
    assert {p.group for p in pts} == {"ddim", "dpmsolver++", "unipc", "ddim, decision pass only",
                                      "ddim, world-model pass only"}
    cfg = steps.validate(workload="mg2", preset="tiny", device="cpu", solvers="renoise,euler", shifts="none",
                         sampling_steps="1000,500;1000")
    assert [p.label for p in steps.points(cfg)] == [
        "renoise [1000,666,333] shift 5", "renoise [1000,500] shift 5", "renoise [1000] shift 5",
        "euler [1000,500] shift 5", "euler [1000] shift 5"]
    ax = steps.axis(cfg)
    assert ax.kwargs(steps.points(cfg)[1]) == {"solver": "renoise", "denoising_steps": (1000, 500), "shift": 5.0}
    # scalars as the command line's YAML gives them (`-p steps 2`, `-p shifts 3`)
    cfg = steps.validate(workload="wma", preset="tiny-wma", device="cpu", solvers="ddim", sampling_steps=2,
                         split_passes=False)
    assert [p.label for p in steps.points(cfg)] == ["ddim 3+3", "ddim 2+2"]
    cfg = steps.validate(workload="mg2", preset="tiny", device="cpu", solvers="renoise", shifts=3,
                         sampling_steps="1000,500")
    assert [p.label for p in steps.points(cfg)] == ["renoise [1000,666,333] shift 5", "renoise [1000,500] shift 5",
                                                    "renoise [1000,500] shift 3"]


def test_wma_default_grid_adds_a_trained_presets_shipped_count():
    """The wma grid is DDIM 50/30/20/16/10/5 (20/10/5 for the multistep solvers); a trained preset's shipped count
    (a world preset's sample_steps, e.g. 2) joins every curve and each pass alone, so the sweep shows where its
    weights ship; a preset without one (wma) keeps the grid."""
    from wmbook.pipelines.solvers import UNetStepAxis
    from wmbook.presets import ALL_PRESETS

    ax = UNetStepAxis()
    assert ax.default_counts(ALL_PRESETS["wma"], "ddim") == [50, 30, 20, 16, 10, 5]
    assert ax.default_counts(ALL_PRESETS["wma"], "unipc") == [20, 10, 5]
    assert ALL_PRESETS["world-wma"].sample_steps == 5  # already on both grids: they stay as they are
    assert ax.default_counts(ALL_PRESETS["world-wma"], "ddim") == [50, 30, 20, 16, 10, 5]
    world = dataclasses.replace(ALL_PRESETS["world-wma"], sample_steps=2)  # a count off the grid joins it
    assert ax.default_counts(world, "ddim") == [50, 30, 20, 16, 10, 5, 2]
    assert ax.default_counts(world, "dpmsolver++") == [20, 10, 5, 2]
    labels = [p.label for p in ax.points(world, ("ddim",), None, None, split=True)]
    assert {"ddim 2+2", "ddim 2+50", "ddim 50+2"} <= set(labels) and len(labels) == len(set(labels))


def test_sweep_rounds_run_the_points_in_a_seeded_shuffle_after_the_first():
    """Round 0 runs the points as listed; each later round a shuffle of them, the same for the same seed and round,
    so that a point's place in the round shows as spread, not as a bias."""
    from wmbook.studies.steps import round_order

    assert round_order(20, 0, seed=3) == list(range(20))
    later = [round_order(20, rep, seed=3) for rep in (1, 2)]
    assert all(sorted(o) == list(range(20)) for o in later)
    assert later[0] != list(range(20)) and later[0] != later[1]
    assert later[0] == round_order(20, 1, seed=3) and later[0] != round_order(20, 1, seed=4)


def test_notebook_03_study_without_ground_truth(tmp_path, monkeypatch):
    """Tiny presets have random weights: the quality section skips with the reason (whether or not wmbook.world.eval
    exists yet), the knee uses the deviation budget, rows carry the sampling keywords."""
    import json

    from wmbook import results
    from wmbook.studies import steps

    cfg = steps.validate(workload="wma", preset="tiny-wma", device="cpu", solvers="ddim,unipc", sampling_steps="3,1",
                         split_passes=False, warmup=0, repeats=2, deviation_budget_db=0.0,
                         results_path=str(tmp_path / "r.csv"))
    pipe, inputs = steps.build(cfg)
    sw = steps.run_sweep(cfg, pipe, inputs, progress=False)
    note = steps.quality(cfg, pipe, sw, progress=False)
    assert note.startswith("Quality against ground truth skipped:") and not sw.has_quality
    tab = steps.table(sw)
    assert tab.loc[0, "psnr vs full (dB)"] == np.inf and tab.loc[0, "speedup"] == 1.0
    assert (tab["forwards"] == [6, 2, 6, 2]).all() and tab["actions rel-L2 vs full"].notna().all()
    kt = steps.knee_table(sw).set_index("curve")
    assert kt.loc["ddim", "knee"] == "ddim 1+1" and kt.loc["unipc", "knee"] == "unipc 1+1"  # budget 0 dB: any point
    rows = steps.result_rows(sw)
    results.append(rows, cfg.results_path)
    df = results.read(cfg.results_path)
    assert {"iteration_s", "speedup_vs_full", "psnr_vs_full", "action_rel_l2_vs_full", "knee_speedup"} <= set(df.metric)
    it = df[(df.metric == "iteration_s") & (df.variant == "steps:unipc 1+1")].iloc[0]
    assert it["n"] == 2 and it["p20"] <= it["value"] <= it["p80"]
    assert json.loads(it["params"])["sampling"] == {"solver": "unipc", "decision_steps": 1, "world_steps": 1}
    assert "solver error" in steps.interpret(sw)
    # equal work (same forwards, same steps per pass: ddim 3+3 and unipc 3+3) should take equal time; how far it does
    # not is said as the run's timing noise
    from wmbook.bench import Samples

    measured = [r.metric for r in sw.results]
    for r in sw.results:
        r.metric = Samples([1.0, 1.0], "s")
    assert steps.equal_work_spread(sw)["ratio"] == 1.0 and "Timing noise" not in steps.interpret(sw)
    sw.results[2].metric = Samples([1.5, 1.5], "s")  # unipc 3+3 half again as slow as ddim 3+3
    eq = steps.equal_work_spread(sw)
    assert eq["ratio"] == pytest.approx(1.5) and eq["forwards"] == 6
    assert eq["fast"][0] == "ddim 3+3" and eq["slow"][0] == "unipc 3+3"
    assert "1.50x apart" in steps.interpret(sw)
    for r, m in zip(sw.results, measured):
        r.metric = m
    knee = steps.stored_knee("wma", "tiny-wma", path=cfg.results_path)
    assert knee["sampling"] == {"solver": "ddim", "decision_steps": 1, "world_steps": 1} and knee["speedup"] > 0
    assert steps.stored_knee("wma", "tiny-wma", curve="nope", path=cfg.results_path) is None
    steps.plot_frontier(sw)
    # against notebook 01's stored fp32 eager run of the same preset on the same GPU model (a GPU run's yardstick)
    assert steps._vs_fp32_eager(sw, "GPU X", path=cfg.results_path) == []  # none stored: nothing said
    base = dict(notebook="01_baseline_profiling", workload="wma", preset="tiny-wma", variant="eager",
                metric="iteration_s", unit="s")
    full = sw.reference.metric.median
    results.append([results.make_row(**base, value=full * 4, params={"dtype": "fp32"}) | {"median": full * 4},
                    results.make_row(**base, value=full * 2, params={"dtype": "bf16"}) | {"median": full * 2}],
                   cfg.results_path)
    df = results.read(cfg.results_path)
    df.loc[df["notebook"] == "01_baseline_profiling", "device_name"] = "GPU X"
    df.to_csv(cfg.results_path, index=False)
    said = steps._vs_fp32_eager(sw, "GPU X", path=cfg.results_path)
    assert len(said) == 1 and f"`{sw.reference.point.label}` 4.0x" in said[0], said  # the fp32 row, not the bf16 one
    assert steps._vs_fp32_eager(sw, "GPU Y", path=cfg.results_path) == []  # another GPU model: not comparable

    # a world preset with ground truth: the interface of wmbook.world.eval, faked
    import sys
    import types

    fake = types.ModuleType("wmbook.world.eval")
    fake.is_world_preset = lambda name: True
    fake.heldout_case = lambda wl, pipe, seed: types.SimpleNamespace(seed=seed)
    fake.copy_last = lambda case: "copy"
    fake.predict = lambda wl, pipe, case, **kw: kw["decision_steps"] + kw["world_steps"]
    fake.score = lambda pred, case: {"psnr": 20.0 if pred == "copy" else 30.0 - 6 / pred, "ssim": 0.5,
                                     "agent_err_px": 1.0}
    monkeypatch.setitem(sys.modules, "wmbook.world.eval", fake)
    import wmbook.world as world_pkg

    monkeypatch.setattr(world_pkg, "eval", fake, raising=False)
    cfg2 = cfg.replace(options=dict(cfg.options) | {"quality_budget_db": 2.5})
    sw.cfg = cfg2
    steps.quality(cfg2, pipe, sw, progress=False)
    assert sw.has_quality and sw.copy_last["psnr"] == 20.0
    kt = steps.knee_table(sw).set_index("curve")  # 6 forwards: 29 dB; 2 forwards: 27 dB (loss 2 dB <= 2.5)
    assert (kt.loc["ddim", "knee"] == "ddim 1+1"
            and kt.loc["ddim", "PSNR change vs full steps (dB)"] == pytest.approx(-2.0))
    assert "psnr_gt" in {r["metric"] for r in steps.result_rows(sw)}
    assert sw.weights_sha256 is None and "weights_sha256" not in results.params_of(steps.result_rows(sw)[0])
    assert "The weights ship at" not in steps.interpret(sw)  # tiny-wma has no shipped count
    # the full-step run and the copy-last baseline on every quality metric (SSIM and the agent too, not PSNR alone)
    assert ("The full-step run scores 29.00 dB PSNR, SSIM 0.500, agent error 1.0 px against the truth (copying the "
            "last frame: 20.00 dB PSNR, SSIM 0.500, agent error 1.0 px).") in steps.interpret(sw)
    # a trained preset shipped at 1 step a pass (the fields tiny-wma has, and world-wma's sample_steps)
    sw.cfg = cfg2.replace(preset=types.SimpleNamespace(**vars(cfg2.preset), sample_steps=1))
    ship = next(x for x in steps.interpret(sw).split("\n\n") if x.startswith("The weights ship at"))
    assert ship.startswith("The weights ship at `ddim 1+1` (`sample_steps` 1") and "x the full-step run's speed" in ship
    sw.cfg = cfg2
    sw.weights_sha256 = "ab" * 32  # a world preset's weights file: every row says which
    assert {results.params_of(r)["weights_sha256"] for r in steps.result_rows(sw)} == {"ab" * 32}
    sw.cfg = cfg2.replace(options=dict(cfg2.options) | {"agent_budget_px": 0.5})  # the agent error counts too
    fake.score = lambda pred, case: {"psnr": 29.0, "ssim": 0.5, "agent_err_px": 1.0 if pred in ("copy", 6) else 2.0}
    steps.quality(sw.cfg, pipe, sw, progress=False)
    assert steps.knee_table(sw).set_index("curve").loc["ddim", "knee"] == "ddim 3+3"
    steps.plot_frontier(sw)


def test_world_preset_without_weights_is_refused_at_validation(tmp_path, monkeypatch):
    """A notebook given a trained world preset whose weights are missing stops at validation, naming the file and
    the training command (not later, inside a pipeline build)."""
    from types import SimpleNamespace

    from wmbook import workloads
    from wmbook.params import ParameterError
    from wmbook.presets import ALL_PRESETS
    from wmbook.world import weights

    monkeypatch.setattr(weights, "WEIGHTS_DIR", tmp_path)
    for wl_name, preset in (("mg2", "world-mg2"), ("wma", "world-wma")):
        cfg = SimpleNamespace(preset=ALL_PRESETS[preset])
        with pytest.raises(ParameterError, match=f"preset='{preset}'.*python -m wmbook.train --workload {wl_name}"):
            workloads.get(wl_name).check_config(cfg)
        weights.weights_path(preset).write_bytes(b"")
        workloads.get(wl_name).check_config(cfg)  # present: no error here (the loader checks the content)
    workloads.get("mg2").check_config(SimpleNamespace(preset=ALL_PRESETS["tiny"]))  # other presets: nothing to check


def test_weights_note_says_when_quality_rows_are_not_of_the_shipped_weights():
    """A world preset's notebook-03 rows record the SHA-256 of the weights they scored; the published block and the
    index say so when that is not the file shipped now, or when rows do not say; random-weight presets get no note.
    Every such row in the store records it (those from before the record were backfilled from git)."""
    import pandas as pd

    from wmbook import results
    from wmbook.presets import ALL_PRESETS
    from wmbook.studies.step_notes import weights_note
    from wmbook.world.weights import file_sha256, weights_path

    shipped = file_sha256(weights_path(ALL_PRESETS["world-wma"]))

    def rows(preset="world-wma", **params):
        return pd.DataFrame([results.make_row(notebook="03_step_reduction", workload="wma", preset=preset,
                                              variant="steps:ddim 2+2", metric=m, unit="dB", value=1.0, params=params)
                             for m in ("iteration_s", "psnr_gt")])

    assert weights_note(rows(weights_sha256=shipped)) == ""
    note = weights_note(rows(weights_sha256="ab" * 32))
    assert "sha256 abababababababab" in note and f"sha256 {shipped[:16]}" in note and "world-wma" in note
    assert weights_note(rows(weights_sha256="ab" * 32), short=True) == (
        "quality columns were scored on other weights (sha256 abababababababab), not the file shipped now")
    assert weights_note(rows(weights_sha256=shipped), short=True) == ""
    assert "do not say which weights" in weights_note(rows())  # no record
    mixed = pd.concat([rows(weights_sha256="ab" * 32), rows()])
    assert "(sha256 abababababababab); some rows do not say which" in weights_note(mixed)
    assert weights_note(rows(preset="wma")) == "" and weights_note(rows()[:1]) == ""  # random weights; no quality
    stored = results.read()
    world = stored[(stored["notebook"] == "03_step_reduction") & stored["preset"].isin(["world-mg2", "world-wma"])]
    assert len(world) and all(len(results.params_of(r).get("weights_sha256", "")) == 64 for _, r in world.iterrows())
