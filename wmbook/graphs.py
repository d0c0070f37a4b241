"""CUDA-graph capture of a callable: static input and output buffers, one memory pool, warm-up before capture,
replay, and a fallback that says why a graph could not be captured.

    g = GraphedCallable(model._forward, name="DiT forward", key_fn=cache_slots)
    model._forward = g            # first calls of each input signature run eagerly (warm-up: compile, autotuning,
    ...                           # lazy init), the next one is captured, every later one replays
    g.table()                     # one row per signature: captured or why not, replays, graph memory

What a graph replays is what the capture recorded: the same kernels on the same addresses. So:
- tensor arguments are copied into the graph's static input buffers before each replay (pytrees of tuples, lists,
  dicts and the dataclasses named in `FLATTEN_DATACLASSES` are looked into); other arguments (ints, the caches of a
  generation, ...) must be the same object or value, and are part of the signature, with `key_fn(args, kwargs)`;
- state the callable reads or writes outside its arguments (KV caches, cross-attention K/V) must keep its
  addresses between replays: allocate it once and update it in place (the static caches of notebook 06);
- outputs live in the graph's memory and are overwritten by the next replay: they are cloned on return
  (`clone_outputs=False` hands out the static buffers, in the same output object every replay, when the caller
  consumes them first).

On a CPU, or with graphs switched off, the callable runs eagerly and `table()` says why.
"""

from __future__ import annotations

import dataclasses
import linecache
import sys
import traceback
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

FLATTEN_DATACLASSES: set[type] = set()  # dataclass types whose tensor fields are graph inputs (register_input_type)


def register_input_type(cls: type) -> type:
    """Treat the dataclass `cls` as a container of graph inputs (its fields are looked into); returns cls."""
    if not dataclasses.is_dataclass(cls):
        raise ValueError(f"{cls.__name__} is not a dataclass")
    FLATTEN_DATACLASSES.add(cls)
    return cls


# --- flattening: tensors out of nested arguments, and back -----------------------------------------------------

def _flatten(obj, leaves: list) -> Any:
    """A structure spec of `obj` with every tensor replaced by its index into `leaves` (appended)."""
    if isinstance(obj, torch.Tensor):
        leaves.append(obj)
        return ("T", len(leaves) - 1)
    if isinstance(obj, (tuple, list)):
        return ("L" if isinstance(obj, list) else "U", tuple(_flatten(x, leaves) for x in obj))
    if isinstance(obj, dict):
        return ("D", tuple((k, _flatten(v, leaves)) for k, v in obj.items()))
    if type(obj) in FLATTEN_DATACLASSES:
        return ("C", type(obj), tuple((f.name, _flatten(getattr(obj, f.name), leaves))
                                      for f in dataclasses.fields(obj)))
    return ("O", obj)


def _unflatten(spec, leaves: list):
    kind = spec[0]
    if kind == "T":
        return leaves[spec[1]]
    if kind in ("L", "U"):
        items = [_unflatten(s, leaves) for s in spec[1]]
        return items if kind == "L" else tuple(items)
    if kind == "D":
        return {k: _unflatten(s, leaves) for k, s in spec[1]}
    if kind == "C":
        return spec[1](**{k: _unflatten(s, leaves) for k, s in spec[2]})
    return spec[1]


def _signature(spec) -> Any:
    """A hashable signature of a structure spec: opaque objects by value when hashable and simple, else by id."""
    kind = spec[0]
    if kind == "T":
        return ("T",)
    if kind in ("L", "U"):
        return (kind, tuple(_signature(s) for s in spec[1]))
    if kind == "D":
        return ("D", tuple((k, _signature(s)) for k, s in spec[1]))
    if kind == "C":
        return ("C", spec[1], tuple((k, _signature(s)) for k, s in spec[2]))
    obj = spec[1]
    if obj is None or isinstance(obj, (bool, int, float, str, torch.dtype, torch.device)):
        return ("O", obj)
    if isinstance(obj, tuple) and all(isinstance(x, (bool, int, float, str)) for x in obj):
        return ("O", obj)
    return ("O", type(obj).__name__, id(obj))


