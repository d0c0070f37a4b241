"""Session reports: machine-readable JSON and a self-contained HTML page (figures inlined as base64 PNG).

File names: <session name>_<UTC start time>_rank<r>.json / .html in the config's output_dir. Both are
written through wmbook.atomic.atomic_open; the JSON is written first and the HTML is rendered to a string
before its file is opened, so a rendering failure leaves the JSON and any older HTML untouched.
"""

from __future__ import annotations

import datetime as _dt
import html
import json
import re
from pathlib import Path

from ..atomic import atomic_open
from .definitions import DEFINITIONS
from .jsonable import jsonable as _jsonable
from .timelines import draw_timelines, figure_png, png_base64

SCHEMA = "wmbook.profiling.session/1"


def slug(text: str) -> str:
    """A file-name-safe form of a session name."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", str(text)).strip("-") or "session"


def _formats(formats, default: str) -> list[str]:
    f = default if formats is None else formats
    if isinstance(f, str):
        if f not in ("json", "html", "both"):
            raise ValueError(f"formats must be 'json', 'html', 'both' or a list of 'json'/'html', got {f!r}")
        return ["json", "html"] if f == "both" else [f]
    f = list(f)
    if not f or any(x not in ("json", "html") for x in f):
        raise ValueError(f"formats must be 'json', 'html', 'both' or a list of 'json'/'html', got {formats!r}")
    return sorted(set(f), key=["json", "html"].index)


def report_dict(session, raw: bool = False) -> dict:
    """Everything a session knows, as JSON-serialisable data (monitor samples only when raw)."""
    s = session
    bd = s.breakdown
    if bd is not None and not isinstance(bd, dict):
        bd = bd.to_dict()
    return _jsonable({
        "schema": SCHEMA,
        "session": {
            "name": s.name, "report_stem": s.report_stem, "started_at": s.started_at, "ended_at": s.ended_at,
            "rank": s.rank["rank"], "world_size": s.rank["world_size"], "local_rank": s.rank["local_rank"],
            "rank_source": s.rank["source"], "device": str(s.device), "tags": s.tags, "enabled": s.enabled,
        },
        "definitions": DEFINITIONS,
        "summary": s.summary(),
        "stages": s.stages(),
        "blocks": s.blocks(),
        "events": list(s._events),
        "events_dropped": s.events_dropped,
        "metrics": s.metrics,
        "models": s.models,
        "monitor": s.monitor.to_dict(raw=raw) if s.monitor is not None else None,
        "breakdown": bd,
        "overhead": s.overhead,
        "environment": s.environment,
        "config": s.config.to_dict(),
        "errors": list(s.errors),
        "written_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    })


def write_report(session, output_dir=None, formats=None) -> dict:
    """Write the session's reports atomically; returns {"json": Path, "html": Path} for what was written."""
    fmts = _formats(formats, session.config.report_format)
    out = Path(output_dir if output_dir is not None else session.config.output_dir)
    stem = session.report_stem
    full = report_dict(session, raw=True)  # the HTML draws the timelines even when the JSON omits the samples
    doc = full
    if not session.config.save_raw_data and full.get("monitor"):
        doc = {**full, "monitor": {k: v for k, v in full["monitor"].items() if k != "samples"}}
    paths = {}
    if "json" in fmts:
        p = out / f"{stem}.json"
        with atomic_open(p, "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=1, allow_nan=False)
            f.write("\n")
        paths["json"] = p
    if "html" in fmts:
        try:
            page = render_html(full)
        except Exception as e:
            kept = f"; the JSON report is at {paths['json']}" if "json" in paths else ""
            raise RuntimeError(f"rendering the HTML report failed: {type(e).__name__}: {e}{kept}") from e
        p = out / f"{stem}.html"
        with atomic_open(p, "w", encoding="utf-8") as f:
            f.write(page)
        paths["html"] = p
    return paths


def load_report(path) -> dict:
    """A session report written by write_report (checks the schema)."""
    with open(path, encoding="utf-8") as f:
        d = json.load(f)
    if not isinstance(d, dict) or d.get("schema") != SCHEMA:
        raise ValueError(f"{path} is not a wmbook session report (schema {SCHEMA!r})")
    return d


# ---------------------------------------------------------------------------------------------------------
# HTML

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:24px;color:#222;max-width:1200px}
h1{font-size:22px;margin-bottom:4px}h2{font-size:17px;margin-top:28px;border-bottom:1px solid #ddd;padding-bottom:4px}
.meta{color:#666;font-size:13px}.cards{display:flex;flex-wrap:wrap;gap:10px;margin:14px 0}
.card{border:1px solid #ddd;border-radius:6px;padding:8px 12px;min-width:130px;background:#fafafa}
.card .v{font-size:20px;font-weight:600}.card .k{font-size:12px;color:#666}
table{border-collapse:collapse;font-size:12px;margin:8px 0}
th,td{border:1px solid #e2e2e2;padding:3px 7px;text-align:right}
th{background:#f3f3f3}td.l,th.l{text-align:left}.note{color:#8a5a00;font-size:13px}.def{font-size:13px;color:#444}
img{max-width:100%}code{background:#f3f3f3;padding:0 3px}
"""


def _e(x) -> str:
    return html.escape("" if x is None else str(x))


def _num(x, fmt: str = "{:.3g}", unit: str = "") -> str:
    if x is None or isinstance(x, bool):
        return "n/a" if x is None else str(x)
    try:
        return fmt.format(float(x)) + unit
    except (TypeError, ValueError):
        return _e(x)


def _table(rows: list[dict], columns: list[str] | None = None, left: tuple = (), fmt: dict | None = None,
           indent_by: str | None = None) -> str:
    if not rows:
        return "<p class='meta'>none</p>"
    cols = columns or list(rows[0])
    fmt = fmt or {}
    out = ["<table><tr>" + "".join(f"<th class='{'l' if c in left else ''}'>{_e(c)}</th>" for c in cols) + "</tr>"]
    for r in rows:
        cells = []
        for c in cols:
            v = r.get(c)
            if c in fmt:
                s = _num(v, fmt[c])
            elif isinstance(v, float):
                s = _num(v, "{:.4g}")
            elif isinstance(v, (dict, list)):
                s = _e(json.dumps(v, default=str)[:300])
            else:
                s = _e(v)
            if indent_by and c == indent_by:
                s = "&nbsp;" * 4 * int(r.get("depth") or 0) + s
            cells.append(f"<td class='{'l' if c in left else ''}'>{s}</td>")
        out.append("<tr>" + "".join(cells) + "</tr>")
    return "\n".join(out) + "</table>"


def _img(png: bytes, alt: str) -> str:
    return f"<img alt='{_e(alt)}' src='data:image/png;base64,{png_base64(png)}'>"


def _card(value: str, key: str) -> str:
    return f"<div class='card'><div class='v'>{value}</div><div class='k'>{_e(key)}</div></div>"


def _category_ms(r: dict) -> float:
    """ms of a category record: Breakdown tables say `ms`; older reports said `gpu_ms`."""
    v = r.get("ms", r.get("gpu_ms"))
    return float(v) if isinstance(v, (int, float)) else 0.0


def _category_png(records: list[dict]) -> bytes:
    rows = [r for r in records if _category_ms(r) > 0][::-1]

    def draw(fig):
        ax = fig.add_subplot(1, 1, 1)
        ax.barh([str(r.get("category")) for r in rows], [_category_ms(r) for r in rows], color="tab:blue")
        for y, r in enumerate(rows):
            sh = r.get("share")
            ax.text(_category_ms(r), y, f" {sh:.0%}" if isinstance(sh, (int, float)) else "", va="center", fontsize=8)
        ax.set_xlabel("time by operator category, ms")
        fig.tight_layout()

    return figure_png(draw, figsize=(7, 0.35 * max(len(rows), 3) + 1.0))


def render_html(report: dict) -> str:
    """A self-contained HTML page for a report dict (no external assets)."""
    r = report
    ses = r.get("session", {})
    s = r.get("summary", {}) or {}
    parts = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>wmbook profile: {_e(ses.get('name'))}</title>",
             f"<style>{_CSS}</style></head><body>",
             f"<h1>Profiling session {_e(ses.get('name'))}</h1>",
             f"<div class='meta'>rank {_e(ses.get('rank'))} of {_e(ses.get('world_size'))} · device "
             f"{_e(ses.get('device'))} · started {_e(ses.get('started_at'))} · timing: {_e(s.get('timing'))} · "
             f"tags {_e(json.dumps(ses.get('tags') or {}))}</div>"]

    # summary cards
    ov = r.get("overhead") or {}
    cards = [
        _card(_num(s.get("fps"), "{:.3g}"), "FPS (pixel frames/s, steady state)"),
        _card(_num(s.get("bps"), "{:.3g}"), "BPS (blocks/s)"),
        _card(_num(s.get("first_frame_ms"), "{:.4g}", " ms"), "first-frame latency"),
        _card(_num(s.get("session_ms"), "{:.4g}", " ms"), "session, device timeline"),
        _card(_num(s.get("session_host_ms"), "{:.4g}", " ms"), "session, host wall clock"),
        _card(_e(s.get("blocks")), "blocks timed"),
        _card(_num(s.get("gpu_memory_used_mib_max"), "{:.0f}", " MiB"), "GPU memory used, max (NVML)"),
        _card(_num(s.get("gpu_utilization_pct_mean"), "{:.1f}", "%"), "GPU utilisation, mean"),
        _card(_num(s.get("torch_peak_allocated_mib"), "{:.0f}", " MiB"), "torch peak allocated"),
        _card(_num(s.get("cpu_percent_mean"), "{:.1f}", "%"), "CPU, mean"),
        _card(_num(s.get("process_rss_mib_max"), "{:.0f}", " MiB"), "process RSS, max"),
    ]
    if ov:
        cards.append(_card(_num(ov.get("overhead_frac"), "{:+.1%}"), "profiling overhead"))
    parts.append("<div class='cards'>" + "".join(cards) + "</div>")
    if s.get("stream_note"):
        parts.append(f"<p class='note'>stream metrics: {_e(s['stream_note'])}</p>")
    if s.get("gpu_available") is False:
        parts.append(f"<p class='note'>GPU not monitored: {_e(s.get('gpu_reason'))}</p>")
    defs = r.get("definitions") or {}
    parts.append("<h2>Definitions</h2><div class='def'><ul>" + "".join(
        f"<li><b>{_e(k)}</b>: {_e(v)}</li>" for k, v in defs.items()) + "</ul></div>")

    gens = s.get("generations") or []
    if gens:
        parts.append("<h2>Generations</h2>")
        parts.append(_table(gens, ["generation", "warmup", "n_blocks", "fps", "bps", "first_frame_ms",
                                   "block_ms_median", "steady_blocks", "steady_frames", "steady_ms", "note"],
                            left=("note",)))

    parts.append("<h2>Stages (device-timed sections; self = total minus nested sections)</h2>")
    parts.append(_table(r.get("stages") or [], ["section", "count", "total_ms", "self_ms", "mean_ms", "min_ms",
                                                "max_ms", "host_total_ms", "share_of_parent"],
                        left=("section",), indent_by="section",
                        fmt={"share_of_parent": "{:.1%}", "total_ms": "{:.4g}", "self_ms": "{:.4g}"}))
    if r.get("blocks"):
        parts.append("<h2>Blocks</h2>")
        parts.append(_table(r["blocks"], ["generation", "warmup", "index", "frames", "start_ms", "section_ms",
                                          "stream_ms", "host_ms"]))

    mon = r.get("monitor") or {}
    parts.append("<h2>Resource monitor</h2>")
    if mon:
        parts.append(f"<div class='meta'>GPU: {_e(mon.get('gpu_name') or 'n/a')}"
                     f"{'' if mon.get('gpu_available') else ' (' + _e(mon.get('gpu_reason')) + ')'} · intervals GPU "
                     f"{_e(mon.get('gpu_interval_s'))} s, CPU {_e(mon.get('cpu_interval_s'))} s · dropped samples "
                     f"{_e(mon.get('dropped_total'))} · errors {_e(mon.get('error_count'))}</div>")
        if mon.get("samples"):
            parts.append(_img(figure_png(lambda fig: draw_timelines(fig, mon["samples"]), figsize=(9, 6)),
                              "monitor timelines"))
        parts.append(_table(mon.get("summary") or [], ["metric", "unit", "device", "count", "min", "max", "mean",
                                                      "last", "dropped"], left=("metric", "unit", "device")))
        if mon.get("disabled"):
            parts.append("<p class='note'>switched off: " + _e(json.dumps(mon["disabled"])) + "</p>")
    else:
        parts.append("<p class='meta'>no monitor</p>")

    bd = r.get("breakdown")
    if bd:
        tables = bd.get("tables") or {}
        parts.append(f"<h2>Trace breakdown ({_e(bd.get('region') or 'whole trace')}, {_e(bd.get('source'))} time)</h2>")
        cats = tables.get("categories") or []
        if any(_category_ms(c) > 0 for c in cats):
            parts.append(_img(_category_png(cats), "time by operator category"))
        summ = {k: v for k, v in (bd.get("summary") or {}).items() if not isinstance(v, (list, dict))}
        if summ:
            parts.append(_table([{"key": k, "value": v} for k, v in summ.items()], ["key", "value"], left=("key",)))
        sug = tables.get("suggestions") or []
        parts.append("<h3>Suggestions</h3>")
        parts.append(_table(sug, [c for c in ("rank", "finding", "evidence", "estimated_saving_ms", "notebook",
                                              "action") if not sug or c in sug[0]],
                            left=("finding", "evidence", "notebook", "action")))

    if ov:
        parts.append("<h2>Profiling overhead</h2>")
        rows = [{"run": k.replace("_ms", ""), **(ov.get(k) or {})} for k in ("baseline_ms", "session_ms")]
        parts.append(_table(rows, ["run", "median", "p20", "p80", "min", "max", "n"], left=("run",)))
        ci = ov.get("overhead_ci90") or [None, None]
        parts.append(f"<p>overhead {_num(ov.get('overhead_frac'), '{:+.2%}')} "
                     f"({_num(ov.get('overhead_ms'), '{:.3g}', ' ms')}): median of {_e(ov.get('pairs'))} paired runs, "
                     f"p20-p80 {_num(ov.get('overhead_p20'), '{:+.1%}')} to {_num(ov.get('overhead_p80'), '{:+.1%}')}, "
                     f"90% interval of the median {_num(ci[0], '{:+.1%}')} to {_num(ci[1], '{:+.1%}')} "
                     f"(baseline spread p20-p80 {_num(ov.get('baseline_spread_frac'), '{:.1%}')}); "
                     f"config {_e(ov.get('config'))}, timing {_e(ov.get('timing'))}; {_e(ov.get('method'))}</p>")
        acc = ov.get("accounted") or {}
        if acc:
            parts.append(f"<p>accounted part by part: {_num(ov.get('accounted_frac'), '{:.2%}')} = "
                         f"{_num(acc.get('timed_labels_per_call'), '{:.0f}')} timed labels per run x "
                         f"{_num(acc.get('us_per_timed_label'), '{:.1f}', ' us')} "
                         f"({_num(acc.get('labels_frac'), '{:.2%}')}) + the sampler thread "
                         f"({_num(acc.get('sampler_frac'), '{:.2%}')} of the wall time, an upper bound)</p>")

    ev = r.get("events") or []
    parts.append("<h2>Events</h2>")
    parts.append(_table(ev, ["time_s", "name", "data"], left=("name", "data")))
    if r.get("metrics"):
        parts.append("<h2>Workload metrics</h2>")
        parts.append(_table([{"key": k, "value": v} for k, v in r["metrics"].items()], left=("key", "value")))
    if r.get("models"):
        parts.append("<h2>Models</h2>" + _table(r["models"], left=("model_name", "model_type")))
    env = r.get("environment") or {}
    parts.append("<h2>Environment</h2>")
    parts.append(_table([{"key": k, "value": v} for k, v in env.items()], left=("key", "value")))
    parts.append("<h2>Configuration</h2>")
    parts.append(_table([{"key": k, "value": v} for k, v in (r.get("config") or {}).items()],
                        left=("key", "value")))
    if r.get("errors"):
        parts.append("<h2>Errors</h2><ul>" + "".join(f"<li>{_e(x)}</li>" for x in r["errors"]) + "</ul>")
    parts.append(f"<p class='meta'>written {_e(r.get('written_at'))} · schema {_e(r.get('schema'))}</p>")
    parts.append("</body></html>\n")
    return "\n".join(parts)
