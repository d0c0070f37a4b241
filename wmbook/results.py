"""Append-only results table (CSV) with environment metadata on every row."""

from __future__ import annotations

import datetime as _dt
import fcntl
import functools
import importlib.metadata
import json
import os
import platform
import socket
import uuid
from pathlib import Path

import pandas as pd
import torch

from .atomic import atomic_open
from .paths import RESULTS_PATH, git_commit

DEFAULT_PATH = RESULTS_PATH

RUN_ID = uuid.uuid4().hex[:12]  # one per process

COLUMNS = [
    "timestamp", "run_id", "notebook", "workload", "preset", "variant",
    "metric", "value", "unit", "median", "p20", "p80", "p95", "n", "warmup", "repeats",
    "params", "device_name", "device_kind", "torch", "triton", "cuda", "python",
    "diffusers", "transformers", "numpy", "git_commit", "hostname", "host_cpu",
]  # fmt: skip

# read back as text so commits like "0123456" and JSON params survive untouched
STRING_COLUMNS = [
    "timestamp", "run_id", "notebook", "workload", "preset", "variant", "unit", "params",
    "device_name", "device_kind", "torch", "triton", "cuda", "python", "diffusers", "transformers", "numpy",
    "git_commit", "hostname", "host_cpu",
]  # fmt: skip

# the libraries whose numerics the results depend on besides torch (README: Supported versions)
NUMERIC_LIBRARIES = ("diffusers", "transformers", "numpy")


def default_path() -> Path:
    """$WMBOOK_RESULTS if set, else <repo>/data/results/results.csv."""
    env = os.environ.get("WMBOOK_RESULTS")
    return Path(env) if env else DEFAULT_PATH


def _resolve(path) -> Path:
    return Path(path) if path is not None else default_path()


def library_versions(names=NUMERIC_LIBRARIES) -> dict[str, str]:
    """{name: installed version} from package metadata (no import); '' when not installed."""
    out = {}
    for name in names:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = ""
    return out


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


@functools.lru_cache(maxsize=1)
def _static_metadata() -> dict:
    if torch.cuda.is_available():
        kind, name = "cuda", torch.cuda.get_device_name(torch.cuda.current_device())
    else:
        kind, name = "cpu", _cpu_name()
    try:
        import triton

        triton_version = triton.__version__
    except Exception:  # not installed, or broken install
        triton_version = ""
    return {
        "device_name": name,
        "device_kind": kind,
        "torch": torch.__version__,
        "triton": triton_version,
        "cuda": torch.version.cuda or "",
        "python": platform.python_version(),
        **library_versions(),
        "git_commit": git_commit(),
        "hostname": socket.gethostname(),
        # the host's CPU model and cores: a launch-bound GPU row (the small world models, eager loops) runs at the
        # host's single-thread speed, so the same code and GPU model can differ by 2x between lent machines
        "host_cpu": f"{_cpu_name()} x{os.cpu_count() or 0}",
    }


def environment_metadata() -> dict:
    """Device, versions, git commit, host (cached per process) and a fresh UTC timestamp."""
    meta = dict(_static_metadata())
    meta["timestamp"] = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    return meta


def make_row(
    *,
    notebook: str,
    workload: str,
    preset: str,
    variant: str,
    metric: str,
    value: float,
    unit: str,
    timing=None,
    params: dict | None = None,
    warmup: int | None = None,
    repeats: int | None = None,
    run_id: str | None = None,
    **extra,
) -> dict:
    """One results row: the measurement, timing stats (if given), params as JSON, environment."""
    if params is not None and not isinstance(params, dict):
        raise ValueError(f"params must be a dict or None, got {type(params).__name__}")
    row = {
        "run_id": run_id or RUN_ID,
        "notebook": notebook,
        "workload": workload,
        "preset": preset,
        "variant": variant,
        "metric": metric,
        "value": value,
        "unit": unit,
        "warmup": warmup,
        "repeats": repeats,
        "params": json.dumps(params or {}, sort_keys=True, default=str),
    }
    if timing is not None:
        row.update({k: timing.summary()[k] for k in ("median", "p20", "p80", "p95", "n")})
    row.update(environment_metadata())
    clash = set(extra) & set(COLUMNS)
    if clash:
        raise ValueError(f"extra columns {sorted(clash)} clash with standard columns; pass them by name")
    row.update(extra)
    return {**{c: row.get(c) for c in COLUMNS}, **{k: v for k, v in row.items() if k not in COLUMNS}}


def _to_frame(rows) -> pd.DataFrame:
    if isinstance(rows, pd.DataFrame):
        return rows
    if isinstance(rows, dict):
        return pd.DataFrame([rows])
    if isinstance(rows, (list, tuple)) and all(isinstance(r, dict) for r in rows):
        return pd.DataFrame(list(rows))
    raise ValueError(f"rows must be a dict, a list of dicts or a DataFrame, got {type(rows).__name__}")


def _ordered(df: pd.DataFrame) -> pd.DataFrame:
    cols = [c for c in COLUMNS if c in df.columns] + [c for c in df.columns if c not in COLUMNS]
    return df[cols]


def _write_csv(df: pd.DataFrame, f) -> None:
    df.to_csv(f, index=False)


