"""Score world-model weights against ground truth at several sampling step counts: held-out episodes of
wmbook.world, the model's prediction at each DDIM step count (and eta) against the copy-last-frame baseline (PSNR,
SSIM, the agent's position error). Fewer steps return closer to the model's mean prediction, which PSNR favours
(data/weights/README.md); choose a step count on episodes other than the held-out ones before a shipping decision.

    PYTHONPATH=$PWD python3 tools/world_steps_eval.py reports/train/world-wma.pt --seeds 0,1,2,3 --steps 1,2,5,10,50

With --choose FILE (on the selection episodes, 8-15) it applies the shipping rule, wmbook.world.eval.choose_steps,
and writes the chosen step count to FILE (empty when none passes); score the held-out episodes (0-7) at that count.
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
    ap.add_argument("--device", default="cpu", help="cpu | cuda (the prediction's device)")
    ap.add_argument("--out", default=None, help="CSV path")
    ap.add_argument("--choose", default=None, metavar="FILE",
                    help="selection episodes: apply the step-count rule (wmbook.world.eval.choose_steps) and write the "
                         "chosen count to FILE (empty when no count passes), for the held-out scoring that follows")
    a = ap.parse_args(argv)
    from wmbook.world.eval import int_option

    try:
        seeds, steps = int_option(a.seeds, "seeds"), int_option(a.steps, "steps", lo=1)
    except ValueError as e:
        raise InputError(str(e)) from None
    if a.device not in ("cpu", "cuda") or (a.device == "cuda" and not torch.cuda.is_available()):
        raise InputError(f"--device={a.device!r} is not allowed; allowed values: cpu, cuda (with a CUDA device)")
    from wmbook import workloads
    from wmbook.world import eval as ev
    from wmbook.world.weights import build_world_pipeline

    wl = workloads.get("wma")
    pipe = build_world_pipeline(wl, "world-wma", device=torch.device(a.device), dtype=torch.float32,
                                vae_dtype=torch.float32, weights=a.weights)
    rows = []
    for sd in seeds:
        case = ev.heldout_case(wl, pipe, sd)
        rows.append({"prediction": "copy-last", "seed": sd, **ev.score(ev.copy_last(case), case)})
        for n in steps:
            with torch.no_grad():
                video = ev.predict(wl, pipe, case, ddim_steps=n, eta=a.eta)
            rows.append({"prediction": f"ddim {n}" + (f", eta {a.eta:g}" if a.eta is not None else ""), "seed": sd,
                         **ev.score(video, case)})
    df = pd.DataFrame(rows)
    print(f"{a.weights}: held-out episodes {seeds}")
    print(ev.summarize(rows).to_string(float_format=lambda v: f"{v:.3f}"))
    if a.out:
        df.to_csv(a.out, index=False)
    if a.choose:
        pick = ev.choose_steps(rows)
        print(f"rule: {pick['rule']}; passing: {pick['passing'] or 'none'}; chosen: {pick['chosen']}")
        with open(a.choose, "w") as f:
            f.write("" if pick["chosen"] is None else str(pick["chosen"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
