"""Collecting traces: the torch.profiler wrapper writing gzip Chrome traces (`profile`), and one-off traces of a few
calls (`profile_calls`, `device_busy_ms`). What the traces say is `wmbook.profiling.analysis`."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch
from torch.profiler import ProfilerActivity

from ..atomic import atomic_open
from .analysis.labels import label_table
from .analysis.launches import trace_busy_ms

KEY_AVERAGE_COLUMNS = [
    "name", "count", "cpu_time_total_us", "self_cpu_time_total_us",
    "device_time_total_us", "self_device_time_total_us",
]  # fmt: skip
_ACTIVITIES = {"cpu": ProfilerActivity.CPU, "cuda": ProfilerActivity.CUDA}
def _activities(activities):
    if activities is None:
        acts = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            acts.append(ProfilerActivity.CUDA)
        return acts
    acts = []
    for a in activities:
        if isinstance(a, ProfilerActivity):
            acts.append(a)
        elif isinstance(a, str) and a.lower() in _ACTIVITIES:
            acts.append(_ACTIVITIES[a.lower()])
        else:
            raise ValueError(f"activities must hold 'cpu', 'cuda' or ProfilerActivity values, got {a!r}")
    return acts


@dataclass
class ProfileResult:
    """A finished profile: the gzip trace on disk and the profiler's aggregated events."""

    trace_path: Path
    prof: torch.profiler.profile

    def key_averages(self, group_by_input_shape: bool = False) -> pd.DataFrame:
        """Operator/range table with times in microseconds, sorted by device then CPU total."""
        rows = []
        for e in self.prof.key_averages(group_by_input_shape=group_by_input_shape):
            dev_total = getattr(e, "device_time_total", None)
            if dev_total is None:
                dev_total = getattr(e, "cuda_time_total", 0.0)
            self_dev = getattr(e, "self_device_time_total", None)
            if self_dev is None:
                self_dev = getattr(e, "self_cuda_time_total", 0.0)
            row = {
                "name": e.key,
                "count": e.count,
                "cpu_time_total_us": float(e.cpu_time_total),
                "self_cpu_time_total_us": float(e.self_cpu_time_total),
                "device_time_total_us": float(dev_total),
                "self_device_time_total_us": float(self_dev),
            }
            if group_by_input_shape:
                row["input_shapes"] = str(e.input_shapes)
            rows.append(row)
        if not rows:
            return pd.DataFrame(columns=KEY_AVERAGE_COLUMNS)
        df = pd.DataFrame(rows).sort_values(["device_time_total_us", "cpu_time_total_us"], ascending=False)
        return df.reset_index(drop=True)

    def label_table(self, prefix_filter=None) -> pd.DataFrame:
        """label_table() of this trace."""
        return label_table(self.trace_path, prefix_filter=prefix_filter)


# zlib's own default: a trace compresses about 3x faster than at gzip's 9 (a 24 MB trace 0.19 s against 0.62) for
# a file about 10% larger (notebook 02's trace of a whole wma iteration at the real shapes: 88 MiB at level 9)
TRACE_GZIP_LEVEL = 6


def _gzip_atomic(src: Path, dest: Path) -> None:
    with atomic_open(dest, "wb") as raw:
        with gzip.GzipFile(fileobj=raw, mode="wb", filename="", compresslevel=TRACE_GZIP_LEVEL) as gz, \
                open(src, "rb") as f:
            shutil.copyfileobj(f, gz, 1 << 20)


def profile(
    step_fn,
    *,
    steps: int | None = None,
    wait: int = 0,
    warmup: int = 1,
    active: int = 1,
    out_dir,
    name: str = "trace",
    record_shapes: bool = False,
    with_stack: bool = False,
    profile_memory: bool = False,
    activities=None,
) -> ProfileResult:
    """Call step_fn() `steps` times (default wait+warmup+active) under torch.profiler.

    The schedule records the `active` calls after `wait` skipped and `warmup` untraced ones;
    the trace goes to <out_dir>/<name>.json.gz (written atomically; open in Perfetto).
    """
    for pname, v, lo in (("wait", wait, 0), ("warmup", warmup, 0), ("active", active, 1)):
        if not isinstance(v, int) or v < lo:
            raise ValueError(f"{pname} must be an int >= {lo}, got {v!r}")
    cycle = wait + warmup + active
    if steps is None:
        steps = cycle
    if not isinstance(steps, int) or steps < cycle:
        raise ValueError(f"steps must be an int >= wait+warmup+active ({cycle}), got {steps!r}")
    if not name or "/" in name or os.sep in name:
        raise ValueError(f"name must be a non-empty file name without path separators, got {name!r}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    dest = out / f"{name}.json.gz"

    fd, raw_json = tempfile.mkstemp(dir=out, prefix=f".{name}.", suffix=".json")
    os.close(fd)
    exported = []

    def on_ready(p):
        p.export_chrome_trace(raw_json)
        exported.append(True)

    try:
        with warnings.catch_warnings():
            # schedule(repeat=1) has one cycle, so the "clears events at the end of each cycle" note is moot
            warnings.filterwarnings("ignore", message=".*clears events at the end of each cycle.*")
            with torch.profiler.profile(
                activities=_activities(activities),
                schedule=torch.profiler.schedule(wait=wait, warmup=warmup, active=active, repeat=1),
                on_trace_ready=on_ready,
                record_shapes=record_shapes,
                with_stack=with_stack,
                profile_memory=profile_memory,
            ) as prof:
                for _ in range(steps):
                    step_fn()
                    prof.step()
        if not exported:
            raise RuntimeError("profiler produced no trace (schedule never reached its active steps)")
        _gzip_atomic(Path(raw_json), dest)
    finally:
        if os.path.exists(raw_json):
            os.unlink(raw_json)
    return ProfileResult(trace_path=dest, prof=prof)


def profile_calls(fn, device=None, calls: int = 1) -> dict | None:
    """The torch.profiler trace (a chrome-trace dict, CPU + CUDA activity) of `calls` calls of fn() (already
    warm), synchronized before and after. None off CUDA."""
    if isinstance(calls, bool) or not isinstance(calls, int) or calls < 1:
        raise ValueError(f"calls={calls!r} is not allowed; allowed values: an integer >= 1")
    dev = torch.device(device) if device is not None else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if dev.type != "cuda":
        return None
    torch.cuda.synchronize(dev)
    with torch.profiler.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize(dev)
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path) as f:
            return json.load(f)
    finally:
        os.unlink(path)


def device_busy_ms(fn, device=None, calls: int = 1) -> float:
    """Mean GPU busy time per call of fn() (already warm), from one torch.profiler trace of `calls` calls: the
    union of the device activities. Against the wall time of the same call it says how much of it is host or
    launch overhead (what CUDA graphs, notebook 06, remove). NaN off CUDA."""
    trace = profile_calls(fn, device, calls)
    return float("nan") if trace is None else trace_busy_ms(trace) / calls
