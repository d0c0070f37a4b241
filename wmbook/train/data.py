"""Training data: a bank of rendered world episodes held as tensors (on the training device), sampled in windows.

Seeds: training episode i of data seed d is `render_episode(d * 1_000_000 + i)`; data seeds are < 1000, so every
training seed is below HELDOUT_BASE = 10^9 and held-out episodes (`wmbook.world.eval.heldout_episode`) never overlap.
"""

from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor

import numpy as np
import torch
from tqdm.auto import tqdm

from ..world.env import render_episode

HELDOUT_BASE = 10**9
MAX_DATA_SEED = 999
EPISODES_PER_SEED = 1_000_000


def train_seed(data_seed: int, i: int) -> int:
    if not 0 <= data_seed <= MAX_DATA_SEED:
        raise ValueError(f"data_seed={data_seed!r} is not allowed; allowed values: an integer in [0, {MAX_DATA_SEED}]")
    if not 0 <= i < EPISODES_PER_SEED:
        raise ValueError(f"episode index {i} outside [0, {EPISODES_PER_SEED})")
    return data_seed * EPISODES_PER_SEED + i


def _render(args):
    seed, frames = args
    e = render_episode(seed, frames)
    return e.frames, e.keyboard, e.mouse, e.state, e.action


class EpisodeBank:
    """`episodes` rendered episodes of `frames` frames: frames uint8 [N, L, H, W, 3], keyboard [N, L, 4],
    mouse [N, L, 2], state [N, L, S], action [N, L, A] (float32), all on `device`."""

    def __init__(self, data_seed: int, episodes: int, frames: int, device="cpu", workers: int = 0,
                 progress: bool = True):
        for name, v, lo in (("episodes", episodes, 1), ("frames", frames, 2), ("workers", workers, 0)):
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise ValueError(f"{name}={v!r} is not allowed; allowed values: an integer >= {lo}")
        seeds = [train_seed(data_seed, i) for i in range(episodes)]
        jobs = [(s, frames) for s in seeds]
        workers = workers or 1
        if workers > 1:
            # spawn: the parent may hold CUDA and OpenMP threads; the workers only need numpy
            with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as ex:
                out = list(tqdm(ex.map(_render, jobs, chunksize=16), total=len(jobs), desc="rendering episodes",
                                disable=not progress, leave=False))
        else:
            out = [_render(j) for j in tqdm(jobs, desc="rendering episodes", disable=not progress, leave=False)]
        cols = list(zip(*out))
        self.data_seed, self.episodes, self.length = data_seed, episodes, frames
        self.frames = torch.from_numpy(np.stack(cols[0])).to(device)
        self.keyboard, self.mouse, self.state, self.action = (torch.from_numpy(np.stack(c)).to(device)
                                                              for c in cols[1:])
        self.device = torch.device(device)

    def windows(self, gen: torch.Generator, batch: int, length: int, min_start: int = 0, stride: int = 1):
        """Random windows of `length` frames `stride` rendered frames apart: (episode idx [B], frame idx [B, length])
        drawn with `gen` (on the bank's device)."""
        span = (length - 1) * stride + 1
        hi = self.length - span + 1
        if hi <= min_start:
            raise ValueError(f"windows of {length} frames {stride} apart ({span} rendered frames, from {min_start}) "
                             f"do not fit episodes of {self.length}")
        e = torch.randint(0, self.episodes, (batch,), generator=gen, device=self.device)
        s = torch.randint(min_start, hi, (batch,), generator=gen, device=self.device)
        return e, s[:, None] + stride * torch.arange(length, device=self.device)[None, :]

    @staticmethod
    def to_video(frames_u8: torch.Tensor) -> torch.Tensor:
        """uint8 [B, T, H, W, 3] -> float [B, 3, T, H, W] in [-1, 1]."""
        return frames_u8.permute(0, 4, 1, 2, 3).float() / 127.5 - 1.0


def default_workers() -> int:
    return max(1, min(8, (os.cpu_count() or 2) // 2))
