"""Shared by the hostile-input tests (test_hostile_*.py): fingerprints of what must never change, and a runner for the
commands that returns (exit code, stdout, stderr)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# what a refused input, a fault or an interrupt must leave exactly as it was: the published README, the committed
# results store and the shipped weights
GUARDED = [ROOT / "README.md", *sorted((ROOT / "data" / "results").glob("results*.csv")),
           *sorted((ROOT / "data" / "weights").glob("world-*"))]


def fingerprint(paths) -> dict:
    """{path: its fingerprint, or None when absent} for files, and for folders every file below them: the SHA-256 of
    the bytes, and for a file over 1 MiB (the shipped weights) its size, inode and modification time, which any
    write or replace (a new inode) changes, without hashing 40 MB around every case."""
    out = {}
    for p in map(Path, paths):
        files = sorted(q for q in p.rglob("*") if q.is_file()) if p.is_dir() else [p]
        for f in files:
            if not f.is_file():
                out[str(f)] = None
                continue
            st = f.stat()
            out[str(f)] = ((st.st_size, st.st_ino, st.st_mtime_ns) if st.st_size > 2**20 else
                           hashlib.sha256(f.read_bytes()).hexdigest())
    return out


def run_cli(args, env=None, timeout=120, cwd=ROOT):
    """`python ARGS` in a fresh interpreter: (exit code, stdout, stderr)."""
    e = {**os.environ, **(env or {})}
    p = subprocess.run([sys.executable, *map(str, args)], capture_output=True, text=True, timeout=timeout, env=e,
                       cwd=cwd)
    return p.returncode, p.stdout, p.stderr


def one_message(err: str, *needles: str) -> None:
    """stderr holds a message with every needle and no traceback, and never advises weights_only=False."""
    assert "Traceback" not in err, err
    assert "weights_only=False" not in err, err
    for n in needles:
        assert n in err, f"{n!r} not in {err!r}"
