"""Score world-model weights against ground truth at several sampling step counts: held-out episodes of
wmbook.world, the model's prediction at each DDIM step count (and eta) against the copy-last-frame baseline (PSNR,
SSIM, the agent's position error). Fewer steps return closer to the model's mean prediction, which PSNR favours
(data/weights/README.md); choose a step count on episodes other than the held-out ones before a shipping decision.

    PYTHONPATH=$PWD python3 tools/world_steps_eval.py reports/train/world-wma.pt --seeds 0,1,2,3 --steps 1,2,5,10,50

Each episode is predicted with --draws draws of the sampling noise (default 4; draw k samples with seed
episode + k * wmbook.world.eval.DRAW_SEED_STRIDE, draw 0 with the episode's own seed); the means are over episodes and
draws, and the per-draw means show the spread. With --choose FILE (on the selection episodes, 8-15) it applies the
step-count rule, wmbook.world.eval.choose_steps (at least 4 draws), and writes the chosen step count to FILE (empty
when none passes); score the held-out episodes (0-7) at that count.
"""

from __future__ import annotations

import argparse
import sys

import pandas as pd
import torch

from wmbook.errors import InputError, command


@command("world_steps_eval.py")
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("weights", help="a world-wma .pt file (wmbook.world.weights format)")
    ap.add_argument("--seeds", default="0,1,2,3", help="held-out episode seeds")
    ap.add_argument("--steps", default="1,2,5,10,50", help="DDIM step counts")
    ap.add_argument("--eta", type=float, default=None, help="DDIM eta (default: the preset's)")
    ap.add_argument("--draws", default="4", help="draws of the sampling noise per episode (>= 1; the rule needs 4)")
    ap.add_argument("--device", default="cpu", help="cpu | cuda (the prediction's device)")
    ap.add_argument("--out", default=None, help="CSV path")
    ap.add_argument("--choose", default=None, metavar="FILE",
                    help="selection episodes: apply the step-count rule (wmbook.world.eval.choose_steps) and write the "
                         "chosen count to FILE (empty when no count passes), for the held-out scoring that follows")
    a = ap.parse_args(argv)
    from wmbook.world.eval import int_option

    try:
        seeds, steps = int_option(a.seeds, "seeds"), int_option(a.steps, "steps", lo=1)
        draws = int_option(a.draws, "draws", lo=1)
        if len(draws) != 1:
            raise ValueError(f"--draws={a.draws!r} is not allowed; allowed values: one integer >= 1")
        draws = draws[0]
    except ValueError as e:
        raise InputError(str(e)) from None
    if a.device not in ("cpu", "cuda") or (a.device == "cuda" and not torch.cuda.is_available()):
        raise InputError(f"--device={a.device!r} is not allowed; allowed values: cpu, cuda (with a CUDA device)")
    from wmbook import workloads
    from wmbook.world import eval as ev

    if a.choose and draws < ev.MIN_DRAWS:
        raise InputError(f"--draws={a.draws!r} is not allowed with --choose; allowed values: an integer >= "
                         f"{ev.MIN_DRAWS} (the step-count rule averages that many draws of the sampling noise)")
    from wmbook.world.weights import build_world_pipeline

    wl = workloads.get("wma")
    pipe = build_world_pipeline(wl, "world-wma", device=torch.device(a.device), dtype=torch.float32,
                                vae_dtype=torch.float32, weights=a.weights)
    rows = []
    for i, (sd, k) in enumerate((sd, k) for sd in seeds for k in range(draws)):
        case = ev.heldout_case(wl, pipe, sd, sample_seed=ev.sample_seed_of(sd, k))
        if k == 0:  # copy-last draws no noise: one row per episode
            rows.append({"prediction": "copy-last", "seed": sd, "draw": 0, **ev.score(ev.copy_last(case), case)})
        for n in steps:
            with torch.no_grad():
                video = ev.predict(wl, pipe, case, ddim_steps=n, eta=a.eta)
            rows.append({"prediction": f"ddim {n}" + (f", eta {a.eta:g}" if a.eta is not None else ""), "seed": sd,
                         "draw": k, **ev.score(video, case)})
        print(f"episode {sd} draw {k} done ({i + 1}/{len(seeds) * draws})", file=sys.stderr, flush=True)
    df = pd.DataFrame(rows)
    print(f"{a.weights}: held-out episodes {seeds}, {draws} draw(s) each")
    print(ev.summarize(rows).to_string(float_format=lambda v: f"{v:.3f}"))
    if draws > 1:
        print("per draw, the mean over episodes:")
        print(ev.draw_means(rows).to_string(float_format=lambda v: f"{v:.3f}"))
    if a.out:
        df.to_csv(a.out, index=False)
    if a.choose:
        pick = ev.choose_steps(rows)
        print(f"rule: {pick['rule']}; passing: {pick['passing'] or 'none'}; chosen: {pick['chosen']}")
        print("single draws passing: " + ", ".join(f"{lab} {k}/{pick['draws']}"
                                                    for lab, k in pick["draws_passing"].items()))
        with open(a.choose, "w") as f:
            f.write("" if pick["chosen"] is None else str(pick["chosen"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
