"""How a set's runs are dealt to the host's queues and fitted into a time limit (wmbook.regenerate runs them): each
run's expected minutes, the rule that starts a run before a limit, and what a set would do if every run took its
expected time (what `regenerate --plan` prints)."""

from __future__ import annotations

import json
from pathlib import Path

from .published_set import CANNOT, GPU_TIME_FILE, SET_FILE, Job

__all__ = ["DEFAULT_MINUTES", "PACE_MAX", "START_MARGIN", "deal", "earlier_minutes", "expected_minutes", "host_pace",
           "print_plan", "recorded_minutes", "say_paces", "simulate", "starts_in_time", "starts_without_margin"]

DEFAULT_MINUTES = 10.0  # a run with no earlier time: dealt as if it took this long
# a run starts before a time limit only with this to spare (factor, seconds): its expectation is the notebook's own time
# from the times file, while the set's clock also holds the kernel's start and the report (about half a minute), and on
# a fresh machine's empty compile cache runs took 0.96-1.47x their earlier times (H200, a2ed9dc: 05 mg2 1.31x, 06 wma
# 1.47x; 02 mg2 was still running at 1.31x when cut). A run cut near its end loses all its minutes, one not started
# only the minutes left, which a shorter run may still take
START_MARGIN = (1.35, 30.0)

# a run recorded on a faster host core is expected to take longer here by the cores' ratio, at most this much: the
# launch-bound rows and the compiles follow the core (H200 hosts: notebook 02 at mg2 took 1.5x as long on a host whose
# core ran the fixed loop 1.6x slower), the GPU's own work does not, so the ratio errs long; a faster core here leaves
# the expectation as it was (a run cut near its end loses all its minutes)
PACE_MAX = 3.0


def host_pace(core_now_us: float | None, core_then_us: float | None) -> float:
    """How much longer a run is expected to take on this host than on the one its time was recorded on, by their
    cores' fixed-loop times (wmbook.hostload.core_loop_us): their ratio within [1, PACE_MAX], 1 where either is not
    known."""
    if not core_now_us or not core_then_us or core_now_us <= 0 or core_then_us <= 0:
        return 1.0
    return min(PACE_MAX, max(1.0, core_now_us / core_then_us))


def earlier_minutes(out: Path, publish: Path | None, core_now: float | None = None,
                    paces: dict[str, float] | None = None) -> dict[str, float]:
    """Minutes per run from the set the folder held before, else from the published folder's gpu_time.json; with
    `core_now` (this host's core, wmbook.hostload.core_loop_us) each scaled by host_pace against the core its run was
    made on, where recorded (the pace put into `paces`)."""
    for f in (out / SET_FILE, publish / GPU_TIME_FILE if publish is not None else None):
        if f is not None and f.is_file():
            try:
                d = json.loads(f.read_text())
                loops = d.get("host_core_loop_us") or {}
                return _paced({n: s / 60 for n, s in d.get("seconds", {}).items() if s > 0},
                              {n: loops.get(n) for n in d.get("seconds", {})}, core_now, paces)
            except (ValueError, AttributeError):
                continue
    return {}


def _paced(minutes: dict[str, float], loops: dict[str, float | None], core_now: float | None,
           paces: dict[str, float] | None) -> dict[str, float]:
    """`minutes` with each run's scaled by host_pace(core_now, its recorded core loop); the paces over 1 go into
    `paces`."""
    out = {}
    for name, m in minutes.items():
        pace = host_pace(core_now, loops.get(name))
        if pace > 1.0 and paces is not None:
            paces[name] = pace
        out[name] = m * pace
    return out


def recorded_minutes(jobs: list[Job], device: str, gpus: int | None = None, core_now: float | None = None,
                     paces: dict[str, float] | None = None) -> dict[str, float]:
    """Minutes per run from the times recorded for the same notebook, workload, preset, device and parameters
    (wmbook.runtimes: every finished run and published report leaves one; a run on every GPU, by runs on `gpus`
    GPUs): a first set on a device is dealt, and fitted into a time limit, by what its runs took there before. With
    `core_now` (this host's core, wmbook.hostload.core_loop_us) a time recorded on a faster core is scaled by
    host_pace (the pace put into `paces`)."""
    from . import runtimes  # noqa: PLC0415
    from . import workloads as wls  # noqa: PLC0415  heavy: torch

    out, loops = {}, {}
    for j in jobs:
        w, preset = j.params.get("workload"), j.params.get("preset", "auto")
        if not isinstance(w, str) or w not in wls.names():
            continue
        if preset == "auto":
            preset = wls.get(w).real_preset
        if not preset:
            continue
        key = dict(params=runtimes.params_key(j.params), gpus=gpus if j.gpus == "all" else None)
        got = runtimes.expected_with_core(j.notebook, w, preset, device, **key)
        if got is not None:
            out[j.name], loops[j.name] = got[0] / 60, got[2]
    return _paced(out, loops, core_now, paces)


def say_paces(core_now: float, paces: dict[str, float]) -> None:
    """This host's core, and the runs expected to take longer here than where their times were recorded."""
    print(f"this host's core: {core_now:,.0f} us for the fixed loop of wmbook.hostload"
          + ("; expected longer here than on the faster cores their times were recorded on: "
             + ", ".join(f"{n} x{p:.1f}" for n, p in sorted(paces.items())) if paces else ""))


