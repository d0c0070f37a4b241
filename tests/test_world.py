"""The synthetic game world: determinism, the agent detector, the space-to-depth codec, eval on random weights,
weights files loaded strictly."""

import numpy as np
import pytest
import torch

from wmbook import workloads
from wmbook.presets import PRESETS, WMA_PRESETS, ActionConfig
from wmbook.world import eval as weval
from wmbook.world import locate_agent, render_episode
from wmbook.world import weights as wweights


def tiny_world_mg2():
    return PRESETS["world-mg2"].with_(
        name="world-mg2-test", dim=32, ffn_dim=64, num_heads=2, num_layers=2, freq_dim=32, default_blocks=2,
        action=ActionConfig(blocks=(0,), hidden_size=8, img_hidden_size=32, keyboard_hidden_dim=16,
                            mouse_hidden_dim=16, heads_num=2, rope_dim_list=(4, 2, 2)))


def tiny_world_wma():
    return WMA_PRESETS["world-wma"].with_(
        name="world-wma-test", frames=4, model_channels=16, channel_mult=(1, 1, 1, 1), num_head_channels=8,
        norm_groups=8, context_dim=32, text_width=32, output_action_context_len=8, resampler_dim=32,
        resampler_dim_head=16, stem_dim_head=16, head_down_dims=(8, 8, 8, 8), obs_widths=(16, 16, 32, 32),
        obs_spatial_kp=8, head_step_embed_dim=16, default_steps=2)


@pytest.fixture(scope="module")
def pipes(one_thread):
    return {"mg2": wweights.build_world_pipeline(workloads.get("mg2"), tiny_world_mg2(), device="cpu", dtype="fp32",
                                                 weights=False),
            "wma": wweights.build_world_pipeline(workloads.get("wma"), tiny_world_wma(), device="cpu", dtype="fp32",
                                                 weights=False)}


# --- the world ------------------------------------------------------------------------------------------------


def test_same_seed_same_bytes_different_seeds_differ():
    a, b, c = render_episode(7, 20), render_episode(7, 20), render_episode(8, 20)
    for f in ("frames", "keyboard", "mouse", "state", "action", "agent_xy", "agent_visible"):
        assert getattr(a, f).tobytes() == getattr(b, f).tobytes(), f
    assert a.frames.tobytes() != c.frames.tobytes()
    assert a.frames.shape == (20, 64, 64, 3) and a.frames.dtype == np.uint8
    assert a.keyboard.shape == (20, 4) and a.mouse.shape == (20, 2) and a.state.shape == (20, 6)
    assert set(np.unique(a.keyboard)) <= {0.0, 1.0} and (a.keyboard.sum(1) <= 1).all()
    assert np.abs(a.mouse).max() <= 1


def test_actions_drive_the_agent_and_the_view():
    e = render_episode(3, 120)
    world = (e.state[:, :2] + 1) / 2 * 192  # agent position in arena pixels
    cam = (e.state[:, 4:6] + 1) / 2 * (192 - 64)
    held = e.keyboard[:-1].argmax(1)
    moving = e.keyboard[:-1].sum(1) > 0
    step = np.diff(world, axis=0)
    # a held key accelerates along its direction: x for A/D (2, 3), y for W/S (0, 1)
    dirs = np.array([[0, -1], [0, 1], [-1, 0], [1, 0]])
    along = (step * dirs[held]).sum(1)
    assert (along[moving] > -2.0).all() and along[moving].mean() > 0.3
    pan = np.diff(cam, axis=0)
    inside = (cam[:-1] > 1).all(1) & (cam[:-1] < 127).all(1) & (cam[1:] > 1).all(1) & (cam[1:] < 127).all(1)
    np.testing.assert_allclose(pan[inside], 2.0 * e.mouse[:-1][inside], atol=1e-4)


@pytest.mark.parametrize("bad", [-1, 1.5, "3", True])
def test_bad_seed_is_refused(bad):
    with pytest.raises(ValueError, match="seed="):
        render_episode(bad, 4)
    with pytest.raises(ValueError, match="num_frames="):
        render_episode(0, 0)


