"""The papermill batch runner (wmbook.run); notebook hygiene is in test_notebook_sources.py.

Kernel start-up dominates: the module runs three notebook executions in all.
"""

from __future__ import annotations

import json
from pathlib import Path

import nbformat
import pytest

from wmbook import cli
from wmbook import run as wmrun

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(__file__).resolve().parent / "data"
NB_OK = DATA / "nb_ok.ipynb"
NB_FAIL = DATA / "nb_fail.ipynb"


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """One run of [nb_fail, nb_ok]: the failure comes first, the good notebook must still run."""
    tmp = tmp_path_factory.mktemp("report")
    marker = tmp / "x.txt"
    out = tmp / "out"
    runs = wmrun.run_notebooks(
        [NB_FAIL, NB_OK],
        out=out,
        parameters={"x": 7, "out_file": str(marker)},
        kernel_name="python3",
        progress=False,
    )
    return runs, out, marker


def test_ok_notebook_executed_with_parameter_override(report):
    runs, out, marker = report
    ok = runs[1]
    assert ok.name == "nb_ok" and ok.status == "ok", ok
    assert ok.error is None and ok.seconds > 0
    assert marker.read_text() == "7"  # -p x 7 reached the kernel
    executed = Path(ok.executed_path)
    assert executed == out / "executed" / "nb_ok.ipynb"
    nb = nbformat.read(executed, as_version=4)
    assert any("x = 7" in "".join(c.source) for c in nb.cells)  # papermill's injected cell
    html = Path(ok.html_path)
    assert html == out / "nb_ok.html"
    assert "<html" in html.read_text().lower()
    assert not list(out.rglob("*.tmp")) and not list(out.rglob(".*partial*"))


def test_failing_notebook_reported_with_cell(report):
    runs, out, _ = report
    bad = runs[0]
    assert bad.name == "nb_fail" and bad.status == "failed"
    assert "ValueError" in bad.error and "boom" in bad.error
    assert bad.failed_source.startswith('raise ValueError("boom")')
    # index in the source notebook (as in JupyterLab), not papermill's shifted one
    src = nbformat.read(NB_FAIL, as_version=4)
    assert 'raise ValueError("boom")' in src.cells[bad.failed_cell].source
    assert bad.failed_exec_count is not None
    # the executed notebook and its HTML are kept for failures too, named as failed
    assert Path(bad.executed_path) == out / "executed" / "nb_fail.FAILED.ipynb"
    assert Path(bad.html_path) == out / "nb_fail.FAILED.html"
    assert Path(bad.executed_path).is_file() and Path(bad.html_path).is_file()
    assert not (out / "nb_fail.html").exists() and not (out / "executed" / "nb_fail.ipynb").exists()
    summary = bad.failure_summary()
    assert "nb_fail" in summary and "boom" in summary and "raise ValueError" in summary


def test_index_and_summary_written(report):
    runs, out, _ = report
    index = (out / "index.html").read_text()
    for name, file in (("nb_ok", "nb_ok"), ("nb_fail", "nb_fail.FAILED")):
        assert name in index
        assert f'href="{file}.html"' in index
        assert f'href="executed/{file}.ipynb"' in index
    assert "failed" in index and "boom" in index
    summary = json.loads((out / "summary.json").read_text())
    assert [n["status"] for n in summary["notebooks"]] == ["failed", "ok"]
    for n in summary["notebooks"]:  # the host's CPU use while each ran (wmbook.hostload), failed runs too
        h = n["host_load"]
        assert h["cores"] >= 1 and 0 <= h["busy_cores"] <= h["cores"] and h["own_cores"] > 0 and h["seconds"] > 0
        assert h["core_loop_us"] > 0  # the speed of one of the host's cores
    assert summary["meta"]["parameters"] == {"x": 7, "out_file": str(out.parent / "x.txt")}


def test_each_notebook_gets_the_parameters_it_declares(report):
    """x and out_file are nb_ok's parameters: nb_fail (parameter y) gets none of them, so papermill never warns
    about a parameter its notebook does not have."""
    runs, out, _ = report
    nb = nbformat.read(out / "executed" / "nb_fail.FAILED.ipynb", as_version=4)
    injected = [c for c in nb.cells if "injected-parameters" in c.metadata.get("tags", [])]
    assert not injected


def test_cli_failing_notebook_exits_1(tmp_path, capsys):
    out = tmp_path / "cli"
    rc = cli.run_main([str(NB_FAIL), "--out", str(out), "-q", "-p", "y", "3"])
    assert rc == 1
    err = capsys.readouterr().err
    assert "nb_fail" in err and "boom" in err and 'raise ValueError("boom")' in err
    assert (out / "index.html").is_file()


