"""The papermill batch runner (wmbook.run); notebook hygiene is in test_notebook_sources.py.

Kernel start-up dominates: the module runs three notebook executions in all.
"""

from __future__ import annotations

import json
from pathlib import Path

import nbformat
import pytest

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
    # the executed notebook and its HTML are kept for failures too
    assert Path(bad.executed_path).is_file() and Path(bad.html_path).is_file()
    summary = bad.failure_summary()
    assert "nb_fail" in summary and "boom" in summary and "raise ValueError" in summary


def test_index_and_summary_written(report):
    runs, out, _ = report
    index = (out / "index.html").read_text()
    for name in ("nb_ok", "nb_fail"):
        assert name in index
        assert f'href="{name}.html"' in index
        assert f'href="executed/{name}.ipynb"' in index
    assert "failed" in index and "boom" in index
    summary = json.loads((out / "summary.json").read_text())
    assert [n["status"] for n in summary["notebooks"]] == ["failed", "ok"]
    assert summary["meta"]["parameters"] == {"x": 7, "out_file": str(out.parent / "x.txt")}


def test_cli_failing_notebook_exits_1(tmp_path, capsys):
    out = tmp_path / "cli"
    rc = wmrun.main([str(NB_FAIL), "--out", str(out), "-q", "-p", "y", "3"])
    assert rc == 1
    err = capsys.readouterr().err
    assert "nb_fail" in err and "boom" in err and 'raise ValueError("boom")' in err
    assert (out / "index.html").is_file()


def test_unknown_notebook_rejected_before_running(tmp_path, capsys):
    out = tmp_path / "never"
    with pytest.raises(wmrun.UnknownNotebookError) as info:
        wmrun.run_notebooks([NB_OK, "99_does_not_exist"], out=out, progress=False)
    assert "99_does_not_exist" in str(info.value)
    assert "available notebooks" in str(info.value)
    assert not out.exists()

    rc = wmrun.main(["99_does_not_exist", "--out", str(out), "-q"])
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
