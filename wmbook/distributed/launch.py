"""Start a job with torchrun and wait for it: progress while it runs, every rank's result or a named failure.

    from wmbook.distributed import JobSpec, run_job
    res = run_job(JobSpec("mg2", "tiny", "stage-split", nproc=2), "reports/x/08_jobs")
    res.ranks[1]["fps"]

torchrun (`python -m torch.distributed.run --standalone`) starts one process per rank (wmbook.distributed.worker);
`--max-restarts 0`: a rank that raises or dies ends the job, torchrun stops the other ranks, and this launcher
names each failed rank with its error (its own error file, else how torchrun saw it end and the tail of its log).
A job never waits forever: every wait between ranks is bounded by the job's timeout (the process group's), and the
whole job by `timeout_s` here (then its process group is killed).
"""

from __future__ import annotations

import datetime as _dt
import json
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tqdm.auto import tqdm

from ..atomic import atomic_write_text
from ..process_group import package_env, stop_group
from .job import NO_MULTICAST_ENV, JobError, JobFailed, JobSpec, check_job


@dataclass
class JobResult:
    spec: JobSpec
    job_dir: Path
    ranks: list[dict]  # rank r's result JSON at index r
    wall_s: float


def _read(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _log_tail(job_dir: Path, rank: int, lines: int = 12) -> str:
    logs = sorted((job_dir / "logs").glob(f"**/attempt_*/{rank}/stderr.log"))
    if not logs:
        return ""
    text = logs[-1].read_text(errors="replace").strip().splitlines()
    return "\n".join(text[-lines:])


def _new_job_dir(parent: Path, spec: JobSpec) -> Path:
    """A folder of this job's own under `parent` (earlier jobs' files are never touched)."""
    if parent.exists() and not parent.is_dir():
        raise JobError(f"job folder {str(parent)!r} is a file; allowed values: a folder (created if missing)")
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%S%fZ")
    d = parent / f"{spec.layout}-{spec.workload}-{spec.nproc}-{stamp}"
    try:
        d.mkdir(parents=True)
    except OSError as e:
        raise JobError(f"job folder {str(parent)!r} cannot be written: {e.strerror}") from None
    return d


def _stop(proc: subprocess.Popen) -> None:
    """End torchrun and every rank it started (their own process group), politely first."""
    stop_group(proc, term_wait_s=15, kill_wait_s=5)


def run_job(spec: JobSpec, parent, *, progress: bool = True, timeout_s: float | None = None,
            python: str = sys.executable) -> JobResult:
    """Check the job, run it in a new folder under `parent` and return every rank's result; JobFailed names the
    ranks that did not finish (their results so far, if any, in `.partial`)."""
    check_job(spec)
    if timeout_s is not None and not (isinstance(timeout_s, (int, float)) and 0 < timeout_s < float("inf")):
        raise JobError(f"timeout_s={timeout_s!r} is not allowed; allowed values: a finite number of seconds > 0")
    job_dir = _new_job_dir(Path(parent), spec)
    atomic_write_text(job_dir / "job.json", spec.to_json())
    env = package_env(**NO_MULTICAST_ENV)
    cmd = [python, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={spec.nproc}",
           "--max-restarts=0", "--monitor-interval=0.5", f"--log-dir={job_dir / 'logs'}", "--redirects=3",
           "-m", "wmbook.distributed.worker", str(job_dir)]
    t0 = time.monotonic()
    with open(job_dir / "torchrun.log", "wb") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        bar = tqdm(total=spec.nproc, desc=f"{spec.layout} x{spec.nproc}", disable=not progress, leave=False)
        last = ""
        try:
            while proc.poll() is None:
                if timeout_s is not None and time.monotonic() - t0 > timeout_s:
                    _stop(proc)
                    raise JobFailed(f"job {job_dir.name} ran past timeout_s={timeout_s} s and was stopped",
                                    {}, _results(job_dir, spec.nproc))
                states = [_read(job_dir / f"progress-rank{r}.json") for r in range(spec.nproc)]
                shown = " | ".join(f"{s['rank']}: {s['stage']} {s['done']}/{s['total']}" for s in states if s)
                if shown != last:  # a new line only when a rank moved on
                    last = shown
                    bar.n = sum(1 for s in states if s and s["stage"] == "done")
                    bar.set_postfix_str(shown, refresh=False)
                    bar.refresh()
                time.sleep(0.5)
        except BaseException:
            _stop(proc)
            raise
        finally:
            bar.close()
    wall = time.monotonic() - t0
    results = _results(job_dir, spec.nproc)
    if proc.returncode == 0 and len(results) == spec.nproc:
        return JobResult(spec, job_dir, [results[r] for r in range(spec.nproc)], wall)
    root, codes = _torchrun_failures(job_dir / "torchrun.log")
    failures = {}
    for r in range(spec.nproc):
        err = _read(job_dir / f"error-rank{r}.json")
        if err is not None:
            failures[r] = err["error"]
        elif r not in results:
            code = codes.get(r)
            how = (f"killed by signal {-code}" if code is not None and code < 0 else
                   f"exited with code {code}" if code is not None else "stopped by torchrun after another rank failed")
            tail = _log_tail(job_dir, r)
            failures[r] = f"{how}, without a result or an error of its own" + (
                f"; its log ends:\n{tail}" if tail else "")
    if not failures:  # every rank finished, torchrun still failed: its own log says why
        tail = (job_dir / "torchrun.log").read_text(errors="replace").strip().splitlines()[-12:]
        raise JobFailed(f"job {job_dir.name}: torchrun exit code {proc.returncode} after every rank finished:\n"
                        + "\n".join(tail), {}, results)
    first = root if root in failures else min(failures)  # the first to fail; the others followed it
    raise JobFailed(f"job {job_dir.name} failed: rank {first}: {failures[first]}"
                    + "".join(f"\n  then rank {r}: {m.splitlines()[0]}" for r, m in failures.items() if r != first),
                    failures, results)


_FAILURE = re.compile(r"rank\s*:\s*(\d+) \(local_rank.*?\n\s*exitcode\s*:\s*(-?\d+)")


def _torchrun_failures(log: Path) -> tuple[int | None, dict[int, int]]:
    """From torchrun's failure summary: the rank it saw fail first (its "Root Cause") and each failed rank's exit
    code (negative: the signal that ended it)."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return None, {}
    codes = {int(r): int(c) for r, c in _FAILURE.findall(text)}
    _, _, root_part = text.partition("Root Cause")
    root = _FAILURE.search(root_part)
    return (int(root.group(1)) if root else None), codes


def _results(job_dir: Path, nproc: int) -> dict[int, dict]:
    out = {}
    for r in range(nproc):
        res = _read(job_dir / f"rank{r}.json")
        if res is not None:
            out[r] = res
    return out
