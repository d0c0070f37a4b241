"""Nested section timing with device events: the seed's section table (count, total, mean), done right.

A `SectionTimer` records, for every entered section, a start and an end mark: CUDA events on the
current stream on a GPU (no host sync until the table is read), `perf_counter` on a CPU. Host wall
time is kept beside it, so host-bound sections show up (host >> device).

Self vs total: a section's total is its own duration; its self time is the total minus the totals of
the sections directly nested in it (children run inside the parent on one stream, so this is exact up
to event resolution; clamped at 0). Summing `total_ms` over nested rows double counts; summing
`self_ms` over all rows gives the time of the outermost sections.

While `attach(timer)` (or `timer.attached()`) is active, every `wmbook.profiling.label` range is also
a timed section, so labelled pipelines fill the table without further code. Fine per-layer labels
(`detail_label`) are never timed: hundreds per forward would cost host time.
"""

from __future__ import annotations

import contextlib
import re
import time
from dataclasses import dataclass

import pandas as pd

from ..bench import DeviceTimer

TABLE_COLUMNS = [
    "path", "section", "parent", "depth", "count", "total_ms", "mean_ms", "self_ms", "min_ms", "max_ms",
    "host_total_ms", "share_of_parent",
]  # fmt: skip

# Index-like parts of label names, collapsed by `collapse_indices` so that repeated sections group:
# "2.3_Block_4" -> "2.3_Block_*", "2.3.4_Update_KV_Cache" -> "2.3.*_Update_KV_Cache",
# "2.3.4_Denoising_Step_1_t908" -> "2.3.*_Denoising_Step_1_t908", "DDIM_Step_17_t520" -> "DDIM_Step_*".
_BLOCK = re.compile(r"^2\.3_Block_\d+$")
_BLOCK_CHILD = re.compile(r"^2\.3\.\d+_")
_STEP = re.compile(r"(?i)(step)_\d+(_t\d+)?$")
_INDEX = re.compile(r"(?i)_(frame|block|iteration|rank|pass)_\d+$")


def collapse_indices(name: str) -> str:
    """Replace block/step/frame indices in a section name by '*' so repeated sections group.

    DiT labels keep their denoising-step index (each step has its own timestep); other step labels
    ("DDIM_Step_17_t520") collapse to "DDIM_Step_*".
    """
    if _BLOCK.match(name):
        return "2.3_Block_*"
    if _BLOCK_CHILD.match(name):
        return _BLOCK_CHILD.sub("2.3.*_", name)
    name = _STEP.sub(r"\1_*", name)
    return _INDEX.sub(r"_\1_*", name)


@dataclass
class _Rec:
    path: tuple[str, ...]
    start: object  # torch.cuda.Event or float (perf_counter seconds)
    end: object = None
    host_start: float = 0.0
    host_end: float = 0.0


