"""Timing harness: measured values with their unit, device-event timing, stream metrics (FPS/BPS)."""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field

import torch

from .presets import resolve_device


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
class Samples:
    """Repeated measurements of one quantity, with its unit, and their summary statistics.

    `time_fn` gives milliseconds (unit "ms"); FPS, seconds per iteration and the like carry their own unit.
    """

    values: list[float] = field(default_factory=list)
    unit: str = "ms"

    @property
    def n(self) -> int:
        return len(self.values)

    @property
    def median(self) -> float:
        return _percentile(self.values, 50)

    @property
    def p20(self) -> float:
        return _percentile(self.values, 20)

    @property
    def p80(self) -> float:
        return _percentile(self.values, 80)

    @property
    def p95(self) -> float:
        return _percentile(self.values, 95)

    @property
    def mean(self) -> float:
        return statistics.fmean(self.values) if self.values else math.nan

    @property
    def std(self) -> float:
        return statistics.stdev(self.values) if self.n > 1 else 0.0

    @property
    def min(self) -> float:
        return min(self.values) if self.values else math.nan

    @property
    def max(self) -> float:
        return max(self.values) if self.values else math.nan

    def summary(self) -> dict:
        """Statistics as a flat dict (in `unit`)."""
        return {"median": self.median, "p20": self.p20, "p80": self.p80, "p95": self.p95, "mean": self.mean,
                "std": self.std, "min": self.min, "max": self.max, "n": self.n}

    def __str__(self) -> str:
        return f"{self.median:.3g} {self.unit} (p20 {self.p20:.3g}, p80 {self.p80:.3g}, n={self.n})"


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_fn(fn, *, warmup: int = 3, repeats: int = 10, device=None, sync: bool = True, before=None) -> Samples:
    """Time fn() `repeats` times after `warmup` untimed calls.

    CUDA with sync=True: a pair of CUDA events around each call, one synchronize at the end.
    CPU, or sync=False: host perf_counter around each call (sync=False on CUDA measures
    host/launch time only, nothing waits for the device).
    `before()`: called before each timed call, outside the timed span (e.g. a write that flushes the L2).
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
                if before is not None:
                    before()
                start.record()
                fn()
                end.record()
                pairs.append((start, end))
            torch.cuda.synchronize(dev)
        return Samples([float(s.elapsed_time(e)) for s, e in pairs], "ms")

    times = []
    for _ in range(repeats):
        if before is not None:
            before()
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return Samples(times, "ms")


def time_back_to_back(fn, *, calls: int = 50, rounds: int = 10, warmup: int = 3, device=None) -> Samples:
    """ms per call of `calls` back-to-back calls, `rounds` times after `warmup` untimed calls: one pair of CUDA events
    (a host clock and a synchronize on a CPU) around each round, nothing waits between calls. What a loop that issues
    one call per step pays: the host issues the next call while the device runs the last, so a call costs the larger
    of its host time and its device time (time_fn's one-call-at-a-time wall is their sum when the device idles
    between calls)."""
    for name, v, lo in (("calls", calls, 1), ("rounds", rounds, 1), ("warmup", warmup, 0)):
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise ValueError(f"{name}={v!r} is not allowed; allowed values: an integer >= {lo}")
    dev = resolve_device(device)
    for _ in range(warmup):
        fn()
    _sync(dev)
    out = []
    for _ in range(rounds):
        if dev.type == "cuda":
            with torch.cuda.device(dev):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(calls):
                    fn()
                end.record()
                end.synchronize()
                out.append(float(start.elapsed_time(end)) / calls)
        else:
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            out.append((time.perf_counter() - t0) * 1e3 / calls)
    return Samples(out, "ms")


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


@dataclass
class ReplayFloor:
    """What one CUDA-graph replay costs on this machine when the graph holds a single one-element kernel: `loop`, ms
    per replay issued back to back (time_back_to_back), and `host_ms`, the median host time to issue one. No step
    that replays one graph can cost less in a loop: past the bytes it must move, this is the floor of a captured
    step (notebook 07's fetch). A bare torch.cuda.CUDAGraph, not wmbook.graphs.GraphedCallable: the floor leaves
    out the wrapper's own host work, which a captured fetch's loop time then shows."""

    loop: Samples
    host_ms: float

    @property
    def ms(self) -> float:
        return self.loop.median


def capture_graph(fn, calls: int = 1, *, warmup: int = 1, device=None) -> torch.cuda.CUDAGraph:
    """A bare CUDA graph of `calls` calls of fn() (no arguments; its tensors keep their addresses), after `warmup`
    eager calls on a side stream (autotuning, workspaces: torch's own recipe) outside the capture."""
    dev = resolve_device(device)
    with torch.cuda.device(dev):
        side = torch.cuda.Stream(dev)
        side.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(side):
            for _ in range(warmup):
                fn()
        torch.cuda.current_stream(dev).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(calls):
                fn()
    return graph


def graph_replay_floor(device=None, *, calls: int = 50, rounds: int = 10) -> ReplayFloor | None:
    """Measure ReplayFloor on a CUDA device (None on any other: there is no graph to replay)."""
    dev = resolve_device(device)
    if dev.type != "cuda":
        return None
    x = torch.zeros(1, device=dev)
    graph = capture_graph(lambda: x.add_(1), device=dev)
    loop = time_back_to_back(graph.replay, calls=calls, rounds=rounds, warmup=3, device=dev)
    host = statistics.median(host_launch_ms(graph.replay, dev) for _ in range(rounds))
    return ReplayFloor(loop, host)


def time_in_graph(fn, k: int = 16, *, rounds: int = 10, warmup: int = 3, device=None) -> Samples | None:
    """ms per call of `fn` when `k` calls are captured in one CUDA graph and the graph is replayed back to back: the
    call's cost inside a larger captured program (its kernels and the gaps between them), the graph's launch shared
    by k calls. Against time_back_to_back of a graph holding one call, it tells the launch's share of a captured
    step. `fn` takes no arguments and keeps its tensors' addresses (its work on the same buffers each call). None
    off a CUDA device (nothing to capture)."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k={k!r} is not allowed; allowed values: an integer >= 1")
    dev = resolve_device(device)
    if dev.type != "cuda":
        return None
    graph = capture_graph(fn, k, warmup=warmup, device=dev)
    loop = time_back_to_back(graph.replay, calls=max(1, 64 // k), rounds=rounds, warmup=3, device=dev)
    return Samples([v / k for v in loop.values], loop.unit)


def spin_up(device=None, ms: float = 100.0) -> float:
    """Keep a CUDA device busy for about `ms` milliseconds (back-to-back 4096^2 bf16 matmuls), so the next timing
    starts at full clocks: after a quiet spell (a torch.compile, host-side setup) a GPU lowers its clocks, and a
    short timing that starts then can mix slow and fast calls (the suspected cause of notebook 05's first call sites
    on the H100: p20-p80 of 10-43 us around a 26 us median, not yet confirmed by a re-run). Returns the milliseconds
    spent; a CPU device returns 0 at once."""
    if isinstance(ms, bool) or not isinstance(ms, (int, float)) or not 0 <= ms <= 10_000:
        raise ValueError(f"ms={ms!r} is not allowed; allowed values: a number in [0, 10000]")
    dev = resolve_device(device)
    if dev.type != "cuda" or ms == 0:
        return 0.0
    with torch.cuda.device(dev):
        a = torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16)
        t0 = time.perf_counter()
        while (time.perf_counter() - t0) * 1e3 < ms:
            for _ in range(8):
                a @ a
            torch.cuda.synchronize(dev)
        return (time.perf_counter() - t0) * 1e3


def time_once(fn, device=None) -> float:
    """One cold wall-clock measurement in ms (e.g. compile), synchronizing before and after."""
    dev = resolve_device(device)
    _sync(dev)
    t0 = time.perf_counter()
    fn()
    _sync(dev)
    return (time.perf_counter() - t0) * 1e3


class DeviceTimer:
    """Named time marks without host syncs: CUDA events on the current stream on cuda, perf_counter on cpu.

    The one event clock of wmbook: `stamp()` records a time point, `between(a, b)` reads the milliseconds between
    two (after `synchronize()`); wmbook.profiling.SectionTimer builds its nested sections on it. Re-marking a
    name replaces it. Call synchronize() (or elapsed_ms does it) before reading.
    """

    def __init__(self, device=None):
        self.device = resolve_device(device)
        self.is_cuda = self.device.type == "cuda"
        self._marks: dict = {}
        self._synced = True

    def stamp(self):
        """A time point now: a recorded CUDA event (cuda) or perf_counter seconds (cpu)."""
        if self.is_cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record(torch.cuda.current_stream(self.device))
            self._synced = False
            return ev
        return time.perf_counter()

    def between(self, a, b) -> float:
        """Milliseconds from stamp `a` to stamp `b` (both completed: synchronize() first on cuda)."""
        return float(a.elapsed_time(b)) if self.is_cuda else (b - a) * 1e3

    def mark(self, name: str) -> None:
        """Record a time point named `name`."""
        self._marks[name] = self.stamp()

    def synchronize(self) -> None:
        """Wait until every recorded stamp has completed."""
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
        return self.between(self._marks[a], self._marks[b])

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


def dit_bench_args(description: str, argv=None):
    """The command line of the kernel tables at a causal-Wan preset's real shapes (tools/attn_bench.py,
    tools/gemm_bench.py): --preset, --repeats, --json. A bad --repeats, or no CUDA device, is refused (exit 2) before
    any work. Returns (the arguments, the preset, the CUDA device)."""
    import argparse  # noqa: PLC0415  only the tools parse command lines

    from .presets import PRESETS  # noqa: PLC0415

    ap = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="mg2-universal", choices=[k for k, p in PRESETS.items()
                                                                  if hasattr(p, "num_frame_per_block")])
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    if a.repeats < 1:
        ap.error(f"--repeats={a.repeats} is not allowed; allowed values: an integer >= 1")
    if not torch.cuda.is_available():
        ap.error("needs a CUDA device")
    return a, PRESETS[a.preset], torch.device("cuda")