def test_detector_finds_the_agent():
    errs = []
    for s in range(6):
        e = render_episode(s, 40)
        det = locate_agent(e.frames)
        vis = e.agent_visible > 0.99
        assert vis.sum() > 10
        errs.append(np.linalg.norm(det[vis] - e.agent_xy[vis], axis=1))
    errs = np.concatenate(errs)
    assert np.isfinite(errs).all() and errs.max() < 0.6
    blank = np.zeros((2, 64, 64, 3), np.uint8)
    assert np.isnan(locate_agent(blank)).all()
    with pytest.raises(ValueError, match="frames must be"):
        locate_agent(np.zeros((64, 64)))


def test_render_speed():
    import time

    t = time.perf_counter()
    render_episode(11, 200)
    assert time.perf_counter() - t < 2.0  # thousands of frames a minute, with room to spare


# --- the codec ------------------------------------------------------------------------------------------------


def test_video_codec_round_trip_through_the_streaming_decoder(pipes):
    from wmbook.models.vae import encode_first_frame, normalize_latents

    pipe = pipes["mg2"]
    e = render_episode(5, 1 + 4 * 5)
    x = torch.from_numpy(e.frames).permute(3, 0, 1, 2)[None].float() / 127.5 - 1  # [1, 3, 21, 64, 64]
    z = normalize_latents(pipe.vae, pipe.vae.encode(x).latent_dist.mode())
    assert z.shape == (1, 192, 6, 16, 16)
    pipe.decoder.reset()
    y = torch.cat([pipe.decoder.decode_block(z[:, :, :3]), pipe.decoder.decode_block(z[:, :, 3:])], dim=2)
    assert torch.equal(y, x)
    first = encode_first_frame(pipe.vae, x[:, :, 0], 6)
    assert torch.equal(first[:, :, 0], z[:, :, 0]) and not first[:, :, 1:].any()
    with pytest.raises(ValueError, match="1 \\+ 4k"):
        pipe.vae.encode(x[:, :, :3])


def test_frame_codec_round_trip(pipes):
    from wmbook.models.wma.vae import decode_frame, encode_frame

    pipe = pipes["wma"]
    x = torch.from_numpy(render_episode(6, 1).frames[0]).permute(2, 0, 1)[None].float() / 127.5 - 1
    z = encode_frame(pipe.vae, x, pipe.preset.scale_factor)
    assert z.shape == (1, 48, 16, 16)
    assert torch.equal(decode_frame(pipe.vae, z, pipe.preset.scale_factor), x)


# --- evaluation on random weights -------------------------------------------------------------------------------


@pytest.mark.parametrize("wl", ["mg2", "wma"])
def test_eval_functions_on_random_weights(pipes, wl):
    pipe = pipes[wl]
    assert weval.is_world_preset("world-mg2") and weval.is_world_preset(pipe.preset)
    assert not weval.is_world_preset("tiny") and not weval.is_world_preset("nope")
    case = weval.heldout_case(workloads.get(wl), pipe, 3)
    n = 4 * (2 * 3 - 1) if wl == "mg2" else pipe.preset.frames
    assert case.target.shape == (n, 64, 64, 3) and case.target_xy.shape == (n, 2)
    pred = weval.predict(workloads.get(wl), pipe, case)
    assert pred.shape == case.target.shape and pred.dtype == np.uint8
    s = weval.score(pred, case)
    assert set(s) >= {"psnr", "ssim", "agent_err_px"} and all(np.isfinite(v) for v in s.values())
    base = weval.score(weval.copy_last(case), case)
    assert np.isfinite(base["psnr"]) and base["psnr"] > s["psnr"]  # random weights do not beat copying
    perfect = weval.score(case.target, case)
    assert perfect["psnr"] == 100.0 and perfect["ssim"] == pytest.approx(1.0) and perfect["agent_err_px"] < 0.6
    again = weval.predict(workloads.get(wl), pipe, weval.heldout_case(workloads.get(wl), pipe, 3))
    assert np.array_equal(again, pred)  # seeded


def test_heldout_episodes_are_not_training_episodes():
    from wmbook.train.data import train_seed

    assert train_seed(999, 999_999) < weval.HELDOUT_BASE
    with pytest.raises(ValueError, match="data_seed="):
        train_seed(1000, 0)


