"""The published set from one command (wmbook.regenerate): the plan, the queues, a cut set resumed, and publishing
refused until the set is complete and from one clean commit."""

from __future__ import annotations

import json

import nbformat
import pytest

from wmbook import regenerate as rg
from wmbook.errors import InputError

FAST_NB = """
import os, time
from wmbook import results
results.append([results.make_row(notebook="t", workload="w", preset="tiny", variant="v", metric="m", value=1.0,
                                 unit="ms", params={})], results_path)
from wmbook import display as wd
wd.rows(results_path, results.RUN_ID)
env = os.environ.get
print(env("WMBOOK_GIT_COMMIT"), env("NCCL_NVLS_ENABLE"), env("TORCHINDUCTOR_CACHE_DIR"))
assert fail == 0, "asked to fail"
time.sleep(sleep)
"""


def _notebook(tmp_path, name="99_fast"):
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("results_path = ''\nfail = 0\nsleep = 0")
    cell.metadata["tags"] = ["parameters"]
    nb.cells = [cell, nbformat.v4.new_code_cell(FAST_NB)]
    nb.metadata["kernelspec"] = {"name": "python3", "language": "python", "display_name": "Python 3"}
    path = tmp_path / f"{name}.ipynb"
    nbformat.write(nb, path)
    return path


def test_the_plan_runs_each_notebook_once_per_workload_and_multi_gpu_alone():
    jobs = rg.plan(["01", "07", "08"])
    names = [j.name for j in jobs]
    assert names == ["01_baseline_profiling-mg2", "01_baseline_profiling-wma", "07_motion_data_loading-motion",
                     "08_multi_gpu-mg2", "08_multi_gpu-wma"]
    assert {j.name for j in jobs if j.gpus == "all"} == {"08_multi_gpu-mg2", "08_multi_gpu-wma"}
    assert all(j.params["workload"] in j.name for j in jobs)
    # the study's own runs (notebook 03's trained presets) stay out when a preset is given for every run
    assert [j.name for j in rg.plan(["03"], ["mg2"], {"preset": "tiny"})] == ["03_step_reduction-mg2"]


def test_bad_input_is_named_before_anything_runs(tmp_path):
    with pytest.raises(ValueError, match="unknown notebook"):
        rg.plan(["42"])
    with pytest.raises(InputError, match="workload"):
        rg.plan(["01"], ["nope"])
    with pytest.raises(SystemExit):
        rg.main(["--out", str(tmp_path / "s"), "--gpus", "0", "--allow-dirty"])


def test_runs_are_dealt_longest_first_to_the_least_loaded_queue():
    jobs = [rg.Job(n, "x", "x.ipynb", {}) for n in "abcde"] + [rg.Job("f", "x", "x.ipynb", {}, gpus="all")]
    load = rg.deal(jobs, 2, {"a": 40, "b": 30, "c": 20, "d": 10, "e": 5})
    assert load == [55, 50] and {j.name: j.queue for j in jobs} == {"a": 0, "b": 1, "c": 1, "d": 0, "e": 0,
                                                                    "f": None}
    # a queue runs its runs in the plan's order (notebook by notebook: what an earlier one compiled is cached)
    assert [j.name for j in jobs] == list("abcdef")


def test_gpu_time_counts_an_all_gpu_run_once_per_gpu_it_held(tmp_path):
    jobs = [rg.Job("04-mg2", "04_compile", "x", {}, queue=0, status="ok", seconds=600),
            rg.Job("05-mg2", "05_kernels", "x", {}, queue=1, status="ok", seconds=300),
            rg.Job("08-wma", "08_multi_gpu", "x", {}, gpus="all", status="ok", seconds=120, gpu_count=2)]
    t = rg.gpu_time(rg.SetState(tmp_path, "abc1234", "NVIDIA H200", 2, jobs))
    assert t["seconds"]["08-wma"] == 120 and t["gpus"]["08-wma"] == 2
    assert t["notebook_seconds"]["08_multi_gpu"] == 240 and t["total_seconds"] == 1140
    assert t["wall_seconds"] == 720  # the longest queue, then the all-GPU run
    assert t["host_other_cores"] == {}  # no run recorded its host's CPU use
    folder = tmp_path / "runs" / "05-mg2"
    folder.mkdir(parents=True)
    (folder / "summary.json").write_text(json.dumps({"meta": {}, "notebooks": [{"host_load": {
        "seconds": 300.0, "cores": 16, "busy_cores": 14.9, "own_cores": 3.7, "steal_share": 0.0,
        "others_cores": 11.2}}]}))
    t = rg.gpu_time(rg.SetState(tmp_path, "abc1234", "NVIDIA H200", 2, jobs))
    assert t["host_other_cores"] == {"05-mg2": 11.2}
    assert t["host_core_loop_us"] == {}  # a record made before the core's speed was measured
    assert rg._host_load_said(folder) == "host CPUs busy 14.9 of 16 (other work 11.2)"
    (folder / "summary.json").write_text(json.dumps({"meta": {}, "notebooks": [{"host_load": {
        "seconds": 300.0, "cores": 16, "busy_cores": 1.0, "own_cores": 1.0, "steal_share": 0.0, "core_loop_us": 950.4,
        "others_cores": 0.0}}]}))
    assert rg.gpu_time(rg.SetState(tmp_path, "abc1234", "NVIDIA H200", 2, jobs))["host_core_loop_us"] == {"05-mg2": 950}
    assert rg._host_load_said(folder) == "host CPUs busy 1.0 of 16 (other work 0.0), core loop 950 us"
    assert rg._host_load_said(tmp_path / "runs" / "04-mg2") == ""  # none recorded: nothing said


