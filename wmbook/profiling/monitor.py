"""Background GPU (NVML) and host (psutil) resource monitor, with a console status line and a notebook live view.

`ResourceMonitor` samples on its own thread, GPU and host metrics at separate intervals, into one ring
buffer per metric (`max_points` each; evicted samples are counted in `dropped`, and min/max/mean in
`summary()` still cover every sample taken). Start/stop are idempotent, `stop()` joins the thread and
takes one final sample, and nothing raised while sampling leaves the thread: errors are kept in
`errors` and a metric that keeps failing (e.g. power on a GPU without a sensor) is switched off with
the reason in `disabled`.

Which GPU: torch's current CUDA device, mapped to NVML's numbering through CUDA_VISIBLE_DEVICES when
that is a list of integers (or a GPU UUID). Without a GPU or NVML the host side runs alone and
`gpu_available` is False with `gpu_reason` saying why.
"""

from __future__ import annotations

import collections
import datetime as _dt
import math
import os
import sys
import threading
import time

import pandas as pd
import torch

from .config import load_config
from .timelines import SAMPLE_COLUMNS, draw_timelines

MIB = 2**20

# metric group (what the config switches) -> metrics it samples
GPU_GROUPS = {
    "gpu_memory": ("gpu_memory_used_mib", "gpu_memory_total_mib", "gpu_memory_used_pct"),
    "gpu_utilization": ("gpu_utilization_pct", "gpu_memory_utilization_pct"),
    "gpu_temperature": ("gpu_temperature_c",),
    "gpu_power": ("gpu_power_w",),
    "gpu_clocks": ("gpu_sm_clock_mhz", "gpu_memory_clock_mhz"),
}
CPU_GROUPS = {
    "cpu_usage": ("cpu_percent",),
    "system_memory": ("system_memory_used_mib", "system_memory_total_mib", "system_memory_used_pct",
                      "process_rss_mib"),
}
DEFAULT_GROUPS = ("gpu_memory", "gpu_utilization", "gpu_temperature", "gpu_power", "cpu_usage", "system_memory")
UNITS = {
    "gpu_memory_used_mib": "MiB", "gpu_memory_total_mib": "MiB", "gpu_memory_used_pct": "%",
    "gpu_utilization_pct": "%", "gpu_memory_utilization_pct": "%", "gpu_temperature_c": "degC",
    "gpu_power_w": "W", "gpu_sm_clock_mhz": "MHz", "gpu_memory_clock_mhz": "MHz", "cpu_percent": "%",
    "system_memory_used_mib": "MiB", "system_memory_total_mib": "MiB", "system_memory_used_pct": "%",
    "process_rss_mib": "MiB",
}  # fmt: skip
SUMMARY_COLUMNS = ["metric", "unit", "device", "count", "min", "max", "mean", "last", "dropped"]
FAILURES_BEFORE_DISABLE = 3  # consecutive errors of one metric group before it is switched off

# ---------------------------------------------------------------------------------------------------------
# NVML: initialised once per process while any monitor uses it

_NVML_LOCK = threading.Lock()
_NVML_USERS = 0


def _nvml_acquire():
    """The pynvml module with NVML initialised (reference counted); raises RuntimeError with the reason."""
    global _NVML_USERS
    try:
        import pynvml  # noqa: PLC0415  optional: pynvml
    except ImportError as e:
        raise RuntimeError("nvidia-ml-py (pynvml) is not installed") from e
    with _NVML_LOCK:
        if _NVML_USERS == 0:
            try:
                pynvml.nvmlInit()
            except Exception as e:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
                raise RuntimeError(f"NVML init failed: {e}") from e
        _NVML_USERS += 1
    return pynvml


def _nvml_release(pynvml) -> None:
    global _NVML_USERS
    with _NVML_LOCK:
        if _NVML_USERS <= 0:
            return
        _NVML_USERS -= 1
        if _NVML_USERS == 0:
            try:
                pynvml.nvmlShutdown()
            except Exception:  # shutting down a library that is going away: nothing to do
                pass


