"""Rendering of a report folder: each executed notebook as standalone HTML, and the folder's index page and
summary (wmbook.run writes them as the notebooks finish).

A rendered report is self-contained: images are embedded, animated GIFs too (nbconvert drops image/gif outputs:
they are turned into embedded <img> elements), and every file a notebook linked with wmbook.display.link (traces,
session reports) is copied into the report folder's ``artifacts/<notebook>/`` and linked relatively. Noise that
means nothing to a reader (the profiler's USDT lines, the kernel's transport warning, progress-bar widgets whose
state was not saved) is left out of the HTML; the executed notebook keeps every output.
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

from .atomic import atomic_write_text

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
_TQDM = re.compile(r"\d+%\|.*\|\s*\d+/\d+|it/s\]|s/it\]")  # a tqdm bar's text: ' 40%|####  | 4/10 [00:01<...'
_HREF = re.compile(r'<a href="(file://[^"]+)" ' + ARTIFACT_ATTR + r'="1"')


# --------------------------------------------------------------------------- notebook clean-up before export


def _copy_artifact(src: Path, dest_dir: Path) -> Path:
    """Copy `src` (a file or a folder) into dest_dir, atomically per file; returns the copy's path."""
    dest = dest_dir / src.name
    dest_dir.mkdir(parents=True, exist_ok=True)
    if src.is_dir():
        if dest.exists():
            return dest
        tmp = Path(tempfile.mkdtemp(dir=dest_dir, prefix=f".{src.name}."))
        try:
            shutil.copytree(src, tmp, dirs_exist_ok=True)
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


def _report_link(stem: str, report_dir: Path, own: str) -> str | None:
    """The report in `report_dir` of notebook `stem` (a cross-link target): the one whose name after the notebook's
    shares the longest start with the report `own`'s ('02_bottleneck_breakdown-wma-bf16' -> '01_...-wma-bf16' if
    there, else '04_...-wma' before '04_...-mg2-universal'), the shortest name among equals; partial and failed
    reports last."""
    cands = sorted(p.name for p in report_dir.glob(f"{stem}*.html") if ".FAILED" not in p.name)
    if not cands:
        return None
    suffix = own.split("-", 1)[1] if "-" in own else ""

    def shared(name: str) -> int:  # leading '-'-separated parts in common ('wma' and 'world-mg2' share none)
        rest = name[len(stem):].removesuffix(".html").lstrip("-").split("-")
        n = 0
        for a, b in zip(rest, suffix.split("-") if suffix else []):
            if a != b:
                break
            n += 1
        return n

    return min(cands, key=lambda c: ("PARTIAL" in c, -shared(c), len(c), c))


def prepare_for_html(nb, report_dir: Path, artifacts: Path | None = None, own: str = "") -> tuple[Any, list[str]]:
    """A copy of the executed notebook ready for HTML: GIFs embedded as <img>, artifact links relative (files
    copied under `artifacts`), links to other notebooks pointed at their reports in the same folder (when there),
    noise lines and unsaved progress widgets dropped. Returns (notebook, copied files)."""
    nb = copy.deepcopy(nb)
    for cell in nb.cells:
        if cell.cell_type == "markdown" and ".ipynb)" in cell.source:
            cell.source = _NB_LINK.sub(
                lambda m: f"]({_report_link(m.group(1), report_dir, own) or m.group(1) + '.ipynb'})", cell.source)
    has_state = bool(nb.metadata.get("widgets", {}).get("application/vnd.jupyter.widget-state+json", {}).get("state"))
    copied: list[str] = []
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        outs = []
        for out in cell.get("outputs", []):
            kind = out.get("output_type")
            if kind == "stream":
                out["text"] = _NOISE.sub("", out.get("text", ""))
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


_REPORT_CSS = """<style>
.jp-OutputArea-output table, .jp-RenderedHTMLCommon table { font-size: 12px; }
.jp-OutputArea-output { overflow-x: auto; }
.wmbook-nav { font: 13px system-ui, sans-serif; margin: 0.5em 1em; }
</style>"""