def test_a_set_runs_on_queues_resumes_what_did_not_finish_and_publishes_only_when_whole(tmp_path, monkeypatch):
    nb = _notebook(tmp_path)
    out = tmp_path / "set"
    jobs = rg.plan([str(nb)], None, {})
    jobs.append(rg.Job("99_fast-fails", "99_fast", str(nb), {"fail": 1}))
    rg.deal(jobs, 2, {})
    state = rg.SetState(out, "abc1234", "CPU", 2, jobs)
    rg.run_set(state, 0, 300, echo=lambda *a: None)
    st = {j.name: j.status for j in state.jobs}
    assert st == {"99_fast-default": "ok", "99_fast-fails": "failed"}, [j.error for j in state.jobs]
    assert "asked to fail" in (out / "logs" / "99_fast-fails.log").read_text()
    log = (out / "logs" / "99_fast-default.log").read_text()
    assert (out / "results" / "99_fast-default.csv").exists() and "1/1 notebooks ok" in log
    executed = next((out / "runs" / "99_fast-default" / "executed").glob("*.ipynb")).read_text()
    # every run records the set's commit, multicast stays off, and the runs share the set's compile cache
    assert f"abc1234 0 {out / 'cache' / 'inductor'}" in executed
    saved = rg.SetState.load(out)
    assert [j.status for j in saved.jobs] == ["ok", "failed"] and saved.jobs[0].seconds > 0

    # publishing a set that is not whole writes nothing and names what is missing
    folder, store = tmp_path / "pub", tmp_path / "store.csv"
    with pytest.raises(InputError, match="not complete.*99_fast-fails"):
        rg.publish_set(saved, folder, store=store, notes=None, echo=lambda *a: None)
    assert not folder.exists() and not store.exists()

    # resumed: only the run that did not finish runs again (now told not to fail); its cut rows are kept aside
    calls = []
    real = rg._run_job

    def spy(job, *a, **k):
        calls.append(job.name)
        job.params["fail"] = 0
        return real(job, *a, **k)

    monkeypatch.setattr(rg, "_run_job", spy)
    rg.run_set(saved, 0, 300, echo=lambda *a: None)
    assert calls == ["99_fast-fails"] and not saved.missing()
    assert list((out / "results").glob("99_fast-fails.cut-*.csv"))

    # a set from a tree with uncommitted changes is never published
    saved.commit = "abc1234+dirty"
    with pytest.raises(InputError, match="not one clean commit"):
        rg.publish_set(saved, folder, store=store, notes=None, echo=lambda *a: None)
    saved.commit = "abc1234"
    from wmbook import results, runtimes

    repo = runtimes.times_path(results.default_path())
    repo_times = repo.read_bytes() if repo.exists() else None
    written = rg.publish_set(saved, folder, store=store, notes=None, echo=lambda *a: None)
    t = json.loads((folder / rg.GPU_TIME_FILE).read_text())
    assert set(t["seconds"]) == {"99_fast-default", "99_fast-fails"} and t["total_seconds"] > 0
    assert (folder / "index.html") in written and "GPU time of this set" in (folder / "index.html").read_text()
    assert store.exists()  # the rows of both runs joined the store
    times = runtimes.read(runtimes.times_path(store))  # and their times the store's times file
    assert len(times) == 2 and all(t["seconds"] > 0 and t["notebook"] == "t" for t in times)
    assert (repo.read_bytes() if repo.exists() else None) == repo_times  # never the repository's store


def test_a_set_started_at_another_commit_is_refused(tmp_path, monkeypatch):
    out = tmp_path / "set"
    rg.SetState(out, "0000000", "CPU", 1, [rg.Job("a", "a", "a.ipynb", {})]).save()
    monkeypatch.setattr(rg, "git_commit", lambda: "1111111")  # the real one is cached for the process
    with pytest.raises(SystemExit):
        rg.main(["--out", str(out)])


def test_a_set_is_finished_on_the_device_it_started_on(tmp_path, monkeypatch, capsys):
    out = tmp_path / "set"
    rg.SetState(out, "1111111", "NVIDIA H200", 2, [rg.Job("a", "a", "a.ipynb", {})]).save()
    monkeypatch.setattr(rg, "git_commit", lambda: "1111111")  # the real one is cached for the process
    with pytest.raises(SystemExit):  # this host is a CPU
        rg.main(["--out", str(out)])
    assert "ran on NVIDIA H200; this host has CPU" in capsys.readouterr().err
    done = rg.SetState(out, "1111111", "NVIDIA H200", 2, [rg.Job("a", "a", "a.ipynb", {}, status="ok", seconds=5)])
    done.save()  # a complete set resumes anywhere (nothing to run: publishing it here)
    assert rg.main(["--out", str(out)]) == 0


def test_a_run_the_host_cannot_make_is_planned_as_such_and_keeps_the_set_unpublished(tmp_path, monkeypatch):
    import wmbook.runconfig as rc
    from wmbook.params import ParameterError

    real = rc.notebook_parameters

    def one_gpu_host(paths, params, workloads=None):  # notebook 08's stage split on a host of one GPU
        if workloads == ["mg2"] and "08" in str(paths[0]):
            raise ParameterError("nproc=2 needs 2 GPUs (one per rank); this host has 1")
        return real(paths, params, workloads)

    monkeypatch.setattr(rc, "notebook_parameters", one_gpu_host)
    jobs = rg.plan(["08"])
    assert [(j.name, j.status) for j in jobs] == [("08_multi_gpu-mg2", rg.CANNOT), ("08_multi_gpu-wma", "pending")]
    assert "2 GPUs" in jobs[0].error
    jobs = jobs[:1]
    state = rg.SetState(tmp_path / "set", "abc1234", "CPU", 1, jobs)
    rg.run_set(state, 0, 60, echo=lambda *a: None)  # nothing it can run
    with pytest.raises(InputError, match="08_multi_gpu-mg2 .cannot run on this host: nproc=2 needs 2 GPUs"):
        rg.publish_set(state, tmp_path / "pub", store=tmp_path / "s.csv", notes=None, echo=lambda *a: None)


def test_the_plan_of_a_new_set_on_one_gpu_leaves_its_all_gpu_runs_out(tmp_path, monkeypatch, capsys):
    """--plan of a set not started yet, on a GPU host of one: notebook 08 is said to wait for a host of two, not
    planned after the queues."""
    jobs = [rg.Job("one", "01", "n.ipynb", {}), rg.Job("every", "08", "n.ipynb", {}, gpus="all")]
    monkeypatch.setattr(rg, "_device", lambda: ("NVIDIA H200", 1))
    monkeypatch.setattr(rg, "plan", lambda *a, **k: [rg.Job(**vars(j)) for j in jobs])
    assert rg.main(["--out", str(tmp_path / "set"), "--plan", "--allow-dirty"]) == 0
    said = capsys.readouterr().out
    assert "this host has 1 GPUs: the all-GPU runs wait for a host of 2 or more" in said, said
    assert [ln.split()[:2] for ln in said.splitlines() if "expected" in ln and ln.startswith("  ")] == [
        ["q0", "one"], ["all", "every"]]
    assert "every  {}  expected 10.0 min, waits for a host of more GPUs" in said, said  # not given a start


