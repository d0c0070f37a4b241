"""What a ProfilingSession costs the run it watches: a paired A/B (ABBA) measurement and the cost accounted part
by part (timed labels, the monitor's sampler thread). See measure_overhead."""

from __future__ import annotations

import statistics
import time

import numpy as np

from ..bench import Samples, time_fn
from ..presets import resolve_device
from .config import load_config
from .jsonable import jsonable as _jsonable
from .labels import label
from .sections import SectionTimer
from .session import ProfilingSession, current_session


def label_timing_cost_us(device=None, n: int = 2000) -> float:
    """Host microseconds one `label()` range costs when a session times it (a SectionTimer attached: two event
    records and its bookkeeping), over the same range untimed; the median of 5 rounds of `n` ranges."""
    dev = resolve_device(device)

    def rounds(timer) -> float:
        out = []
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(n):
                with label("overhead_probe"):
                    pass
            out.append((time.perf_counter() - t0) / n * 1e6)
            if timer is not None:
                timer.reset()
        return statistics.median(out)

    plain = rounds(None)
    timer = SectionTimer(dev)
    with timer.attached():
        timed = rounds(timer)
    return max(0.0, timed - plain)


def measure_overhead(fn, config="production", pairs: int = 8, warmup: int = 1, device=None, seed: int = 0) -> dict:
    """Time fn() without a session and inside a session with `config` (monitors on, no trace), in pairs.

    Each pair is one call without and one inside a fresh session, in alternating order (ABBA: a drift in clocks or
    host load hits both sides alike), timed with wmbook.bench.time_fn (CUDA events on a GPU). The overhead is the
    median of the per-pair ratios session/baseline - 1, with the p20-p80 of those ratios and a bootstrap 90%
    interval of the median: a run-to-run spread larger than the overhead shows up as an interval around 0 instead
    of a number that looks like a cost. `accounted_frac` adds up what the session puts on the launching thread,
    part by part (timed labels per call x label_timing_cost_us, plus the sampler thread's share of the wall time):
    the precise figure where the A/B difference is within the run-to-run spread. Returns both timings' summaries,
    overhead_frac/_ms, the interval, the accounted parts, the monitor's own sampling cost and the config.
    """
    if not callable(fn):
        raise ValueError(f"fn must be callable, got {type(fn).__name__}")
    for n, v, lo in (("pairs", pairs, 2), ("warmup", warmup, 0)):
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise ValueError(f"{n} must be an int >= {lo}, got {v!r}")
    if current_session() is not None:
        raise RuntimeError("measure_overhead must run outside a ProfilingSession (it opens its own)")

    cfg = load_config(config).replace(generate_final_report=False, enabled=True)
    dev = resolve_device(device)
    if warmup:
        time_fn(fn, warmup=warmup - 1, repeats=1, device=dev)
    base, inside, info = [], [], {}
    sampling_s = sampling_cpu_s = wall_s = 0.0

    sections = []

    def in_session():
        nonlocal info, sampling_s, sampling_cpu_s, wall_s
        with ProfilingSession("overhead", config=cfg, device=dev) as s:
            inside.extend(time_fn(fn, warmup=0, repeats=1, device=dev).values)
        info = s.monitor.info()
        sections.append(len(s.timer) - 1)  # the timed labels of one call (not the Session section itself)
        sampling_s += info.get("sampling_s") or 0.0
        sampling_cpu_s += info.get("sampling_cpu_s") or 0.0
        wall_s += info.get("duration_s") or 0.0

    for r in range(pairs):
        first_base = r % 2 == 0  # AB BA AB BA ...
        if first_base:
            base.extend(time_fn(fn, warmup=0, repeats=1, device=dev).values)
        in_session()
        if not first_base:
            base.extend(time_fn(fn, warmup=0, repeats=1, device=dev).values)
    b, i = Samples(base, "ms"), Samples(inside, "ms")
    ratios = np.asarray(inside) / np.asarray(base)
    rng = np.random.default_rng(seed)
    boot = np.median(rng.choice(ratios, size=(2000, len(ratios)), replace=True), axis=1)
    lo, hi = np.percentile(boot, [5, 95])
    med = float(np.median(ratios))
    info = dict(info, sampling_s=sampling_s, sampling_cpu_s=sampling_cpu_s, duration_s=wall_s,
                sampling_share_of_wall=sampling_s / wall_s if wall_s else None)
    # what the session adds to the launching thread, part by part: precise where the A/B difference is noise
    per_call = float(np.median(sections)) if cfg.time_labels else 0.0
    label_us = label_timing_cost_us(dev) if per_call else 0.0
    labels_ms = per_call * label_us / 1e3
    sampler_frac = info["sampling_share_of_wall"] or 0.0
    return _jsonable({
        "config": config if isinstance(config, str) else "custom",
        "device": str(dev), "timing": "CUDA events" if dev.type == "cuda" else "host perf_counter",
        "method": "paired ABBA: per pair one call without and one inside a session; overhead = median ratio - 1",
        "pairs": pairs, "repeats": pairs, "warmup": warmup,
        "baseline_ms": b.summary(), "session_ms": i.summary(),
        "overhead_frac": med - 1, "overhead_ms": float(np.median(np.asarray(inside) - np.asarray(base))),
        "overhead_p20": float(np.percentile(ratios, 20)) - 1, "overhead_p80": float(np.percentile(ratios, 80)) - 1,
        "overhead_ci90": [float(lo) - 1, float(hi) - 1], "ratios": [float(r) - 1 for r in ratios],
        "baseline_spread_frac": (b.p80 - b.p20) / b.median,
        "accounted_frac": labels_ms / b.median + sampler_frac,
        "accounted": {"timed_labels_per_call": per_call, "us_per_timed_label": label_us, "labels_ms": labels_ms,
                      "labels_frac": labels_ms / b.median, "sampler_frac": sampler_frac,
                      "basis": "timed labels x their measured host cost, plus the sampler thread's share of the "
                               "wall time (an upper bound on what it can take from the launching thread)"},
        "monitor": {k: info.get(k) for k in ("gpu_available", "gpu_reason", "groups", "gpu_interval_s",
                                             "cpu_interval_s", "sampling_s", "sampling_cpu_s",
                                             "sampling_share_of_wall", "duration_s")},
        "time_labels": cfg.time_labels,
    })
