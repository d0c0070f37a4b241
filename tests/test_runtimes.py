"""How long a notebook takes (wmbook.runtimes): the runner records each finished run beside its results file, a
notebook says at its start what to expect, and `wmbook run --profile quick` runs each notebook's short parameters."""

from __future__ import annotations

import nbformat
import pytest

from wmbook import run as wmrun
from wmbook import runconfig, runtimes
from wmbook.hostload import HostLoad
from wmbook.params import ParameterError

KEY = {"notebook": "06_cuda_graphs", "workload": "wma", "preset": "wma", "device_name": "NVIDIA H200"}


def test_expected_is_the_median_of_the_latest_runs_of_that_notebook_device_profile_and_commit(tmp_path):
    store = tmp_path / "results.csv"
    assert runtimes.expected(**KEY, files=[runtimes.times_path(store)]) is None
    for i, s in enumerate([900, 100, 200, 300, 400, 500]):  # the oldest (900) falls out of the latest five
        runtimes.record(store, **KEY, run_id=f"r{i}", seconds=s, timestamp=f"2026-11-2{i}T00:00:00+00:00")
    runtimes.record(store, **KEY, run_id="r5", seconds=7000)  # a run id already there is not added again
    runtimes.record(store, **(KEY | {"device_name": "NVIDIA H100"}), run_id="h", seconds=5)
    runtimes.record(store, **KEY, run_id="q", seconds=60, profile="quick")
    files = [runtimes.times_path(store)]
    assert runtimes.expected(**KEY, files=files) == (300.0, 5)
    assert runtimes.expected(**KEY, profile="quick", files=files) == (60.0, 1)
    assert "about 5 minutes on NVIDIA H200" in runtimes.describe(**KEY, files=files)
    # a newer commit's runs are what to expect: the code moved the notebook's time, not the machine
    runtimes.record(store, **KEY, run_id="new", seconds=960, git_commit="83ba1ac9", timestamp="2026-11-30T00:00:00")
    assert runtimes.expected(**KEY, files=files) == (960.0, 1)
    assert runtimes.describe(**KEY, files=files).endswith("about 16 minutes on NVIDIA H200 (the last run at commit "
                                                          "83ba1ac)")
    assert "not known yet" in runtimes.describe(**(KEY | {"preset": "other"}), files=files)
    with pytest.raises(ValueError, match="profile"):
        runtimes.record(store, **KEY, run_id="x", seconds=1, profile="fast")
    with pytest.raises(ValueError, match="seconds"):
        runtimes.record(store, **KEY, run_id="x", seconds=0)


def test_an_expectation_says_the_host_core_its_runs_ran_on(tmp_path):
    """The median core loop of the runs an expectation is the median of (those that recorded one), in the notebook's
    words too: a launch-bound notebook's time follows its host's core."""
    store = tmp_path / "results.csv"
    files = [runtimes.times_path(store)]
    runtimes.record(store, **KEY, run_id="a", seconds=100, timestamp="2026-12-01T00:00:00")
    assert runtimes.expected_with_core(**KEY, files=files) == (100.0, 1, None)
    assert "host core" not in runtimes.describe(**KEY, files=files)
    for i, loop in enumerate(["1200", "2400", "bad"]):
        runtimes.record(store, **KEY, run_id=f"b{i}", seconds=100, host_core_loop_us=loop,
                        timestamp=f"2026-12-0{i + 2}T00:00:00")
    assert runtimes.expected_with_core(**KEY, files=files) == (100.0, 4, 1800.0)
    assert runtimes.describe(**KEY, files=files).endswith("(median of the last 4 runs; host core loop 1,800 us)")
    assert runtimes.expected_with_core(**(KEY | {"preset": "other"}), files=files) is None


