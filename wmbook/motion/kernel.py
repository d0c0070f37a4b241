"""The whole motion fetch in one Triton kernel: query times, frame blend, the gather of both frames, lerp, slerp
(short arc, near-parallel inputs by normalized lerp) and the transform into each root's frame, written straight into
the output rows. The kernel file contract of wmbook.kernels (launcher, torch reference, bytes, custom op).

Unfused (wmbook.motion.fetch, the reference): ~150 small kernels per step, every intermediate through memory. Fused:
each query reads its two frames' rows of the grouped table once and writes its output row once.

Rows are grouped (wmbook.motion.library.grouped_fields), with NB bodies and NJ joints:
    [root_pos 3 | root_lin_vel 3 | root_ang_vel 3 | body_pos NB x 3 | dof_pos NJ | dof_vel NJ | root_rot 4 |
     body_rot NB x 4]
One program handles BLOCK_Q queries; inside it the NB + 2 rotated vectors, the 2 NJ joint values and the NB + 1
quaternions of each query are [BLOCK_Q, BLOCK] tiles, one component at a time. acos is a polynomial (Abramowitz and
Stegun 4.4.46, |error| <= 2.2e-8), so the kernel needs no libdevice and runs in Triton's CPU interpreter too.
"""

from __future__ import annotations

import torch

from ..kernels import next_pow2, runs_triton
from .fetch import get_motion_state_fused, no_label
from .library import RowLayout, grouped_fields

try:
    import triton
    import triton.language as tl
except ImportError:  # the custom op falls back to the reference
    triton = None

NEAR_PARALLEL_SIN = 1e-3  # wmbook.motion.quat.NEAR_PARALLEL_SIN


