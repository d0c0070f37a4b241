"""A deterministic procedural game world: an arena larger than the view, an agent moved with the keyboard, a view
panned with the mouse. numpy only, CPU, no download.

One episode (`render_episode(seed, num_frames)`):
- the arena (ARENA x ARENA pixels) is a textured ground (smooth value noise through an earthy palette, a tile grid,
  paths) with static objects on it (rocks, houses, ponds, crates) and tree canopies drawn *above* the agent, so the
  agent is occluded when it walks under one;
- the agent is a magenta disc with a dark rim (no other pixel of the world is magenta: `locate_agent` finds it with a
  colour mask);
- dynamics with momentum: velocity v <- DAMPING * v + ACCEL * key direction; position clamped to the arena;
- the view (VIEW x VIEW) pans with the mouse: camera <- camera + PAN * mouse, clamped to the arena;
- actions follow a seeded random policy with persistence: a key (none, W, S, A, D) held for 6..20 frames (steered
  away from walls), a smooth mouse (random targets every 8..24 frames blended with a pull that keeps the agent in
  view, low-pass filtered).

Action convention: `keyboard[t]`, `mouse[t]` (and `action[t]`) are taken *at* frame t and produce frame t + 1, so the
last action of an episode moves nothing inside it. This is the Matrix-Game-2 convention of wmbook's action modules:
latent frame i sees the raw actions of pixel frames before 4i (wmbook.models.action.action_windows).

Formats: frames uint8 [T, H, W, 3]; keyboard float32 [T, 4] one-hot rows (W, S, A, D) or all zero (no key); mouse
float32 [T, 2] in [-1, 1] (pan x, pan y), the Matrix-Game-2 `{"keyboard", "mouse"}` conditions of
wmbook.pipelines.causal; robot-like `state` float32 [T, STATE_DIM] (agent x, y, vx, vy, camera x, y, each scaled to
about [-1, 1]) and `action` float32 [T, ACTION_DIM] (keyboard 4 | mouse 2) for the WMA workload; `agent_xy` float32
[T, 2] the agent's true centre in view pixels (x, y), and `agent_visible` float32 [T] the fraction of its sprite that
is visible (0 when occluded or outside the view).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

ARENA = 192  # arena side, pixels
VIEW = 64  # view side, pixels (the models' frame size)
AGENT_R = 4  # agent disc radius, pixels
ACCEL = 0.35  # px / frame^2 while a key is held
DAMPING = 0.8  # velocity kept per frame (terminal speed ACCEL / (1 - DAMPING) = 1.75 px / frame)
PAN = 2.0  # px / frame at mouse = 1
KEYS = ("W", "S", "A", "D")  # keyboard columns: up, down, left, right (image y grows downward)
KEY_DIRS = np.array([[0.0, -1.0], [0.0, 1.0], [-1.0, 0.0], [1.0, 0.0]])
STATE_DIM = 6
ACTION_DIM = 6
AGENT_RGB = (235, 30, 220)  # the only magenta in the world
AGENT_RIM = (70, 10, 60)


@dataclass
class Episode:
    """One rendered episode (see the module docstring for the formats)."""

    seed: int
    frames: np.ndarray  # uint8 [T, H, W, 3]
    keyboard: np.ndarray  # float32 [T, 4]
    mouse: np.ndarray  # float32 [T, 2]
    state: np.ndarray  # float32 [T, STATE_DIM]
    action: np.ndarray  # float32 [T, ACTION_DIM]
    agent_xy: np.ndarray  # float32 [T, 2] view pixels (x, y)
    agent_visible: np.ndarray  # float32 [T]

    def __len__(self) -> int:
        return self.frames.shape[0]


def _check_int(name: str, v, lo: int, hi: int | None = None) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < lo or (hi is not None and v > hi):
        allowed = f"an integer >= {lo}" if hi is None else f"an integer in [{lo}, {hi}]"
        raise ValueError(f"{name}={v!r} is not allowed; allowed values: {allowed}")
    return int(v)


# --------------------------------------------------------------------------------------------------------------
# The static arena
# --------------------------------------------------------------------------------------------------------------


def _value_noise(rng: np.random.Generator, size: int, cells: int) -> np.ndarray:
    """Smooth noise in [0, 1]: a random (cells+1)^2 grid bilinearly upsampled to size x size."""
    g = rng.random((cells + 1, cells + 1))
    x = np.linspace(0, cells, size, endpoint=False)
    i = x.astype(int)
    f = x - i
    f = f * f * (3 - 2 * f)  # smoothstep
    a = g[i][:, i] * (1 - f)[None, :] + g[i][:, i + 1] * f[None, :]
    b = g[i + 1][:, i] * (1 - f)[None, :] + g[i + 1][:, i + 1] * f[None, :]
    return a * (1 - f)[:, None] + b * f[:, None]


def _disc(h: int, w: int, cy: float, cx: float, ry: float, rx: float) -> np.ndarray:
    yy, xx = np.mgrid[0:h, 0:w]
    return ((yy - cy) / ry) ** 2 + ((xx - cx) / rx) ** 2 <= 1.0


def _arena(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ground+objects uint8 [A, A, 3], canopy colours uint8 [A, A, 3], canopy mask bool [A, A])."""
    a = ARENA
    n = 0.55 * _value_noise(rng, a, 6) + 0.3 * _value_noise(rng, a, 24) + 0.15 * rng.random((a, a))
    base = np.array(rng.choice([[96, 140, 70], [120, 150, 80], [150, 135, 90]], axis=0), dtype=np.float64)
    ground = base[None, None, :] * (0.7 + 0.6 * n[..., None])
    tile = 16
    yy, xx = np.mgrid[0:a, 0:a]
    ground[((yy % tile) == 0) | ((xx % tile) == 0)] *= 0.85  # a faint tile grid
    for _ in range(2):  # sandy paths
        if rng.random() < 0.5:
            y0, wdt = rng.integers(20, a - 20), rng.integers(5, 9)
            ground[y0:y0 + wdt, :] = [186, 170, 120] * (0.9 + 0.2 * n[y0:y0 + wdt, :, None])
        else:
            x0, wdt = rng.integers(20, a - 20), rng.integers(5, 9)
            ground[:, x0:x0 + wdt] = [186, 170, 120] * (0.9 + 0.2 * n[:, x0:x0 + wdt, None])
    img = ground
    for _ in range(int(rng.integers(28, 40))):  # static objects below the agent
        kind = rng.integers(0, 4)
        cy, cx = rng.uniform(8, a - 8, size=2)
        if kind == 0:  # rock: grey ellipse with a highlight
            ry, rx = rng.uniform(3, 7, size=2)
            m = _disc(a, a, cy, cx, ry, rx)
            img[m] = rng.uniform(100, 150) * np.array([1.0, 1.0, 1.05])
            img[_disc(a, a, cy - ry / 3, cx - rx / 3, ry / 3, rx / 3)] = [200, 200, 205]
        elif kind == 1:  # house: brown walls, red roof, dark door
            h, w = rng.integers(10, 18, size=2)
            y0, x0 = int(cy) - h // 2, int(cx) - w // 2
            ys, xs = slice(max(y0, 0), max(y0 + h, 0)), slice(max(x0, 0), max(x0 + w, 0))
            img[ys, xs] = [140, 95, 60]
            img[max(y0, 0):max(y0 + h // 3, 0), xs] = [170, 50, 40]
            img[max(y0 + h - 5, 0):max(y0 + h, 0), max(x0 + w // 2 - 1, 0):max(x0 + w // 2 + 2, 0)] = [50, 35, 25]
        elif kind == 2:  # pond: blue ellipse with a light ring
            ry, rx = rng.uniform(6, 12, size=2)
            img[_disc(a, a, cy, cx, ry + 1.5, rx + 1.5)] = [150, 180, 200]
            img[_disc(a, a, cy, cx, ry, rx)] = [40, 80, 170]
        else:  # crate: yellow-brown square with a cross
            s = int(rng.integers(5, 9))
            y0, x0 = int(cy), int(cx)
            img[y0:y0 + s, x0:x0 + s] = [200, 160, 60]
            for k in range(s):
                if y0 + k < a and x0 + k < a:
                    img[y0 + k, x0 + k] = [110, 80, 30]
                if y0 + k < a and x0 + s - 1 - k < a:
                    img[y0 + k, x0 + s - 1 - k] = [110, 80, 30]
    ground = np.clip(img, 0, 255).astype(np.uint8)
    canopy = np.zeros((a, a, 3), dtype=np.float64)
    cmask = np.zeros((a, a), dtype=bool)
    leaf = _value_noise(rng, a, 40)
    for _ in range(int(rng.integers(8, 13))):  # tree canopies above the agent
        cy, cx = rng.uniform(10, a - 10, size=2)
        r = rng.uniform(7, 12)
        m = _disc(a, a, cy, cx, r, r)
        cmask |= m
        canopy[m] = np.array([30, 95, 40]) * (0.6 + 0.8 * leaf[m, None])
    return ground, np.clip(canopy, 0, 255).astype(np.uint8), cmask


_SPRITE = _disc(2 * AGENT_R + 1, 2 * AGENT_R + 1, AGENT_R, AGENT_R, AGENT_R + 0.3, AGENT_R + 0.3)
_CORE = _disc(2 * AGENT_R + 1, 2 * AGENT_R + 1, AGENT_R, AGENT_R, AGENT_R - 0.9, AGENT_R - 0.9)


# --------------------------------------------------------------------------------------------------------------
# The policy and the dynamics
# --------------------------------------------------------------------------------------------------------------


def _policy(rng: np.random.Generator, num_frames: int):
    """A stateful seeded policy: returns step(pos, vel, cam) -> (key index or -1, mouse [2])."""
    st = {"key": -1, "hold": 0, "target": np.zeros(2), "retarget": 0, "mouse": np.zeros(2)}

    def step(pos, cam):
        if st["hold"] <= 0:
            probs = np.array([0.2, 0.2, 0.2, 0.2, 0.2])  # none, W, S, A, D
            margin = 24
            if pos[1] < margin:
                probs[1] = 0.02
            if pos[1] > ARENA - margin:
                probs[2] = 0.02
            if pos[0] < margin:
                probs[3] = 0.02
            if pos[0] > ARENA - margin:
                probs[4] = 0.02
            st["key"] = int(rng.choice(5, p=probs / probs.sum())) - 1
            st["hold"] = int(rng.integers(6, 21))
        st["hold"] -= 1
        if st["retarget"] <= 0:
            st["target"] = rng.uniform(-0.7, 0.7, size=2)
            st["retarget"] = int(rng.integers(8, 25))
        st["retarget"] -= 1
        # pull toward a view that keeps the agent inside its central 60%
        rel = (pos - cam) / VIEW - 0.5  # agent position in the view, -0.5 .. 0.5
        pull = np.where(np.abs(rel) > 0.2, np.sign(rel) * (np.abs(rel) - 0.2) * 4.0, 0.0)
        want = np.clip(st["target"] * 0.6 + pull, -1, 1)
        st["mouse"] = 0.8 * st["mouse"] + 0.2 * want
        return st["key"], np.clip(st["mouse"], -1, 1)

    return step


def render_episode(seed: int, num_frames: int = 49) -> Episode:
    """Render one episode of `num_frames` frames from `seed` (same seed, same bytes)."""
    seed = _check_int("seed", seed, 0)
    t_total = _check_int("num_frames", num_frames, 1, 100_000)
    rng = np.random.default_rng([seed, 0x57A1D])
    ground, canopy, cmask = _arena(rng)
    policy = _policy(rng, t_total)
    pos = rng.uniform(48, ARENA - 48, size=2)  # agent centre (x, y), arena pixels
    vel = np.zeros(2)
    cam = np.clip(pos - VIEW / 2 + rng.uniform(-8, 8, size=2), 0, ARENA - VIEW)  # view top-left (x, y)

    frames = np.empty((t_total, VIEW, VIEW, 3), dtype=np.uint8)
    keyboard = np.zeros((t_total, 4), dtype=np.float32)
    mouse = np.zeros((t_total, 2), dtype=np.float32)
    state = np.zeros((t_total, STATE_DIM), dtype=np.float32)
    agent_xy = np.zeros((t_total, 2), dtype=np.float32)
    visible = np.zeros(t_total, dtype=np.float32)
    d = 2 * AGENT_R + 1
    n_sprite = int(_SPRITE.sum())
    vmax = ACCEL / (1 - DAMPING)
    for t in range(t_total):
        # render frame t from the current state
        cx, cy = int(round(cam[0])), int(round(cam[1]))
        ax, ay = int(round(pos[0])), int(round(pos[1]))
        fr = ground[cy:cy + VIEW, cx:cx + VIEW].copy()
        vx0, vy0 = ax - AGENT_R - cx, ay - AGENT_R - cy  # sprite top-left in the view
        y0, y1 = max(vy0, 0), min(vy0 + d, VIEW)
        x0, x1 = max(vx0, 0), min(vx0 + d, VIEW)
        seen = 0
        if y0 < y1 and x0 < x1:
            sub = fr[y0:y1, x0:x1]
            spr = _SPRITE[y0 - vy0:y1 - vy0, x0 - vx0:x1 - vx0]
            core = _CORE[y0 - vy0:y1 - vy0, x0 - vx0:x1 - vx0]
            sub[spr] = AGENT_RIM
            sub[core] = AGENT_RGB
            over = cmask[cy + y0:cy + y1, cx + x0:cx + x1]
            seen = int((spr & ~over).sum())
        m = cmask[cy:cy + VIEW, cx:cx + VIEW]
        fr[m] = canopy[cy:cy + VIEW, cx:cx + VIEW][m]
        frames[t] = fr
        agent_xy[t] = (ax - cx, ay - cy)
        visible[t] = seen / n_sprite
        state[t] = (pos[0] / ARENA * 2 - 1, pos[1] / ARENA * 2 - 1, vel[0] / vmax, vel[1] / vmax,
                    cam[0] / (ARENA - VIEW) * 2 - 1, cam[1] / (ARENA - VIEW) * 2 - 1)
        # the action taken at frame t, producing frame t + 1
        key, mo = policy(pos, cam)
        if key >= 0:
            keyboard[t, key] = 1.0
        mouse[t] = mo
        acc = KEY_DIRS[key] * ACCEL if key >= 0 else np.zeros(2)
        vel = DAMPING * vel + acc
        new = pos + vel
        lo, hi = AGENT_R + 1, ARENA - AGENT_R - 2
        hit = (new < lo) | (new > hi)
        vel[hit] = 0.0
        pos = np.clip(new, lo, hi)
        cam = np.clip(cam + PAN * mouse[t].astype(np.float64), 0, ARENA - VIEW)
    action = np.concatenate([keyboard, mouse], axis=1)
    return Episode(seed=seed, frames=frames, keyboard=keyboard, mouse=mouse, state=state, action=action,
                   agent_xy=agent_xy, agent_visible=visible)


# --------------------------------------------------------------------------------------------------------------
# The detector
# --------------------------------------------------------------------------------------------------------------


def agent_colour(r, g, b):
    """The agent's magenta (red and blue high, green low) on signed channel values (numpy int16 arrays or torch
    int16 tensors alike): one rule for the detector here and the training objectives' agent weighting."""
    return (r - g > 110) & (b - g > 100) & (r > 140) & (b > 130)


def agent_mask(frames: np.ndarray) -> np.ndarray:
    """bool [..., H, W]: pixels whose colour is close to the agent's magenta (agent_colour)."""
    f = np.asarray(frames).astype(np.int16)
    return agent_colour(f[..., 0], f[..., 1], f[..., 2])


def locate_agent(frames: np.ndarray, min_pixels: int = 3) -> np.ndarray:
    """Agent centre per frame from a colour mask: uint8 [T, H, W, 3] (or one [H, W, 3]) -> float32 [T, 2] (x, y)
    view pixels; NaN where fewer than `min_pixels` magenta pixels are found."""
    fr = np.asarray(frames)
    if fr.ndim == 3:
        fr = fr[None]
    if fr.ndim != 4 or fr.shape[-1] != 3:
        raise ValueError(f"frames must be uint8 [T, H, W, 3] or [H, W, 3]; got shape {tuple(np.shape(frames))}")
    m = agent_mask(fr)
    n = m.sum(axis=(1, 2))
    yy, xx = np.mgrid[0:fr.shape[1], 0:fr.shape[2]]
    with np.errstate(invalid="ignore", divide="ignore"):
        x = (m * xx).sum(axis=(1, 2)) / n
        y = (m * yy).sum(axis=(1, 2)) / n
    out = np.stack([x, y], axis=1).astype(np.float32)
    out[n < min_pixels] = np.nan
    return out


def strided_actions(action, start, steps: int, stride: int):
    """The actions of `steps` model steps of `stride` rendered frames each, from frame `start` on: step j is the mean
    of action[start + j * stride : start + (j + 1) * stride] (the frames it spans; stride 1: the actions themselves).
    `action` [..., L, A] (numpy or torch, L covering start + steps * stride), `start` an int or a tensor of shape
    action.shape[:-2] (one start per leading index): [..., steps, A]."""
    import torch  # noqa: PLC0415  heavy: torch (this module is numpy-only)

    if isinstance(stride, bool) or not isinstance(stride, int) or stride < 1:
        raise ValueError(f"stride={stride!r} is not allowed; allowed values: an integer >= 1")
    if isinstance(start, int):
        chunk = action[..., start:start + steps * stride, :]
        if chunk.shape[-2] != steps * stride:
            raise ValueError(f"{steps} steps of stride {stride} from frame {start} need {start + steps * stride} "
                             f"frames; the actions have {action.shape[-2]}")
        return chunk.reshape(*chunk.shape[:-2], steps, stride, chunk.shape[-1]).mean(-2)
    idx = start[..., None] + torch.arange(steps * stride, device=start.device)  # [..., steps * stride]
    chunk = torch.gather(action, -2, idx[..., None].expand(*idx.shape, action.shape[-1]))
    return chunk.unflatten(-2, (steps, stride)).mean(-2)
