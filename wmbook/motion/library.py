"""A procedural motion library: many clips of humanoid reference motion (a Unitree G1's 29 joints and 30 bodies),
generated deterministically from a seed (no download), stored clip after clip in concatenated frame tensors.

    lib = generate(MOTION_PRESETS["tiny-motion"], seed=0).to("cuda")
    lib.fields["body_rot"]        # [frames, 30, 4], every clip's frames one after the other
    lib.start[m], lib.num_frames[m], lib.length[m], lib.dt[m], lib.loop[m]   # where clip m lives and how it plays
    lib.packed()                  # [frames, 281]: one row per frame, the fields in the seed's order
    lib.grouped()                 # [frames, 281]: one row per frame, grouped by the math applied (GROUPED)

The motion: a root walking a gently curving path with gait-frequency sway, bob, pitch and roll; joints as sums of two
harmonics of the gait frequency (velocities their exact derivatives); bodies at fixed offsets from the pelvis with a
small periodic motion and a periodic local rotation. A quarter of the stored quaternions are negated (the same
rotation, as captured data often has): interpolating between frames has to take the short arc.
Quaternions are (x, y, z, w) (wmbook.motion.quat).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pandas as pd
import torch

from .presets import MotionPreset
from .quat import quat_apply, quat_from_axis_angle, quat_from_euler_zyx, quat_mul


class RowLayout:
    """Named fields packed side by side in one row: offsets, widths, and per-field views of [..., width] rows."""

    def __init__(self, fields: tuple[tuple[str, tuple[int, ...]], ...]):
        self.fields = fields
        self.offsets: dict[str, tuple[int, int]] = {}
        off = 0
        for name, shape in fields:
            n = math.prod(shape)
            self.offsets[name] = (off, off + n)
            off += n
        self.width = off
        self.shapes = dict(fields)

    def views(self, rows: torch.Tensor) -> dict[str, torch.Tensor]:
        """{field: rows[..., a:b] viewed as [..., *shape]} (no copy)."""
        return {name: rows[..., a:b].unflatten(-1, self.shapes[name]) for name, (a, b) in self.offsets.items()}

    def pack(self, parts: dict[str, torch.Tensor]) -> torch.Tensor:
        """The fields [rows, *shape] side by side: [rows, width]."""
        return torch.cat([parts[name].flatten(1) for name, _ in self.fields], dim=1)


def frame_fields(num_joints: int, num_bodies: int) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """What one stored frame holds, in the seed's order (world frame; velocities in m/s and rad/s)."""
    return (("root_pos", (3,)), ("root_rot", (4,)), ("root_lin_vel", (3,)), ("root_ang_vel", (3,)),
            ("dof_pos", (num_joints,)), ("dof_vel", (num_joints,)), ("body_pos", (num_bodies, 3)),
            ("body_rot", (num_bodies, 4)))


def grouped_fields(num_joints: int, num_bodies: int) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """A frame's fields grouped by the math the fetch applies: the vectors (lerp; all but the root position then
    rotated into the root frame), the joint values (lerp only), the quaternions (slerp; the bodies' then expressed
    relative to the root). The fetch's output rows use the same order."""
    return (("root_pos", (3,)), ("root_lin_vel", (3,)), ("root_ang_vel", (3,)), ("body_pos", (num_bodies, 3)),
            ("dof_pos", (num_joints,)), ("dof_vel", (num_joints,)), ("root_rot", (4,)), ("body_rot", (num_bodies, 4)))


