"""torch.profiler wrapper writing gzip Chrome traces, and label breakdowns from those traces."""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch
from torch.profiler import ProfilerActivity

from ..atomic import atomic_open

LABEL_COLUMNS = [
    "label", "count", "cpu_total_ms", "cpu_self_ms", "gpu_total_ms", "gpu_self_ms", "depth", "parent",
]  # fmt: skip
KEY_AVERAGE_COLUMNS = [
    "name", "count", "cpu_time_total_us", "self_cpu_time_total_us",
    "device_time_total_us", "self_device_time_total_us",
]  # fmt: skip
STAGE_RE = re.compile(r"^\d+_")
BLOCK_RE = re.compile(r"^2\.3_Block_(\d+)$")
STEP_RE = re.compile(r"^2\.3\.(\d+)_Denoising_Step_(\d+)_t(\d+)$")

_EPS_US = 0.002  # trace ts and dur are rounded to ns separately, so ends can differ by ~1 ns

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


def _gzip_atomic(src: Path, dest: Path) -> None:
    with atomic_open(dest, "wb") as raw:
        with gzip.GzipFile(fileobj=raw, mode="wb", filename="") as gz, open(src, "rb") as f:
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


def load_trace(path) -> dict:
    """A Chrome trace as a dict, from .json or .json.gz."""
    p = Path(path)
    opener = gzip.open if p.suffix == ".gz" else open
    with opener(p, "rt") as f:
        return json.load(f)


def _ext_id(e: dict):
    args = e.get("args")
    return args.get("External id") if isinstance(args, dict) else None


def _nest(events: list[dict]) -> list[dict]:
    """Nodes for X-events with depth, parent, children by interval containment per thread/stream."""
    groups: dict = {}
    for e in events:
        groups.setdefault((e.get("pid"), e.get("tid")), []).append(e)
    nodes = []
    for evs in groups.values():
        # outer range first when two start together
        evs = sorted(evs, key=lambda e: (float(e["ts"]), -float(e.get("dur", 0.0))))
        stack: list[dict] = []
        for e in evs:
            ts, dur = float(e["ts"]), float(e.get("dur", 0.0))
            node = {
                "name": e["name"], "ts": ts, "end": ts + dur, "dur": dur, "ext": _ext_id(e),
                "children": [], "gpu": [], "lane": (e["name"], e.get("pid"), e.get("tid")),
            }  # fmt: skip
            while stack and not (ts >= stack[-1]["ts"] and node["end"] <= stack[-1]["end"] + _EPS_US):
                stack.pop()
            node["depth"] = len(stack)
            node["parent"] = stack[-1] if stack else None
            if stack:
                stack[-1]["children"].append(node)
            stack.append(node)
            nodes.append(node)
    return nodes


def _attach_gpu(cpu_nodes: list[dict], gpu_events: list[dict]) -> list[dict]:
    """Give each device range to its host range (by External id, else k-th by name); return the rest."""
    by_ext = {n["ext"]: n for n in cpu_nodes if n["ext"] is not None}
    by_name: dict = {}
    for n in sorted(cpu_nodes, key=lambda n: n["ts"]):
        by_name.setdefault(n["name"], []).append(n)
    lanes: dict = {}
    for e in gpu_events:
        ts, end = float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0.0))
        host = by_ext.get(_ext_id(e))
        if host is not None and host["name"] == e["name"]:
            host["gpu"].append((ts, end))
        else:
            lanes.setdefault((e["name"], e.get("pid"), e.get("tid")), []).append(e)
    rest = []
    for (name, _, _), evs in lanes.items():
        hosts = by_name.get(name, [])
        for k, e in enumerate(sorted(evs, key=lambda e: float(e["ts"]))):
            if k < len(hosts):
                hosts[k]["gpu"].append((float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0.0))))
            else:
                rest.append(e)
    return rest


def _roll_up_gpu(cpu_nodes: list[dict]) -> None:
    """Device span of each host range = first to last device work of it and its nested ranges."""
    for n in sorted(cpu_nodes, key=lambda n: -n["depth"]):  # children before parents
        spans = n["gpu"] + [c["gpu_span"] for c in n["children"] if c["gpu_span"] is not None]
        n["gpu_span"] = (min(s for s, _ in spans), max(e for _, e in spans)) if spans else None
        if n["gpu_span"] is None:
            n["gpu_total"] = n["gpu_self"] = None
            continue
        total = n["gpu_span"][1] - n["gpu_span"][0]
        child = sum(c["gpu_total"] for c in n["children"] if c["gpu_total"] is not None)
        n["gpu_total"] = total
        n["gpu_self"] = max(0.0, total - child)  # children on parallel streams can overlap


