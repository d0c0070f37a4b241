"""The per-step motion fetch of an RL environment, as the seed's task does it (the eager reference), and the same
fetch by other routes (the variants of wmbook.motion.variants pick one).

Every step each robot needs its reference motion's state at its current time: `MotionDataTerm.fetch()` (the seed's
`AnimationTerm._fetch_motion_data`) prepares the queries (one per robot and fetched frame), calls
`get_motion_state(motion_ids, motion_times)` and stores the result in the buffers the environment reads. Inside
`get_motion_state`, labelled with the seed's stages:

    calc_frame_blend      clip time -> the two frames around it and the blend weight between them (times clamp at a
                          clip's ends, or wrap for a looping clip)
    indexing_data         the two frames' data, field by field
    interpolation         lerp for positions, velocities and joint values; slerp for rotations (short arc)
    coordinate_transform  velocities and body positions into the root's frame (quat_apply_inverse), body rotations
                          relative to the root

Implementations (all `(library, ids, times, stage, out) -> MotionState`):
    get_motion_state          the reference: one tensor per field, each indexed twice (the seed's structure)
    get_motion_state_packed   one gather of both frames from the packed table (one row per frame), same math
    get_motion_state_grouped  the grouped table: one lerp for every linear value, one slerp for every quaternion,
                              results written in place into the output rows; the reference's transforms
    get_motion_state_fused    the same, with the transforms fused: one rotation matrix per query applied to every
                              vector with one batched matmul, one quaternion product for every body
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, fields

import torch

from ..graphs import register_input_type
from ..profiling.labels import label
from .library import MotionLibrary, RowLayout, grouped_fields
from .quat import quat_apply_inverse, quat_conjugate, quat_mul, quat_to_matrix, slerp

FETCH_LABEL = "AnimationTerm::_fetch_motion_data"
CALL_STAGES = ("prepare_query", "get_motion_state_call", "store_buffers")  # inside FETCH_LABEL
STATE_LABEL = "get_motion_state"
STATE_STAGES = ("calc_frame_blend", "indexing_data", "interpolation", "coordinate_transform")  # inside STATE_LABEL
_NULL = contextlib.nullcontext()


def no_label(name: str):
    """A stage label that is not emitted (what compiled fetches use: torch.compile traces a null context)."""
    return _NULL


@register_input_type
@dataclass
class MotionState:
    """What the environment reads for each query: the root in the world frame, the rest in the root's frame."""

    root_pos: torch.Tensor  # [..., 3] world
    root_lin_vel_b: torch.Tensor  # [..., 3] root frame
    root_ang_vel_b: torch.Tensor  # [..., 3] root frame
    body_pos_b: torch.Tensor  # [..., bodies, 3] relative to the root, root frame
    dof_pos: torch.Tensor  # [..., joints]
    dof_vel: torch.Tensor  # [..., joints]
    root_rot: torch.Tensor  # [..., 4] world, (x, y, z, w)
    body_rot_b: torch.Tensor  # [..., bodies, 4] relative to the root

    def items(self):
        return [(f.name, getattr(self, f.name)) for f in fields(self)]

    def copy_(self, other: "MotionState") -> "MotionState":
        """Copy `other`'s values in (shapes may differ by the leading dimensions' split)."""
        for name, t in self.items():
            t.copy_(getattr(other, name).view(t.shape))
        return self


def state_layout(num_joints: int, num_bodies: int) -> RowLayout:
    """The fetch's output rows: the grouped order, with the state's names (root-frame quantities end in `_b`)."""
    names = {"root_lin_vel": "root_lin_vel_b", "root_ang_vel": "root_ang_vel_b", "body_pos": "body_pos_b",
             "body_rot": "body_rot_b"}
    return RowLayout(tuple((names.get(n, n), s) for n, s in grouped_fields(num_joints, num_bodies)))


def state_from_rows(rows: torch.Tensor, num_joints: int, num_bodies: int) -> MotionState:
    """MotionState views of output rows [..., width] (no copy)."""
    return MotionState(**state_layout(num_joints, num_bodies).views(rows))


def empty_state(lead: tuple[int, ...], num_joints: int, num_bodies: int, dtype, device) -> MotionState:
    """One buffer per field, [*lead, *shape] (the reference's buffers)."""
    lay = state_layout(num_joints, num_bodies)
    return MotionState(**{n: torch.zeros(*lead, *s, dtype=dtype, device=device) for n, s in lay.fields})


