"""How busy the host's CPUs were while a run ran, how much of that was the run's own work, and how fast a core was.

A notebook's eager rows are launch-bound and its compiles CPU-bound, so other work on the host (another tenant of a
shared machine, another queue of a set) or a slower core slows them without touching the GPU: the same UNet forward,
with the same GPU busy time, has taken 103 ms in one run and 166 ms in another. `host_load()` records, over a span,
the host's busy CPUs (all work, from its CPU counters), the CPUs this process and its descendants used (sampled from the
process tree, so a notebook's kernel and its compile workers count while they live), the difference (other work), the
hypervisor's steal share, and the speed of one of its cores: the CPU time of a fixed pure-Python loop (`core_loop_us`,
median of one a second). Launch-bound timings follow the speed of the core that launches the kernels, which may
differ between hosts of one instance type with no other work on them; the loop would tell such hosts apart where the
load figures cannot. `wmbook run` records it all for every notebook (summary.json, notebook_times.csv), so a slow run
can be told from slow code.

In a container the counters are the host's (psutil reads /proc/stat), the process tree only this container's: other
work is everything the host ran beside this run's processes. A descendant that ended between two samples loses its
CPU time since the last one, and one that lived less than a sampling interval is not seen, so `others_cores` is an
upper bound (by at most about an interval's work per process that ended). (wmbook.profiling.monitor's
ResourceMonitor samples the host's CPU percent alone, for a figure over time; this takes the span's counters and the
run's own share.)"""

from __future__ import annotations

import contextlib
import math
import os
import statistics
import threading
import time
from dataclasses import MISSING, asdict, dataclass, fields
from pathlib import Path
from typing import Iterator

__all__ = ["LOOP_N", "HostLoad", "SAMPLE_S", "core_loop_median", "core_loop_us", "core_speed", "host_load", "of_report"]

SAMPLE_S = 1.0  # how often the process tree is read (a psutil walk of a few processes: well under a millisecond)
LOOP_N = 20_000  # the core probe's iterations: about a millisecond of one core a sample


def core_loop_us(n: int = LOOP_N) -> float:
    """The CPU time (this thread's, so waiting for a core or for the GIL does not count) of a fixed pure-Python loop of
    `n` iterations, in microseconds: the speed of the core it ran on, as interpreted Python (and PyTorch's eager
    dispatch, host code of the same kind) sees it."""
    t, x = time.thread_time_ns(), 0
    for i in range(n):
        x = (x * 31 + i) & 0xFFFF
    return (time.thread_time_ns() - t) / 1e3


def core_loop_median(samples: int = 9) -> float:
    """This host's core now: the median of `samples` core_loop_us() (about 10 ms at 9)."""
    return statistics.median(core_loop_us() for _ in range(max(1, samples)))


def core_speed(samples: int = 9) -> str:
    """This host's core speed in words, for a report's parameters table (core_loop_median), so that a reader can tell
    a launch-bound row of a slow host from slow code."""
    return (f"{core_loop_median(samples):,.0f} us for the fixed loop of wmbook.hostload (lower is faster; launch-bound "
            "rows slow with it)")


@dataclass(frozen=True)
class HostLoad:
    """CPU use over a span of `seconds`: the host's `cores`, the average CPUs busy on the host (all work), those used by
    this process and its descendants (`own_cores`), the share of CPU time stolen by the hypervisor, and the median of
    core_loop_us() over the span (None in a record made before it was measured)."""

    seconds: float
    cores: int
    busy_cores: float
    own_cores: float
    steal_share: float
    core_loop_us: float | None = None

    @property
    def others_cores(self) -> float:
        """Average CPUs busy with work that is not this run's (an upper bound: see the module's docstring)."""
        return max(0.0, self.busy_cores - self.own_cores)

    def record(self) -> dict:
        """Rounded fields for summary.json, others_cores included."""
        d = {k: (round(v, 3) if isinstance(v, float) else v) for k, v in asdict(self).items()}
        d["others_cores"] = round(self.others_cores, 3)
        return d

    @classmethod
    def from_record(cls, d: dict) -> HostLoad:
        """The HostLoad a record() came from (KeyError for a record that lacks a field without a default)."""
        return cls(**{f.name: d[f.name] if f.default is MISSING else d.get(f.name, f.default) for f in fields(cls)})

    def describe(self) -> str:
        """'host CPUs busy 14.9 of 16 (other work 11.2), core loop 950 us', steal named when there was any."""
        s = f"host CPUs busy {self.busy_cores:.1f} of {self.cores} (other work {self.others_cores:.1f})"
        s += f", {100 * self.steal_share:.0f}% stolen by the hypervisor" if self.steal_share >= 0.005 else ""
        return s + (f", core loop {self.core_loop_us:.0f} us" if self.core_loop_us is not None else "")


