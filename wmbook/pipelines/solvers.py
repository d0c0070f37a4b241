"""Samplers for step-count reduction (notebook 03): the choices both pipelines accept besides their reference sampler,
and the step axes notebook 03 sweeps.

UNet world model (`WMAInteractionPipeline.run_iteration(solver=..., decision_steps=..., world_steps=...)`):

  ddim         the reference (default): `ddim.DDIMTable` / `ddim_update`, v-prediction on zero-terminal-SNR
               scaled-linear betas, trailing timesteps, eta (1 upstream) and DynamiCrafter's dynamic pred-x0 rescale.
  dpmsolver++  diffusers' DPMSolverMultistepScheduler, 2M (order 2, data prediction, ODE).
  unipc        diffusers' UniPCMultistepScheduler (order 2, bh2, predictor-corrector, ODE).

  Both are configured from the preset like `ddim.video_scheduler`: the same betas (scaled-linear, rescaled to zero
  terminal SNR), v-prediction, trailing spacing (so the same timesteps as DDIM at every step count: 999, 979, ..., 19
  at 50), and their last step ends at alpha_bar[0] like the reference (`final_sigmas_type="sigma_min"`, DDIM's
  `set_alpha_to_one=False`). What they cannot reproduce:
  - eta: they integrate the probability-flow ODE (eta 0); the reference adds fresh noise every step (eta 1). At equal
    steps they therefore reach a different sample from the same initial noise, not a more or less accurate one of the
    same; their deviation from the reference's full-step output includes that.
  - the dynamic rescale (pred_x0 * scale(t_prev) / scale(t), 0.7 -> 1 over t < 400): a multistep solver combines x0
    predictions of several timesteps and has no hook for a per-step data scale; the model's x0 is used as predicted.
  - zero terminal SNR: alpha_bar[999] = 0 makes the noise-to-data log-SNR -inf; diffusers replaces it with 2^-24 in
    both schedulers (a first step from alpha = 2^-12 instead of 0: finite, no NaN; DDIM's update in `DDIMTable` avoids
    its NaN its own way).
  The action and state heads keep their own DDIM (epsilon, squaredcos_cap_v2) stepped at the video's timesteps, as
  the reference does; every solver has the same timesteps, so the heads step identically under all three.

Causal DiT (`CausalStreamingPipeline.generate(denoising_steps=..., shift=..., solver=...)`): each block is denoised
over a short list of nominal steps (e.g. [1000, 666, 333]) warped onto the shift-5 flow-matching schedule
(`causal.warped_timesteps`); every forward predicts x0, the block's clean latent is the last forward's x0 (what the
cache refresh and the decoder see), and only how the next forward's input is formed differs:

  renoise  the reference (default), as Self-Forcing / Matrix-Game-2: fresh Gaussian noise to the next sigma,
           x_next = (1 - s_next) x0 + s_next eps. (diffusers' FlowMatchEulerDiscreteScheduler with
           stochastic_sampling=True computes the same update; the pipeline keeps its own two lines.)
  euler    diffusers' FlowMatchEulerDiscreteScheduler (deterministic): the flow-matching Euler ODE step
           x_next = x + (s_next - s) v with v = (x - x0) / s, i.e. x0 + s_next / s (x - x0): the block's own noise
           is carried along instead of replaced.
  unipc    diffusers' UniPCMultistepScheduler with flow sigmas (flow_prediction, order 2, bh2): multistep over the
           block's x0 predictions, history reset every block.

  What is comparable: every solver runs the same forwards (one per nominal step plus the refresh) at the same warped
  timesteps, so the time per block is the same at equal steps and only the quality differs. What is not: Self-Forcing
  generators are distilled (DMD) for the re-noising sampler on their own schedule; Euler and UniPC integrate an ODE the
  few-step generator was never trained to follow, so at real checkpoints they are expected to be worse, not better.
  With one step all three are the same forward; with two, UniPC's first step is order 1 and equals Euler.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

WMA_SOLVERS = ("ddim", "dpmsolver++", "unipc")  # the first is the reference
FLOW_SOLVERS = ("renoise", "euler", "unipc")


def check_solver(solver, allowed: tuple[str, ...], name: str = "solver") -> str:
    if not isinstance(solver, str) or solver not in allowed:
        raise ValueError(f"{name}={solver!r} is not allowed; allowed values: {list(allowed)}")
    return solver


def check_steps(value, hi: int, name: str) -> int:
    """A step count: an int in [1, hi]."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 1 <= value <= hi:
        raise ValueError(f"{name}={value!r} is not allowed; allowed values: an integer in [1, {hi}]")
    return int(value)