def test_a_time_limit_starts_only_runs_that_fit_and_cuts_one_still_going(tmp_path, monkeypatch):
    import time

    nb = _notebook(tmp_path)
    monkeypatch.setattr(rg, "STOP_GRACE_S", 20.0)
    monkeypatch.setattr(rg.set_schedule, "START_MARGIN", (1.0, 0.0))  # a seconds-long limit: no margin
    jobs = [rg.Job("slow", "99_fast", str(nb), {"sleep": 600}), rg.Job("long", "99_fast", str(nb), {}),
            rg.Job("short", "99_fast", str(nb), {})]
    rg.deal(jobs, 1, {})
    state = rg.SetState(tmp_path / "set", "abc1234", "CPU", 1, jobs)
    lines = []
    t0 = time.monotonic()
    rg.run_set(state, 0, 3600, echo=lines.append, deadline=t0 + 15, minutes={"slow": 0.1, "long": 60, "short": 0.1})
    took = time.monotonic() - t0
    st = {j.name: (j.status, j.error) for j in state.jobs}
    assert st["slow"][0] == "failed" and st["slow"][1].startswith("cut at the set's time limit"), st
    assert state.jobs[0].cut_after_s >= 14  # it needs longer than it ran: expected_minutes says so on resume
    assert st["long"] == ("pending", "") and any("long: not started (expected 60 min" in ln for ln in lines)
    assert st["short"] == ("pending", "")  # the cut run used the time up
    assert took < 15 + 20 + 15, took  # stopped as Ctrl-C stops it: the runner ended its kernel and went
    assert rg.SetState.load(tmp_path / "set").missing() == state.jobs  # all three run again on resume


def test_a_run_cut_before_is_expected_to_take_at_least_as_long_as_it_ran(tmp_path):
    """A run a limit cut after 25 minutes is not started again with 20 minutes left, though its earlier time says 10
    (the set's file keeps how long it ran); the run that fits goes."""
    import time

    nb = _notebook(tmp_path)
    jobs = [rg.Job("cut", "99_fast", str(nb), {}, status="failed", cut_after_s=25 * 60),
            rg.Job("short", "99_fast", str(nb), {})]
    assert rg.expected_minutes(jobs[0], {"cut": 10}) == 25 and rg.expected_minutes(jobs[0], {"cut": 40}) == 40
    assert rg.expected_minutes(jobs[1], {}) == rg.DEFAULT_MINUTES
    state = rg.SetState(tmp_path / "set", "abc1234", "CPU", 1, jobs)
    lines = []
    rg.run_set(state, 0, 3600, echo=lines.append, deadline=time.monotonic() + 20 * 60,
               minutes={"cut": 10, "short": 0.1})
    assert any("cut: not started (expected 25 min; cut after 25 min before, 20 min left" in ln for ln in lines), lines
    assert [j.status for j in state.jobs] == ["failed", "ok"]
    assert rg.SetState.load(tmp_path / "set").jobs[0].cut_after_s == 25 * 60


def test_a_run_that_would_just_fit_is_not_started_without_its_margin(tmp_path):
    """Expected 5 minutes with 5.2 left: its report and a cold cache would take it past the limit, so it waits."""
    import time

    nb = _notebook(tmp_path)
    jobs = [rg.Job("tight", "99_fast", str(nb), {}), rg.Job("short", "99_fast", str(nb), {})]
    state = rg.SetState(tmp_path / "set", "abc1234", "CPU", 1, jobs)
    lines = []
    rg.run_set(state, 0, 3600, echo=lines.append, deadline=time.monotonic() + 5.2 * 60,
               minutes={"tight": 5.0, "short": 0.1})
    assert any("tight: not started (expected 5 min, 5 min left before the time limit; a run starts with 35% and 30 s"
               in ln for ln in lines), lines
    assert [j.status for j in state.jobs] == ["pending", "ok"]


def test_a_run_no_slice_would_start_with_its_margin_starts_first_on_a_fresh_queue(capsys):
    """A 20-minute run in 24-minute slices needs 27.5 with its margin: it would never start. It starts where a queue
    has run nothing yet in the slice and it fits at all; after a run, or without the room, it waits as before."""
    m = 60.0
    assert rg.starts_without_margin(20 * m, 24 * m, 24 * m) and rg.starts_in_time(20 * m, 24 * m, 24 * m)
    assert not rg.starts_in_time(20 * m, 24 * m)  # not on a queue that has run something
    assert not rg.starts_without_margin(17 * m, 24 * m, 24 * m)  # 17 x 1.35 + 0.5 = 23.45: the margin rule's
    assert rg.starts_in_time(17 * m, 24 * m, 24 * m)
    assert not rg.starts_in_time(24 * m, 24 * m, 24 * m)  # no room for the kernel's start and the report
    assert not rg.starts_without_margin(20 * m, 24 * m, None)

    jobs = [rg.Job("long", "06", "n.ipynb", {}), rg.Job("other", "05", "n.ipynb", {}),
            rg.Job("small", "01", "n.ipynb", {})]
    minutes = {"long": 20.0, "other": 19.0, "small": 1.0}
    assert rg.simulate(jobs, 1, minutes, 24) == {"long": (0, 0.0), "other": None, "small": (0, 20.0)}
    assert rg.simulate(jobs, 2, minutes, 24) == {"long": (0, 0.0), "other": (1, 0.0), "small": (1, 19.0)}
    every = [rg.Job("every", "08", "n.ipynb", {}, gpus="all")]  # an all-GPU run: fresh while no queue started one
    assert rg.simulate(every, 1, {"every": 20.0}, 24) == {"every": (None, 0.0)}
    assert rg.simulate([jobs[2], *every], 1, {"small": 1.0, "every": 20.0}, 24) == {"small": (0, 0.0), "every": None}
    rg.set_schedule.print_plan(jobs, 1, minutes, 24)  # --plan says which start so
    said = [ln for ln in capsys.readouterr().out.splitlines() if "without the margin" in ln]
    assert len(said) == 1 and "long" in said[0] and "at 0.0 min (without the margin: the first of its queue)" in said[0]