def of_report(folder) -> HostLoad | None:
    """The HostLoad `wmbook run` recorded for the first notebook of a report folder (its summary.json), or None where
    it holds none (no summary, a run from before it was recorded)."""
    import json  # noqa: PLC0415

    try:
        return HostLoad.from_record(json.loads((Path(folder) / "summary.json").read_text())["notebooks"][0]
                                    ["host_load"])
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        return None


_NOT_BUSY = ("idle", "iowait", "steal")  # steal: the hypervisor ran other machines' work (counted on its own)
_IN_USER = ("guest", "guest_nice")  # already counted in user and nice on Linux


def _busy_s(t) -> float:
    """CPU seconds the host spent running work in a psutil cpu_times() total."""
    return sum(v for k, v in t._asdict().items() if k not in _NOT_BUSY + _IN_USER)


def _total_s(t) -> float:
    return sum(v for k, v in t._asdict().items() if k not in _IN_USER)


class _Tree:
    """CPU seconds of a process and its descendants: each process's latest reading, kept after it ends."""

    def __init__(self, psutil, proc):
        self.psutil, self.proc = psutil, proc
        self.seen: dict[tuple[int, float], float] = {}  # (pid, create_time) -> CPU seconds at its latest sample
        self.base: dict[tuple[int, float], float] = {}  # those alive at the start: CPU seconds then
        self.lock = threading.Lock()

    def sample(self) -> None:
        procs = [self.proc]
        with contextlib.suppress(Exception):
            procs += self.proc.children(recursive=True)
        got = {}
        for p in procs:
            try:
                with p.oneshot():
                    t = p.cpu_times()
                    got[(p.pid, p.create_time())] = t.user + t.system
            except Exception:  # noqa: BLE001  ended while read: its last sample stands
                continue
        with self.lock:
            self.seen.update(got)

    def start(self) -> None:
        self.sample()
        with self.lock:
            self.base = dict(self.seen)

    def used_s(self) -> float:
        """CPU seconds the tree used since start()."""
        with self.lock:
            return sum(v - self.base.get(k, 0.0) for k, v in self.seen.items())


@contextlib.contextmanager
def host_load(interval_s: float = SAMPLE_S) -> Iterator[dict]:
    """Measure the host's CPU use over the `with` block; afterwards the yielded dict holds "load": a HostLoad, or
    None where the counters cannot be read (no psutil, no /proc), with "reason" saying why. Never raises for a
    measurement problem: the block's own outcome stands."""
    if not (interval_s > 0 and math.isfinite(interval_s)):
        raise ValueError(f"interval_s={interval_s!r} is not allowed; allowed values: seconds > 0")
    out: dict = {"load": None, "reason": None}
    try:
        import psutil  # noqa: PLC0415  a dependency; absent only in a trimmed environment

        cores = psutil.cpu_count(logical=True) or os.cpu_count() or 0
        tree = _Tree(psutil, psutil.Process())
        t0, c0 = time.perf_counter(), psutil.cpu_times()
        tree.start()
    except Exception as e:  # noqa: BLE001  not measurable here: said, not raised
        out["reason"] = f"the host's CPU counters cannot be read: {type(e).__name__}: {e}"
        yield out
        return
    stop = threading.Event()
    loops = [core_loop_us()]  # one at each end as well: a span shorter than an interval still has the figure

    def sampler():
        while not stop.wait(interval_s):
            tree.sample()
            loops.append(core_loop_us())

    th = threading.Thread(target=sampler, name="wmbook-host-load", daemon=True)
    th.start()
    try:
        yield out
    finally:
        stop.set()
        th.join()
        try:
            tree.sample()
            loops.append(core_loop_us())
            c1, seconds = psutil.cpu_times(), time.perf_counter() - t0
            total = _total_s(c1) - _total_s(c0)
            steal = getattr(c1, "steal", 0.0) - getattr(c0, "steal", 0.0)
            if seconds > 0:
                out["load"] = HostLoad(seconds=seconds, cores=int(cores),
                                       busy_cores=min(float(cores), (_busy_s(c1) - _busy_s(c0)) / seconds),
                                       own_cores=tree.used_s() / seconds,
                                       steal_share=steal / total if total > 0 else 0.0,
                                       core_loop_us=statistics.median(loops))
            else:
                out["reason"] = "the span was too short to measure"
        except Exception as e:  # noqa: BLE001
            out["reason"] = f"the host's CPU counters cannot be read: {type(e).__name__}: {e}"