def test_failure_names_the_line_that_raised(tmp_path):
    nb = nbformat.v4.new_notebook()
    params = nbformat.v4.new_code_cell("n = 1")
    params.metadata["tags"] = ["parameters"]
    nb.cells = [params, nbformat.v4.new_code_cell("import math\nvalue = math.sqrt(n)\n"
                                                  "value = math.sqrt(-n)\nprint(value)")]
    path = tmp_path / "nb_line.ipynb"
    nbformat.write(nb, path)
    (bad,) = wmrun.run_notebooks([path], out=tmp_path / "o", kernel_name="python3", progress=False)
    assert bad.status == "failed" and "math domain error" in bad.error
    assert (bad.failed_cell, bad.failed_line, bad.failed_source) == (1, 3, "value = math.sqrt(-n)")
    assert "cell 1 (In [2]) line 3: value = math.sqrt(-n)" in bad.failure_summary()


@pytest.mark.parametrize("argv,expected", [
    (["-p", "num_blockz", "2"], r"unknown parameter\(s\) \['num_blockz'\].*allowed names: \[.*'num_blocks'"),
    (["-p", "preset", "no-such-preset"], r"preset='no-such-preset' is not allowed.*allowed values"),
    (["-p", "warmup", "-1"], r"warmup=-1 is not allowed; allowed values: an integer >= 0"),
    (["-p", "device", "quantum"], r"device='quantum' is not allowed; allowed values"),
    (["-p", "num_blocks", "abc"], r"num_blocks='abc' is not allowed"),
    (["-p", "workload", "wma", "-p", "num_blocks", "3"], r"num_blocks=3 applies to workload \['mg2'\] only"),
    (["--timeout", "0"], r"--timeout: '0' is not allowed; allowed values: seconds > 0"),
    (["--timeout", "-5"], r"--timeout: '-5' is not allowed"),
])
def test_bad_parameters_refused_before_a_kernel_starts(tmp_path, capsys, argv, expected):
    """Names against the parameters cell, values with the notebook's own validator: refused in seconds, with the
    parameter and what is allowed, and nothing written (no report folder, no results rows)."""
    import re

    out = tmp_path / "never"
    results = tmp_path / "results.csv"
    try:
        rc = cli.run_main(["01", "--out", str(out), "-q", "-p", "results_path", str(results), *argv])
    except SystemExit as e:  # argparse refuses --timeout itself
        rc = e.code
    assert rc == 2
    assert re.search(expected, capsys.readouterr().err), expected
    assert not out.exists() and not results.exists()


def _notebook(path, *sources, params="results_path = ''"):
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell(params)
    cell.metadata["tags"] = ["parameters"]
    nb.cells = [cell, *(nbformat.v4.new_code_cell(s) for s in sources)]
    nb.metadata["kernelspec"] = {"name": "python3", "language": "python", "display_name": "Python 3"}
    nb.metadata["language_info"] = {"name": "python"}
    nbformat.write(nb, path)
    return path


APPEND = """from wmbook import results
results.append([results.make_row(notebook="t", workload="w", preset="tiny", variant="v", metric="m", value=1.0,
                                 unit="ms", params={}, warmup=0, repeats=1)], results_path)"""


@pytest.mark.parametrize("failure", ["oom", "cell timeout"])
def test_results_survive_a_run_that_dies_midway(tmp_path, failure):
    """Rows appended by a cell that finished stay, intact and readable, when a later cell runs out of memory or
    the run is cut off by the cell timeout (its kernel interrupted mid-cell); the report is marked failed."""
    from wmbook import results

    store = tmp_path / "results.csv"
    last = ("import torch\nraise torch.OutOfMemoryError('CUDA out of memory. Tried to allocate 20.00 GiB')"
            if failure == "oom" else f"{APPEND}\nimport time\ntime.sleep(60)")
    nb = _notebook(tmp_path / "nb_dies.ipynb", APPEND, last)
    (run,) = wmrun.run_notebooks([nb], out=tmp_path / "o", parameters={"results_path": str(store)},
                                 kernel_name="python3", progress=False, timeout=None if failure == "oom" else 10)
    assert run.status == "failed" and run.html_path.endswith(".FAILED.html")
    assert ("OutOfMemoryError" in run.error) if failure == "oom" else ("Timeout" in run.error)
    rows = results.read(store)
    assert len(rows) == (1 if failure == "oom" else 2) and set(rows["metric"]) == {"m"}
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".") or p.suffix == ".tmp"]


def test_timeout_checked_by_the_api_too(tmp_path):
    for bad in (0, -5, True):
        with pytest.raises(ValueError, match="timeout"):
            wmrun.run_notebooks([NB_OK], out=tmp_path / "o", timeout=bad, progress=False)
    assert not (tmp_path / "o").exists()


def test_unknown_notebook_rejected_before_running(tmp_path, capsys):
    out = tmp_path / "never"
    with pytest.raises(wmrun.UnknownNotebookError) as info:
        wmrun.run_notebooks([NB_OK, "99_does_not_exist"], out=out, progress=False)
    assert "99_does_not_exist" in str(info.value)
    assert "available notebooks" in str(info.value)
    assert not out.exists()

    rc = cli.run_main(["99_does_not_exist", "--out", str(out), "-q"])
    assert rc == 2
    assert "99_does_not_exist" in capsys.readouterr().err
    assert not out.exists()


