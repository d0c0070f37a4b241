"""Notebook sources and hygiene, with the ecosystem's tools (no kernel is started; a few seconds in all).

Every ``notebooks/NN_name.ipynb`` is paired with the jupytext percent-format script ``notebooks/NN_name.py``
(``notebooks/jupytext.toml``): both hold the same cells, the ``.ipynb`` is stored stripped (by nbstripout,
with the flags of ``make strip``) and its first code cell is the ``parameters`` cell papermill reads.
"""

from __future__ import annotations

import ast
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import jupytext
import nbformat
import papermill as pm
import pytest
from jupytext.config import load_jupytext_config

from wmbook import run as wmrun

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
DATA = Path(__file__).resolve().parent / "data"
NB_OK = DATA / "nb_ok.ipynb"
NB_FAIL = DATA / "nb_fail.ipynb"

IPYNBS = sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
SCRIPTS = sorted(NOTEBOOKS.glob("[0-9][0-9]_*.py"))
PAIRING = "ipynb,py:percent"

# written by running a notebook, never by authoring it (nbstripout drops them; see NBSTRIPOUT_FLAGS)
VOLATILE_NB_METADATA = ("widgets", "papermill", "execution")
VOLATILE_CELL_METADATA = ("papermill", "execution", "ExecuteTime", "widgets")


def _makefile_nbstripout_flags() -> list[str]:
    """The nbstripout flags `make strip` and `make strip-check` use, so these tests check exactly that."""
    text = (ROOT / "Makefile").read_text()
    m = re.search(r"^NBSTRIPOUT_FLAGS\s*:?=\s*(.*)$", text, re.MULTILINE)
    assert m, "Makefile: NBSTRIPOUT_FLAGS not found"
    return shlex.split(m.group(1))


NBSTRIPOUT_FLAGS = _makefile_nbstripout_flags()


def nbstripout(*args: str | Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nbstripout", *NBSTRIPOUT_FLAGS, *map(str, args)],
                          capture_output=True, text=True, timeout=120)


def cells(nb: nbformat.NotebookNode) -> list[tuple[str, str, list[str]]]:
    return [(c.cell_type, c.source, list(c.get("metadata", {}).get("tags", []))) for c in nb.cells]


def pair_differences(ipynb: Path, script: Path) -> list[str]:
    """How the cells (type, source, tags) of a notebook and of its paired script differ; empty: in sync."""
    a = cells(nbformat.read(ipynb, as_version=4))
    b = cells(jupytext.read(script))
    found = [f"cell {i}: {ipynb.name} has {x!r}, {script.name} has {y!r}"
             for i, (x, y) in enumerate(zip(a, b)) if x != y]
    if len(a) != len(b):
        found.append(f"{ipynb.name} has {len(a)} cells, {script.name} has {len(b)}")
    return found


def strip_problems(nb: nbformat.NotebookNode) -> list[str]:
    """What a run left in a notebook (empty: stripped)."""
    found = [f"notebook metadata '{k}'" for k in VOLATILE_NB_METADATA if k in nb.metadata]
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            if cell.get("outputs"):
                found.append(f"cell {i}: outputs")
            if cell.get("execution_count") is not None:
                found.append(f"cell {i}: execution_count")
        found += [f"cell {i}: metadata '{k}'" for k in VOLATILE_CELL_METADATA if k in cell.get("metadata", {})]
    return found


def _ids(paths):
    return [p.stem for p in paths]


# ------------------------------------------------------------------ pairing: one .py per .ipynb, same cells


def test_workbook_has_paired_notebooks():
    assert IPYNBS, "no notebooks/NN_*.ipynb found"
    assert _ids(SCRIPTS) == _ids(IPYNBS), (
        "every notebooks/NN_name.ipynb needs its notebooks/NN_name.py and vice versa: run `make strip`")


@pytest.mark.parametrize("ipynb", IPYNBS, ids=_ids(IPYNBS))
def test_pairing_is_configured_for_jupytext(ipynb):
    # what JupyterLab's jupytext and `jupytext --sync` use to find the pair
    config = load_jupytext_config(str(ipynb))
    assert config is not None and config.default_formats(str(ipynb)) == PAIRING
    header = jupytext.read(ipynb.with_suffix(".py")).metadata
    assert header["jupytext"]["text_representation"]["format_name"] == "percent"
    assert header["kernelspec"]["name"] == "python3"