@dataclass
class MotionLibrary:
    """Every clip's frames concatenated (see the module docstring); `to` copies it to a device and dtype."""

    preset: MotionPreset
    seed: int
    fields: dict[str, torch.Tensor]  # name -> [frames, *shape]
    start: torch.Tensor  # [motions] int64: first frame of each clip
    num_frames: torch.Tensor  # [motions] int64
    length: torch.Tensor  # [motions] seconds, (num_frames - 1) * dt
    dt: torch.Tensor  # [motions] seconds per frame
    loop: torch.Tensor  # [motions] bool: times wrap (else they clamp at the clip's ends)
    fps: torch.Tensor  # [motions] int64
    _layouts: dict = field(default_factory=dict, repr=False)

    @property
    def num_motions(self) -> int:
        return int(self.start.numel())

    @property
    def total_frames(self) -> int:
        return int(self.fields["root_pos"].shape[0])

    @property
    def device(self) -> torch.device:
        return self.fields["root_pos"].device

    @property
    def dtype(self) -> torch.dtype:
        return self.fields["root_pos"].dtype

    @property
    def num_joints(self) -> int:
        return self.preset.num_joints

    @property
    def num_bodies(self) -> int:
        return self.preset.num_bodies

    def layout(self, kind: str) -> RowLayout:
        """'packed' (the seed's field order) or 'grouped' (by the math applied)."""
        make = {"packed": frame_fields, "grouped": grouped_fields}
        if kind not in make:
            raise ValueError(f"kind={kind!r} is not allowed; allowed values: {list(make)}")
        return RowLayout(make[kind](self.num_joints, self.num_bodies))

    def _rows(self, kind: str) -> torch.Tensor:
        if kind not in self._layouts:
            self._layouts[kind] = self.layout(kind).pack(self.fields).contiguous()
        return self._layouts[kind]

    def packed(self) -> torch.Tensor:
        """[frames, width]: each frame's fields side by side in the seed's order (built once, kept)."""
        return self._rows("packed")

    def grouped(self) -> torch.Tensor:
        """[frames, width]: each frame's fields grouped by the math applied (built once, kept)."""
        return self._rows("grouped")

    def nbytes(self) -> int:
        """Bytes of the per-field frame tensors (one copy of the library)."""
        return sum(t.numel() * t.element_size() for t in self.fields.values())

    def to(self, device=None, dtype: torch.dtype | None = None) -> "MotionLibrary":
        """A copy on `device` with floating fields (and times) in `dtype`."""
        dev = torch.device(device) if device is not None else self.device
        dt = dtype or self.dtype

        def cast(t):
            return t.to(dev, dt if t.is_floating_point() else t.dtype)

        return MotionLibrary(self.preset, self.seed, {k: cast(v) for k, v in self.fields.items()}, cast(self.start),
                             cast(self.num_frames), cast(self.length), cast(self.dt), cast(self.loop), cast(self.fps))

    def table(self):
        """Size of the library: clips, frames, frame rates, looping share, bytes per frame and in all."""
        p = self.preset
        lengths = self.length.double().cpu()
        per_frame = sum(math.prod(s) for _, s in frame_fields(p.num_joints, p.num_bodies)) * self.fields[
            "root_pos"].element_size()
        d = {"clips": self.num_motions, "frames": self.total_frames,
             "clip seconds (min / median / max)": f"{lengths.min():.2f} / {lengths.median():.2f} / {lengths.max():.2f}",
             "frame rates": ", ".join(f"{int(f)} fps x {int(n)}" for f, n in zip(*torch.unique(self.fps.cpu(),
                                                                                          return_counts=True))),
             "looping clips": int(self.loop.sum()), "joints": p.num_joints, "bodies": p.num_bodies,
             "bytes per frame": per_frame, "library MiB": self.nbytes() / 2**20, "dtype": str(self.dtype),
             "seed": self.seed}
        return pd.DataFrame({"value": {k: str(v) if not isinstance(v, float) else f"{v:.1f}" for k, v in d.items()}})


def _skeleton(g: torch.Generator, num_bodies: int) -> torch.Tensor:
    """[bodies, 3] offsets of each body from the pelvis in its rest pose (body 0: the pelvis itself), m."""
    lo = torch.tensor([-0.15, -0.25, -0.75], dtype=torch.float64)
    hi = torch.tensor([0.15, 0.25, 0.55], dtype=torch.float64)
    off = lo + (hi - lo) * torch.rand(num_bodies, 3, generator=g, dtype=torch.float64)
    off[0] = 0.0
    return off


def _unit(g: torch.Generator, *shape: int) -> torch.Tensor:
    v = torch.randn(*shape, 3, generator=g, dtype=torch.float64)
    return v / torch.linalg.vector_norm(v, dim=-1, keepdim=True)