if triton is not None:

    @triton.jit
    def _acos(x):
        """acos on [0, 1] (A&S 4.4.46)."""
        p = -0.0012624911
        p = p * x + 0.0066700901
        p = p * x - 0.0170881256
        p = p * x + 0.0308918810
        p = p * x - 0.0501743046
        p = p * x + 0.0889789874
        p = p * x - 0.2145988016
        p = p * x + 1.5707963050
        return tl.sqrt(tl.maximum(1.0 - x, 0.0)) * p

    @triton.jit
    def _motion_fetch_kernel(
        table_ptr,  # [frames, W] fp32: every frame's grouped row
        start_ptr,  # [motions] int64: first frame of each clip
        nframes_ptr,  # [motions] int64
        length_ptr,  # [motions] fp32 seconds
        dt_ptr,  # [motions] fp32 seconds per frame
        loop_ptr,  # [motions] int32: 1 = the clip wraps
        ids_ptr,  # [envs] int64: each robot's clip
        time_ptr,  # [envs] fp32: each robot's time in it
        offset_ptr,  # [K] fp32: the fetched frames' time offsets
        out_ptr,  # [envs * K, W] fp32: output rows, same order (vectors and quaternions in the root frame)
        Q,  # queries = envs * K
        K,  # frames fetched per robot
        W: tl.constexpr,  # row width
        NB: tl.constexpr,  # bodies
        NJ: tl.constexpr,  # joints
        NEAR: tl.constexpr,  # near-parallel threshold on sin(theta)
        BLOCK_Q: tl.constexpr,
        BLOCK_V: tl.constexpr,  # >= NB + 2: root_lin_vel, root_ang_vel, the body positions
        BLOCK_S: tl.constexpr,  # >= 2 NJ
        BLOCK_R: tl.constexpr,  # >= NB + 1: the root's quaternion, then the bodies'
    ):
        SOFF: tl.constexpr = 3 * (NB + 3)  # joint values
        QOFF: tl.constexpr = SOFF + 2 * NJ  # quaternions
        q = tl.program_id(0) * BLOCK_Q + tl.arange(0, BLOCK_Q)
        qm = q < Q
        env = q // K
        # --- prepare_query and calc_frame_blend ---
        mid = tl.load(ids_ptr + env, mask=qm, other=0)
        t = tl.load(time_ptr + env, mask=qm, other=0.0) + tl.load(offset_ptr + (q - env * K), mask=qm, other=0.0)
        start = tl.load(start_ptr + mid, mask=qm, other=0)
        n = tl.load(nframes_ptr + mid, mask=qm, other=2)
        length = tl.load(length_ptr + mid, mask=qm, other=1.0)
        dt = tl.load(dt_ptr + mid, mask=qm, other=1.0)
        wraps = tl.load(loop_ptr + mid, mask=qm, other=0) != 0
        t = tl.where(wraps, t - length * tl.floor(t / length), t)
        t = tl.minimum(tl.maximum(t, 0.0), length)
        f0 = ((t / length) * (n - 1).to(tl.float32)).to(tl.int64)
        f1 = tl.minimum(f0 + 1, n - 1)
        blend = tl.minimum(tl.maximum((t - f0.to(tl.float32) * dt) / dt, 0.0), 1.0)
        row0 = (start + f0) * W
        row1 = (start + f1) * W
        orow = q.to(tl.int64) * W
        b2 = blend[:, None]
        r0, r1, o2 = row0[:, None], row1[:, None], orow[:, None]

        # --- quaternions: slerp on the short arc, then relative to the root (column 0) ---
        r = tl.arange(0, BLOCK_R)[None, :]
        rm = qm[:, None] & (r < NB + 1)
        qo = QOFF + 4 * r
        ax = tl.load(table_ptr + r0 + qo, mask=rm, other=0.0)
        ay = tl.load(table_ptr + r0 + qo + 1, mask=rm, other=0.0)
        az = tl.load(table_ptr + r0 + qo + 2, mask=rm, other=0.0)
        aw = tl.load(table_ptr + r0 + qo + 3, mask=rm, other=1.0)
        bx = tl.load(table_ptr + r1 + qo, mask=rm, other=0.0)
        by = tl.load(table_ptr + r1 + qo + 1, mask=rm, other=0.0)
        bz = tl.load(table_ptr + r1 + qo + 2, mask=rm, other=0.0)
        bw = tl.load(table_ptr + r1 + qo + 3, mask=rm, other=1.0)
        d = ax * bx + ay * by + az * bz + aw * bw
        sgn = tl.where(d < 0.0, -1.0, 1.0)
        bx, by, bz, bw = bx * sgn, by * sgn, bz * sgn, bw * sgn
        d = tl.minimum(tl.abs(d), 1.0)
        theta = _acos(d)
        s = tl.sin(theta)
        near = s < NEAR
        safe = tl.where(near, 1.0, s)
        w0 = tl.where(near, 1.0 - b2, tl.sin((1.0 - b2) * theta) / safe)
        w1 = tl.where(near, b2, tl.sin(b2 * theta) / safe)
        x = w0 * ax + w1 * bx
        y = w0 * ay + w1 * by
        z = w0 * az + w1 * bz
        w = w0 * aw + w1 * bw
        inv = tl.where(near, 1.0 / tl.sqrt(x * x + y * y + z * z + w * w), 1.0)
        x, y, z, w = x * inv, y * inv, z * inv, w * inv
        is_root = r == 0
        rx = tl.sum(tl.where(is_root, x, 0.0), axis=1)[:, None]
        ry = tl.sum(tl.where(is_root, y, 0.0), axis=1)[:, None]
        rz = tl.sum(tl.where(is_root, z, 0.0), axis=1)[:, None]
        rw = tl.sum(tl.where(is_root, w, 0.0), axis=1)[:, None]
        # conj(root) * body, the root's own quaternion kept as is (world frame)
        ox = tl.where(is_root, x, rw * x - rx * w - ry * z + rz * y)
        oy = tl.where(is_root, y, rw * y + rx * z - ry * w - rz * x)
        oz = tl.where(is_root, z, rw * z - rx * y + ry * x - rz * w)
        ow = tl.where(is_root, w, rw * w + rx * x + ry * y + rz * z)
        tl.store(out_ptr + o2 + qo, ox, mask=rm)
        tl.store(out_ptr + o2 + qo + 1, oy, mask=rm)
        tl.store(out_ptr + o2 + qo + 2, oz, mask=rm)
        tl.store(out_ptr + o2 + qo + 3, ow, mask=rm)

        # --- the root position: lerp (the origin of the root frame) ---
        px0 = tl.load(table_ptr + row0, mask=qm, other=0.0)
        py0 = tl.load(table_ptr + row0 + 1, mask=qm, other=0.0)
        pz0 = tl.load(table_ptr + row0 + 2, mask=qm, other=0.0)
        px = px0 + blend * (tl.load(table_ptr + row1, mask=qm, other=0.0) - px0)
        py = py0 + blend * (tl.load(table_ptr + row1 + 1, mask=qm, other=0.0) - py0)
        pz = pz0 + blend * (tl.load(table_ptr + row1 + 2, mask=qm, other=0.0) - pz0)
        tl.store(out_ptr + orow, px, mask=qm)
        tl.store(out_ptr + orow + 1, py, mask=qm)
        tl.store(out_ptr + orow + 2, pz, mask=qm)

        # --- vectors: lerp, body positions from the root, all rotated by the root's inverse ---
        v = tl.arange(0, BLOCK_V)[None, :]
        vm = qm[:, None] & (v < NB + 2)
        vo = 3 + 3 * v
        vx0 = tl.load(table_ptr + r0 + vo, mask=vm, other=0.0)
        vy0 = tl.load(table_ptr + r0 + vo + 1, mask=vm, other=0.0)
        vz0 = tl.load(table_ptr + r0 + vo + 2, mask=vm, other=0.0)
        vx = vx0 + b2 * (tl.load(table_ptr + r1 + vo, mask=vm, other=0.0) - vx0)
        vy = vy0 + b2 * (tl.load(table_ptr + r1 + vo + 1, mask=vm, other=0.0) - vy0)
        vz = vz0 + b2 * (tl.load(table_ptr + r1 + vo + 2, mask=vm, other=0.0) - vz0)
        is_pos = v >= 2
        vx = tl.where(is_pos, vx - px[:, None], vx)
        vy = tl.where(is_pos, vy - py[:, None], vy)
        vz = tl.where(is_pos, vz - pz[:, None], vz)
        tx = 2.0 * (ry * vz - rz * vy)  # t = 2 cross(xyz, v); v' = v - w t + cross(xyz, t)
        ty = 2.0 * (rz * vx - rx * vz)
        tz = 2.0 * (rx * vy - ry * vx)
        tl.store(out_ptr + o2 + vo, vx - rw * tx + (ry * tz - rz * ty), mask=vm)
        tl.store(out_ptr + o2 + vo + 1, vy - rw * ty + (rz * tx - rx * tz), mask=vm)
        tl.store(out_ptr + o2 + vo + 2, vz - rw * tz + (rx * ty - ry * tx), mask=vm)

        # --- joint positions and velocities: lerp ---
        j = tl.arange(0, BLOCK_S)[None, :]
        jm = qm[:, None] & (j < 2 * NJ)
        s0 = tl.load(table_ptr + r0 + SOFF + j, mask=jm, other=0.0)
        s1 = tl.load(table_ptr + r1 + SOFF + j, mask=jm, other=0.0)
        tl.store(out_ptr + o2 + SOFF + j, s0 + b2 * (s1 - s0), mask=jm)


