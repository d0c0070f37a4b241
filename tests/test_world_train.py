"""Training the world models: the objective matches inference, the loss goes down, the loop resumes and ships
loadable weights."""

import json

import pytest
import torch

from test_world import tiny_world_mg2, tiny_world_wma
from wmbook.train import TrainConfig, train
from wmbook.train.data import EpisodeBank
from wmbook.train.objectives import Mg2Objective, WMAObjective
from wmbook.world import weights as wweights


@pytest.fixture(scope="module")
def bank(one_thread):
    return EpisodeBank(0, 3, 40, progress=False)


def _pipe(wl):
    p = tiny_world_mg2() if wl == "mg2" else tiny_world_wma()
    return wweights.build_world_pipeline(wl, p, device="cpu", dtype="fp32", weights=False)


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
    pipe = wweights.build_world_pipeline("mg2", tiny_world_mg2(), device="cpu", dtype="fp32", weights=out)
    assert not pipe.model.training
    with pytest.raises(ValueError, match="was made with"):
        train(TrainConfig(steps=5, **{**kw, "batch": 2}), bank=bank)


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

    with pytest.raises(SystemExit):
        main(["--workload", "wma", "--preset", "world-mg2", "--steps", "1"])
    assert "preset=" in capsys.readouterr().err


def test_rendering_workers_give_the_same_bank():
    a = EpisodeBank(1, 3, 12, workers=2, progress=False)
    b = EpisodeBank(1, 3, 12, workers=1, progress=False)
    assert torch.equal(a.frames, b.frames) and torch.equal(a.action, b.action)
    assert not torch.equal(a.frames, EpisodeBank(2, 3, 12, progress=False).frames)
