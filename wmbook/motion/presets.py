"""Named shapes of the motion workload: a tiny one for the CPU and the seed's task (4096 Unitree G1 robots)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace


@dataclass(frozen=True)
class MotionPreset:
    """A procedural motion library and the robots that read from it every environment step."""

    name: str
    num_envs: int  # robots (environments) fetching a reference state every step
    num_motions: int  # clips in the library
    clip_seconds: tuple[float, float]  # clip length range (uniform)
    fps_choices: tuple[int, ...] = (30, 50, 60)  # each clip's frame rate, drawn from these
    loop_fraction: float = 0.5  # share of the clips that loop (times wrap); the others clamp at their ends
    num_joints: int = 29  # Unitree G1: 29 actuated joints (DoF)
    num_bodies: int = 30  # rigid bodies, body 0 the pelvis (the root)
    frames_per_env: int = 1  # states fetched per robot per step (the current one, then future reference frames)
    step_dt: float = 0.02  # seconds between environment steps (50 Hz control) and between fetched future frames
    scaling_envs: tuple[int, ...] = (4096, 16384, 65536)  # robot counts of the scaling figure
    flip_fraction: float = 0.25  # stored quaternions negated at random (same rotation): slerp must take the short arc
    tiny: bool = False

    @property
    def queries(self) -> int:
        """Motion states one step fetches."""
        return self.num_envs * self.frames_per_env

    def with_(self, **kw) -> "MotionPreset":
        return replace(self, **kw)

    def to_dict(self) -> dict:
        return asdict(self)


MOTION_PRESETS: dict[str, MotionPreset] = {
    # same code paths at toy size: 64 robots, two states each (current + next), 6 short clips
    "tiny-motion": MotionPreset(name="tiny-motion", num_envs=64, num_motions=6, clip_seconds=(0.5, 1.5),
                                frames_per_env=2, scaling_envs=(64, 256, 1024), tiny=True),
    # the seed's task: 4096 robots (its --num_envs default), one reference state each per step; 512 clips of 2-20 s
    # (~270k frames, ~300 MB per copy of the library in fp32)
    "g1-4096": MotionPreset(name="g1-4096", num_envs=4096, num_motions=512, clip_seconds=(2.0, 20.0)),
}
