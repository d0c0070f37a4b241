"""`python -m wmbook.train`: train one world preset's model (see wmbook.train). Each run writes into a folder of its
own (data/weights/runs/<date>-<preset>/ unless --out says where); the shipped weights change only with --ship, and
then only when the new weights pass the shipping rule on held-out episodes."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..errors import InputError, command
from . import core
from .core import TrainConfig, default_out, trainable_workloads


@command("python -m wmbook.train")
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m wmbook.train", description=__doc__)
    ap.add_argument("--workload", required=True, choices=trainable_workloads())
    ap.add_argument("--preset", default=None, help="a world preset of the workload (default: world-<workload>)")
    ap.add_argument("--out", type=Path, default=None,
                    help="weights file, .pt (default: data/weights/runs/<UTC date>-<preset>/<preset>.pt, a new folder; "
                         "never the shipped data/weights/<preset>.pt)")
    ap.add_argument("--ship", action="store_true",
                    help="after training, replace the shipped data/weights/<preset>.pt (and its .json, .loss.csv) with "
                         "the new weights if they pass the shipping rule on the held-out episodes (PSNR and SSIM "
                         "above copy-last's, agent error at most half of copy-last's); exit 1 when they do not")
    ap.add_argument("--minutes", type=float, default=None, help="training-time budget (rendering excluded)")
    ap.add_argument("--steps", type=int, default=None, help="step budget (the first budget reached ends training)")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--data-seed", type=int, default=0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--episodes", type=int, default=2000, help="rendered training episodes")
    ap.add_argument("--episode-frames", type=int, default=97)
    ap.add_argument("--workers", type=int, default=0, help="rendering processes (0: half the CPUs, at most 8)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--ckpt-every", type=int, default=500)
    ap.add_argument("--log-every", type=int, default=25)
    ap.add_argument("--ema", type=float, default=0.999)
    ap.add_argument("--change-weight", type=float, default=0.0,
                    help="extra loss weight on latent positions that change between frames (the agent, the panned "
                         "edges): weight 1 + this x change / mean change; 0: plain MSE")
    ap.add_argument("--agent-weight", type=float, default=0.0,
                    help="extra loss weight on the latent cells where the agent is or was (its magenta in the "
                         "rendered frames): weight 1 + this there, 1 elsewhere, not normalised per sample as "
                         "--change-weight is; 0: off")
    ap.add_argument("--sigma-min", type=float, default=0.05,
                    help="noise-level floor of the x0 losses' 1 / sigma^2 weight (larger: nearly clean draws weigh "
                         "less, min-SNR style)")
    ap.add_argument("--decision-fraction", type=float, default=0.5,
                    help="workloads with a decision pass (wma): the share of samples trained as decision passes "
                         "(action tokens zeroed, the action head's loss), the rest as world-model passes (the true "
                         "actions, the state head's loss); the video loss applies to both")
    ap.add_argument("--compile", default="none", choices=["none", "inductor", "aot_eager"],
                    help="torch.compile the denoiser for training (none: eager)")
    ap.add_argument("--eval-cases", type=int, default=8, help="held-out episodes scored at the end")
    ap.add_argument("--ckpt", type=Path, default=None, help="checkpoint (default: reports/train/<out stem>.ckpt)")
    ap.add_argument("--no-resume", action="store_true", help="start over even when a checkpoint exists")
    ap.add_argument("--init-weights", type=Path, default=None,
                    help="start from this world-weights file of the same preset (e.g. data/weights/world-wma.pt) "
                         "instead of a fresh initialisation; the optimizer starts fresh")
    ap.add_argument("-q", "--quiet", action="store_true", help="no progress bars")
    a = ap.parse_args(argv)

    preset = a.preset or f"world-{a.workload}"
    out = a.out or default_out(preset)
    cfg = TrainConfig(workload=a.workload, preset=preset, out=out, minutes=a.minutes, steps=a.steps, batch=a.batch,
                      lr=a.lr, warmup=a.warmup, data_seed=a.data_seed, seed=a.seed, episodes=a.episodes,
                      episode_frames=a.episode_frames, workers=a.workers, device=a.device, ckpt_every=a.ckpt_every,
                      log_every=a.log_every, ema=a.ema, change_weight=a.change_weight, agent_weight=a.agent_weight,
                      sigma_min=a.sigma_min,
                      decision_fraction=a.decision_fraction,
                      resume=not a.no_resume, compile=a.compile, eval_cases=a.eval_cases, init_weights=a.init_weights,
                      ckpt=a.ckpt, ship=a.ship, progress=not a.quiet, command="python -m wmbook.train " + " ".join(
                          argv if argv is not None else sys.argv[1:]))
    try:
        cfg.check()
    except ValueError as e:
        raise InputError(str(e)) from None
    meta = core.train(cfg)  # looked up at the call (tests stand in for it)
    print(json.dumps(meta, indent=2, sort_keys=True))
    print(f"weights: {cfg.out}")
    rule = meta.get("shipping_rule")
    if cfg.ship:
        if meta.get("shipped"):
            print("shipped (they pass the shipping rule): " + ", ".join(meta["shipped"]))
        else:
            print(f"not shipped: {'; '.join(rule['fails'])}. The shipped weights are unchanged; the new ones stay in "
                  f"{cfg.out.parent}", file=sys.stderr)
            return 1
    elif rule is not None:
        print("they pass the shipping rule: --ship would replace the shipped weights" if rule["passes"] else
              f"they do not pass the shipping rule ({'; '.join(rule['fails'])})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
