"""Append-only results table (CSV) with environment metadata on every row.

The store proves its own integrity. An append is whole or absent: under an exclusive lock the existing rows are read
and checked, the new table is written to memory and checked again, then to a temporary file beside the store, synced
and renamed over it. A store that was cut or edited into a broken shape (a half row from a crash or a full disk, a
row of the wrong width, a value that is not a number) is refused on every read and append with the line named, never
padded or skipped: `problems` lists what is wrong, `check` adds the rows a committed store lost since its last commit,
and `wmbook results check` prints both.

Rows that form a closed record (an older device's) can be sealed: `seal` moves them into a part beside the store
(`results.h100.csv` beside `results.csv`), which every read and check takes with the store and no append touches.
"""

from __future__ import annotations

import csv
import datetime as _dt
import fcntl
import functools
import importlib.metadata
import io
import json
import os
import platform
import socket
import subprocess
import uuid
from collections import Counter
from pathlib import Path

import pandas as pd
import torch

from .atomic import atomic_open
from .errors import InputError
from .paths import GPU_TIME_FILE, RESULTS_PATH, check_output_file, git_commit

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

# every row has these filled in (a marker row of mark_cut / mark_partial too); the numeric ones are a number or empty
KEY_COLUMNS = ("timestamp", "run_id", "notebook", "metric")
NUMERIC_COLUMNS = ("value", "median", "p20", "p80", "p95", "n", "warmup", "repeats")
_SHOW_PROBLEMS = 10


class StoreError(InputError):
    """A results store that fails its checks (wmbook.results.problems): the message names the file and the lines."""


# the libraries whose numerics the results depend on besides torch (README: Supported versions)
NUMERIC_LIBRARIES = ("diffusers", "transformers", "numpy")