def append(rows, path=None) -> Path:
    """Append rows atomically (lock, read, concat, write temp, fsync, rename); returns the path."""
    new = _to_frame(rows)
    dest = _resolve(path)
    dest.parent.mkdir(parents=True, exist_ok=True)
    lock_path = dest.with_name(dest.name + ".lock")
    with open(lock_path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if dest.exists() and dest.stat().st_size > 0:
                # all text, no NA parsing: existing rows are rewritten byte-for-byte
                old = pd.read_csv(dest, dtype=str, keep_default_na=False)
                df = pd.concat([old, new], ignore_index=True, sort=False)
            else:
                df = new
            df = _ordered(df)
            with atomic_open(dest, "w", newline="") as f:
                _write_csv(df, f)
            _fsync_dir(dest.parent)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return dest


CUT = "run_cut"  # the metric of the row that marks a run as cut before its notebook finished


PARTIAL = "run_partial"  # the metric of the row that marks a finished run that measured part of its notebook


def _mark(run_id: str, reason: str, metric: str, example: str, path=None) -> Path:
    df = read(path)
    if not reason:
        raise ValueError(f"reason='' is not allowed: say why (e.g. {example!r})")
    match = df[df["run_id"] == run_id]
    if not len(match):
        raise ValueError(f"run_id={run_id!r} is not allowed: no such run in {_resolve(path)}; allowed values: "
                         f"{sorted(df['run_id'].dropna().unique().tolist())[-10:]} (the last 10)")
    r = match.iloc[0]
    row = {k: r[k] for k in ("timestamp", "run_id", "notebook", "workload", "preset", "params", "device_name",
                             "device_kind", "torch", "git_commit", "hostname") if k in match.columns}
    row.update(variant="", metric=metric, value=1.0, unit="", note=reason)
    return append([row], path)


def mark_cut(run_id: str, reason: str, path=None) -> Path:
    """Mark a stored run as cut (its notebook stopped before the end: the machine taken back, a timeout): one row of
    metric CUT carrying the reason in `note`. Its rows stay (they were measured), but the published tables and
    indexes (wmbook.published, wmbook.headlines) show the latest run that was not cut, so a table and its report come
    from one run."""
    return _mark(run_id, reason, CUT, "device time ran out after row 4", path)


def mark_partial(run_id: str, reason: str, path=None) -> Path:
    """Mark a stored run as partial: it finished, but measured only part of its notebook by choice (e.g. notebook 06
    for its decoder table, with one graph row). One row of metric PARTIAL carrying the reason in `note`. The published
    tables and headlines of the notebook keep the latest full run; a table that only some runs have (notebook 06's
    decoder table) takes the latest run that has it, partial or not."""
    return _mark(run_id, reason, PARTIAL, "decoder table only, one graph row", path)


def _marked(df: pd.DataFrame, metric: str) -> set:
    """The run ids carrying a marker row of `metric` (CUT, PARTIAL)."""
    if "metric" not in df.columns or not len(df):
        return set()
    return set(df.loc[df["metric"] == metric, "run_id"])


def partial_runs(df: pd.DataFrame) -> set:
    """The run ids marked partial (mark_partial)."""
    return _marked(df, PARTIAL)


def of_device(df: pd.DataFrame, device: str | None) -> pd.DataFrame:
    """The rows of devices whose name contains `device` (case-insensitive, a plain substring: 'H100', 'H200');
    every row when `device` is None or empty."""
    if not device:
        return df
    return df[df["device_name"].astype(str).str.contains(device, case=False, regex=False)]


def without_cut(df: pd.DataFrame) -> pd.DataFrame:
    """The rows of runs that were not marked cut (mark_cut)."""
    cut = _marked(df, CUT)
    return df[~df["run_id"].isin(cut)] if cut else df


def _fsync_dir(d: Path) -> None:
    try:
        fd = os.open(d, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def read(path=None, **filters) -> pd.DataFrame:
    """The results table (standard columns even when empty); filters keep rows where col == value.

    A list/tuple/set filter value keeps rows whose column is any of its values.
    """
    src = _resolve(path)
    if not src.exists() or src.stat().st_size == 0:
        df = pd.DataFrame({c: pd.Series(dtype=object) for c in COLUMNS})
    else:
        df = pd.read_csv(src, dtype={c: str for c in STRING_COLUMNS})
        for c in STRING_COLUMNS:
            if c in df.columns:
                df[c] = df[c].fillna("")
    for col, want in filters.items():
        if col not in df.columns:
            raise ValueError(f"filter column {col!r} not in results; columns: {list(df.columns)}")
        if isinstance(want, (list, tuple, set)):
            df = df[df[col].isin(list(want))]
        else:
            df = df[df[col] == want]
    return df.reset_index(drop=True)


def params_of(row) -> dict:
    """Decode the JSON params column of one row (Series or dict)."""
    text = row["params"]
    return json.loads(text) if isinstance(text, str) and text else {}


__all__ = [
    "COLUMNS", "DEFAULT_PATH", "RUN_ID", "append", "default_path", "environment_metadata",
    "git_commit", "library_versions", "make_row", "params_of", "read",
]  # fmt: skip
