"""The published set from one command: every notebook for every workload it runs for (and the runs its study adds:
notebook 03's trained presets), at one commit, spread over the host's GPUs, resumed where a cut run stopped, and
published only when it is complete.

    python -m wmbook regenerate --out sets/h200                       # run (or resume) the set
    python -m wmbook regenerate --out sets/h200 --publish data/reports/h200   # ... then publish it when complete
    python -m wmbook regenerate --out sets/h200 --plan                # what would run where and when, nothing run
    python -m wmbook regenerate --out sets/h200 --device-name H200 --time-limit 25 --expect 06_cuda_graphs-wma=18
                                                                      # a limited slice; one run's expected minutes
                                                                      # given (its code changed since its last time)
    python -m wmbook regenerate --out sets/h200 --merge part2/sets/h200 --publish data/reports/h200
                                                                      # parts made on several machines joined

Queues: one per GPU (CUDA_VISIBLE_DEVICES), each on its own share of the host's cores (a queue's compile workers do not
slow another queue's launch-bound timings); the runs are dealt longest first by the time each took in the set the folder
held before (else in the published folder's `gpu_time.json`). A notebook whose study asks for every GPU (notebook 08)
runs alone after the queues. Each run is `wmbook run` into `<out>/runs/<name>/`, its rows into
`<out>/results/<name>.csv` and its log into `<out>/logs/<name>.log`; every row records the commit the set started at.
`<out>/set.json` holds the plan and each run's status and seconds, rewritten after every run: a set that is cut (Ctrl-C,
a lost machine) resumes where it stopped, re-running only what did not finish (its plan is fixed: --notebooks,
--workloads and -p that plan other runs are refused); a tree at another commit may join and publish a set (that runs
nothing) but not finish it (start over with --fresh); a run planned as one the host could not make (notebook 08 on too
few GPUs) is checked again when the set resumes on a host of the same device, and an all-GPU run is made on no fewer
GPUs than the host that started the set had (a set started on two and resumed on one leaves notebook 08 for a host of
two or more). `--time-limit MINUTES` fits a set into a time-limited allocation (a batch job's wall time): no run starts
that is expected to end after the limit (by the time it took before on this device, wmbook.runtimes, longer where that
time was recorded on a faster host core than this host's, and never less than it ran before a limit cut it), a run still
going at the limit is stopped as Ctrl-C stops it (it counts if its report was complete by then), and the same command
finishes the set later, on this machine or another of the same device: what a resume reads is `set.json` (the runs still
to make), so an allocation on a fresh machine needs only that file in `<out>`, and `--merge` joins the parts (their run
folders, rows, logs and times) where the set is published. The runs share one compile cache, `<out>/cache/` (inductor's
FX-graph, AOTAutograd and autotuning caches, Triton's kernels): a model several notebooks compile is compiled once
(compile-time tables measure with empty caches of their own).

Publishing refuses a set that is not complete or not from one clean commit, naming what is missing, and a set of another
device than its folder's (data/reports/h200 holds H200 runs only), and writes nothing then. A host may give another card
than the one asked for: `--device-name NAME`, and a --publish folder of one device, each refuse a set whose runs would
be of another device before any run (or any move of an earlier set). Otherwise: the rows go into the results store, each
run's report into the folder (wmbook.published.publish_report), the folder's `gpu_time.json` (seconds per run and in
all: the index shows it; written only for the whole set's plan, so that a set of some notebooks never stands as the
set's GPU time), its index, the README's table and the folder's page, and one dated entry in data/reports/NOTES.md.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict
from pathlib import Path

from . import set_schedule
from .distributed.job import NO_MULTICAST_ENV
from .errors import InputError, command
from .hostload import core_loop_median
from .paths import REPO_ROOT, git_commit
from .published_set import (
    CANNOT,
    GOAL_MINUTES,
    GPU_TIME_FILE,
    MIN_ALL_GPUS,
    NOTES,
    SET_FILE,
    Job,
    SetState,
    gpu_time,
    merge_set,
    publish_set,
)
from .set_options import check_device, check_expected, check_same_plan, expectations, wanted_devices
from .set_schedule import (
    DEFAULT_MINUTES,
    START_MARGIN,
    deal,
    earlier_minutes,
    expected_minutes,
    print_plan,
    recorded_minutes,
    say_paces,
    simulate,
    starts_in_time,
    starts_without_margin,
)

# the set's record and publishing live in wmbook.published_set, its dealing and time limits in wmbook.set_schedule,
# the checks of its options in wmbook.set_options; these names are this command's too
__all__ = ["CANNOT", "DEFAULT_MINUTES", "GOAL_MINUTES", "GPU_TIME_FILE", "MIN_ALL_GPUS", "NOTES", "SET_FILE",
           "START_MARGIN", "STOP_GRACE_S", "Job", "SetState", "deal", "expected_minutes", "gpu_time", "main",
           "merge_set", "plan", "publish_set", "recheck_cannot", "run_set", "simulate"]

STOP_GRACE_S = 60.0  # a run stopped at its time limit gets this long to end its kernels before it is killed


def plan(notebooks=None, workloads=None, params=None) -> list[Job]:
    """The set's runs (checked as `wmbook run` checks them, before anything runs): each notebook once per workload it
    runs for, then the runs its study adds (NotebookSpec.set_runs; left out when `params` gives a preset, or their
    workload is not among `workloads`)."""
    from . import studies  # noqa: PLC0415  heavy: torch, the studies
    from . import workloads as wls  # noqa: PLC0415  heavy: torch
    from .params import ParameterError  # noqa: PLC0415  heavy: torch
    from .run import resolve_notebooks  # noqa: PLC0415  heavy: papermill's runner
    from .runconfig import notebook_parameters  # noqa: PLC0415  heavy: torch, workloads

    params = dict(params or {})
    names = list(workloads) if workloads is not None else wls.names()
    jobs: list[Job] = []
    for path in resolve_notebooks(notebooks):
        spec = studies.spec_for(path.stem)
        gpus = spec.gpus if spec is not None else "one"
        src = str(path.relative_to(REPO_ROOT)) if path.is_relative_to(REPO_ROOT) else str(path)
        if gpus == "all":  # a run this host cannot make (too few GPUs) is planned as such: the set stays incomplete
            for w in (n for n in names if spec.supports(wls.get(n))):
                try:
                    for _, _, prm in notebook_parameters([path], params, [w]):
                        jobs.append(Job(f"{path.stem}-{w}", path.stem, src, prm, gpus))
                except ParameterError as e:
                    jobs.append(Job(f"{path.stem}-{w}", path.stem, src, params | {"workload": w}, gpus,
                                    status=CANNOT, error=str(e)))
            continue
        for _, w, prm in notebook_parameters([path], params, names):
            jobs.append(Job(f"{path.stem}-{w or 'default'}", path.stem, src, prm, gpus))
        for extra in (spec.set_runs if spec is not None and "preset" not in params else ()):
            if extra.get("workload") not in names:
                continue
            for _, _, prm in notebook_parameters([path], params | extra):
                jobs.append(Job(f"{path.stem}-{extra['preset']}", path.stem, src, prm, gpus))
    for j in jobs:  # a run starts once the runs of the notebooks it builds on, at the same workload, have ended
        spec = studies.spec_for(j.notebook)
        if spec is not None and spec.builds_on and j.gpus != "all":
            j.after = [o.name for o in jobs if o.notebook in spec.builds_on and o.gpus != "all"
                       and o.params.get("workload") == j.params.get("workload")
                       and o.params.get("preset", "auto") == j.params.get("preset", "auto")]
    seen = set()
    for j in jobs:
        if j.name in seen:
            raise InputError(f"the set names two runs {j.name!r}: each run needs a name of its own")
        seen.add(j.name)
    return jobs


def recheck_cannot(jobs: list[Job]) -> list[Job]:
    """The runs planned as ones the host could not make (notebook 08 on too few GPUs), checked again as plan() checks
    them, on this host: those it can make become pending (a set started on a host of two GPUs is finished on one of
    four); the others keep the reason this host gives. Returns the runs that became pending."""
    from .params import ParameterError  # noqa: PLC0415  heavy: torch
    from .run import resolve_notebooks  # noqa: PLC0415  heavy: papermill's runner
    from .runconfig import notebook_parameters  # noqa: PLC0415  heavy: torch, workloads

    now = []
    for j in (j for j in jobs if j.status == CANNOT):
        src = Path(j.source)
        path = resolve_notebooks([src if src.is_absolute() else REPO_ROOT / src])[0]
        given = {k: v for k, v in j.params.items() if k != "workload"}
        try:
            runs = notebook_parameters([path], given, [j.params["workload"]])
        except ParameterError as e:
            j.error = str(e)
            continue
        j.params, j.status, j.error = runs[0][2], "pending", ""
        now.append(j)
    return now


def _device() -> tuple[str, int]:
    """The host's accelerator (name) and how many of it."""
    import torch  # noqa: PLC0415  heavy: torch

    if torch.cuda.is_available() and torch.cuda.device_count():
        return torch.cuda.get_device_name(0), torch.cuda.device_count()
    return "CPU", 0


