"""Merge per-rank session reports: per-metric min/max/mean over ranks, a rank table, stage spread, slowest rank.

    agg = aggregate_reports("profiling_reports/development")  # folders of <name>_<time>_rank<r>.json and/or files
    print(agg.text()); agg.ranks; agg.metrics; agg.stages; agg.paths
    group_reports(["data/reports/h100/artifacts/02_bottleneck_breakdown"])  # {session name: [report paths]}
    # {session name: AggregateReport}, one per session
    aggregate_sessions("data/reports/h100/artifacts/02_bottleneck_breakdown")

Reports belong to one session when they carry the same session name (report["session"]["name"]).
Aggregates are written to ./profiling_reports/aggregate/<session>_aggregate.json (+ .html) of the current
working directory unless output= or output_dir= say otherwise; never into the input folder by default.

The slowest rank is decided by the session's device time (the `Session` section on the device timeline:
CUDA events on a GPU, host clock on a CPU); host wall time decides only where no device time was recorded.
Written outputs (JSON and a small HTML) go through wmbook.atomic.atomic_open.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from ..atomic import atomic_open
from .jsonable import jsonable as _jsonable
from .report import _CSS, SCHEMA, _e, _table, slug

AGGREGATE_SCHEMA = "wmbook.profiling.aggregate/1"

# per-rank metric -> (label, unit, where: "summary" key or ("monitor", metric, statistic))
RANK_METRICS = {
    "session_ms": ("Session device time", "ms", "summary"),
    "session_host_ms": ("Session host wall time", "ms", "summary"),
    "fps": ("FPS", "frames/s", "summary"),
    "bps": ("BPS", "blocks/s", "summary"),
    "first_frame_ms": ("First-frame latency", "ms", "summary"),
    "torch_peak_allocated_mib": ("torch peak allocated", "MiB", "summary"),
    "gpu_memory_used_mib_max": ("GPU Memory (max)", "MiB", ("monitor", "gpu_memory_used_mib", "max")),
    "gpu_memory_used_mib_mean": ("GPU Memory (mean)", "MiB", ("monitor", "gpu_memory_used_mib", "mean")),
    "gpu_utilization_pct_mean": ("GPU Utilization", "%", ("monitor", "gpu_utilization_pct", "mean")),
    "gpu_memory_utilization_pct_mean": ("GPU Memory-bus Utilization", "%",
                                        ("monitor", "gpu_memory_utilization_pct", "mean")),
    "gpu_temperature_c_max": ("GPU Temperature (max)", "°C", ("monitor", "gpu_temperature_c", "max")),
    "gpu_power_w_mean": ("GPU Power", "W", ("monitor", "gpu_power_w", "mean")),
    "gpu_sm_clock_mhz_mean": ("GPU SM clock", "MHz", ("monitor", "gpu_sm_clock_mhz", "mean")),
    "cpu_percent_mean": ("CPU Usage", "%", ("monitor", "cpu_percent", "mean")),
    "system_memory_used_mib_max": ("System Memory (max)", "MiB", ("monitor", "system_memory_used_mib", "max")),
    "process_rss_mib_max": ("Process RSS (max)", "MiB", ("monitor", "process_rss_mib", "max")),
}
SECTIONS = [
    ("GPU Metrics (Aggregated)", ["gpu_memory_used_mib_max", "gpu_memory_used_mib_mean", "gpu_utilization_pct_mean",
                                  "gpu_memory_utilization_pct_mean", "gpu_temperature_c_max", "gpu_power_w_mean",
                                  "gpu_sm_clock_mhz_mean", "torch_peak_allocated_mib"]),
    ("CPU Metrics (Aggregated)", ["cpu_percent_mean", "system_memory_used_mib_max", "process_rss_mib_max"]),
    ("Stream Metrics (pixel frames, steady state; README: definitions)", ["fps", "bps", "first_frame_ms"]),
    ("Session Time", ["session_ms", "session_host_ms"]),
]


@dataclass
class AggregateReport:
    """Merged view of one session's per-rank reports."""

    session: str
    world_size: int
    ranks: pd.DataFrame  # one row per rank: the RANK_METRICS values, device, gpu_available, path
    metrics: pd.DataFrame  # per metric: label, unit, n, min, max, mean, min_rank, max_rank
    stages: pd.DataFrame  # per stage path: total_ms of each rank (rank_<r>), min, max, mean, spread, slowest_rank
    slowest: dict  # rank, by (metric), value, mean, excess_frac
    missing_ranks: list = field(default_factory=list)
    sources: list = field(default_factory=list)
    gpu_reasons: dict = field(default_factory=dict)  # rank -> why no GPU was monitored
    paths: dict = field(default_factory=dict)  # what aggregate_reports wrote

    def to_dict(self) -> dict:
        return _jsonable({
            "schema": AGGREGATE_SCHEMA, "session": self.session, "world_size": self.world_size,
            "n_reports": len(self.ranks), "ranks_present": [int(r) for r in self.ranks["rank"]],
            "missing_ranks": self.missing_ranks, "slowest_rank": self.slowest,
            "metrics": self.metrics, "rank_table": self.ranks, "stages": self.stages,
            "gpu_reasons": self.gpu_reasons, "sources": self.sources,
            "written_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        })  # fmt: skip

    def text(self) -> str:
        """The console summary (like the seed's aggregation output)."""
        ranks = [int(r) for r in self.ranks["rank"]]
        lines = ["=== Aggregation Summary ===", f"Session: {self.session}",
                 f"Total reports processed: {len(ranks)}",
                 f"Ranks: {len(ranks)} ({', '.join(map(str, ranks))}) of world size {self.world_size}"]
        if self.missing_ranks:
            lines.append(f"Missing ranks: {self.missing_ranks}")
        m = self.metrics.set_index("metric") if len(self.metrics) else pd.DataFrame()
        for title, keys in SECTIONS:
            lines += ["", f"=== {title} ==="]
            shown = 0
            for k in keys:
                if k not in m.index:
                    continue
                r = m.loc[k]
                unit = r["unit"]
                sep = "" if unit in ("%", "°C") else " "
                fmt = (lambda v: f"{v:.1f}{sep}{unit}") if unit in ("MiB", "%", "°C", "W", "MHz", "ms") else (
                    lambda v: f"{v:.3g} {unit}")
                lines.append(f"{r['label']} - Min: {fmt(r['min'])}, Max: {fmt(r['max'])}, Avg: {fmt(r['mean'])}"
                             f" (min rank {r['min_rank']}, max rank {r['max_rank']})")
                shown += 1
            if not shown:
                if title.startswith("GPU") and self.gpu_reasons:
                    why = sorted({str(v) for v in self.gpu_reasons.values() if v}) or ["the reports hold no monitor"]
                    lines.append(f"GPU: not monitored ({'; '.join(why)})")
                else:
                    lines.append("no data")
        s = self.slowest
        if s:
            rel = "under" if s["by"] in ("fps", "bps") else "over"
            lines += ["", f"Slowest rank: {s['rank']} by {s['label'].lower()} ({s['value']:.4g} {s['unit']}, "
                          f"{abs(s['excess_frac']):.1%} {rel} the mean {s['mean']:.4g} {s['unit']})"]
        if len(self.stages) and "spread" in self.stages and self.stages["spread"].notna().any():
            deep = self.stages[self.stages["path"].str.count("/") >= 1]  # below the Session root
            if len(deep) and deep["spread"].notna().any():
                r = deep.loc[deep["spread"].idxmax()]
                lines.append(f"Largest stage spread: {r['path']} ({r['spread']:.0%} of its mean "
                             f"{r['mean_ms']:.4g} ms; slowest rank {r['slowest_rank']})")
        return "\n".join(lines)


DEFAULT_OUTPUT_DIR = Path("profiling_reports") / "aggregate"  # relative to the current working directory
_EXPECTED = "a wmbook session report (*.json) or a folder holding them"


def _read_report(p: Path):
    """(dict, None) for a session report, else (None, why it is not one)."""
    try:
        with open(p, encoding="utf-8") as fh:
            d = json.load(fh)
    except OSError as e:
        return None, f"cannot be read ({e.strerror or e})"
    except ValueError as e:
        return None, f"is not valid JSON ({e})"
    if not isinstance(d, dict):
        return None, f"holds a JSON {type(d).__name__}, not an object"
    if d.get("schema") != SCHEMA:
        found = f"schema {d['schema']!r}" if "schema" in d else "no 'schema' key"
        return None, f"has {found}"
    sess = d.get("session")
    if not isinstance(sess, dict) or not isinstance(sess.get("name"), str) or "rank" not in sess \
            or "world_size" not in sess:
        return None, "has no session name/rank/world_size"
    why = _wrong_types(d)
    if why:
        return None, why
    return d, None


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number_or_none(v) -> bool:
    return v is None or (isinstance(v, (int, float)) and not isinstance(v, bool))


def _wrong_types(d: dict) -> str | None:
    """Which field of a session report has a type the aggregation cannot use ('has session.rank = "a", not an
    integer >= 0'), or None: checked on reading, so a hand-edited or foreign report is named instead of failing
    deep inside the aggregation."""
    sess = d["session"]
    if not _is_int(sess["world_size"]) or sess["world_size"] < 1:
        return f"has session.world_size = {sess['world_size']!r}, not an integer >= 1"
    if not _is_int(sess["rank"]) or not 0 <= sess["rank"] < sess["world_size"]:
        return f"has session.rank = {sess['rank']!r}, not an integer in [0, world_size)"
    for key in ("summary", "monitor"):
        if d.get(key) is not None and not isinstance(d[key], dict):
            return f"has {key} = a JSON {type(d[key]).__name__}, not an object"
    stages = d.get("stages")
    if stages is not None and not isinstance(stages, list):
        return f"has stages = a JSON {type(stages).__name__}, not a list"
    for i, st in enumerate(stages or []):
        if not isinstance(st, dict) or not isinstance(st.get("path"), str):
            return f"has stages[{i}] without a string 'path'"
        if not _is_number_or_none(st.get("total_ms")) or not _is_number_or_none(st.get("depth")):
            return f"has stages[{i}].total_ms / depth = {st.get('total_ms')!r} / {st.get('depth')!r}, not numbers"
    mon = (d.get("monitor") or {}).get("summary")
    if mon is not None and (not isinstance(mon, list)
                            or not all(isinstance(r, dict) and isinstance(r.get("metric"), str) for r in mon)):
        return "has monitor.summary that is not a list of objects with a string 'metric'"
    return None


def _as_list(reports) -> list[Path]:
    if isinstance(reports, (str, Path)):
        return [Path(reports)]
    try:
        items = list(reports)
    except TypeError:
        raise ValueError(f"reports must be a path, a folder or a list of them, got {type(reports).__name__}") \
            from None
    for x in items:
        if not isinstance(x, (str, Path)):
            raise ValueError(f"reports must be a path, a folder or a list of them; got an item {x!r}")
    if not items:
        raise ValueError(f"no report paths given (each must be {_EXPECTED})")
    return [Path(x) for x in items]


def _load_reports(reports) -> list[tuple[Path, dict]]:
    """Every session report named by `reports` (files and folders; a folder's *.json that are not session
    reports, like aggregates, are skipped). All paths are checked before anything is returned."""
    paths = _as_list(reports)
    for p in paths:
        if not p.exists():
            raise ValueError(f"report path {str(p)!r} does not exist (each path must be {_EXPECTED})")
        if not (p.is_dir() or p.is_file()):
            raise ValueError(f"report path {str(p)!r} is neither a folder nor a file (each path must be "
                             f"{_EXPECTED})")
    out: list[tuple[Path, dict]] = []
    seen: set = set()
    for p in paths:
        if p.is_dir():
            found = []
            for f in sorted(p.glob("*.json")):
                d, _ = _read_report(f)
                if d is not None:
                    found.append((f, d))
            if not found:
                raise ValueError(f"no wmbook session reports (*.json with schema {SCHEMA!r}) in {p}")
        else:
            d, why = _read_report(p)
            if d is None:
                raise ValueError(f"{p} is not a wmbook session report: it {why}; a session report is a JSON "
                                 f"object with schema {SCHEMA!r} (as ProfilingSession.write_report writes)")
            found = [(p, d)]
        for f, d in found:
            key = f.resolve()
            if key not in seen:  # a file named twice (itself and through its folder) counts once
                seen.add(key)
                out.append((f, d))
    return out


def _group(reps: list[tuple[Path, dict]]) -> dict[str, list[tuple[Path, dict]]]:
    """Reports of one session are those with the same session name (report["session"]["name"])."""
    groups: dict = {}
    for p, d in reps:
        groups.setdefault(d["session"]["name"], []).append((p, d))
    return {k: groups[k] for k in sorted(groups)}


def group_reports(reports) -> dict[str, list[Path]]:
    """The session reports named by `reports` (a path, a folder, or a list of them), by session name.

    Raises ValueError for a path that does not exist, a folder without session reports, a file that is
    not a session report.
    """
    return {k: [p for p, _ in v] for k, v in _group(_load_reports(reports)).items()}


def _describe(groups: dict) -> str:
    return ", ".join(f"{n!r} ({len(v)} report{'s' if len(v) != 1 else ''})" for n, v in groups.items())


def _select(groups: dict, session) -> dict:
    if session is None:
        return groups
    if not isinstance(session, str) or session not in groups:
        raise ValueError(f"session {session!r} is not among the sessions found; choose one of: "
                         f"{_describe(groups)}")
    return {session: groups[session]}


def _out_path(output) -> Path:
    out = Path(output)
    return out if out.suffix == ".json" else out.with_suffix(".json")


def aggregate_sessions(reports, session: str | None = None, output=None, output_dir=None, html: bool = True,
                       write: bool = True, by: str = "session_ms") -> dict[str, AggregateReport]:
    """Aggregate each session found in `reports` (a path, a folder, or a list of them) separately.

    session: aggregate only that session. output: the aggregate JSON path; only with one session
    selected. output_dir: where <session>_aggregate.json (+ .html) go; default
    ./profiling_reports/aggregate of the current working directory (never the input folder).
    Everything is checked and aggregated before the first file is written.
    Returns {session name: AggregateReport}; what was written is in each one's .paths.
    """
    _check_args(by, output, output_dir)
    return _run(_group(_load_reports(reports)), session, output, output_dir, html, write, by)


def aggregate_reports(reports, output=None, html: bool = True, write: bool = True,
                      by: str = "session_ms", session: str | None = None, output_dir=None) -> AggregateReport:
    """Merge one session's per-rank JSON reports (a path, a folder, or a list of them) and write the aggregate.

    Where the reports hold several sessions, session= picks one (aggregate_sessions does them all;
    group_reports lists them). output: the aggregate JSON path (default
    <output_dir>/<session>_aggregate.json, output_dir defaulting to ./profiling_reports/aggregate);
    html=True also writes the same name with .html. by: what decides the slowest rank: a time metric
    (session_ms, the default; session_host_ms, first_frame_ms), fps/bps (lowest is slowest), or a stage
    path of the stage table. Raises ValueError for a missing path, no reports, several sessions without
    session=, reports of one session that disagree on world size, a rank present twice.
    """
    _check_args(by, output, output_dir)
    groups = _group(_load_reports(reports))
    if session is None and len(groups) > 1:
        raise ValueError(f"reports from different sessions: {_describe(groups)}. Pick one with session=..., "
                         "or aggregate each with aggregate_sessions(...) (the CLI, wmbook aggregate, does each)")
    return next(iter(_run(groups, session, output, output_dir, html, write, by).values()))


def _check_args(by, output, output_dir) -> None:
    if not isinstance(by, str) or not by:
        raise ValueError(f"by must be a rank metric {SLOWEST_BY} or a stage path, got {by!r}")
    if output is not None and output_dir is not None:
        raise ValueError("give output (one aggregate file) or output_dir (a folder), not both")


def _run(groups: dict, session, output, output_dir, html: bool, write: bool, by: str) -> dict:
    groups = _select(groups, session)
    if output is not None and len(groups) > 1:
        raise ValueError(f"output names one file, but {len(groups)} sessions were found: {_describe(groups)}; "
                         "pick one with session (CLI: --session NAME) or give a folder with output_dir "
                         "(CLI: --output-dir DIR)")
    aggs = {name: _aggregate(reps, by) for name, reps in groups.items()}
    if not write:
        return aggs
    folder = Path(output_dir) if output_dir is not None else Path.cwd() / DEFAULT_OUTPUT_DIR
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"output_dir {str(folder)!r} exists and is not a folder")
    outs = {name: _out_path(output) if output is not None else folder / f"{slug(name)}_aggregate.json"
            for name in aggs}
    for name, out in outs.items():
        other = [n for n, o in outs.items() if o == out and n != name]
        if other:
            raise ValueError(f"sessions {name!r} and {other[0]!r} would both be written to {out}; aggregate "
                             "them one at a time (session=..., output=...)")
    docs = {name: (agg.to_dict(), render_aggregate_html(agg) if html else None)  # render before writing
            for name, agg in aggs.items()}
    for name, agg in aggs.items():
        doc, page = docs[name]
        out = outs[name]
        with atomic_open(out, "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=1, allow_nan=False)
            f.write("\n")
        agg.paths["json"] = out
        if page is not None:
            with atomic_open(out.with_suffix(".html"), "w", encoding="utf-8") as f:
                f.write(page)
            agg.paths["html"] = out.with_suffix(".html")
    return aggs


def _aggregate(reps: list[tuple[Path, dict]], by: str) -> AggregateReport:
    """One session's AggregateReport from its loaded (path, report) pairs."""
    names: dict = {}
    for p, d in reps:
        names.setdefault(d["session"]["name"], []).append(p.name)
    if len(names) > 1:  # callers group first; kept as a guard
        raise ValueError("reports from different sessions: " + "; ".join(f"{n!r}: {len(v)} report(s)"
                         for n, v in names.items()))
    sizes = {d["session"]["world_size"] for _, d in reps}
    if len(sizes) > 1:
        raise ValueError(f"reports of session {next(iter(names))!r} disagree on world_size: {sorted(sizes)}; "
                         "they come from different runs")
    seen: dict = {}
    for p, d in reps:
        seen.setdefault(d["session"]["rank"], []).append(p.name)
    dup = {r: v for r, v in seen.items() if len(v) > 1}
    if dup:
        r, v = next(iter(dup.items()))
        raise ValueError(f"rank {r} appears in {len(v)} reports ({', '.join(v)}): several runs of session "
                         f"{next(iter(names))!r} in one folder; pass the files of one run")
    session = next(iter(names))
    world = sizes.pop()

    ranks = pd.DataFrame([_rank_row(d, p) for p, d in reps]).sort_values("rank").reset_index(drop=True)
    mrows = []
    for key, (lab, unit, _) in RANK_METRICS.items():
        col = ranks[key].dropna()
        if not len(col):
            continue
        mrows.append({"metric": key, "label": lab, "unit": unit, "n": len(col), "min": float(col.min()),
                      "max": float(col.max()), "mean": float(col.mean()),
                      "min_rank": int(ranks.loc[col.idxmin(), "rank"]),
                      "max_rank": int(ranks.loc[col.idxmax(), "rank"])})
    metrics = pd.DataFrame(mrows, columns=["metric", "label", "unit", "n", "min", "max", "mean", "min_rank",
                                           "max_rank"])

    # stage spread: total_ms per (collapsed) stage path and rank
    srows = {}
    order = []
    for _, d in reps:
        r = d["session"]["rank"]
        for st in d.get("stages") or []:
            k = st["path"]
            if k not in srows:
                srows[k] = {"path": k, "depth": st.get("depth", 0)}
                order.append(k)
            srows[k][f"rank_{r}"] = st.get("total_ms")
    stages = pd.DataFrame([srows[k] for k in order])
    rank_cols = [f"rank_{r}" for r in ranks["rank"]]
    if len(stages):
        for c in rank_cols:
            if c not in stages:
                stages[c] = math.nan
        vals = stages[rank_cols].astype(float)
        stages["min_ms"], stages["max_ms"], stages["mean_ms"] = vals.min(axis=1), vals.max(axis=1), vals.mean(axis=1)
        stages["spread"] = (stages["max_ms"] - stages["min_ms"]) / stages["mean_ms"]
        stages["slowest_rank"] = [int(row.idxmax().split("_")[1]) if row.notna().any() else None
                                  for _, row in vals.iterrows()]

    slowest = _slowest(ranks, stages, by)
    gpu_reasons = {int(d["session"]["rank"]): (d.get("monitor") or {}).get("gpu_reason")
                   for _, d in reps if not (d.get("monitor") or {}).get("gpu_available")}
    agg = AggregateReport(session=session, world_size=int(world), ranks=ranks, metrics=metrics, stages=stages,
                          slowest=slowest, missing_ranks=sorted(set(range(int(world))) - set(seen)),
                          sources=[str(p) for p, _ in reps], gpu_reasons=gpu_reasons)
    return agg


def _rank_row(rep: dict, path: Path) -> dict:
    s = rep.get("summary") or {}
    mon = {r["metric"]: r for r in ((rep.get("monitor") or {}).get("summary") or [])}
    row = {"rank": rep["session"]["rank"], "device": rep["session"].get("device"),
           "gpu_available": (rep.get("monitor") or {}).get("gpu_available")}
    for key, (_, _, where) in RANK_METRICS.items():
        if where == "summary":
            v = s.get(key)
        else:
            _, metric, stat = where
            v = (mon.get(metric) or {}).get(stat)
        row[key] = float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else math.nan
    row["path"] = str(path)
    return row


SLOWEST_BY = ("session_ms", "session_host_ms", "first_frame_ms", "fps", "bps")


def _slowest(ranks: pd.DataFrame, stages: pd.DataFrame, by: str) -> dict:
    """The slowest rank by `by` (session_ms falls back to host wall time where no device time exists)."""
    if by in SLOWEST_BY:
        tries = [by, "session_host_ms"] if by == "session_ms" else [by]
        for key in tries:
            col = ranks[key]
            if col.notna().any():
                i = col.idxmin() if key in ("fps", "bps") else col.idxmax()
                vals, label, unit = col, RANK_METRICS[key][0], RANK_METRICS[key][1]
                break
        else:
            return {}
    else:
        if not len(stages) or by not in set(stages["path"]):
            known = list(stages["path"][:8]) if len(stages) else []
            raise ValueError(f"by={by!r} is neither a rank metric {SLOWEST_BY} nor a stage path (e.g. {known})")
        row = stages.set_index("path").loc[by]
        vals = pd.Series({int(c.split("_")[1]): row[c] for c in row.index if c.startswith("rank_")}, dtype=float)
        vals = pd.Series(vals.values, index=[ranks.index[ranks["rank"] == r][0] for r in vals.index])
        if not vals.notna().any():
            return {}
        i, label, unit, key = vals.idxmax(), f"stage {by}", "ms", by
    mean = float(vals.mean())
    v = float(vals[i])
    return {"rank": int(ranks.loc[i, "rank"]), "by": key, "label": label, "unit": unit, "value": v, "mean": mean,
            "excess_frac": v / mean - 1 if mean > 0 else math.nan}


def render_aggregate_html(agg: AggregateReport) -> str:
    """A small self-contained HTML page of an aggregate."""
    d = agg.to_dict()
    parts = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>wmbook aggregate: {_e(agg.session)}</title>",
             f"<style>{_CSS}</style></head><body><h1>Aggregate of session {_e(agg.session)}</h1>",
             f"<pre>{_e(agg.text())}</pre>", "<h2>Metrics over ranks</h2>",
             _table(d["metrics"], left=("metric", "label", "unit")), "<h2>Ranks</h2>",
             _table(d["rank_table"], ["rank", "device", "session_ms", "session_host_ms", "fps", "bps",
                                      "first_frame_ms", "gpu_memory_used_mib_max", "gpu_utilization_pct_mean",
                                      "cpu_percent_mean", "process_rss_mib_max"], left=("device",))]
    if d["stages"]:
        st = [s for s in d["stages"] if (s.get("depth") or 0) <= 3]
        cols = ["path"] + [c for c in d["stages"][0] if c.startswith("rank_")] + ["min_ms", "max_ms", "mean_ms",
                                                                                  "spread", "slowest_rank"]
        parts += ["<h2>Stage total time per rank (ms)</h2>", _table(st, cols, left=("path",),
                                                                    fmt={"spread": "{:.1%}"})]
    parts.append("<h2>Sources</h2><ul>" + "".join(f"<li>{_e(s)}</li>" for s in agg.sources) + "</ul></body></html>\n")
    return "\n".join(parts)
