"""The `motion` workload: reference-motion loading for thousands of simulated robots (seed 003; wmbook.motion).

Unit of work: one environment step's fetch, `MotionDataTerm.fetch()`: for every robot (and each of its fetched
frames) the state of its reference clip at its current time, interpolated between two frames and expressed in its root
frame. Metric: ms per step's fetch (lower is better), against the bytes it must move at the measured copy bandwidth.
Notebook 07 (wmbook.studies.motion) is its notebook; the world-model notebooks (01-06) need a denoiser and do not
apply to it.
"""

from __future__ import annotations

import torch

from ..motion.fetch import FETCH_LABEL, STATE_LABEL, STATE_STAGES, MotionDataTerm, sample_queries, state_layout
from ..motion.library import MotionLibrary, generate
from ..motion.presets import MOTION_PRESETS
from ..motion.variants import known
from ..params import Param, check_fits, integer
from .base import E2ESize, GraphTarget, Labels, Metric, Probe, Workload

# floating-point operations per query of the fetch, counted on wmbook.motion.kernel (the fused kernel's arithmetic):
# frame blend ~15, lerp 3 per linear value, slerp ~60 per quaternion (acos polynomial, three sines, weights, blend,
# sign), the inverse rotation of a vector 18 (+3 for the body positions' offset), a quaternion product 28
_FLOPS_BLEND, _FLOPS_SLERP, _FLOPS_ROTATE, _FLOPS_QUAT_MUL = 15, 60, 18, 28


def _count(v, ctx):
    """0 -> the preset's value of the parameter (num_envs, frames_per_env); a count whose queries' states cannot fit
    on the device refused before anything is allocated."""
    name, p = ctx["_name"], ctx["preset"]
    n = integer(0)(v, ctx) or getattr(p, name)
    # each query's state row in fp32, about three times (the term's state, the output rows, a variant's copy)
    row = 3 * 4 * state_layout(p.num_joints, p.num_bodies).width
    other = ctx.get("num_envs", 1) if name == "frames_per_env" else 1
    check_fits(name, n, row * other, ctx["device"], "robot" if name == "num_envs" else "frame per robot")
    return n


class MotionWorkload(Workload):
    name = "motion"
    title = "motion-data loading for simulated robots (Unitree G1 reference motions)"
    presets = dict(MOTION_PRESETS)
    real_preset = "g1-4096"
    tiny_preset = "tiny-motion"
    features = frozenset({"motion"})
    forward_name = "motion fetch"
    metric = Metric("fetch_ms", "ms", False, "ms per step's fetch")
    labels = Labels(region=FETCH_LABEL, forward=STATE_LABEL, fine=STATE_STAGES)
    params = (Param("num_envs", 0, _count, "robots fetching each step; 0: the preset's (4096 at g1-4096)"),
              Param("frames_per_env", 0, _count, "states fetched per robot per step (now, then future steps); 0: the "
                                                 "preset's"))
    # notebook 07's goals at g1-4096 (H100): the fetch at least 10x faster than the eager reference and within 2x of
    # the bytes it must move at the measured copy bandwidth
    goals = {"fetch_speedup": 10.0, "bytes_floor_x": 2.0}

    def __init__(self):
        self._libraries: dict = {}

    # --- building --------------------------------------------------------------------------------------
    def library(self, preset, device: torch.device, seed: int = 0) -> MotionLibrary:
        """The preset's library on `device` (fp32), generated once per preset and seed (the last one kept)."""
        key = (preset.name, int(seed), str(device))
        if key not in self._libraries:
            self._libraries.clear()  # one library in memory at a time (~300 MB per table at g1-4096)
            self._libraries[key] = generate(preset, seed).to(device)
        return self._libraries[key]

    def pipeline(self, preset, device, dtype, vae_dtype, seed: int = 0, num_envs: int | None = None,
                 frames_per_env: int | None = None) -> MotionDataTerm:
        """The eager reference term (fp32) over the preset's library, its robots on seeded clips and times."""
        if dtype != torch.float32:
            raise ValueError(f"the motion fetch runs in fp32 (the seed's task); got dtype {dtype}")
        lib = self.library(preset, torch.device(device), seed)
        term = MotionDataTerm(lib, num_envs or preset.num_envs, frames_per_env or preset.frames_per_env,
                              preset.step_dt)
        term.reset(*sample_queries(lib, term.num_envs, seed))
        return term

    def build(self, cfg) -> tuple[MotionDataTerm, tuple[torch.Tensor, torch.Tensor]]:
        """(the reference term, its (motion_ids, episode_times)) at the configured robot and frame counts."""
        term = self.pipeline(cfg.preset, cfg.device, torch.float32, torch.float32, cfg.seed,
                             cfg.options.num_envs, cfg.options.frames_per_env)
        return term, (term.motion_ids.clone(), term.episode_times.clone())

    # --- the parts variants act on -----------------------------------------------------------------------
    def denoiser(self, pipe):
        raise NotImplementedError("the motion workload has no denoiser: its unit of work is the fetch")

    def compile_regions(self, pipe) -> list:
        return []  # compiled whole: wmbook.motion.variants 'compile'

    def graph_targets(self, pipe: MotionDataTerm) -> list[GraphTarget]:
        """The per-step fetch (it reads and writes only the term's own tensors: a graph replays it as is)."""
        return [GraphTarget(pipe, "_fetch", "motion fetch")]

    def default_ladder(self, device, attention: str | None = None) -> list[str]:
        """Every motion variant that runs on `device`, in ladder order (wmbook.motion.variants)."""
        return known(device)

    # --- measuring -------------------------------------------------------------------------------------
    def forward_flops(self, preset, num_envs: int | None = None, frames_per_env: int | None = None) -> dict:
        """Floating-point operations of one step's fetch by part (an analytic count; the fetch is bytes-bound)."""
        q = (num_envs or preset.num_envs) * (frames_per_env or preset.frames_per_env)
        B, J = preset.num_bodies, preset.num_joints
        parts = {"calc_frame_blend": _FLOPS_BLEND, "lerp": 3 * (3 * (B + 3) + 2 * J),
                 "slerp": _FLOPS_SLERP * (B + 1), "coordinate_transform": _FLOPS_ROTATE * (B + 2) + 3 * B
                 + _FLOPS_QUAT_MUL * B}
        out = {k: float(v * q) for k, v in parts.items()}
        out["total"] = sum(out.values())
        return out

    def forward_probe(self, pipe: MotionDataTerm, seed: int = 0) -> Probe:
        """One step's fetch on seeded clips and times (returns the term's state buffers)."""
        pipe.reset(*sample_queries(pipe.library, pipe.num_envs, seed))
        flops = self.forward_flops(pipe.library.preset, pipe.num_envs, pipe.frames_per_env)["total"]
        return Probe(pipe.fetch, flops, f"one step's fetch: {pipe.num_envs} robots x {pipe.frames_per_env} frames")

    def e2e_description(self, size: E2ESize) -> str:
        return "one environment step's fetch"


__all__ = ["MotionWorkload"]