def _run_job(job: Job, out: Path, gpu: int | None, cpus: set[int] | None, commit: str, timeout_s: float,
             stopped_by: str | None = None) -> None:
    """`wmbook run` for one job (its own report folder, rows file and log); sets its status and seconds.
    `stopped_by`: what `timeout_s` is, for the error of a run stopped there (default: the run's own timeout)."""
    store, log = out / "results" / f"{job.name}.csv", out / "logs" / f"{job.name}.log"
    for f in (store, log):
        f.parent.mkdir(parents=True, exist_ok=True)
    if store.exists():  # a cut run's rows never join the set: kept beside it, not published
        store.rename(store.with_name(f"{job.name}.cut-{int(time.time())}.csv"))
    cmd = _command(job, out / "runs" / job.name, store)
    env = os.environ | NO_MULTICAST_ENV | {"WMBOOK_GIT_COMMIT": commit, "PYTHONUNBUFFERED": "1"}
    # one compile cache for the whole set: a model that several runs compile (notebook 04's stack in 05 and 06, say)
    # is compiled once; compile-time tables measure with empty caches of their own. Always the set's own (inductor
    # writes its default folder into the environment of a process that used it)
    from .runtimes import compile_cache_env  # noqa: PLC0415

    env.update(compile_cache_env(out / "cache"))
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = str(gpu)

    def pin():  # the queue's cores only: torch and inductor size their threads from them
        if cpus:
            os.sched_setaffinity(0, cpus)

    t0, since = time.monotonic(), _dt.datetime.now(_dt.timezone.utc)
    with log.open("w") as f:
        proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env=env, stdout=f, stderr=subprocess.STDOUT,
                                preexec_fn=pin if cpus and hasattr(os, "sched_setaffinity") else None)
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            rc = None
            # as Ctrl-C: the runner ends the kernels it started (their own sessions: a plain kill would leave them
            # holding the GPU the next run gets), then it goes
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        except BaseException:  # Ctrl-C (the run got it too) or an error here: never leave the run behind
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=STOP_GRACE_S)
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            raise
    job.seconds = time.monotonic() - t0
    # a run whose report was complete before the stop ended its work in time; only its interpreter's exit was cut
    if rc == 0 or (rc is None and _report_complete(out / "runs" / job.name, since)):
        job.status, job.error = "ok", ""
        return
    job.status = "failed"
    if rc is None:  # stopped at its limit: it needs longer than this
        job.cut_after_s = max(job.cut_after_s, job.seconds)
    tail = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    stopped = f"{stopped_by} after {job.seconds / 60:.1f} min" if stopped_by else f"timed out after {timeout_s:.0f} s"
    job.error = (stopped if rc is None else f"exit {rc}") + (
        f": {tail[-1][:300]}" if tail else "")