def check_step_list(steps, num_train_timesteps: int = 1000, name: str = "denoising_steps") -> tuple[int, ...]:
    """Nominal denoising steps of one block: a non-empty, strictly decreasing sequence of ints in (0, T]."""
    allowed = f"a non-empty, strictly decreasing list of integers in [1, {num_train_timesteps}], e.g. [1000, 666, 333]"
    if isinstance(steps, (str, bytes)) or not hasattr(steps, "__iter__"):
        raise ValueError(f"{name}={steps!r} is not allowed; allowed values: {allowed}")
    out = tuple(steps)
    if not out or any(isinstance(s, bool) or not isinstance(s, (int, np.integer)) or not 0 < s <= num_train_timesteps
                      for s in out) or any(a <= b for a, b in zip(out[:-1], out[1:])):
        raise ValueError(f"{name}={steps!r} is not allowed; allowed values: {allowed}")
    return tuple(int(s) for s in out)


def check_shift(shift, name: str = "shift") -> float:
    if isinstance(shift, bool) or not isinstance(shift, (int, float, np.integer, np.floating)) \
            or not math.isfinite(shift) or shift <= 0:
        raise ValueError(f"{name}={shift!r} is not allowed; allowed values: a finite number > 0")
    return float(shift)


# --- UNet world model -----------------------------------------------------------------------------------------


def video_solver(p, solver: str):
    """A diffusers multistep scheduler for the video latents, configured from the preset like the reference DDIM."""
    from diffusers import DPMSolverMultistepScheduler, UniPCMultistepScheduler  # noqa: PLC0415  heavy: diffusers

    check_solver(solver, WMA_SOLVERS[1:])
    common = dict(num_train_timesteps=p.num_train_timesteps, beta_start=p.beta_start, beta_end=p.beta_end,
                  beta_schedule=p.beta_schedule, rescale_betas_zero_snr=p.rescale_betas_zero_snr,
                  prediction_type=p.prediction_type, timestep_spacing=p.timestep_spacing, steps_offset=0,
                  final_sigmas_type="sigma_min", solver_order=2, lower_order_final=True)
    if solver == "dpmsolver++":
        return DPMSolverMultistepScheduler(algorithm_type="dpmsolver++", solver_type="midpoint", **common)
    return UniPCMultistepScheduler(predict_x0=True, solver_type="bh2", **common)


# --- causal DiT ------------------------------------------------------------------------------------------------