def test_run_set_starts_the_run_that_needs_a_fresh_queue_first_and_says_so(tmp_path, monkeypatch):
    import time

    nb = _notebook(tmp_path)
    monkeypatch.setattr(rg.set_schedule, "START_MARGIN", (2.0, 0.0))  # a margin of 2x, no seconds
    jobs = [rg.Job("first", "99_fast", str(nb), {}), rg.Job("later", "99_fast", str(nb), {}),
            rg.Job("short", "99_fast", str(nb), {})]
    state = rg.SetState(tmp_path / "set", "abc1234", "CPU", 1, jobs)
    lines = []
    # 8-minute runs in a 10-minute slice would need 16 with the margin; the runs themselves take seconds
    rg.run_set(state, 0, 3600, echo=lines.append, deadline=time.monotonic() + 10 * 60,
               minutes={"first": 8.0, "later": 8.0, "short": 0.1})
    assert any("first: starts without the margin (expected 8 min, 10 min left): no slice of 10 min would start it"
               in ln for ln in lines), lines
    assert any("later: not started" in ln for ln in lines), lines  # the queue has run one: the margin holds
    assert [j.status for j in state.jobs] == ["ok", "pending", "ok"]


def test_a_first_set_is_dealt_by_the_times_its_runs_took_on_the_device_before():
    from wmbook import runtimes

    jobs = rg.plan(["06"], ["mg2", "wma"])
    got = rg.recorded_minutes(jobs, "NVIDIA H200")
    assert got  # the store records notebook 06's runs on the H200
    for j in jobs:
        w = j.params["workload"]
        rec = runtimes.expected("06_cuda_graphs", w, "mg2-universal" if w == "mg2" else "wma", "NVIDIA H200")
        assert (got.get(j.name) is None) == (rec is None) and (rec is None or got[j.name] == rec[0] / 60)
    assert rg.recorded_minutes(jobs, "a device never seen") == {}
    (dp,) = rg.plan(["08"], ["wma"])  # on every GPU: by the runs on as many, at the notebook's defaults
    for n in (2, 4):
        rec = runtimes.expected("08_multi_gpu", "wma", "wma", "NVIDIA H200", gpus=n)
        assert rg.recorded_minutes([dp], "NVIDIA H200", n).get(dp.name) == (rec and rec[0] / 60)


def test_a_time_recorded_on_a_faster_host_core_is_expected_to_take_longer_here(tmp_path, monkeypatch, capsys):
    """A launch-bound notebook follows the host core that launches its kernels (02 at mg2 took 1.5x as long on an H200
    host whose core ran the fixed loop 1.6x slower): a run recorded on a faster core is expected to take longer by the
    cores' ratio (at most PACE_MAX), one recorded on a slower core or with no core recorded as recorded, and the plan
    says this host's core and the runs it lengthens."""
    from wmbook import runtimes

    assert rg.set_schedule.host_pace(2000, 1000) == 2.0 and rg.set_schedule.host_pace(900, 1000) == 1.0
    assert rg.set_schedule.host_pace(9000, 1000) == rg.set_schedule.PACE_MAX
    assert rg.set_schedule.host_pace(None, 1000) == rg.set_schedule.host_pace(2000, None) == 1.0
    store = tmp_path / "store" / "results.csv"
    monkeypatch.setenv("WMBOOK_RESULTS", str(store))
    monkeypatch.setattr(rg, "core_loop_median", lambda: 2400.0)
    key = {"device_name": "NVIDIA H200", "git_commit": "abc1234"}
    runtimes.record(store, notebook="01_baseline_profiling", workload="mg2", preset="mg2-universal", run_id="fast",
                    seconds=120, host_core_loop_us="1200", **key)  # a core twice as fast: 4 minutes here
    runtimes.record(store, notebook="01_baseline_profiling", workload="wma", preset="wma", run_id="old", seconds=120,
                    **key)  # no core recorded: as recorded
    runtimes.record(store, notebook="02_bottleneck_breakdown", workload="mg2", preset="mg2-universal", run_id="slow",
                    seconds=120, host_core_loop_us="3000", **key)  # a slower core: as recorded
    jobs = rg.plan(["01", "02"], ["mg2", "wma"])
    paces = {}
    got = rg.recorded_minutes(jobs, "NVIDIA H200", core_now=2400.0, paces=paces)
    assert got["01_baseline_profiling-mg2"] == pytest.approx(4.0) and paces == {"01_baseline_profiling-mg2": 2.0}
    assert got["01_baseline_profiling-wma"] == got["02_bottleneck_breakdown-mg2"] == pytest.approx(2.0)
    assert rg.recorded_minutes(jobs, "NVIDIA H200") == rg.recorded_minutes(jobs, "NVIDIA H200", core_now=None)
    assert rg.recorded_minutes(jobs, "NVIDIA H200")["01_baseline_profiling-mg2"] == pytest.approx(2.0)
    # the published set's times (gpu_time.json) carry their runs' cores as well
    pub = tmp_path / "pub"
    pub.mkdir()
    (pub / rg.GPU_TIME_FILE).write_text(json.dumps({"seconds": {"a": 60.0, "b": 60.0},
                                                    "host_core_loop_us": {"a": 800}}))
    paces = {}
    assert rg.earlier_minutes(tmp_path / "none", pub, 2400.0, paces) == {"a": 3.0, "b": 1.0} and paces == {"a": 3.0}

    # the plan of a new set on this host: 01 mg2 is 4 minutes here and goes first within 7 minutes; 01 wma (2) no
    # longer fits after it (2 x 1.35 + 0.5 = 3.2 > 3); --expect, given for this host, is taken as given
    out = tmp_path / "set"
    monkeypatch.setattr(rg, "_device", lambda: ("NVIDIA H200", 1))
    assert rg.main(["--out", str(out), "--notebooks", "01", "--workloads", "mg2,wma", "--plan", "--time-limit", "7",
                    "--allow-dirty"]) == 0
    said = capsys.readouterr().out
    assert ("this host's core: 2,400 us for the fixed loop of wmbook.hostload; expected longer here than on the "
            "faster cores their times were recorded on: 01_baseline_profiling-mg2 x2.0") in said, said
    assert "expected minutes per queue: 6" in said and said.count("not started within the limit") == 1, said
    assert rg.main(["--out", str(out), "--notebooks", "01", "--workloads", "mg2,wma", "--plan", "--time-limit", "7",
                    "--allow-dirty", "--expect", "01_baseline_profiling-mg2=2"]) == 0
    said = capsys.readouterr().out
    assert "this host's core: 2,400 us for the fixed loop of wmbook.hostload\n" in said, said
    assert "not started within the limit" not in said, said