def _command(job: Job, folder: Path, store: Path) -> list[str]:
    """The `wmbook run` command of a job: its report folder, its rows file, its parameters."""
    cmd = [sys.executable, "-m", "wmbook", "run", job.source, "--out", str(folder), "-q",
           "-p", "results_path", str(store)]
    for k, v in job.params.items():
        cmd += ["-p", k, json.dumps(v) if not isinstance(v, str) else v]
    return cmd


def _host_load_said(folder: Path) -> str:
    """The host's CPU use while a run's notebook ran (wmbook.hostload), as words; '' when not recorded."""
    from .hostload import of_report  # noqa: PLC0415

    load = of_report(folder)
    return load.describe() if load is not None else ""


def _report_complete(folder: Path, since: _dt.datetime) -> bool:
    """Whether a run started at `since` or later finished with every notebook ok, by its report folder's summary
    (`wmbook run` writes `finished` there once every report is rendered, the last thing it does before it exits; a
    summary older than `since` is an earlier attempt's)."""
    try:
        d = json.loads((folder / "summary.json").read_text())
        meta, nbs = d["meta"], d["notebooks"]
        started = _dt.datetime.fromisoformat(meta["started"])
        return (started >= since.replace(microsecond=0) and bool(meta.get("finished")) and bool(nbs)
                and all(n.get("status") == "ok" for n in nbs))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def run_set(state: SetState, gpus: int, timeout_s: float, echo=print, deadline: float | None = None,
            minutes: dict[str, float] | None = None) -> SetState:
    """Every run of the set that is not done yet: the queues in parallel, then the all-GPU runs alone.

    Each queue takes the longest run still to do (expected_minutes) whose notebook builds on none that
    is still to do or running for the same workload (Job.after: then the stacks it compiles again are in the set's
    compile cache; at wma a cold whole-UNet compile takes minutes, a cache hit about half a minute).
    deadline (time.monotonic()): no run starts that is expected to end after it, and a run still going then is cut
    there (failed, to be run again on resume): a set fits a time-limited allocation (a batch job's wall time) and is
    finished by later ones."""
    minutes = minutes or {}
    part = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    todo = [j for j in state.jobs if j.status not in ("ok", CANNOT)]
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    share = max(1, len(cores) // max(1, state.queues)) if cores else 0
    done = [len(state.jobs) - len(todo)]
    stop = threading.Event()  # Ctrl-C: no queue starts another run (the running ones got the interrupt too)
    pending = sorted((j for j in todo if j.gpus != "all"), key=lambda j: -expected_minutes(j, minutes))
    running: set[str] = set()
    cv = threading.Condition()

    whole = deadline - time.monotonic() if deadline is not None else None
    started: set[int | None] = set()  # the queues that started a run in this slice (None: any did)

    def limit_for(j: Job, tag: str, q: int | None) -> float | None:
        """The run's time limit, or None when it is not expected to end before the deadline (said so)."""
        if deadline is None:
            return timeout_s
        left, need = deadline - time.monotonic(), expected_minutes(j, minutes) * 60
        fresh = whole if not (q in started if q is not None else started) else None
        margin = f"{set_schedule.START_MARGIN[0] - 1:.0%} and {set_schedule.START_MARGIN[1]:.0f} s to spare"
        if not starts_in_time(need, left, fresh):
            was = f"; cut after {j.cut_after_s / 60:.0f} min before" if j.cut_after_s else ""
            echo(f"[{tag}] {j.name}: not started (expected {need / 60:.0f} min{was}, {max(0.0, left) / 60:.0f} min "
                 f"left before the time limit; a run starts with {margin}" + (", or, where no slice this long "
                 f"would, first on its queue with {set_schedule.START_MARGIN[1]:.0f} s" if fresh else "") + ")")
            return None
        if starts_without_margin(need, left, fresh):  # (only where the margin rule would not start it)
            echo(f"[{tag}] {j.name}: starts without the margin (expected {need / 60:.0f} min, {left / 60:.0f} min "
                 f"left): no slice of {fresh / 60:.0f} min would start it with {margin}; a queue that has run "
                 f"nothing yet is its one chance")
        started.update((q, None))
        return min(timeout_s, left)

    def take(q: int) -> tuple[Job, float] | None:
        with cv:
            while pending and not stop.is_set():
                held = running | {x.name for x in pending}
                for j in pending:
                    if not set(j.after) & held:
                        pending.remove(j)
                        limit = limit_for(j, f"q{q}", q)
                        if limit is None:
                            cv.notify_all()  # what waited for it need not any more
                            break
                        running.add(j.name)
                        return j, limit
                else:
                    cv.wait(timeout=1.0)
            return None

    def run(j: Job, q: int | None, cpus, limit: float) -> None:
        tag = "all" if q is None else f"q{q}"
        j.status, j.queue, j.part = "running", q, part
        state.save()
        echo(f"[{tag}] {j.name}: started")
        if q is None:  # an all-GPU run holds every GPU of the host for its whole time
            j.gpu_count = max(1, gpus)
        try:
            _run_job(j, state.out, q if (gpus and q is not None) else None, cpus, state.commit, limit,
                     stopped_by="cut at the set's time limit" if limit < timeout_s else None)
        except Exception as e:  # noqa: BLE001  a run this process could not start or watch: failed, never "running"
            j.status, j.error = "failed", f"{type(e).__name__}: {e}"
        state.save()
        done[0] += 1
        host = _host_load_said(state.out / "runs" / j.name) if j.status == "ok" else ""  # (else maybe an earlier try's)
        echo(f"[{tag}] {j.name}: {j.status} ({j.seconds / 60:.1f} min{'; ' + host if host else ''})"
             + (f" {j.error}" if j.error else "") + f"  [{done[0]}/{len(state.jobs)}]")

    def work(q: int) -> None:
        cpus = set(cores[q * share:(q + 1) * share]) if cores and state.queues > 1 else None
        while (got := take(q)) is not None:
            try:
                run(got[0], q, cpus, got[1])
            finally:
                with cv:
                    running.discard(got[0].name)
                    cv.notify_all()

    threads = [threading.Thread(target=work, args=(q,), daemon=True) for q in range(state.queues)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            while t.is_alive():
                t.join(timeout=0.5)
        for j in (j for j in todo if j.gpus == "all"):
            if stop.is_set():
                break
            if not state.makes_all_gpu_runs(gpus):  # its study would be of fewer GPUs
                echo(f"[all] {j.name}: not started (it holds every GPU of its host to study several; this host has "
                     f"{gpus}: it runs on a host of {state.all_gpu_runs_need()} or more)")
                continue
            limit = limit_for(j, "all", None)
            if limit is not None:
                run(j, None, None, limit)
    except KeyboardInterrupt:
        stop.set()
        with cv:
            cv.notify_all()
        for t in threads:  # each ends when its running notebook has (it was interrupted as well)
            t.join(timeout=60)
        raise
    return state


def _plan_resumed(state: SetState, commit: str, device: str, count: int, queues: int, time_limit: float | None,
                  minutes: dict[str, float]) -> int:
    """--plan on a folder that holds a set: the runs still to make on this host, dealt to its queues as a resume
    would deal them, with their expected minutes; nothing is run and set.json is not written. What would keep this
    tree or host from finishing it (another commit, another device, too few GPUs for its all-GPU runs) is said."""
    todo = state.missing()
    print(f"the set of {state.started} at commit {state.commit[:7]} on {state.device}: "
          f"{len(state.jobs) - len(todo)} of {len(state.jobs)} runs done")
    if state.commit != commit:
        print(f"  this tree is at {commit[:7]}: the set is finished from a tree at {state.commit[:7]}")
    if state.device != device:
        print(f"  this host has {device}: the set is finished on a host of {state.device}")
    all_gpu = _say_all_gpu_wait(state, count, todo)
    load = deal(todo, queues, minutes)
    print(f"{len(todo)} runs to make on {queues} queue(s); expected minutes per queue: "
          + (", ".join(f"{m:.0f}" for m in load) or "none"))
    print_plan(todo, queues, minutes, time_limit, all_gpu)
    return 0


def _say_all_gpu_wait(state: SetState, count: int, todo: list[Job]) -> bool:
    """Whether a host of `count` GPUs makes the set's all-GPU runs; where it does not and `todo` holds one, says so."""
    all_gpu = state.makes_all_gpu_runs(count)
    if not all_gpu and any(j.gpus == "all" for j in todo):
        print(f"  this host has {count} GPUs: the all-GPU runs wait for a host of {state.all_gpu_runs_need()} or more")
    return all_gpu


def _merge_main(ap, a, out: Path, commit: str, wanted: list[tuple[str, str]] | None = None) -> int:
    """--merge: the parts of a set made on several machines joined into `out` (started from the first part's plan
    when `out` holds no set yet), then published with --publish once complete; nothing is run."""
    if a.fresh or a.plan:
        ap.error("--merge joins parts of a set that ran; it takes neither --fresh nor --plan")
    if (out / SET_FILE).exists():
        state = SetState.load(out)
    else:
        first = a.merge[0]
        if not (first / SET_FILE).is_file():
            ap.error(f"--merge {first}: no {SET_FILE} there (the --out folder of a part of the set)")
        base = SetState.load(first)
        jobs = [Job(**(asdict(j) | {"status": CANNOT if j.status == CANNOT else "pending", "seconds": 0.0,
                                    "queue": None, "part": "", "cut_after_s": 0.0,
                                    "error": j.error if j.status == CANNOT else ""})) for j in base.jobs]
        state = SetState(out, base.commit, base.device, base.queues, jobs, base.host_gpus)
        state.started = base.started
    check_device(ap, wanted or [], state.device, "the set ran on", "a set")
    _say_publisher(state, commit)
    for folder in a.merge:
        merge_set(state, folder)
    if a.publish is not None:
        publish_set(state, a.publish, tree=commit, whole=plan())
    return 0 if not state.missing() else 1


def _say_publisher(state: SetState, commit: str) -> None:
    """Joining and publishing make no run, so a later tree may do them (a fix to the publishing reaches a set already
    made); the rows and reports stay the set's commit's, and the set's NOTES entry names both."""
    if state.commit != commit:
        print(f"the set's runs are of commit {state.commit}; joined and published by this tree, at {commit}")


@command("wmbook regenerate")
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="wmbook regenerate", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="the set's folder (resumed when it holds one)")
    ap.add_argument("--notebooks", default=None, help="comma-separated notebooks (default: every one)")
    ap.add_argument("--workloads", default=None, help="comma-separated workloads (default: every one)")
    ap.add_argument("-p", nargs=2, action="append", default=[], metavar=("NAME", "VALUE"),
                    help="a parameter for every run that declares it")
    ap.add_argument("--gpus", type=int, default=None, help="queues, one per GPU (default: every GPU; 1 on a CPU)")
    ap.add_argument("--timeout", type=float, default=3600.0, help="seconds one run may take (default 3600)")
    ap.add_argument("--time-limit", type=float, default=None, metavar="MINUTES",
                    help="stop within this many minutes (a batch job's wall time): no run starts that is expected to "
                         f"end after it (with {START_MARGIN[0] - 1:.0%}% and {START_MARGIN[1]:.0f} s to spare, but a "
                         "run too long for that in any slice this long starts on a queue that has run nothing yet), "
                         "a run still going then is cut; the same command resumes the set later")
    ap.add_argument("--fresh", action="store_true", help="start over: the folder's earlier set is moved aside")
    ap.add_argument("--plan", action="store_true",
                    help="print what would run on which queue and when, by the runs' expected times (a folder that "
                         "holds a set: the runs still to make; with --time-limit: which would start within it); "
                         "run and write nothing")
    ap.add_argument("--publish", type=Path, default=None, metavar="FOLDER",
                    help="when the set is complete: publish it into FOLDER (e.g. data/reports/h200)")
    ap.add_argument("--merge", type=Path, action="append", default=[], metavar="FOLDER",
                    help="join the runs another machine made of this set (its --out folder) into --out, then publish "
                         "with --publish when the set is complete; nothing is run (repeatable)")
    ap.add_argument("--expect", action="append", default=[], metavar="RUN=MINUTES",
                    help="a run's expected minutes, in place of its recorded time (e.g. 06_cuda_graphs-wma=18 where "
                         "the notebook's code changed since that time was taken); dealing and --time-limit go by it "
                         "(repeatable)")
    ap.add_argument("--allow-dirty", action="store_true",
                    help="run from a tree with uncommitted changes (such a set is never published)")
    ap.add_argument("--device-name", default=None, metavar="NAME",
                    help="run only on a host whose GPU's name has the word NAME (e.g. H200), refused before any run "
                         "elsewhere; a --publish folder of one device (data/reports/h200: H200) asks for its device "
                         "too")
    a = ap.parse_args(argv)
    if a.device_name is not None and not a.device_name.strip():
        ap.error(f"--device-name={a.device_name!r} is not allowed; allowed values: part of a GPU's name, e.g. H200")
    import yaml  # noqa: PLC0415  heavy: yaml

    try:  # a value as `wmbook run -p` reads it (YAML: 2 is a number, a,b a string)
        params = {k: yaml.safe_load(v) for k, v in a.p}
    except yaml.YAMLError as e:
        ap.error(f"-p: a value is not YAML: {e}")
    if not (a.timeout > 0 and math.isfinite(a.timeout)):
        ap.error(f"--timeout={a.timeout!r} is not allowed; allowed values: seconds > 0")
    if a.time_limit is not None and not (a.time_limit > 0 and math.isfinite(a.time_limit)):
        ap.error(f"--time-limit={a.time_limit!r} is not allowed; allowed values: minutes > 0")
    expect = expectations(ap, a.expect)
    started = time.monotonic()
    device, count = _device()
    queues = a.gpus if a.gpus is not None else max(1, count)
    if queues < 1 or (count and queues > count):
        ap.error(f"--gpus={queues} is not allowed; allowed values: 1..{max(1, count)} (this host has {count} GPUs)")
    commit = git_commit()
    if commit.endswith("+dirty") and not a.allow_dirty:
        ap.error("the tree has uncommitted changes: a set records the commit its rows come from; commit them first "
                 "(or --allow-dirty for a set that will not be published)")
    out = a.out
    wanted = wanted_devices(a)
    if a.merge:
        return _merge_main(ap, a, out, commit, wanted)
    if not a.plan and (a.fresh or not (out / SET_FILE).exists()):  # a new set runs here: before the old one is moved
        check_device(ap, wanted, device, "this host has")
    if a.fresh and (out / SET_FILE).exists():
        aside = out.with_name(f"{out.name}.superseded-{int(time.time())}")
        shutil.move(str(out), str(aside))
        print(f"the earlier set moved to {aside}")
    core_now, paces = core_loop_median(), {}

    def expected_here(jobs: list[Job], on: str) -> dict[str, float]:
        """Each run's expected minutes on this host (recorded, else the set's earlier times, else --expect's), and
        this host's core with the runs whose times it lengthens, said."""
        got = (recorded_minutes(jobs, on, count, core_now, paces)
               | earlier_minutes(out, a.publish, core_now, paces) | expect)
        say_paces(core_now, {n: p for n, p in paces.items() if n not in expect})
        return got

    def planned() -> list[Job]:
        return plan(a.notebooks.split(",") if a.notebooks else None,
                    [w.strip() for w in a.workloads.split(",")] if a.workloads else None, params)

    held = SetState.load(out) if (out / SET_FILE).exists() else None
    if held is not None and (a.notebooks or a.workloads or params):  # resumed: the runs asked for must be the set's
        check_same_plan(ap, planned(), held.jobs, out)
    if held is not None and a.plan:
        check_expected(ap, expect, held.jobs)
        return _plan_resumed(held, commit, device, count, queues, a.time_limit, expected_here(held.jobs, held.device))
    if held is not None:
        state = held
        check_expected(ap, expect, state.jobs)
        if state.commit != commit and [j for j in state.missing() if j.status != CANNOT]:
            ap.error(f"{out} holds a set started at commit {state.commit}; this tree is at {commit}: a set comes from "
                     "one commit, so finish it from a tree at that commit (--fresh starts it over)")
        _say_publisher(state, commit)
        # a run the set's first host could not make (too few GPUs): maybe this one can, at the set's commit only
        if state.device == device and state.commit == commit:
            for j in recheck_cannot(state.jobs):
                print(f"{j.name}: this host can make it (planned as one the set's first host could not)")
        check_device(ap, wanted, state.device, f"{out} holds a set that ran on", "a set")
        if [j for j in state.missing() if j.status != CANNOT] and state.device != device:
            ap.error(f"{out} holds a set that ran on {state.device}; this host has {device}: a set comes from one "
                     f"device, so finish it on a host of {state.device} (or start it over here with --fresh)")
        if state.missing():  # this host's queues: each takes whichever run is ready (run_set); a complete set keeps
            state.queues = queues  # the count its runs were made on (its wall clock in gpu_time), wherever published
        minutes = expected_here(state.jobs, state.device)
        print(f"resuming the set of {state.started}: {len(state.jobs) - len(state.missing())} of {len(state.jobs)} "
              "runs done")
    else:
        jobs = planned()
        check_expected(ap, expect, jobs)
        minutes = expected_here(jobs, device)
        load = deal(jobs, queues, minutes)
        out.mkdir(parents=True, exist_ok=True)
        state = SetState(out, commit, device, queues, jobs, count)
        print(f"{len(jobs)} runs on {queues} queue(s) ({device}); expected minutes per queue: "
              + ", ".join(f"{m:.0f}" if math.isfinite(m) else "?" for m in load))
        if a.plan:
            print_plan(jobs, queues, minutes, a.time_limit, _say_all_gpu_wait(state, count, jobs))
            return 0
        state.save()
    try:
        run_set(state, count, a.timeout, deadline=None if a.time_limit is None else started + a.time_limit * 60,
                minutes=minutes)
    except KeyboardInterrupt:
        for j in state.jobs:
            if j.status == "running":
                j.status, j.error = "failed", "interrupted"
        state.save()
        print(f"wmbook regenerate: interrupted; run the same command to resume ({len(state.missing())} runs left)",
              file=sys.stderr)
        return 130
    t = gpu_time(state)
    print(f"GPU time {t['total_seconds'] / 60:.1f} minutes for its {len(state.jobs)} runs (the whole set's goal "
          f"{GOAL_MINUTES:.0f}), wall {t['wall_seconds'] / 60:.1f} minutes; missing: "
          f"{[j.name for j in state.missing()] or 'none'}")
    if state.missing():
        print(f"run `python -m wmbook regenerate --out {out}` again to finish the set")
    if a.publish is not None:
        publish_set(state, a.publish, tree=commit, whole=plan())
    return 0 if not state.missing() else 1


if __name__ == "__main__":
    sys.exit(main())
