"""Named ranges for the label hierarchy: torch.profiler record_function + NVTX, free when off."""

from __future__ import annotations

import contextlib
import functools

import torch

from .sections import _SINKS

_ENABLED = True
_NVTX = False
_DETAIL = False  # fine labels inside the DiT forward (attention, FFN, ...): off unless asked for


def set_labels(enabled: bool = True, nvtx: bool | None = None, detail: bool | None = None) -> None:
    """Switch label emission on/off globally (off: `label` returns a shared null context).

    `detail` switches the fine per-layer labels of `detail_label` (hundreds per forward, so they
    cost host time; the breakdown notebook turns them on only while it records a trace).
    """
    global _ENABLED, _NVTX, _DETAIL
    _ENABLED = bool(enabled)
    if nvtx is not None:
        _NVTX = bool(nvtx) and torch.cuda.is_available()
    if detail is not None:
        _DETAIL = bool(detail)


def labels_enabled() -> bool:
    return _ENABLED


_NULL = contextlib.nullcontext()


class _Range:
    __slots__ = ("name", "rf", "sink")

    def __init__(self, name: str, timed: bool = True):
        self.name = name
        self.rf = None
        # a SectionTimer attached with wmbook.profiling.sections.attach times coarse labels too
        self.sink = _SINKS[-1] if timed and _SINKS else None

    def __enter__(self):
        self.rf = torch.profiler.record_function(self.name)
        self.rf.__enter__()
        if _NVTX:
            torch.cuda.nvtx.range_push(self.name)
        if self.sink is not None:
            self.sink.push(self.name)
        return self

    def __exit__(self, *exc):
        if self.sink is not None:
            self.sink.pop()
        if _NVTX:
            torch.cuda.nvtx.range_pop()
        self.rf.__exit__(*exc)
        return False


_profiling = torch._C._autograd._profiler_enabled  # whether a torch.profiler / autograd profiler session records


def label(name: str):
    """Context manager for one labelled range (record_function + optional NVTX; a SectionTimer attached with
    wmbook.profiling.sections.attach times it). With nothing to receive it (no profiler recording, no NVTX, no
    timer) it is the shared null context: a record_function costs a few microseconds of host time even then (7 us on
    a 2-core CI host), which a launch-bound step pays per label (a CUDA-graph replay that takes 5 us on the GPU)."""
    if not _ENABLED or not (_SINKS or _NVTX or _profiling()):
        return _NULL
    return _Range(name)


def detail_label(name: str):
    """A fine label inside the model forward; null unless labels and `detail` are both on."""
    if not (_ENABLED and _DETAIL):
        return _NULL
    return _Range(name, timed=False)


def detail_enabled() -> bool:
    return _ENABLED and _DETAIL


def labelled(name: str):
    """Decorator form of `label`."""

    def deco(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with label(name):
                return fn(*args, **kwargs)

        return wrapper

    return deco