def test_a_run_starts_once_the_runs_it_builds_on_have_ended_and_the_longest_ready_run_goes_first(tmp_path,
                                                                                                   monkeypatch):
    import threading
    import time

    seen, lock = {}, threading.Lock()

    def fake_run(job, out, gpu, cpus, commit, limit, **kw):  # the scheduling alone: each run takes 0.3 s
        with lock:
            seen[job.name] = [time.monotonic(), None]
        time.sleep(0.3)
        with lock:
            seen[job.name][1] = time.monotonic()
        job.status, job.seconds = "ok", 0.3

    monkeypatch.setattr(rg, "_run_job", fake_run)
    jobs = [rg.Job("04-w", "x", "x", {}), rg.Job("06-w", "x", "x", {}, after=["04-w"]), rg.Job("01-w", "x", "x", {}),
            rg.Job("02-w", "x", "x", {})]
    rg.deal(jobs, 2, {})
    state = rg.SetState(tmp_path / "set", "abc1234", "CPU", 2, jobs)
    # 06-w is the longest but waits for 04-w (the longest ready one); the other queue takes 01-w meanwhile
    rg.run_set(state, 0, 600, echo=lambda *a: None, minutes={"06-w": 30, "04-w": 2, "01-w": 1.5, "02-w": 1})
    assert [j.status for j in jobs] == ["ok"] * 4
    assert seen["06-w"][0] >= seen["04-w"][1]
    assert seen["01-w"][0] < seen["04-w"][1]  # ran beside 04-w
    # in the plan: 06 after 04 and 05 of the same workload (a plan without them: nothing to wait for)
    assert rg.plan(["04", "05", "06"], ["wma"])[2].after == ["04_compile_autocast-wma", "05_triton_kernels-wma"]
    assert rg.plan(["06"], ["wma"])[0].after == []


def test_a_run_the_first_host_could_not_make_is_checked_again_where_the_set_resumes(monkeypatch):
    """Notebook 08 planned on a host of too few GPUs: on resume (a host of the same device) it is checked again, and
    runs when this host can make it; otherwise it keeps this host's reason."""
    import wmbook.runconfig as rc
    from wmbook.params import ParameterError

    real = rc.notebook_parameters
    gpus = {"n": 1}

    def host(paths, params, workloads=None):
        if "08" in str(paths[0]) and gpus["n"] < 2:
            raise ParameterError(f"nproc=2 needs 2 GPUs (one per rank); this host has {gpus['n']}")
        return real(paths, params, workloads)

    monkeypatch.setattr(rc, "notebook_parameters", host)
    jobs = rg.plan(["08"], ["mg2"])
    assert [j.status for j in jobs] == [rg.CANNOT]
    assert rg.recheck_cannot(jobs) == [] and "this host has 1" in jobs[0].error
    gpus["n"] = 2
    assert rg.recheck_cannot(jobs) == jobs
    assert jobs[0].status == "pending" and not jobs[0].error and jobs[0].params["workload"] == "mg2"


def test_a_complete_set_published_elsewhere_keeps_the_queues_its_runs_were_made_on(tmp_path, monkeypatch, capsys):
    out = tmp_path / "set"
    jobs = [rg.Job("a", "a", "a.ipynb", {}, queue=0, status="ok", seconds=60),
            rg.Job("b", "b", "b.ipynb", {}, queue=1, status="ok", seconds=120)]
    rg.SetState(out, "1111111", "NVIDIA H200", 2, jobs).save()
    monkeypatch.setattr(rg, "git_commit", lambda: "1111111")  # the real one is cached for the process
    assert rg.main(["--out", str(out)]) == 0  # on this CPU host: nothing to run
    assert "wall 2.0 minutes" in capsys.readouterr().out  # the longer of the set's two queues, not one queue's


def test_an_unfinished_set_is_finished_only_from_its_own_commit(tmp_path, monkeypatch, capsys):
    out = tmp_path / "set"
    jobs = [rg.Job("a", "a", "a.ipynb", {}, queue=0, status="ok", seconds=60), rg.Job("b", "b", "b.ipynb", {})]
    rg.SetState(out, "1111111", "CPU", 1, jobs).save()
    monkeypatch.setattr(rg, "git_commit", lambda: "2222222")
    with pytest.raises(SystemExit):
        rg.main(["--out", str(out)])
    assert "finish it from a tree at that commit" in capsys.readouterr().err
    # with only a run its host could not make left, another tree may publish it, but makes no run for it
    jobs[1].status, jobs[1].source, jobs[1].error = rg.CANNOT, str(tmp_path / "gone.ipynb"), "nproc=2 needs 2 GPUs"
    rg.SetState(out, "1111111", "CPU", 1, jobs).save()
    assert rg.main(["--out", str(out)]) == 1
    assert rg.SetState.load(out).jobs[1].status == rg.CANNOT
    assert "joined and published by this tree, at 2222222" in capsys.readouterr().out