class SectionTimer(DeviceTimer):
    """Nested named sections timed on the device (CUDA events) or the host clock (CPU), with DeviceTimer's clock.

    max_sections bounds memory: past it, new sections are counted in `dropped` and not recorded.
    """

    def __init__(self, device=None, max_sections: int = 200_000):
        if not isinstance(max_sections, int) or max_sections < 1:
            raise ValueError(f"max_sections must be an int >= 1, got {max_sections!r}")
        super().__init__(device)
        self.max_sections = max_sections
        self.dropped = 0
        self._stack: list[_Rec | None] = []
        self._done: list[_Rec] = []

    # --- recording ----------------------------------------------------------------------------------
    def push(self, name: str) -> None:
        """Enter a section named `name` (nested in the current one)."""
        parent = next((r.path for r in reversed(self._stack) if r is not None), ())
        if len(self._done) + len(self._stack) >= self.max_sections:
            self.dropped += 1
            self._stack.append(None)
            return
        self._stack.append(_Rec(path=parent + (str(name),), start=self.stamp(), host_start=time.perf_counter()))

    def pop(self) -> None:
        """Leave the innermost open section."""
        if not self._stack:
            raise RuntimeError("SectionTimer.pop() without a matching push()")
        rec = self._stack.pop()
        if rec is None:
            return
        rec.end = self.stamp()
        rec.host_end = time.perf_counter()
        self._done.append(rec)

    @contextlib.contextmanager
    def section(self, name: str):
        """Context manager for one timed section."""
        self.push(name)
        try:
            yield self
        finally:
            self.pop()

    @contextlib.contextmanager
    def attached(self):
        """Time every `label(...)` range entered inside this block (see module docstring)."""
        with attach(self):
            yield self

    def reset(self) -> None:
        if self._stack:
            raise RuntimeError("cannot reset a SectionTimer with open sections")
        super().reset()
        self._done.clear()
        self.dropped = 0

    def __len__(self) -> int:
        return len(self._done)

    # --- reading ------------------------------------------------------------------------------------
    def _durations(self) -> list[tuple[tuple[str, ...], float, float, float, float]]:
        """(path, start_ms, end_ms, duration_ms, host_ms) per finished section, times from the first start."""
        if not self._done:
            return []
        self.synchronize()
        base = min(self._done, key=lambda r: r.host_start).start
        out = []
        for r in self._done:
            s, e = self.between(base, r.start), self.between(base, r.end)
            out.append((r.path, s, e, e - s, (r.host_end - r.host_start) * 1e3))
        return out

    def events(self) -> pd.DataFrame:
        """One row per finished section: path ('a/b/c'), section, depth, start_ms, end_ms, ms, host_ms."""
        rows = [{"path": "/".join(p), "section": p[-1], "depth": len(p) - 1, "start_ms": s, "end_ms": e,
                 "ms": d, "host_ms": h} for p, s, e, d, h in self._durations()]
        cols = ["path", "section", "depth", "start_ms", "end_ms", "ms", "host_ms"]
        return pd.DataFrame(rows, columns=cols).sort_values("start_ms", kind="stable").reset_index(drop=True) \
            if rows else pd.DataFrame(columns=cols)

    def table(self, collapse: bool = True) -> pd.DataFrame:
        """The nested section table: per path, count, total/mean/min/max and self ms, host total, share.

        collapse=True groups repeated sections (blocks, steps, frames) with `collapse_indices`.
        Rows come in tree order (parents before children, siblings by first start).
        """
        durs = self._durations()
        if not durs:
            return pd.DataFrame(columns=TABLE_COLUMNS)
        # each finished section's children: sections whose path extends its path by one element and
        # whose interval lies inside it (host order decides nesting; device times give the durations)
        order = sorted(range(len(self._done)), key=lambda i: self._done[i].host_start)
        child_sum = [0.0] * len(durs)
        stack: list[int] = []
        for i in order:
            r = self._done[i]
            while stack and not (r.host_start >= self._done[stack[-1]].host_start
                                 and r.host_end <= self._done[stack[-1]].host_end
                                 and r.path[:-1] == self._done[stack[-1]].path):
                stack.pop()
            if stack:
                child_sum[stack[-1]] += durs[i][3]
            stack.append(i)

        def key(path):
            return tuple(collapse_indices(p) for p in path) if collapse else tuple(path)

        agg: dict = {}
        first: dict = {}
        for i, (path, s, _e, d, h) in enumerate(durs):
            k = key(path)
            a = agg.setdefault(k, {"count": 0, "total": 0.0, "self": 0.0, "min": float("inf"),
                                   "max": 0.0, "host": 0.0})
            a["count"] += 1
            a["total"] += d
            a["self"] += max(0.0, d - child_sum[i])
            a["min"] = min(a["min"], d)
            a["max"] = max(a["max"], d)
            a["host"] += h
            first[k] = min(first.get(k, s), s)

        def tree_order(k):  # parents first, then by first start along the path
            return tuple(first.get(k[: j + 1], 0.0) for j in range(len(k)))

        rows = []
        for k in sorted(agg, key=tree_order):
            a = agg[k]
            parent = k[:-1]
            ptotal = agg[parent]["total"] if parent in agg else float("nan")
            rows.append({
                "path": "/".join(k), "section": k[-1], "parent": "/".join(parent), "depth": len(k) - 1,
                "count": a["count"], "total_ms": a["total"], "mean_ms": a["total"] / a["count"],
                "self_ms": a["self"], "min_ms": a["min"], "max_ms": a["max"], "host_total_ms": a["host"],
                "share_of_parent": a["total"] / ptotal if ptotal and ptotal == ptotal else float("nan"),
            })  # fmt: skip
        return pd.DataFrame(rows, columns=TABLE_COLUMNS)


# --- the label hook --------------------------------------------------------------------------------
_SINKS: list[SectionTimer] = []


def active_timers() -> list[SectionTimer]:
    return list(_SINKS)


@contextlib.contextmanager
def attach(timer: SectionTimer):
    """While active, `label()` ranges push/pop sections on `timer` (nesting allowed, innermost wins)."""
    if not isinstance(timer, SectionTimer):
        raise ValueError(f"timer must be a SectionTimer, got {type(timer).__name__}")
    _SINKS.append(timer)
    try:
        yield timer
    finally:
        _SINKS.remove(timer)