# --- the stages -----------------------------------------------------------------------------------------------

def calc_frame_blend(lib: MotionLibrary, motion_ids: torch.Tensor, motion_times: torch.Tensor):
    """(first frame row, second frame row, blend weight) of each query, as the seed's motion library computes them:
    the time clamped to the clip (wrapped for a looping clip), frame = floor(phase * (frames - 1)),
    blend = (time - frame * dt) / dt."""
    length = lib.length[motion_ids]
    n = lib.num_frames[motion_ids]
    dt = lib.dt[motion_ids]
    t = torch.where(lib.loop[motion_ids], torch.remainder(motion_times, length), motion_times)
    t = torch.minimum(t.clamp(min=0.0), length)
    phase = t / length
    f0 = (phase * (n - 1)).long()  # t >= 0: truncation is floor
    f1 = torch.minimum(f0 + 1, n - 1)
    blend = ((t - f0 * dt) / dt).clamp(0.0, 1.0)
    start = lib.start[motion_ids]
    return f0 + start, f1 + start, blend


def interpolate(x0: dict, x1: dict, blend: torch.Tensor) -> dict:
    """Frame values between two frames: lerp for vectors and joint values, slerp for rotations (the seed's way:
    one call per field)."""
    b = blend.unsqueeze(-1)
    out = {k: torch.lerp(x0[k], x1[k], b) for k in ("root_pos", "root_lin_vel", "root_ang_vel", "dof_pos", "dof_vel")}
    out["body_pos"] = torch.lerp(x0["body_pos"], x1["body_pos"], b.unsqueeze(-1))
    out["root_rot"] = slerp(x0["root_rot"], x1["root_rot"], b)
    out["body_rot"] = slerp(x0["body_rot"], x1["body_rot"], b.unsqueeze(-1))
    return out


def to_root_frame(w: dict) -> MotionState:
    """World-frame values -> the state: velocities and body positions in the root's frame, body rotations relative
    to the root (the seed's coordinate_transform: quat_apply_inverse per quantity)."""
    root_rot = w["root_rot"]
    rr = root_rot.unsqueeze(-2).expand_as(w["body_rot"])
    return MotionState(
        root_pos=w["root_pos"],
        root_lin_vel_b=quat_apply_inverse(root_rot, w["root_lin_vel"]),
        root_ang_vel_b=quat_apply_inverse(root_rot, w["root_ang_vel"]),
        body_pos_b=quat_apply_inverse(rr, w["body_pos"] - w["root_pos"].unsqueeze(-2)),
        dof_pos=w["dof_pos"], dof_vel=w["dof_vel"], root_rot=root_rot,
        body_rot_b=quat_mul(quat_conjugate(rr), w["body_rot"]))


# --- the implementations ----------------------------------------------------------------------------------------

def get_motion_state(lib: MotionLibrary, motion_ids, motion_times, stage=label, out=None) -> MotionState:
    """The eager reference, modelled on the seed's MotionDataTerm.get_motion_state (its stages, its labels): every
    field indexed twice, one lerp or slerp per field, one transform per quantity."""
    with stage(STATE_LABEL):
        with stage("calc_frame_blend"):
            f0, f1, blend = calc_frame_blend(lib, motion_ids, motion_times)
        with stage("indexing_data"):
            x0 = {k: v[f0] for k, v in lib.fields.items()}
            x1 = {k: v[f1] for k, v in lib.fields.items()}
        with stage("interpolation"):
            w = interpolate(x0, x1, blend)
        with stage("coordinate_transform"):
            return to_root_frame(w)


def get_motion_state_packed(lib: MotionLibrary, motion_ids, motion_times, stage=label, out=None) -> MotionState:
    """Index once: both frames of every query in one gather from the packed table; fields are views of its rows."""
    with stage(STATE_LABEL):
        with stage("calc_frame_blend"):
            f0, f1, blend = calc_frame_blend(lib, motion_ids, motion_times)
        with stage("indexing_data"):
            rows = lib.packed().index_select(0, torch.cat((f0, f1))).unflatten(0, (2, -1))  # [2, Q, width]
            lay = lib.layout("packed")
            x0, x1 = lay.views(rows[0]), lay.views(rows[1])
        with stage("interpolation"):
            w = interpolate(x0, x1, blend)
        with stage("coordinate_transform"):
            return to_root_frame(w)


