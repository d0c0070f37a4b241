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

from dataclasses import dataclass

import numpy as np
import torch

from .env import locate_agent, render_episode
from .weights import is_world_preset

__all__ = ["Case", "HELDOUT_BASE", "copy_last", "heldout_case", "heldout_episode", "is_world_preset", "predict",
           "psnr", "score", "ssim"]

HELDOUT_BASE = 10**9


@dataclass
class Case:
    """One held-out prediction problem."""

    workload: str  # "mg2" | "wma"
    seed: int  # held-out index (episode seed HELDOUT_BASE + seed)
    start: int  # the last conditioning frame's index in the episode
    inputs: object  # StreamInputs (mg2) | WMAInputs (wma)
    target: np.ndarray  # uint8 [T, H, W, 3] ground-truth frames to predict
    target_xy: np.ndarray  # float32 [T, 2] the agent's true positions in them
    target_visible: np.ndarray  # float32 [T] visible fraction of the agent's sprite
    last: np.ndarray  # uint8 [H, W, 3] the last conditioning frame (copy-last baseline)
    world_actions: torch.Tensor | None = None  # wma: [1, T, A] the true actions for the world-model pass
    num_blocks: int | None = None  # mg2


def _workload_name(workload) -> str:
    name = getattr(workload, "name", workload)
    if name not in ("mg2", "wma"):
        raise ValueError(f"workload={name!r} is not allowed; allowed values: ['mg2', 'wma']")
    return name


def heldout_episode(seed: int, num_frames: int):
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed={seed!r} is not allowed; allowed values: an integer >= 0")
    return render_episode(HELDOUT_BASE + int(seed), num_frames)


def heldout_case(workload, pipe, seed: int, *, start: int | None = None, num_blocks: int | None = None,
                 sample_seed: int | None = None) -> Case:
    """The pipeline inputs of held-out episode `seed` and the ground truth to score a prediction against.

    start: index of the last conditioning frame (default: 0 for mg2, an episode's start with the agent at rest;
    n_obs + 6 for wma, so the agent already moves); num_blocks (mg2): blocks to generate (default: the preset's);
    sample_seed: the seed of the sampling noise (default: `seed`)."""
    from .env import VIEW

    from .weights import workload_of

    wl = _workload_name(workload)
    p = pipe.preset
    if not is_world_preset(p) or workload_of(p) != wl or (p.height, p.width) != (VIEW, VIEW):
        raise ValueError(f"the pipeline's preset {p.name!r} is not a world preset of workload {wl!r} making "
                         f"{VIEW}x{VIEW} frames (what wmbook.world renders)")
    sample_seed = seed if sample_seed is None else sample_seed
    dev = pipe.device
    if wl == "mg2":
        from ..models.vae import pixel_frames_for

        nb = p.default_blocks if num_blocks is None else num_blocks
        if isinstance(nb, bool) or not isinstance(nb, int) or nb < 1:
            raise ValueError(f"num_blocks={num_blocks!r} is not allowed; allowed values: a positive integer")
        start = 0 if start is None else start
        if isinstance(start, bool) or not isinstance(start, int) or start < 0:
            raise ValueError(f"start={start!r} is not allowed; allowed values: an integer >= 0")
        n_pix = pixel_frames_for(nb * p.num_frame_per_block, True)
        ep = heldout_episode(seed, start + n_pix)
        sl = slice(start, start + n_pix)
        img = torch.from_numpy(ep.frames[start]).permute(2, 0, 1).float() / 127.5 - 1
        inputs = pipe.prepare(nb, image=img, seed=sample_seed)
        if inputs.actions is not None:
            inputs.actions = {"keyboard": torch.from_numpy(ep.keyboard[sl])[None].to(dev, pipe.dtype),
                              "mouse": torch.from_numpy(ep.mouse[sl])[None].to(dev, pipe.dtype)}
        tgt = slice(start + 1, start + n_pix)
        return Case(workload=wl, seed=int(seed), start=start, inputs=inputs, target=ep.frames[tgt],
                    target_xy=ep.agent_xy[tgt], target_visible=ep.agent_visible[tgt], last=ep.frames[start],
                    num_blocks=nb)
    from ..pipelines.ddim import DEFAULT_INSTRUCTION, WMAInputs

    if num_blocks is not None:
        raise ValueError("num_blocks is an mg2 option; the wma workload predicts the preset's `frames` frames")
    n_obs, t = p.n_obs_steps, p.frames
    start = n_obs + 6 if start is None else start
    if isinstance(start, bool) or not isinstance(start, int) or start < n_obs - 1:
        raise ValueError(f"start={start!r} is not allowed; allowed values: an integer >= {n_obs - 1}")
    if p.agent_state_dim != ep_dims()[0] or p.agent_action_dim != ep_dims()[1]:
        raise ValueError(f"preset {p.name!r} has state/action dims {p.agent_state_dim}/{p.agent_action_dim}; the "
                         f"world's are {ep_dims()}")
    ep = heldout_episode(seed, start + t + 1)
    obs = slice(start - n_obs + 1, start + 1)
    images = torch.from_numpy(ep.frames[obs]).permute(3, 0, 1, 2).float() / 127.5 - 1  # [3, n_obs, H, W]
    inputs = WMAInputs(seed=sample_seed, observation_images=images[None].to(dev),
                       observation_states=torch.from_numpy(ep.state[obs])[None].to(dev),
                       actions=torch.zeros(1, p.horizon, p.agent_action_dim, device=dev),
                       instruction=DEFAULT_INSTRUCTION)
    acts = torch.from_numpy(ep.action[start:start + t])[None].to(dev)
    tgt = slice(start + 1, start + t + 1)
    return Case(workload=wl, seed=int(seed), start=start, inputs=inputs, target=ep.frames[tgt],
                target_xy=ep.agent_xy[tgt], target_visible=ep.agent_visible[tgt], last=ep.frames[start],
                world_actions=acts)


def ep_dims() -> tuple[int, int]:
    from .env import ACTION_DIM, STATE_DIM

    return STATE_DIM, ACTION_DIM


def predict(workload, pipe, case: Case, *, return_output: bool = False, **sampling):
    """Run the pipeline on a case -> uint8 [T, H, W, 3] aligned with `case.target` (and the pipeline's output object
    when return_output=True). `sampling` goes unchanged to CausalStreamingPipeline.generate (mg2) or
    WMAInteractionPipeline.run_iteration (wma)."""
    wl = _workload_name(workload)
    if wl != case.workload:
        raise ValueError(f"case is a {case.workload!r} case, not {wl!r}")
    if wl == "mg2":
        out = pipe.generate(case.inputs, progress=False, **sampling)
        video = pipe.postprocess(out.frames)[1:]
    else:
        from ..pipelines.ddim import to_uint8_video

        out = pipe.run_iteration(case.inputs, world_actions=case.world_actions, progress=False, **sampling)
        video = to_uint8_video(out.world.frames)
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
    a, b = _as_video(a, "a"), _as_video(b, "b")
    if a.shape != b.shape:
        raise ValueError(f"shapes differ: {a.shape} vs {b.shape}")
    mse = ((a.astype(np.float64) - b.astype(np.float64)) ** 2).mean(axis=(1, 2, 3))
    with np.errstate(divide="ignore"):
        return 10 * np.log10(255.0**2 / mse)


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
