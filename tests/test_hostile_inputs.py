"""Bad inputs against every command a user runs (`wmbook run`, `-f` files, papermill directly, `wmbook aggregate`,
`python -m wmbook.published`, `python -m wmbook.train`, the tools): each is refused before any work with one message
naming the input, what is wrong and what is allowed, exit code 2, no traceback, and nothing already written changed
(the README, the committed store, the shipped weights: the autouse fixture; the case's own files: in the case).

The commands run in this process (their `main` returns the exit code) where that is enough; a few run as the user
runs them, in a fresh interpreter, to show the real exit code and stderr."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hostile import GUARDED, ROOT, fingerprint, one_message, run_cli

from wmbook import cli

NB01 = "01"


@pytest.fixture(autouse=True)
def nothing_written_changes():
    before = fingerprint(GUARDED)
    yield
    assert fingerprint(GUARDED) == before, "a refused input changed the README, the store or the shipped weights"


def _run(argv, capsys):
    rc = cli.main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


# --- wmbook run: the command line --------------------------------------------------------------------------------
def test_unknown_kernel_is_refused_before_the_report_folder_exists(tmp_path, capsys):
    out = tmp_path / "report"
    rc, _, err = _run(["run", NB01, "--out", str(out), "--kernel", "nokernel42", "-q"], capsys)
    assert rc == 2 and not out.exists()
    one_message(err, "kernel='nokernel42'", "no such Jupyter kernel", "'python3'")


@pytest.mark.parametrize("kind", ["a file", "under a file"])
def test_out_that_is_not_a_folder(tmp_path, capsys, kind):
    afile = tmp_path / "afile"
    afile.write_text("keep me")
    out = afile if kind == "a file" else afile / "sub"
    rc, _, err = _run(["run", NB01, "--out", str(out), "-q"], capsys)
    assert rc == 2 and afile.read_text() == "keep me"
    one_message(err, "out=", "is a file", "allowed values: a folder")


PARAMETER_FILES = {  # (bytes of the -f file, what the message must say)
    "not UTF-8": (b"preset: \xff\xfe tiny\n", "not UTF-8"),
    "a repeated key": (b"num_blocks: 2\nnum_blocks: 3\n", "key 'num_blocks' is given again (first on line 1)"),
    "a key that is not a string": (b"1: 2\n", "key 1 is not a parameter name"),
    "a key that is a list": (b"? [a, b]\n: 2\n", "is not a parameter name"),
    "a list, not a mapping": (b"- preset\n- tiny\n", "holds a list, not a mapping"),
    "not YAML": (b"preset: [tiny\n", "not valid YAML"),
    "a repeated key in a nested mapping": (b"sections:\n  a: 1\n  a: 2\n", "key 'a' is given again"),
}


@pytest.mark.parametrize("case", list(PARAMETER_FILES))
def test_bad_parameters_file(tmp_path, capsys, case):
    data, needle = PARAMETER_FILES[case]
    f = tmp_path / "p.yaml"
    f.write_bytes(data)
    out = tmp_path / "o"
    rc, _, err = _run(["run", NB01, "-f", str(f), "--out", str(out), "-q"], capsys)
    assert rc == 2 and not out.exists() and f.read_bytes() == data
    one_message(err, "-f", needle, "allowed values")


@pytest.mark.parametrize("kind", ["missing", "a folder"])
def test_parameters_file_that_is_not_a_file(tmp_path, capsys, kind):
    f = tmp_path / "p.yaml"
    if kind == "a folder":
        f.mkdir()
    rc, _, err = _run(["run", NB01, "-f", str(f), "--out", str(tmp_path / "o"), "-q"], capsys)
    assert rc == 2
    one_message(err, "-f", "no such file" if kind == "missing" else "it is a folder")


NOTEBOOK_VALUES = {  # (-p NAME VALUE, what the message must say); checked by the notebook's own validator
    "infinite guidance": (("guidance_scale", ".inf"), "guidance_scale=inf is not allowed: it is not finite"),
    "NaN guidance": (("guidance_scale", ".nan"), "guidance_scale=nan is not allowed: it is not finite"),
    "negative infinite guidance": (("guidance_scale", " -.inf"), "it is not finite"),
    "blocks past the device": (("num_blocks", "99999999999"), "num_blocks=99999999999 is not allowed on cpu"),
    "a misspelled name": (("num_blokcs", "1"), "unknown parameter(s) ['num_blokcs']"),
    "a string for an integer": (("num_blocks", "many"), "num_blocks='many' is not allowed"),
    "a negative count": (("repeats", "-1"), "repeats=-1 is not allowed"),
    "an unknown device": (("device", "tpu"), "tpu"),
}


@pytest.mark.parametrize("case", list(NOTEBOOK_VALUES))
def test_bad_parameter_value(tmp_path, capsys, case):
    (name, value), needle = NOTEBOOK_VALUES[case]
    wl = ["--workload", "wma"] if name == "guidance_scale" else []
    rc, _, err = _run(["run", NB01, *wl, "-p", name, value, "--out", str(tmp_path / "o"), "-q"], capsys)
    assert rc == 2 and not (tmp_path / "o").exists()
    one_message(err, needle)
    assert "allowed" in err


def test_sizes_are_checked_against_the_device_for_every_workload(tmp_path, capsys):
    rc, _, err = _run(["run", "07", "-p", "num_envs", "99999999999", "--out", str(tmp_path / "o"), "-q"], capsys)
    assert rc == 2
    one_message(err, "num_envs=99999999999 is not allowed on cpu", "GiB", "allowed values: at most")


@pytest.mark.parametrize("kind", ["results_path a folder", "results_path under a file", "output_dir a file"])
def test_output_paths_checked_before_anything_runs(tmp_path, capsys, kind):
    afile = tmp_path / "afile"
    afile.write_text("keep me")
    name, value = {"results_path a folder": ("results_path", tmp_path),
                   "results_path under a file": ("results_path", afile / "r.csv"),
                   "output_dir a file": ("output_dir", afile)}[kind]
    rc, _, err = _run(["run", NB01, "-p", name, str(value), "--out", str(tmp_path / "o"), "-q"], capsys)
    assert rc == 2 and afile.read_text() == "keep me" and not (tmp_path / "o").exists()
    one_message(err, f"{name}=", "is not allowed", "allowed values")


@pytest.mark.parametrize("content", [b"not json at all", b'{"cells": "nope"}', b"\x00\x01\x02"])
def test_junk_notebook_is_named(tmp_path, capsys, content):
    nb = tmp_path / "junk.ipynb"
    nb.write_bytes(content)
    rc, _, err = _run(["run", str(nb), "--out", str(tmp_path / "o"), "-q"], capsys)
    assert rc == 2 and not (tmp_path / "o").exists()
    one_message(err, "junk.ipynb", "not a readable Jupyter notebook", "allowed values")


def test_the_shell_sees_exit_2_and_one_line(tmp_path):
    """As a user runs it: a fresh interpreter, the real exit code, no traceback."""
    rc, out, err = run_cli(["-m", "wmbook", "run", NB01, "--kernel", "nokernel42", "--out", tmp_path / "o", "-q"])
    assert rc == 2 and not (tmp_path / "o").exists()
    one_message(err, "wmbook run: error: kernel='nokernel42'")


def test_papermill_run_directly_refuses_a_misspelled_parameter(tmp_path):
    """papermill itself only warns about a name the parameters cell lacks; the notebook's validation refuses it
    before any work, so no row is written with the defaults."""
    store = tmp_path / "r.csv"
    rc, _, err = run_cli(["-m", "papermill", ROOT / "notebooks" / "01_baseline_profiling.ipynb", tmp_path / "o.ipynb",
                          "-p", "num_blokcs", "1", "-p", "results_path", store, "--no-progress-bar"], timeout=300)
    assert rc != 0 and not store.exists()
    assert "unknown parameter(s) ['num_blokcs']" in err and "allowed names" in err


# --- a re-run into a folder that holds a report ------------------------------------------------------------------
def _toggle_notebook(path):
    import nbformat

    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("fail = False")
    cell.metadata["tags"] = ["parameters"]
    nb.cells = [cell, nbformat.v4.new_code_cell("assert not fail, 'asked to fail'")]
    nb.metadata["kernelspec"] = {"name": "python3", "language": "python", "display_name": "Python 3"}
    nbformat.write(nb, path)
    return path


def test_rerun_that_fails_moves_the_old_good_report_aside(tmp_path):
    from wmbook import run as wmrun

    nb = _toggle_notebook(tmp_path / "nb_toggle.ipynb")
    out = tmp_path / "report"
    (ok,) = wmrun.run_notebooks([nb], out=out, kernel_name="python3", progress=False)
    assert ok.ok and (out / "nb_toggle.html").is_file()
    good = fingerprint([out / "nb_toggle.html", out / "executed" / "nb_toggle.ipynb"])
    (bad,) = wmrun.run_notebooks([nb], out=out, parameters={"fail": True}, kernel_name="python3", progress=False)
    assert not bad.ok and (out / "nb_toggle.FAILED.html").is_file()
    # the folder shows the failure alone; the good report is kept, unchanged, under superseded/
    assert not (out / "nb_toggle.html").exists() and not (out / "executed" / "nb_toggle.ipynb").exists()
    (kept,) = (out / "superseded").iterdir()
    moved = fingerprint([kept / "nb_toggle.html", kept / "executed" / "nb_toggle.ipynb"])
    assert sorted(moved.values()) == sorted(good.values())
    summary = json.loads((out / "summary.json").read_text())
    assert [r["status"] for r in summary["notebooks"]] == ["failed"]


# --- python -m wmbook.published ----------------------------------------------------------------------------------
def test_published_write_refuses_a_device_that_matches_no_row(capsys):
    from wmbook import published

    assert published.main(["--write", "--device", "H10O"]) == 2
    out, err = capsys.readouterr()
    one_message(err, "--device='H10O'", "matches no row", "NVIDIA H100")
    assert "README.md updated" not in out


def test_published_print_and_index_refuse_it_too(tmp_path, capsys):
    from wmbook import published

    assert published.main(["--device", "H10O"]) == 2
    one_message(capsys.readouterr().err, "matches no row")
    with pytest.raises(SystemExit) as e:
        published.main(["--index", str(tmp_path), "--device", "H10O"])
    assert e.value.code == 2 and not (tmp_path / "index.html").exists()
    one_message(capsys.readouterr().err, "matches no row")


def test_published_write_as_the_user_runs_it():
    rc, out, err = run_cli(["-m", "wmbook.published", "--write", "--device", "H10O"])
    assert rc == 2 and "README.md updated" not in out
    one_message(err, "python -m wmbook.published: error: --device='H10O'")


def _store_copy(tmp_path, cut: int | None = None, rows: int | None = None) -> Path:
    src = (ROOT / "data" / "results" / "results.csv").read_bytes()
    if rows is not None:
        src = b"".join(src.splitlines(keepends=True)[:rows + 1])
    dst = tmp_path / "results.csv"
    dst.write_bytes(src[:cut] if cut is not None else src)
    return dst


@pytest.mark.parametrize("cut", ["mid row", "inside a quoted field", "last byte"])
def test_published_write_refuses_a_torn_store(tmp_path, monkeypatch, capsys, cut):
    from wmbook import published

    raw = (ROOT / "data" / "results" / "results.csv").read_bytes()
    at = {"mid row": len(raw) // 2, "inside a quoted field": raw.index(b'"{', 100_000) + 15,
          "last byte": len(raw) - 1}[cut]
    store = _store_copy(tmp_path, cut=at)
    monkeypatch.setenv("WMBOOK_RESULTS", str(store))
    assert published.main(["--write"]) == 2
    one_message(capsys.readouterr().err, "fails its check", "line ", "allowed values")
    assert store.read_bytes() == raw[:at]


def test_published_write_says_what_it_would_remove_and_refuses(tmp_path, monkeypatch, capsys):
    """A store cut at a row boundary (older rows only) is well formed: the block it makes has fewer tables and rows
    than the README's, so --write names the lines it would drop and stops; --allow-removal writes it."""
    from wmbook import published

    readme = tmp_path / "README.md"
    readme.write_bytes((ROOT / "README.md").read_bytes())
    monkeypatch.setattr(published, "REPO_ROOT", tmp_path)
    pages = {}  # every page --write touches, as copies
    for folder, device in published.FOLDER_PAGES.items():
        (tmp_path / folder.name).mkdir()
        (tmp_path / folder.name / "README.md").write_bytes((folder / "README.md").read_bytes())
        pages[tmp_path / folder.name] = device
    monkeypatch.setattr(published, "FOLDER_PAGES", pages)
    monkeypatch.setenv("WMBOOK_RESULTS", str(_store_copy(tmp_path, rows=1500)))
    before = readme.read_bytes()
    assert published.main(["--write"]) == 2
    out, err = capsys.readouterr()
    assert "the published block drops" in out and "  - " in out
    one_message(err, "removes", "--allow-removal")
    assert readme.read_bytes() == before
    assert published.main(["--write", "--allow-removal"]) == 0
    assert readme.read_bytes() != before and "README.md updated" in capsys.readouterr().out