def _interpolate_grouped(lib: MotionLibrary, motion_ids, motion_times, stage):
    """The grouped table's rows of both frames in one gather, then one lerp over every linear value ([Q, q0]: the
    vectors, then the joint values) and one slerp over every quaternion ([Q, bodies + 1, 4]: the root's first)."""
    with stage("calc_frame_blend"):
        f0, f1, blend = calc_frame_blend(lib, motion_ids, motion_times)
    with stage("indexing_data"):
        rows = lib.grouped().index_select(0, torch.cat((f0, f1))).unflatten(0, (2, -1))  # [2, Q, width]
    with stage("interpolation"):
        q0 = lib.layout("grouped").offsets["root_rot"][0]  # the quaternions come last
        b = blend.unsqueeze(-1)
        lin = torch.lerp(rows[0, :, :q0], rows[1, :, :q0], b)
        nq = lib.num_bodies + 1
        quats = slerp(rows[0, :, q0:].view(-1, nq, 4), rows[1, :, q0:].view(-1, nq, 4), b.unsqueeze(-1))
    return lin, quats


def get_motion_state_grouped(lib: MotionLibrary, motion_ids, motion_times, stage=label, out=None) -> MotionState:
    """Contiguous layout: the grouped table's rows gathered once, one lerp and one slerp over contiguous blocks, the
    reference's transforms, the state written into `out` [Q, width] (output rows in the grouped order) by one cat."""
    J, B = lib.num_joints, lib.num_bodies
    with stage(STATE_LABEL):
        lin, quats = _interpolate_grouped(lib, motion_ids, motion_times, stage)
        with stage("coordinate_transform"):
            root_pos, root_rot = lin[:, :3], quats[:, 0]
            rr = root_rot.unsqueeze(1).expand(-1, B, -1)
            body_pos = quat_apply_inverse(rr, lin[:, 9:3 * (B + 3)].view(-1, B, 3) - root_pos.unsqueeze(1))
            torch.cat((root_pos, quat_apply_inverse(root_rot, lin[:, 3:6]), quat_apply_inverse(root_rot, lin[:, 6:9]),
                       body_pos.flatten(1), lin[:, 3 * (B + 3):], root_rot,
                       quat_mul(quat_conjugate(rr), quats[:, 1:]).flatten(1)), dim=1, out=out)
        return state_from_rows(out, J, B)


def get_motion_state_fused(lib: MotionLibrary, motion_ids, motion_times, stage=label, out=None) -> MotionState:
    """Grouped layout with fused quaternion math: the root's rotation matrix once per query, applied to the two root
    velocities and every body position in one batched matmul; the bodies' relative rotations in one product."""
    J, B = lib.num_joints, lib.num_bodies
    with stage(STATE_LABEL):
        lin, quats = _interpolate_grouped(lib, motion_ids, motion_times, stage)
        with stage("coordinate_transform"):
            vec = lin[:, 3:3 * (B + 3)].view(-1, B + 2, 3)  # root_lin_vel, root_ang_vel, body_pos
            rel = torch.cat((vec[:, :2], vec[:, 2:] - lin[:, None, :3]), dim=1)  # body positions from the root
            root = quats[:, 0]
            local = torch.bmm(rel, quat_to_matrix(root))  # row vectors: v^T R = (R^T v)^T, the inverse rotation
            torch.cat((lin[:, :3], local.flatten(1), lin[:, 3 * (B + 3):], root,
                       quat_mul(quat_conjugate(root).unsqueeze(1), quats[:, 1:]).flatten(1)), dim=1, out=out)
        return state_from_rows(out, J, B)


# --- the environment's term ---------------------------------------------------------------------------------------

