"""The host's CPU use over a run (wmbook.hostload): this process's and its children's work counts as the run's own,
the host's counters give the rest. Bounds, not exact values: other tests run beside these on the same cores."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest

from wmbook import hostload
from wmbook.hostload import LOOP_N, HostLoad, core_loop_us, host_load


def _spin(seconds: float) -> None:
    t = time.perf_counter()
    while time.perf_counter() - t < seconds:
        pass


def _sane(load: HostLoad) -> None:
    assert load.cores >= 1 and load.seconds > 0
    assert 0 <= load.busy_cores <= load.cores and 0 <= load.steal_share <= 1
    assert 0 <= load.others_cores <= load.cores


def test_a_busy_thread_is_the_runs_own_work():
    th = threading.Thread(target=lambda: _spin(1.5))
    with host_load(0.2) as hl:
        th.start()
        th.join()
    load = hl["load"]
    _sane(load)
    assert load.own_cores >= 0.5, load  # one core for 1.5 s, whatever else the host ran
    assert load.busy_cores >= 0.5  # the host's counters saw it too
    assert load.core_loop_us > 0  # sampled at each end and once an interval


def test_the_core_loop_counts_this_threads_cpu_time_not_waiting(monkeypatch):
    """core_loop_us is the loop's CPU time on this thread's clock (waiting for a core or the GIL adds nothing), and
    more iterations take longer (bounds only: the tests' own cores are shared)."""
    assert core_loop_us() > 0 and core_loop_us(20 * LOOP_N) > core_loop_us(LOOP_N)
    ticks = iter([1_000, 6_000])  # the thread's CPU clock, in ns: 5 us apart whatever the wall clock did
    monkeypatch.setattr(hostload.time, "thread_time_ns", lambda: next(ticks))
    assert core_loop_us(10) == 5.0


def test_a_child_process_counts_as_the_runs_own():
    with host_load(0.2) as hl:
        subprocess.run([sys.executable, "-c", "import time\nt = time.perf_counter()\n"
                        "while time.perf_counter() - t < 2.0: pass"], check=True)
    load = hl["load"]
    _sane(load)
    assert load.own_cores >= 0.5, load  # sampled while it ran (at most its last interval is missed)


def test_record_round_trip_and_words():
    load = HostLoad(seconds=10.0, cores=16, busy_cores=14.9, own_cores=3.7, steal_share=0.0)
    rec = load.record()
    assert rec["others_cores"] == pytest.approx(11.2) and HostLoad.from_record(rec) == load
    assert load.describe() == "host CPUs busy 14.9 of 16 (other work 11.2)"
    stolen = HostLoad(seconds=10.0, cores=8, busy_cores=2.0, own_cores=3.0, steal_share=0.25)
    assert stolen.others_cores == 0.0  # never below zero (own work sampled a little high)
    assert stolen.describe().endswith("25% stolen by the hypervisor")
    fast = HostLoad(seconds=10.0, cores=16, busy_cores=1.0, own_cores=1.0, steal_share=0.0, core_loop_us=950.0)
    assert HostLoad.from_record(fast.record()) == fast
    assert fast.describe() == "host CPUs busy 1.0 of 16 (other work 0.0), core loop 950 us"
    assert HostLoad.from_record(rec).core_loop_us is None  # a record made before it was measured


def test_without_counters_the_run_goes_on_and_the_reason_is_said(monkeypatch):
    monkeypatch.setitem(sys.modules, "psutil", None)  # import psutil raises ImportError
    with host_load() as hl:
        x = 1 + 1
    assert x == 2 and hl["load"] is None and "cannot be read" in hl["reason"]


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), float("inf")])
def test_a_bad_interval_is_refused_naming_it(bad):
    with pytest.raises(ValueError, match="interval_s="), host_load(bad):
        pass
