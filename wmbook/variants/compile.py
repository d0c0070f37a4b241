"""torch.compile applied from outside (whole model or the repeated blocks), and measured honestly.

    spec = CompileSpec(scope="regional", mode="default", dynamic=False)
    record = apply_compile(model, spec, regions=list(model.blocks))   # in place; twice is an error
    with CompileMonitor() as mon:                                     # what compiled, why it recompiled
        run(model)
    mon.summary(); mon.recompiles; mon.graph_breaks                   # dict, DataFrames
    graph_break_report(model, *args)                                  # torch._dynamo.explain as a table
    measure_compile_time(make_model, run_once, spec, regions="blocks")  # cold vs warm on-disk cache

Compile time is host work: it is timed with the wall clock around a synchronized first call.
CUDA graphs (mode="reduce-overhead") belong to notebook 06 and are refused here.

Torch internals used (all read defensively, checked on torch 2.13; names exist in the 2.11 source):
`torch._dynamo.utils.counters` (frames / unique_graphs / graph_break), `torch._dynamo.utils.
get_compilation_metrics()` (one CompilationMetrics per compiled frame: recompile_reason, phase times,
FX/AOT cache hits), the `graph_breaks` log artifact (user locations) and the
"torch._dynamo hit config.recompile_limit" warning of `torch._dynamo.convert_frame`.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import inspect
import json
import logging
import os
import re
import shutil
import subprocess as _subprocess
import sys
import tempfile
import time
import warnings
from collections import Counter
from dataclasses import dataclass, field

import pandas as pd
import torch
import torch._dynamo

from ..bench import resolve_device, time_fn, time_once

SCOPES = ("regional", "whole")
MODES = ("default", "max-autotune-no-cudagraphs")
BACKENDS = ("inductor", "aot_eager", "eager")
_CUDAGRAPH_MODES = ("reduce-overhead", "max-autotune")  # both capture CUDA graphs
_MARK = "_wmbook_compiled"  # set on every module this file compiled (value: the spec name)
_RECORD = "_wmbook_compile_record"  # set on the root model
_RESULT_TAG = "WMBOOK_COMPILE_RESULT "


# --- spec ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CompileSpec:
    """How to compile: scope (regional | whole), mode, dynamic, backend, fullgraph; validated here."""

    scope: str = "regional"
    mode: str = "default"
    dynamic: bool | None = False
    backend: str = "inductor"
    fullgraph: bool = False

    def __post_init__(self):
        if self.scope not in SCOPES:
            raise ValueError(f"scope={self.scope!r} is not allowed; allowed values: {list(SCOPES)}")
        if isinstance(self.mode, str) and self.mode not in MODES and (
                self.mode in _CUDAGRAPH_MODES or "cudagraph" in self.mode):
            raise ValueError(f"mode={self.mode!r} captures CUDA graphs; CUDA graphs belong to notebook 06 "
                             f"(CUDA graphs). Allowed modes here: {list(MODES)}")
        if self.mode not in MODES:
            raise ValueError(f"mode={self.mode!r} is not allowed; allowed values: {list(MODES)}")
        if not (self.dynamic is None or isinstance(self.dynamic, bool)):
            raise ValueError(f"dynamic={self.dynamic!r} is not allowed; allowed values: [False, True, None]")
        if self.backend not in BACKENDS:
            raise ValueError(f"backend={self.backend!r} is not allowed; allowed values: {list(BACKENDS)}")
        if self.mode != "default" and self.backend != "inductor":
            raise ValueError(f"mode={self.mode!r} needs backend='inductor', got backend={self.backend!r}")
        if not isinstance(self.fullgraph, bool):
            raise ValueError(f"fullgraph={self.fullgraph!r} is not allowed; allowed values: [False, True]")

    @property
    def name(self) -> str:
        """Short label, e.g. `regional-default-static` (dynamic: static | dynamic | auto)."""
        dyn = {False: "static", True: "dynamic", None: "auto"}[self.dynamic]
        s = f"{self.scope}-{self.mode}-{dyn}"
        if self.backend != "inductor":
            s += f"-{self.backend}"
        return s + ("-fullgraph" if self.fullgraph else "")

    def compile_kwargs(self) -> dict:
        """Keyword arguments for torch.compile / nn.Module.compile."""
        kw = {"backend": self.backend, "dynamic": self.dynamic, "fullgraph": self.fullgraph}
        if self.mode != "default":
            kw["mode"] = self.mode
        return kw

    def to_dict(self) -> dict:
        return {"scope": self.scope, "mode": self.mode, "dynamic": self.dynamic, "backend": self.backend,
                "fullgraph": self.fullgraph}


# --- apply ------------------------------------------------------------------------------------------------


@dataclass
class CompileRecord:
    """What apply_compile compiled: qualified names, classes, and how (Module.compile or forward)."""

    spec: CompileSpec
    targets: list[str]  # qualified module names; "" is the root model
    classes: dict[str, int]  # class name -> how many targets
    methods: list[str]  # per target: "Module.compile" or "forward" (torch-defined forwards, see below)
    shares_code: bool  # regional: one compiled code per block class (inline_inbuilt_nn_modules)
    torch_version: str = torch.__version__
    _modules: list = field(default_factory=list, repr=False)

    @property
    def n_targets(self) -> int:
        return len(self.targets)

    def summary(self) -> dict:
        return {"name": self.spec.name, **self.spec.to_dict(), "n_targets": self.n_targets,
                "classes": dict(self.classes), "methods": dict(Counter(self.methods)),
                "shares_code": self.shares_code, "torch": self.torch_version}


def _inline_inbuilt_nn_modules() -> bool:
    # always True on 2.13 (reading the flag warns that it is deprecated); a real flag on older versions
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return bool(getattr(torch._dynamo.config, "inline_inbuilt_nn_modules", True))


def _forward_owner(module: torch.nn.Module) -> str:
    for klass in type(module).__mro__:
        if "forward" in klass.__dict__:
            return klass.__module__ or ""
    return ""


def _is_compiled(module: torch.nn.Module) -> bool:
    return (_MARK in module.__dict__ or getattr(module, "_compiled_call_impl", None) is not None
            or "forward" in module.__dict__)


def _resolve_regions(model: torch.nn.Module, regions) -> list[torch.nn.Module]:
    """regions: list/ModuleList of modules, a callable (model) -> modules or () -> modules, or an
    attribute path of `model` such as "blocks"."""
    if isinstance(regions, str):
        obj = model
        for part in regions.split("."):
            if not hasattr(obj, part):
                raise ValueError(f"regions={regions!r}: {type(obj).__name__} has no attribute {part!r}")
            obj = getattr(obj, part)
        regions = obj
    elif callable(regions) and not isinstance(regions, torch.nn.Module):
        try:
            n_params = len(inspect.signature(regions).parameters)
        except (TypeError, ValueError):
            n_params = 1
        regions = regions(model) if n_params >= 1 else regions()
    if isinstance(regions, torch.nn.Module) and not isinstance(regions, (torch.nn.ModuleList, torch.nn.Sequential)):
        regions = [regions]
    try:
        out = list(regions)
    except TypeError:
        raise ValueError(f"regions must be a list of modules, a callable returning them or an attribute name, "
                         f"got {type(regions).__name__}") from None
    bad = [type(m).__name__ for m in out if not isinstance(m, torch.nn.Module)]
    if bad:
        raise ValueError(f"regions must all be torch.nn.Module, got {bad[:3]}")
    if not out:
        raise ValueError("regions is empty: a regional compile needs at least one module to compile")
    if len({id(m) for m in out}) != len(out):
        raise ValueError("regions lists the same module more than once")
    return out


def apply_compile(model: torch.nn.Module, spec: CompileSpec, regions=None) -> CompileRecord:
    """Compile `model` in place: the whole forward, or every module of `regions` (scope="regional").

    regions: a list of modules (e.g. `list(model.blocks)`), a callable returning them, or an
    attribute path such as "blocks". Blocks of one class share compiled code (dynamo inlines
    nn.Module calls and guards on the class, not the instance). Modules whose forward is defined
    inside torch (nn.Sequential, nn.Linear, ...) get `forward` replaced by a compiled one, because
    `nn.Module.compile()` silently compiles nothing for them. Applying twice raises.
    """
    if not isinstance(spec, CompileSpec):
        raise ValueError(f"spec must be a CompileSpec, got {type(spec).__name__}")
    if not isinstance(model, torch.nn.Module):
        raise ValueError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if _RECORD in model.__dict__:
        raise RuntimeError(f"model is already compiled ({model.__dict__[_RECORD].spec.name}); build a fresh "
                           f"model or call remove_compile(model) first")
    names = {id(m): n for n, m in model.named_modules()}
    if spec.scope == "whole":
        if regions is not None:
            raise ValueError("regions is only for scope='regional'; scope='whole' compiles the model's forward")
        targets = [model]
    else:
        if regions is None:
            raise ValueError("scope='regional' needs regions= (e.g. list(model.blocks) or 'blocks')")
        targets = _resolve_regions(model, regions)
        outside = [type(m).__name__ for m in targets if id(m) not in names]
        if outside:
            raise ValueError(f"regions must be submodules of the model; not found in it: {outside[:3]}")
        ids = {id(m) for m in targets}
        for m in targets:
            nested = [names[id(s)] for s in m.modules() if s is not m and id(s) in ids]
            if nested:
                raise ValueError(f"region {names[id(m)] or type(m).__name__!r} contains other regions {nested[:3]}; "
                                 f"nested compiled regions are not allowed")
    already = [names.get(id(m), "?") or "<model>" for m in model.modules() if _is_compiled(m)]
    if already:
        raise RuntimeError(f"modules already compiled (or forward overridden): {already[:5]}; build a fresh "
                           f"model or call remove_compile(model) first")

    shares = _inline_inbuilt_nn_modules()
    if spec.scope == "regional" and not shares and len(targets) > 1:
        warnings.warn("torch._dynamo.config.inline_inbuilt_nn_modules is False: every block instance compiles "
                      "its own graph (and may hit the recompile limit); set it to True", stacklevel=2)
    kw = spec.compile_kwargs()
    methods = []
    for m in targets:
        if _forward_owner(m).startswith("torch."):
            m.forward = torch.compile(m.forward, **kw)  # instance attribute; hooks stay eager
            methods.append("forward")
        else:
            m.compile(**kw)
            methods.append("Module.compile")
        m.__dict__[_MARK] = spec.name
    record = CompileRecord(spec=spec, targets=[names[id(m)] for m in targets],
                           classes=dict(Counter(type(m).__name__ for m in targets)), methods=methods,
                           shares_code=shares, _modules=list(targets))
    model.__dict__[_RECORD] = record
    return record


def remove_compile(model: torch.nn.Module) -> CompileRecord:
    """Undo apply_compile on `model` (back to eager); returns the record it removed."""
    record = model.__dict__.pop(_RECORD, None)
    if record is None:
        raise RuntimeError("model was not compiled by apply_compile")
    for m, how in zip(record._modules, record.methods):
        if how == "forward":
            m.__dict__.pop("forward", None)
        else:
            m._compiled_call_impl = None
        m.__dict__.pop(_MARK, None)
    return record


# --- monitor ----------------------------------------------------------------------------------------------


def _first_line(text) -> str:
    return str(text or "").strip().splitlines()[0].strip() if str(text or "").strip() else ""


def _short_reason(text) -> str:
    """The informative line of a graph-break reason (skips dynamo's 'Encountered graph break ...' preamble)."""
    lines = [ln.strip() for ln in str(text or "").splitlines() if ln.strip()]
    for ln in lines:
        if not ln.startswith("Encountered graph break when attempting to trace"):
            return ln.rstrip(":")
    return lines[0] if lines else ""


def _parse_graph_break(msg: str) -> dict:
    m = re.search(r"in user code at (.+?):(\d+)\s*$", msg.splitlines()[0] if msg else "")
    if m:
        file, line = m.group(1), int(m.group(2))
    else:
        frames = re.findall(r'File "([^"]+)", line (\d+)', msg)
        file, line = (frames[-1][0], int(frames[-1][1])) if frames else (None, None)
    r = re.search(r"Graph Break Reason:(.*?)(?:\n\s*\nUser code traceback:|\Z)", msg, re.S)
    reason = _short_reason(r.group(1)) if r else _first_line(msg)
    return {"reason": reason, "file": file, "line": line, "detail": msg}


def _counters():
    from torch._dynamo.utils import counters

    return counters


def _metrics_list() -> list:
    try:
        from torch._dynamo.utils import get_compilation_metrics

        return list(get_compilation_metrics())
    except Exception:  # internal API moved: frames/recompile tables stay empty, counters still work
        return []


def _metrics_maxlen():
    try:
        import torch._dynamo.utils as du

        return du._compilation_metrics.maxlen
    except Exception:
        return None


def _set_metrics_limit(n: int) -> bool:
    try:
        from torch._dynamo.utils import set_compilation_metrics_limit

        set_compilation_metrics_limit(n)
        return True
    except Exception:
        return False


def _is_limit_hit(metric) -> bool:
    text = f"{getattr(metric, 'fail_reason', '') or ''}"
    return any(s in text for s in ("recompile limit", "recompile_limit", "cache_size_limit", "cache size limit"))


class _Capture(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records: list[tuple[str, int, str]] = []

    def emit(self, record):
        try:
            self.records.append((record.name, record.levelno, record.getMessage()))
        except Exception:  # a malformed record must never break the user's run
            pass


class CompileMonitor:
    """Counts what compiles inside the `with` block: frames, graphs, recompiles (with the guard that
    failed), graph breaks (reason and user location) and recompile-limit hits.

    Nests, restores every logger it touched, and does not call torch._logging.set_logs. Sources:
    dynamo's counters (counts), get_compilation_metrics() (one row per compiled frame: recompile
    reason, compile-phase times, FX/AOT cache hits) and the `graph_breaks` log artifact.
    """

    METRICS_LIMIT = 4096  # compiled frames kept while monitoring (torch keeps 64)

    def __init__(self, capture_logs: bool = True):
        self.capture_logs = capture_logs
        self._active = False
        self._result = None

    # lifecycle
    def __enter__(self):
        if self._active:
            raise RuntimeError("this CompileMonitor is already active; use a new one to nest")
        import torch._dynamo  # noqa: F401  (loads the modules whose loggers are captured)

        counters = _counters()
        self._sentinel = f"m{id(self)}_{time.perf_counter_ns()}"
        counters["wmbook_monitor"][self._sentinel] += 1
        self._c0 = {k: dict(v) for k, v in counters.items()}
        self._old_maxlen = None
        maxlen = _metrics_maxlen()
        if maxlen is not None and maxlen < self.METRICS_LIMIT and _set_metrics_limit(self.METRICS_LIMIT):
            self._old_maxlen = maxlen
        ms = _metrics_list()
        self._anchor = ms[-1] if ms else None
        self._handler = _Capture()
        self._touched: list[tuple[logging.Logger, int, bool]] = []
        if self.capture_logs:
            self._attach()
        self._active = True
        self._result = None
        return self

    def __exit__(self, *exc):
        try:
            self._result = self._collect()
        finally:
            self._detach()
            if self._old_maxlen is not None and _metrics_maxlen() == self.METRICS_LIMIT:
                _set_metrics_limit(self._old_maxlen)
            counters = _counters()
            counters["wmbook_monitor"].pop(self._sentinel, None)
            if not counters["wmbook_monitor"]:
                del counters["wmbook_monitor"]
            self._active = False
        return False

    def _attach(self) -> None:
        names = [n for n in list(logging.root.manager.loggerDict) if n.endswith(".__graph_breaks")]
        for n in names:
            lg = logging.getLogger(n)
            self._touched.append((lg, lg.level, lg.propagate))
            if not lg.isEnabledFor(logging.DEBUG):  # not already on by TORCH_LOGS: on, quietly
                lg.setLevel(logging.DEBUG)
                lg.propagate = False
            lg.addHandler(self._handler)
        cf = logging.getLogger("torch._dynamo.convert_frame")  # "hit config.recompile_limit" warnings
        self._touched.append((cf, cf.level, cf.propagate))
        cf.addHandler(self._handler)

    def _detach(self) -> None:
        for lg, level, propagate in reversed(self._touched):
            lg.removeHandler(self._handler)
            lg.setLevel(level)
            lg.propagate = propagate
        self._touched = []

    # collection
    def _collect(self) -> dict:
        counters = _counters()
        reset_inside = self._sentinel not in counters.get("wmbook_monitor", {})

        def diff(cat: str) -> dict:
            now = dict(counters.get(cat, {}))
            before = {} if reset_inside else self._c0.get(cat, {})
            return {k: v - before.get(k, 0) for k, v in now.items() if v - before.get(k, 0) > 0}

        ms = _metrics_list()
        ids = [id(m) for m in ms]
        truncated = False
        if self._anchor is None:
            new = ms
        elif id(self._anchor) in ids:
            new = ms[ids.index(id(self._anchor)) + 1:]
        else:  # cleared (all entries are new) or evicted (some lost)
            new = ms
            truncated = _metrics_maxlen() is not None and len(ms) >= _metrics_maxlen()
        records = list(self._handler.records)
        return {"frames": diff("frames"), "stats": diff("stats"), "graph_break": diff("graph_break"),
                "metrics": new, "records": records, "reset_inside": reset_inside, "truncated": truncated}

    def _data(self) -> dict:
        if self._active:
            return self._collect()
        if self._result is None:
            raise RuntimeError("CompileMonitor has not run yet: use it as `with CompileMonitor() as mon:`")
        return self._result

    # results
    @property
    def frames(self) -> pd.DataFrame:
        """One row per compiled frame (CompilationMetrics): function, recompile reason, times in s."""
        rows = []
        for m in self._data()["metrics"]:
            g = lambda k: getattr(m, k, None)  # noqa: E731
            reason = g("recompile_reason")
            rows.append({
                "compile_id": g("compile_id"), "function": g("co_name"), "file": g("co_filename"),
                "line": g("co_firstlineno"), "recompile": reason is not None and not _is_limit_hit(m),
                "recompile_reason": _first_line(reason) or None, "graph_ops": g("graph_op_count"),
                "compile_s": g("entire_frame_compile_time_s"), "backend_s": g("backend_compile_time_s"),
                "inductor_s": g("inductor_compile_time_s"), "codegen_s": g("code_gen_time_s"),
                "fx_cache_hits": g("inductor_fx_local_cache_hit_count"),
                "fx_cache_misses": g("inductor_fx_local_cache_miss_count"),
                "aot_cache_hits": g("aotautograd_local_cache_hit_count"),
                "aot_cache_misses": g("aotautograd_local_cache_miss_count"),
                "fail_type": g("fail_type"), "fail_reason": _first_line(g("fail_reason")) or None,
                "limit_hit": _is_limit_hit(m),
            })
        cols = ["compile_id", "function", "file", "line", "recompile", "recompile_reason", "graph_ops", "compile_s",
                "backend_s", "inductor_s", "codegen_s", "fx_cache_hits", "fx_cache_misses", "aot_cache_hits",
                "aot_cache_misses", "fail_type", "fail_reason", "limit_hit"]
        return pd.DataFrame(rows, columns=cols)

    @property
    def recompiles(self) -> pd.DataFrame:
        """One row per recompilation: the function and the guard that failed (`guard`, e.g. `n == 1`)."""
        rows = []
        for m in self._data()["metrics"]:
            reason = getattr(m, "recompile_reason", None)
            if reason is None or _is_limit_hit(m):
                continue
            first = _first_line(reason)
            guard = first.split("  #")[0].strip()
            entry, _, guard = guard.partition(": ") if re.match(r"^\d+/\d+: ", guard) else ("", "", guard)
            rows.append({"compile_id": getattr(m, "compile_id", None), "function": getattr(m, "co_name", None),
                         "file": getattr(m, "co_filename", None), "line": getattr(m, "co_firstlineno", None),
                         "failed_entry": entry or None, "guard": guard, "reason": first, "detail": str(reason)})
        return pd.DataFrame(rows, columns=["compile_id", "function", "file", "line", "failed_entry", "guard",
                                           "reason", "detail"])

    @property
    def graph_breaks(self) -> pd.DataFrame:
        """Graph breaks grouped by (reason, user file, line) with counts; locations come from the log."""
        d = self._data()
        parsed = [_parse_graph_break(msg) for name, _, msg in d["records"] if name.endswith(".__graph_breaks")]
        cols = ["reason", "file", "line", "count", "detail"]
        if parsed:
            df = pd.DataFrame(parsed)
            out = (df.groupby(["reason", "file", "line"], dropna=False, sort=False)
                   .agg(count=("detail", "size"), detail=("detail", "first")).reset_index())
            return out.sort_values("count", ascending=False, kind="stable").reset_index(drop=True)[cols]
        rows = [{"reason": _short_reason(k), "file": None, "line": None, "count": v, "detail": k}
                for k, v in d["graph_break"].items()]
        return pd.DataFrame(rows, columns=cols)

    @property
    def limit_hits(self) -> pd.DataFrame:
        """Recompile-limit hits: the function dynamo gave up on (it runs eager from then on)."""
        d = self._data()
        rows = []
        for name, level, msg in d["records"]:
            if name == "torch._dynamo.convert_frame" and "hit config." in msg:
                lim = re.search(r"hit config\.(\w+) \((\d+)\)", msg)
                fn = re.search(r"function: '([^']*)' \((.+):(\d+)\)", msg)
                last = re.search(r"last reason: (.*)", msg)
                rows.append({"limit": lim.group(1) if lim else None, "value": int(lim.group(2)) if lim else None,
                             "function": fn.group(1) if fn else None, "file": fn.group(2) if fn else None,
                             "line": int(fn.group(3)) if fn else None,
                             "last_reason": last.group(1).split("  #")[0].strip() if last else None})
        if not rows:  # warning not captured (logger renamed or silenced): fall back to the metrics
            for m in d["metrics"]:
                if _is_limit_hit(m):
                    rows.append({"limit": "recompile_limit", "value": None, "function": getattr(m, "co_name", None),
                                 "file": getattr(m, "co_filename", None), "line": getattr(m, "co_firstlineno", None),
                                 "last_reason": _first_line(getattr(m, "recompile_reason", None)) or None})
        return pd.DataFrame(rows, columns=["limit", "value", "function", "file", "line", "last_reason"])

    def summary(self) -> dict:
        """Counts and compile-phase times (s) for the monitored block."""
        d = self._data()
        fr = self.frames

        def total(col):
            return float(pd.to_numeric(fr[col], errors="coerce").fillna(0).sum()) if len(fr) else 0.0

        gb = d["graph_break"]
        compile_s, backend_s = total("compile_s"), total("backend_s")
        return {
            "frames_compiled": int(d["frames"].get("ok", 0)),
            "frame_attempts": int(d["frames"].get("total", 0)),
            "graphs": int(d["stats"].get("unique_graphs", 0)),
            "recompiles": int(fr["recompile"].sum()) if len(fr) else 0,
            "graph_breaks": int(sum(gb.values())),
            "unique_graph_breaks": len(gb),
            "recompile_limit_hits": len(self.limit_hits),
            "compile_s": compile_s,
            "dynamo_s": max(compile_s - backend_s, 0.0),
            "backend_s": backend_s,
            "inductor_s": total("inductor_s"),
            "codegen_s": total("codegen_s"),
            "fx_cache_hits": int(total("fx_cache_hits")),
            "fx_cache_misses": int(total("fx_cache_misses")),
            "aot_cache_hits": int(total("aot_cache_hits")),
            "aot_cache_misses": int(total("aot_cache_misses")),
            "metrics_truncated": bool(d["truncated"]),
            "counters_reset_inside": bool(d["reset_inside"]),
        }


# --- graph breaks -----------------------------------------------------------------------------------------


@dataclass
class GraphBreakReport:
    """torch._dynamo.explain as numbers and a table of break reasons with user-code locations."""

    graphs: int
    graph_breaks: int
    ops: int
    breaks: pd.DataFrame  # reason, file, line, function, code, count
    explain: object = field(repr=False, default=None)

    def summary(self) -> dict:
        return {"graphs": self.graphs, "graph_breaks": self.graph_breaks, "ops": self.ops,
                "unique_breaks": len(self.breaks)}


def graph_break_report(fn, *args, **kwargs) -> GraphBreakReport:
    """Run `fn(*args, **kwargs)` under torch._dynamo.explain; pass the eager (uncompiled) model.

    explain calls torch._dynamo.reset() before and after: compiled code elsewhere in the process is
    discarded and recompiles on its next call.
    """
    out = torch._dynamo.explain(fn)(*args, **kwargs)
    rows = []
    for r in getattr(out, "break_reasons", []) or []:
        stack = list(getattr(r, "user_stack", None) or [])
        loc = stack[-1] if stack else None
        rows.append({"reason": _short_reason(getattr(r, "reason", "")),
                     "file": getattr(loc, "filename", None), "line": getattr(loc, "lineno", None),
                     "function": getattr(loc, "name", None), "code": (getattr(loc, "line", None) or "").strip()})
    cols = ["reason", "file", "line", "function", "code"]
    df = pd.DataFrame(rows, columns=cols)
    if len(df):
        df = (df.groupby(cols, dropna=False, sort=False).size().rename("count").reset_index()
              .sort_values("count", ascending=False, kind="stable").reset_index(drop=True))
    else:
        df = pd.DataFrame(columns=cols + ["count"])
    n_breaks = len(rows) if rows else int(getattr(out, "graph_break_count", 0) or 0)
    return GraphBreakReport(graphs=int(out.graph_count), graph_breaks=n_breaks, ops=int(out.op_count), breaks=df,
                            explain=out)


# --- config and caches ------------------------------------------------------------------------------------


def recompile_limit_name() -> str:
    """The dynamo config holding the per-code recompile limit: recompile_limit (new) or cache_size_limit."""
    cfg = torch._dynamo.config
    return "recompile_limit" if hasattr(cfg, "recompile_limit") else "cache_size_limit"


def get_recompile_limit() -> int:
    return int(getattr(torch._dynamo.config, recompile_limit_name()))


@contextlib.contextmanager
def set_recompile_limit(n: int):
    """Temporarily set dynamo's per-function recompile limit to `n`; yields the old value."""
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"recompile limit must be an int >= 1, got {n!r}")
    name = recompile_limit_name()
    old = getattr(torch._dynamo.config, name)
    setattr(torch._dynamo.config, name, n)
    try:
        yield old
    finally:
        setattr(torch._dynamo.config, name, old)


_CACHE_ENV = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")


def clear_inmemory_compile_caches() -> None:
    """Forget inductor's in-process code caches (loaded modules stay alive where still referenced)."""
    try:
        import torch._inductor.utils as iu
    except Exception:
        return
    fn = getattr(iu, "clear_caches", None) or getattr(iu, "clear_inductor_caches", None)
    if fn is not None:
        fn()


def reset_compile_state() -> None:
    """Fresh process-level compile state: torch._dynamo.reset() plus inductor's in-memory caches."""
    torch._dynamo.reset()
    clear_inmemory_compile_caches()


@contextlib.contextmanager
def inductor_cache_dir(path=None, keep: bool | None = None):
    """Point the on-disk compile caches at `path` (None: a fresh temporary directory); yields the path.

    TORCHINDUCTOR_CACHE_DIR holds the FX-graph cache (fxgraph/), the AOTAutograd cache (aotautograd/),
    C++/Triton kernel sources and binaries, autotune results and dynamo's PGO profiles (dynamo/);
    TRITON_CACHE_DIR (<path>/triton) holds Triton's compiled kernels. In-memory caches are cleared on
    entry and exit; the environment is restored on exit. A temporary directory is deleted on exit
    unless keep=True; a given path is kept unless keep=False.
    """
    created = path is None
    d = tempfile.mkdtemp(prefix="wmbook_inductor_") if created else os.path.abspath(os.fspath(path))
    os.makedirs(d, exist_ok=True)
    keep = (not created) if keep is None else bool(keep)
    old = {k: os.environ.get(k) for k in _CACHE_ENV}
    clear_inmemory_compile_caches()
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = d
    os.environ["TRITON_CACHE_DIR"] = os.path.join(d, "triton")
    try:
        yield d
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        clear_inmemory_compile_caches()
        if not keep:
            shutil.rmtree(d, ignore_errors=True)


def _dir_bytes(path: str) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            with contextlib.suppress(OSError):
                total += os.path.getsize(os.path.join(root, f))
    return total


def cpp_compiler_available() -> bool:
    """Whether inductor's CPU backend can find a C++ compiler (needed for backend='inductor' on CPU)."""
    try:
        from torch._inductor.cpp_builder import get_cpp_compiler

        get_cpp_compiler()
        return True
    except Exception:
        return any(shutil.which(c) for c in ("g++", "c++", "clang++"))


# --- compile time -----------------------------------------------------------------------------------------


def _import_backend(backend: str) -> float:
    """Import the backend's modules now (s), so neither cold nor warm pays the import."""
    t0 = time.perf_counter()
    if backend == "inductor":
        importlib.import_module("torch._inductor.compile_fx")
    elif backend == "aot_eager":
        importlib.import_module("torch._functorch.aot_autograd")
    return time.perf_counter() - t0


def _phase_cols(phase: str, first_s: float, s: dict) -> dict:
    return {f"{phase}_s": first_s, f"{phase}_compile_s": s["compile_s"], f"{phase}_dynamo_s": s["dynamo_s"],
            f"{phase}_backend_s": s["backend_s"], f"{phase}_inductor_s": s["inductor_s"],
            f"{phase}_graphs": s["graphs"], f"{phase}_recompiles": s["recompiles"],
            f"{phase}_graph_breaks": s["graph_breaks"], f"{phase}_fx_cache_hits": s["fx_cache_hits"],
            f"{phase}_fx_cache_misses": s["fx_cache_misses"], f"{phase}_aot_cache_hits": s["aot_cache_hits"]}


def _check_cache_dir(cache_dir) -> None:
    if cache_dir is not None and os.path.isdir(cache_dir) and os.listdir(cache_dir):
        raise ValueError(f"cache_dir={cache_dir!r} is not empty: the cold measurement needs an empty cache "
                         f"directory (pass a new path, or None for a temporary one)")


def measure_compile_time(make_model, run_once, spec: CompileSpec, regions=None, device=None, *, cache_dir=None,
                         steady_repeats: int = 3, eager_first: bool = True, subprocess: bool = False,
                         timeout_s: float = 1800, after_warm=None) -> dict:
    """Compile time of `spec` cold (empty on-disk cache) and warm (cache filled by the cold run).

    make_model(): a fresh model (called once per phase); run_once(model): one unit of work (e.g. a
    forward). regions: as in apply_compile, but an attribute path ("blocks") or a callable (model)
    -> modules, since each phase builds its own model. Each phase: reset_compile_state(), build,
    apply_compile, wall time of the first synchronized run_once (compile + one run); then the warm
    model's steady time (median of `steady_repeats`). Returns one flat row (seconds unless `_ms`).

    In-process limits: warm here still has torch/inductor imported, the compile worker pool running
    and the CUDA context up; a new process pays those again. eager_first runs one eager call first so
    that CUDA context / cuBLAS / lazy-init costs land in neither phase. subprocess=True measures both
    phases in fresh Python processes (make_model / run_once / regions callables given as
    "module:attr" strings importable there); process_s is then what a user waits for end to end.
    after_warm(model): called in-process with the warm compiled model after its steady timing (e.g. to run
    more measurements on it without compiling again).
    """
    if not isinstance(spec, CompileSpec):
        raise ValueError(f"spec must be a CompileSpec, got {type(spec).__name__}")
    if not isinstance(steady_repeats, int) or steady_repeats < 1:
        raise ValueError(f"steady_repeats must be an int >= 1, got {steady_repeats!r}")
    if regions is not None and not (isinstance(regions, str) or callable(regions)):
        raise ValueError("regions must be an attribute path such as 'blocks' or a callable (model) -> modules: "
                         "each phase builds its own model")
    _check_cache_dir(cache_dir)
    if subprocess:
        if after_warm is not None:
            raise ValueError("after_warm needs the model in this process; it is not allowed with subprocess=True")
        return _measure_subprocess(make_model, run_once, spec, regions, device, cache_dir, steady_repeats,
                                   timeout_s)
    dev = resolve_device(device)
    row = {"name": spec.name, **spec.to_dict(), "device": str(dev), "torch": torch.__version__,
           "method": "in-process"}
    if eager_first:
        model = make_model()
        row["eager_first_s"] = time_once(lambda: run_once(model), dev) / 1e3
        del model
    row["backend_import_s"] = _import_backend(spec.backend)
    with inductor_cache_dir(cache_dir) as d:
        for phase in ("cold", "warm"):
            reset_compile_state()
            gc.collect()
            model = make_model()
            record = apply_compile(model, spec, regions=regions)
            with CompileMonitor() as mon:
                first_ms = time_once(lambda: run_once(model), dev)
            row.update(_phase_cols(phase, first_ms / 1e3, mon.summary()))
            if phase == "cold":
                row["graph_breaks"] = mon.summary()["graph_breaks"]
                del model
        with CompileMonitor() as smon:
            t = time_fn(lambda: run_once(model), warmup=1, repeats=steady_repeats, device=dev)
        row.update(steady_ms=t.median, steady_p20=t.p20, steady_p80=t.p80)
        row["steady_recompiles"] = smon.summary()["recompiles"]
        row["n_targets"] = record.n_targets
        row["cache_mb"] = _dir_bytes(d) / 2**20
        if after_warm is not None:
            after_warm(model)
        del model
    row["cold_over_warm"] = row["cold_s"] / row["warm_s"] if row["warm_s"] > 0 else float("nan")
    return row


def _import_attr(spec: str):
    if not isinstance(spec, str) or ":" not in spec:
        raise ValueError(f"subprocess=True needs 'module:attr' strings for make_model/run_once, got {spec!r}")
    mod, _, attr = spec.partition(":")
    obj = importlib.import_module(mod)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def _measure_subprocess(make_model, run_once, spec, regions, device, cache_dir, steady_repeats, timeout_s) -> dict:
    for name, v in (("make_model", make_model), ("run_once", run_once)):
        if not (isinstance(v, str) and ":" in v):
            raise ValueError(f"subprocess=True needs {name} as a 'module:attr' string importable in a fresh "
                             f"process, got {v!r}")
    if regions is not None and not isinstance(regions, str):
        raise ValueError("subprocess=True needs regions as an attribute path ('blocks') or 'module:attr' string")
    row = {"name": spec.name, **spec.to_dict(), "device": str(resolve_device(device)), "torch": torch.__version__,
           "method": "subprocess"}
    env = os.environ.copy()
    env["PYTHONPATH"] = os.pathsep.join([os.getcwd()] + [p for p in sys.path if p])
    with inductor_cache_dir(cache_dir) as d:
        env["TORCHINDUCTOR_CACHE_DIR"] = d
        env["TRITON_CACHE_DIR"] = os.path.join(d, "triton")
        for phase in ("cold", "warm"):
            payload = {"make_model": make_model, "run_once": run_once, "spec": spec.to_dict(), "regions": regions,
                       "device": None if device is None else str(device), "steady_repeats": steady_repeats,
                       "t_launch": time.time()}
            t0 = time.perf_counter()
            p = _subprocess.run([sys.executable, "-m", "wmbook.variants.compile", json.dumps(payload)], env=env,
                                capture_output=True, text=True, timeout=timeout_s)
            process_s = time.perf_counter() - t0
            lines = [ln for ln in p.stdout.splitlines() if ln.startswith(_RESULT_TAG)]
            if p.returncode != 0 or not lines:
                raise RuntimeError(f"{phase} compile-time subprocess failed (exit {p.returncode}):\n"
                                   f"{(p.stderr or p.stdout)[-3000:]}")
            res = json.loads(lines[-1][len(_RESULT_TAG):])
            row[f"{phase}_process_s"] = process_s
            row[f"{phase}_startup_s"] = res["startup_s"]
            row[f"{phase}_make_model_s"] = res["make_model_s"]
            row.update(_phase_cols(phase, res["first_run_s"], res["summary"]))
            if phase == "warm":
                row["steady_ms"] = res["steady_ms"]
                row["n_targets"] = res["n_targets"]
            else:
                row["graph_breaks"] = res["summary"]["graph_breaks"]
        row["cache_mb"] = _dir_bytes(d) / 2**20
    row["cold_over_warm"] = row["cold_s"] / row["warm_s"] if row["warm_s"] > 0 else float("nan")
    return row


def _child_main(argv: list[str]) -> None:
    """Subprocess side of measure_compile_time: one phase in this fresh process, result as a JSON line."""
    payload = json.loads(argv[0])
    startup_s = time.time() - payload["t_launch"]  # interpreter start + torch/wmbook imports
    make_model, run_once = _import_attr(payload["make_model"]), _import_attr(payload["run_once"])
    regions = payload["regions"]
    if isinstance(regions, str) and ":" in regions:
        regions = _import_attr(regions)
    spec = CompileSpec(**payload["spec"])
    dev = resolve_device(payload["device"])
    t0 = time.perf_counter()
    model = make_model()
    make_s = time.perf_counter() - t0
    record = apply_compile(model, spec, regions=regions)
    with CompileMonitor() as mon:
        first_ms = time_once(lambda: run_once(model), dev)
    t = time_fn(lambda: run_once(model), warmup=1, repeats=payload["steady_repeats"], device=dev)
    out = {"startup_s": startup_s, "make_model_s": make_s, "first_run_s": first_ms / 1e3, "steady_ms": t.median,
           "summary": mon.summary(), "n_targets": record.n_targets}
    print(_RESULT_TAG + json.dumps(out), flush=True)


__all__ = ["BACKENDS", "CompileMonitor", "CompileRecord", "CompileSpec", "GraphBreakReport", "MODES", "SCOPES",
           "apply_compile", "clear_inmemory_compile_caches", "cpp_compiler_available", "get_recompile_limit",
           "graph_break_report", "inductor_cache_dir", "measure_compile_time", "recompile_limit_name",
           "remove_compile", "reset_compile_state", "set_recompile_limit"]


if __name__ == "__main__":
    _child_main(sys.argv[1:])
