"""The published set's record and its publishing (wmbook.regenerate makes the runs): `set.json` (the plan, each
run's status, seconds and the part of the set that made it), the set's GPU time, the parts made on several machines
merged into one folder, and a complete set published into a reports folder with its GPU time, index, pages and one
NOTES.md entry."""

from __future__ import annotations

import csv
import datetime as _dt
import json
import shutil
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .atomic import atomic_write_text
from .errors import InputError
from .paths import GPU_TIME_FILE, REPO_ROOT

SET_FILE = "set.json"
CANNOT = "cannot run on this host"
GOAL_MINUTES = 60.0  # the whole set's GPU time on the reference device
# a run that holds every GPU (notebook 08) studies several: on a GPU host of one it would compare one GPU with itself
MIN_ALL_GPUS = 2
NOTES = REPO_ROOT / "data" / "reports" / "NOTES.md"


@dataclass
class Job:
    """One run of the set: `wmbook run <notebook>` with `params` (its workload and preset among them)."""

    name: str  # '<notebook>-<workload>' or, for a run the study adds, '<notebook>-<its preset>'
    notebook: str  # its file stem
    source: str  # the notebook file (relative to the repository when inside it)
    params: dict
    gpus: str = "one"  # "all": alone, after the queues, every GPU visible
    queue: int | None = None
    status: str = "pending"  # pending | running | ok | failed | cannot run here (CANNOT)
    seconds: float = 0.0  # wall clock of the run
    gpu_count: int = 1  # the GPUs it held: its GPU time is seconds x gpu_count
    after: list[str] = field(default_factory=list)  # runs whose compiled stacks it reuses: started once they ended
    error: str = ""
    cut_after_s: float = 0.0  # the longest it ran before a limit cut it: it needs at least that long
    # the `wmbook regenerate` call (its start) that made it: a set made in parts, on one machine or several, has the
    # wall clock of each part's queues
    part: str = ""


class SetState:
    """set.json: the commit, the device, the plan and each run's outcome; saved whole after every change."""

    def __init__(self, out: Path, commit: str, device: str, queues: int, jobs: list[Job], host_gpus: int | None = None):
        self.out, self.commit, self.device, self.queues, self.jobs = out, commit, device, queues, jobs
        # the GPUs of the host that started the set: its all-GPU runs are made on no fewer (None: a set of a version
        # that did not record it)
        self.host_gpus = host_gpus
        self.started = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
        self._lock = threading.Lock()

    def save(self) -> None:
        with self._lock:
            self.out.mkdir(parents=True, exist_ok=True)
            d = {"commit": self.commit, "device": self.device, "queues": self.queues, "host_gpus": self.host_gpus,
                 "started": self.started, "jobs": [asdict(j) for j in self.jobs],
                 "seconds": {j.name: j.seconds for j in self.jobs if j.status == "ok"}}
            atomic_write_text(self.out / SET_FILE, json.dumps(d, indent=1))

    @classmethod
    def load(cls, out: Path) -> "SetState":
        d = json.loads((out / SET_FILE).read_text())
        st = cls(out, d["commit"], d["device"], d["queues"], [Job(**j) for j in d["jobs"]], d.get("host_gpus"))
        st.started = d["started"]
        return st

    def all_gpu_runs_need(self) -> int:
        """The fewest GPUs of a host that makes the set's all-GPU runs: as many as the host that started the set had
        (on fewer, notebook 08 would study fewer GPUs than the set's other runs were planned around), and on a GPU
        device at least MIN_ALL_GPUS (a CPU set runs them on processes, whatever the count)."""
        need = self.host_gpus or 0
        return need if self.device == "CPU" else max(need, MIN_ALL_GPUS)

    def makes_all_gpu_runs(self, gpus: int) -> bool:
        """Whether a host of `gpus` GPUs makes the set's all-GPU runs (all_gpu_runs_need)."""
        return gpus >= self.all_gpu_runs_need()

    def missing(self) -> list[Job]:
        return [j for j in self.jobs if j.status != "ok"]


def gpu_time(state: SetState) -> dict:
    """GPU seconds per run, per notebook and in all (a run's wall clock times the GPUs it held: an all-GPU run on two
    GPUs counts twice its time), and the set's wall clock: per part (Job.part: a call that ran some of its runs), its
    longest queue, then its all-GPU runs; summed over the parts."""
    gpu_s = {j.name: j.seconds * max(1, j.gpu_count) for j in state.jobs}
    per_nb: dict[str, float] = {}
    for j in state.jobs:
        per_nb[j.notebook] = per_nb.get(j.notebook, 0.0) + gpu_s[j.name]
    wall = 0.0
    for part in {j.part for j in state.jobs}:
        jobs = [j for j in state.jobs if j.part == part]
        queues = {j.queue for j in jobs if j.gpus != "all" and j.queue is not None}
        wall += max((sum(j.seconds for j in jobs if j.queue == q and j.gpus != "all") for q in queues), default=0.0)
        wall += sum(j.seconds for j in jobs if j.gpus == "all")
    return {"commit": state.commit, "device": state.device, "queues": state.queues,
            "seconds": {j.name: round(j.seconds, 1) for j in state.jobs},
            "gpus": {j.name: max(1, j.gpu_count) for j in state.jobs},
            "notebook_seconds": {k: round(v, 1) for k, v in per_nb.items()},
            "total_seconds": round(sum(gpu_s.values()), 1), "wall_seconds": round(wall, 1),
            "goal_minutes": GOAL_MINUTES, **_host_figures(state)}


