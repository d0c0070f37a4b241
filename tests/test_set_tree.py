"""tools/set_tree.py and `gpu_set.sh start`: a set's slice runs only from a tree that is the set's commit, so its rows
never record a commit they do not come from."""

import importlib.util
import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("set_tree", REPO / "tools" / "set_tree.py")
set_tree = importlib.util.module_from_spec(spec)
spec.loader.exec_module(set_tree)

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


def _git(repo, *args):
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True, env=env).stdout.strip()


@pytest.fixture
def repo(tmp_path):
    r = tmp_path / "repo"
    for path, text in {"wmbook/a.py": "x = 1\n", "notebooks/n.py": "# n\n", "data/reports/NOTES.md": "notes\n",
                       "data/weights/w.bin": "w", ".gitignore": "/.set-tree*\n/sets/\n"}.items():
        (r / path).parent.mkdir(parents=True, exist_ok=True)
        (r / path).write_text(text)
    os.symlink("a.py", r / "wmbook" / "link.py")
    _git(r, "init", "-q")
    _git(r, "add", "-A")
    _git(r, "commit", "-qm", "c")
    return r


def _verify(repo, sha):
    return set_tree.verify(sha, repo, repo / ".set-tree")


def test_blob_id_is_git_s(repo):
    assert set_tree.blob_id(b"x = 1\n") == _git(repo, "hash-object", "wmbook/a.py")


def test_the_commit_s_tree_verifies_and_the_published_record_may_stay_behind(repo):
    sha = _git(repo, "rev-parse", "HEAD")
    set_tree.write(sha[:7], repo, repo / ".set-tree")
    assert (repo / ".set-tree").read_text().startswith(f"commit {sha}\n")
    assert _verify(repo, sha[:7]) == []
    (repo / "data" / "reports" / "NOTES.md").unlink()  # left out of the copy to keep it small
    (repo / "wmbook" / "__pycache__").mkdir()
    (repo / "wmbook" / "__pycache__" / "a.cpython-312.pyc").write_bytes(b"\0")
    (repo / "notebooks" / "out.json").write_text("{}")  # what a run writes beside the code is not code
    assert _verify(repo, sha) == []


def test_a_changed_missing_or_stray_file_is_named(repo):
    sha = _git(repo, "rev-parse", "HEAD")
    set_tree.write(sha, repo, repo / ".set-tree")
    (repo / "wmbook" / "a.py").write_text("x = 2\n")
    (repo / "notebooks" / "n.py").unlink()
    (repo / "wmbook" / "extra.py").write_text("")
    (repo / "data" / "reports" / "NOTES.md").write_text("other notes\n")  # there, so checked
    problems = _verify(repo, sha)
    assert sorted(problems) == ["data/reports/NOTES.md: differs from the commit", "notebooks/n.py: missing",
                                "wmbook/a.py: differs from the commit", "wmbook/extra.py: not in the commit"]


def test_another_commit_or_no_manifest_is_refused(repo):
    sha = _git(repo, "rev-parse", "HEAD")
    assert "no .set-tree" in _verify(repo, sha)[0]
    set_tree.write(sha, repo, repo / ".set-tree")
    assert "not of 1234567" in _verify(repo, "1234567")[0]
    assert _verify(repo, "")  # a commit must be named


def test_write_refuses_a_working_tree_that_is_not_the_commit_s(repo):
    sha = _git(repo, "rev-parse", "HEAD")
    (repo / "wmbook" / "b.py").write_text("")
    with pytest.raises(SystemExit, match="untracked: wmbook/b.py"):
        set_tree.write(sha, repo, repo / ".set-tree")
    (repo / "wmbook" / "b.py").unlink()
    (repo / "wmbook" / "a.py").write_text("x = 3\n")
    with pytest.raises(SystemExit, match="changed: wmbook/a.py"):
        set_tree.write(sha, repo, repo / ".set-tree")
    (repo / "wmbook" / "a.py").write_text("x = 1\n")
    (repo / "data" / "reports" / "NOTES.md").unlink()  # the record may be moved aside before the copy
    set_tree.write(sha, repo, repo / ".set-tree")
    assert _verify(repo, sha) == []


def test_start_refuses_a_tree_that_is_not_the_set_s_commit(repo, tmp_path):
    sha = _git(repo, "rev-parse", "HEAD")
    set_tree.write(sha, repo, repo / ".set-tree")
    (repo / "wmbook" / "a.py").write_text("x = 2\n")
    root = tmp_path / "root"
    r = subprocess.run(["bash", str(REPO / "tools" / "gpu_set.sh"), "start", sha, "sets/h200", "5"], cwd=repo,
                       capture_output=True, text=True, env={"GPU_SET_ROOT": str(root), "PATH": os.environ["PATH"]},
                       timeout=60)
    assert r.returncode == 2
    assert "wmbook/a.py: differs from the commit" in r.stderr
    assert not root.exists()  # nothing started, nothing moved


def test_write_names_a_commit_git_does_not_know(repo, monkeypatch, capsys):
    monkeypatch.chdir(repo)
    assert set_tree.main(["write", "nosuch"]) == 2
    assert "nosuch" in capsys.readouterr().err
    assert not (repo / ".set-tree").exists()


def test_tree_writes_the_manifest_at_the_repository_s_root(repo):
    (repo / "tools").mkdir()
    for name in ("gpu_set.sh", "set_tree.py"):
        shutil.copy(REPO / "tools" / name, repo / "tools" / name)
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "tools")
    sha = _git(repo, "rev-parse", "HEAD")
    r = subprocess.run(["bash", str(repo / "tools" / "gpu_set.sh"), "tree", sha], cwd=repo / "wmbook",
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert (repo / ".set-tree").read_text().startswith(f"commit {sha}\n")
    assert not (repo / "wmbook" / ".set-tree").exists()
    assert _verify(repo, sha) == []
