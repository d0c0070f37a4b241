"""Evaluating world models on held-out episodes of wmbook.world: build the pipeline's inputs from an episode, run it,
and score its frames against the ground truth and against the copy-last-frame baseline.

Held-out episodes are `render_episode(HELDOUT_BASE + seed)` (HELDOUT_BASE = 10^9; training never uses seeds that
high, wmbook.train.data).

- mg2: the conditioning is the episode's frame `start` (the image the pipeline encodes and embeds) and the true
  keyboard / mouse of the next 1 + 4(F - 1) frames (F = blocks x frames per block latent frames); the target is the
  4(F - 1) frames after the conditioning frame (the generated video's frame 0 reconstructs the conditioning frame
  and is not scored).
- wma: the observation is frames (and states) start - n_obs + 1 .. start; the world-model pass gets the true actions
  taken at frames start .. start + T - 1 (`run_iteration(world_actions=...)`; the decision pass still runs, as in the
  reference iteration); the target is frames start + 1 .. start + T.

score(): `psnr` the mean over frames of each frame's PSNR (8-bit, peak 255), `ssim` the mean over frames and colour
channels of SSIM (Gaussian window 11, sigma 1.5, K1 0.01, K2 0.03; Wang et al. 2004), `agent_err_px` the mean over
frames where the agent is visible in the ground truth (>= half its sprite) of the distance between the detector's
position in the predicted frame (`locate_agent`) and the agent's true position; a frame where the detector finds no
agent counts the frame's diagonal. `agent_found` is the fraction of those frames where it found one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:
    import pandas as pd

from ..check import frame_psnr
from .env import VIEW, locate_agent, render_episode
from .weights import is_world_preset

__all__ = ["Case", "HELDOUT_BASE", "SHIPPING_RULE", "choose_steps", "copy_last", "heldout_case", "heldout_episode",
           "int_option", "is_world_preset", "predict", "psnr", "score", "shipping_failures", "ssim", "summarize"]

HELDOUT_BASE = 10**9


def int_option(text: str, option: str, lo: int = 0, hi: int | None = None) -> list[int]:
    """A tool's comma-separated integer option (seeds, step counts, timesteps) -> ints in [lo, hi]; ValueError naming
    the option and the allowed values otherwise (the evaluation tools exit with it, before any model is built)."""
    try:
        vals = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        vals = []
    if not vals or min(vals) < lo or (hi is not None and max(vals) > hi):
        span = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise ValueError(f"--{option}={text!r} is not allowed; allowed values: comma-separated integers {span}")
    return vals


@dataclass
class Case:
    """One held-out prediction problem."""

    workload: str  # the name of the workload whose world model made the case
    seed: int  # held-out index (episode seed HELDOUT_BASE + seed)
    start: int  # the last conditioning frame's index in the episode
    inputs: object  # StreamInputs (mg2) | WMAInputs (wma)
    target: np.ndarray  # uint8 [T, H, W, 3] ground-truth frames to predict
    target_xy: np.ndarray  # float32 [T, 2] the agent's true positions in them
    target_visible: np.ndarray  # float32 [T] visible fraction of the agent's sprite
    last: np.ndarray  # uint8 [H, W, 3] the last conditioning frame (copy-last baseline)
    world_actions: torch.Tensor | None = None  # wma: [1, T, A] the true actions for the world-model pass
    num_blocks: int | None = None  # mg2


def _workload(workload):
    """`workload`, a Workload object, which must have a world model (the `world` feature). A name is refused: the
    caller holds the object (wmbook.workloads.get), and resolving it here would tie this module to the workloads
    package, which uses it."""
    if isinstance(workload, str) or not hasattr(workload, "features"):
        raise TypeError(f"workload={workload!r} is not allowed here; pass the Workload object "
                        f"(wmbook.workloads.get(name))")
    if "world" not in workload.features:
        raise ValueError(f"workload={workload.name!r} has no world model (the 'world' feature)")
    return workload


def _check_seed(seed) -> None:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed={seed!r} is not allowed; allowed values: an integer >= 0")


def heldout_episode(seed: int, num_frames: int):
    _check_seed(seed)
    return render_episode(HELDOUT_BASE + int(seed), num_frames)


def heldout_case(workload, pipe, seed: int, *, start: int | None = None, num_blocks: int | None = None,
                 sample_seed: int | None = None) -> Case:
    """The pipeline inputs of held-out episode `seed` and the ground truth to score a prediction against.

    start: index of the last conditioning frame (default: 0 for mg2, an episode's start with the agent at rest;
    (n_obs + 6) x frame_stride for wma, so the agent already moves); num_blocks (mg2): blocks to generate
    (default: the preset's);
    sample_seed: the seed of the sampling noise (default: `seed`)."""
    wl = _workload(workload)
    p = pipe.preset
    if not is_world_preset(p) or not wl.owns_preset(p) or (p.height, p.width) != (VIEW, VIEW):
        raise ValueError(f"the pipeline's preset {p.name!r} is not a world preset of workload {wl.name!r} making "
                         f"{VIEW}x{VIEW} frames (what wmbook.world renders)")
    sample_seed = seed if sample_seed is None else sample_seed
    _check_seed(seed)
    return wl.world_case(pipe, lambda n: heldout_episode(seed, n), seed, start, num_blocks, sample_seed)


def predict(workload, pipe, case: Case, *, return_output: bool = False, **sampling):
    """Run the pipeline on a case -> uint8 [T, H, W, 3] aligned with `case.target` (and the pipeline's output object
    when return_output=True). `sampling` goes unchanged to CausalStreamingPipeline.generate (mg2) or
    WMAInteractionPipeline.run_iteration (wma)."""
    wl = _workload(workload)
    if wl.name != case.workload:
        raise ValueError(f"case is a {case.workload!r} case, not {wl.name!r}")
    video, out = wl.world_predict(pipe, case, **sampling)
    if video.shape != case.target.shape:
        raise ValueError(f"prediction {video.shape} does not match the target {case.target.shape}")
    return (video, out) if return_output else video


def copy_last(case: Case) -> np.ndarray:
    """The copy-last-frame baseline: the last conditioning frame repeated for every target frame."""
    return np.repeat(case.last[None], case.target.shape[0], axis=0)


def _as_video(x, name: str) -> np.ndarray:
    a = np.asarray(x)
    if a.ndim == 3:
        a = a[None]
    if a.ndim != 4 or a.shape[-1] != 3 or a.dtype != np.uint8:
        raise ValueError(f"{name} must be uint8 [T, H, W, 3]; got {a.dtype} {a.shape}")
    return a


def psnr(a, b) -> np.ndarray:
    """Per-frame PSNR (dB, peak 255) of two uint8 videos [T, H, W, 3]; inf where identical."""
    return frame_psnr(_as_video(a, "a"), _as_video(b, "b"))


def ssim(a, b) -> np.ndarray:
    """Per-frame SSIM of two uint8 videos [T, H, W, 3] (per colour channel, averaged; see the module docstring)."""
    a, b = _as_video(a, "a"), _as_video(b, "b")
    if a.shape != b.shape:
        raise ValueError(f"shapes differ: {a.shape} vs {b.shape}")
    x = torch.from_numpy(a).double().permute(0, 3, 1, 2).reshape(-1, 1, *a.shape[1:3])
    y = torch.from_numpy(b).double().permute(0, 3, 1, 2).reshape(-1, 1, *b.shape[1:3])
    r = torch.arange(11, dtype=torch.float64) - 5
    g = torch.exp(-(r**2) / (2 * 1.5**2))
    g = g / g.sum()
    w = (g[:, None] * g[None, :])[None, None]

    def f(z):
        return torch.nn.functional.conv2d(z, w)  # valid windows only

    c1, c2 = (0.01 * 255) ** 2, (0.03 * 255) ** 2
    mx, my = f(x), f(y)
    sxx, syy, sxy = f(x * x) - mx**2, f(y * y) - my**2, f(x * y) - mx * my
    s = ((2 * mx * my + c1) * (2 * sxy + c2)) / ((mx**2 + my**2 + c1) * (sxx + syy + c2))
    return s.mean(dim=(1, 2, 3)).view(a.shape[0], 3).mean(dim=1).numpy()


def score(pred, case: Case) -> dict:
    """PSNR, SSIM and the agent-position error of a prediction against a case's ground truth (module docstring)."""
    pred = _as_video(pred, "pred")
    if pred.shape != case.target.shape:
        raise ValueError(f"pred has shape {pred.shape}; the case's target is {case.target.shape}")
    p = psnr(pred, case.target)
    det = locate_agent(pred)
    vis = case.target_visible >= 0.5
    diag = float(np.hypot(*pred.shape[1:3]))
    err = np.linalg.norm(det - case.target_xy, axis=1)
    found = ~np.isnan(err)
    err = np.where(found, err, diag)
    return {"psnr": float(np.mean(np.minimum(p, 100.0))), "ssim": float(np.mean(ssim(pred, case.target))),
            "agent_err_px": float(err[vis].mean()) if vis.any() else float("nan"),
            "agent_found": float(found[vis].mean()) if vis.any() else float("nan"), "frames": int(pred.shape[0])}


SCORE_COLUMNS = ("psnr", "ssim", "agent_err_px", "agent_found")
STEPS_RULE = ("the fewest DDIM steps whose mean PSNR and SSIM beat copy-last's and whose mean agent error is at most "
              "half of copy-last's, on the selection episodes, each mean taken over at least 4 draws of the sampling "
              "noise and moved against the model by its standard error over the draws")
# A step count's scores move with the sampling noise: on the shipped world-wma weights the agent error at 2 steps,
# averaged over the same eight episodes, ranged 3.2-9.4 px over eight draws against a 5.7 px limit, so a single draw,
# or a mean that clears the limit by less than its own standard error, passes or fails by the luck of the draw.
MIN_DRAWS = 4
DRAW_SEED_STRIDE = 10_000  # draw k of episode e samples with seed e + k * stride: draw 0 is the episode's own seed


def sample_seed_of(seed: int, draw: int) -> int:
    """The sampling-noise seed of draw `draw` of episode `seed` (draw 0: the episode's seed, heldout_case's
    default)."""
    _check_seed(seed)
    if isinstance(draw, bool) or not isinstance(draw, (int, np.integer)) or not 0 <= draw:
        raise ValueError(f"draw={draw!r} is not allowed; allowed values: an integer >= 0")
    return int(seed) + int(draw) * DRAW_SEED_STRIDE
SHIPPING_RULE = ("weights ship when, on held-out episodes, their mean PSNR and SSIM beat copy-last's and their mean "
                 "agent error is at most half of copy-last's")


def shipping_failures(model, copy_last) -> list[str]:
    """Why mean scores (dicts or rows with psnr, ssim, agent_err_px) fail the comparison with copy-last's that both
    STEPS_RULE and SHIPPING_RULE make; [] when they pass. A missing or NaN score fails."""
    def get(r, k):
        v = r.get(k) if hasattr(r, "get") else None
        return float(v) if v is not None else float("nan")

    fails = []
    for key, name in (("psnr", "PSNR"), ("ssim", "SSIM")):
        m, b = get(model, key), get(copy_last, key)
        if not m > b:
            fails.append(f"{name} {m:.4g} is not above copy-last's {b:.4g}")
    m, b = get(model, "agent_err_px"), get(copy_last, "agent_err_px")
    if not m <= b / 2:
        fails.append(f"agent error {m:.4g} px is not at most half of copy-last's {b:.4g} px")
    return fails


def summarize(rows) -> "pd.DataFrame":
    """Per-episode score rows (`prediction`, `seed`, optionally `draw`, and score()'s keys;
    tools/world_steps_eval.py) -> one row per prediction, in first-seen order: the mean over episodes and draws of
    each score (NaN-skipping: an episode without a visible agent has no agent error)."""
    import pandas as pd  # noqa: PLC0415  heavy: pandas, only for summaries

    df = pd.DataFrame(rows)
    cols = [c for c in SCORE_COLUMNS if c in df]
    return df.groupby("prediction", sort=False)[cols].agg(lambda v: float(np.nanmean(v)))


def draw_means(rows) -> "pd.DataFrame":
    """Score rows -> the mean over episodes per prediction and sampling draw (rows without a `draw` are draw 0):
    index (prediction, draw), one column per score."""
    import pandas as pd  # noqa: PLC0415  heavy: pandas, only for summaries

    df = pd.DataFrame(rows)
    if "draw" not in df:
        df = df.assign(draw=0)
    cols = [c for c in SCORE_COLUMNS if c in df]
    return df.groupby(["prediction", "draw"], sort=False)[cols].agg(lambda v: float(np.nanmean(v)))


def choose_steps(rows, *, min_draws: int = MIN_DRAWS) -> dict:
    """The sampling step count a world-wma model ships with, chosen on selection episodes (never the held-out ones)
    by STEPS_RULE: {"chosen": the step count or None, "rule", "table" (summarize: means over episodes and draws),
    "passing": labels, "draws": how many sampling draws the rows hold, "spread": per prediction and score the lowest
    and highest of the draws' means, "sem": the standard error of each mean over the draws, "cautious": the means
    moved against the model by it (what the rule compares), "draws_passing": per step-count label, in how many single
    draws it would pass}.
    The predictions are labelled 'ddim N' (with ', eta E' when an eta was given) beside a 'copy-last' row (the
    copy-last baseline draws nothing, so one draw of it serves every draw). Refused with fewer than `min_draws`
    draws of the step counts."""
    table = summarize(rows)
    if "copy-last" not in table.index:
        raise ValueError("rows have no 'copy-last' prediction to compare with")
    per_draw = draw_means(rows)
    steps = [lab for lab in table.index if re.fullmatch(r"ddim (\d+)(, eta .*)?", str(lab))]
    draws = min((len(per_draw.loc[lab]) for lab in steps), default=0)
    if draws < min_draws:
        raise ValueError(f"the rows hold {draws} sampling draw(s) of each step count; the rule needs at least "
                         f"min_draws={min_draws} (tools/world_steps_eval.py --draws)")
    base = table.loc["copy-last"]
    # the standard error of each mean over the draws (0 for one draw): the part of the mean the noise can move
    sem = per_draw.groupby(level="prediction", sort=False).agg(
        lambda v: float(np.std(v, ddof=1) / np.sqrt(len(v))) if len(v) > 1 else 0.0)
    worse = {"psnr": -1.0, "ssim": -1.0, "agent_err_px": 1.0}  # the direction in which a score gets worse
    cautious = table.copy()
    for col, sign in worse.items():
        if col in cautious:
            cautious[col] = table[col] + sign * sem[col].reindex(table.index).fillna(0.0)
    passing, draws_passing = [], {}
    for label in steps:
        draws_passing[label] = sum(not shipping_failures(r, base) for _, r in per_draw.loc[label].iterrows())
        if not shipping_failures(cautious.loc[label], base):
            passing.append((int(re.fullmatch(r"ddim (\d+).*", label).group(1)), label))
    passing.sort()
    spread = per_draw.groupby(level="prediction", sort=False).agg(["min", "max"])
    return {"chosen": passing[0][0] if passing else None, "rule": STEPS_RULE, "table": table,
            "passing": [lab for _, lab in passing], "draws": draws, "spread": spread, "sem": sem,
            "cautious": cautious, "draws_passing": draws_passing}