def test_parts_of_a_set_made_on_two_machines_are_merged_and_published_as_one(tmp_path, monkeypatch, capsys):
    """A set cut to fit two allocations: each machine ran some runs into its own --out; --merge joins them (reports,
    rows, logs, times) into one folder, which publishes once complete. Its wall clock is each part's, summed."""
    nb = _notebook(tmp_path)

    def part(name, run):
        jobs = [rg.Job("one", "99_fast", str(nb), {}), rg.Job("two", "99_fast", str(nb), {})]
        state = rg.SetState(tmp_path / name, "abc1234", "CPU", 1, jobs)
        for j in jobs:
            if j.name == run:
                rg._run_job(j, state.out, None, None, state.commit, 300)
                j.queue, j.part = 0, name
            else:  # left for the other machine: cut at this one's time limit
                j.status, j.cut_after_s, j.error = "failed", 90.0, "cut at the set's time limit after 1.5 min"
        state.save()
        return state.out

    a, b = part("a", "one"), part("b", "two")
    monkeypatch.setattr(rg, "git_commit", lambda: "abc1234")  # the real one is cached for the process
    merged = tmp_path / "merged"
    assert rg.main(["--out", str(merged), "--merge", str(a)]) == 1  # half a set: "two" still to run
    assert "1 runs joined" in capsys.readouterr().out
    two = rg.SetState.load(merged).jobs[1]  # the next part plans the cut run at least as long as it ran
    assert (two.status, two.cut_after_s) == ("failed", 90.0) and rg.expected_minutes(two, {"two": 1.0}) == 1.5
    # a later tree may join and publish (it runs nothing): the runs stay the set's commit's, and it says so
    monkeypatch.setattr(rg, "git_commit", lambda: "def5678")
    assert rg.main(["--out", str(merged), "--merge", str(b), "--merge", str(a)]) == 0  # "one" is not taken twice
    assert "runs are of commit abc1234; joined and published by this tree, at def5678" in capsys.readouterr().out
    state = rg.SetState.load(merged)
    assert not state.missing() and {j.part for j in state.jobs} == {"a", "b"}
    for name in ("one", "two"):
        assert (merged / "runs" / name / "executed").is_dir() and (merged / "results" / f"{name}.csv").exists()
    from wmbook import runtimes

    assert len(runtimes.read(merged / "results" / runtimes.TIMES_FILE)) == 2
    t = rg.gpu_time(state)
    assert t["wall_seconds"] == pytest.approx(sum(j.seconds for j in state.jobs), abs=0.2)  # two parts, one queue each
    import shutil

    for gone in (a, b):  # the parts' folders stay on the machines that made them: rows are read from the set's own
        shutil.copytree(gone, tmp_path / f"kept-{gone.name}")
        shutil.rmtree(gone)
    from wmbook import headlines
    from wmbook.rows import Findings

    monkeypatch.setattr(headlines, "findings", lambda df: Findings("the headline", "the goal", "what next")
                        if df is not None and len(df) else None)
    written = rg.publish_set(state, tmp_path / "pub", store=tmp_path / "s.csv", notes=None, echo=lambda *a: None)
    assert (tmp_path / "pub" / rg.GPU_TIME_FILE) in written
    assert (tmp_path / "pub" / "99_fast-tiny.html") in written  # the reports too, named by their rows' preset
    assert "the headline" in (tmp_path / "pub" / "99_fast-tiny.html").read_text()  # findings from the set's store
    from wmbook import published_set
    from wmbook.paths import REPO_ROOT

    notes = tmp_path / "NOTES.md"  # the set's entry names the tree that published it where it is not the set's
    notes.write_text("# Run notes\n\n- **an earlier entry**\n")
    published_set._note(notes, state, REPO_ROOT / "data" / "reports" / "h200", t, tree="def5678")
    entry = notes.read_text().split("\n- **")[1]
    assert entry.split(",")[1] == " commit abc1234" and "joined and published by the tree at commit def5678" in entry

    # into a device's folder, a set of fewer runs than the whole set (--notebooks, --workloads, -p) publishes its
    # reports and rows but writes no GPU time of the set, and its NOTES entry gives no verdict on the set's goal
    from wmbook import published

    dev = tmp_path / "dev"
    monkeypatch.setitem(published.FOLDER_PAGES, dev, "CPU")
    monkeypatch.setattr(published, "check_folder_device", lambda *a: None)  # a CPU's name: any vendor's
    with pytest.raises(ValueError, match="whole set's plan"):
        rg.publish_set(state, dev, store=tmp_path / "d.csv", notes=None, echo=lambda *a: None)
    assert not dev.exists() and not (tmp_path / "d.csv").exists()
    whole = [rg.Job(n, "99_fast", str(nb), {}) for n in ("one", "two", "three")]
    written = rg.publish_set(state, dev, store=tmp_path / "d.csv", notes=None, echo=lambda *a: None, whole=whole)
    assert (dev / "99_fast-tiny.html") in written and (dev / "index.html") in written
    assert not (dev / rg.GPU_TIME_FILE).exists() and "GPU time of this set" not in (dev / "index.html").read_text()
    assert published_set.whole_set_lacks(state, whole) == ["three"]
    assert published_set.whole_set_lacks(state, [rg.Job("one", "99_fast", str(nb), {"repeats": 2})]) == ["one"]
    published_set._note(notes, state, REPO_ROOT / "data" / "reports" / "h200", t, lacks=["three"])
    entry = notes.read_text().split("\n- **")[1]
    assert "2 runs of the published set regenerated** (not the whole set: 1 of its runs not among them" in entry
    assert "GPU time of these runs" in entry and "goal" not in entry
    rg.publish_set(state, dev, store=tmp_path / "d.csv", notes=None, echo=lambda *a: None, whole=whole[:2])
    assert json.loads((dev / rg.GPU_TIME_FILE).read_text())["total_seconds"] == t["total_seconds"]
    for gone in (a, b):
        shutil.move(tmp_path / f"kept-{gone.name}", gone)

    # a part of another commit, or with a run the plan does not have, is refused before anything is copied
    other = rg.SetState.load(b)
    other.commit = "fff0000"
    other.save()
    before = (merged / rg.SET_FILE).read_text()
    assert rg.main(["--out", str(merged), "--merge", str(b)]) == 2
    assert "ran at commit fff0000" in capsys.readouterr().err
    other.commit = "abc1234"
    other.jobs.append(rg.Job("three", "99_fast", str(nb), {}, status="ok"))
    other.save()
    assert rg.main(["--out", str(merged), "--merge", str(b)]) == 2
    assert "['three'] are not in this set's plan" in capsys.readouterr().err
    assert (merged / rg.SET_FILE).read_text() == before


LINGER = """
import datetime as dt, json, pathlib, sys, time
folder = pathlib.Path(sys.argv[1]); folder.mkdir(parents=True, exist_ok=True)
now = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
meta = {"started": now} | ({"finished": now} if sys.argv[2] == "done" else {})
status = "ok" if sys.argv[2] == "done" else sys.argv[2]
(folder / "summary.json").write_text(json.dumps({"meta": meta, "notebooks": [{"name": "n", "status": status}]}))
time.sleep(600)  # its exit held up past the limit (a slow teardown)
"""


@pytest.mark.parametrize("summary, status", [("done", "ok"), ("pending", "failed"), ("stale", "failed")])
def test_a_run_stopped_at_the_limit_after_its_report_was_complete_counts(tmp_path, monkeypatch, summary, status):
    """A run that rendered its last report before the limit and was stopped in its exit made everything the set
    needs: it counts (a run of notebook 01 was cut two seconds after its summary said finished). A run whose
    summary is unfinished, or complete but older than the run (an earlier attempt's), was cut."""
    import sys
    import time

    monkeypatch.setattr(rg, "STOP_GRACE_S", 1.5)  # under xdist it did not end on SIGINT: killed after the grace
    folder = tmp_path / "set" / "runs" / "r"
    if summary == "stale":
        folder.mkdir(parents=True)
        old = "2020-01-01T00:00:00+00:00"
        (folder / "summary.json").write_text(json.dumps(
            {"meta": {"started": old, "finished": old}, "notebooks": [{"name": "n", "status": "ok"}]}))
    arg = "pending" if summary == "stale" else summary

    def command(job, f, store):
        return [sys.executable, "-c", LINGER, str(f), arg] if summary != "stale" else [
            sys.executable, "-c", "import time; time.sleep(600)"]

    monkeypatch.setattr(rg, "_command", command)
    job = rg.Job("r", "01_baseline_profiling", "x.ipynb", {})
    t0 = time.monotonic()
    # a limit of 1.5 s: time enough for the lingering run (a bare interpreter, no heavy imports) to write its summary
    rg._run_job(job, tmp_path / "set", None, None, "abc1234", 1.5, stopped_by="cut at the set's time limit")
    assert time.monotonic() - t0 < 1.5 + 1.5 + 5
    assert job.status == status, job.error
    assert (job.error == "") == (status == "ok")
    assert (job.cut_after_s > 0) == (status == "failed")


