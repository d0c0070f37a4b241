"""How long each notebook takes on a device: every finished `wmbook run` (and every report published from a GPU run)
leaves one line per notebook run in `notebook_times.csv` beside the results file its rows went to; a notebook says at
its start how long it expects to take on the device it runs on (the parameters table's `expected run time`), from the
runs recorded there and in the store's file.

    from wmbook import runtimes
    runtimes.expected("06_cuda_graphs", "wma", "wma", "NVIDIA H200")   # (seconds, runs) or None

A line also holds the parameters the run was given that change its work (`params`: '' at the notebook's defaults) and
how many GPUs it could see (`gpus`, empty where not known): an expectation counts only runs of the same parameters
(by default the defaults', what `wmbook run` and the published set run), and for a notebook that uses every GPU of
its host only runs on as many: notebook 08's batch-1 run on four GPUs is not what its full sweep takes on two.
"""

from __future__ import annotations

import contextlib
import csv
import datetime as _dt
import fcntl
import json
import os
import statistics
from pathlib import Path
from typing import Iterator

TIMES_FILE = "notebook_times.csv"
# the host's CPUs while it ran, and the speed of one of its cores (wmbook.hostload)
HOST_FIELDS = ("host_cores", "host_busy_cores", "host_other_cores", "host_core_loop_us")
FIELDS = ("timestamp", "notebook", "workload", "preset", "profile", "device_name", "git_commit", "run_id", "seconds",
          "params", "gpus", *HOST_FIELDS)
RUN_IDENTITY = ("workload", "preset", "results_path", "output_dir")  # which run it is and where it writes, not its work
PROFILES = ("full", "quick")
LAST_RUNS = 5  # the expectation is the median of at most this many runs: the latest ones at the newest commit
PROFILE_ENV = "WMBOOK_PROFILE"  # set by `wmbook run --profile` for its kernels: the profile a notebook runs under


def times_path(results_path) -> Path:
    """The times file beside a results file."""
    return Path(results_path).with_name(TIMES_FILE)


def params_key(parameters: dict, defaults: dict | None = None) -> str:
    """The parameters a run was given that change its work, as one string ('' for a run at the notebook's defaults):
    sorted `name=value` pairs, leaving out RUN_IDENTITY and the names of `defaults` (a profile's own parameters)
    given with their value there."""
    defaults = defaults or {}
    given = sorted((k, v) for k, v in parameters.items()
                   if k not in RUN_IDENTITY and not (k in defaults and defaults[k] == v))
    return "; ".join(f"{k}={v if isinstance(v, str) else json.dumps(v)}" for k, v in given)


def given_params(notebook, parameters: dict, profile: str = "full") -> str:
    """params_key of a notebook's run (its path) under a profile: a quick run's own short parameters left out."""
    from . import studies  # noqa: PLC0415  heavy: torch

    spec = studies.spec_for(Path(notebook).stem)
    return params_key(parameters, spec.quick if profile == "quick" and spec is not None else {})


def visible_gpus() -> int | None:
    """How many GPUs a process started now would see (CUDA_VISIBLE_DEVICES, else NVML's count); None where not known
    (no NVIDIA driver)."""
    v = os.environ.get("CUDA_VISIBLE_DEVICES")
    if v is not None:
        ids = [x.strip() for x in v.split(",") if x.strip()]
        return len(ids[:ids.index("-1")] if "-1" in ids else ids)  # CUDA stops at the first invalid id
    try:
        import pynvml  # noqa: PLC0415  nvidia-ml-py: a GPU host's; the count without starting CUDA in this process

        pynvml.nvmlInit()
        try:
            return int(pynvml.nvmlDeviceGetCount())
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001  no library or no driver: not known
        return None