@pytest.mark.parametrize("ipynb", IPYNBS, ids=_ids(IPYNBS))
def test_py_and_ipynb_have_the_same_cells(ipynb):
    diff = pair_differences(ipynb, ipynb.with_suffix(".py"))
    assert not diff, "out of sync, run `make strip` (jupytext --sync):\n" + "\n".join(diff[:5])


def test_editing_one_file_of_a_pair_is_caught(tmp_path):
    src = IPYNBS[0]
    ipynb, script = tmp_path / src.name, tmp_path / src.with_suffix(".py").name
    shutil.copy(NOTEBOOKS / "jupytext.toml", tmp_path)
    shutil.copy(src, ipynb)
    shutil.copy(src.with_suffix(".py"), script)
    assert pair_differences(ipynb, script) == []
    original_py, original_nb = script.read_text(), ipynb.read_text()

    # the .py alone: a changed line of code
    nb = jupytext.read(script)
    code = next(i for i, c in enumerate(nb.cells) if c.cell_type == "code" and i > 1)
    nb.cells[code].source += "\nx_edited = 1"
    jupytext.write(nb, script, fmt="py:percent")
    assert any(f"cell {code}:" in d for d in pair_differences(ipynb, script))

    # the .py alone: the parameters tag dropped
    script.write_text(original_py.replace('# %% tags=["parameters"]\n', "# %%\n", 1))
    assert pair_differences(ipynb, script)

    # the .ipynb alone: a markdown cell edited, then a cell added
    script.write_text(original_py)
    nb = nbformat.read(ipynb, as_version=4)
    nb.cells[0].source += "\nedited"
    nbformat.write(nb, ipynb)
    assert any("cell 0:" in d for d in pair_differences(ipynb, script))
    ipynb.write_text(original_nb)
    nb = nbformat.read(ipynb, as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell("y = 2"))
    nbformat.write(nb, ipynb)
    assert pair_differences(ipynb, script)

    # `make strip`'s fix: jupytext --sync takes the newer file's inputs and keeps the cell ids
    ipynb.write_text(original_nb)
    nb = jupytext.read(script)
    nb.cells[code].source += "\nx_edited = 1"
    jupytext.write(nb, script, fmt="py:percent")
    os.utime(ipynb, (script.stat().st_mtime - 10,) * 2)  # the .py is the newer file
    ids = [c.id for c in nbformat.read(ipynb, as_version=4).cells]
    done = subprocess.run([sys.executable, "-m", "jupytext", "--quiet", "--sync", str(script)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert pair_differences(ipynb, script) == []
    synced = nbformat.read(ipynb, as_version=4)
    assert [c.id for c in synced.cells] == ids
    assert synced.cells[code].source.endswith("x_edited = 1")


# ------------------------------------------------------------------ stored stripped, with a parameters cell


@pytest.mark.parametrize("ipynb", IPYNBS, ids=_ids(IPYNBS))
def test_notebook_is_stripped_with_kernelspec(ipynb):
    nb = nbformat.read(ipynb, as_version=4)
    problems = strip_problems(nb)
    assert not problems, f"{ipynb.name} not stripped ({'; '.join(problems[:5])}): run `make strip`"
    assert nb.metadata["kernelspec"]["name"] == "python3"


def test_notebooks_pass_nbstripout_verify():
    done = nbstripout("--verify", *IPYNBS)
    assert done.returncode == 0, f"{done.stdout}{done.stderr}run `make strip`"


@pytest.mark.parametrize("ipynb", IPYNBS, ids=_ids(IPYNBS))
def test_first_code_cell_is_the_parameters_cell(ipynb):
    nb = nbformat.read(ipynb, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and "parameters" in code[0].metadata.get("tags", []), \
        f"{ipynb.name}: the first code cell must be tagged 'parameters'"
    assert sum("parameters" in c.metadata.get("tags", []) for c in nb.cells) == 1
    assigned = [t.id for node in ast.parse(code[0].source).body if isinstance(node, ast.Assign)
                for t in node.targets if isinstance(t, ast.Name)]
    found = pm.inspect_notebook(str(ipynb))
    assert assigned and list(found) == assigned, (list(found), assigned)


def test_runner_sees_only_the_ipynb_files():
    # the .py next to each notebook is its source, never a second notebook to run
    assert wmrun.discover_notebooks(NOTEBOOKS) == [p.resolve() for p in IPYNBS]
    assert wmrun.resolve_notebooks([IPYNBS[0].stem[:2]], NOTEBOOKS) == [IPYNBS[0].resolve()]


# ------------------------------------------------------------------ the stripping tool (nbstripout, `make strip`'s
# flags)


def test_strip_tool_keeps_tags_drops_outputs(tmp_path):
    nb = nbformat.read(NB_OK, as_version=4)
    nb.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {"state": {}}}
    nb.metadata["papermill"] = {"duration": 1.5, "parameters": {"x": 7}}
    nb.metadata["execution"] = {"timeout": 600}
    cell = nb.cells[2]
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="x = 1\n")]
    cell.execution_count = 3
    cell.metadata["execution"] = {"iopub.execute_input": "2024-01-01T00:00:00Z"}
    cell.metadata["papermill"] = {"status": "completed", "duration": 0.1}
    cell.metadata["ExecuteTime"] = {"start_time": "2024-01-01T00:00:00Z"}
    path = tmp_path / "dirty.ipynb"
    nbformat.write(nb, path)
    assert strip_problems(nbformat.read(path, as_version=4))

    assert nbstripout("--verify", path).returncode == 1
    assert nbstripout(path).returncode == 0
    assert nbstripout("--verify", path).returncode == 0
    clean = nbformat.read(path, as_version=4)
    assert strip_problems(clean) == []
    assert clean.cells[1].metadata["tags"] == ["parameters"]
    assert clean.cells[2].outputs == [] and clean.cells[2].execution_count is None
    assert clean.metadata["kernelspec"] == nbformat.read(NB_OK, as_version=4).metadata["kernelspec"]
    assert [c.id for c in clean.cells] == [c.id for c in nb.cells]  # --keep-id: stable ids
    assert cells(clean) == cells(nbformat.read(NB_OK, as_version=4))


