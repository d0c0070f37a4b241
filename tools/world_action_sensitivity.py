"""Does a world-wma model respond to its actions? Each held-out case is given the next case's actions (everything else
its own) and the relative L2 change is measured, against a redrawn noise for scale:

- the denoiser's output at training-like timesteps, with the actions swapped on both paths, on the action embedding
  only (`WMAPreset.action_embedding`, the raw actions) and on the cross-attention only (the context's action tokens);
- the DDIM prediction (`--steps`): how far the video moves and where the detected agent lands (px between the agent
  of the true-action and the swapped-action predictions; a model that ignores its actions puts it in the same place),
  and the agent error against ground truth with the true and with the swapped actions.

    PYTHONPATH=$PWD python3 tools/world_action_sensitivity.py world-wma.pt [--seeds 0,1,2,3] [--steps 5] [--out PREFIX]

Writes PREFIX.denoiser.csv and PREFIX.video.csv (default: next to the weights). One CPU thread.
"""

from __future__ import annotations

import argparse
import copy
import sys
import time

import numpy as np
import torch

from wmbook.errors import InputError, command


@command("world_action_sensitivity.py")
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("weights", help="a world-wma .pt file (wmbook.world.weights format)")
    ap.add_argument("--seeds", default="0,1,2,3",
                    help="held-out episode seeds (at least 2: each takes the next's actions)")
    ap.add_argument("--timesteps", default="200,500,800", help="denoiser timesteps")
    ap.add_argument("--steps", default="5", help="DDIM steps of the predictions")
    ap.add_argument("--out", default=None, help="output prefix (default: the weights path)")
    a = ap.parse_args(argv)
    from wmbook.world.eval import int_option

    try:
        seeds, ts = int_option(a.seeds, "seeds"), int_option(a.timesteps, "timesteps", hi=999)
        steps = int_option(a.steps, "steps", lo=1)[0]
    except ValueError as e:
        raise InputError(str(e)) from None
    if len(seeds) < 2:
        raise InputError(f"--seeds={a.seeds!r} is not allowed; allowed values: at least 2 seeds (each case takes the "
                         f"next's actions)")
    import pandas as pd

    from wmbook import workloads
    from wmbook.check import compare
    from wmbook.models.wma.vae import encode_frame
    from wmbook.world import eval as ev
    from wmbook.world.env import locate_agent
    from wmbook.world.weights import build_world_pipeline

    def _rel(a, b) -> float:  # ||a - b|| / ||b||, in float64
        return compare(torch.as_tensor(a), torch.as_tensor(b)).rel_l2

    torch.set_num_threads(1)
    t0 = time.time()
    wl = workloads.get("wma")
    pipe = build_world_pipeline(wl, "world-wma", device=torch.device("cpu"), dtype=torch.float32,
                                vae_dtype=torch.float32, weights=a.weights)
    p, m = pipe.preset, pipe.model
    cases = {s: ev.heldout_case(wl, pipe, s) for s in seeds}
    swap = {s: seeds[(i + 1) % len(seeds)] for i, s in enumerate(seeds)}
    ab = pipe.scheduler.alphas_cumprod.float()

    @torch.no_grad()
    def prep(case):
        cond = pipe.condition(case.inputs, torch.Generator("cpu").manual_seed(0), False)
        tgt = torch.from_numpy(case.target).permute(3, 0, 1, 2).float() / 127.5 - 1
        x0 = encode_frame(pipe.vae, tgt.transpose(0, 1), p.scale_factor).float().transpose(0, 1)[None]
        return cond, x0

    @torch.no_grad()
    def denoise(case, cond, x0, xattn_actions, emb_actions, t, noise_seed):
        g = torch.Generator("cpu").manual_seed(1000 + noise_seed)
        eps = torch.randn(x0.shape, generator=g)
        xa = torch.randn(1, p.horizon, p.agent_action_dim, generator=g)
        xs = torch.randn(1, p.horizon, p.agent_state_dim, generator=g)
        xt = ab[t].sqrt() * x0 + (1 - ab[t]).sqrt() * eps
        ctx = m.build_context(cond.state, m.embed_action(xattn_actions), cond.empty_text, cond.image)
        tt, fs = torch.full((1,), t, dtype=torch.long), torch.full((1,), p.default_fs, dtype=torch.long)
        extra = {"actions": emb_actions} if p.action_embedding else {}
        return m(xt, cond.cond_latent, xa, xs, tt, ctx, case.inputs.observation_images,
                 case.inputs.observation_states, fs, **extra)[0].float().numpy()

    rows = []
    for s in seeds:
        c, (cond, x0) = cases[s], prep(cases[s])
        own, other = c.world_actions, cases[swap[s]].world_actions
        for t in ts:
            base = denoise(c, cond, x0, own, own, t, s)
            rows.append(dict(seed=s, t=t, out_swap=_rel(denoise(c, cond, x0, other, other, t, s), base),
                             out_swap_embedding_only=_rel(denoise(c, cond, x0, own, other, t, s), base),
                             out_swap_cross_attention_only=_rel(denoise(c, cond, x0, other, own, t, s), base),
                             out_noise=_rel(denoise(c, cond, x0, own, own, t, s + 100), base)))
    den = pd.DataFrame(rows)
    print(den.groupby("t").mean(numeric_only=True).drop(columns="seed").to_string(float_format=lambda v: f"{v:.4f}"),
          f"\n({time.time() - t0:.0f} s)", flush=True)

    def predict(case, actions):
        c = copy.copy(case)
        c.world_actions = actions
        with torch.no_grad():
            return ev.predict(wl, pipe, c, ddim_steps=steps)

    vid = []
    for s in seeds:
        c = cases[s]
        v_true, v_swap = predict(c, c.world_actions), predict(c, cases[swap[s]].world_actions)
        c2 = ev.heldout_case(wl, pipe, s, sample_seed=s + 100)
        v_noise = predict(c2, c2.world_actions)
        st, ss = ev.score(v_true, c), ev.score(v_swap, c)
        pt, ps, pn = locate_agent(v_true), locate_agent(v_swap), locate_agent(v_noise)
        with np.errstate(all="ignore"):
            vid.append(dict(seed=s, video_swap=_rel(v_swap, v_true), video_noise=_rel(v_noise, v_true),
                            agent_px_true_vs_swap=float(np.nanmean(np.linalg.norm(pt - ps, axis=1))),
                            agent_px_true_vs_noise=float(np.nanmean(np.linalg.norm(pt - pn, axis=1))),
                            agent_err_true=st["agent_err_px"], agent_err_swap=ss["agent_err_px"],
                            agent_found=st["agent_found"], psnr=st["psnr"]))
    vd = pd.DataFrame(vid)
    print(vd.to_string(float_format=lambda v: f"{v:.4f}"))
    print("mean:", vd.mean(numeric_only=True).drop("seed").round(4).to_dict(), f"({time.time() - t0:.0f} s)")
    prefix = a.out or a.weights
    den.to_csv(f"{prefix}.denoiser.csv", index=False)
    vd.to_csv(f"{prefix}.video.csv", index=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
