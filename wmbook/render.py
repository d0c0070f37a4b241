"""Rendering of a report folder: each executed notebook as standalone HTML, and the folder's index page and
summary (wmbook.run writes them as the notebooks finish).

A rendered report opens with its findings (three bullets computed from its results rows, wmbook.headlines) and is
self-contained and whole offline: images are embedded, animated GIFs too (nbconvert drops image/gif outputs: they are
turned into embedded <img> elements), every file a notebook linked with wmbook.display.link (traces, session
reports) is copied into the report folder's ``artifacts/<notebook>/`` and linked relatively, links to other notebooks
point at their reports in the folder (or become text), no script comes from the network (wmbook's nbconvert template,
``wmbook/templates/wmbook_report``) and no machine path is shown (wmbook.html_clean). The results rows and the raw
tables are collapsed appendices. Noise that means nothing to a reader (the profiler's USDT lines, the kernel's
transport warning, known library warnings, progress-bar widgets whose state was not saved) is left out of the HTML,
and a published report shows no stderr at all; the executed notebook keeps every output.
"""

from __future__ import annotations

import base64
import copy
import html
import json
import os
import re
import shutil
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any, Mapping, Sequence
from urllib.parse import unquote, urlparse

from . import html_clean
from .atomic import atomic_write_text
from .html_clean import report_link
from .html_parts import REPORT_CSS, finding_html, findings_box, page

STATUS_OK = "ok"
STATUS_FAILED = "failed"
STATUS_PENDING = "pending"

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
ARTIFACT_ATTR = "data-wmbook-artifact"  # wmbook.display.link marks its links with it
META_KEY = "wmbook"  # display metadata: {"wmbook": {"run_id": ..., "results_path": ...}} (wmbook.display.rows)

_NOISE = re.compile(
    r"^(USDT:.*profiler_(start|stop).*|STAGE:.*Completed Stage:.*|.*Kernel is running over TCP without encryption.*"
    r"|\[IPKernelApp\] WARNING.*)\n?",
    re.M,
)
# library warnings a reader cannot act on, filtered where they arise (wmbook.display.setup) and, for a kernel that did
# not run it, here: torchao's escape-sequence SyntaxWarning at import, inductor declining CUDA graphs (the row's note
# says so), a note about optional torchao checkpoints
_KNOWN_STDERR = re.compile(
    r"^(.*SyntaxWarning: invalid escape sequence.*|\s*\"\"\"Configuration class for applying different quantization.*"
    r"|.*skipping cudagraphs due to.*|Unable to import `torchao` Tensor objects.*)\n?", re.M)
_TQDM = re.compile(r"\d+%\|.*\|\s*\d+/\d+|it/s\]|s/it\]")  # a tqdm bar's text: ' 40%|####  | 4/10 [00:01<...'
_HREF = re.compile(r'<a href="(file://[^"]+)" ' + ARTIFACT_ATTR + r'="1"')


# --------------------------------------------------------------------------- notebook clean-up before export


TEXT_ARTIFACTS = (".html", ".json", ".md", ".csv", ".txt", ".log")  # copied with machine paths made relative


def _strip_copied_paths(path: Path) -> None:
    """A copied text artifact (a file, or a folder's text files; a session report names its own output folder, say)
    with the machine's absolute paths shown from the report folder's `artifacts/` or the repository
    (html_clean.strip_paths): a shared report shows no machine's paths."""
    files = [path] if path.is_file() else [f for f in path.rglob("*") if f.is_file() and f.suffix in TEXT_ARTIFACTS]
    for f in files:
        text = f.read_text(errors="surrogateescape")
        clean = html_clean.strip_paths(text)
        if clean != text:
            f.write_text(clean, errors="surrogateescape")


def _copy_artifact(src: Path, dest_dir: Path) -> Path:
    """Copy `src` (a file or a folder) into dest_dir, atomically per file, text files with machine paths made
    relative; returns the copy's path."""
    dest = dest_dir / src.name
    dest_dir.mkdir(parents=True, exist_ok=True)
    if src.is_dir():
        if dest.exists():
            return dest
        tmp = Path(tempfile.mkdtemp(dir=dest_dir, prefix=f".{src.name}."))
        try:
            shutil.copytree(src, tmp, dirs_exist_ok=True)
            _strip_copied_paths(tmp)
            os.replace(tmp, dest)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return dest
    if dest.exists() and dest.stat().st_size == src.stat().st_size and dest.stat().st_mtime >= src.stat().st_mtime:
        return dest
    fd, tmp = tempfile.mkstemp(dir=dest_dir, prefix=f".{src.name}.", suffix=".tmp")
    os.close(fd)
    try:
        shutil.copy2(src, tmp)
        if dest.suffix in TEXT_ARTIFACTS:
            _strip_copied_paths(Path(tmp))
        os.replace(tmp, dest)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return dest


