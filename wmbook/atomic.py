"""Atomic file writes: a temp file in the destination folder, fsync, then os.replace."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


@contextlib.contextmanager
def atomic_open(dest, mode: str = "w", **kwargs):
    """Open a temp file beside `dest`; on success it replaces `dest`, on any error it is removed.

    An interrupt or failure mid-write leaves the old `dest` (if any) untouched.
    """
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, mode, **kwargs) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; results and reports are meant to be shared
        os.replace(tmp, dest)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write_text(dest, text: str) -> Path:
    """Write `text` (UTF-8) to `dest` atomically; returns the path."""
    with atomic_open(dest, "w", encoding="utf-8") as f:
        f.write(text)
    return Path(dest)


def atomic_write_many(files: dict) -> list[Path]:
    """Write several files {dest: bytes} as one change: every one is written and synced to a temp file beside its
    dest before the first rename, so a failure while writing (a full disk, an interrupt) leaves every dest as it was;
    then each temp file replaces its dest. Returns the dests."""
    staged: list[tuple[str, Path]] = []
    try:
        for dest, data in files.items():
            dest = Path(dest)
            dest.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".tmp")
            staged.append((tmp, dest))
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.chmod(tmp, 0o666 & ~_umask())
        for tmp, dest in staged:
            os.replace(tmp, dest)
    except BaseException:
        for tmp, _ in staged:
            if os.path.exists(tmp):
                os.unlink(tmp)
        raise
    return [dest for _, dest in staged]


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