def _opaque(spec) -> list:
    """The objects a signature knows by id (caches, modules): an entry holds them, so a freed object's id cannot
    come back as another object's and match a graph whose addresses belong to the first."""
    kind = spec[0]
    if kind in ("L", "U"):
        return [o for s in spec[1] for o in _opaque(s)]
    if kind == "D":
        return [o for _, s in spec[1] for o in _opaque(s)]
    if kind == "C":
        return [o for _, s in spec[2] for o in _opaque(s)]
    if kind == "O" and len(_signature(spec)) == 3:
        return [spec[1]]
    return []


def _meta(t: torch.Tensor) -> tuple:
    return tuple(t.shape), tuple(t.stride()), t.dtype, t.device, t.requires_grad


_EMPTY_CALL = _flatten(((), {}), [])  # the structure spec of a call without arguments


# --- the capture ------------------------------------------------------------------------------------------------

@dataclass
class _Entry:
    """One input signature: eager warm-up calls so far, then its graph (or why there is none)."""

    warmup_calls: int = 0
    graph: Any = None  # torch.cuda.CUDAGraph
    static_in: list = field(default_factory=list)
    out_spec: Any = None
    static_out: list = field(default_factory=list)
    replays: int = 0
    eager_calls: int = 0
    pool_bytes: int = 0  # device memory the capture took (graph-owned activations and outputs)
    failure: str | None = None  # why no graph: the capture's error and the op that caused it
    rewrite: Any = None  # memset_kernels: what graph_memsets.memsets_to_kernels did to the graph
    keep: list = field(default_factory=list)  # the signature's opaque objects, held so that their ids stay unique
    out_obj: Any = None  # clone_outputs=False: the output structure over the static buffers, built once