def starts_in_time(need_s: float, left_s: float, whole_s: float | None = None) -> bool:
    """Whether a run expected to take `need_s` seconds starts with `left_s` seconds left before a limit
    (START_MARGIN's rule: run_set decides by it, simulate predicts by it), or by starts_without_margin where the
    queue has started nothing yet in a slice of `whole_s` seconds (None: it has)."""
    return need_s * START_MARGIN[0] + START_MARGIN[1] <= left_s or starts_without_margin(need_s, left_s, whole_s)


def starts_without_margin(need_s: float, left_s: float, whole_s: float | None) -> bool:
    """Whether a run starts on a queue that has started nothing yet in a slice of `whole_s` seconds although
    START_MARGIN's spare time is not left: no slice of that length would ever start it with the margin, so its one
    chance is a fresh queue, and it takes it when it fits at all (with START_MARGIN's seconds for the kernel's start
    and the report). A limit that cuts it anyway records how long it ran (Job.cut_after_s): the set then says it needs
    a longer slice instead of trying again."""
    return (whole_s is not None and need_s * START_MARGIN[0] + START_MARGIN[1] > whole_s
            and need_s + START_MARGIN[1] <= left_s)


def expected_minutes(job: Job, minutes: dict[str, float]) -> float:
    """How long a run is expected to take: its earlier time (`minutes`, else DEFAULT_MINUTES), and never less than
    it already ran before a limit cut it (a run cut after 25 minutes is not started again with 10 minutes left)."""
    return max(minutes.get(job.name, DEFAULT_MINUTES), job.cut_after_s / 60)


def deal(jobs: list[Job], queues: int, minutes: dict[str, float]) -> list[float]:
    """Each single-GPU run to a queue, longest first to the least loaded one; returns each queue's expected minutes
    (what --plan shows: when the set runs, each queue takes the longest run that is ready, run_set)."""
    load = [0.0] * queues
    single = (j for j in jobs if j.gpus != "all" and j.status != CANNOT)
    for j in sorted(single, key=lambda j: -expected_minutes(j, minutes)):
        j.queue = min(range(queues), key=load.__getitem__)
        load[j.queue] += expected_minutes(j, minutes)
    return load


def simulate(jobs: list[Job], queues: int, minutes: dict[str, float], time_limit: float | None = None,
             all_gpu: bool = True) -> dict[str, tuple[int | None, float] | None]:
    """What run_set would do if every run took its expected minutes: each run's (queue, start minute), None for the
    queue-less all-GPU runs' queue, or None for a run not started within `time_limit` (START_MARGIN's rule). A free
    queue takes the longest run still to do that waits for no run still to do or running (Job.after); the all-GPU
    runs follow once every queue has ended (all_gpu=False: this host makes none of them)."""
    todo = [j for j in jobs if j.status not in ("ok", CANNOT)]
    pending = sorted((j for j in todo if j.gpus != "all"), key=lambda j: -expected_minutes(j, minutes))
    free, running = [0.0] * max(1, queues), {}
    got: dict[str, tuple[int | None, float] | None] = {}
    started: set[int | None] = set()  # the queues that started a run (None: any did)

    def fits(j: Job, at: float, q: int | None) -> bool:
        whole = None if (q in started if q is not None else bool(started)) else (time_limit or 0) * 60
        return time_limit is None or starts_in_time(expected_minutes(j, minutes) * 60, (time_limit - at) * 60, whole)

    while pending:
        q = min(range(len(free)), key=free.__getitem__)
        t = free[q]
        running = {n: end for n, end in running.items() if end > t}
        held = set(running) | {x.name for x in pending}
        ready = [j for j in pending if not set(j.after) & held]
        if not ready:  # what it waits for is running: the queue is free again when the first of those ends
            if not running:
                break
            free[q] = min(running.values())
            continue
        j = ready[0]
        pending.remove(j)
        if not fits(j, t, q):
            got[j.name] = None
            continue
        got[j.name] = (q, t)
        started.add(q)
        running[j.name] = free[q] = t + expected_minutes(j, minutes)
    for j in pending:  # waits for a run that never ends within the plan
        got[j.name] = None
    t = max(free + list(running.values()))
    for j in (j for j in todo if j.gpus == "all"):
        got[j.name] = (None, t) if all_gpu and fits(j, t, None) else None
        if got[j.name] is not None:
            t += expected_minutes(j, minutes)
            started.add(None)
    return got


def print_plan(jobs: list[Job], queues: int, minutes: dict[str, float], time_limit: float | None,
                all_gpu: bool = True) -> None:
    """Each run still to make, in the order the set would start it if each took its expected minutes (simulate):
    its queue, when it starts, what it is given; with a time limit, the runs not expected to start within it."""
    sim = simulate(jobs, queues, minutes, time_limit, all_gpu)
    order = sorted(jobs, key=lambda j: (sim.get(j.name) is None, (sim.get(j.name) or (0, 0.0))[1]))
    for j in order:
        at = sim.get(j.name)
        where = "all" if j.gpus == "all" else f"q{at[0]}" if at else "--"
        bare = at and time_limit and not starts_in_time(expected_minutes(j, minutes) * 60, (time_limit - at[1]) * 60)
        when = (f"at {at[1]:.1f} min" + (" (without the margin: the first of its queue)" if bare else "") if at
                else "waits for a host of more GPUs" if j.gpus == "all" and not all_gpu
                else "not started within the limit" if j.name in sim else j.status)
        print(f"  {where}  {j.name}  {j.params}  expected {expected_minutes(j, minutes):.1f} min, {when}"
              + (f"  after {', '.join(j.after)}" if j.after else "")
              + (f"  [{j.status}: {j.error}]" if j.status == CANNOT else ""))