def _check(table, start, num_frames, length, dt, loop, motion_ids, episode_times, frame_offsets, num_joints,
           num_bodies) -> int:
    """Shapes and dtypes of a fetch's inputs; returns the row width."""
    width = 3 * (num_bodies + 3) + 2 * num_joints + 4 * (num_bodies + 1)
    if table.dim() != 2 or table.shape[1] != width or table.dtype != torch.float32:
        raise ValueError(f"table must be fp32 [frames, {width}] (grouped rows for {num_joints} joints and "
                         f"{num_bodies} bodies), got {table.dtype} {tuple(table.shape)}")
    m = start.numel()
    for name, t, dts in (("start", start, (torch.int64,)), ("num_frames", num_frames, (torch.int64,)),
                         ("length", length, (torch.float32,)), ("dt", dt, (torch.float32,)),
                         ("loop", loop, (torch.bool, torch.int32))):
        if t.dim() != 1 or t.numel() != m or t.dtype not in dts:
            raise ValueError(f"{name} must be [motions={m}] of {[str(d) for d in dts]}, got {t.dtype} "
                             f"{tuple(t.shape)}")
    if motion_ids.dim() != 1 or motion_ids.dtype != torch.int64:
        raise ValueError(f"motion_ids must be int64 [envs], got {motion_ids.dtype} {tuple(motion_ids.shape)}")
    if episode_times.shape != motion_ids.shape or episode_times.dtype != torch.float32:
        raise ValueError(f"episode_times must be fp32 {tuple(motion_ids.shape)}, got {episode_times.dtype} "
                         f"{tuple(episode_times.shape)}")
    if frame_offsets.dim() != 1 or frame_offsets.numel() < 1 or frame_offsets.dtype != torch.float32:
        raise ValueError(f"frame_offsets must be fp32 [K >= 1], got {frame_offsets.dtype} {tuple(frame_offsets.shape)}")
    return width