def default_results_path(tiny: bool) -> Path:
    """Real-shape rows go to the committed store ($WMBOOK_RESULTS overrides it), tiny-preset rows to a local,
    git-ignored one, so CPU smoke runs never mix with GPU numbers."""
    from . import paths  # noqa: PLC0415  (its TINY_RESULTS_PATH read at call time)

    return paths.TINY_RESULTS_PATH if tiny else default_path()


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
        import triton  # noqa: PLC0415  optional: triton

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
        # host's single-thread speed, so the same code and GPU model can differ by 2x between hosts
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
    """Append rows, whole or not at all; returns the path. Under an exclusive lock: the store is checked (a store that
    fails problems() is refused, StoreError, nothing written), the new table is made in memory and checked to hold
    every old row and the new ones, then written to a temporary file, synced and renamed over the store."""
    new = _to_frame(rows)
    dest = _resolve(path)
    check_output_file(dest, "results_path", "the path of a results file (.csv)")
    dest.parent.mkdir(parents=True, exist_ok=True)
    lock_path = dest.with_name(dest.name + ".lock")
    with open(lock_path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            n_old = 0
            if dest.exists() and dest.stat().st_size > 0:
                n_old = _checked_rows(dest)
                # all text, no NA parsing: existing rows are rewritten byte-for-byte
                old = pd.read_csv(dest, dtype=str, keep_default_na=False)
                df = pd.concat([old, new], ignore_index=True, sort=False)
            else:
                df = new
            buf = io.StringIO()
            _write_csv(_ordered(df), buf)
            text = buf.getvalue()
            _, n, found = _scan(io.StringIO(text))
            if found or n != n_old + len(new):
                raise StoreError(f"results_path={str(dest)!r}: the rows to append would not make a sound store "
                                 f"({'; '.join(found[:3]) or f'{n} rows instead of {n_old} + {len(new)}'}); nothing "
                                 f"was written; allowed values: rows of numbers in the numeric columns "
                                 f"{list(NUMERIC_COLUMNS)} and {list(KEY_COLUMNS)} filled in")
            with atomic_open(dest, "w", newline="") as f:
                f.write(text)
            _fsync_dir(dest.parent)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return dest


def seal(device: str, path=None) -> tuple[Path, int]:
    """Move the rows of the devices whose name contains `device` (case-insensitive) out of the store into its sealed
    part `<stem>.<device><suffix>` (rows a part already holds stay; the new ones follow them), for a record that is
    closed (an older device's); returns (the part, rows moved). Under the store's lock, the part is written whole
    (temporary file, renamed) before the store is rewritten without those rows: an interruption leaves every row in
    one file at least (problems() names rows left in both)."""
    tag = "".join(ch if ch.isalnum() else "-" for ch in str(device).lower()).strip("-")
    if not tag:
        raise InputError(f"device={device!r} is not allowed; allowed values: part of a device name, e.g. H100")
    src = _resolve(path)
    if not src.is_file():
        raise InputError(f"path={str(src)!r} is not allowed: no such file; allowed values: a results CSV file")
    part = src.with_name(f"{src.stem}.{tag}{src.suffix}")
    with open(src.with_name(src.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            for f in (part, src):
                _checked_rows(f)
            df = pd.read_csv(src, dtype=str, keep_default_na=False)
            mine = df["device_name"].str.contains(str(device), case=False, regex=False)
            if not mine.any():
                names = sorted(set(df["device_name"]))
                raise InputError(f"device={device!r} is not allowed: no row of {src.name} is of such a device; "
                                 f"allowed values: part of one of {names}")
            old = pd.read_csv(part, dtype=str, keep_default_na=False) if part.is_file() else df.iloc[:0]
            for dest, rows in ((part, pd.concat([old, df[mine]], ignore_index=True, sort=False)), (src, df[~mine])):
                buf = io.StringIO()
                _write_csv(_ordered(rows), buf)
                with atomic_open(dest, "w", newline="") as f:
                    f.write(buf.getvalue())
            _fsync_dir(src.parent)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return part, int(mine.sum())


def _scan(f) -> tuple[list[str], int, list[str]]:
    """(header, rows, problems) of a results CSV opened as text: each problem 'line N: what is wrong'. Strict: a row
    of another width than the header, a quote left open, a last line without its line end (a row cut while it was
    written), an empty key column, a numeric column that is not a number."""
    problems: list[str] = []
    reader = csv.reader(f, strict=True)
    try:
        header = next(reader)
    except StopIteration:
        return [], 0, []
    except csv.Error as e:
        return [], 0, [f"line 1 (the header): {e}"]
    missing = [c for c in KEY_COLUMNS + ("value",) if c not in header]
    dup = sorted({c for c in header if header.count(c) > 1})
    if missing or dup:
        return header, 0, ["line 1 (the header): " + "; ".join(
            ([f"columns {missing} missing"] if missing else []) + ([f"columns {dup} repeated"] if dup else []))]
    keys = [(c, header.index(c)) for c in KEY_COLUMNS]
    nums = [(c, header.index(c)) for c in NUMERIC_COLUMNS if c in header]
    rows, line = 0, 1
    while True:
        try:
            row = next(reader)
        except StopIteration:
            break
        except csv.Error as e:
            problems.append(f"line {reader.line_num}: {e} (a quote left open: the row was cut)")
            break
        rows += 1
        line = reader.line_num
        if len(row) != len(header):
            problems.append(f"line {line}: {len(row)} fields, the header has {len(header)} (a row cut short by a "
                            f"crash or a full disk, or edited by hand)")
            continue
        for c, i in keys:
            if not row[i]:
                problems.append(f"line {line}: {c} is empty")
        for c, i in nums:
            if row[i]:
                try:
                    float(row[i])
                except ValueError:
                    problems.append(f"line {line}: {c}={row[i]!r} is not a number")
    return header, rows, problems


def _inspect(src: Path) -> tuple[int, list[str]]:
    """(rows, problems) of a store file: what _scan finds, a last row without its line end, bytes that are not
    UTF-8."""
    if not src.exists() or (src.is_file() and src.stat().st_size == 0):
        return 0, []
    if not src.is_file():
        return 0, [f"{str(src)!r} is not a file"]
    raw = src.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[:e.start].count(b"\n") + 1
        return 0, [f"line {line}: bytes that are not UTF-8 (a corrupted file)"]
    _, n, found = _scan(io.StringIO(text, newline=""))
    if not text.endswith("\n") and not any("quote left open" in p for p in found):
        found.append(f"line {text.count(chr(10)) + 1} (the last): no line end, the row was cut while it was written")
    return n, found


def sealed_parts(path=None) -> list[Path]:
    """The sealed parts of a store (`seal`): `<stem>.<part><suffix>` files beside it, read and checked with it."""
    src = _resolve(path)
    return sorted(p for p in src.parent.glob(f"{src.stem}.*{src.suffix}") if p.is_file()) if src.suffix else []


def _rows_of(src: Path) -> list[tuple]:
    with open(src, newline="", encoding="utf-8") as f:
        return [tuple(r) for r in csv.reader(f)][1:]


def problems(path=None) -> list[str]:
    """What is wrong with a results store and its sealed parts, line by line (a part's lines named with its file, rows
    found in a part and in the store too); [] when it is sound, absent or empty."""
    src = _resolve(path)
    parts = sealed_parts(src)
    found = [f"{part.name}, {p}" for part in parts for p in _inspect(part)[1]] + _inspect(src)[1]
    if found or not parts or not src.is_file():
        return found
    live = set(_rows_of(src))
    return [f"{part.name}: {n} row(s) are in {src.name} too (a seal cut short: remove them from {src.name})"
            for part in parts if (n := sum(r in live for r in _rows_of(part)))]


def _store_error(src: Path, found: list[str]) -> StoreError:
    shown = "; ".join(found[:_SHOW_PROBLEMS]) + (f"; and {len(found) - _SHOW_PROBLEMS} more" if len(found) >
                                                   _SHOW_PROBLEMS else "")
    return StoreError(f"results store {str(src)!r} fails its check: {shown}. Nothing was read or written; allowed "
                      f"values: a store whose every row is whole (restore it, e.g. `git checkout -- FILE` for the "
                      f"committed one, or remove the named lines; `wmbook results check` lists every problem)")


def _checked_rows(src: Path) -> int:
    """The number of rows of a store that passes problems(); StoreError naming the lines otherwise."""
    n, found = _inspect(src)
    if found:
        raise _store_error(src, found)
    return n


def _row_key(row: dict) -> tuple:
    return tuple(row.get(c, "") for c in ("timestamp", "run_id", "notebook", "metric", "variant"))


def lost_since_commit(path=None) -> list[str]:
    """Rows that the last commit of a store tracked by git holds, in the store or its sealed parts, and that none of
    those files holds now (the store only grows, and sealed rows only move to a part, so a row gone means a cut or
    replaced file): one problem line per run that lost rows; [] when the file is not tracked, git is not there, or
    nothing was lost."""
    src = _resolve(path).resolve()
    if not src.is_file():
        return []

    def git(*args):
        return subprocess.run(["git", "-C", str(src.parent), *args], capture_output=True, timeout=30)

    def keys(text: str) -> Counter:
        return Counter(_row_key(r) for r in csv.DictReader(io.StringIO(text, newline="")))

    try:
        if git("ls-files", "--error-unmatch", src.name).returncode:
            return []
        # the files of the store at the last commit and now: a part committed and since deleted counts as well
        tracked = git("ls-files", "--", src.name, f"{src.stem}.*{src.suffix}").stdout.decode().split()
        committed, now = Counter(), Counter()
        for name in dict.fromkeys([*tracked, *(p.name for p in sealed_parts(src))]):
            shown = git("show", f"HEAD:./{name}")
            if not shown.returncode:
                committed += keys(shown.stdout.decode("utf-8"))
            if (src.parent / name).is_file():
                now += keys((src.parent / name).read_text(encoding="utf-8"))
    except (OSError, subprocess.SubprocessError):
        return []
    except (UnicodeDecodeError, csv.Error):
        return []  # problems() names what is wrong with the files themselves
    gone = committed - now
    runs = Counter(k[1] for k in gone.elements())
    return [f"{n} row(s) of run {r} are in the last commit and no longer in the file (the store was cut or replaced; "
            f"`git diff {src.name}` shows them)" for r, n in sorted(runs.items())]


def check(path=None) -> list[str]:
    """Every problem of a results store: problems() and, for a committed store, lost_since_commit(). [] when sound."""
    return problems(path) + lost_since_commit(path)


def require_sound(path=None) -> Path:
    """The store's path when check() finds nothing; StoreError naming every problem's line otherwise (what a command
    runs before it publishes from the store)."""
    src = _resolve(path)
    found = check(src)
    if found:
        raise _store_error(src, found)
    return src


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


def set_commit(folder) -> str | None:
    """The commit of the set a published folder holds (its GPU_TIME_FILE, written by publish_set), else None."""
    if folder is None or not (Path(folder) / GPU_TIME_FILE).is_file():
        return None
    try:
        return str(json.loads((Path(folder) / GPU_TIME_FILE).read_text())["commit"]) or None
    except (ValueError, KeyError, TypeError, OSError):
        return None


def of_set(df, folder, device: str | None):
    """The stored rows a published folder's tables, summary and cards show: where the folder holds a set, of the rows
    of its device (names containing `device`) only the set's commit's, so that no table takes a row from a run
    outside the set; the other devices' rows, and everything when the folder holds no set, as they are."""
    commit = set_commit(folder)
    if not commit or not len(df) or "git_commit" not in df:
        return df
    mine = df["device_name"].astype(str).str.contains(device, case=False, regex=False) if device else True
    return df[~mine | (df["git_commit"].astype(str) == commit)]


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
    """The results table, its sealed parts' rows first (standard columns even when empty); filters keep rows where
    col == value.

    A list/tuple/set filter value keeps rows whose column is any of its values.
    """
    src = _resolve(path)
    files = [f for f in (*sealed_parts(src), src) if f.exists() and f.stat().st_size > 0]
    if not files:
        df = pd.DataFrame({c: pd.Series(dtype=object) for c in COLUMNS})
    else:
        for f in files:
            _checked_rows(f)  # a torn or malformed store is refused with its lines named, never padded
        df = pd.concat([pd.read_csv(f, dtype={c: str for c in STRING_COLUMNS}) for f in files], ignore_index=True,
                       sort=False)
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
    "COLUMNS", "DEFAULT_PATH", "RUN_ID", "StoreError", "append", "check", "default_path", "default_results_path",
    "environment_metadata",
    "git_commit", "library_versions", "make_row", "params_of", "problems", "read", "seal", "sealed_parts",
]  # fmt: skip