# --- wmbook results check ----------------------------------------------------------------------------------------
def test_results_check_names_the_line(tmp_path, capsys):
    raw = (ROOT / "data" / "results" / "results.csv").read_bytes()
    store = _store_copy(tmp_path, cut=len(raw) // 3)
    rc, out, err = _run(["results", "check", str(store)], capsys)
    assert rc == 2 and "fails its check" in err and "line " in err and "Traceback" not in err
    rc, out, err = _run(["results", "check", str(ROOT / "data" / "results" / "results.csv")], capsys)
    assert rc == 0 and "ok," in out


@pytest.mark.parametrize("kind", ["folder", "missing"])
def test_results_check_of_what_is_not_a_store(tmp_path, capsys, kind):
    rc, _, err = _run(["results", "check", str(tmp_path if kind == "folder" else tmp_path / "none.csv")], capsys)
    assert rc == 2
    one_message(err, "is not allowed", "allowed values: a results CSV file")


# --- wmbook aggregate --------------------------------------------------------------------------------------------
def _report(**over):
    from wmbook.profiling.aggregate import SCHEMA

    d = {"schema": SCHEMA, "session": {"name": "s", "rank": 0, "world_size": 1}, "stages": [], "summary": {}}
    for k, v in over.items():
        if k in ("rank", "world_size"):
            d["session"][k] = v
        else:
            d[k] = v
    return d


SESSION_REPORTS = {
    "rank a string": (dict(rank="a"), "session.rank = 'a'"),
    "rank past world size": (dict(rank=3, world_size=2), "session.rank = 3"),
    "world size zero": (dict(world_size=0), "session.world_size = 0"),
    "world size a bool": (dict(world_size=True), "session.world_size = True"),
    "stages an object": (dict(stages={"a": 1}), "stages = a JSON dict"),
    "a stage without a path": (dict(stages=[{"total_ms": 1.0}]), "stages[0] without a string 'path'"),
    "a stage time that is text": (dict(stages=[{"path": "Session", "total_ms": "fast"}]), "stages[0].total_ms"),
    "summary a list": (dict(summary=[1, 2]), "summary = a JSON list"),
    "monitor summary of numbers": (dict(monitor={"summary": [1]}), "monitor.summary"),
}


@pytest.mark.parametrize("case", list(SESSION_REPORTS))
def test_aggregate_names_the_field_of_the_wrong_type(tmp_path, capsys, case):
    over, needle = SESSION_REPORTS[case]
    f = tmp_path / "rank0.json"
    f.write_text(json.dumps(_report(**over)))
    rc, _, err = _run(["aggregate", str(f), "--output-dir", str(tmp_path / "agg")], capsys)
    assert rc == 2 and not (tmp_path / "agg").exists()
    one_message(err, "rank0.json", needle)


def test_aggregate_output_under_a_file(tmp_path, capsys):
    f = tmp_path / "rank0.json"
    f.write_text(json.dumps(_report()))
    afile = tmp_path / "afile"
    afile.write_text("keep me")
    rc, _, err = _run(["aggregate", str(f), "--output-dir", str(afile / "agg")], capsys)
    assert rc == 2 and afile.read_text() == "keep me"
    assert "Traceback" not in err and "afile" in err


# --- python -m wmbook.train: refused before any rendering or training --------------------------------------------
def _train(args, capsys):
    from wmbook.train.__main__ import main

    rc = main(["--workload", "mg2", "--steps", "2", "--episodes", "2", "-q", *map(str, args)])
    return rc, capsys.readouterr().err


def test_train_never_writes_the_shipped_weights(capsys):
    shipped = ROOT / "data" / "weights" / "world-mg2.pt"
    rc, err = _train(["--out", shipped], capsys)
    assert rc == 2
    one_message(err, "where the shipped weights live", "--ship")


def test_train_default_out_is_a_new_run_folder(tmp_path, monkeypatch):
    from wmbook.train.core import default_out
    from wmbook.world import weights

    monkeypatch.setattr(weights, "WEIGHTS_DIR", tmp_path)
    first = default_out("world-mg2")
    assert first.parent.parent == tmp_path / "runs" and first.name == "world-mg2.pt"
    first.parent.mkdir(parents=True)
    second = default_out("world-mg2")
    assert second.parent != first.parent and second.parent.name.endswith("-2")


@pytest.mark.parametrize("kind", ["under a file", "a folder", "not .pt"])
def test_train_out_checked_before_training(tmp_path, capsys, kind):
    afile = tmp_path / "afile"
    afile.write_text("keep me")
    (tmp_path / "dir.pt").mkdir()
    out = {"under a file": afile / "t.pt", "a folder": tmp_path / "dir.pt", "not .pt": tmp_path / "w.bin"}[kind]
    rc, err = _train(["--out", out, "--ckpt", tmp_path / "c.ckpt"], capsys)
    assert rc == 2 and afile.read_text() == "keep me" and not (tmp_path / "c.ckpt").exists()
    one_message(err, "out=", "allowed values")


@pytest.mark.parametrize("flag,value,needle", [("--lr", "inf", "lr=inf is not allowed: it is not finite"),
                                               ("--minutes", "nan", "minutes=nan is not allowed: it is not finite"),
                                               ("--ema", "=-inf", "it is not finite"),
                                               ("--eval-cases", "0", "eval_cases=0 is not allowed with ship=True")])
def test_train_numbers(tmp_path, capsys, flag, value, needle):
    arg = [flag + value] if value.startswith("=") else [flag, value]
    rc, err = _train(["--out", tmp_path / "w.pt", *arg, "--ship"], capsys)
    assert rc == 2
    one_message(err, needle)


def _bad_weights(tmp_path, kind) -> Path:
    import os

    import torch

    good = ROOT / "data" / "weights" / "world-mg2.pt"
    p = tmp_path / f"{kind.replace(' ', '_')}.pt"
    if kind == "truncated":
        p.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    elif kind == "random bytes":
        p.write_bytes(os.urandom(4096))
    elif kind == "a state dict, not world weights":
        torch.save({"a": torch.zeros(2)}, p)
    elif kind == "empty":
        p.write_bytes(b"")
    return p


@pytest.mark.parametrize("kind", ["truncated", "random bytes", "a state dict, not world weights", "empty", "missing"])
def test_train_init_weights_that_are_not_weights(tmp_path, capsys, kind):
    p = _bad_weights(tmp_path, kind)
    rc, err = _train(["--out", tmp_path / "w.pt", "--init-weights", p], capsys)
    assert rc == 2 and not (tmp_path / "w.pt").exists()
    one_message(err, "init_weights=", p.name, "allowed values")


def test_train_checkpoint_that_cannot_be_resumed(tmp_path, capsys):
    ck = tmp_path / "w.ckpt"
    ck.write_bytes(b"PK\x03\x04 half a zip")
    rc, err = _train(["--out", tmp_path / "w.pt", "--ckpt", ck], capsys)
    assert rc == 2 and ck.read_bytes() == b"PK\x03\x04 half a zip"
    one_message(err, "w.ckpt", "--no-resume")


def test_train_as_the_user_runs_it(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("x")
    rc, _, err = run_cli(["-m", "wmbook.train", "--workload", "mg2", "--steps", "2", "--episodes", "2",
                          "--out", afile / "t.pt"])
    assert rc == 2
    one_message(err, "python -m wmbook.train: error: out=", "is a file")


def test_train_ship_keeps_the_shipped_weights_when_the_rule_fails(tmp_path, monkeypatch, capsys):
    """--ship after a run whose weights do not beat copy-last: exit 1, the shipped files untouched, the run's own
    file kept (the training itself is stood in for: what is tested is the decision and what it writes)."""
    from wmbook.train import __main__ as entry
    from wmbook.train import core

    def fake_train(cfg, bank=None):
        cfg.out.parent.mkdir(parents=True, exist_ok=True)
        cfg.out.write_bytes(b"new weights")
        meta = {"eval": {"model": {"psnr": 14.1, "ssim": 0.2, "agent_err_px": 30.0},
                         "copy_last": {"psnr": 17.3, "ssim": 0.3, "agent_err_px": 20.0}}}
        from wmbook.world.eval import SHIPPING_RULE, shipping_failures

        fails = shipping_failures(meta["eval"]["model"], meta["eval"]["copy_last"])
        return meta | {"shipping_rule": {"rule": SHIPPING_RULE, "passes": not fails, "fails": fails}, "shipped": []}

    monkeypatch.setattr(core, "train", fake_train)
    rc = entry.main(["--workload", "mg2", "--steps", "2", "--episodes", "2", "-q", "--ship",
                     "--out", str(tmp_path / "run" / "world-mg2.pt")])
    err = capsys.readouterr().err
    assert rc == 1 and "not shipped: PSNR 14.1 is not above copy-last's 17.3" in err
    assert (tmp_path / "run" / "world-mg2.pt").read_bytes() == b"new weights"


# --- the tools ---------------------------------------------------------------------------------------------------
TOOLS = ROOT / "tools"


@pytest.mark.parametrize("args,needle", [(["--seeds", "x"], "--seeds='x' is not allowed"),
                                         (["--steps", "0"], "--steps='0' is not allowed"),
                                         (["--device", "tpu"], "--device='tpu' is not allowed")])
def test_world_steps_eval_options(tmp_path, capsys, args, needle):
    import importlib.util

    spec = importlib.util.spec_from_file_location("world_steps_eval", TOOLS / "world_steps_eval.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main([str(tmp_path / "w.pt"), *args]) == 2
    one_message(capsys.readouterr().err, needle)


def test_pick_world_weights_refuses_a_provenance_that_is_not_json(tmp_path):
    (tmp_path / "w.pt").write_bytes(b"x")
    (tmp_path / "w.pt.json").write_text("{not json")
    dest = tmp_path / "dest"
    rc, _, err = run_cli([TOOLS / "pick_world_weights.py", tmp_path / "w.pt", "--dest", dest],
                         env={"PYTHONPATH": str(ROOT)})
    assert rc == 2 and not dest.exists()
    one_message(err, "w.pt.json", "not a JSON provenance file")


def test_published_write_takes_a_newer_run_of_a_table(tmp_path, monkeypatch):
    """A newer run of a published table changes its heading's parenthesis (commit, base) and its numbers: that replaces
    the table and is written without --allow-removal; a table whose title goes is refused."""
    from wmbook import published
    from wmbook.errors import InputError

    page = tmp_path / "README.md"
    old = "**06 · graphs, wma / wma** (H200, commit aaaaaaa)\n| row | s |\n|---|---|\n| base | 8.5 |"
    page.write_text(f"# t\n\n{published.BEGIN}\n{old}\n{published.END}\n")
    plan = []
    monkeypatch.setattr(published, "planned_pages", lambda readme=None, path=None: plan)
    plan[:] = [(page, published.BEGIN, published.END, old.replace("aaaaaaa", "bbbbbbb").replace("8.5", "8.3"))]
    assert published.update_readme(page, allow_removal=False)
    assert "bbbbbbb" in page.read_text() and "8.3" in page.read_text()
    before = page.read_text()
    other = "**06 · graphs, mg2 / mg2** (H200)\n| row | s |\n|---|---|\n| b | 1 |"
    plan[:] = [(page, published.BEGIN, published.END, other)]
    with pytest.raises(InputError, match="1 table"):
        published.update_readme(page, allow_removal=False)
    assert page.read_text() == before
