"""Merge per-rank session reports: per-metric min/max/mean over ranks, a rank table, stage spread, slowest rank.

    agg = aggregate_reports("profiling_reports/run1")   # a folder of <name>_<time>_rank<r>.json, or a list of paths
    print(agg.text()); agg.ranks; agg.metrics; agg.stages; agg.paths

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
from .report import SCHEMA, _CSS, _e, _table, slug

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
    ("Stream Metrics (pixel frames, steady state; DESIGN.md)", ["fps", "bps", "first_frame_ms"]),
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
                    why = sorted(set(self.gpu_reasons.values()))
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


def _find_reports(source) -> list[Path]:
    if isinstance(source, (str, Path)):
        p = Path(source)
        if p.is_dir():
            out = []
            for f in sorted(p.glob("*.json")):
                try:
                    with open(f, encoding="utf-8") as fh:
                        if json.load(fh).get("schema") == SCHEMA:
                            out.append(f)
                except (OSError, ValueError, AttributeError):
                    continue  # not a session report (an aggregate, a trace, anything else)
            if not out:
                raise ValueError(f"no wmbook session reports (*.json with schema {SCHEMA!r}) in {p}")
            return out
        if p.is_file():
            return [p]
        raise ValueError(f"reports source {str(p)!r} is neither a folder nor a file")
    paths = [Path(x) for x in source]
    if not paths:
        raise ValueError("no report paths given")
    return paths


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


def aggregate_reports(reports, output=None, html: bool = True, write: bool = True,
                      by: str = "session_ms") -> AggregateReport:
    """Merge one session's per-rank JSON reports (a folder or a list of paths) and write the aggregate.

    output: the aggregate JSON path (default <folder>/<session>_aggregate.json); html=True also writes
    the same name with .html. by: what decides the slowest rank: a time metric (session_ms, the default;
    session_host_ms, first_frame_ms), fps/bps (lowest is slowest), or a stage path of the stage table.
    Raises ValueError for no reports, reports of different sessions or world sizes, a rank present twice.
    """
    if not isinstance(by, str) or not by:
        raise ValueError(f"by must be a rank metric {SLOWEST_BY} or a stage path, got {by!r}")
    paths = _find_reports(reports)
    reps = []
    for p in paths:
        try:
            with open(p, encoding="utf-8") as f:
                d = json.load(f)
        except (OSError, ValueError) as e:
            raise ValueError(f"cannot read report {p}: {e}") from e
        if not isinstance(d, dict) or d.get("schema") != SCHEMA:
            raise ValueError(f"{p} is not a wmbook session report (schema {SCHEMA!r})")
        reps.append((p, d))
    names: dict = {}
    for p, d in reps:
        names.setdefault(d["session"]["name"], []).append(p.name)
    if len(names) > 1:
        raise ValueError("reports from different sessions: " + "; ".join(f"{n!r}: {len(v)} report(s)"
                         for n, v in names.items()) + ". Aggregate one session at a time (pass its files).")
    sizes = {d["session"]["world_size"] for _, d in reps}
    if len(sizes) > 1:
        raise ValueError(f"reports disagree on world_size: {sorted(sizes)}; they come from different runs")
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
    if write:
        out = Path(output) if output is not None else paths[0].parent / f"{slug(session)}_aggregate.json"
        if out.suffix != ".json":
            out = out.with_suffix(".json")
        doc = agg.to_dict()
        page = render_aggregate_html(agg) if html else None  # render before writing anything
        with atomic_open(out, "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=1, allow_nan=False)
            f.write("\n")
        agg.paths["json"] = out
        if page is not None:
            with atomic_open(out.with_suffix(".html"), "w", encoding="utf-8") as f:
                f.write(page)
            agg.paths["html"] = out.with_suffix(".html")
    return agg


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
