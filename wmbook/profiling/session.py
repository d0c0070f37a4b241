"""Profiling sessions: resource monitor + device-timed stages + stream metrics + events, one report per rank.

    with ProfilingSession("baseline", config="development", device=dev, tags={"preset": "tiny"}) as s:
        inputs = pipe.prepare(3)
        with s.generation():                      # first-frame latency starts here
            out = pipe.generate(inputs)           # its 2.3_Block_{i} labels are timed by the session
        s.set_block_frames(out.frames_per_block)  # pixel frames of each block -> FPS / BPS
    s.summary(); s.stages(); s.write_report()

Every `label()` entered inside the session is a section of a `SectionTimer` (CUDA events on a GPU,
host clock on a CPU), so the stage table has self and total device time for the whole label tree.
Own loops time their blocks with `s.block(i, frames=n)` and steps with `s.diffusion_step(j, t)`.

Stream metrics follow DESIGN.md exactly (see DEFINITIONS): pixel frames, steady state = the blocks after
the first of the last generation that is not a warm-up, block time = end of the previous block to end of
this one (every forward, the cache refresh, the VAE decode and any host gap between blocks count), and
first-frame latency from the start of `s.generation()` (else of block 0) to the end of block 0. They are
computed with `wmbook.bench.stream_metrics`, the function the pipelines use.

The seed's decorators (`profile_method`, `profile_session`, ...) are in `wmbook.profiling.decorators`; the
report (JSON + HTML) is `wmbook.profiling.report`.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import os
import re
import time
import warnings
from dataclasses import dataclass

import pandas as pd
import torch

from ..bench import stream_metrics
from ..device import environment
from ..presets import resolve_device
from .config import ProfilingConfig, load_config
from .definitions import DEFINITIONS  # noqa: F401  (re-exported: the report quotes them)
from .jsonable import jsonable as _jsonable
from .labels import label, labels_enabled
from .monitor import ResourceMonitor
from .report import report_dict, slug, write_report
from .sections import SectionTimer, active_timers

SESSION_LABEL = "Session"
GENERATION_LABEL = "Generation"
WARMUP_LABEL = "Warmup_Generation"
BLOCK_RE = re.compile(r"^2\.3_Block_(\d+)$")

_ENABLED = True
_ACTIVE: list["ProfilingSession"] = []


def set_profiling(enabled: bool = True) -> None:
    """Switch profiling sessions on/off process-wide (off: sessions and decorators do nothing)."""
    global _ENABLED
    _ENABLED = bool(enabled)


def profiling_enabled() -> bool:
    return _ENABLED


def current_session() -> "ProfilingSession | None":
    """The innermost active ProfilingSession, or None."""
    return _ACTIVE[-1] if _ACTIVE else None


def rank_info() -> dict:
    """rank, world_size, local_rank and where they came from (torch.distributed, else env vars, else 0/1)."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return {"rank": dist.get_rank(), "world_size": dist.get_world_size(),
                "local_rank": int(os.environ.get("LOCAL_RANK", dist.get_rank())), "source": "torch.distributed"}

    def env(name, default):
        v = os.environ.get(name)
        try:
            return int(v) if v is not None else default
        except ValueError:
            return default

    if any(k in os.environ for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE")):
        rank = env("RANK", env("LOCAL_RANK", 0))
        return {"rank": rank, "world_size": env("WORLD_SIZE", 1), "local_rank": env("LOCAL_RANK", rank),
                "source": "environment"}
    return {"rank": 0, "world_size": 1, "local_rank": 0, "source": "default"}


# ---------------------------------------------------------------------------------------------------------
# a SectionTimer that also notes, as they are entered, the block and generation sections


@dataclass
class _Block:
    index: int
    frames: int | None
    generation: int
    timed: bool  # False when the timer was full (section dropped)


@dataclass
class _Generation:
    id: int
    warmup: bool
    explicit: bool  # opened with session.generation(); else inferred from block indices
    timed: bool


class _SessionTimer(SectionTimer):
    """SectionTimer that records outermost 2.3_Block_{i} and Generation sections in the order entered."""

    def __init__(self, device, max_sections: int = 200_000):
        super().__init__(device, max_sections=max_sections)
        self.blocks: list[_Block] = []
        self.generations: list[_Generation] = []
        self.pending_frames: int | None = None
        self._kinds: list[str | None] = []
        self._open_generation: int | None = None
        self._auto_generation: int | None = None

    def push(self, name: str) -> None:
        before = self.dropped
        super().push(name)
        timed = self.dropped == before
        kind = None
        m = BLOCK_RE.match(name)
        if m and "block" not in self._kinds:
            kind = "block"
            idx = int(m.group(1))
            if self._open_generation is not None:
                gen = self._open_generation
            else:  # a new inferred generation when block indices restart
                last = self.blocks[-1] if self.blocks else None
                if (self._auto_generation is None or last is None or last.generation != self._auto_generation
                        or idx <= last.index):
                    self._auto_generation = len(self.generations)
                    self.generations.append(_Generation(self._auto_generation, False, False, timed))
                gen = self._auto_generation
            self.blocks.append(_Block(idx, self.pending_frames, gen, timed))
            self.pending_frames = None
        elif name in (GENERATION_LABEL, WARMUP_LABEL) and "generation" not in self._kinds:
            kind = "generation"
            self._open_generation = len(self.generations)
            self._auto_generation = None
            self.generations.append(_Generation(self._open_generation, name == WARMUP_LABEL, True, timed))
        self._kinds.append(kind)

    def pop(self) -> None:
        super().pop()
        if self._kinds and self._kinds.pop() == "generation":
            self._open_generation = None


# ---------------------------------------------------------------------------------------------------------
# the session


class ProfilingSession:
    """Context manager: monitor + timed labels/stages/blocks + events + environment for one run, one rank."""

    def __init__(self, name: str, config=None, device=None, tags: dict | None = None, output_dir=None):
        """name: session name (in the report file name); config: preset name, YAML path, dict or ProfilingConfig;
        device: the torch device doing the work (None: cuda if available); tags: extra session tags."""
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f"name must be a non-empty str, got {name!r}")
        if tags is not None and not isinstance(tags, dict):
            raise ValueError(f"tags must be a dict or None, got {type(tags).__name__}")
        self.name = name
        self.config: ProfilingConfig = load_config(config)
        if tags:
            self.config = self.config.replace(session_tags={**self.config.session_tags, **tags})
        if output_dir is not None:
            self.config = self.config.replace(output_dir=str(output_dir))
        self.device = resolve_device(device)
        self.tags = dict(self.config.session_tags)
        self.enabled = self.config.enabled and _ENABLED
        self.rank = rank_info()
        self.monitor: ResourceMonitor | None = None
        self.timer: _SessionTimer | None = None
        self.environment: dict = {}
        self.metrics: dict = {}
        self.models: list[dict] = []
        self.events_dropped = 0
        self.errors: list[str] = []
        self.breakdown = None
        self.overhead: dict | None = None
        self.report_paths: dict = {}
        self.report_error: str | None = None
        self.started_at = self.ended_at = None
        self.host_ms: float | None = None
        self.torch_peak_allocated_bytes: int | None = None
        self.diffusion_steps = 0
        self._events: list[dict] = []
        self._t0: float | None = None
        self._stack: contextlib.ExitStack | None = None
        self._block_stack: list[int] = []
        self._stamp: str | None = None
        self.active = False

    # --- lifecycle ---------------------------------------------------------------------------------------
    def __enter__(self) -> "ProfilingSession":
        if self.active:
            raise RuntimeError(f"session {self.name!r} is already active")
        if not self.enabled:
            return self
        if _ACTIVE:
            raise RuntimeError(f"session {_ACTIVE[-1].name!r} is active: one ProfilingSession at a time "
                               f"(use session.stage(...) for a part of it)")
        now = _dt.datetime.now(_dt.timezone.utc)
        self.started_at = now.isoformat(timespec="milliseconds")
        self._stamp = now.strftime("%Y%m%d-%H%M%S-") + f"{now.microsecond // 1000:03d}"
        self.rank = rank_info()
        try:
            self.environment = environment(self.device)
        except Exception as e:  # environment facts are nice to have, never a reason to fail a run
            self.errors.append(f"environment: {type(e).__name__}: {e}")
        self.monitor = ResourceMonitor.from_config(self.config, device=self.device, name=self.name)
        self.timer = _SessionTimer(self.device)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        self._stack = contextlib.ExitStack()
        try:
            self.monitor.start()
            self._stack.callback(self.monitor.stop)
            if self.config.time_labels:
                self._stack.enter_context(self.timer.attached())
            self._t0 = time.perf_counter()
            self._stack.enter_context(self.timer.section(SESSION_LABEL))
        except BaseException:
            self._stack.close()
            raise
        _ACTIVE.append(self)
        self.active = True
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if not self.active:
            return False
        try:
            if self._stack is not None:
                self._stack.close()  # ends the Session section, detaches the timer, stops the monitor
        finally:
            self.host_ms = (time.perf_counter() - self._t0) * 1e3
            self.ended_at = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="milliseconds")
            if self in _ACTIVE:
                _ACTIVE.remove(self)
            self.active = False
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.torch_peak_allocated_bytes = int(torch.cuda.max_memory_allocated(self.device))
        if exc_type is not None:
            self.event("session_failed", error=f"{exc_type.__name__}: {exc}")
        if self.config.generate_final_report:
            try:
                self.write_report()
            except Exception as e:  # never hide the body's exception or fail a finished run over a report
                self.report_error = f"{type(e).__name__}: {e}"
                warnings.warn(f"profiling report of session {self.name!r} failed: {self.report_error}", stacklevel=2)
        return False

    @property
    def report_stem(self) -> str:
        """File name stem of this session's reports: <name>_<UTC start time>_rank<r>."""
        return f"{slug(self.name)}_{self._stamp or 'not-started'}_rank{self.rank['rank']}"

    # --- timed regions -----------------------------------------------------------------------------------
    def _timed(self, name: str):
        """label(name) (record_function + NVTX), and a section of this session's timer."""
        if not self.active:
            return label(name)
        sinks = active_timers()
        if labels_enabled() and sinks and sinks[-1] is self.timer:
            return label(name)  # the attached timer times the label
        stack = contextlib.ExitStack()
        stack.enter_context(label(name))
        stack.enter_context(self.timer.section(name))
        return stack

    def stage(self, name: str):
        """A labelled, device-timed stage (context manager)."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"stage name must be a non-empty str, got {name!r}")
        return self._timed(name)

    def generation(self, warmup: bool = False):
        """Mark one generation: first-frame latency starts here; warmup=True excludes it from the summary."""
        return self._timed(WARMUP_LABEL if warmup else GENERATION_LABEL)

    @contextlib.contextmanager
    def block(self, index: int, frames: int | None = None):
        """One generated block (label 2.3_Block_{index}); frames = decoded pixel frames of the block."""
        if isinstance(index, bool) or not isinstance(index, int) or index < 0:
            raise ValueError(f"block index must be an int >= 0, got {index!r}")
        if frames is not None and (isinstance(frames, bool) or not isinstance(frames, int) or frames < 0):
            raise ValueError(f"frames must be None or an int >= 0 (decoded pixel frames), got {frames!r}")
        if not self.active:
            with label(f"2.3_Block_{index}"):
                yield self
            return
        self.timer.pending_frames = frames
        self._block_stack.append(index)
        try:
            with self._timed(f"2.3_Block_{index}"):
                yield self
        finally:
            self._block_stack.pop()
            self.timer.pending_frames = None

    def diffusion_step(self, step: int, timestep=None):
        """One denoising step (label 2.3.{block}_Denoising_Step_{step}_t{timestep} inside a block)."""
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"step must be an int >= 0, got {step!r}")
        t = ""
        if timestep is not None:
            if isinstance(timestep, torch.Tensor):  # never read a device tensor back (host sync)
                timestep = timestep.item() if timestep.device.type == "cpu" and timestep.numel() == 1 else None
            if timestep is not None:
                t = f"_t{int(round(float(timestep)))}"
        prefix = f"2.3.{self._block_stack[-1]}_" if self._block_stack else ""
        if self.active:
            self.diffusion_steps += 1
        return self._timed(f"{prefix}Denoising_Step_{step}{t}")

    # --- data --------------------------------------------------------------------------------------------
    def event(self, name: str, **data) -> None:
        """A custom event with a timestamp (host time since the session start) and JSON-able data."""
        if not self.active and self._t0 is None:
            return
        if len(self._events) >= self.config.max_data_points:
            self.events_dropped += 1
            return
        self._events.append({
            "name": str(name),
            "time_s": round(time.perf_counter() - self._t0, 6),
            "utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="milliseconds"),
            "data": _jsonable(data),
        })

    def set_metrics(self, metrics: dict | None = None, **kw) -> None:
        """Workload metrics to keep in the report (preset, steps, resolution, ...); later keys win."""
        if metrics is not None and not isinstance(metrics, dict):
            raise ValueError(f"metrics must be a dict, got {type(metrics).__name__}")
        self.metrics.update(_jsonable({**(metrics or {}), **kw}))

    def record_model(self, name: str, model=None, parameters_count: int | None = None, model_type=None) -> None:
        """Note a model and its parameter count (from an nn.Module or given)."""
        if parameters_count is None and isinstance(model, torch.nn.Module):
            parameters_count = sum(p.numel() for p in model.parameters())
        self.models.append({"model_name": str(name), "parameters_count": parameters_count,
                            "model_type": None if model_type is None else str(model_type)})

    def set_block_frames(self, frames_per_block, generation: int = -1) -> None:
        """Pixel frames of each block of a generation (default the last), e.g. `out.frames_per_block`."""
        frames = getattr(frames_per_block, "frames_per_block", frames_per_block)
        if not isinstance(frames, (list, tuple)) or not all(isinstance(f, int) and f >= 0 for f in frames):
            raise ValueError(f"frames_per_block must be a list of ints >= 0 (or a StreamOutput), got {frames!r}")
        if self.timer is None:
            return
        gens = sorted({b.generation for b in self.timer.blocks})
        if not gens:
            raise ValueError("no block sections were timed in this session (labels off, or time_labels: false "
                             "and no session.block(...))")
        try:
            gid = gens[generation]
        except IndexError:
            raise ValueError(f"generation={generation} out of range: {len(gens)} generations with blocks") from None
        blocks = [b for b in self.timer.blocks if b.generation == gid]
        if len(blocks) != len(frames):
            raise ValueError(f"frames_per_block has {len(frames)} entries but generation {gid} has "
                             f"{len(blocks)} timed blocks")
        for b, f in zip(blocks, frames):
            b.frames = int(f)

    def attach_breakdown(self, breakdown) -> None:
        """Attach a trace Breakdown (wmbook.profiling.breakdown.analyze) to appear in the report."""
        if not (hasattr(breakdown, "to_dict") or isinstance(breakdown, dict)):
            raise ValueError(f"breakdown must be a Breakdown (or its to_dict()), got {type(breakdown).__name__}")
        self.breakdown = breakdown

    def set_overhead(self, overhead: dict) -> None:
        """Attach a measure_overhead() result to appear in the report."""
        if not isinstance(overhead, dict) or "overhead_frac" not in overhead:
            raise ValueError("overhead must be the dict returned by measure_overhead()")
        self.overhead = overhead

    # --- reading -----------------------------------------------------------------------------------------
    def stages(self, collapse: bool = True) -> pd.DataFrame:
        """The nested stage table (SectionTimer.table): count, total/self/mean ms, host ms, share of parent."""
        if self.timer is None:
            return SectionTimer().table()
        return self.timer.table(collapse=collapse)

    def tables(self) -> dict:
        """The session's tables: stages, blocks, events, monitor (summary) as DataFrames."""
        mon = self.monitor.summary() if self.monitor is not None else None
        return {"stages": self.stages(), "blocks": self.blocks(), "events": self.events(), "monitor": mon}

    def events(self) -> pd.DataFrame:
        """Custom events: name, time_s (host, since session start), utc, data."""
        return pd.DataFrame(self._events, columns=["name", "time_s", "utc", "data"])

    def blocks(self) -> pd.DataFrame:
        """Timed blocks: generation, warmup, index, frames, start/end on the device timeline, section ms, stream ms."""
        cols = ["generation", "warmup", "index", "frames", "start_ms", "end_ms", "section_ms", "host_ms",
                "stream_ms"]
        blocks, gens, _ = self._timeline()
        rows = []
        for g in gens:
            prev = g["start_ms"]
            for b in (b for b in blocks if b["generation"] == g["id"]):
                rows.append({**b, "warmup": g["warmup"], "stream_ms": b["end_ms"] - prev})
                prev = b["end_ms"]
        return pd.DataFrame(rows, columns=cols)

    def _timeline(self):
        """(blocks, generations, notes): finished block/generation sections matched to their records."""
        notes = []
        if self.timer is None:
            return [], [], ["session not started or profiling disabled"]
        ev = self.timer.events()
        if self.timer.dropped:
            notes.append(f"{self.timer.dropped} sections dropped (timer full)")

        def outermost(rx_or_names, path):
            parts = path.split("/")
            match = (lambda p: BLOCK_RE.match(p)) if rx_or_names is BLOCK_RE else (lambda p: p in rx_or_names)
            return bool(match(parts[-1])) and not any(match(p) for p in parts[:-1])

        brows = ev[[outermost(BLOCK_RE, p) for p in ev["path"]]] if len(ev) else ev
        grows = ev[[outermost((GENERATION_LABEL, WARMUP_LABEL), p) for p in ev["path"]]] if len(ev) else ev
        recs = [b for b in self.timer.blocks if b.timed][: len(brows)]  # open blocks (not finished) come last
        blocks = [{"generation": r.generation, "index": r.index, "frames": r.frames, "start_ms": float(row.start_ms),
                   "end_ms": float(row.end_ms), "section_ms": float(row.ms), "host_ms": float(row.host_ms)}
                  for r, row in zip(recs, brows.itertuples())]
        explicit = [g for g in self.timer.generations if g.explicit and g.timed][: len(grows)]
        gstart = {g.id: float(row.start_ms) for g, row in zip(explicit, grows.itertuples())}
        gens = []
        for g in self.timer.generations:
            bs = [b for b in blocks if b["generation"] == g.id]
            if not bs:
                continue
            gens.append({"id": g.id, "warmup": g.warmup, "explicit": g.explicit,
                         "start_ms": gstart.get(g.id, bs[0]["start_ms"]), "n_blocks": len(bs)})
        return blocks, gens, notes

    def stream(self) -> tuple[dict | None, list[dict], str | None]:
        """(metrics of the last non-warm-up generation, metrics of every generation, note when None)."""
        blocks, gens, notes = self._timeline()
        per_gen = []
        for g in gens:
            bs = [b for b in blocks if b["generation"] == g["id"]]
            d = {"generation": g["id"], "warmup": g["warmup"], "explicit_start": g["explicit"],
                 "n_blocks": len(bs), "indices": [b["index"] for b in bs]}
            missing = [b["index"] for b in bs if b["frames"] is None]
            if missing:
                d["note"] = (f"pixel frames unknown for blocks {missing}: pass frames= to session.block or call "
                             f"session.set_block_frames(out.frames_per_block)")
            else:
                ends = [g["start_ms"]] + [b["end_ms"] for b in bs]
                block_ms = [b - a for a, b in zip(ends[:-1], ends[1:])]
                first = bs[0]["end_ms"] - g["start_ms"]
                try:
                    d.update(stream_metrics(block_ms, [b["frames"] for b in bs], first, steady_from=1))
                except ValueError as e:
                    d["note"] = str(e)
            per_gen.append(d)
        cands = [d for d in per_gen if not d["warmup"]]
        if not per_gen:
            note = "no block sections timed: use session.block(i, frames=n) or run a labelled pipeline inside"
            return None, per_gen, "; ".join(notes + [note])
        if not cands:
            return None, per_gen, "every generation was marked warm-up"
        last = cands[-1]
        if "fps" not in last:
            return None, per_gen, last.get("note")
        if last["n_blocks"] < 2:
            last = {**last, "note": "one block only: FPS/BPS include the first block (no steady state)"}
        return last, per_gen, None

    def summary(self) -> dict:
        """Session time, FPS/BPS/first-frame (DESIGN.md), counts, monitor highlights (JSON-serialisable)."""
        out = {"name": self.name, "enabled": self.enabled, "rank": self.rank["rank"],
               "world_size": self.rank["world_size"], "device": str(self.device),
               "timing": ("CUDA events" if self.device.type == "cuda" else "host perf_counter (CPU device)")}
        if self.timer is None:
            return out
        ev = self.timer.events()
        root = ev[ev["path"] == SESSION_LABEL]
        out["session_ms"] = float(root["ms"].iloc[0]) if len(root) else None  # device timeline, start to end
        out["session_host_ms"] = self.host_ms if self.host_ms is not None else (
            (time.perf_counter() - self._t0) * 1e3 if self._t0 else None)
        stream, per_gen, note = self.stream()
        out["stream"] = stream
        out["stream_note"] = note
        out["generations"] = per_gen
        for k in ("fps", "bps", "first_frame_ms"):
            out[k] = stream.get(k) if stream else None
        out["blocks"] = len(self.timer.blocks)
        out["diffusion_steps"] = self.diffusion_steps
        out["sections"] = len(self.timer)
        out["events"] = len(self._events)
        out["torch_peak_allocated_mib"] = (None if self.torch_peak_allocated_bytes is None
                                           else self.torch_peak_allocated_bytes / 2**20)
        if self.monitor is not None:
            ms = self.monitor.summary().set_index("metric")
            for key, metric, col in (("gpu_memory_used_mib_max", "gpu_memory_used_mib", "max"),
                                     ("gpu_utilization_pct_mean", "gpu_utilization_pct", "mean"),
                                     ("gpu_power_w_mean", "gpu_power_w", "mean"),
                                     ("cpu_percent_mean", "cpu_percent", "mean"),
                                     ("process_rss_mib_max", "process_rss_mib", "max")):
                out[key] = float(ms.at[metric, col]) if metric in ms.index else None
            out["gpu_available"] = self.monitor.gpu_available
            out["gpu_reason"] = self.monitor.gpu_reason
        return _jsonable(out)

    # --- reports -----------------------------------------------------------------------------------------
    def to_dict(self, raw: bool | None = None) -> dict:
        """The JSON report as a dict (monitor samples when raw, default config.save_raw_data)."""
        return report_dict(self, raw=self.config.save_raw_data if raw is None else raw)

    def write_report(self, output_dir=None, formats=None) -> dict:
        """Write the JSON and/or HTML report atomically; returns {"json": path, "html": path} of what was written."""
        if self.timer is None:
            warnings.warn(f"session {self.name!r} was not run with profiling enabled: no report", stacklevel=2)
            return {}
        self.report_paths = write_report(self, output_dir=output_dir, formats=formats)
        return self.report_paths