def nvml_device_for(torch_index: int, visible: str | None = None):
    """NVML index (int) or UUID (str) of torch's CUDA device `torch_index`, honouring CUDA_VISIBLE_DEVICES."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES") if visible is None else visible
    if visible is None:
        return torch_index
    entries = [e.strip() for e in visible.split(",") if e.strip()]
    if not entries:
        raise ValueError("CUDA_VISIBLE_DEVICES is set but empty: no GPU is visible")
    ints = []
    for e in entries:  # CUDA stops at the first entry that is not a device
        if not e.lstrip("-").isdigit() or int(e) < 0:
            break
        ints.append(int(e))
    if ints:
        if torch_index >= len(ints):
            raise ValueError(f"CUDA device {torch_index} is not among CUDA_VISIBLE_DEVICES={visible!r}")
        return ints[torch_index]
    if torch_index < len(entries) and entries[torch_index].startswith(("GPU-", "MIG-")):
        return entries[torch_index]
    return torch_index


def _s(x) -> str:
    return x.decode() if isinstance(x, bytes) else str(x)


# ---------------------------------------------------------------------------------------------------------
# the monitor


class ResourceMonitor:
    """Background sampler of GPU (NVML) and host (psutil) metrics into bounded per-metric ring buffers."""

    def __init__(self, device=None, *, gpu_interval: float = 0.5, cpu_interval: float = 1.0, metrics=None,
                 max_points: int = 10_000, display_interval: float | None = None, gpu_index: int | None = None,
                 stream=None, name: str = "monitor"):
        """device: torch device whose GPU to watch (None: the current CUDA device, if any; "cpu": host only).
        metrics: groups to sample (default DEFAULT_GROUPS; all: GPU_GROUPS | CPU_GROUPS).
        display_interval: print a status line every that many seconds (None: never).
        gpu_index: watch this torch CUDA index even if torch does not see it (tests, NVML-only hosts)."""
        for name, v in (("gpu_interval", gpu_interval), ("cpu_interval", cpu_interval)):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
                raise ValueError(f"{name} must be a number of seconds > 0, got {v!r}")
        if display_interval is not None and (isinstance(display_interval, bool)
                                             or not isinstance(display_interval, (int, float))
                                             or not display_interval > 0):
            raise ValueError(f"display_interval must be None or a number of seconds > 0, got {display_interval!r}")
        if isinstance(max_points, bool) or not isinstance(max_points, int) or max_points < 1:
            raise ValueError(f"max_points must be an int >= 1, got {max_points!r}")
        groups = tuple(DEFAULT_GROUPS if metrics is None else metrics)
        allowed = {**GPU_GROUPS, **CPU_GROUPS}
        for g in groups:
            if g not in allowed:
                raise ValueError(f"unknown metric group {g!r}; allowed: {list(allowed)}")
        if gpu_index is not None and (isinstance(gpu_index, bool) or not isinstance(gpu_index, int) or gpu_index < 0):
            raise ValueError(f"gpu_index must be None or an int >= 0, got {gpu_index!r}")
        self.gpu_interval = float(gpu_interval)
        self.cpu_interval = float(cpu_interval)
        self.display_interval = None if display_interval is None else float(display_interval)
        self.max_points = max_points
        self.gpu_groups = [g for g in groups if g in GPU_GROUPS]
        self.cpu_groups = [g for g in groups if g in CPU_GROUPS]
        self.stream = stream
        self.name = str(name)
        self._device = device
        self._gpu_index = gpu_index

        self.gpu_available = False
        self.gpu_reason = "monitor not started"
        self.gpu_name = None
        self.torch_index = None
        self.nvml_device = None
        self.cpu_available = False
        self.cpu_reason = "monitor not started"
        self.disabled: dict[str, str] = {}  # metric group -> why it was switched off
        self.errors: collections.deque = collections.deque(maxlen=50)  # (time_s, group, message)
        self.error_count = 0
        self.dropped: dict[str, int] = {}
        self.started_at = None  # UTC ISO time of the first start
        self._series: dict[str, collections.deque] = {}
        self._stats: dict[str, list] = {}  # metric -> [count, min, max, sum, last]
        self._devices: dict[str, str] = {}
        self._fails: dict[str, int] = {}
        self._lock = threading.Lock()  # guards the buffers (sampler thread vs readers)
        self._state = threading.Lock()  # guards start/stop
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._t0: float | None = None
        self._t_stop: float | None = None
        self._nvml = None
        self._handle = None
        self._psutil = None
        self._proc = None
        self._cpu_window_start = 0.0
        self.sampling_s = 0.0  # wall time the sampler spent taking samples (its own cost)
        self.sampling_cpu_s = 0.0  # CPU time of the sampler thread

    @classmethod
    def from_config(cls, config, device=None, **kw) -> "ResourceMonitor":
        """A monitor with the intervals, metric switches and limits of a ProfilingConfig (or preset/dict/path)."""
        c = load_config(config)
        groups = [g for g in (*GPU_GROUPS, *CPU_GROUPS) if getattr(c, "monitor_" + g)]
        return cls(device, gpu_interval=c.gpu_monitor_interval, cpu_interval=c.cpu_monitor_interval, metrics=groups,
                   max_points=c.max_data_points, display_interval=c.display_interval if c.real_time_display else None,
                   **kw)

    # --- lifecycle ---------------------------------------------------------------------------------------
    @property
    def running(self) -> bool:
        return self._thread is not None

    def start(self) -> "ResourceMonitor":
        """Start sampling (no-op if already running)."""
        with self._state:
            if self._thread is not None:
                return self
            if self._t0 is None:
                self._t0 = time.perf_counter()
                self.started_at = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
            self._setup_gpu()
            self._setup_cpu()
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="wmbook-resource-monitor", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> "ResourceMonitor":
        """Stop sampling: join the thread, take one final sample, release NVML (no-op if not running)."""
        with self._state:
            t = self._thread
            if t is None:
                return self
            self._stop.set()
            t.join(timeout=10.0)
            if t.is_alive():
                self._error("thread", "sampler thread did not stop within 10 s")
            self._thread = None
            self._t_stop = time.perf_counter()
            now = self.elapsed_s()
            if self.gpu_available:
                self._sample_gpu(now)
            if self.cpu_available:
                self._sample_cpu(now)
            if self._nvml is not None:
                _nvml_release(self._nvml)
                self._nvml = None
                self._handle = None
        return self

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
        return False

    def __del__(self):
        try:
            if self._thread is not None:
                self._stop.set()
        except Exception:
            pass

    def elapsed_s(self) -> float:
        """Seconds since the first start (0 before it; frozen at the last stop)."""
        if self._t0 is None:
            return 0.0
        return (time.perf_counter() if self._thread is not None or self._t_stop is None else self._t_stop) - self._t0

    def _setup_gpu(self) -> None:
        self.gpu_available = False
        if not self.gpu_groups:
            self.gpu_reason = "no GPU metrics requested"
            return
        idx = self._gpu_index
        if idx is None:
            dev = self._device
            if dev is not None and torch.device(dev).type != "cuda":
                self.gpu_reason = f"device is {torch.device(dev)}, not a CUDA device"
                return
            if not torch.cuda.is_available():
                self.gpu_reason = "torch sees no CUDA device"
                return
            d = torch.device(dev) if dev is not None else None
            idx = d.index if d is not None and d.index is not None else torch.cuda.current_device()
        self.torch_index = idx
        try:
            self.nvml_device = nvml_device_for(idx)
        except ValueError as e:
            self.gpu_reason = str(e)
            return
        try:
            nv = _nvml_acquire()
        except RuntimeError as e:
            self.gpu_reason = str(e)
            return
        try:
            if isinstance(self.nvml_device, str):
                handle = nv.nvmlDeviceGetHandleByUUID(self.nvml_device)
            else:
                count = nv.nvmlDeviceGetCount()
                if self.nvml_device >= count:
                    raise RuntimeError(f"NVML device {self.nvml_device} out of range ({count} devices)")
                handle = nv.nvmlDeviceGetHandleByIndex(self.nvml_device)
            try:
                self.gpu_name = _s(nv.nvmlDeviceGetName(handle))
            except Exception:
                self.gpu_name = None
        except Exception as e:
            _nvml_release(nv)
            self.gpu_reason = f"NVML has no handle for GPU {self.nvml_device}: {e}"
            return
        self._nvml, self._handle = nv, handle
        self.gpu_available = True
        self.gpu_reason = None

    def _setup_cpu(self) -> None:
        self.cpu_available = False
        if not self.cpu_groups:
            self.cpu_reason = "no host metrics requested"
            return
        try:
            import psutil  # noqa: PLC0415  optional: psutil
        except ImportError:
            self.cpu_reason = "psutil is not installed"
            return
        self._psutil = psutil
        self._proc = psutil.Process()
        psutil.cpu_percent(interval=None)  # the first call only starts the measurement window
        self._cpu_window_start = time.perf_counter()
        self.cpu_available = True
        self.cpu_reason = None

    # --- sampling (on the monitor thread) ----------------------------------------------------------------
    def _run(self) -> None:
        try:
            inf = math.inf
            now = time.perf_counter()
            next_gpu = now if self.gpu_available else inf
            next_cpu = now if self.cpu_available else inf
            next_disp = now + self.display_interval if self.display_interval else inf
            cpu0, cpu_base = time.thread_time(), self.sampling_cpu_s
            while not self._stop.is_set():
                now = time.perf_counter()
                if now >= next_gpu:
                    self._sample_gpu(now - self._t0)
                    next_gpu = _next_tick(next_gpu, self.gpu_interval, time.perf_counter())
                if now >= next_cpu:
                    self._sample_cpu(now - self._t0)
                    next_cpu = _next_tick(next_cpu, self.cpu_interval, time.perf_counter())
                if now >= next_disp:
                    self._display()
                    next_disp = _next_tick(next_disp, self.display_interval, time.perf_counter())
                # the sampler's own cost: wall time spent sampling and the thread's CPU time so far
                self.sampling_s += time.perf_counter() - now
                self.sampling_cpu_s = cpu_base + time.thread_time() - cpu0
                wait = min(next_gpu, next_cpu, next_disp) - time.perf_counter()
                if self._stop.wait(min(max(wait, 0.0), 3600.0)):
                    break
        except BaseException as e:  # never let the thread raise: record and stop sampling
            self._error("thread", f"sampler thread stopped: {type(e).__name__}: {e}")

    def _error(self, group: str, msg: str) -> None:
        self.error_count += 1
        self.errors.append((round(self.elapsed_s(), 3), group, msg))

    def _group(self, group: str, t: float, device: str, read) -> None:
        """Sample one metric group; switch it off after repeated failures."""
        if group in self.disabled:
            return
        try:
            values = read()
        except Exception as e:
            self._error(group, f"{type(e).__name__}: {e}")
            self._fails[group] = self._fails.get(group, 0) + 1
            if self._fails[group] >= FAILURES_BEFORE_DISABLE:
                self.disabled[group] = f"{FAILURES_BEFORE_DISABLE} failures in a row, last: {type(e).__name__}: {e}"
            return
        self._fails[group] = 0
        with self._lock:
            for metric, v in values:
                self._add(metric, t, float(v), device)

    def _add(self, metric: str, t: float, v: float, device: str) -> None:
        buf = self._series.get(metric)
        if buf is None:
            buf = self._series[metric] = collections.deque(maxlen=self.max_points)
            self._stats[metric] = [0, math.inf, -math.inf, 0.0, math.nan]
            self._devices[metric] = device
            self.dropped[metric] = 0
        if len(buf) == self.max_points:
            self.dropped[metric] += 1
        buf.append((t, v))
        s = self._stats[metric]
        s[0] += 1
        s[1] = min(s[1], v)
        s[2] = max(s[2], v)
        s[3] += v
        s[4] = v

    def _sample_gpu(self, t: float) -> None:
        nv, h = self._nvml, self._handle
        if nv is None:
            return
        dev = f"cuda:{self.torch_index}"
        for g in self.gpu_groups:
            if g == "gpu_memory":
                def read():
                    m = nv.nvmlDeviceGetMemoryInfo(h)
                    return [("gpu_memory_used_mib", m.used / MIB), ("gpu_memory_total_mib", m.total / MIB),
                            ("gpu_memory_used_pct", 100.0 * m.used / m.total if m.total else math.nan)]
            elif g == "gpu_utilization":
                def read():
                    u = nv.nvmlDeviceGetUtilizationRates(h)
                    return [("gpu_utilization_pct", u.gpu), ("gpu_memory_utilization_pct", u.memory)]
            elif g == "gpu_temperature":
                def read():
                    return [("gpu_temperature_c", nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU))]
            elif g == "gpu_power":
                def read():
                    return [("gpu_power_w", nv.nvmlDeviceGetPowerUsage(h) / 1000.0)]  # mW -> W
            else:  # gpu_clocks
                def read():
                    return [("gpu_sm_clock_mhz", nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)),
                            ("gpu_memory_clock_mhz", nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM))]
            self._group(g, t, dev, read)

    def _sample_cpu(self, t: float) -> None:
        ps, proc = self._psutil, self._proc
        if ps is None:
            return
        for g in self.cpu_groups:
            if g == "cpu_usage":
                def read():
                    # psutil measures since its previous call: skip windows too short to mean anything
                    now = time.perf_counter()
                    if now - self._cpu_window_start < 0.02:
                        return []
                    self._cpu_window_start = now
                    return [("cpu_percent", ps.cpu_percent(interval=None))]
            else:  # system_memory
                def read():
                    vm = ps.virtual_memory()
                    return [("system_memory_used_mib", (vm.total - vm.available) / MIB),
                            ("system_memory_total_mib", vm.total / MIB), ("system_memory_used_pct", vm.percent),
                            ("process_rss_mib", proc.memory_info().rss / MIB)]
            self._group(g, t, "host", read)

    def _display(self) -> None:
        try:
            print(self.status_line(), file=self.stream or sys.stdout, flush=True)
        except Exception as e:
            self._error("display", f"{type(e).__name__}: {e}")

    # --- reading -----------------------------------------------------------------------------------------
    def last(self, metric: str, default=math.nan) -> float:
        """The latest value of `metric` (default if never sampled)."""
        with self._lock:
            s = self._stats.get(metric)
            return default if s is None else s[4]

    def status_line(self) -> str:
        """One line like the seed's: GPU memory/util/temp/power, then CPU and host memory."""
        def v(m):
            return self.last(m)

        parts = [f"[{self.name} {self.elapsed_s():6.1f}s]"]
        if self.gpu_available:
            g = []
            if not math.isnan(v("gpu_memory_used_mib")):
                g.append(f"Memory {v('gpu_memory_used_mib'):.0f}MiB / {v('gpu_memory_total_mib'):.0f}MiB "
                         f"({v('gpu_memory_used_pct'):.1f}%)")
            if not math.isnan(v("gpu_utilization_pct")):
                g.append(f"Util {v('gpu_utilization_pct'):.1f}%")
            if not math.isnan(v("gpu_temperature_c")):
                g.append(f"Temp {v('gpu_temperature_c'):.1f}°C")
            if not math.isnan(v("gpu_power_w")):
                g.append(f"Power {v('gpu_power_w'):.0f}W")
            if not math.isnan(v("gpu_sm_clock_mhz")):
                g.append(f"SM {v('gpu_sm_clock_mhz'):.0f}MHz")
            parts.append(f"GPU cuda:{self.torch_index}: " + ", ".join(g or ["no sample yet"]))
        else:
            parts.append(f"GPU: n/a ({self.gpu_reason})")
        c = []
        if not math.isnan(v("cpu_percent")):
            c.append(f"{v('cpu_percent'):.1f}%")
        if not math.isnan(v("system_memory_used_mib")):
            c.append(f"Memory {v('system_memory_used_mib'):.0f}MiB / {v('system_memory_total_mib'):.0f}MiB "
                     f"({v('system_memory_used_pct'):.1f}%), RSS {v('process_rss_mib'):.0f}MiB")
        parts.append("CPU: " + (", ".join(c) if c else ("n/a" if not self.cpu_available else "no sample yet")))
        return " | ".join(parts)

    def samples(self) -> pd.DataFrame:
        """Tidy samples kept in the ring buffers: time_s (since start), metric, value, device."""
        with self._lock:
            rows = [(t, m, v, self._devices[m]) for m, buf in self._series.items() for t, v in buf]
        df = pd.DataFrame(rows, columns=SAMPLE_COLUMNS)
        return df.sort_values(["time_s", "metric"], kind="stable").reset_index(drop=True)

    def summary(self) -> pd.DataFrame:
        """Per metric: unit, device, count, min, max, mean, last over every sample taken, and dropped."""
        with self._lock:
            rows = [{"metric": m, "unit": UNITS.get(m, ""), "device": self._devices[m], "count": s[0],
                     "min": s[1], "max": s[2], "mean": s[3] / s[0] if s[0] else math.nan, "last": s[4],
                     "dropped": self.dropped[m]} for m, s in self._stats.items()]
        order = list(UNITS)
        rows.sort(key=lambda r: order.index(r["metric"]) if r["metric"] in order else len(order))
        return pd.DataFrame(rows, columns=SUMMARY_COLUMNS)

    def info(self) -> dict:
        """What is monitored and why not (JSON-serialisable)."""
        return {
            "gpu_available": self.gpu_available, "gpu_reason": self.gpu_reason, "gpu_name": self.gpu_name,
            "torch_index": self.torch_index,
            "nvml_device": self.nvml_device,
            "cpu_available": self.cpu_available, "cpu_reason": self.cpu_reason,
            "gpu_interval_s": self.gpu_interval, "cpu_interval_s": self.cpu_interval,
            "display_interval_s": self.display_interval, "max_points": self.max_points,
            "sampling_s": round(self.sampling_s, 6), "sampling_cpu_s": round(self.sampling_cpu_s, 6),
            "sampling_share_of_wall": (self.sampling_s / self.elapsed_s()) if self.elapsed_s() > 0 else None,
            "groups": self.gpu_groups + self.cpu_groups, "disabled": dict(self.disabled),
            "dropped_total": int(sum(self.dropped.values())), "error_count": self.error_count,
            "errors": [list(e) for e in self.errors], "started_at": self.started_at,
            "duration_s": round(self.elapsed_s(), 3),
        }  # fmt: skip

    def to_dict(self, raw: bool = False) -> dict:
        """info() + summary records (+ the kept samples per metric when raw=True)."""
        d = self.info()
        d["summary"] = _records(self.summary())
        if raw:
            with self._lock:
                d["samples"] = {m: {"device": self._devices[m], "unit": UNITS.get(m, ""),
                                    "time_s": [round(t, 4) for t, _ in buf], "value": [v for _, v in buf]}
                                for m, buf in self._series.items()}
        return d

    def plot(self, metrics=None, figsize=(9, 6)):
        """Timelines of the kept samples, one panel per unit (opt-in; returns the matplotlib figure)."""
        import matplotlib.pyplot as plt  # noqa: PLC0415  heavy: matplotlib.pyplot, opt-in plot

        fig = plt.figure(figsize=figsize)
        draw_timelines(fig, self.samples(), metrics)
        return fig


def _next_tick(prev: float, interval: float, now: float) -> float:
    nxt = prev + interval
    return nxt if nxt > now else now + interval  # fell behind: skip missed ticks instead of bursting


def _records(df: pd.DataFrame) -> list[dict]:
    out = []
    for r in df.to_dict(orient="records"):
        out.append({k: (None if isinstance(v, float) and (math.isnan(v) or math.isinf(v)) else v)
                    for k, v in r.items()})
    return out