def test_an_expectation_counts_the_runs_of_the_same_parameters_and_for_all_gpu_notebooks_as_many_gpus(tmp_path,
                                                                                                 monkeypatch):
    """Notebook 08 at wma on four GPUs at batch 1 took 6 minutes, its full sweep on two 16: only like counts like."""
    assert runtimes.params_key({"workload": "wma", "results_path": "r.csv", "output_dir": "o", "preset": "wma"}) == ""
    assert runtimes.params_key({"repeats": 3, "batches": "1", "e2e": True}) == "batches=1; e2e=true; repeats=3"
    assert runtimes.params_key({"repeats": 1, "batches": "1"}, {"repeats": 1}) == "batches=1"  # a profile's own
    store = tmp_path / "results.csv"
    key = KEY | {"notebook": "08_multi_gpu"}
    runtimes.record(store, **key, run_id="sweep", seconds=950, gpus=2, timestamp="2026-11-29T00:00:00")
    runtimes.record(store, **key, run_id="b1", seconds=374, gpus=4, params="batches=1",
                    timestamp="2026-11-30T00:00:00")
    files = [runtimes.times_path(store)]
    assert runtimes.expected(**key, files=files) == (950.0, 1)  # the defaults' run, though older
    assert runtimes.expected(**key, files=files, params="batches=1") == (374.0, 1)
    assert runtimes.expected(**key, files=files, gpus=2) == (950.0, 1)
    assert runtimes.expected(**key, files=files, gpus=4) is None
    assert "about 16 minutes" in runtimes.describe(**key, files=files)
    # a file of an older version (no params or gpus column) takes them on at its next line, its lines kept
    old = tmp_path / "old" / runtimes.TIMES_FILE
    old.parent.mkdir()
    old.write_text("timestamp,notebook,workload,preset,profile,device_name,git_commit,run_id,seconds\n"
                   "2026-11-28T00:00:00+00:00,06_cuda_graphs,wma,wma,full,NVIDIA H200,abc,r0,120.0\n")
    runtimes.record(old, **KEY, run_id="r1", seconds=60, params="repeats=1")
    assert old.read_text().splitlines()[0].endswith(",seconds,params,gpus," + ",".join(runtimes.HOST_FIELDS))
    assert [(r["run_id"], r["seconds"], r["params"]) for r in runtimes.read(old)] == [("r0", 120.0, ""),
                                                                                      ("r1", 60.0, "repeats=1")]
    assert runtimes.expected(**KEY, files=[old]) == (120.0, 1)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,-1,3")  # CUDA stops at an invalid id
    assert runtimes.visible_gpus() == 2
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert runtimes.visible_gpus() == 0


def test_quick_profile_parameters_under_the_given_ones():
    paths = wmrun.resolve_notebooks(["04", "06"])
    jobs = runconfig.notebook_parameters(paths, {"repeats": 7}, ["mg2"], "quick")
    p04, p06 = (p for _, _, p in jobs)
    assert p04["compile_table"] == "reference,hygiene" and p04["repeats"] == 7  # the given value wins
    # its time is recorded as a quick run given repeats=7: the profile's own parameters are not the run's
    assert runtimes.given_params(paths[0], p04, "quick") == "repeats=7"
    assert runtimes.given_params(paths[0], p04, "full").startswith("compile_table=reference,hygiene; ")
    assert p06["reduce_overhead"] is False and p06["e2e_repeats"] == 1
    assert runconfig.notebook_parameters(paths, {}, ["mg2"])[0][2] == {"workload": "mg2"}  # full: nothing added
    with pytest.raises(ParameterError, match="profile='fast'.*allowed values"):
        runconfig.notebook_parameters(paths, {}, ["mg2"], "fast")


def test_every_notebooks_quick_parameters_validate():
    from wmbook import studies

    for p in wmrun.resolve_notebooks(None):
        spec = studies.spec_for(p.stem)
        assert spec is not None and spec.quick, p.stem
        for wl in spec.workloads():
            runconfig.validate(spec, workload=wl.name, **spec.quick)


def test_the_parameters_table_says_what_to_expect(tmp_path, monkeypatch):
    from wmbook import paths, results
    from wmbook.studies import baseline

    # the tiny store's times (a `make report` before this test leaves some) are looked at too: an empty one here
    monkeypatch.setattr(paths, "TINY_RESULTS_PATH", tmp_path / "tiny" / "results-tiny.csv")
    cfg = baseline.validate(results_path=str(tmp_path / "results.csv"))
    assert "not known yet" in cfg.table().loc["expected run time", "value"]
    runtimes.record(cfg.results_path, notebook=cfg.notebook, workload=cfg.workload.name, preset=cfg.preset.name,
                    device_name=results.environment_metadata()["device_name"], run_id="a", seconds=42)
    assert cfg.table().loc["expected run time", "value"].startswith("about 42 s on ")
    # the host's core beside it: a launch-bound row of a slow host is told from slow code
    speed = cfg.table().loc["host core speed", "value"]
    assert speed.endswith(" us for the fixed loop of wmbook.hostload (lower is faster; launch-bound rows slow with it)")
    assert float(speed.split(" us ")[0].replace(",", "")) > 0


def _notebook(path, source):
    nb = nbformat.v4.new_notebook()
    params = nbformat.v4.new_code_cell("results_path = ''")
    params.metadata["tags"] = ["parameters"]
    nb.cells = [params, nbformat.v4.new_code_cell(source)]
    nb.metadata["kernelspec"] = {"name": "python3", "language": "python", "display_name": "Python 3"}
    nb.metadata["language_info"] = {"name": "python"}
    nbformat.write(nb, path)
    return path


