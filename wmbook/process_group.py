"""Children of this process that run wmbook: the environment that makes them import this copy of the package
(`package_env`), and ending one started in a process group of its own (`subprocess.Popen(...,
start_new_session=True)`: the child and everything it started, torchrun's ranks or inductor's compile workers, go
together)."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

PACKAGE_ROOT = Path(__file__).resolve().parents[1]  # the folder holding `wmbook/`


def package_env(**extra: str) -> dict[str, str]:
    """This process's environment with PACKAGE_ROOT first on PYTHONPATH (the child imports this copy), plus `extra`."""
    path = os.pathsep.join([str(PACKAGE_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    return {**os.environ, "PYTHONPATH": path, **extra}


def stop_group(proc: subprocess.Popen, term_wait_s: float = 15.0, kill_wait_s: float = 5.0) -> None:
    """SIGTERM to the child's process group, then SIGKILL if it has not ended within term_wait_s."""
    for sig, wait in ((signal.SIGTERM, term_wait_s), (signal.SIGKILL, kill_wait_s)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue
