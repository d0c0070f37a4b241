"""Where things live: the repository, committed data, local reports and per-notebook artifacts."""

from __future__ import annotations

import functools
import os
import subprocess
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
DATA_DIR = REPO_ROOT / "data"
NOTEBOOKS_DIR = REPO_ROOT / "notebooks"
REPORTS_DIR = REPO_ROOT / "reports"  # git-ignored: local runs
RESULTS_PATH = DATA_DIR / "results" / "results.csv"  # committed: real-shape rows
TINY_RESULTS_PATH = REPORTS_DIR / "results" / "results-tiny.csv"  # git-ignored: tiny-preset (CI, laptop) rows
CEILINGS_DIR = DATA_DIR / "ceilings"  # committed: ceilings measured on GPUs


def artifacts_dir(notebook: str, preset: str, device_type: str) -> Path:
    """Default output folder of one notebook run: traces, videos, session reports."""
    return REPORTS_DIR / "artifacts" / notebook / f"{preset}-{device_type}"



@functools.lru_cache(maxsize=1)
def git_commit() -> str:
    """Short HEAD commit of the repository, '+dirty' if tracked files changed; '' when unknown.

    $WMBOOK_GIT_COMMIT overrides it: a copy of the working tree run elsewhere (a lent GPU host) may carry a
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