ROWS = """from wmbook import results, display as wd
results.append([results.make_row(notebook="t", workload="w", preset="tiny", variant="v", metric="m", value=1.0,
                                 unit="ms", params={}, warmup=0, repeats=1, run_id="run1")], results_path)
wd.rows(results_path, "run1")"""


def test_the_runner_records_a_finished_run_and_the_quick_profile_keeps_the_store_clean(tmp_path, monkeypatch):
    from wmbook import paths

    monkeypatch.setattr(paths, "TINY_RESULTS_PATH", tmp_path / "tiny" / "results-tiny.csv")
    nb = _notebook(tmp_path / "nb_rows.ipynb", ROWS)
    store = tmp_path / "results.csv"
    (run,) = wmrun.run_notebooks([nb], out=tmp_path / "o", parameters={"results_path": str(store)},
                                 kernel_name="python3", progress=False)
    assert run.ok, run.error
    (line,) = runtimes.read(runtimes.times_path(store))
    assert line["run_id"] == "run1" and line["profile"] == "full" and line["seconds"] > 0
    assert line["params"] == ""  # where its rows go is no parameter of its work
    assert int(line["host_cores"]) >= 1 and float(line["host_other_cores"]) >= 0  # the host's CPUs while it ran
    assert float(line["host_busy_cores"]) <= int(line["host_cores"])
    # quick, no results_path given: its rows and time go into the report folder
    (run,) = wmrun.run_notebooks([nb], out=tmp_path / "q", kernel_name="python3", progress=False, profile="quick")
    assert run.ok, run.error
    assert (tmp_path / "q" / "results-quick.csv").is_file()
    assert runtimes.read(tmp_path / "q" / runtimes.TIMES_FILE)[0]["profile"] == "quick"
    assert runtimes.read(tmp_path / "q" / runtimes.TIMES_FILE)[0]["params"] == ""
    # and where the next quick run at a tiny preset looks (the preset's default store), not in the store's rows
    assert runtimes.read(tmp_path / "tiny" / runtimes.TIMES_FILE)[0]["profile"] == "quick"
    assert not (tmp_path / "tiny" / "results-tiny.csv").exists()


def test_compile_cache_folder_is_checked_before_anything_runs(tmp_path, capsys):
    from wmbook import cli

    f = tmp_path / "file"
    f.write_text("")
    assert cli.run_main(["01", "--compile-cache", str(f)]) == 2
    err = capsys.readouterr().err
    assert "compile-cache=" in err and "allowed values" in err
    env = runtimes.compile_cache_env(tmp_path / "c")
    assert env == {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "c" / "inductor"),
                   "TRITON_CACHE_DIR": str(tmp_path / "c" / "triton")}


def test_a_times_file_of_an_earlier_version_gains_the_host_columns_and_keeps_its_lines(tmp_path):
    """A file written before the host's CPU columns (HOST_FIELDS) is rewritten with them on the next record: its
    lines stay, their new columns empty."""
    path = tmp_path / runtimes.TIMES_FILE
    old = [f for f in runtimes.FIELDS if f not in runtimes.HOST_FIELDS]
    path.write_text(",".join(old) + "\n" + ",".join({"seconds": "12.5", "run_id": "old1", "notebook": "01_x",
                                                      "profile": "full"}.get(f, "") for f in old) + "\n")
    runtimes.record(tmp_path / "results.csv", notebook="01_x", run_id="new1", seconds=3.0,
                    **runtimes.host_fields(HostLoad(seconds=3.0, cores=16, busy_cores=15.0, own_cores=4.0,
                                                    steal_share=0.0)))
    lines = runtimes.read(path)
    assert [r["run_id"] for r in lines] == ["old1", "new1"] and lines[0]["seconds"] == 12.5
    assert lines[0]["host_other_cores"] == "" and lines[1]["host_other_cores"] == "11.0"
    assert lines[1]["host_cores"] == "16" and lines[1]["host_busy_cores"] == "15.0"
    assert lines[1]["host_core_loop_us"] == ""  # a HostLoad without the core's speed
    assert runtimes.host_fields(HostLoad(seconds=3.0, cores=16, busy_cores=1.0, own_cores=1.0, steal_share=0.0,
                                         core_loop_us=1210.6))["host_core_loop_us"] == "1211"
    assert runtimes.host_fields(None) == dict.fromkeys(runtimes.HOST_FIELDS, "")