class FlowStepper:
    """The step between two forwards of one block for the `euler` and `unipc` flow solvers (diffusers schedulers on
    the block's warped timesteps `ts`, sigma = t / 1000, last sigma 0); `reset()` at every block."""

    def __init__(self, solver: str, ts: list[float], num_train_timesteps: int = 1000):
        from diffusers import (  # noqa: PLC0415  heavy: diffusers
            FlowMatchEulerDiscreteScheduler,
            UniPCMultistepScheduler,
        )

        check_solver(solver, FLOW_SOLVERS[1:])
        self.solver = solver
        self.sigmas = [float(t) / num_train_timesteps for t in ts]
        if solver == "euler":  # shift 1: the sigmas given are already warped
            self.sched = FlowMatchEulerDiscreteScheduler(num_train_timesteps=num_train_timesteps, shift=1.0)
        else:
            self.sched = UniPCMultistepScheduler(num_train_timesteps=num_train_timesteps, use_flow_sigmas=True,
                                                 flow_shift=1.0, prediction_type="flow_prediction", solver_order=2,
                                                 solver_type="bh2", lower_order_final=True, final_sigmas_type="zero")
        self.reset()

    def reset(self) -> None:
        self.sched.set_timesteps(sigmas=np.array(self.sigmas, dtype=np.float64))  # host-side tables (a fresh copy)
        self.sched.set_begin_index(0)

    def next(self, j: int, x: torch.Tensor, x0: torch.Tensor) -> torch.Tensor:
        """The input of forward j + 1 from forward j's input `x` and its x0 prediction (the flow the model gave,
        recovered as (x - x0) / sigma_j)."""
        s = self.sched.sigmas[j]
        xf = x.float()
        flow = (xf - x0.float()) / s
        return self.sched.step(flow, self.sched.timesteps[j], xf).prev_sample.to(x0.dtype)


# --- the step axes notebook 03 sweeps (one per pipeline kind; a workload hands out its own: Workload.step_axis) ----


@dataclass(frozen=True)
class StepPoint:
    """One sampling configuration of a sweep. `steps`: the nominal step list of a block (flow) or (decision steps,
    world-model steps) (UNet); `shift`: the flow warp (flow only); `group`: the curve it belongs to."""

    solver: str
    steps: tuple[int, ...]
    shift: float | None = None
    group: str = ""
    eta: float | None = None  # UNet DDIM only; None: the preset's

    @property
    def label(self) -> str:
        if self.shift is None:
            d, w = self.steps
            return f"{self.solver} {d}+{w}" + (f" eta {self.eta:g}" if self.eta is not None else "")
        return f"{self.solver} [{','.join(map(str, self.steps))}] shift {self.shift:g}"


@dataclass
class SampleRun:
    """One timed sampling run: what the deviation is computed on, and its device-event time."""

    frames: torch.Tensor  # decoded frames [B, 3, T, H, W] in [-1, 1]
    actions: torch.Tensor | None  # the decision pass's action chunk (UNet), else None
    run_ms: float  # the whole run (an interaction iteration, or a generation of all blocks)
    value: float  # the workload's sweep metric: s per iteration, or FPS over the steady blocks


def _items(v) -> list:
    """A comma-separated string, a sequence, or one scalar (`-p steps 20` arrives as an int) -> items."""
    if isinstance(v, str):
        return [x.strip() for x in v.split(",") if x.strip()]
    return list(v) if isinstance(v, (list, tuple)) else [v]


def _int_list(v, name: str) -> list[int]:
    items = _items(v)
    try:
        out = [int(x) for x in items]
        if any(isinstance(x, bool) or float(x) != int(x) for x in items):
            out = []
    except (TypeError, ValueError):
        out = []
    if not out:
        raise ValueError(f"{name}={v!r} is not allowed; allowed values: 'auto' or comma-separated positive integers")
    return out


class _StepAxis:
    """What a workload's step axis declares (class keywords): its solvers (the first is the reference sampler), the
    metric a point is timed in (name, unit, whether higher is better, how a sentence names it), what its forwards
    count, whether it sweeps a flow shift and whether its two passes are swept apart."""

    def __init_subclass__(cls, *, solvers, metric: tuple[str, str, bool, str], forwards_label: str, has_shift: bool,
                          has_passes: bool, **kw):
        super().__init_subclass__(**kw)
        cls.solvers = solvers
        cls.metric, cls.unit, cls.higher_is_better, cls.metric_label = metric
        cls.forwards_label, cls.has_shift, cls.has_passes = forwards_label, has_shift, has_passes