def test_a_set_started_on_two_gpus_makes_its_all_gpu_runs_on_no_fewer(tmp_path):
    """A set started on a host of two GPUs and resumed on one runs its single-GPU runs there, but not notebook 08's
    (every GPU of the host: on one it would study one GPU); they stay pending for a host of two or more, and the
    number is kept in set.json."""
    nb = _notebook(tmp_path)
    jobs = [rg.Job("one", "99_fast", str(nb), {}), rg.Job("every", "99_fast", str(nb), {}, gpus="all")]
    state = rg.SetState(tmp_path / "set", "abc1234", "CPU", 1, jobs, host_gpus=2)
    state.save()
    assert rg.SetState.load(tmp_path / "set").host_gpus == 2
    lines = []
    rg.run_set(state, 1, 600, echo=lines.append)
    assert [j.status for j in state.jobs] == ["ok", "pending"]
    assert any("every: not started (it holds every GPU of its host to study several; this host has 1: it runs on "
               "a host of 2 or more)" in ln for ln in lines), lines
    old = json.loads((tmp_path / "set" / rg.SET_FILE).read_text())
    del old["host_gpus"]  # a set of a version that did not record it: no check
    (tmp_path / "set" / rg.SET_FILE).write_text(json.dumps(old))
    assert rg.SetState.load(tmp_path / "set").host_gpus is None


def test_a_set_started_on_one_gpu_leaves_its_all_gpu_runs_for_a_host_of_two(tmp_path):
    """Notebook 08 at a data-parallel workload takes any number of ranks, but on a GPU host of one it would compare one
    GPU with itself: a set started there leaves it for a host of MIN_ALL_GPUS or more (a CPU set runs it on
    processes)."""
    jobs = [rg.Job("every", "08", "n.ipynb", {}, gpus="all")]
    gpu_set = rg.SetState(tmp_path, "abc1234", "NVIDIA H200", 1, jobs, host_gpus=1)
    assert rg.MIN_ALL_GPUS == 2 and gpu_set.all_gpu_runs_need() == 2
    assert not gpu_set.makes_all_gpu_runs(1) and gpu_set.makes_all_gpu_runs(2)
    assert rg.SetState(tmp_path, "abc1234", "NVIDIA H200", 4, jobs, host_gpus=4).all_gpu_runs_need() == 4
    cpu_set = rg.SetState(tmp_path, "abc1234", "CPU", 1, jobs, host_gpus=0)
    assert cpu_set.makes_all_gpu_runs(0) and cpu_set.all_gpu_runs_need() == 0


def test_the_plan_of_a_set_follows_the_runs_it_waits_for_and_the_time_limit(tmp_path, capsys):
    """--plan on a folder that holds a set runs nothing and writes nothing: the runs still to make in the order a
    resume would start them (the longest ready first; one waits for the runs it builds on), and with --time-limit
    which of them would start within it by START_MARGIN's rule; another commit and device are named, not refused."""
    jobs = [rg.Job("done", "n", "n.ipynb", {}, status="ok", seconds=60),
            rg.Job("big", "06", "n.ipynb", {}, after=["mid"]), rg.Job("mid", "05", "n.ipynb", {}),
            rg.Job("small", "01", "n.ipynb", {}), rg.Job("every", "08", "n.ipynb", {}, gpus="all")]
    minutes = {"big": 8.0, "mid": 4.0, "small": 1.0, "every": 2.0}
    sim = rg.simulate(jobs, 1, minutes)
    assert sim == {"mid": (0, 0.0), "big": (0, 4.0), "small": (0, 12.0), "every": (None, 13.0)}
    assert rg.simulate(jobs, 2, minutes) == {"mid": (0, 0.0), "small": (1, 0.0), "big": (0, 4.0),
                                             "every": (None, 12.0)}
    # 12 minutes: `big` would need 8 x 1.35 + 0.5 = 11.3 with 8 left, so it is passed over and `small` goes
    assert rg.simulate(jobs, 1, minutes, 12) == {"mid": (0, 0.0), "big": None, "small": (0, 4.0), "every": (None, 5.0)}
    assert rg.simulate(jobs, 1, minutes, all_gpu=False)["every"] is None

    out = tmp_path / "set"
    rg.SetState(out, "1111111", "NVIDIA H200", 2, jobs, host_gpus=2).save()
    before = (out / rg.SET_FILE).read_text()
    assert rg.main(["--out", str(out), "--plan", "--time-limit", "14", "--allow-dirty"]) == 0
    said = capsys.readouterr().out
    assert (out / rg.SET_FILE).read_text() == before and not (out / "runs").exists()
    assert "1 of 5 runs done" in said and "the set is finished from a tree at 1111111" in said
    assert "the set is finished on a host of NVIDIA H200" in said
    assert "the all-GPU runs wait for a host of 2 or more" in said
    # no times recorded for these runs: each is expected to take DEFAULT_MINUTES, so only the first fits in 14
    lines = [ln.split()[:2] for ln in said.splitlines() if ln.startswith("  ") and "expected" in ln]
    assert lines == [["q0", "mid"], ["--", "big"], ["--", "small"], ["all", "every"]], said
    assert said.count("not started within the limit") == 2 and "every  {}  expected 10.0 min, waits for a host" in said