def test_cli_dispatch_and_parameter_parsing(tmp_path, monkeypatch):
    from wmbook import cli

    seen = {}

    def fake_run(paths, **kw):
        seen.update(kw, paths=paths)
        return []

    monkeypatch.setattr(wmrun, "run_notebooks", fake_run)
    params = tmp_path / "p.yaml"
    params.write_text("blocks: 4\nname: from-file\nsteps: 2\n")
    rc = cli.main(["run", str(NB_OK), "--preset", "tiny", "--out", str(tmp_path / "o"),
                   "-f", str(params), "-p", "blocks", "2", "-p", "flag", "true",
                   "-p", "label", "abc", "--timeout", "30", "-q"])
    assert rc == 0
    assert seen["paths"] == [NB_OK.resolve()]
    assert seen["preset"] == "tiny"
    assert seen["parameters"] == {"blocks": 2, "name": "from-file", "steps": 2,
                                  "flag": True, "label": "abc"}
    assert seen["timeout"] == 30 and seen["progress"] is False
    assert cli.main(["bogus"]) == 2


def test_resolve_by_name_and_number(tmp_path):
    for name in ("01_alpha", "02_beta", "helper"):
        nbformat.write(nbformat.v4.new_notebook(), tmp_path / f"{name}.ipynb")
    found = wmrun.discover_notebooks(tmp_path)
    assert [p.stem for p in found] == ["01_alpha", "02_beta"]  # helper.ipynb is not numbered
    assert wmrun.resolve_notebooks(["02", "01_alpha.ipynb"], tmp_path) == found[::-1]
    with pytest.raises(wmrun.UnknownNotebookError, match="01_alpha"):
        wmrun.resolve_notebooks(["03"], tmp_path)


# ------------------------------------------------------------------ strip tool / notebook hygiene
# moved to tests/test_notebook_sources.py: nbstripout with `make strip`'s flags on nb_ok/nb_fail, and the
# workbook's notebooks (stripped, paired with their jupytext .py, parameters cell first)


def test_workloads_expand_notebooks_that_have_the_parameter():
    """--workload all: every notebook with a `workload` parameter once per workload, checked before running."""
    from wmbook.params import ParameterError
    from wmbook.runconfig import notebook_parameters

    nbs = wmrun.resolve_notebooks(["01", "02"]) + [NB_OK]
    jobs = notebook_parameters(nbs, {"repeats": 2}, ["mg2", "wma"])
    assert [(p.stem, w) for p, w, _ in jobs] == [("01_baseline_profiling", "mg2"), ("01_baseline_profiling", "wma"),
                                                  ("02_bottleneck_breakdown", "mg2"),
                                                  ("02_bottleneck_breakdown", "wma"), ("nb_ok", None)]
    assert jobs[1][2] == {"repeats": 2, "workload": "wma"} and jobs[-1][2] == {}
    with pytest.raises(ParameterError, match=r"workload='nope' is not allowed; allowed values: \['mg2', 'wma'"):
        notebook_parameters(nbs, {}, ["mg2", "nope"])
    with pytest.raises(ParameterError, match="workload is given twice"):
        notebook_parameters(nbs, {"workload": "wma"}, ["mg2"])
    with pytest.raises(ParameterError, match=r"01_baseline_profiling \(wma\): num_blocks=2 applies to workload"):
        notebook_parameters(nbs, {"num_blocks": 2}, ["mg2", "wma"])
    assert cli._workload_list("all") == ["mg2", "wma", "motion"] and cli._workload_list(" wma, mg2") == ["wma", "mg2"]


def test_ctrl_c_says_one_line_not_an_abandoned_cells_traceback(tmp_path, monkeypatch, caplog):
    """Ctrl-C reaches the kernel as well as the runner: a cell that then fails in nbclient's task, which the interrupt
    left unawaited, must not reach stderr as asyncio's "Task exception was never retrieved" and a traceback."""
    import asyncio
    import gc
    import logging

    from wmbook import cli

    def interrupted_run(paths, **kw):
        loop = asyncio.new_event_loop()

        async def cell():
            raise RuntimeError("the kernel's cell ended by the same Ctrl-C")

        task = loop.create_task(cell())
        loop.run_until_complete(asyncio.sleep(0))  # the cell's task fails; nothing awaits it
        loop.close()
        assert task.done()
        raise KeyboardInterrupt

    monkeypatch.setattr(wmrun, "run_notebooks", interrupted_run)
    monkeypatch.setattr(logging.getLogger("asyncio"), "disabled", False)
    with caplog.at_level(logging.DEBUG, logger="asyncio"):
        rc = cli.main(["run", str(NB_OK), "--out", str(tmp_path / "o"), "-q"])
        gc.collect()  # the abandoned task is reported when it is collected
    assert rc == 130
    assert "never retrieved" not in caplog.text