def _relink(text: str, report_dir: Path, artifacts: Path | None, copied: list[str]) -> str:
    """Artifact links (file:// URIs) made relative to the report folder; a file outside it is copied into
    `artifacts` first. A file that no longer exists keeps its link text without a link."""

    def sub(m: re.Match) -> str:
        src = Path(unquote(urlparse(m.group(1)).path))
        if not src.exists():
            return f'<a title="not kept with this report: {html.escape(src.name)}" {ARTIFACT_ATTR}="missing"'
        try:
            src.resolve().relative_to(report_dir.resolve())
            target = src
        except ValueError:
            if artifacts is None:
                return m.group(0)
            target = _copy_artifact(src, artifacts)
            copied.append(str(target))
        rel = Path(os.path.relpath(target, report_dir)).as_posix()
        return f'<a href="{html.escape(rel)}" {ARTIFACT_ATTR}="1"'

    return _HREF.sub(sub, text)


_NB_LINK = re.compile(r"\]\((\d\d_[A-Za-z0-9_]+)\.ipynb\)")


def prepare_for_html(nb, report_dir: Path, artifacts: Path | None = None, own: str = "",
                     published: bool = False) -> tuple[Any, list[str]]:
    """A copy of the executed notebook ready for HTML: GIFs embedded as <img>, artifact links relative (files
    copied under `artifacts`), links to other notebooks pointed at their reports in the same folder (when there),
    noise lines, known warnings and unsaved progress widgets dropped; `published`: every stderr output dropped.
    Returns (notebook, copied files)."""
    nb = copy.deepcopy(nb)
    for cell in nb.cells:
        if cell.cell_type == "markdown" and ".ipynb)" in cell.source:
            cell.source = _NB_LINK.sub(
                lambda m: f"]({report_link(m.group(1), report_dir, own) or m.group(1) + '.ipynb'})", cell.source)
    has_state = bool(nb.metadata.get("widgets", {}).get("application/vnd.jupyter.widget-state+json", {}).get("state"))
    copied: list[str] = []
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        outs = []
        for out in cell.get("outputs", []):
            kind = out.get("output_type")
            if kind == "stream":
                if published and out.get("name") == "stderr":
                    continue
                out["text"] = _KNOWN_STDERR.sub("", _NOISE.sub("", out.get("text", "")))
                if not out["text"].strip():
                    continue
            elif kind in ("display_data", "execute_result"):
                data = out.get("data", {})
                if WIDGET_VIEW in data and set(data) <= {WIDGET_VIEW, "text/plain"}:
                    text = data.get("text/plain", "")
                    text = "".join(text) if isinstance(text, list) else text
                    if not has_state or _TQDM.search(text):
                        continue  # a widget whose state was not saved, or a progress bar: an empty box in HTML
                if "image/gif" in data and "text/html" not in data:
                    gif = data["image/gif"]
                    gif = gif if isinstance(gif, str) else base64.b64encode(gif).decode("ascii")
                    data["text/html"] = f'<img alt="animation" src="data:image/gif;base64,{gif.strip()}">'
                if "text/html" in data:
                    h = data["text/html"]
                    h = "".join(h) if isinstance(h, list) else h
                    data["text/html"] = _relink(h, report_dir, artifacts, copied)
            outs.append(out)
        cell["outputs"] = outs
    return nb, copied


TEMPLATE = Path(__file__).parent / "templates"  # wmbook_report: nbconvert's lab template without network scripts


def run_rows(rec: dict, store=None):
    """The results rows of one run a notebook names ({run_id, results_path}: notebook_runs): where the run wrote them,
    else in the store they were merged into (`store`, default data/results/results.csv: a GPU host's results file
    stays behind when its rows are appended there and its notebook is published); None when none holds them."""
    from . import results  # noqa: PLC0415  heavy: pandas (wmbook run starts without)

    for path in dict.fromkeys(p for p in (rec.get("results_path"), store, results.default_path()) if p):
        try:
            df = results.read(path, run_id=rec["run_id"])
        except Exception:  # noqa: BLE001  (a moved results file: the report stands without findings)
            continue
        if len(df):
            return df
    return None


def report_findings(executed_nb, store=None) -> tuple[list[str], list[tuple[str, str]]] | None:
    """The findings bullets and links of an executed notebook, from the results rows its results cell names (run_rows:
    `store` where the run's own file is not here; None when it names none or they are gone)."""
    from . import headlines  # noqa: PLC0415  heavy: torch, pandas (wmbook run starts without)

    for rec in notebook_runs(executed_nb):
        df = run_rows(rec, store)
        f = headlines.findings(df) if df is not None and len(df) else None
        if f is not None:
            return f.bullets(), f.next_links
    return None