def motion_fetch_ref(table, start, num_frames, length, dt, loop, motion_ids, episode_times, frame_offsets,
                     num_joints: int, num_bodies: int) -> torch.Tensor:
    """The same fetch in plain torch (wmbook.motion.fetch's fused implementation): output rows [envs * K, W]."""
    width = _check(table, start, num_frames, length, dt, loop, motion_ids, episode_times, frame_offsets, num_joints,
                   num_bodies)
    lib = _TableView(table, start, num_frames, length, dt, loop.bool(), num_joints, num_bodies)
    ids = motion_ids.repeat_interleave(frame_offsets.numel())
    times = (episode_times.unsqueeze(1) + frame_offsets).reshape(-1)
    out = torch.empty(ids.numel(), width, dtype=table.dtype, device=table.device)
    get_motion_state_fused(lib, ids, times, no_label, out)
    return out


class _TableView:
    """The parts of a MotionLibrary the fused implementation reads, over a grouped table."""

    def __init__(self, table, start, num_frames, length, dt, loop, num_joints, num_bodies):
        self._table, self.start, self.num_frames, self.length, self.dt, self.loop = (table, start, num_frames, length,
                                                                                    dt, loop)
        self.num_joints, self.num_bodies = num_joints, num_bodies
        self._layout = RowLayout(grouped_fields(num_joints, num_bodies))

    def grouped(self):
        return self._table

    def layout(self, kind):
        return self._layout


def fetch_bytes(num_envs: int, frames_per_env: int, num_motions: int, width: int, element_size: int = 4) -> int:
    """The fewest bytes a fetch moves: each query's two frame rows read once and its output row written once, each
    robot's clip id and time read once, the clips' five metadata values (start, frames, length, dt, loop) read once."""
    return (3 * num_envs * frames_per_env * width * element_size + num_envs * (8 + 4)
            + num_motions * (8 + 8 + 4 + 4 + 4))


def motion_fetch_bytes(table, start, motion_ids, frame_offsets) -> int:
    """fetch_bytes of a launch's arguments."""
    return fetch_bytes(motion_ids.numel(), frame_offsets.numel(), start.numel(), table.shape[1], table.element_size())


# On CUDA the queries per program and the warps are picked by measurement, once per query count (triton.autotune,
# key Q): at a few thousand robots the fetch is latency-bound, where smaller programs fill more SMs (H100, 4096 robots:
# 10.0 us of GPU time per fetch with 8 queries and 4 warps a program, 6.1 us autotuned, against a 4.6 us bytes floor;
# the wall time with CUDA graphs, 71 us, is the host's). sm_90, ptxas: 8
# queries and 4 warps use 96 registers, 16 use 188, no spills. The interpreter runs one program at a time: one fixed,
# larger block there.
TUNE_CONFIGS = tuple((bq, nw) for bq in (1, 2, 4, 8, 16) for nw in (1, 2, 4))
_tuned_kernel = None