def test_ssim_matches_a_known_value():
    rng = np.random.default_rng(0)
    a = rng.integers(0, 256, (1, 32, 32, 3), dtype=np.uint8)
    assert weval.ssim(a, a)[0] == pytest.approx(1.0)
    b = np.clip(a.astype(int) + rng.integers(-40, 41, a.shape), 0, 255).astype(np.uint8)
    c = np.clip(a.astype(int) + rng.integers(-120, 121, a.shape), 0, 255).astype(np.uint8)
    assert 1.0 > weval.ssim(a, b)[0] > weval.ssim(a, c)[0] > 0.0
    assert weval.ssim(a, 255 - a)[0] < 0  # anti-correlated structure
    # flat frames: only the luminance term is left, (2 mx my + C1) / (mx^2 + my^2 + C1)
    x, y, c1 = np.full((1, 16, 16, 3), 100, np.uint8), np.full((1, 16, 16, 3), 140, np.uint8), (0.01 * 255) ** 2
    assert weval.ssim(x, y)[0] == pytest.approx((2 * 100 * 140 + c1) / (100**2 + 140**2 + c1))
    assert weval.psnr(a, b)[0] == pytest.approx(10 * np.log10(255**2 / ((a.astype(float) - b) ** 2).mean()))


def test_world_actions_are_checked(pipes):
    pipe = pipes["wma"]
    case = weval.heldout_case(workloads.get("wma"), pipe, 0)
    with pytest.raises(ValueError, match="world_actions="):
        pipe.run_iteration(case.inputs, world_actions=torch.zeros(1, 3, 6), progress=False)


# --- weights ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("wl", ["mg2", "wma"])
def test_weights_round_trip_strict(pipes, wl, tmp_path):
    from wmbook.models.checkpoint import CheckpointMismatchError

    pipe = pipes[wl]
    path = wweights.save_weights(pipe, workloads.get(wl), tmp_path / "w.pt", meta={"x": 1})
    assert (tmp_path / "w.pt.json").is_file()
    fresh = wweights.build_world_pipeline(workloads.get(wl), pipe.preset, device="cpu", dtype="fp32", weights=path)
    for (k, a), (_, b) in zip(pipe.model.state_dict().items(), fresh.model.state_dict().items()):
        assert torch.equal(a.to(torch.bfloat16).float(), b), k
    case = weval.heldout_case(workloads.get(wl), fresh, 1)
    assert weval.predict(workloads.get(wl), fresh, case).shape == case.target.shape
    state = torch.load(path, weights_only=True)
    state["model"].pop(next(iter(state["model"])))
    torch.save(state, tmp_path / "bad.pt")
    with pytest.raises(CheckpointMismatchError):
        wweights.build_world_pipeline(workloads.get(wl), pipe.preset, device="cpu", dtype="fp32",
                                      weights=tmp_path / "bad.pt")
    with pytest.raises(FileNotFoundError, match="missing.pt"):
        wweights.build_world_pipeline(workloads.get(wl), pipe.preset, device="cpu", dtype="fp32",
                                      weights=tmp_path / "missing.pt")


def test_workload_pipeline_names_the_missing_weights(tmp_path, monkeypatch):
    from wmbook import workloads

    monkeypatch.setattr(wweights, "WEIGHTS_DIR", tmp_path)
    with pytest.raises(FileNotFoundError, match="world-wma.pt"):
        workloads.get("wma").pipeline("world-wma", torch.device("cpu"), torch.float32, torch.float32)


def test_predict_forwards_sampling_options(pipes):
    pipe = pipes["wma"]
    case = weval.heldout_case(workloads.get("wma"), pipe, 2)
    one, out = weval.predict(workloads.get("wma"), pipe, case, ddim_steps=1, return_output=True)
    assert out.ddim_steps == 1 and one.shape == case.target.shape
    assert not np.array_equal(one, weval.predict(workloads.get("wma"), pipe, case, ddim_steps=2))
    with pytest.raises(ValueError, match="ddim_steps="):
        weval.predict(workloads.get("wma"), pipe, case, ddim_steps=0)


@pytest.mark.parametrize("wl, kw, name", [("mg2", {"start": -1}, "start="), ("mg2", {"num_blocks": 0}, "num_blocks="),
                                          ("wma", {"start": 0}, "start="), ("wma", {"num_blocks": 2}, "num_blocks"),
                                          ("mg2", {"seed": -3}, "seed="), ("motion", {}, "workload=")])
def test_heldout_case_refuses_bad_input(pipes, wl, kw, name):
    pipe = pipes.get(wl, pipes["mg2"])
    kw = {"seed": 0, **kw}
    with pytest.raises(ValueError, match=name):
        weval.heldout_case(workloads.get(wl), pipe, **kw)