def record(results_path, **row) -> Path:
    """Append one finished run's line (FIELDS; `timestamp` filled in when missing) to the times file beside
    `results_path`, under a lock; a run id already there is not added again. A file of fewer columns (an older
    version's) is rewritten with these first, its lines kept. Returns the file."""
    if row.get("profile", "full") not in PROFILES:
        raise ValueError(f"profile={row.get('profile')!r} is not allowed; allowed values: {list(PROFILES)}")
    seconds = float(row["seconds"])
    if not seconds > 0:
        raise ValueError(f"seconds={row['seconds']!r} is not allowed; allowed values: a duration > 0")
    row = {"timestamp": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), "profile": "full"} | row
    row["seconds"] = f"{seconds:.1f}"
    path = times_path(results_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        lines = read(path)
        if row.get("run_id") and any(r.get("run_id") == row["run_id"] for r in lines):
            return path
        new = not path.exists() or path.stat().st_size == 0
        if not new and _header(path) != list(FIELDS):
            _rewrite(path, lines)
        with open(path, "a", newline="") as f:
            w = csv.DictWriter(f, fieldnames=FIELDS, extrasaction="ignore")
            if new:
                w.writeheader()
            w.writerow({k: row.get(k, "") for k in FIELDS})
            f.flush()
            os.fsync(f.fileno())
    return path


def _header(path: Path) -> list[str]:
    with open(path, newline="") as f:
        return next(csv.reader(f), [])


def _rewrite(path: Path, lines: list[dict]) -> None:
    """The file again with FIELDS' columns (atomically: an interrupt leaves the old file)."""
    from .atomic import atomic_open  # noqa: PLC0415

    with atomic_open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS, extrasaction="ignore")
        w.writeheader()
        for r in lines:
            w.writerow({k: f"{r[k]:.1f}" if k == "seconds" else (r.get(k) or "") for k in FIELDS})


def read(path) -> list[dict]:
    """The lines of a times file (none when it is missing; a line that does not parse is skipped)."""
    path = Path(path)
    if not path.is_file():
        return []
    with open(path, newline="") as f:
        out = []
        for r in csv.DictReader(f):
            try:
                r["seconds"] = float(r["seconds"])
            except (TypeError, ValueError):
                continue
            out.append(r)
        return out


def expected(notebook: str, workload: str, preset: str, device_name: str, profile: str = "full",
             files=(), params: str = "", gpus: int | None = None) -> tuple[float, int] | None:
    """(median seconds, runs) over the recorded runs of this notebook, workload, preset, device and profile in `files`
    (times files; default: the store's and the tiny store's) that `latest` keeps, or None when none is recorded.
    `params`: the runs' given parameters (params_key; '' the defaults); `gpus`: only runs that saw as many GPUs (or
    an unknown count), for a notebook that uses all of them; None: any."""
    got = _expectation(notebook, workload, preset, device_name, profile, files, params, gpus)
    return got[:2] if got else None


def expected_with_core(notebook: str, workload: str, preset: str, device_name: str, profile: str = "full",
                       files=(), params: str = "", gpus: int | None = None) -> tuple[float, int, float | None] | None:
    """expected() and the speed of the host core its runs ran on: (median seconds, runs, the median of their
    `host_core_loop_us` (wmbook.hostload.core_loop_us) or None where none recorded it), or None. A launch-bound
    notebook takes about twice as long on a host whose core runs the loop in twice the time."""
    got = _expectation(notebook, workload, preset, device_name, profile, files, params, gpus)
    return (got[0], got[1], got[3]) if got else None


def matches(r: dict, params: str = "", gpus: int | None = None) -> bool:
    """Whether a recorded run counts for an expectation of these parameters and GPU count (expected)."""
    return (r.get("params") or "") == params and (gpus is None or not r.get("gpus") or str(r["gpus"]) == str(gpus))


def _expectation(notebook, workload, preset, device_name, profile, files, params="", gpus=None
                 ) -> tuple[float, int, str, float | None] | None:
    """(median seconds, runs, their commit, the median of their hosts' core loops or None) of the matching runs
    `latest` keeps, or None."""
    from . import paths, results  # noqa: PLC0415  heavy: pandas (wmbook.results)

    files = list(files) or [times_path(results.default_path()), times_path(paths.TINY_RESULTS_PATH)]
    seen, match = set(), []
    for f in dict.fromkeys(Path(p) for p in files):
        for r in read(f):
            key = r.get("run_id") or id(r)
            if key in seen:
                continue
            seen.add(key)
            if (r.get("notebook"), r.get("workload"), r.get("preset"), r.get("device_name"), r.get("profile")) == \
                    (notebook, workload, preset, device_name, profile) and matches(r, params, gpus):
                match.append(r)
    last = latest(match)
    if not last:
        return None
    loops = [v for v in (_number(r.get("host_core_loop_us")) for r in last) if v is not None]
    return (statistics.median(r["seconds"] for r in last), len(last), last[-1].get("git_commit", ""),
            statistics.median(loops) if loops else None)


def _number(v) -> float | None:
    """A positive number from a times file's cell, or None (empty, missing, not a number)."""
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return x if x > 0 else None