class MotionDataTerm:
    """The reference-motion term of a vectorized environment: each robot plays clip `motion_ids[i]` at time
    `episode_times[i]`; `fetch()` fills `state` ([num_envs, frames_per_env, ...]) with the states at those times
    and the next frames_per_env - 1 steps. `reset` sets the clips and times, `step` fetches and advances them.

    What a variant changes: `get_motion_state` (the implementation), `out` (output rows written in place, with
    `state` their views), `stage` (labels or none), `_fetch` (what `fetch` runs: compile and CUDA graphs wrap it).
    """

    def __init__(self, library: MotionLibrary, num_envs: int, frames_per_env: int = 1, step_dt: float = 0.02):
        for name, v in (("num_envs", num_envs), ("frames_per_env", frames_per_env)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name}={v!r} is not allowed; allowed values: an integer >= 1")
        self.library = library
        self.num_envs, self.frames_per_env, self.step_dt = num_envs, frames_per_env, float(step_dt)
        dev, dt = library.device, library.dtype
        self.motion_ids = torch.zeros(num_envs, dtype=torch.long, device=dev)
        self.episode_times = torch.zeros(num_envs, dtype=dt, device=dev)
        self.frame_offsets = torch.arange(frames_per_env, dtype=dt, device=dev) * self.step_dt  # [K]
        self.state = empty_state((num_envs, frames_per_env), library.num_joints, library.num_bodies, dt, dev)
        self.out: torch.Tensor | None = None
        self.get_motion_state = get_motion_state
        self.stage = label
        self._fetch = self.fetch_stages

    @property
    def queries(self) -> int:
        return self.num_envs * self.frames_per_env

    def use_output_rows(self) -> None:
        """Keep the state as views of one [num_envs * frames_per_env, width] tensor that implementations write into."""
        lib = self.library
        width = state_layout(lib.num_joints, lib.num_bodies).width
        self.out = torch.zeros(self.queries, width, dtype=lib.dtype, device=lib.device)
        self.state = state_from_rows(self.out.view(self.num_envs, self.frames_per_env, width), lib.num_joints,
                                     lib.num_bodies)

    def reset(self, motion_ids: torch.Tensor, episode_times: torch.Tensor) -> None:
        """Every robot's clip and time in it (copied into the term's own tensors: their addresses never change)."""
        self.motion_ids.copy_(motion_ids)
        self.episode_times.copy_(episode_times)

    def prepare_query(self):
        """(motion id, time) of every query: each robot's clip, its time plus 0, 1, ... steps ahead."""
        ids = self.motion_ids.repeat_interleave(self.frames_per_env)
        times = (self.episode_times.unsqueeze(1) + self.frame_offsets).reshape(-1)
        return ids, times

    def fetch_stages(self) -> MotionState:
        """The seed's _fetch_motion_data: prepare_query, get_motion_state_call, store_buffers."""
        st = self.stage
        with st("prepare_query"):
            ids, times = self.prepare_query()
        with st("get_motion_state_call"):
            s = self.get_motion_state(self.library, ids, times, st, self.out)
        with st("store_buffers"):
            if self.out is None:  # written in place otherwise
                self.state.copy_(s)
        return self.state

    def fetch(self) -> MotionState:
        """This step's states of every robot (the buffers `state`)."""
        with label(FETCH_LABEL):
            return self._fetch()

    def step(self) -> MotionState:
        """Fetch, then advance every robot's time by one step."""
        s = self.fetch()
        self.episode_times += self.step_dt
        return s


def sample_queries(lib: MotionLibrary, num_envs: int, seed: int = 0, spread: tuple[float, float] = (-0.1, 1.3)):
    """(motion_ids [N], episode_times [N]) on the library's device: random clips, times from spread[0] to spread[1]
    times the clip's length (before the start and past the end included: clamping and wrapping get exercised)."""
    g = torch.Generator().manual_seed(int(seed) + 7919)
    ids = torch.randint(lib.num_motions, (num_envs,), generator=g)
    frac = spread[0] + (spread[1] - spread[0]) * torch.rand(num_envs, generator=g, dtype=torch.float64)
    times = (frac * lib.length.cpu().double()[ids]).to(lib.dtype)
    return ids.to(lib.device), times.to(lib.device)


__all__ = ["CALL_STAGES", "FETCH_LABEL", "MotionDataTerm", "MotionState", "STATE_LABEL", "STATE_STAGES",
           "calc_frame_blend", "empty_state", "get_motion_state", "get_motion_state_fused", "get_motion_state_grouped",
           "get_motion_state_packed", "interpolate", "no_label", "sample_queries", "state_from_rows", "state_layout",
           "to_root_frame"]
