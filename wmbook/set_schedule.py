"""How a set's runs are dealt to the host's queues and fitted into a time limit (wmbook.regenerate runs them): each
run's expected minutes, the rule that starts a run before a limit, and what a set would do if every run took its
expected time (what `regenerate --plan` prints)."""

from __future__ import annotations

from .published_set import CANNOT, Job

__all__ = ["DEFAULT_MINUTES", "START_MARGIN", "deal", "expected_minutes", "print_plan", "simulate", "starts_in_time"]

DEFAULT_MINUTES = 10.0  # a run with no earlier time: dealt as if it took this long
# a run starts before a time limit only with this to spare (factor, seconds): its expectation is the notebook's own time
# from the times file, while the set's clock also holds the kernel's start and the report (about half a minute), and on
# a fresh machine's empty compile cache runs took 0.96-1.47x their earlier times (H200, a2ed9dc: 05 mg2 1.31x, 06 wma
# 1.47x; 02 mg2 was still running at 1.31x when cut). A run cut near its end loses all its minutes, one not started
# only the minutes left, which a shorter run may still take
START_MARGIN = (1.35, 30.0)


def starts_in_time(need_s: float, left_s: float) -> bool:
    """Whether a run expected to take `need_s` seconds starts with `left_s` seconds left before a limit
    (START_MARGIN's rule: run_set decides by it, simulate predicts by it)."""
    return need_s * START_MARGIN[0] + START_MARGIN[1] <= left_s


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

    def fits(j: Job, at: float) -> bool:
        return time_limit is None or starts_in_time(expected_minutes(j, minutes) * 60, (time_limit - at) * 60)

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
        if not fits(j, t):
            got[j.name] = None
            continue
        got[j.name] = (q, t)
        running[j.name] = free[q] = t + expected_minutes(j, minutes)
    for j in pending:  # waits for a run that never ends within the plan
        got[j.name] = None
    t = max(free + list(running.values()))
    for j in (j for j in todo if j.gpus == "all"):
        got[j.name] = (None, t) if all_gpu and fits(j, t) else None
        if got[j.name] is not None:
            t += expected_minutes(j, minutes)
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
        when = (f"at {at[1]:.1f} min" if at else "waits for a host of more GPUs" if j.gpus == "all" and not all_gpu
                else "not started within the limit" if j.name in sim else j.status)
        print(f"  {where}  {j.name}  {j.params}  expected {expected_minutes(j, minutes):.1f} min, {when}"
              + (f"  after {', '.join(j.after)}" if j.after else "")
              + (f"  [{j.status}: {j.error}]" if j.status == CANNOT else ""))