def render_html(executed: str | os.PathLike, html_path: str | os.PathLike,
                artifacts: str | os.PathLike | None = None) -> Path:
    """Render an executed notebook to standalone HTML (images embedded, artifacts linked relatively, see the module
    docstring), atomically. `artifacts`: where files outside the report folder are copied (default
    ``<report folder>/artifacts/<notebook>``)."""
    import nbformat
    from nbconvert import HTMLExporter

    executed = Path(executed)
    html_path = Path(html_path)
    nb = nbformat.read(executed, as_version=4)
    name = executed.stem.removesuffix(".FAILED")
    art = Path(artifacts) if artifacts is not None else html_path.parent / "artifacts" / name
    nb, _ = prepare_for_html(nb, html_path.parent, art, own=html_path.stem)
    exporter = HTMLExporter(embed_images=True)
    body, _ = exporter.from_notebook_node(
        nb, resources={"metadata": {"name": executed.stem, "path": str(executed.parent)}}
    )
    nav = ""
    if (html_path.parent / "index.html").exists() or (html_path.parent / "summary.json").exists():
        nav = '<div class="wmbook-nav"><a href="index.html">&larr; index of this report</a></div>'
    body = body.replace("</head>", _REPORT_CSS + "\n</head>", 1)
    body = re.sub(r"(<body[^>]*>)", lambda m: m.group(1) + nav, body, count=1)
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
    """question, conclusion, run ids and headline numbers (from the results rows) of an executed notebook."""
    import nbformat

    nb = nbformat.read(Path(executed), as_version=4)
    facts: dict[str, Any] = {"question": notebook_question(nb), "conclusion": notebook_conclusion(nb),
                             "results": notebook_runs(nb), "headline": {}}
    for rec in facts["results"]:
        try:
            from . import headlines, results

            df = results.read(rec["results_path"], run_id=rec["run_id"])
            if len(df):
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

INDEX_CSS = """
body { font-family: system-ui, sans-serif; margin: 2em; max-width: 1400px; color: #222; }
table { border-collapse: collapse; margin-bottom: 1.5em; }
th, td { border: 1px solid #ccc; padding: 0.3em 0.7em; text-align: left; vertical-align: top; }
th { background: #f4f4f4; }
code { font-size: 90%; }
.finding { border: 1px solid #ddd; border-radius: 6px; padding: 0.6em 1em; margin: 0 0 1.2em 0; }
.finding h2 { font-size: 1.15em; margin: 0.2em 0 0.4em 0; }
.finding .question { color: #444; font-style: italic; margin: 0 0 0.5em 0; }
.finding .conclusion { margin: 0.5em 0; line-height: 1.4; }
.headline td { text-align: right; font-variant-numeric: tabular-nums; }
.headline th { font-weight: normal; }
.links a { margin-right: 1em; }
"""


def headline_table(headline: Mapping[str, Any]) -> str:
    """A one-row table of headline numbers (header: name, cell: value)."""
    if not headline:
        return ""
    e = html.escape
    heads = "".join(f"<th>{e(str(k))}</th>" for k in headline)
    cells = "".join(f"<td>{e(str(v))}</td>" for v in headline.values())
    return f'<table class="headline"><tr>{heads}</tr><tr>{cells}</tr></table>'


def _markdown(text: str) -> str:
    """Markdown as HTML (the conclusions are markdown: code spans, emphasis)."""
    try:
        import markdown as md

        return md.markdown(text)
    except ImportError:
        try:
            import mistune

            return mistune.html(text)
        except Exception:  # noqa: BLE001
            return f"<p>{html.escape(text)}</p>"


def finding_html(title: str, question: str | None, headline: Mapping[str, Any], conclusion: str | None,
                 links: Sequence[tuple[str, str]], status_html: str = "") -> str:
    e = html.escape
    parts = [f'<div class="finding"><h2>{e(title)} {status_html}</h2>']
    if question:
        q = re.sub(r"^<p>|</p>\s*$", "", _markdown(question).strip())
        parts.append(f'<p class="question">{q}</p>')
    parts.append(headline_table(headline))
    if conclusion:
        parts.append(f'<div class="conclusion">{_markdown(conclusion)}</div>')
    if links:
        parts.append('<p class="links">' + "".join(f'<a href="{e(h)}">{e(t)}</a>' for t, h in links) + "</p>")
    parts.append("</div>")
    return "".join(parts)


def page(title: str, body: str) -> str:
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{html.escape(title)}</title>
<style>{INDEX_CSS}</style>
</head>
<body>
{body}
</body>
</html>
"""


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
            findings.append(f'<a id="{e(r.name)}"></a>' + finding_html(
                r.name, facts.get("question"), facts.get("headline") or {},
                facts.get("conclusion") if r.status == STATUS_OK else f"Failed: {r.error}", links, status))
    n_ok = sum(r.status == STATUS_OK for r in runs)
    n_failed = sum(r.status == STATUS_FAILED for r in runs)
    facts_rows = "".join(
        f"<tr><th>{e(str(k))}</th><td>{e(json.dumps(v) if not isinstance(v, str) else v)}</td></tr>"
        for k, v in meta.items()
    )
    body = f"""<h1>wmbook report</h1>
