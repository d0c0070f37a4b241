"""Timing harness: device-event timing, stream metrics (FPS/BPS), peak memory."""

from __future__ import annotations

import contextlib
import math
import resource
import statistics
import sys
import time
from dataclasses import dataclass, field

import torch


def _percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile (q in [0, 100]), like numpy's default."""
    if not values:
        return math.nan
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


@dataclass
class Timing:
    """Repeated timings in milliseconds with summary statistics."""

    times_ms: list[float] = field(default_factory=list)

    @property
    def n(self) -> int:
        return len(self.times_ms)

    @property
    def median(self) -> float:
        return _percentile(self.times_ms, 50)

    @property
    def p20(self) -> float:
        return _percentile(self.times_ms, 20)

    @property
    def p80(self) -> float:
        return _percentile(self.times_ms, 80)

    @property
    def p95(self) -> float:
        return _percentile(self.times_ms, 95)

    @property
    def mean(self) -> float:
        return statistics.fmean(self.times_ms) if self.times_ms else math.nan

    @property
    def std(self) -> float:
        return statistics.stdev(self.times_ms) if self.n > 1 else 0.0

    @property
    def min(self) -> float:
        return min(self.times_ms) if self.times_ms else math.nan

    @property
    def max(self) -> float:
        return max(self.times_ms) if self.times_ms else math.nan

    def summary(self) -> dict:
        """Statistics as a flat dict (all times in ms)."""
        return {
            "median": self.median,
            "p20": self.p20,
            "p80": self.p80,
            "p95": self.p95,
            "mean": self.mean,
            "std": self.std,
            "min": self.min,
            "max": self.max,
            "n": self.n,
        }

    def __str__(self) -> str:
        return f"{self.median:.3g} ms (p20 {self.p20:.3g}, p80 {self.p80:.3g}, n={self.n})"


def resolve_device(device=None) -> torch.device:
    """None -> cuda if available else cpu; str/torch.device -> torch.device."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if isinstance(device, torch.device):
        return device
    if isinstance(device, str):
        return torch.device(device)
    raise ValueError(f"device must be None, a str or a torch.device, got {device!r}")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_fn(fn, *, warmup: int = 3, repeats: int = 10, device=None, sync: bool = True) -> Timing:
    """Time fn() `repeats` times after `warmup` untimed calls.

    CUDA with sync=True: a pair of CUDA events around each call, one synchronize at the end.
    CPU, or sync=False: host perf_counter around each call (sync=False on CUDA measures
    host/launch time only, nothing waits for the device).
    """
    if not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup must be an int >= 0, got {warmup!r}")
    if not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be an int >= 1, got {repeats!r}")
    dev = resolve_device(device)
    for _ in range(warmup):
        fn()
    if sync:
        _sync(dev)

    if dev.type == "cuda" and sync:
        with torch.cuda.device(dev):
            pairs = []
            for _ in range(repeats):
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                pairs.append((start, end))
            torch.cuda.synchronize(dev)
        return Timing([float(s.elapsed_time(e)) for s, e in pairs])

    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return Timing(times)


def host_launch_ms(fn, device=None) -> float:
    """Host time of one call in ms, from a synchronized start to fn() returning, without waiting for the device:
    against the call's device-timed wall time it says whether the forward is launch-bound."""
    dev = resolve_device(device)
    _sync(dev)
    t0 = time.perf_counter()
    fn()
    ms = (time.perf_counter() - t0) * 1e3
    _sync(dev)
    return ms


def time_once(fn, device=None) -> float:
    """One cold wall-clock measurement in ms (e.g. compile), synchronizing before and after."""
    dev = resolve_device(device)
    _sync(dev)
    t0 = time.perf_counter()
    fn()
    _sync(dev)
    return (time.perf_counter() - t0) * 1e3


