"""Where things live: the repository, committed data, local reports and per-notebook artifacts."""

from __future__ import annotations

import functools
import os
import subprocess
from pathlib import Path

from .errors import InputError

REPO_ROOT = Path(__file__).resolve().parent.parent
DATA_DIR = REPO_ROOT / "data"
NOTEBOOKS_DIR = REPO_ROOT / "notebooks"
REPORTS_DIR = REPO_ROOT / "reports"  # git-ignored: local runs
RESULTS_PATH = DATA_DIR / "results" / "results.csv"  # committed: real-shape rows
TINY_RESULTS_PATH = REPORTS_DIR / "results" / "results-tiny.csv"  # git-ignored: tiny-preset (CI, laptop) rows
CEILINGS_DIR = DATA_DIR / "ceilings"  # committed: ceilings measured on GPUs
GPU_TIME_FILE = "gpu_time.json"  # a published folder's set: its commit, device and GPU time (wmbook.regenerate)


def artifacts_dir(notebook: str, preset: str, device_type: str) -> Path:
    """Default output folder of one notebook run: traces, videos, session reports."""
    return REPORTS_DIR / "artifacts" / notebook / f"{preset}-{device_type}"



@functools.lru_cache(maxsize=1)
def git_commit() -> str:
    """Short HEAD commit of the repository, '+dirty' if tracked files changed; '' when unknown.

    $WMBOOK_GIT_COMMIT overrides it: a copy of the working tree run elsewhere (a remote GPU host) may carry a
    stale .git, so the launcher passes the commit it was copied from.
    """
    env = os.environ.get("WMBOOK_GIT_COMMIT")
    if env:
        return env

    def git(*args: str) -> str:
        out = subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10, check=True)
        return out.stdout.strip()

    try:
        commit = git("rev-parse", "--short", "HEAD")
        if git("status", "--porcelain", "--untracked-files=no"):
            commit += "+dirty"
        return commit
    except (OSError, subprocess.SubprocessError):
        return ""


def _folder_problem(path: Path) -> str | None:
    """Why no file can be written in folder `path` (existing or to be created), or None when one can."""
    if path.exists() and not path.is_dir():
        return f"{str(path)!r} is a file, not a folder"
    base = path
    while not base.exists() and base != base.parent:
        base = base.parent
    if not base.is_dir():
        return f"{str(base)!r} is a file, so no folder can be made under it"
    if not os.access(base, os.W_OK | os.X_OK):
        return f"{str(base)!r} is not writable"
    return None


def check_output_dir(path, name: str, allowed: str = "a folder you can write to, existing or to be created") -> Path:
    """`path` as a folder a run may write into: an existing writable folder, or one that can be created (its nearest
    existing ancestor a writable folder). Checked before any work, so a run never fails at its last write; raises
    InputError naming `name`."""
    path = Path(path).expanduser()
    why = _folder_problem(path)
    if why:
        raise InputError(f"{name}={str(path)!r} is not allowed: {why}; allowed values: {allowed}")
    return path


def check_output_file(path, name: str, allowed: str = "a file path") -> Path:
    """`path` as a file a run will write (or replace, or append to): not a folder, writable if it exists, and its
    folder writable or creatable. Raises InputError naming `name` and `allowed`."""
    path = Path(path).expanduser()
    why = None
    if path.is_dir():
        why = "it is a folder"
    elif path.exists() and not os.access(path, os.W_OK):
        why = "it is not writable"
    else:
        why = _folder_problem(path.parent)
    if why:
        raise InputError(f"{name}={str(path)!r} is not allowed: {why}; allowed values: {allowed}")
    return path