class GraphedCallable:
    """`fn` run through CUDA graphs, one per input signature (see the module docstring).

    warmup: eager calls of a signature before it is captured (torch.compile and Triton autotuning finish there,
    and caches are filled). pool: a graph memory pool shared with other GraphedCallables (default: one per
    instance). key_fn(args, kwargs): more of the signature, e.g. the KV-cache write slots that the captured
    kernels' addresses depend on. enabled=False, or a CPU device, runs `fn` eagerly. memset_kernels=True: the
    graph's small memsets become kernel nodes before it is instantiated (wmbook.graph_memsets; the variant
    graph-memset-kernels sets it).
    """

    def __init__(self, fn: Callable, *, name: str = "", warmup: int = 2, pool=None, key_fn=None,
                 clone_outputs: bool = True, device=None, enabled: bool = True, memset_kernels: bool = False):
        if not callable(fn):
            raise ValueError(f"fn must be callable, got {type(fn).__name__}")
        if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 1:
            raise ValueError(f"warmup={warmup!r} is not allowed; allowed values: an integer >= 1 (eager calls before "
                             f"the capture: compile, autotuning and lazy init must not happen while capturing)")
        self.fn = fn
        self.name = name or getattr(fn, "__qualname__", type(fn).__name__)
        self.warmup = warmup
        self.key_fn = key_fn
        self.clone_outputs = clone_outputs
        if not isinstance(memset_kernels, bool):
            raise ValueError(f"memset_kernels={memset_kernels!r} is not allowed; allowed values: True, False")
        self.memset_kernels = memset_kernels
        dev = torch.device(device) if device is not None else torch.device("cuda" if torch.cuda.is_available()
                                                                           else "cpu")
        self.device = dev
        self.disabled_reason = None
        if not enabled:
            self.disabled_reason = "graphs switched off"
        elif dev.type != "cuda" or not torch.cuda.is_available():
            self.disabled_reason = "CUDA graphs need a CUDA device: ran eagerly"
        self.pool = pool if pool is not None or self.disabled_reason else torch.cuda.graph_pool_handle()
        self.entries: dict[Any, _Entry] = {}
        self._no_args: _Entry | None = None  # the captured entry of a call without arguments (the fast path)
        self.resets = 0  # reset() calls so far: a signature's counts start again after one

    def __call__(self, *args, **kwargs):
        if self.disabled_reason is not None:
            return self.fn(*args, **kwargs)
        e = self._no_args
        if e is not None and not args and not kwargs:
            # no arguments and no key_fn: the signature cannot change, so the replay skips building it (a motion fetch
            # spends ~5 us of the GPU per step, about what flattening, keying and looking up its entry cost the host)
            return self._replay(e, ())
        leaves: list = []
        spec = _flatten((args, kwargs), leaves)
        extra = self.key_fn(args, kwargs) if self.key_fn is not None else None
        key = (_signature(spec), tuple(_meta(t) for t in leaves), extra)
        e = self.entries.get(key)
        if e is None:
            e = self.entries[key] = _Entry(keep=_opaque(spec))
        if e.graph is None:
            if e.failure is not None or e.warmup_calls < self.warmup:
                e.warmup_calls += e.failure is None
                e.eager_calls += 1
                return self.fn(*args, **kwargs)
            out = self._capture(e, spec, leaves)
            if e.graph is None:  # capture failed: eager, and the entry says why
                e.eager_calls += 1
                return self.fn(*args, **kwargs)
            return out  # this call's result is the sync check's run: the callable ran once, as every call does
        return self._replay(e, leaves)

    def _replay(self, e: _Entry, leaves) -> Any:
        for s, t in zip(e.static_in, leaves):
            if s.data_ptr() != t.data_ptr():
                s.copy_(t)
        e.graph.replay()
        e.replays += 1
        if self.clone_outputs:
            return _unflatten(e.out_spec, [t.clone() for t in e.static_out])
        if e.out_obj is None:  # every replay returns the same buffers: their structure is built once, not per call
            e.out_obj = _unflatten(e.out_spec, e.static_out)  # (1.5 us of host time for an 8-field dataclass)
        return e.out_obj

    def _capture(self, e: _Entry, spec, leaves: list):
        """Capture the entry's graph; returns the output of this call (the eager run before the capture), or None
        when the capture failed (e.failure says why; the caller runs the callable eagerly)."""
        e.static_in = [t.detach().clone() for t in leaves]
        args, kwargs = _unflatten(spec, e.static_in)
        before = torch.cuda.memory_allocated(self.device)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        # one eager run on the capture stream warms its cuBLAS/cuDNN handles and workspaces and, with sync debugging
        # set to raise, finds an op that synchronizes with the host: such an op cannot be captured, and a capture
        # that fails part-way can leave the CUDA generators marked as capturing (later random draws then fail).
        # That run is this call's run: its output is returned and the graph is not replayed now, so a callable that
        # updates state (a streaming decoder's past frames) advances once per call, as it would eagerly.
        with torch.cuda.stream(side):
            culprit, result = find_sync(self.fn, *args, return_output=True, **kwargs)
        torch.cuda.current_stream(self.device).wait_stream(side)
        if culprit:
            e.failure, e.static_in = f"synchronizes with the host: {culprit}", []
            return None
        result = torch.utils._pytree.tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, result)
        try:
            g = torch.cuda.CUDAGraph(keep_graph=True) if self.memset_kernels else torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, pool=self.pool, stream=side):
                out = self.fn(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001  (a capture that fails is a finding: say why, run eagerly)
            torch.cuda.synchronize(self.device)
            e.failure = f"capture failed: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
            e.static_in = []
            return None
        if self.memset_kernels:
            from .graph_memsets import memsets_to_kernels  # noqa: PLC0415  (ctypes on the CUDA driver: GPU only)

            try:
                with torch.cuda.device(self.device):
                    e.rewrite = memsets_to_kernels(g.raw_cuda_graph())
                    g.instantiate()
            except Exception as exc:  # noqa: BLE001  (a graph half rewritten is not replayed: eager, and say why)
                e.failure = f"memset rewrite failed: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
                e.static_in, e.rewrite = [], None
                return None
        out_leaves: list = []
        e.out_spec = _flatten(out, out_leaves)
        e.static_out = out_leaves
        e.graph = g
        e.pool_bytes = torch.cuda.memory_allocated(self.device) - before
        if not leaves and self.key_fn is None and spec == _EMPTY_CALL:
            self._no_args = e
        return result

    # --- what happened ------------------------------------------------------------------------------------------
    @property
    def captured(self) -> int:
        return sum(e.graph is not None for e in self.entries.values())

    @property
    def failures(self) -> list[str]:
        return [e.failure for e in self.entries.values() if e.failure]

    def warming(self) -> dict:
        """{signature key: eager warm-up calls so far} of the input signatures neither captured nor failed: the next
        call of each runs eagerly or captures it, what no timed call should do (empty when graphs are off)."""
        if self.disabled_reason is not None:
            return {}
        return {k: e.warmup_calls for k, e in self.entries.items() if e.graph is None and e.failure is None}

    def table(self):
        """One row per input signature: graph captured (or why not), eager calls, replays, graph memory (MiB)."""
        import pandas as pd  # noqa: PLC0415  heavy: pandas, only for table()

        if self.disabled_reason is not None:
            return pd.DataFrame([{"callable": self.name, "graph": False, "why not": self.disabled_reason}])
        rows = [{"callable": self.name, "signature": i, "graph": e.graph is not None, "eager calls": e.eager_calls,
                 "replays": e.replays, "graph memory MiB": e.pool_bytes / 2**20, "why not": e.failure or ""}
                | ({"memsets as kernels": f"{e.rewrite.replaced} of {e.rewrite.memsets}" if e.rewrite else ""}
                   if self.memset_kernels else {})
                for i, e in enumerate(self.entries.values())]
        return pd.DataFrame(rows)

    def reset(self) -> None:
        """Drop every graph (their memory returns to the pool)."""
        self.entries.clear()
        self._no_args = None
        self.resets += 1


def find_sync(fn, *args, return_output: bool = False, **kwargs):
    """Run fn once with CUDA sync debugging set to raise, and name the first synchronizing op: 'file:line: code'
    of the innermost frame outside torch (None when nothing synchronizes, or on a CPU). return_output=True returns
    (culprit, fn's output), the output None when fn raised."""
    culprit = out = None
    if torch.cuda.is_available():
        old = torch.cuda.get_sync_debug_mode()
        with warnings.catch_warnings():  # "Synchronization debug mode is a prototype feature": we know, every call
            warnings.filterwarnings("ignore", message="Synchronization debug mode is a prototype feature")
            torch.cuda.set_sync_debug_mode("error")
        try:
            out = fn(*args, **kwargs)
        except RuntimeError as exc:
            if "synchroniz" not in str(exc):
                culprit = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
            else:
                culprit = _user_frame(exc) or str(exc).splitlines()[0][:200]
        finally:
            torch.cuda.set_sync_debug_mode(old)
            torch.cuda.synchronize()
    return (culprit, out) if return_output else culprit


def _user_frame(exc: BaseException) -> str | None:
    """'file:line: code' of the innermost traceback frame that is not inside torch (or this module)."""
    torch_dir = torch.__file__.rsplit("/", 1)[0]
    here = __file__
    found = None
    for fs in traceback.extract_tb(exc.__traceback__):
        if fs.filename.startswith(torch_dir) or fs.filename == here or fs.filename.startswith(sys.prefix + "/lib"):
            continue
        found = fs
    if found is None:
        return None
    code = (found.line or linecache.getline(found.filename, found.lineno)).strip()
    return f"{'/'.join(Path(found.filename).parts[-2:])}:{found.lineno}: {code}"


__all__ = ["FLATTEN_DATACLASSES", "GraphedCallable", "find_sync", "register_input_type"]
