"""Quaternion math of the motion fetch, in plain torch, scalar-last (x, y, z, w).

Convention: (x, y, z, w), like Isaac Gym and Isaac Lab from 3.0 on (Isaac Lab 1.x-2.x used (w, x, y, z); the seed's
task does not say which of them it runs on, and the arithmetic is the same with the components permuted). Rotations
are active: `quat_apply(q, v)` rotates v from the body frame into the world frame, `quat_apply_inverse` back.
Everything works on [..., 4] / [..., 3] tensors and broadcasts over the leading dimensions.
"""

from __future__ import annotations

import torch

# slerp falls back to normalized lerp when sin(theta) is below this: the two differ by O(theta^3) there (< 1e-9),
# while sin(t theta) / sin(theta) loses digits
NEAR_PARALLEL_SIN = 1e-3


def quat_conjugate(q: torch.Tensor) -> torch.Tensor:
    """(-x, -y, -z, w): the inverse of a unit quaternion."""
    return torch.cat((-q[..., :3], q[..., 3:]), dim=-1)


def quat_mul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Hamilton product a * b (apply b, then a)."""
    ax, ay, az, aw = a.unbind(-1)
    bx, by, bz, bw = b.unbind(-1)
    return torch.stack((aw * bx + ax * bw + ay * bz - az * by,
                        aw * by - ax * bz + ay * bw + az * bx,
                        aw * bz + ax * by - ay * bx + az * bw,
                        aw * bw - ax * bx - ay * by - az * bz), dim=-1)


def quat_apply(q: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Rotate v [..., 3] by the unit quaternion q [..., 4] (body frame -> world frame)."""
    xyz, w = q[..., :3], q[..., 3:]
    t = 2.0 * torch.linalg.cross(xyz, v, dim=-1)
    return v + w * t + torch.linalg.cross(xyz, t, dim=-1)


def quat_apply_inverse(q: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Rotate v [..., 3] by the inverse of q [..., 4] (world frame -> body frame)."""
    xyz, w = q[..., :3], q[..., 3:]
    t = 2.0 * torch.linalg.cross(xyz, v, dim=-1)
    return v - w * t + torch.linalg.cross(xyz, t, dim=-1)


def quat_to_matrix(q: torch.Tensor) -> torch.Tensor:
    """Rotation matrix [..., 3, 3] of the unit quaternion q: R @ v == quat_apply(q, v)."""
    x, y, z, w = q.unbind(-1)
    xx, yy, zz = x * x, y * y, z * z
    xy, xz, yz, wx, wy, wz = x * y, x * z, y * z, w * x, w * y, w * z
    return torch.stack((1 - 2 * (yy + zz), 2 * (xy - wz), 2 * (xz + wy),
                        2 * (xy + wz), 1 - 2 * (xx + zz), 2 * (yz - wx),
                        2 * (xz - wy), 2 * (yz + wx), 1 - 2 * (xx + yy)), dim=-1).unflatten(-1, (3, 3))


def quat_from_axis_angle(axis: torch.Tensor, angle: torch.Tensor) -> torch.Tensor:
    """Unit quaternion of a rotation by `angle` [...] (radians) about the unit `axis` [..., 3]."""
    half = 0.5 * angle.unsqueeze(-1)
    return torch.cat((axis * torch.sin(half), torch.cos(half)), dim=-1)


def quat_from_euler_zyx(yaw: torch.Tensor, pitch: torch.Tensor, roll: torch.Tensor) -> torch.Tensor:
    """q = q_z(yaw) * q_y(pitch) * q_x(roll) (intrinsic z-y-x: heading first)."""
    ez, ey, ex = (torch.tensor(a, dtype=yaw.dtype, device=yaw.device).expand(*yaw.shape, 3)
                  for a in ((0.0, 0.0, 1.0), (0.0, 1.0, 0.0), (1.0, 0.0, 0.0)))
    return quat_mul(quat_mul(quat_from_axis_angle(ez, yaw), quat_from_axis_angle(ey, pitch)),
                    quat_from_axis_angle(ex, roll))


def slerp(q0: torch.Tensor, q1: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """Spherical linear interpolation from q0 (t=0) to q1 (t=1) along the shorter arc; t broadcasts to [..., 1].

    q and -q are the same rotation: q1 is negated where q0 . q1 < 0 (shortest path), so opposite inputs give q0.
    Near-parallel inputs (sin theta < NEAR_PARALLEL_SIN, equal ones included) use normalized lerp.
    """
    d = (q0 * q1).sum(-1, keepdim=True)
    q1 = torch.where(d < 0, -q1, q1)
    d = d.abs().clamp(max=1.0)
    theta = torch.acos(d)
    sin_theta = torch.sin(theta)
    near = sin_theta < NEAR_PARALLEL_SIN
    safe = torch.where(near, torch.ones_like(sin_theta), sin_theta)
    w0 = torch.where(near, 1.0 - t, torch.sin((1.0 - t) * theta) / safe)
    w1 = torch.where(near, t, torch.sin(t * theta) / safe)
    q = w0 * q0 + w1 * q1
    return torch.where(near, q / torch.linalg.vector_norm(q, dim=-1, keepdim=True), q)


def slerp_exact(q0: torch.Tensor, q1: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """Slerp by a different route, for tests: q0 * exp(t * log(q0^-1 q1)) on the shorter arc, in float64."""
    q0, q1 = q0.double(), q1.double()
    t = torch.as_tensor(t, dtype=torch.float64, device=q0.device)
    rel = quat_mul(quat_conjugate(q0), q1)
    rel = torch.where(rel[..., 3:] < 0, -rel, rel)  # shorter arc: w >= 0, half angle in [0, pi/2]
    vnorm = torch.linalg.vector_norm(rel[..., :3], dim=-1, keepdim=True)
    half = torch.atan2(vnorm, rel[..., 3:])  # the half angle, accurate for tiny and large angles alike
    axis = torch.where(vnorm > 0, rel[..., :3] / vnorm.clamp(min=1e-300), torch.zeros_like(rel[..., :3]))
    step = torch.cat((axis * torch.sin(t * half), torch.cos(t * half)), dim=-1)
    return quat_mul(q0, step)


__all__ = ["NEAR_PARALLEL_SIN", "quat_apply", "quat_apply_inverse", "quat_conjugate", "quat_from_axis_angle",
           "quat_from_euler_zyx", "quat_mul", "quat_to_matrix", "slerp", "slerp_exact"]