def test_expect_replaces_a_runs_recorded_time_in_the_plan_and_refuses_a_bad_value(tmp_path, capsys):
    """--expect RUN=MINUTES: the run is dealt and fitted into --time-limit by the given minutes instead of its
    recorded ones (here none: DEFAULT_MINUTES); a malformed value, or a run the set does not hold, is refused naming
    the option before anything runs."""
    jobs = [rg.Job("big", "06", "n.ipynb", {}), rg.Job("small", "01", "n.ipynb", {})]
    out = tmp_path / "set"
    rg.SetState(out, "1111111", "NVIDIA H200", 1, jobs, host_gpus=1).save()
    assert rg.main(["--out", str(out), "--plan", "--time-limit", "14", "--allow-dirty"]) == 0
    said = capsys.readouterr().out
    assert said.count("not started within the limit") == 1  # 10 + 10 expected: only one fits
    assert rg.main(["--out", str(out), "--plan", "--time-limit", "14", "--allow-dirty",
                    "--expect", "big=3", "--expect", "small=2"]) == 0
    said = capsys.readouterr().out
    assert "not started within the limit" not in said, said
    for bad in ("big", "big=", "big=-1", "big=nan", "=3", "big=x"):
        with pytest.raises(SystemExit):
            rg.main(["--out", str(out), "--plan", "--allow-dirty", "--expect", bad])
        assert "--expect=" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        rg.main(["--out", str(out), "--allow-dirty", "--expect", "bigg=3"])
    err = capsys.readouterr().err
    assert "--expect names ['bigg']" in err and "'big'" in err


def test_a_set_of_another_card_than_its_folder_is_refused_before_any_run_and_never_published(tmp_path, monkeypatch,
                                                                                                capsys):
    """A host may give another card than the one asked for (an H100 for an H200): --device-name, or a --publish folder
    of one device (data/reports/h200 holds H200 runs only), refuses such a set before any run or write; a set of the
    wrong device is refused at publishing, and so is a part joined for it."""
    from wmbook import published

    h200 = tmp_path / "h200"
    monkeypatch.setitem(published.FOLDER_PAGES, h200, "H200")
    monkeypatch.setattr(rg, "git_commit", lambda: "abc1234")  # the real one is cached for the process
    monkeypatch.setattr(rg, "_device", lambda: ("NVIDIA H100 80GB HBM3", 1))
    ran = []
    monkeypatch.setattr(rg, "run_set", lambda state, *a, **k: ran.append(state))
    out = tmp_path / "set"
    for args in (["--device-name", "H200"], ["--publish", str(h200)]):
        with pytest.raises(SystemExit):
            rg.main(["--out", str(out), "--notebooks", "01", *args])
        err = capsys.readouterr().err
        assert "this host has NVIDIA H100 80GB HBM3" in err and "has the word 'H200'" in err, err
        assert not out.exists() and not ran  # nothing planned, saved or run
    with pytest.raises(SystemExit):
        rg.main(["--out", str(out), "--device-name", " "])
    assert "--device-name=' ' is not allowed" in capsys.readouterr().err
    # a name the folder's device is not: both are asked for, so the H100 is refused for the H200's folder
    with pytest.raises(SystemExit):
        rg.main(["--out", str(out), "--notebooks", "01", "--device-name", "H100", "--publish", str(h200)])
    assert "--publish" in capsys.readouterr().err and not out.exists()
    # the card asked for (case aside), or no option: the set runs
    assert rg.main(["--out", str(out), "--notebooks", "01", "--device-name", "h100"]) == 1 and len(ran) == 1

    # --fresh on the wrong card leaves the earlier set where it was
    kept = tmp_path / "kept"
    rg.SetState(kept, "abc1234", "NVIDIA H200", 1, [rg.Job("a", "a", "a.ipynb", {})]).save()
    with pytest.raises(SystemExit):
        rg.main(["--out", str(kept), "--fresh", "--publish", str(h200)])
    assert "this host has NVIDIA H100 80GB HBM3" in capsys.readouterr().err
    assert (kept / rg.SET_FILE).exists() and not list(tmp_path.glob("kept.superseded-*"))

    # a set already started on the H100 is not finished, joined or published for the H200's folder
    with pytest.raises(SystemExit):
        rg.main(["--out", str(out), "--publish", str(h200)])
    assert f"{out} holds a set that ran on NVIDIA H100 80GB HBM3" in capsys.readouterr().err and len(ran) == 1
    with pytest.raises(SystemExit):
        rg.main(["--out", str(tmp_path / "joined"), "--merge", str(out), "--publish", str(h200)])
    assert "the set ran on NVIDIA H100 80GB HBM3" in capsys.readouterr().err
    assert not (tmp_path / "joined").exists()
    done = rg.SetState(tmp_path / "done", "abc1234", "NVIDIA H100 80GB HBM3", 1,
                       [rg.Job("a", "a", "a.ipynb", {}, status="ok", seconds=5)])
    with pytest.raises(InputError, match="the set ran on NVIDIA H100 80GB HBM3; folder=.*h200' holds the H200's"):
        rg.publish_set(done, h200, store=tmp_path / "store.csv", notes=None, echo=lambda *a: None)
    assert not h200.exists() and not (tmp_path / "store.csv").exists()


def test_a_resumed_set_refuses_notebooks_workloads_or_parameters_other_than_its_plan(tmp_path, capsys):
    """A set's plan is fixed when it starts: the command that started it resumes it, while --notebooks, --workloads
    or -p that plan other runs are refused naming the difference (they would otherwise be passed over in silence
    and the set's own plan run instead)."""
    out = tmp_path / "set"
    rg.SetState(out, "1111111", "NVIDIA H200", 1, rg.plan(["01", "07"]), host_gpus=1).save()
    before = (out / rg.SET_FILE).read_text()
    for same in ([], ["--notebooks", "01,07"], ["--notebooks", "07,01", "--workloads", "mg2,wma,motion"]):
        assert rg.main(["--out", str(out), "--plan", "--allow-dirty", *same]) == 0, same
    capsys.readouterr()
    for other, said in ((["--notebooks", "05"], "runs not in the set: ['05_triton_kernels-mg2'"),
                        (["--notebooks", "01"], "the set's runs left out: ['07_motion_data_loading-motion']"),
                        (["--notebooks", "01", "--workloads", "wma"], "left out: ['01_baseline_profiling-mg2'"),
                        (["--notebooks", "01,07", "-p", "repeats", "2"], "other parameters for: ['01_baseline")):
        for plan_only in (["--plan"], []):
            with pytest.raises(SystemExit):
                rg.main(["--out", str(out), "--allow-dirty", *plan_only, *other])
            err = capsys.readouterr().err
            assert "--notebooks/--workloads/-p" in err and said in err and "--fresh" in err, (other, err)
    assert (out / rg.SET_FILE).read_text() == before and not (out / "runs").exists()