def finish_page(body: str, folder: Path, own: str, bullets: list[str] | None, links=(),
                published: bool = False, mend_all: bool = False) -> str:
    """An nbconvert page made whole (wmbook.html_clean): no network script, no machine path, links mended (a notebook
    link pointed at its report in `folder`, else made text; `mend_all`: every broken link made text), the findings box
    under the title, the results rows and appendix collapsed, the index link on top, wmbook's report style;
    `published`: no stderr box."""
    soup = html_clean.soup_of(body)
    html_clean.remove_network_scripts(soup)
    html_clean.remove_machine_paths(soup)
    if published:
        html_clean.remove_stderr(soup)
    html_clean.fix_links(soup, folder, own, mend_all)
    if bullets:
        resolved = [(t, html_clean.anchor(soup, h) if h.startswith("#") else (report_link(h, folder, own) or ""))
                    for t, h in links]
        html_clean.insert_findings(soup, findings_box(bullets, [(t, h) for t, h in resolved if h]))
    html_clean.collapse_sections(soup)
    html_clean.add_style(soup, REPORT_CSS)
    if ((folder / "index.html").exists() or (folder / "summary.json").exists()) and soup.body is not None \
            and soup.find(class_="wmbook-nav") is None:
        soup.body.insert(0, html_clean.soup_of('<div class="wmbook-nav"><a href="index.html">&larr; index of this '
                                               'report</a></div>'))
    return str(soup)


def render_html(executed: str | os.PathLike, html_path: str | os.PathLike,
                artifacts: str | os.PathLike | None = None, published: bool = False, store=None) -> Path:
    """Render an executed notebook to standalone HTML that opens with its findings (see the module docstring),
    atomically. `artifacts`: where files outside the report folder are copied (default
    ``<report folder>/artifacts/<notebook>``); `store`: where the findings' rows are when the run's own results file
    is not on this machine (run_rows). A link the page still cannot resolve fails the render (ValueError)."""
    import nbformat  # noqa: PLC0415  heavy: nbformat
    from nbconvert import HTMLExporter  # noqa: PLC0415  heavy: nbconvert

    executed = Path(executed)
    html_path = Path(html_path)
    nb = nbformat.read(executed, as_version=4)
    name = executed.stem.removesuffix(".FAILED")
    art = Path(artifacts) if artifacts is not None else html_path.parent / "artifacts" / name
    ready, _ = prepare_for_html(nb, html_path.parent, art, own=html_path.stem, published=published)
    exporter = HTMLExporter(embed_images=True, template_name="wmbook_report", extra_template_basedirs=[str(TEMPLATE)])
    body, _ = exporter.from_notebook_node(ready, resources={"metadata": {"name": executed.stem}})
    found = report_findings(nb, store)
    body = finish_page(body, html_path.parent, html_path.stem, found[0] if found else None,
                       found[1] if found else (), published)
    broken = html_clean.broken_links(html_clean.soup_of(body), html_path.parent)
    if broken:
        raise ValueError(f"{html_path.name} links to files that are not in its folder: {broken[:5]}")
    atomic_write_text(html_path, body)
    return html_path


# --------------------------------------------------------------------------- what a notebook says


_QUESTION = re.compile(r"\*\*Question\.\*\*\s*(.+?)(?:\n\s*\n|$)", re.S)


def notebook_question(nb) -> str | None:
    """The '**Question.** ...' paragraph of the notebook's first markdown cells."""
    for cell in nb.cells[:4]:
        if cell.cell_type == "markdown":
            m = _QUESTION.search(cell.source)
            if m:
                text = " ".join(m.group(1).split())
                return re.sub(r"\s+[^.?!]*:$", "", text)  # a trailing 'Two workloads:' introduces a list
    return None


def _output_text(out) -> str | None:
    data = out.get("data", {})
    for mime in ("text/markdown", "text/plain"):
        if mime in data:
            t = data[mime]
            return "".join(t) if isinstance(t, list) else t
    if out.get("output_type") == "stream":
        return out.get("text")
    return None


def notebook_conclusion(nb) -> str | None:
    """The text output of the cells under the '## Interpretation' heading (the notebook's conclusion)."""
    inside = False
    texts = []
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            heads = re.findall(r"^\s*#{1,3}\s+(.+)$", cell.source, re.M)
            if heads:
                inside = any(h.strip().lower().startswith("interpretation") for h in heads)
            continue
        if inside:
            for out in cell.get("outputs", []):
                t = _output_text(out)
                if t and t.strip() and not t.startswith("<IPython"):
                    texts.append(t.strip())
    return "\n\n".join(texts) or None


