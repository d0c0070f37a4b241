"""What torch.compile did in a run: frames compiled, recompiles and their reasons, graph breaks and where.

    with CompileMonitor() as mon:           # what compiled, why it recompiled
        run(model)
    mon.summary(); mon.recompiles; mon.graph_breaks   # dict, DataFrames
    graph_break_report(model, *args)        # torch._dynamo.explain as a table

Torch internals used (all read defensively, checked on torch 2.13; names exist in the 2.11 source):
`torch._dynamo.utils.counters` (frames / unique_graphs / graph_break), `torch._dynamo.utils.
get_compilation_metrics()` (one CompilationMetrics per compiled frame: recompile_reason, phase times,
FX/AOT cache hits), the `graph_breaks` log artifact (user locations) and the
"torch._dynamo hit config.recompile_limit" warning of `torch._dynamo.convert_frame`.
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass, field

import pandas as pd
import torch
import torch._dynamo
from torch._dynamo.utils import counters


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
    return counters


def _metrics_list() -> list:
    try:
        from torch._dynamo.utils import get_compilation_metrics  # noqa: PLC0415  optional: dynamo internal

        return list(get_compilation_metrics())
    except Exception:  # internal API moved: frames/recompile tables stay empty, counters still work
        return []


def _metrics_maxlen():
    try:
        import torch._dynamo.utils as du  # noqa: PLC0415  optional: dynamo internal

        return du._compilation_metrics.maxlen
    except Exception:
        return None


def _set_metrics_limit(n: int) -> bool:
    try:
        from torch._dynamo.utils import set_compilation_metrics_limit  # noqa: PLC0415  optional: dynamo internal

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


def entered() -> CompileMonitor:
    """An entered CompileMonitor (the caller exits it)."""
    m = CompileMonitor()
    m.__enter__()
    return m


def compile_note(summary: dict) -> str:
    """What a compilation did, for a ladder row's note when it did more than compile each region once: recompiles
    (a guard that failed: a new shape, a changed attribute) and recompile-limit hits (dynamo gave up and ran the
    function eagerly), with the compile seconds; empty otherwise. Says why a row's first call took long."""
    rec, hits = int(summary.get("recompiles", 0)), int(summary.get("recompile_limit_hits", 0))
    if not rec and not hits:
        return ""
    return (f"compile: {int(summary.get('frames_compiled', 0))} graphs, {rec} recompiles, {hits} recompile-limit hits, "
            f"{float(summary.get('compile_s', 0.0)):.0f} s")