@torch.no_grad()
def generate(preset: MotionPreset, seed: int = 0, chunk_frames: int = 65536) -> MotionLibrary:
    """The library of `preset`, the same for the same seed on every machine (CPU, float64, stored as fp32)."""
    g = torch.Generator().manual_seed(int(seed))
    M, J, B = preset.num_motions, preset.num_joints, preset.num_bodies
    f64 = dict(dtype=torch.float64)

    def u(*shape, lo=0.0, hi=1.0):
        return lo + (hi - lo) * torch.rand(*shape, generator=g, **f64)

    # --- the clips: frame rate, length, looping, where their frames start --------------------------------------
    fps = torch.tensor(preset.fps_choices)[torch.randint(len(preset.fps_choices), (M,), generator=g)]
    n = (u(M, lo=preset.clip_seconds[0], hi=preset.clip_seconds[1]) * fps).round().long().clamp(min=1) + 1
    dt = 1.0 / fps.double()
    length = (n - 1) * dt
    loop = u(M) < preset.loop_fraction
    start = torch.cumsum(n, 0) - n
    F = int(n.sum())

    # --- per-clip motion parameters --------------------------------------------------------------------------
    gait = 2 * math.pi * u(M, lo=0.6, hi=1.4)  # rad/s
    speed, heading0 = u(M, lo=0.3, hi=1.2), u(M, lo=-math.pi, hi=math.pi)
    turn = torch.where(u(M) < 0.5, -1.0, 1.0) * u(M, lo=0.05, hi=0.4)  # rad/s, never 0
    xy0 = u(M, 2, lo=-2.0, hi=2.0)
    sway, bob = u(M, lo=0.01, hi=0.05), u(M, lo=0.005, hi=0.03)
    pitch_amp, roll_amp = u(M, hi=0.08), u(M, hi=0.06)
    phase = u(M, 4, hi=2 * math.pi)  # sway, bob, pitch, roll
    dof_center, dof_a1, dof_a2 = u(M, J, lo=-0.3, hi=0.3), u(M, J, lo=0.05, hi=0.5), u(M, J, hi=0.15)
    dof_phase = u(M, J, 2, hi=2 * math.pi)
    rest = _skeleton(g, B)
    wobble_dir, wobble_amp, wobble_phase = _unit(g, M, B), u(M, B, hi=0.08), u(M, B, hi=2 * math.pi)
    rot_axis, rot_amp, rot_phase = _unit(g, M, B), u(M, B, hi=0.4), u(M, B, hi=2 * math.pi)
    wobble_amp[:, 0] = 0.0
    rot_amp[:, 0] = 0.0  # body 0 is the pelvis: it moves and turns with the root
    flips = torch.rand(F, B + 1, generator=g, **f64) < preset.flip_fraction  # root + bodies

    clip_of = torch.repeat_interleave(torch.arange(M), n)  # [F]
    out = {name: torch.empty(F, *shape, dtype=torch.float32) for name, shape in frame_fields(J, B)}
    for a in range(0, F, chunk_frames):  # bounded temporaries at the real preset
        c = clip_of[a:a + chunk_frames]
        t = (torch.arange(a, a + c.numel()) - start[c]).double() * dt[c]  # [f] seconds into the clip
        w = gait[c]
        ph = w * t
        # root: a curving walk (analytic integral of speed along the heading), lateral sway, vertical bob
        yaw = heading0[c] + turn[c] * t
        r = speed[c] / turn[c]
        fwd = torch.stack((torch.cos(yaw), torch.sin(yaw), torch.zeros_like(yaw)), -1)
        left = torch.stack((-torch.sin(yaw), torch.cos(yaw), torch.zeros_like(yaw)), -1)
        s = sway[c] * torch.sin(ph + phase[c, 0])
        root_pos = torch.stack((xy0[c, 0] + r * (torch.sin(yaw) - torch.sin(heading0[c])),
                                xy0[c, 1] - r * (torch.cos(yaw) - torch.cos(heading0[c])),
                                0.78 + bob[c] * torch.sin(2 * ph + phase[c, 1])), -1) + s[:, None] * left
        root_lin_vel = speed[c, None] * fwd + (sway[c] * w * torch.cos(ph + phase[c, 0]))[:, None] * left
        root_lin_vel[:, 2] = 2 * w * bob[c] * torch.cos(2 * ph + phase[c, 1])
        pitch = pitch_amp[c] * torch.sin(ph + phase[c, 2])
        roll = roll_amp[c] * torch.sin(ph + phase[c, 3])
        root_rot = quat_from_euler_zyx(yaw, pitch, roll)
        d_roll, d_pitch = roll_amp[c] * w * torch.cos(ph + phase[c, 3]), pitch_amp[c] * w * torch.cos(ph + phase[c, 2])
        root_ang_vel = d_roll[:, None] * fwd + d_pitch[:, None] * left  # roll about heading, pitch about left
        root_ang_vel[:, 2] = turn[c]
        # joints: two harmonics of the gait, velocities their derivatives
        a1 = ph[:, None] + dof_phase[c, :, 0]
        a2 = 2 * ph[:, None] + dof_phase[c, :, 1]
        dof_pos = dof_center[c] + dof_a1[c] * torch.sin(a1) + dof_a2[c] * torch.sin(a2)
        dof_vel = w[:, None] * (dof_a1[c] * torch.cos(a1) + 2 * dof_a2[c] * torch.cos(a2))
        # bodies: rest offset plus a small periodic motion, in the root frame; a periodic local rotation
        bph = ph[:, None]
        local_pos = rest + (wobble_amp[c] * torch.sin(bph + wobble_phase[c]))[..., None] * wobble_dir[c]
        body_pos = root_pos[:, None] + quat_apply(root_rot[:, None].expand(-1, B, -1), local_pos)
        local_rot = quat_from_axis_angle(rot_axis[c], rot_amp[c] * torch.sin(bph + rot_phase[c]))
        body_rot = quat_mul(root_rot[:, None].expand(-1, B, -1), local_rot)
        fl = flips[a:a + c.numel()]
        root_rot = torch.where(fl[:, :1], -root_rot, root_rot)
        body_rot = torch.where(fl[:, 1:, None], -body_rot, body_rot)
        for name, v in (("root_pos", root_pos), ("root_rot", root_rot), ("root_lin_vel", root_lin_vel),
                        ("root_ang_vel", root_ang_vel), ("dof_pos", dof_pos), ("dof_vel", dof_vel),
                        ("body_pos", body_pos), ("body_rot", body_rot)):
            out[name][a:a + c.numel()] = v
    return MotionLibrary(preset, int(seed), out, start, n, length.float(), dt.float(), loop, fps)


__all__ = ["MotionLibrary", "RowLayout", "frame_fields", "generate", "grouped_fields"]