def label_table(trace_or_path, prefix_filter=None) -> pd.DataFrame:
    """Per-label count, total and self ms on host (user_annotation) and device (gpu_user_annotation).

    Host: total = summed range durations; self = total minus directly nested labels (same thread).
    Device: the profiler gives a device range only to the innermost label of each kernel, so each
    host range is credited with the span from the first to the last device work launched inside
    it (nested labels included); self = that span minus its nested labels' spans.
    Device ranges with no host range are nested among themselves per stream.
    depth/parent come from the first occurrence. ProfilerStep#N ranges are left out.
    prefix_filter: str or tuple of str, applied after nesting.
    """
    trace = trace_or_path if isinstance(trace_or_path, dict) else load_trace(trace_or_path)
    events = trace.get("traceEvents", []) if isinstance(trace, dict) else []

    def pick(cat):
        return [
            e for e in events
            if e.get("cat") == cat and e.get("ph") == "X" and "ts" in e and "name" in e
            and not str(e["name"]).startswith("ProfilerStep#")
        ]  # fmt: skip

    cpu_nodes = _nest(pick("user_annotation"))
    rest = _attach_gpu(cpu_nodes, pick("gpu_user_annotation"))
    _roll_up_gpu(cpu_nodes)
    gpu_only = _nest(rest)
    for n in gpu_only:
        n["gpu_total"] = n["dur"]
        n["gpu_self"] = n["dur"] - sum(c["dur"] for c in n["children"])

    stats: dict = {}
    for side, nodes in (("cpu", cpu_nodes), ("gpu", gpu_only)):
        for n in nodes:
            s = stats.setdefault(n["name"], {"first": None, "side": side, "cpu": [], "gpu": []})
            if s["first"] is None or (s["side"] == side and n["ts"] < s["first"]["ts"]):
                s["first"] = n
            if side == "cpu":
                s["cpu"].append((n["dur"], n["dur"] - sum(c["dur"] for c in n["children"])))
            if n["gpu_total"] is not None:
                s["gpu"].append((n["gpu_total"], n["gpu_self"]))

    rows = []
    for name, s in stats.items():
        first = s["first"]
        row = {"label": name, "count": len(s["cpu"]) or len(s["gpu"])}
        for side in ("cpu", "gpu"):
            vals = s[side]
            # trace times are in microseconds
            row[f"{side}_total_ms"] = sum(t for t, _ in vals) / 1e3 if vals else float("nan")
            row[f"{side}_self_ms"] = sum(x for _, x in vals) / 1e3 if vals else float("nan")
        row["depth"] = first["depth"]
        row["parent"] = first["parent"]["name"] if first["parent"] is not None else ""
        row["_order"] = (s["side"] != "cpu", first["ts"])
        rows.append(row)
    if not rows:
        return pd.DataFrame({c: pd.Series(dtype=object) for c in LABEL_COLUMNS})
    rows.sort(key=lambda r: r["_order"])
    df = pd.DataFrame(rows)
    if prefix_filter is not None:
        prefixes = (prefix_filter,) if isinstance(prefix_filter, str) else tuple(prefix_filter)
        df = df[df["label"].str.startswith(prefixes)]
    return df[LABEL_COLUMNS].reset_index(drop=True)


_PREFER = ("gpu", "cpu")


def _ms(df: pd.DataFrame, prefer: str) -> tuple[pd.Series, pd.Series]:
    if prefer not in _PREFER:
        raise ValueError(f"prefer must be one of {_PREFER}, got {prefer!r}")
    first, second = ("gpu", "cpu") if prefer == "gpu" else ("cpu", "gpu")
    a = df[f"{first}_total_ms"].astype(float)
    ms = a.where(a.notna(), df[f"{second}_total_ms"].astype(float))
    source = a.notna().map({True: first, False: second})
    return ms, source


def stage_table(df: pd.DataFrame, prefer: str = "gpu") -> pd.DataFrame:
    """Top-level stages (labels like '1_Data_Preparation'): ms (`prefer` side, else the other) and share.

    Host-heavy stages (image loading, export) show little device time: use prefer="cpu" for
    wall-clock shares when the run synchronizes at stage boundaries.
    """
    st = df[df["label"].astype(str).str.match(STAGE_RE)]
    ms, source = _ms(st, prefer)
    out = pd.DataFrame(
        {
            "label": st["label"],
            "ms": ms,
            "source": source,
            "cpu_ms": st["cpu_total_ms"].astype(float),
            "gpu_ms": st["gpu_total_ms"].astype(float),
        }
    )
    total = out["ms"].sum()
    out["share"] = out["ms"] / total if total > 0 else float("nan")
    return out.reset_index(drop=True)


def block_table(df: pd.DataFrame, prefer: str = "gpu") -> pd.DataFrame:
    """Per-block rows (2.3_Block_i) and per-step rows (2.3.i_Denoising_Step_j_tT): block, step, t, ms."""
    ms, source = _ms(df, prefer)
    rows = []
    for label, v, src in zip(df["label"].astype(str), ms, source):
        if m := BLOCK_RE.match(label):
            block, step, t = int(m[1]), None, None
        elif m := STEP_RE.match(label):
            block, step, t = int(m[1]), int(m[2]), int(m[3])
        else:
            continue
        rows.append({"label": label, "block": block, "step": step, "t": t, "ms": v, "source": src})
    cols = ["label", "block", "step", "t", "ms", "source"]
    if not rows:
        return pd.DataFrame({c: pd.Series(dtype=object) for c in cols})
    out = pd.DataFrame(rows, columns=cols)
    out["step"] = out["step"].astype("Int64")
    out["t"] = out["t"].astype("Int64")
    # block row first (step NA sorts first), then its steps in order
    out = out.sort_values(["block", "step"], na_position="first", kind="stable")
    return out.reset_index(drop=True)
