"""The decode step a decoder variant compiles or captures: defined beside the models, which hand it out, so that a
model never imports the workload layer above it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

__all__ = ["DecoderStep"]


@dataclass(frozen=True)
class DecoderStep:
    """The per-frame decode callable that decoder variants compile or capture: `getattr(owner, attr)`. compiled(args):
    whether a call is one to compile (None: every call; a streaming decoder compiles its steady frames only).
    make_static(pipe): what capture needs first (the streaming decoder's caches in fixed buffers), or None."""

    owner: Any
    attr: str
    compiled: Callable | None = None
    make_static: Callable | None = None