def _host_figures(state: SetState) -> dict[str, dict[str, float]]:
    """Per made run, from its report folder's summary (wmbook.hostload; runs made before a figure was recorded are
    left out of it): the average CPUs other work kept busy on its host while it ran (host_other_cores), and the
    speed of one of the host's cores (host_core_loop_us)."""
    from .hostload import of_report  # noqa: PLC0415

    loads = {j.name: of_report(state.out / "runs" / j.name) for j in state.jobs}
    loads = {name: load for name, load in loads.items() if load is not None}
    return {"host_other_cores": {name: round(load.others_cores, 1) for name, load in loads.items()},
            "host_core_loop_us": {name: round(load.core_loop_us) for name, load in loads.items()
                                  if load.core_loop_us is not None}}


def merge_set(state: SetState, other: Path, echo=print) -> list[str]:
    """Join the runs another machine finished of the same set (its folder `other`: same commit, device and runs) into
    `state`'s folder: each run that is done there and not here brings its report folder, rows and log, its status and
    seconds; the times file's lines join this one's; a run its time limit cut there brings how long it ran. Everything
    is checked before anything is copied (InputError naming what does not fit). Returns the names of the runs
    joined."""
    from . import runtimes  # noqa: PLC0415

    if not (other / SET_FILE).is_file():
        raise InputError(f"--merge {other}: no {SET_FILE} there (the --out folder of a part of this set)")
    theirs = SetState.load(other)
    if (theirs.commit, theirs.device) != (state.commit, state.device):
        raise InputError(f"--merge {other}: its set ran at commit {theirs.commit} on {theirs.device}, this one at "
                         f"{state.commit} on {state.device}: a set comes from one commit and one device")
    mine = {j.name: j for j in state.jobs}
    unknown = sorted(j.name for j in theirs.jobs if j.name not in mine)
    if unknown:
        raise InputError(f"--merge {other}: runs {unknown} are not in this set's plan ({sorted(mine)})")
    take = [j for j in theirs.jobs if j.status == "ok" and mine[j.name].status != "ok"]
    for j in take:
        for need in (other / "runs" / j.name, other / "results" / f"{j.name}.csv"):
            if not need.exists():
                raise InputError(f"--merge {other}: run {j.name} is done in its {SET_FILE} but {need} is missing")
    for j in take:
        dst = state.out / "runs" / j.name
        tmp = dst.with_name(f".{j.name}.merging")
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(other / "runs" / j.name, tmp)
        shutil.rmtree(dst, ignore_errors=True)
        tmp.rename(dst)  # a run's folder is whole or absent, never half copied
        for sub, name in (("results", f"{j.name}.csv"), ("logs", f"{j.name}.log")):
            if (other / sub / name).exists():
                (state.out / sub).mkdir(parents=True, exist_ok=True)
                shutil.copy2(other / sub / name, state.out / sub / name)
        m = mine[j.name]
        m.status, m.seconds, m.queue, m.gpu_count, m.part, m.error = "ok", j.seconds, j.queue, j.gpu_count, \
            j.part or f"merged from {other.name}", ""
    cut = [j for j in theirs.jobs if j.status != "ok" and mine[j.name].status != "ok"
           and j.cut_after_s > mine[j.name].cut_after_s]
    for j in cut:  # a run a part's time limit cut: the next part plans it at least that long (expected_minutes)
        m = mine[j.name]
        m.status, m.error, m.cut_after_s = "failed", j.error, j.cut_after_s
    times = other / "results" / runtimes.TIMES_FILE
    for line in runtimes.read(times):  # into this set's times file (record writes beside the path it is given); a
        runtimes.record(state.out / "results" / runtimes.TIMES_FILE, **line)  # run id already there is not added twice
    state.save()
    echo(f"{len(take)} runs joined from {other}; {len(state.missing())} of {len(state.jobs)} still to run"
         + (f": {[j.name for j in state.missing()]}" if state.missing() else ""))
    return [j.name for j in take]


def run_params(jobs: list[Job]) -> dict[str, str]:
    """Each run's name -> its parameters as one comparable string (two plans are the same runs where these are)."""
    return {j.name: json.dumps(j.params, sort_keys=True, default=str) for j in jobs}


def whole_set_lacks(state: SetState, whole: list[Job]) -> list[str]:
    """The runs of the whole set (`whole`: every notebook for every workload, at their own parameters) that `state`
    does not make as they are: not among its runs (--notebooks, --workloads) or made with other parameters (-p)."""
    theirs, mine = run_params(whole), run_params(state.jobs)
    return sorted(n for n, p in theirs.items() if mine.get(n) != p)