class UNetStepAxis(_StepAxis, solvers=WMA_SOLVERS, metric=("iteration_s", "s", False, "s per interaction iteration"),
                   forwards_label="UNet forwards per iteration", has_shift=False, has_passes=True):
    """The UNet world model: DDIM step counts per pass, the diffusers multistep solvers, each pass alone."""

    REAL_DDIM = (50, 30, 20, 16, 10, 5)
    REAL_SOLVER = (20, 10, 5)
    PASS_ALONE_MAX = 20  # each pass alone is swept at the counts up to this (the other pass at full steps)

    def reference(self, preset, eta: float | None = None) -> StepPoint:
        n = preset.default_steps
        return StepPoint("ddim", (n, n), None, "ddim", eta)

    def stochastic(self, preset, eta: float | None = None) -> bool:
        """Whether the reference sampler draws fresh noise every step (DDIM with eta > 0)."""
        return (preset.ddim_eta if eta is None else eta) > 0

    def parse_eta(self, v, preset, name: str = "eta"):
        if v == "auto":
            return None
        if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)) or not 0 <= v <= 1:
            raise ValueError(f"{name}={v!r} is not allowed; allowed values: 'auto' or a number in [0, 1]")
        return float(v)

    def default_counts(self, preset, solver: str) -> list[int]:
        full = preset.default_steps
        if full <= 5:  # tiny presets: every count down to 1
            return list(range(full, 0, -1))
        grid = self.REAL_DDIM if solver == "ddim" else self.REAL_SOLVER
        # a trained preset's shipped count (world-wma's sample_steps) is on every curve: the sweep shows where it ships
        grid = (*grid, *((preset.sample_steps,) if 0 < getattr(preset, "sample_steps", 0) < full else ()))
        return sorted({full, *(c for c in grid if c < full)} if solver == "ddim" else
                      {c for c in grid if c <= full}, reverse=True)

    def parse_steps(self, v, preset, name: str = "steps"):
        """'auto' -> None; else comma-separated step counts per pass (every solver)."""
        if v == "auto":
            return None
        counts = _int_list(v, name)
        for c in counts:
            check_steps(c, preset.num_train_timesteps, name)
        return tuple(sorted(set(counts), reverse=True))

    def parse_shifts(self, v, preset, name: str = "shifts"):
        if v != "auto":
            raise ValueError(f"{name}={v!r} is not allowed for this workload (no flow-matching shift); "
                             f"allowed values: ['auto']")
        return None

    def points(self, preset, solvers, counts, shifts, split: bool, eta: float | None = None) -> list[StepPoint]:
        ref = self.reference(preset, eta)
        full = ref.steps[1]
        out = []
        for s in solvers:
            for c in (counts if counts is not None else self.default_counts(preset, s)):
                out.append(StepPoint(s, (c, c), None, s, eta if s == "ddim" else None))
        if split and self.solvers[0] in solvers:
            s = self.solvers[0]
            alone = [c for c in (counts if counts is not None else self.default_counts(preset, s))
                     if c < full and (c <= self.PASS_ALONE_MAX or preset.default_steps <= 5)]
            out += [StepPoint(s, (c, full), None, f"{s}, decision pass only", eta) for c in alone]
            out += [StepPoint(s, (full, c), None, f"{s}, world-model pass only", eta) for c in alone]
        return out

    def forwards(self, point: StepPoint) -> int:
        return sum(point.steps)

    def kwargs(self, point: StepPoint) -> dict:
        """The keyword arguments of `WMAInteractionPipeline.run_iteration` for this point."""
        kw = {"solver": point.solver, "decision_steps": point.steps[0], "world_steps": point.steps[1]}
        return kw | ({"eta": point.eta} if point.eta is not None else {})

    def prepare(self, pipe, seed: int, blocks: int = 0):
        return pipe.prepare(seed=seed)

    def run(self, pipe, inputs, point: StepPoint) -> SampleRun:
        out = pipe.run_iteration(inputs, progress=False, **self.kwargs(point))
        return SampleRun(frames=out.world.frames, actions=out.decision.actions, run_ms=out.iteration_ms,
                         value=out.iteration_ms / 1e3)