def notebook_runs(nb) -> list[dict]:
    """The {run_id, results_path} records a notebook's results cells left in their display metadata."""
    found = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            md = out.get("metadata", {}).get(META_KEY)
            if isinstance(md, dict) and md.get("run_id"):
                found.append({"run_id": md["run_id"], "results_path": md.get("results_path")})
    return found


def notebook_facts(executed: str | os.PathLike) -> dict:
    """question, conclusion, run ids, findings bullets and headline numbers (from the results rows) of an executed
    notebook."""
    import nbformat  # noqa: PLC0415  heavy: nbformat

    nb = nbformat.read(Path(executed), as_version=4)
    found = report_findings(nb)
    facts: dict[str, Any] = {"question": notebook_question(nb), "conclusion": notebook_conclusion(nb),
                             "results": notebook_runs(nb), "headline": {}, "findings": found[0] if found else []}
    for rec in facts["results"]:
        try:
            from . import headlines  # noqa: PLC0415  heavy: torch, pandas (wmbook run starts without)

            df = run_rows(rec)
            if df is None:
                facts["headline_error"] = (f"the rows of run {rec['run_id']} are neither in the results file "
                                           "the notebook names nor in the store")
            else:
                facts["headline"].update(headlines.headline(df))
        except Exception as e:  # noqa: BLE001  (a moved results file: the index says so, the report stays)
            facts["headline_error"] = f"{type(e).__name__}: {e}"
    return facts


# --------------------------------------------------------------------------- index


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
    rows, findings = [], []
    for r in runs:
        html_rel, nb_rel = _rel(r.html_path, out), _rel(r.executed_path, out)
        html_link = f'<a href="{e(html_rel)}">HTML</a>' if html_rel else ""
        nb_link = f'<a href="{e(nb_rel)}">.ipynb</a>' if nb_rel else ""
        detail = ""
        if r.status == STATUS_FAILED:
            detail = f"<code>{e(r.failed_where())}</code><br>{e(r.error or '')}"
        seconds = f"{r.seconds:.1f} s" if r.status != STATUS_PENDING else ""
        status = f'<span style="{_STATUS_STYLE.get(r.status, "")}">{e(r.status)}</span>'
        rows.append(
            "<tr>"
            f'<td><a href="#{e(r.name)}">{e(r.name)}</a></td>'
            f"<td>{status}</td>"
            f'<td style="text-align:right">{seconds}</td>'
            f"<td>{html_link}</td><td>{nb_link}</td>"
            f"<td>{detail}</td>"
            "</tr>"
        )
        facts = getattr(r, "facts", None) or {}
        if r.status != STATUS_PENDING:
            links = [(t, h) for t, h in (("report", html_rel), ("executed notebook", nb_rel)) if h]
            ok = r.status == STATUS_OK
            findings.append(finding_html(
                r.name, facts.get("question"), dict(list((facts.get("headline") or {}).items())[:6]),
                facts.get("conclusion") if ok else f"Failed: {r.error}", links, status,
                bullets=facts.get("findings") or () if ok else (), anchor=r.name))
    n_ok = sum(r.status == STATUS_OK for r in runs)
    n_failed = sum(r.status == STATUS_FAILED for r in runs)
    facts_rows = "".join(
        f"<tr><th>{e(str(k))}</th><td>{e(html_clean.strip_paths(json.dumps(v) if not isinstance(v, str) else v))}"
        f"</td></tr>"
        for k, v in meta.items()
    )
    body = f"""<h1>wmbook report</h1>
<p>{n_ok} ok, {n_failed} failed, {len(runs) - n_ok - n_failed} pending, of {len(runs)} notebooks.</p>
<table>
<tr><th>notebook</th><th>status</th><th>duration</th><th>report</th><th>executed</th><th>failure</th></tr>
{chr(10).join(rows)}
</table>
<h2>Findings</h2>
<p>Per notebook: its question, its findings (computed from its results rows: the headline number, the goal met or
missed, what to read next) and a few headline numbers.</p>
{chr(10).join(findings)}
<h2>Run</h2>
<table>
{facts_rows}
</table>"""
    return page(f"wmbook report {meta.get('started', '')}", body)


def write_index(out: Path, runs: Sequence, meta: Mapping[str, Any]) -> None:
    """index.html (status table and each notebook's finding) and summary.json in the report folder, each written
    atomically."""
    atomic_write_text(out / "index.html", _index_html(runs, meta, out))
    summary = {"meta": dict(meta), "notebooks": [asdict(r) for r in runs]}
    atomic_write_text(out / "summary.json", json.dumps(summary, indent=2, default=str) + "\n")