def publish_set(state: SetState, folder: Path, store: Path | None = None, notes: Path | None = NOTES,
                echo=print, tree: str = "", whole: list[Job] | None = None) -> list[Path]:
    """Publish a complete set (module docstring); InputError naming what is missing, before anything is written, for
    a set that is not complete or not from one clean commit. `tree`: the commit of the tree publishing it, named in
    the NOTES entry where it is not the set's. `whole`: the whole set's plan (`wmbook.regenerate.plan()`), which a
    set published into a device's folder is held to: one of fewer runs publishes its reports and rows, and its GPU
    time is not written as the set's."""
    from . import published, results  # noqa: PLC0415  heavy: pandas, nbconvert

    missing = state.missing()
    if missing:
        raise InputError("the set is not complete, so nothing is published; missing: " + "; ".join(
            f"{j.name} ({j.status}{': ' + j.error if j.error else ''})" for j in missing)
            + f"; run `python -m wmbook regenerate --out {state.out}` again to finish it")
    if not state.commit or state.commit.endswith("+dirty"):
        raise InputError(f"the set ran at commit {state.commit or 'unknown'!r}, not one clean commit: a published "
                         "set comes from one; start it over from a clean tree (--fresh)")
    published.check_folder_device(folder, [state.device], "the set")
    # a device's published folder: a set of some of the runs publishes its reports and rows, not a GPU time of the set
    device_folder = folder.resolve() in {f.resolve() for f in published.FOLDER_PAGES}
    if device_folder and whole is None:
        raise ValueError("publish_set into a device's folder needs the whole set's plan (whole=regenerate.plan())")
    lacks = whole_set_lacks(state, whole) if device_folder else []
    folder.mkdir(parents=True, exist_ok=True)
    for j in state.jobs:
        with (state.out / "results" / f"{j.name}.csv").open(newline="") as f:
            rows = list(csv.DictReader(f))
        if rows:
            results.append(rows, store)
    # each run's time joins the store's times file: a notebook then says at its start how long it takes here
    from . import runtimes  # noqa: PLC0415

    for line in runtimes.read(state.out / "results" / runtimes.TIMES_FILE):  # beside every run's rows file
        runtimes.record(store or results.default_path(), **line)
    written = []
    for j in state.jobs:
        written += published.publish_report(state.out / "runs" / j.name, folder, store)
    t = gpu_time(state)
    if not lacks:
        atomic_write_text(folder / GPU_TIME_FILE, json.dumps(t, indent=1))
        written.append(folder / GPU_TIME_FILE)
    from .report_index import write_folder_index  # noqa: PLC0415  heavy: nbformat

    # the folder's device where it is a device's folder, else the set's card by its full name (a filter by
    # substring: the last word of 'NVIDIA H100 80GB HBM3' would name the memory, not the card)
    written.append(write_folder_index(folder, results_path=store, device=None if state.device == "CPU"
                                      else published.folder_device(folder) or state.device))
    if device_folder and store is None:
        published.update_readme(allow_removal=True)
    if notes is not None and device_folder:
        _note(notes, state, folder, t, tree, lacks)
        written.append(notes)
    for p in written:
        echo(p)
    return written


def _note(notes: Path, state: SetState, folder: Path, t: dict, tree: str = "", lacks: list[str] = ()) -> None:
    """One dated entry at the top of NOTES.md's list: the commit, the device, GPU time per notebook and in all (of
    these runs only, with no verdict on the set's goal, where the set is not the whole one)."""
    day = _dt.date.today().isoformat()
    per = ", ".join(f"{nb[:2]} {s / 60:.1f}" for nb, s in sorted(t["notebook_seconds"].items()))
    total = t["total_seconds"] / 60
    what = (f"{len(state.jobs)} runs of the published set regenerated** (not the whole set: {len(lacks)} of its runs "
            "not among them, so the folder's GPU time of the set stays its last whole set's; "
            if lacks else "the published set regenerated** (")
    entry = (f"- **{day}, commit {state.commit}, {state.queues} x {state.device}: {what}"
             f"`python -m wmbook regenerate`, {len(state.jobs)} runs into "
             f"`{folder.resolve().relative_to(REPO_ROOT)}`). GPU "
             + (f"time of these runs {total:.1f} minutes" if lacks else
                f"time {total:.1f} minutes in all (goal {GOAL_MINUTES:.0f}: "
                f"{'met' if total <= GOAL_MINUTES else 'missed'})")
             + f", {t['wall_seconds'] / 60:.1f} minutes of wall clock; per notebook (minutes): {per}"
             + (f"; joined and published by the tree at commit {tree[:7]}" if tree and tree != state.commit else "")
             + ".\n")
    text = notes.read_text()
    at = text.find("\n- **")
    atomic_write_text(notes, text[:at + 1] + entry + text[at + 1:] if at >= 0 else text + "\n" + entry)