def test_heldout_case_needs_a_world_sized_preset():
    from wmbook.pipelines.causal import CausalStreamingPipeline

    with pytest.raises(ValueError, match="world preset"):
        weval.heldout_case(workloads.get("mg2"), CausalStreamingPipeline("tiny-sf", device="cpu", dtype="fp32"), 0)


@pytest.mark.parametrize("wl, preset", [("mg2", "world-mg2"), ("wma", "world-wma")])
def test_shipped_weights_load_strict_and_beat_copy_last(one_thread, wl, preset):
    """The weights under data/weights/ (trained on an H100 or H200, `python -m wmbook.train`) load strictly into
    their preset's pipeline and predict a held-out episode better than repeating its last frame by PSNR, and by SSIM
    where their provenance JSON claims it (both shipped files do since world-wma's run o); the JSON records the same
    comparison over 8 held-out episodes at the preset's sampling steps. A preset whose weights are not
    shipped yet is skipped (data/weights/README.md says which runs did not beat copy-last)."""
    import json

    presets = PRESETS if wl == "mg2" else WMA_PRESETS
    path = wweights.weights_path(presets[preset])
    if not path.is_file():
        pytest.skip(f"{path} is not shipped (no trained {preset} beat copy-last yet)")
    meta = json.loads(path.with_name(path.name + ".json").read_text())
    assert meta["eval"]["model"]["psnr"] > meta["eval"]["copy_last"]["psnr"]
    if getattr(presets[preset], "sample_steps", 0):  # scored at the count the pipeline samples with
        assert meta["eval"]["ddim_steps"] == meta["sampling_steps"]["chosen"] == presets[preset].sample_steps
    pipe = wweights.build_world_pipeline(workloads.get(wl), presets[preset], device="cpu")  # strict load inside
    case = weval.heldout_case(workloads.get(wl), pipe, 0)
    model = weval.score(weval.predict(workloads.get(wl), pipe, case), case)
    base = weval.score(weval.copy_last(case), case)
    assert model["psnr"] > base["psnr"] + 1.0, (model, base)
    if meta["eval"].get("draws"):
        # a claim over episodes and draws of the sampling noise (SSIM's margin is a mean over eight episodes: single
        # episodes fall on either side of copy-last's): the JSON holds the means of the stored rows, and this CPU
        # reproduces the stored row of episode 0, draw 0 (fp32 sampling from the same seed; the tolerances cover
        # another CPU's fp32 rounding moving a few uint8 pixel values, far below the claim's margins)
        import re

        import pandas as pd

        rows = pd.read_csv(path.parent / re.search(r"runs/\S+?\.csv", meta["eval"]["source"]).group(0))
        label = f"ddim {meta['eval']['ddim_steps']}"
        for key, pred in (("model", label), ("copy_last", "copy-last")):
            means = rows[rows["prediction"] == pred][["psnr", "ssim", "agent_err_px"]].mean()
            assert means.round(4).to_dict() == pytest.approx({k: meta["eval"][key][k] for k in means.index}, abs=1e-4)
        stored = rows[(rows["prediction"] == label) & (rows["seed"] == 0) & (rows["draw"] == 0)].iloc[0]
        assert model["psnr"] == pytest.approx(stored["psnr"], abs=0.05), (model, stored)
        assert model["ssim"] == pytest.approx(stored["ssim"], abs=0.005), (model, stored)
    elif meta["eval"]["model"]["ssim"] > meta["eval"]["copy_last"]["ssim"]:
        assert model["ssim"] > base["ssim"], (model, base)
    if meta["eval"]["model"]["agent_err_px"] < meta["eval"]["copy_last"]["agent_err_px"]:
        # weights whose provenance claims action following: the agent is found where the actions put it, over three
        # held-out episodes (one episode's agent may stand still, where copy-last is right by construction)
        cases = [weval.heldout_case(workloads.get(wl), pipe, s) for s in (1, 2)]
        scores = [model] + [weval.score(weval.predict(workloads.get(wl), pipe, c), c) for c in cases]
        bases = [base] + [weval.score(weval.copy_last(c), c) for c in cases]
        err = sum(s["agent_err_px"] for s in scores) / 3
        assert err < 0.5 * sum(b["agent_err_px"] for b in bases) / 3, (scores, bases)
        assert min(s["agent_found"] for s in scores) >= 0.8, scores


