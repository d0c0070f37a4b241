"""Reference-motion loading for thousands of simulated robots (the `motion` workload, notebook 07; seed 003).

An RL environment for motion tracking fetches, every step and for every robot, the state of its reference clip at the
robot's current time: two frames around that time, interpolated (lerp and slerp) and expressed in the robot's root
frame. With 4096 robots the seed's eager fetch showed up as a bottleneck.

    presets.py    MotionPreset: tiny-motion (CPU), g1-4096 (the seed's 4096 Unitree G1 robots)
    library.py    the procedural, deterministic motion library (concatenated clips; packed and grouped tables)
    quat.py       quaternion math, (x, y, z, w)
    fetch.py      MotionDataTerm (the per-step fetch) and get_motion_state: the labelled eager reference and the
                  same fetch by other routes
    variants.py   the named optimizations of the fetch, in ladder order
    kernel.py     the whole fetch as one Triton kernel (torch.library op `wmbook::motion_fetch`)
"""

from .presets import MOTION_PRESETS, MotionPreset

__all__ = ["MOTION_PRESETS", "MotionPreset"]