def test_fixture_notebooks_are_stripped():
    for path in (NB_OK, NB_FAIL):
        assert strip_problems(nbformat.read(path, as_version=4)) == [], path.name
    done = nbstripout("--verify", NB_OK, NB_FAIL)
    assert done.returncode == 0, done.stdout + done.stderr


# words that tell how the numbers came about (a run of the past, how the work was organised, a commit) rather than what
# the notebook does: a notebook's text speaks of the product. The organisational words are spelled in parts so that
# this list does not itself read as such text.
_ORG = ("this " + "sess" + "ion", r"(first|second|third|\w+th) " + "sess" + "ion", "le" + "nt", "le" + "ase")
_HISTORY = re.compile(r"\b(past run|last run|earlier run|" + "|".join(_ORG) + r"|commit [0-9a-f]{7}|at [0-9a-f]{7}\b|"
                      r"died|dying)", re.I)


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem)
def test_notebook_text_speaks_of_the_product(script):
    """No markdown or comment of a notebook speaks of past runs, work sessions or commits; every notebook ends with a
    'Next' link to another notebook, and the step-count notebook says what to look for in each section."""
    text = script.read_text()
    prose = "\n".join(ln for ln in text.splitlines() if ln.lstrip().startswith("#"))
    prose = re.sub(r"(profil\w* session|session report|ProfilingSession|session name|profiling session)", "", prose,
                   flags=re.I)
    assert _HISTORY.findall(prose) == []
    assert re.search(r"\*\*Next:\*\*[\s\S]{0,400}?\]\(\d\d_\w+\.ipynb\)", text), "no 'Next' link to a notebook"
    if script.stem.startswith("03_"):
        assert text.count("What to look for") >= 4