def latest(runs: list[dict]) -> list[dict]:
    """What an expectation is the median of: of some recorded runs, those at the commit of the newest one (by
    timestamp), at most the latest LAST_RUNS of them, oldest first. A notebook's code moves its time more than a
    machine's noise does (a compile a row no longer repeats takes minutes off): runs of older code do not count once
    a newer commit has one."""
    runs = sorted(runs, key=lambda r: r.get("timestamp", ""))
    if not runs:
        return []
    newest = runs[-1].get("git_commit", "")
    return [r for r in runs if r.get("git_commit", "") == newest][-LAST_RUNS:]


def describe(notebook: str, workload: str, preset: str, device_name: str, profile: str = "full", files=()) -> str:
    """The expectation in words, for the parameters table: by the runs at the notebook's defaults (a run given other
    parameters takes about that long or, with fewer repeats or rows, less)."""
    got = _expectation(notebook, workload, preset, device_name, profile, files)
    if got is None:
        return f"not known yet: no {profile} run of this notebook at {preset} recorded on {device_name}"
    s, n, commit, loop = got
    when = f"{s / 60:.0f} minutes" if s >= 90 else f"{s:.0f} s"
    at = f" at commit {commit[:7]}" if commit else ""
    core = f"; host core loop {loop:,.0f} us" if loop is not None else ""
    return (f"about {when} on {device_name} ({'the last run' if n == 1 else f'median of the last {n} runs'}{at}"
            f"{core})")


def papermill_seconds(nb) -> float | None:
    """The duration papermill recorded in an executed notebook (nbformat node), or None."""
    d = (nb.get("metadata", {}).get("papermill") or {}).get("duration")
    try:
        return float(d) if d is not None and float(d) > 0 else None
    except (TypeError, ValueError):
        return None


def host_fields(load) -> dict[str, str]:
    """HOST_FIELDS of a HostLoad (wmbook.hostload), or empty strings where it was not measured."""
    if load is None:
        return dict.fromkeys(HOST_FIELDS, "")
    return {"host_cores": str(load.cores), "host_busy_cores": f"{load.busy_cores:.1f}",
            "host_other_cores": f"{load.others_cores:.1f}",
            "host_core_loop_us": "" if load.core_loop_us is None else f"{load.core_loop_us:.0f}"}


def record_run(runs: list[dict], seconds: float, profile: str = "full", params: str = "", host=None) -> bool:
    """A finished notebook run's time (`runs`: the {run_id, results_path} records its results cells left,
    wmbook.render.notebook_runs), in the times file beside the results file its rows went to; a quick run's also
    beside the store its preset's rows go to by default, where the next quick run looks. True when recorded; never
    raises (the expectation is a convenience: the run's own outcome stands). `params`: given_params; the GPUs it
    saw: this process's (visible_gpus: the runner's environment is its kernels'). `host`: the HostLoad measured over
    the run, or None."""
    from .render import run_rows  # noqa: PLC0415  heavy: nbconvert

    gpus = visible_gpus()
    for rec in runs:
        try:
            df = run_rows(rec)
            if df is None or not len(df):
                continue
            r = df.iloc[0]
            row = {k: str(r[k]) for k in ("notebook", "workload", "preset", "device_name", "git_commit", "run_id")}
            dests = [rec.get("results_path")]
            if profile == "quick":
                from . import presets, results  # noqa: PLC0415  heavy: torch, pandas

                with contextlib.suppress(Exception):  # a preset not in the registry: its own file only
                    dests.append(results.default_results_path(presets.get_preset(row["preset"]).tiny))
            for d in dict.fromkeys(x for x in dests if x):
                record(d, **row, profile=profile, seconds=seconds, params=params, gpus="" if gpus is None else gpus,
                       **host_fields(host))
            return True
        except Exception:  # noqa: BLE001
            continue
    return False


@contextlib.contextmanager
def profile_env(profile: str) -> Iterator[None]:
    """The profile the kernels of a run are started under (a notebook's expected time is that of its profile)."""
    old = os.environ.get(PROFILE_ENV)
    os.environ[PROFILE_ENV] = profile
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(PROFILE_ENV, None)
        else:
            os.environ[PROFILE_ENV] = old


def compile_cache_env(folder) -> dict[str, str]:
    """The environment that keeps inductor's caches (FX graphs, AOTAutograd, autotuning) and Triton's kernels in
    `folder`, for the kernels a run starts: a later run of the same models compiles from them."""
    folder = Path(folder)
    return {"TORCHINDUCTOR_CACHE_DIR": str(folder / "inductor"), "TRITON_CACHE_DIR": str(folder / "triton")}