<p>{n_ok} ok, {n_failed} failed, {len(runs) - n_ok - n_failed} pending, of {len(runs)} notebooks.</p>
<table>
<tr><th>notebook</th><th>status</th><th>duration</th><th>report</th><th>executed</th><th>failure</th></tr>
{chr(10).join(rows)}
</table>
<h2>Findings</h2>
<p>Per notebook: its question, headline numbers from its results rows, and its conclusion (the notebook's
Interpretation section).</p>
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


# --------------------------------------------------------------------------- index of a folder of published reports


def html_conclusion(path: str | os.PathLike) -> str | None:
    """The text under the 'Interpretation' heading of a rendered notebook (nbconvert HTML): its conclusion."""
    from bs4 import BeautifulSoup

    soup = BeautifulSoup(Path(path).read_text(encoding="utf-8", errors="replace"), "html.parser")
    head = soup.find(id=re.compile(r"^Interpretation"))
    if head is None:
        return None
    texts = []
    for el in head.find_all_next():
        if el.name in ("h1", "h2", "h3"):  # the next section (the appendix's raw tables) is not the conclusion
            break
        if not any(c.startswith("jp-OutputArea-output") for c in el.get("class") or ()):
            continue
        if el.find(["h1", "h2", "h3"]) is not None:  # an output that opens a section (wd.show_appendix's titles)
            break
        md = el.find(class_=re.compile(r"jp-RenderedMarkdown")) or el
        t = _blocks_markdown(md)
        if t and not t.startswith("{"):
            texts.append(t)
    return "\n\n".join(texts) or None


def _inline_markdown(el) -> str:
    """An element's text as inline markdown: code spans, bold and italics kept, whitespace collapsed."""
    from bs4 import NavigableString

    if isinstance(el, NavigableString):
        return str(el)
    inner = "".join(_inline_markdown(c) for c in el.children)
    if el.name == "code":
        return f"`{el.get_text()}`"
    if el.name in ("strong", "b") and inner.strip():
        return f"**{inner.strip()}**"
    if el.name in ("em", "i") and inner.strip():
        return f"*{inner.strip()}*"
    return inner


def _blocks_markdown(md) -> str:
    """A rendered markdown output back as markdown paragraphs and list items (the index re-renders it), so a
    conclusion written as a list stays a list instead of one run-on paragraph."""
    blocks = []
    children = [c for c in md.children if getattr(c, "name", None)]
    if not children or not all(c.name in ("p", "ul", "ol", "div", "blockquote") for c in children):
        return " ".join(_inline_markdown(md).split())
    for c in children:
        if c.name in ("ul", "ol"):
            items = (" ".join(_inline_markdown(li).split()) for li in c.find_all("li", recursive=False))
            blocks.append("\n".join(f"- {t}" for t in items if t))
        else:
            blocks.append(" ".join(_inline_markdown(c).split()))
    return "\n\n".join(b for b in blocks if b)


def _run_dtype(run) -> str | None:
    """The dtype a stored run was made with (its params), None when not recorded."""
    if run is None or "params" not in run or not len(run):
        return None
    try:
        return json.loads(run["params"].iloc[0] or "{}").get("dtype") or None
    except (TypeError, ValueError):
        return None


def _split_report_name(stem: str, keys) -> tuple[str, str | None, str | None, str]:
    """(notebook, workload, preset, label) of a published report file stem such as
    '04_compile_autocast-mg2-universal-compile-kvfix' against the known (notebook, workload, preset) keys."""
    nb, _, rest = stem.partition("-")
    rest_l = rest.removesuffix(".PARTIAL")
    best = None
    for k_nb, wl, preset in keys:
        if k_nb != nb:
            continue
        for cand in (preset, wl):
            if rest_l == cand or rest_l.startswith(cand + "-"):
                if best is None or len(cand) > len(best[2] if best[2] == cand else best[1]):
                    best = (nb, wl, preset, rest_l[len(cand):].lstrip("-"))
    if best is None:  # no stored GPU run for it: the longest leading part that names a preset
        from . import workloads

        parts = rest_l.split("-")
        for i in range(len(parts), 0, -1):
            cand = "-".join(parts[:i])
            try:
                wl = workloads.for_preset(cand)
            except ValueError:
                continue
            label = "-".join(parts[i:]) + (" (partial)" if rest.endswith(".PARTIAL") else "")
            return nb, wl.name, cand, label.strip()
        return nb, None, None, rest
    return best[0], best[1], best[2], best[3] + (" (partial)" if rest.endswith(".PARTIAL") else "")


_ELIDED_CELL = re.compile(r"<t[hd][^>]*>\s*(?:\.\.\.|\u2026|&hellip;)\s*</t[hd]>")
_IMG_SRC = re.compile(r"<img[^>]*\ssrc=\"([^\"]*)\"")