def _cuda_kernel():
    """The autotuned kernel (built at first use: nothing is compiled or measured at import)."""
    global _tuned_kernel
    if _tuned_kernel is None:
        _tuned_kernel = triton.autotune(
            configs=[triton.Config({"BLOCK_Q": bq}, num_warps=nw) for bq, nw in TUNE_CONFIGS], key=["Q"],
        )(_motion_fetch_kernel)
    return _tuned_kernel


def tuned_config(nq: int) -> dict | None:
    """The (BLOCK_Q, num_warps) autotune picked for `nq` queries on CUDA (None before the first such call)."""
    k = _tuned_kernel
    if k is None:
        return None
    for key, cfg in k.cache.items():
        if key and key[0] == nq:
            return {"BLOCK_Q": cfg.kwargs["BLOCK_Q"], "num_warps": cfg.num_warps}
    return None


def motion_fetch(table, start, num_frames, length, dt, loop, motion_ids, episode_times, frame_offsets,
                 num_joints: int, num_bodies: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """The Triton launcher: output rows [envs * K, W] (into `out` when given: the term's buffers, no copy)."""
    width = _check(table, start, num_frames, length, dt, loop, motion_ids, episode_times, frame_offsets, num_joints,
                   num_bodies)
    k = frame_offsets.numel()
    nq = motion_ids.numel() * k
    if out is None:
        out = torch.empty(nq, width, dtype=table.dtype, device=table.device)
    elif out.shape != (nq, width) or not out.is_contiguous() or out.dtype != table.dtype:
        raise ValueError(f"out must be contiguous {table.dtype} [{nq}, {width}], got {out.dtype} {tuple(out.shape)}")
    if nq == 0:
        return out
    loop = loop.to(torch.int32) if loop.dtype == torch.bool else loop
    args = (table, start, num_frames, length, dt, loop, motion_ids, episode_times, frame_offsets, out, nq, k)
    shape = dict(W=width, NB=num_bodies, NJ=num_joints, NEAR=NEAR_PARALLEL_SIN, BLOCK_V=next_pow2(num_bodies + 2),
                 BLOCK_S=next_pow2(2 * num_joints), BLOCK_R=next_pow2(num_bodies + 1))
    if table.is_cuda:  # measured once per query count, then cached (the timing calls rewrite `out` with the same rows)
        _cuda_kernel()[lambda meta: (triton.cdiv(nq, meta["BLOCK_Q"]),)](*args, **shape)
    else:
        _motion_fetch_kernel[(triton.cdiv(nq, 128),)](*args, **shape, BLOCK_Q=128, num_warps=4)
    return out


@torch.library.custom_op("wmbook::motion_fetch", mutates_args=())
def motion_fetch_op(table: torch.Tensor, start: torch.Tensor, num_frames: torch.Tensor, length: torch.Tensor,
                    dt: torch.Tensor, loop: torch.Tensor, motion_ids: torch.Tensor, episode_times: torch.Tensor,
                    frame_offsets: torch.Tensor, num_joints: int, num_bodies: int) -> torch.Tensor:
    """The custom op torch.compile sees: the Triton kernel where it runs, else the reference."""
    args = (table, start, num_frames, length, dt, loop, motion_ids, episode_times, frame_offsets, num_joints,
            num_bodies)
    if runs_triton(table.device) and triton is not None:
        return motion_fetch(*args)
    return motion_fetch_ref(*args)


@motion_fetch_op.register_fake
def _(table, start, num_frames, length, dt, loop, motion_ids, episode_times, frame_offsets, num_joints, num_bodies):
    return table.new_empty(motion_ids.shape[0] * frame_offsets.shape[0], table.shape[1])


__all__ = ["fetch_bytes", "motion_fetch", "motion_fetch_bytes", "motion_fetch_op", "motion_fetch_ref"]