class FlowStepAxis(_StepAxis, solvers=FLOW_SOLVERS, metric=("fps", "frames/s", True, "FPS"),
                   forwards_label="DiT forwards per block (with the cache refresh)", has_shift=True, has_passes=False):
    """The causal DiT: nominal step lists per block, the flow-matching shift, the flow solvers."""

    # from many steps down to one: 8 (a flow model trained without distillation may want more than the 3-4 of
    # Self-Forcing), Self-Forcing's 4, Matrix-Game-2's 3, 2, 1
    STEP_LISTS = ((1000, 875, 750, 625, 500, 375, 250, 125), (1000, 750, 500, 250), (1000, 666, 333), (1000, 500),
                  (1000,))
    SHIFTS = (3.0, 8.0)  # besides the preset's (5)

    def reference(self, preset, eta: float | None = None) -> StepPoint:
        return StepPoint("renoise", tuple(preset.denoising_steps), float(preset.shift), "renoise")

    def stochastic(self, preset, eta: float | None = None) -> bool:
        return True  # the re-noising sampler draws fresh noise before every forward but the first

    def parse_eta(self, v, preset, name: str = "eta"):
        if v != "auto":
            raise ValueError(f"{name}={v!r} is not allowed for this workload (no DDIM eta); allowed values: ['auto']")
        return None

    def parse_steps(self, v, preset, name: str = "steps"):
        """'auto' -> None; else step lists separated by ';', each comma-separated ('1000,500;1000')."""
        if v == "auto":
            return None
        if not isinstance(v, str) or not v.strip():
            raise ValueError(f"{name}={v!r} is not allowed; allowed values: 'auto' or step lists separated by ';', "
                             f"e.g. '1000,750,500,250;1000,500;1000'")
        lists = []
        for part in v.split(";"):
            if part.strip():
                lists.append(check_step_list(_int_list(part, name), getattr(preset, "num_train_timesteps", 1000), name))
        return tuple(dict.fromkeys(lists))

    def parse_shifts(self, v, preset, name: str = "shifts"):
        """'auto' -> None (the preset's shift and SHIFTS), 'none' -> () (the preset's only), else comma-separated."""
        if v == "auto":
            return None
        if v == "none":
            return ()
        items = _items(v)
        try:
            vals = [float(x) for x in items if not isinstance(x, bool)]
        except (TypeError, ValueError):
            vals = []
        if not vals:
            raise ValueError(f"{name}={v!r} is not allowed; allowed values: 'auto', 'none' or comma-separated "
                             f"numbers > 0")
        return tuple(check_shift(x, name) for x in vals)

    def points(self, preset, solvers, lists, shifts, split: bool, eta: float | None = None) -> list[StepPoint]:
        lists = lists if lists is not None else self.STEP_LISTS
        base = float(preset.shift)
        out = [StepPoint(s, sl, base, s) for s in solvers for sl in lists]
        extra = [x for x in (self.SHIFTS if shifts is None else shifts) if x != base]
        s = self.solvers[0]
        if s in solvers:  # the warp matters only with more than one step
            out += [StepPoint(s, sl, x, f"{s}, shift {x:g}") for x in extra for sl in lists if len(sl) > 1]
        return out

    def forwards(self, point: StepPoint) -> int:
        return len(point.steps) + 1

    def kwargs(self, point: StepPoint) -> dict:
        """The keyword arguments of `CausalStreamingPipeline.generate` for this point."""
        return {"solver": point.solver, "denoising_steps": tuple(point.steps), "shift": point.shift}

    def prepare(self, pipe, seed: int, blocks: int = 0):
        return pipe.prepare(blocks or None, seed=seed)

    def run(self, pipe, inputs, point: StepPoint) -> SampleRun:
        out = pipe.generate(inputs, progress=False, **self.kwargs(point))
        return SampleRun(frames=out.frames, actions=None, run_ms=out.total_ms, value=out.metrics()["fps"])