def test_world_steps_eval_tool_scores_each_step_count(tmp_path, capsys):
    """tools/world_steps_eval.py: a world-wma weights file scored on held-out episodes at each DDIM step count against
    copy-last (one CSV row per episode, draw of the sampling noise and prediction); bad step counts, draws and a
    --choose with fewer draws than the rule needs are refused naming the option, before the model is built."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("world_steps_eval",
                                                  Path(__file__).parents[1] / "tools" / "world_steps_eval.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    assert tool.main(["missing.pt", "--steps", "0"]) == 2 and "--steps='0'" in capsys.readouterr().err
    assert tool.main(["missing.pt", "--seeds", "x"]) == 2 and "--seeds='x'" in capsys.readouterr().err
    assert tool.main(["missing.pt", "--device", "tpu"]) == 2 and "--device='tpu'" in capsys.readouterr().err
    assert tool.main(["missing.pt", "--draws", "0"]) == 2 and "--draws='0'" in capsys.readouterr().err
    assert tool.main(["missing.pt", "--draws", "2", "--choose", "c"]) == 2
    assert "--draws='2' is not allowed with --choose" in capsys.readouterr().err
    pipe = wweights.build_world_pipeline(workloads.get("wma"), "world-wma", device="cpu", dtype="fp32", weights=False)
    path = wweights.save_weights(pipe, workloads.get("wma"), tmp_path / "w.pt")
    out = tmp_path / "scores.csv"
    choice = tmp_path / "choice"
    assert tool.main([str(path), "--seeds", "1", "--steps", "1,2", "--eta", "0", "--draws", "4", "--out", str(out),
                      "--choose", str(choice)]) == 0
    import pandas as pd

    df = pd.read_csv(out)
    assert list(df["prediction"]) == ["copy-last"] + ["ddim 1, eta 0", "ddim 2, eta 0"] * 4
    assert list(df["draw"]) == [0, 0, 0, 1, 1, 2, 2, 3, 3] and set(df["seed"]) == {1}
    assert df["psnr"].notna().all() and (df["psnr"] > 0).all()
    assert df[df["prediction"] == "ddim 1, eta 0"]["psnr"].nunique() == 4  # each draw its own noise
    # --choose writes the rule's choice ('' when no count passes)
    from wmbook.world.eval import choose_steps

    want = choose_steps(df.to_dict("records"))["chosen"]
    assert choice.read_text() == ("" if want is None else str(want))


def test_world_action_sensitivity_tool(tmp_path, capsys):
    """tools/world_action_sensitivity.py: an untrained world-wma model's action embedding ends in zeros, so swapping
    the actions on that path alone moves nothing, while the cross-attention path moves the output; bad options are
    refused naming the option, before the model is built."""
    import importlib.util
    from pathlib import Path

    import pandas as pd

    spec = importlib.util.spec_from_file_location("world_action_sensitivity",
                                                  Path(__file__).parents[1] / "tools" / "world_action_sensitivity.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    assert tool.main(["missing.pt", "--seeds", "1"]) == 2 and "--seeds='1'" in capsys.readouterr().err
    assert tool.main(["missing.pt", "--timesteps", "1000"]) == 2 and "--timesteps='1000'" in capsys.readouterr().err
    pipe = wweights.build_world_pipeline(workloads.get("wma"), "world-wma", device="cpu", dtype="fp32", weights=False)
    path = wweights.save_weights(pipe, workloads.get("wma"), tmp_path / "w.pt")
    assert tool.main([str(path), "--seeds", "0,1", "--timesteps", "500", "--steps", "1"]) == 0
    den = pd.read_csv(f"{path}.denoiser.csv")
    assert (den["out_swap_embedding_only"] == 0).all() and (den["out_swap_cross_attention_only"] > 0).all()
    assert (den["out_noise"] > den["out_swap"]).all()
    vid = pd.read_csv(f"{path}.video.csv")
    assert list(vid["seed"]) == [0, 1] and (vid["video_noise"] > 0).all()


def test_world_wma_samples_at_its_sample_steps_unless_told():
    """world-wma's shipped weights are scored at `sample_steps` (5) DDIM steps a pass: the world evaluation uses it
    when no step count is given, a given one wins (notebook 03's sweep passes each pass's count), and a bad value is
    refused naming the field."""
    import dataclasses
    from types import SimpleNamespace

    from wmbook import workloads

    class Stop(Exception):
        pass

    seen = []

    class Pipe:
        preset = WMA_PRESETS["world-wma"]

        def run_iteration(self, inputs, **kw):
            seen.append(kw)
            raise Stop

    case = SimpleNamespace(inputs=None, world_actions=None)
    for kw in ({}, {"ddim_steps": 50}, {"decision_steps": 2, "world_steps": 3}):
        with pytest.raises(Stop):
            workloads.get("wma").world_predict(Pipe(), case, **kw)
    assert WMA_PRESETS["world-wma"].sample_steps == 5 and WMA_PRESETS["world-wma"].default_steps == 50
    assert seen[0]["ddim_steps"] == 5 and seen[1]["ddim_steps"] == 50 and "ddim_steps" not in seen[2]
    with pytest.raises(ValueError, match="sample_steps=-1 is not allowed"):
        dataclasses.replace(WMA_PRESETS["world-wma"], sample_steps=-1)


def test_choose_steps_takes_the_fewest_steps_passing_psnr_ssim_and_agent():
    """The step-count rule (tools/world_steps_eval.py --choose): the fewest DDIM steps whose mean PSNR and SSIM beat
    copy-last's and whose agent error is at most half of copy-last's; none when no count passes (runs m and n of
    data/weights/runs: each misses one of the three)."""
    from pathlib import Path

    import pandas as pd

    from wmbook.world.eval import choose_steps

    def rows(pred, psnr, ssim, err):
        return [{"prediction": pred, "seed": s, "psnr": psnr + d, "ssim": ssim, "agent_err_px": err + d,
                 "agent_found": 1.0} for s, d in ((0, -0.5), (1, 0.5))]

    base = rows("copy-last", 16.0, 0.27, 12.0)
    cands = rows("ddim 1", 19.0, 0.30, 7.0) + rows("ddim 2", 18.5, 0.29, 6.0) + rows("ddim 5", 18.0, 0.28, 5.0)
    one = dict(min_draws=1)  # rows of one sampling draw: the rule itself needs four (the test below)
    pick = choose_steps(base + cands, **one)
    assert pick["chosen"] == 2 and pick["passing"] == ["ddim 2", "ddim 5"]  # 1 step: 7 px > half of 12
    assert choose_steps(base + rows("ddim 1", 19.0, 0.26, 2.0), **one)["chosen"] is None  # SSIM below copy-last's
    assert choose_steps(base + rows("ddim 3, eta 0", 17.0, 0.28, 6.0), **one)["chosen"] == 3  # the boundary: 12 / 2
    with pytest.raises(ValueError, match="copy-last"):
        choose_steps(cands, **one)
    runs = Path(__file__).resolve().parents[1] / "data" / "weights" / "runs"
    for run in ("2026-11-27-h100-m", "2026-11-28-h100-n", "2026-11-28-h200-p"):
        rows_ = pd.read_csv(runs / run / "steps-select.csv").to_dict("records")
        assert choose_steps(rows_, **one)["chosen"] is None, run
    # run o's one draw on the H200 picked 2 steps; four draws of the same episodes pick the count it ships with
    assert choose_steps(pd.read_csv(runs / "2026-11-28-h200-o" / "steps-select.csv").to_dict("records"),
                        **one)["chosen"] == 2
    shipped = choose_steps(pd.read_csv(runs / "2026-11-28-h200-o" / "steps-select-draws.csv").to_dict("records"))
    assert shipped["draws"] >= 4 and shipped["chosen"] == WMA_PRESETS["world-wma"].sample_steps


def test_choose_steps_averages_sampling_draws_and_reports_their_spread():
    """A step count passes on the means over episodes and at least four draws of the sampling noise, not on one
    lucky draw: 2 steps passing in one draw of four (agent error 3.5 px against a 6 px limit, 9 px in the others)
    does not ship, 5 steps passing on the average does; the spread (each draw's mean) and the single draws that
    pass are reported; fewer draws than the rule needs are refused naming min_draws."""
    from wmbook.world.eval import choose_steps, draw_means, sample_seed_of

    def rows(pred, errs, draws=4):
        return [{"prediction": pred, "seed": s, "draw": k, "psnr": 19.0, "ssim": 0.30, "agent_err_px": errs[k]}
                for s in (8, 9) for k in range(draws)]

    base = [{"prediction": "copy-last", "seed": s, "draw": 0, "psnr": 16.0, "ssim": 0.27, "agent_err_px": 12.0}
            for s in (8, 9)]
    pick = choose_steps(base + rows("ddim 2", [9.0, 9.0, 3.5, 9.0]) + rows("ddim 5", [4.0, 5.0, 7.0, 4.0]))
    assert pick["chosen"] == 5 and pick["passing"] == ["ddim 5"] and pick["draws"] == 4
    assert pick["draws_passing"] == {"ddim 2": 1, "ddim 5": 3}
    assert pick["spread"].loc["ddim 2", ("agent_err_px", "min")] == 3.5
    assert pick["spread"].loc["ddim 2", ("agent_err_px", "max")] == 9.0
    assert len(draw_means(base + rows("ddim 2", [1, 2, 3, 4]))) == 1 + 4
    with pytest.raises(ValueError, match="min_draws=4"):
        choose_steps(base + rows("ddim 2", [1.0, 1.0], draws=2))
    assert sample_seed_of(8, 0) == 8 and len({sample_seed_of(s, k) for s in range(16) for k in range(4)}) == 64
    with pytest.raises(ValueError, match="draw=-1 is not allowed"):
        sample_seed_of(8, -1)


def test_notebook_03_runs_a_world_preset_on_another_weights_file(tmp_path, monkeypatch):
    """notebook 03's `weights`: a trained world preset on another weights file of it (a run just trained): the
    pipeline loads that file, the run's params record it with its SHA-256 and training commit; a missing file, a file
    of another preset and a random-weights preset are refused at validation, naming the parameter. (The world presets
    are GPU presets of the notebooks; marked tiny here so that the CPU validates them.)"""
    import hashlib

    from wmbook import workloads
    from wmbook.params import ParameterError
    from wmbook.studies import steps

    wl = workloads.get("wma")
    monkeypatch.setitem(wl.presets, "world-wma", wl.presets["world-wma"].with_(tiny=True))

    pipe = wweights.build_world_pipeline(workloads.get("wma"), "world-wma", device="cpu", dtype="fp32", weights=False)
    path = wweights.save_weights(pipe, workloads.get("wma"), tmp_path / "w.pt", {"git_commit": "abc1234"})
    kw = dict(workload="wma", device="cpu", solvers="ddim", sampling_steps="2", split_passes=False,
              results_path=str(tmp_path / "r.csv"))
    cfg = steps.validate(preset="world-wma", weights=str(path), **kw)
    assert cfg.preset.name == "world-wma" and cfg.preset.weights == str(path.resolve())
    rec = str(cfg.params()["weights"])
    assert hashlib.sha256(path.read_bytes()).hexdigest()[:16] in rec and "abc1234" in rec
    built, _ = steps.build(cfg)
    saved = wweights.read_weights(path)["model"]
    name, want = next((k, v) for k, v in saved.items() if v.is_floating_point() and v.numel() > 100)
    assert torch.equal(built.model.state_dict()[name].to(want.dtype), want)
    shipped = steps.validate(preset="world-wma", **kw)  # auto: the shipped file
    assert shipped.preset.weights == "world-wma.pt" and shipped.params()["weights"] is None
    # the quality section records the SHA-256 of the file it scored, the shipped one too (it changes between runs)
    for c, f in ((cfg, path), (shipped, wweights.weights_path(shipped.preset))):
        sw = steps.Sweep(cfg=c.replace(options=dict(c.options) | {"quality_cases": 1}), reference=None, results=[])
        steps.quality(sw.cfg, built, sw, progress=False)
        assert sw.weights_sha256 == hashlib.sha256(f.read_bytes()).hexdigest()
    assert sw.weights_sha256[:16] in sw.quality_note
    with pytest.raises(ParameterError, match=r"weights='nope.pt' is not allowed .*allowed values: 'auto'"):
        steps.validate(preset="world-wma", weights="nope.pt", **kw)
    with pytest.raises(ParameterError, match=r"weights=3 is not allowed; allowed values: 'auto' or the path"):
        steps.validate(preset="world-wma", weights=3, **kw)
    with pytest.raises(ParameterError, match="applies to the trained world presets only"):
        steps.validate(preset="tiny-wma", weights=str(path), **kw)
    mg2 = wweights.save_weights(wweights.build_world_pipeline(workloads.get("mg2"), "world-mg2", device="cpu",
                                                              dtype="fp32", weights=False),
                                workloads.get("mg2"), tmp_path / "m.pt")
    with pytest.raises(ParameterError, match="holds mg2/world-mg2 weights"):
        steps.validate(preset="world-wma", weights=str(mg2), **kw)
