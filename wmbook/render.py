"""Rendering of a report folder: each executed notebook as standalone HTML, and the folder's index page and
summary (wmbook.run writes them as the notebooks finish)."""

from __future__ import annotations

import html
import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any, Mapping, Sequence

from .atomic import atomic_write_text

STATUS_OK = "ok"
STATUS_FAILED = "failed"
STATUS_PENDING = "pending"


def render_html(executed: str | os.PathLike, html_path: str | os.PathLike) -> Path:
    """Render an executed notebook to standalone HTML (images embedded), atomically."""
    import nbformat
    from nbconvert import HTMLExporter

    executed = Path(executed)
    nb = nbformat.read(executed, as_version=4)
    exporter = HTMLExporter(embed_images=True)
    body, _ = exporter.from_notebook_node(
        nb, resources={"metadata": {"name": executed.stem, "path": str(executed.parent)}}
    )
    html_path = Path(html_path)
    atomic_write_text(html_path, body)
    return html_path


def _rel(path: str | None, base: Path) -> str | None:
    if not path:
        return None
    try:
        return Path(os.path.relpath(path, base)).as_posix()
    except ValueError:  # different drive on Windows
        return Path(path).as_posix()


_STATUS_STYLE = {
    STATUS_OK: "color:#116611;font-weight:bold",
    STATUS_FAILED: "color:#b00020;font-weight:bold",
    STATUS_PENDING: "color:#777",
}


def _index_html(runs: Sequence, meta: Mapping[str, Any], out: Path) -> str:
    e = html.escape
    rows = []
    for r in runs:
        html_rel, nb_rel = _rel(r.html_path, out), _rel(r.executed_path, out)
        html_link = f'<a href="{e(html_rel)}">HTML</a>' if html_rel else ""
        nb_link = f'<a href="{e(nb_rel)}">.ipynb</a>' if nb_rel else ""
        detail = ""
        if r.status == STATUS_FAILED:
            detail = f"<code>{e(r.failed_where())}</code><br>{e(r.error or '')}"
        seconds = f"{r.seconds:.1f} s" if r.status != STATUS_PENDING else ""
        rows.append(
            "<tr>"
            f"<td>{e(r.name)}</td>"
            f'<td style="{_STATUS_STYLE.get(r.status, "")}">{e(r.status)}</td>'
            f'<td style="text-align:right">{seconds}</td>'
            f"<td>{html_link}</td><td>{nb_link}</td>"
            f"<td>{detail}</td>"
            "</tr>"
        )
    n_ok = sum(r.status == STATUS_OK for r in runs)
    n_failed = sum(r.status == STATUS_FAILED for r in runs)
    facts = "".join(
        f"<tr><th>{e(str(k))}</th><td>{e(json.dumps(v) if not isinstance(v, str) else v)}</td></tr>"
        for k, v in meta.items()
    )
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>wmbook report {e(str(meta.get("started", "")))}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em; }}
table {{ border-collapse: collapse; margin-bottom: 1.5em; }}
th, td {{ border: 1px solid #ccc; padding: 0.3em 0.7em; text-align: left; vertical-align: top; }}
th {{ background: #f4f4f4; }}
code {{ font-size: 90%; }}
</style>
</head>
<body>
<h1>wmbook report</h1>
<p>{n_ok} ok, {n_failed} failed, {len(runs) - n_ok - n_failed} pending, of {len(runs)} notebooks.</p>
<table>
<tr><th>notebook</th><th>status</th><th>duration</th><th>report</th><th>executed</th><th>failure</th></tr>
{chr(10).join(rows)}
</table>
<h2>Run</h2>
<table>
{facts}
</table>
</body>
</html>
"""


def write_index(out: Path, runs: Sequence, meta: Mapping[str, Any]) -> None:
    """index.html (a table of the runs) and summary.json in the report folder, each written atomically."""
    atomic_write_text(out / "index.html", _index_html(runs, meta, out))
    summary = {"meta": dict(meta), "notebooks": [asdict(r) for r in runs]}
    atomic_write_text(out / "summary.json", json.dumps(summary, indent=2, default=str) + "\n")