def render_flaws(path: str | os.PathLike) -> list[str]:
    """What a rendered report shows that the current rendering never does, as short phrases (empty: none): tables cut
    by pandas' repr ('...' columns or rows), progress widgets rendered as empty boxes, images that are not embedded.
    Reports rendered before wmbook.display and this module have them; the folder index names them per report."""
    text = Path(path).read_text(errors="replace")
    flaws = []
    if _ELIDED_CELL.search(text):
        flaws.append("tables cut ('...')")
    if WIDGET_VIEW in text:
        flaws.append("empty progress boxes")
    if any(not src.startswith("data:") for src in _IMG_SRC.findall(text)):
        flaws.append("images not embedded")
    return flaws


def write_folder_index(folder: str | os.PathLike, results_path: str | os.PathLike | None = None,
                       notebooks: str | os.PathLike | None = None, title: str | None = None,
                       note: str | None = None, device: str | None = None) -> Path:
    """index.html for a folder of rendered reports (e.g. data/reports/h100): per notebook and workload/preset its
    question (from the notebook source), headline numbers (the published runs' results rows,
    wmbook.headlines.published_runs), its conclusion (the report's Interpretation section) and links to every
    report and other file. `device`: only rows whose device name contains it (e.g. 'H100'; the folder's reports
    come from one kind of card, the stored rows from several). Written atomically; nothing else in the folder is
    touched."""
    import nbformat

    from . import headlines, results
    from .paths import REPO_ROOT

    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(f"folder={str(folder)!r} is not allowed: not a folder; allowed values: a folder of rendered "
                         f"reports (*.html)")
    df = results.read(results_path or results.default_path())
    df = results.of_device(df, device)
    runs = headlines.published_runs(df)
    nb_dir = Path(notebooks) if notebooks is not None else REPO_ROOT / "notebooks"
    questions = {}
    for p in sorted(nb_dir.glob("[0-9][0-9]_*.ipynb")):
        try:
            questions[p.stem] = notebook_question(nbformat.read(p, as_version=4))
        except Exception:  # noqa: BLE001
            questions[p.stem] = None
    groups: dict[tuple, list[tuple[str, Path]]] = {}
    for f in sorted(folder.glob("*.html")):
        if f.name == "index.html":
            continue
        nb, wl, preset, label = _split_report_name(f.stem, runs)
        groups.setdefault((nb, wl, preset), []).append((label or "main report", f))
    e = html.escape
    findings = []
    for key in sorted(groups, key=lambda k: (k[0], k[1] or "", k[2] or "")):
        nb, wl, preset = key
        files = groups[key]
        run = runs.get(key)
        dtype = _run_dtype(run)  # reports per dtype (01's bf16 / fp32): the conclusion of the run the numbers are from
        main = min(files, key=lambda t: (t[0] != dtype, t[0] != "main report", "partial" in t[0],
                                         len(t[1].name)))[1]
        conclusion = None
        for _, f in sorted(files, key=lambda t: t[1] != main):
            try:
                conclusion = html_conclusion(f)
            except Exception:  # noqa: BLE001
                conclusion = None
            if conclusion:
                if f != main:
                    conclusion += f"\n\n(from {f.name})"
                break
        head = headlines.headline(run) if run is not None else {}
        if run is not None:
            head = head | {"device": str(run["device_name"].iloc[0]),
                           "commit": ", ".join(sorted({str(c)[:7] for c in run["git_commit"] if str(c)})) or "?"}
        title_ = f"{nb} · {wl or '?'} / {preset or '?'}"
        links = []
        for label, f in files:
            flaws = render_flaws(f)  # an older render: say so at its link, the numbers above come from the rows
            links.append((f"{label}: {f.name}" + (f" (older render: {', '.join(flaws)})" if flaws else ""), f.name))
        findings.append(finding_html(title_, questions.get(nb), head, conclusion, links))
    others = sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix != ".html" and not p.name.startswith("."))
    other_html = "".join(f'<li><a href="{e(p.relative_to(folder).as_posix())}">{e(p.relative_to(folder).as_posix())}'
                         f"</a></li>" for p in others)
    body = (f"<h1>{e(title or f'wmbook reports: {folder.name}')}</h1>"
            + (f"<p>{e(note)}</p>" if note else "")
            + "<p>Per notebook and workload: the question it answers, headline numbers from the latest GPU run in "
              "the results table (<code>data/results/results.csv</code>; median with p20-p80 in brackets), the "
              "conclusion its report states, and the reports.</p>"
            + "\n".join(findings)
            + (f"<h2>Other files</h2><ul>{other_html}</ul>" if other_html else ""))
    out = folder / "index.html"
    atomic_write_text(out, page(title or f"wmbook reports: {folder.name}", body))
    return out