class DeviceTimer:
    """Named time marks without host syncs: CUDA events on cuda, perf_counter on cpu.

    Re-marking a name replaces it. Call synchronize() (or elapsed_ms does it) before reading.
    """

    def __init__(self, device=None):
        self.device = resolve_device(device)
        self.is_cuda = self.device.type == "cuda"
        self._marks: dict = {}
        self._synced = True

    def mark(self, name: str) -> None:
        """Record a time point named `name` on the current stream (cuda) or host clock (cpu)."""
        if self.is_cuda:
            ev = torch.cuda.Event(enable_timing=True)
            with torch.cuda.device(self.device):
                ev.record()
            self._marks[name] = ev
            self._synced = False
        else:
            self._marks[name] = time.perf_counter()

    def synchronize(self) -> None:
        """Wait until every recorded mark has completed."""
        if self.is_cuda and not self._synced:
            torch.cuda.synchronize(self.device)
        self._synced = True

    @property
    def names(self) -> list[str]:
        return list(self._marks)

    def elapsed_ms(self, a: str, b: str) -> float:
        """Milliseconds from mark `a` to mark `b`."""
        for n in (a, b):
            if n not in self._marks:
                raise ValueError(f"unknown mark {n!r}; recorded marks: {self.names}")
        self.synchronize()
        if self.is_cuda:
            return float(self._marks[a].elapsed_time(self._marks[b]))
        return (self._marks[b] - self._marks[a]) * 1e3

    def reset(self) -> None:
        """Forget all marks."""
        self._marks.clear()
        self._synced = True


def stream_metrics(
    block_ms: list[float],
    frames_per_block: list[int],
    first_frame_ms: float,
    steady_from: int = 1,
) -> dict:
    """FPS/BPS over steady-state blocks (index >= steady_from; all blocks if none are).

    FPS = decoded pixel frames of those blocks / their summed time; BPS = blocks / same time.
    block_ms must cover every forward of the block (all steps, cache refresh, VAE decode).
    """
    if len(block_ms) == 0:
        raise ValueError("block_ms must hold at least one block time")
    if len(block_ms) != len(frames_per_block):
        raise ValueError(
            f"block_ms and frames_per_block must have the same length, "
            f"got {len(block_ms)} and {len(frames_per_block)}"
        )
    if not isinstance(steady_from, int) or steady_from < 0:
        raise ValueError(f"steady_from must be an int >= 0, got {steady_from!r}")
    start = steady_from if steady_from < len(block_ms) else 0
    ms = [float(x) for x in block_ms[start:]]
    frames = sum(int(f) for f in frames_per_block[start:])
    total_ms = sum(ms)
    if total_ms <= 0:
        raise ValueError(f"block_ms must sum to > 0 ms over the steady blocks, got {total_ms}")
    return {
        "fps": frames / total_ms * 1e3,
        "bps": len(ms) / total_ms * 1e3,
        "first_frame_ms": float(first_frame_ms),
        "block_ms_median": _percentile(ms, 50),
        "block_ms_p20": _percentile(ms, 20),
        "block_ms_p80": _percentile(ms, 80),
        "steady_from": start,
        "steady_blocks": len(ms),
        "steady_frames": frames,
        "steady_ms": total_ms,
        "n_blocks": len(block_ms),
    }


def _maxrss_bytes() -> int:
    # ru_maxrss is KiB on Linux, bytes on macOS
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(r) if sys.platform == "darwin" else int(r) * 1024


@dataclass
class PeakMemory:
    """Memory read by `peak_memory`: CUDA peak allocated bytes, or host RSS changes on CPU."""

    device: str
    bytes: int | None = None  # torch.cuda.max_memory_allocated within the block (cuda only)
    start_bytes: int | None = None  # allocated at entry (cuda only)
    rss_delta_bytes: int | None = None  # RSS at exit minus RSS at entry (cpu only)
    peak_rss_growth_bytes: int | None = None  # growth of the process-lifetime peak RSS (cpu)

    @property
    def delta_bytes(self) -> int | None:
        """Peak allocated above what was allocated at entry (cuda), else the RSS delta."""
        if self.bytes is not None and self.start_bytes is not None:
            return self.bytes - self.start_bytes
        return self.rss_delta_bytes

    @property
    def gib(self) -> float | None:
        return None if self.bytes is None else self.bytes / 2**30


@contextlib.contextmanager
def peak_memory(device=None):
    """Context manager yielding a PeakMemory filled in on exit (cuda: resets peak stats first)."""
    dev = resolve_device(device)
    pm = PeakMemory(device=str(dev))
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        pm.start_bytes = int(torch.cuda.memory_allocated(dev))
        try:
            yield pm
        finally:
            torch.cuda.synchronize(dev)
            pm.bytes = int(torch.cuda.max_memory_allocated(dev))
        return
    proc = None
    try:
        import psutil

        proc = psutil.Process()
        rss0 = proc.memory_info().rss
    except Exception:  # psutil missing or not permitted: skip the RSS delta
        rss0 = None
    max0 = _maxrss_bytes()
    try:
        yield pm
    finally:
        if proc is not None and rss0 is not None:
            pm.rss_delta_bytes = int(proc.memory_info().rss - rss0)
        pm.peak_rss_growth_bytes = _maxrss_bytes() - max0
