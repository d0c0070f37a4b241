"""Training the world models: the objective matches inference, the loss goes down, the loop resumes and ships
loadable weights."""

import json
from pathlib import Path

import pytest
import torch
from test_world import tiny_world_mg2, tiny_world_wma

from wmbook import workloads
from wmbook.train import TrainConfig, train
from wmbook.train.data import EpisodeBank
from wmbook.train.objectives import Mg2Objective, WMAObjective
from wmbook.world import eval as weval
from wmbook.world import weights as wweights


@pytest.fixture(scope="module")
def bank(one_thread):
    return EpisodeBank(0, 3, 40, progress=False)


def _pipe(wl):
    p = tiny_world_mg2() if wl == "mg2" else tiny_world_wma()
    return wweights.build_world_pipeline(workloads.get(wl), p, device="cpu", dtype="fp32", weights=False)


def test_teacher_forcing_equals_the_cached_block_loop(bank):
    """The masked forward on [clean blocks 0..j-1 | noisy block j] gives block j the same flow as the pipeline's
    cached loop (cache-refresh passes at t=0 on the clean blocks, then the denoising forward), window included."""
    pipe = _pipe("mg2")
    obj = Mg2Objective(pipe, bank, blocks=3)
    g = torch.Generator().manual_seed(0)
    batch = obj.sample_batch(g, 1)
    z, cond, ctx = obj.encode(batch["frames"])
    k, j = obj.k, 2  # block 2: block 0 has left the 2-block window
    actions = {"keyboard": batch["keyboard"], "mouse": batch["mouse"]}
    noisy = 0.3 * z[:, :, j * k:(j + 1) * k] + 0.7 * torch.randn(z[:, :, :k].shape, generator=g)
    with torch.no_grad():
        cache = pipe.model.init_cache(1, pipe.device, torch.float32)
        for i in range(j):
            sl = slice(i * k, (i + 1) * k)
            pipe.model(z[:, :, sl], torch.zeros(1, k), ctx, cond_concat=cond[:, :, sl], actions=actions, cache=cache,
                       start_frame=i * k)
        sl = slice(j * k, (j + 1) * k)
        cached = pipe.model(noisy, torch.full((1, k), 700.0), ctx, cond_concat=cond[:, :, sl], actions=actions,
                            cache=cache, start_frame=j * k)
        tt = torch.zeros(1, (j + 1) * k)
        tt[:, j * k:] = 700.0
        full = pipe.model(torch.cat([z[:, :, :j * k], noisy], 2), tt, ctx, cond_concat=cond[:, :, :(j + 1) * k],
                          actions=actions, cache=None, start_frame=0)[:, :, j * k:]
    torch.testing.assert_close(full, cached, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("wl", ["mg2", "wma"])
def test_loss_goes_down_on_a_fixed_batch(bank, wl):
    torch.manual_seed(0)
    pipe = _pipe(wl)
    pipe.model.train().requires_grad_(True)
    obj = Mg2Objective(pipe, bank) if wl == "mg2" else WMAObjective(pipe, bank)
    batch = obj.sample_batch(torch.Generator().manual_seed(1), 2)
    opt = torch.optim.Adam(pipe.model.parameters(), lr=3e-3)
    losses = []
    for _ in range(10):
        g = torch.Generator().manual_seed(2)  # the same noise and timesteps every step
        kw = {"j": 1} if wl == "mg2" else {"decision": torch.tensor([True, False])}
        loss, parts = obj.loss(batch, g, **kw)
        assert all(torch.isfinite(v) for v in parts.values())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    assert all(map(lambda v: v == v, losses))
    assert losses[-1] < 0.85 * losses[0], losses


def test_train_resumes_and_ships_strict_weights(bank, tmp_path):
    out = tmp_path / "w.pt"
    kw = dict(workload="mg2", preset=tiny_world_mg2(), out=out, batch=1, ckpt_every=2, log_every=1, eval_cases=1,
              ckpt=tmp_path / "w.ckpt", progress=False, warmup=1,
              episodes=3, episode_frames=40)
    meta = train(TrainConfig(steps=2, **kw), bank=bank)
    assert meta["steps"] == 2 and (tmp_path / "w.ckpt").is_file()
    ck = torch.load(tmp_path / "w.ckpt", weights_only=True)
    ck["rows"][0]["loss"] = 123.0  # a mark only a resumed run carries on
    torch.save(ck, tmp_path / "w.ckpt")
    meta = train(TrainConfig(steps=4, **kw), bank=bank)  # resumes at step 2
    assert meta["steps"] == 4
    assert (tmp_path / "w.loss.csv").read_text().splitlines()[1].startswith("1,123.0,")
    rows = (tmp_path / "w.loss.csv").read_text().splitlines()
    assert rows[0].startswith("step,loss") and [r.split(",")[0] for r in rows[1:]] == ["1", "2", "3", "4"]
    saved = json.loads((tmp_path / "w.pt.json").read_text())
    assert saved["data_seed"] == 0 and saved["preset"] == "world-mg2-test" and "git_commit" in saved
    assert set(saved["eval"]) == {"heldout_seeds", "model", "copy_last"}
    assert out.stat().st_size < 20 * 2**20
    pipe = wweights.build_world_pipeline(workloads.get("mg2"), tiny_world_mg2(), device="cpu", dtype="fp32",
                                         weights=out)
    assert not pipe.model.training
    with pytest.raises(ValueError, match="was made with"):
        train(TrainConfig(steps=5, **{**kw, "batch": 2}), bank=bank)
    ck = torch.load(tmp_path / "w.ckpt", weights_only=True)
    ck["model"]["extra.weight"] = torch.zeros(1)  # a checkpoint of another architecture of the same preset name
    torch.save(ck, tmp_path / "w.ckpt")
    with pytest.raises(ValueError, match=r"other weights than the model .*unexpected: \['extra.weight'\]"):
        train(TrainConfig(steps=5, **kw), bank=bank)


@pytest.mark.parametrize("kw, name", [({"workload": "motion"}, "workload="), ({"preset": "tiny"}, "preset="),
                                      ({"steps": None, "minutes": None}, "minutes="), ({"steps": 0}, "steps="),
                                      ({"batch": 0}, "batch="), ({"out": "w.bin"}, "out="), ({"lr": -1.0}, "lr="),
                                      ({"data_seed": 1000}, "data_seed="), ({"minutes": -2.0}, "minutes="),
                                      ({"episode_frames": 20}, "episode_frames=")])
def test_bad_config_is_refused_before_work(kw, name):
    base = dict(workload="mg2", preset="world-mg2", out="w.pt", steps=1)
    with pytest.raises(ValueError, match=name):
        TrainConfig(**{**base, **kw}).check()


def test_cli_refuses_bad_arguments(capsys):
    from wmbook.train.__main__ import main

    assert main(["--workload", "wma", "--preset", "world-mg2", "--steps", "1"]) == 2
    assert "preset=" in capsys.readouterr().err


def test_rendering_workers_give_the_same_bank():
    a = EpisodeBank(1, 3, 12, workers=2, progress=False)
    b = EpisodeBank(1, 3, 12, workers=1, progress=False)
    assert torch.equal(a.frames, b.frames) and torch.equal(a.action, b.action)
    assert not torch.equal(a.frames, EpisodeBank(2, 3, 12, progress=False).frames)


# --- oracles: one stub that returns the exact target under the preset's convention must give zero training loss AND
# make the sampler reproduce the ground truth (catches any objective / sampler / eval convention mismatch) ----------


class _Mg2Oracle(torch.nn.Module):
    """Knows the clean latents z of the whole clip; answers like a perfect model of `prediction` ("x0" | "flow")."""

    def __init__(self, z, prediction):
        super().__init__()
        self.z, self.prediction = z, prediction

    def init_cache(self, *a, **k):
        return None

    def forward(self, x, t, context, *, cond_concat=None, actions=None, cache=None, start_frame=0):
        x0 = self.z[:, :, start_frame:start_frame + x.shape[2]].to(x.dtype)
        if self.prediction == "x0":
            return x0.clone()
        sigma = (t.float() / 1000.0).view(x.shape[0], 1, -1, 1, 1)
        return torch.where(sigma > 0, (x - x0) / sigma.clamp(min=1e-12), torch.zeros_like(x))


def _mg2_pipe(prediction):
    p = tiny_world_mg2().with_(prediction=prediction)
    return wweights.build_world_pipeline(workloads.get("mg2"), p, device="cpu", dtype="fp32", weights=False)


@pytest.mark.parametrize("prediction", ["x0", "flow"])
def test_mg2_oracle_has_zero_loss(bank, prediction):
    pipe = _mg2_pipe(prediction)
    obj = Mg2Objective(pipe, bank)
    g = torch.Generator().manual_seed(0)
    batch = obj.sample_batch(g, 3)
    z, _, _ = obj.encode(batch["frames"])
    obj.model = _Mg2Oracle(z, prediction)
    for j in range(obj.blocks):
        loss, parts = obj.loss(batch, g, j=j)
        assert float(loss) < 1e-8, (j, parts)


@pytest.mark.parametrize("prediction", ["x0", "flow"])
@pytest.mark.parametrize("solver", ["renoise", "euler", "unipc"])
def test_mg2_oracle_makes_the_pipeline_reproduce_the_heldout_frames(prediction, solver, one_thread):
    """The same oracle through generate() + eval.predict(): exact frames (PSNR capped at 100), agent found where it
    is; a convention mismatch (flow sign, sigma = t / 1000, x0 vs flow, block offsets, frame alignment) breaks it."""
    from wmbook.models.vae import normalize_latents, pixel_frames_for

    pipe = _mg2_pipe(prediction)
    p = pipe.preset
    case = weval.heldout_case(workloads.get("mg2"), pipe, 1)
    n = pixel_frames_for(case.num_blocks * p.num_frame_per_block, True)
    ep = weval.heldout_episode(1, case.start + n)
    video = torch.from_numpy(ep.frames[case.start:case.start + n]).permute(3, 0, 1, 2)[None].float() / 127.5 - 1
    z = normalize_latents(pipe.vae, pipe.vae.encode(video).latent_dist.mode())
    pipe.model = _Mg2Oracle(z, prediction)
    s = weval.score(weval.predict(workloads.get("mg2"), pipe, case, solver=solver), case)
    base = weval.score(weval.copy_last(case), case)
    assert s["psnr"] > 60 and s["ssim"] > 0.999 and s["agent_err_px"] < 0.5, s
    assert base["psnr"] < 40, base


class _WMAOracle(torch.nn.Module):
    """Knows the clean scaled latents x0 [B, C, T, h, w] of the future frames; answers the exact v at any t (with
    the preset's dynamic rescale), zero head outputs; embeddings from the real model."""

    def __init__(self, real, x0, alphas_cumprod, rescale, model_output="v"):
        super().__init__()
        self.real, self.x0, self.ab, self.rescale, self.model_output = real, x0, alphas_cumprod, rescale, model_output
        for name in ("embed_image", "embed_state", "embed_action", "build_context"):
            setattr(self, name, getattr(real, name))

    def forward(self, x, cond_latent, x_action, x_state, t, context, obs_images, obs_states, fs=None, actions=None):
        b = x.shape[0]
        ab = self.ab.to(x.device)[t].view(b, 1, 1, 1, 1).double()
        x0 = self.x0.double() * self.rescale.to(x.device)[t].view(b, 1, 1, 1, 1).double()
        if self.model_output == "x0":
            return x0.to(x.dtype), torch.zeros_like(x_action), torch.zeros_like(x_state)
        if self.model_output == "x0-residual":  # the change from the last observed frame (cond_latent)
            return (x0 - cond_latent.double()).to(x.dtype), torch.zeros_like(x_action), torch.zeros_like(x_state)
        v = (ab.sqrt() * x.double() - x0) / (1 - ab).sqrt()  # from x = sqrt(ab) x0 + sqrt(1 - ab) eps
        return v.to(x.dtype), torch.zeros_like(x_action), torch.zeros_like(x_state)


@pytest.mark.parametrize("model_output", ["x0-residual", "x0", "v"])
def test_wma_oracle_has_zero_video_loss(bank, model_output):
    torch.manual_seed(0)
    pipe = wweights.build_world_pipeline(workloads.get("wma"), tiny_world_wma().with_(model_output=model_output),
                                         device="cpu", dtype="fp32", weights=False)
    obj = WMAObjective(pipe, bank)
    g = torch.Generator().manual_seed(0)
    batch = obj.sample_batch(g, 4)
    video = EpisodeBank.to_video(batch["frames"])
    x0 = obj.encode_frames(video[:, :, pipe.preset.n_obs_steps:])
    obj.model = _WMAOracle(pipe.model, x0, obj.ab, obj.rescale, model_output)
    for _ in range(3):
        _, parts = obj.loss(batch, g)
        assert float(parts["v_mse"]) < 1e-8, parts


@pytest.mark.parametrize("model_output, rescale", [("x0-residual", False), ("x0", False), ("v", False), ("v", True)])
@pytest.mark.parametrize("solver, steps", [("ddim", 2), ("ddim", 10), ("dpmsolver++", 5), ("unipc", 5)])
def test_wma_oracle_makes_the_pipeline_reproduce_the_heldout_frames(solver, steps, model_output, rescale, one_thread):
    """The exact v through run_iteration(world_actions=...) + eval.predict(): the held-out frames up to the noise
    the reference's last DDIM step leaves (it ends on alpha_bar[0], not 1: about 42 dB), far above copy-last.
    With DynamiCrafter's dynamic rescale (the reference presets; the world preset has it off) DDIM ends on
    scale(t_last) x0, so only many steps come close (42.1 dB at 50 steps, 30.8 at 5 on world-wma, seed 0)."""
    from wmbook.models.wma.vae import encode_frame
    from wmbook.pipelines.ddim import dynamic_rescale

    p = tiny_world_wma().with_(use_dynamic_rescale=rescale, model_output=model_output)
    pipe = wweights.build_world_pipeline(workloads.get("wma"), p, device="cpu", dtype="fp32", weights=False)
    case = weval.heldout_case(workloads.get("wma"), pipe, 2)
    tgt = torch.from_numpy(case.target).permute(3, 0, 1, 2).float() / 127.5 - 1  # [3, T, H, W]
    x0 = torch.stack([encode_frame(pipe.vae, tgt[:, k][None], p.scale_factor) for k in range(p.frames)], 2)
    scale = torch.tensor([dynamic_rescale(p, t) if p.use_dynamic_rescale else 1.0
                          for t in range(p.num_train_timesteps)])
    pipe.model = _WMAOracle(pipe.model, x0, pipe.scheduler.alphas_cumprod, scale, model_output)
    s = weval.score(weval.predict(workloads.get("wma"), pipe, case, solver=solver, ddim_steps=steps), case)
    base = weval.score(weval.copy_last(case), case)
    if rescale:  # few steps end far from scale 1 (DPM-Solver++ / UniPC see an x0 whose scale moves with t)
        assert s["psnr"] < 38, s  # the rescale's contrast loss (documents why the world preset has it off)
    else:
        assert s["psnr"] > 38 and s["ssim"] > 0.97 and s["agent_err_px"] < 1.0, s
        assert base["psnr"] < s["psnr"] - 10, (s, base)


def test_world_presets_can_represent_their_targets():
    """A model that must output noise (flow, epsilon, v) needs at least as many channels as the numbers it takes in
    and outputs per token / position; world-mg2's 2x2 patch of 192-channel latents is 768 numbers from a 256-wide
    token, world-wma's 48 + 48 latent channels meet a 40-channel stem, so both predict x0 (a flow-predicting
    world-mg2 plateaued at loss 0.85, above the 2/3 of the noise it cannot pass)."""
    import math

    from wmbook.presets import ALL_PRESETS, WorldCausalPreset

    p = ALL_PRESETS["world-mg2"]
    assert isinstance(p, WorldCausalPreset)
    if p.prediction != "x0":
        assert p.dim >= math.prod(p.patch_size) * p.out_dim
    w = ALL_PRESETS["world-wma"]
    if w.model_output not in ("x0", "x0-residual"):
        assert w.model_channels >= w.in_channels
    assert w.use_dynamic_rescale is False


def test_world_prediction_conventions_are_checked():
    from wmbook.presets import ALL_PRESETS

    with pytest.raises(ValueError, match="prediction="):
        ALL_PRESETS["world-mg2"].with_(prediction="eps")
    with pytest.raises(ValueError,
                       match=r"model_output='eps' is not allowed; allowed values: \['x0-residual', 'x0', 'v'\]"):
        ALL_PRESETS["world-wma"].with_(model_output="eps")
    with pytest.raises(ValueError, match="use_dynamic_rescale=False"):
        ALL_PRESETS["world-wma"].with_(use_dynamic_rescale=True)
    assert ALL_PRESETS["world-wma"].with_(use_dynamic_rescale=True, model_output="x0").use_dynamic_rescale


def test_x0_residual_training_starts_at_copy_last(bank):
    """world-wma's x0-residual output: build_training zero-initialises the UNet's output conv, so the untrained model
    predicts the last observed frame for every future frame, through the whole DDIM sampler (copy-last's score)."""
    from wmbook.train.core import TrainConfig, build_training

    p = tiny_world_wma()
    assert p.model_output == "x0-residual"
    cfg = TrainConfig(workload="wma", preset=p, out=Path("unused.pt"), steps=1, device="cpu").check()
    pipe, _ = build_training(cfg, torch.device("cpu"), bank)
    pipe.model.eval().requires_grad_(False)
    case = weval.heldout_case(workloads.get("wma"), pipe, 1)
    s = weval.score(weval.predict(workloads.get("wma"), pipe, case, ddim_steps=10), case)
    base = weval.score(weval.copy_last(case), case)
    assert abs(s["psnr"] - base["psnr"]) < 0.5 and abs(s["ssim"] - base["ssim"]) < 0.02, (s, base)


def test_change_weights_favour_what_moves():
    """The optional change weighting (`--change-weight`): static positions weigh 1, a position that changes weighs
    more in proportion to its change, a sample with no change weighs 1 everywhere, strength 0 is the plain MSE."""
    from wmbook.train.objectives import change_weights

    prev = torch.zeros(2, 4, 3, 2, 2)
    x0 = prev.clone()
    x0[0, :, 1, 0, 0] = 2.0  # sample 0: one position of frame 1 changes; sample 1: nothing changes
    w = change_weights(x0, prev, 4.0)
    assert w.shape == (2, 1, 3, 2, 2)
    assert torch.allclose(w[1], torch.ones_like(w[1]))
    n = 3 * 2 * 2
    assert w[0, 0, 1, 0, 0].item() == pytest.approx(1 + 4.0 * n)  # d / mean(d) = n at the one changed position
    assert torch.equal(w[0].flatten().sort().values[:-1], torch.ones(n - 1))
    assert change_weights(x0, prev, 0.0) == 1.0


def test_agent_cells_find_the_agent_and_agent_weights_mark_its_old_and_new_place():
    """`--agent-weight`: agent_cells marks the latent cells under the agent's true centre (and a cell of margin, a few
    cells in all), nothing in a frame where the agent is hidden; agent_weights is 1 + strength where the agent is or
    was, 1 elsewhere; strength 0 is the plain MSE."""
    import numpy as np

    from wmbook.train.objectives import agent_cells, agent_weights
    from wmbook.world.env import render_episode

    ep = render_episode(5, 60)
    cells = agent_cells(torch.from_numpy(ep.frames)[None], 4)[0]  # [T, 16, 16]
    assert cells.shape == (60, 16, 16) and set(cells.unique().tolist()) <= {0.0, 1.0}
    seen = np.flatnonzero(ep.agent_visible >= 0.99)
    hidden = np.flatnonzero(ep.agent_visible == 0)
    assert len(seen) > 10
    for t in seen:
        x, y = ep.agent_xy[t]
        assert cells[t, int(y) // 4, int(x) // 4] == 1.0, t
        assert 4 <= cells[t].sum() <= 25, (t, cells[t].sum())  # the sprite's 2-3 cells a side plus the margin
    for t in hidden:
        assert cells[t].sum() == 0, t
    now, before = torch.zeros(1, 2, 4, 4), torch.zeros(1, 2, 4, 4)
    now[0, 1, 2, 2], before[0, 1, 0, 0] = 1.0, 1.0
    w = agent_weights(now, before, 9.0)
    assert w.shape == (1, 1, 2, 4, 4)
    assert w[0, 0, 1, 2, 2] == 10.0 and w[0, 0, 1, 0, 0] == 10.0 and w.sum() == 32 + 2 * 9.0
    assert agent_weights(now, before, 0.0) == 1.0


@pytest.mark.parametrize("wl", ["mg2", "wma"])
def test_change_weight_trains_and_is_checked(bank, tmp_path, wl):
    p = tiny_world_mg2() if wl == "mg2" else tiny_world_wma()
    cfg = TrainConfig(workload=wl, preset=p, out=tmp_path / "w.pt", ckpt=tmp_path / "w.ckpt", steps=2, batch=2,
                      change_weight=4.0, sigma_min=0.5, agent_weight=10.0,
                      device="cpu", eval_cases=0, progress=False, log_every=1, episodes=3, episode_frames=40,
                      resume=False)
    meta = train(cfg.check(), bank=bank)
    assert meta["change_weight"] == 4.0 and meta["sigma_min"] == 0.5 and meta["steps"] == 2
    assert meta["agent_weight"] == 10.0
    for name in ("change_weight", "agent_weight"):
        for bad in (-1.0, True, "2", 101):
            with pytest.raises(ValueError, match=name + r"=.* allowed values: a number in \[0, 100\]"):
                TrainConfig(workload=wl, preset=p, out=tmp_path / "w.pt", steps=1, **{name: bad}).check()
    for bad in (0.0, 1.5, None):
        with pytest.raises(ValueError, match=r"sigma_min=.* allowed values: a number in \(0, 1\]"):
            TrainConfig(workload=wl, preset=p, out=tmp_path / "w.pt", steps=1, sigma_min=bad).check()


@pytest.mark.parametrize("wl", ["mg2", "wma"])
def test_change_weight_and_sigma_min_reach_the_loss(bank, wl):
    """The objective the workload builds uses both options: on one batch and noise draw, each changes the loss."""
    from wmbook import workloads

    pipe = _pipe(wl)
    batch = None
    losses = {}
    # sigma_min 1.0: every draw clamped (mg2 sigmas skew high)
    for opts in ({}, {"change_weight": 4.0}, {"sigma_min": 1.0}, {"agent_weight": 20.0}):
        obj = workloads.get(wl).training_objective(pipe, bank, **opts)
        if batch is None:
            batch = obj.sample_batch(torch.Generator().manual_seed(0), 2)
            from wmbook.train.objectives import agent_cells

            assert agent_cells(batch["frames"], 4).sum() > 0  # the agent is in the batch, so its weight can act
        with torch.no_grad():
            loss, _ = obj.loss(batch, torch.Generator().manual_seed(1), **({"j": 1} if wl == "mg2" else {}))
        losses[tuple(opts)] = float(loss)
    for opt in ("change_weight", "sigma_min", "agent_weight"):
        assert losses[(opt,)] != losses[()], (opt, losses)
    assert losses[("agent_weight",)] > losses[()]  # weights >= 1 everywhere, > 1 on the agent's cells


def test_decision_fraction_sets_the_share_of_decision_passes(bank, tmp_path):
    """`--decision-fraction` (workloads with a decision pass): the share of samples trained as decision passes
    (action tokens zeroed); 0 and 1 give all world-model / all decision passes, a loss of its own each; it is
    recorded in the provenance, checked before any work, and refused for a workload without a decision pass."""
    from wmbook import workloads

    pipe = _pipe("wma")
    losses = {}
    batch = None
    for frac in (0.0, 1.0):
        obj = workloads.get("wma").training_objective(pipe, bank, decision_fraction=frac)
        if batch is None:
            batch = obj.sample_batch(torch.Generator().manual_seed(0), 4)
        with torch.no_grad():
            losses[frac] = float(obj.loss(batch, torch.Generator().manual_seed(1))[0])
    assert losses[0.0] != losses[1.0], losses
    p = tiny_world_wma()
    cfg = TrainConfig(workload="wma", preset=p, out=tmp_path / "w.pt", ckpt=tmp_path / "w.ckpt", steps=1, batch=2,
                      decision_fraction=0.25, device="cpu", eval_cases=0, progress=False, log_every=1, episodes=3,
                      episode_frames=40, resume=False)
    assert train(cfg.check(), bank=bank)["decision_fraction"] == 0.25
    for bad in (-0.1, 1.5, True):
        with pytest.raises(ValueError, match=r"decision_fraction=.* allowed values: a number in \[0, 1\]"):
            TrainConfig(workload="wma", preset=p, out=tmp_path / "w.pt", steps=1, decision_fraction=bad).check()
    with pytest.raises(ValueError, match=r"decision_fraction=0.25 is not allowed for workload 'mg2'.*\['wma'\]"):
        TrainConfig(workload="mg2", preset="world-mg2", out=tmp_path / "w.pt", steps=1, decision_fraction=0.25).check()


def test_compiled_training_step_equals_eager_and_keeps_the_weights_format(bank):
    # the mg2 world model compiled as training compiles it (regionally, its DiT blocks; aot_eager on the CPU: the same
    # graph capture and autograd split as inductor, without generated kernels): same loss and gradients as eager on
    # the same batch, and the state dict keeps its keys (checkpoints and shipped weights do not depend on the flag)
    from wmbook import workloads
    from wmbook.train.core import compile_for_training

    torch._dynamo.reset()
    pipes = []
    for _ in range(2):
        torch.manual_seed(0)
        pipe = _pipe("mg2")
        pipe.model.train().requires_grad_(True)
        pipes.append(pipe)
    keys = list(pipes[1].model.state_dict())
    mods = compile_for_training(workloads.get("mg2"), pipes[1], "aot_eager")
    assert mods and all(getattr(m, "_compiled_call_impl", None) is not None for m in mods)
    assert list(pipes[1].model.state_dict()) == keys
    losses, grads = [], []
    for pipe in pipes:
        obj = Mg2Objective(pipe, bank)
        gen = torch.Generator().manual_seed(3)
        loss, _ = obj.loss(obj.sample_batch(gen, 2), gen, j=1)
        loss.backward()
        losses.append(loss.detach())
        grads.append(torch.cat([q.grad.flatten() for q in pipe.model.parameters() if q.grad is not None]))
    torch.testing.assert_close(losses[1], losses[0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-4, atol=1e-6)
    with pytest.raises(ValueError, match=r"compile='max'.*allowed values: \['none', 'inductor', 'aot_eager'\]"):
        TrainConfig(workload="wma", preset="world-wma", out="w.pt", steps=1, compile="max").check()
    torch._dynamo.reset()


def test_compile_warmup_is_outside_the_budget_and_leaves_training_unchanged(bank, tmp_path):
    # the compile warm-up (two forward + backward passes on draws of its own, no optimizer step) runs before the
    # budget clock and the learning-rate schedule start: same steps, same weights as an eager run of the same seed,
    # and its seconds are recorded beside the training minutes
    torch._dynamo.reset()
    metas, weights = [], []
    for backend in ("none", "aot_eager"):
        out = tmp_path / backend / "w.pt"
        kw = dict(workload="mg2", preset=tiny_world_mg2(), out=out, batch=1, log_every=1, eval_cases=0,
                  ckpt=tmp_path / backend / "w.ckpt", progress=False, warmup=1, episodes=3, episode_frames=40,
                  compile=backend)
        metas.append(train(TrainConfig(steps=2, **kw), bank=bank))
        weights.append(torch.load(out, weights_only=True)["model"])
    assert metas[0]["compile_seconds"] == 0.0 and metas[1]["compile_seconds"] > 0
    assert metas[0]["steps"] == metas[1]["steps"] == 2
    for k in weights[0]:
        torch.testing.assert_close(weights[1][k].float(), weights[0][k].float(), rtol=2e-2, atol=1e-3, msg=k)
    torch._dynamo.reset()


def test_frame_stride_spaces_windows_actions_and_heldout_cases(bank):
    # world-wma's frames are frame_stride rendered frames apart in training and in the held-out cases alike, and a
    # step's action is the mean over the rendered frames it spans
    import numpy as np

    from wmbook.presets import WMA_PRESETS
    from wmbook.train.objectives import window_frames
    from wmbook.world.env import strided_actions

    p = tiny_world_wma()
    s, n_obs, t = p.frame_stride, p.n_obs_steps, p.frames
    assert s == WMA_PRESETS["world-wma"].frame_stride == 3
    assert window_frames(p) == (n_obs + t - 1) * s + 1
    with pytest.raises(ValueError, match="frame_stride=0 is not allowed"):
        p.with_(frame_stride=0)
    a = bank.action.numpy()
    np.testing.assert_allclose(strided_actions(a[0], 2, 4, 3), a[0, 2:14].reshape(4, 3, -1).mean(1), rtol=1e-6)
    assert np.array_equal(strided_actions(a[0], 5, 4, 1), a[0, 5:9])
    both = strided_actions(bank.action[:2], torch.tensor([2, 7]), 4, 3)
    np.testing.assert_allclose(both[1].numpy(), a[1, 7:19].reshape(4, 3, -1).mean(1), rtol=1e-6)
    with pytest.raises(ValueError, match="need 14 frames"):
        strided_actions(a[0, :10], 2, 4, 3)

    obj = WMAObjective(_pipe("wma"), bank)
    batch = obj.sample_batch(torch.Generator().manual_seed(5), 4)
    e, idx = bank.windows(torch.Generator().manual_seed(5), 4, n_obs + t, stride=s)
    assert (idx.diff(dim=1) == s).all() and torch.equal(batch["frames"], bank.frames[e[:, None], idx])
    for b in range(4):
        for j in range(n_obs + t - 1):
            i0 = int(idx[b, 0]) + j * s
            torch.testing.assert_close(batch["action"][b, j], bank.action[e[b], i0:i0 + s].mean(0))
    assert not batch["action"][:, -1].any()  # the window's last frame takes no action

    pipe = _pipe("wma")
    case = weval.heldout_case(workloads.get("wma"), pipe, 0)
    start = (n_obs + 6) * s
    ep = weval.heldout_episode(0, start + t * s + 1)
    assert case.start == start and np.array_equal(case.last, ep.frames[start])
    assert np.array_equal(case.target, ep.frames[start + s:start + t * s + 1:s]) and len(case.target) == t
    obs = case.inputs.observation_images[0].permute(1, 2, 3, 0)  # [n_obs, H, W, 3]
    want = torch.from_numpy(ep.frames[start - (n_obs - 1) * s:start + 1:s]).float() / 127.5 - 1
    torch.testing.assert_close(obs, want)
    torch.testing.assert_close(case.world_actions[0], torch.from_numpy(strided_actions(ep.action, start, t, s)))


def test_raw_actions_reach_the_action_embedding_in_training_and_sampling(bank, monkeypatch):
    """world-wma's action embedding reads the raw action vectors: the training loss hands it the batch's actions
    (zeros for decision-pass samples), the pipeline the zeros in the decision pass and the given (or decided)
    actions in the world-model pass, at every step."""
    from wmbook import workloads
    from wmbook.world import eval as wev

    pipe = _pipe("wma")
    dm = pipe.model.diffusion_model
    seen = []
    real = dm.frame_embedding
    monkeypatch.setattr(dm, "frame_embedding", lambda emb, t, actions=None, obs_states=None: (
        seen.append(None if actions is None else actions.detach().clone()), real(emb, t, actions, obs_states))[1])
    obj = workloads.get("wma").training_objective(pipe, bank, decision_fraction=0.0)
    batch = obj.sample_batch(torch.Generator().manual_seed(0), 2)
    p = pipe.preset
    want = batch["action"][:, p.n_obs_steps - 1:p.n_obs_steps - 1 + p.frames]
    for decision, expect in ((torch.tensor([False, True]), torch.stack([want[0], torch.zeros_like(want[1])])),
                             (None, want)):
        seen.clear()
        with torch.no_grad():
            obj.loss(batch, torch.Generator().manual_seed(1), decision=decision)
        assert len(seen) == 1 and torch.equal(seen[0][:, :p.frames], expect)
    assert want.abs().sum() > 0  # the batch moved: the comparison above can fail

    case = wev.heldout_case(workloads.get("wma"), pipe, 0)
    seen.clear()
    pipe.run_iteration(case.inputs, ddim_steps=2, progress=False, world_actions=case.world_actions)
    assert len(seen) == 4  # 2 decision steps, 2 world-model steps
    assert all(a is not None and a.abs().sum() == 0 for a in seen[:2])
    assert all(torch.equal(a, case.world_actions.to(a.dtype)) for a in seen[2:])


def test_training_can_start_from_world_weights(bank, tmp_path):
    """`--init-weights`: a run continued from an earlier run's weights file (the shipped one, whose checkpoint stayed
    on the GPU host) starts from exactly those weights, the output conv included (a fresh x0-residual model zeroes
    it), records where it started in its provenance, resumes only a checkpoint made from the same file, and refuses a
    missing file or another preset's weights before any work."""
    from wmbook.train.core import build_training

    p = tiny_world_wma()
    kw = dict(workload="wma", preset=p, batch=2, device="cpu", eval_cases=0, progress=False, log_every=1, episodes=3,
              episode_frames=40, decision_fraction=0.0)
    first = tmp_path / "a.pt"
    train(TrainConfig(out=first, ckpt=tmp_path / "a.ckpt", steps=2, resume=False, **kw).check(), bank=bank)
    saved = wweights.read_weights(first)["model"]
    cfg = TrainConfig(out=tmp_path / "b.pt", ckpt=tmp_path / "b.ckpt", steps=1, init_weights=first, **kw).check()
    pipe, _ = build_training(cfg, torch.device("cpu"), bank)
    state = pipe.model.state_dict()
    assert saved.keys() == state.keys() and pipe.model.training
    for k, v in saved.items():
        torch.testing.assert_close(state[k], v.to(state[k].dtype), msg=k)
    assert saved["diffusion_model.out.2.weight"].abs().sum() > 0
    meta = train(cfg, bank=bank)
    assert meta["init_weights"]["file"] == "a.pt" and meta["init_weights"]["steps"] == 2
    with pytest.raises(ValueError, match="was made with"):  # b.ckpt started from a.pt; a fresh start is another run
        train(TrainConfig(out=tmp_path / "b.pt", ckpt=tmp_path / "b.ckpt", steps=2, **kw), bank=bank)
    with pytest.raises(ValueError, match=r"init_weights='.*missing.pt' is not allowed .*allowed values"):
        TrainConfig(out=tmp_path / "c.pt", steps=1, init_weights=tmp_path / "missing.pt", **kw).check()
    with pytest.raises(ValueError, match=r"init_weights=.* holds wma/world-wma-test weights"):
        TrainConfig(**{**kw, "preset": "world-wma"}, out=tmp_path / "c.pt", steps=1, init_weights=first).check()
