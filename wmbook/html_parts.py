"""Building blocks of the HTML pages wmbook writes (report indexes, a report's findings box): the page shell and its
style, markdown, headline tables, finding cards and collapsed appendices. No network: every page is whole offline."""

from __future__ import annotations

import html
import re
from typing import Any, Mapping, Sequence

INDEX_CSS = """
body { font-family: system-ui, sans-serif; margin: 2em; max-width: 1400px; color: #222; }
table { border-collapse: collapse; margin-bottom: 1.2em; }
th, td { border: 1px solid #ccc; padding: 0.3em 0.7em; text-align: left; vertical-align: top; }
th { background: #f4f4f4; }
code { font-size: 90%; }
.summary { border: 1px solid #bbb; border-radius: 6px; padding: 0.6em 1em; margin: 0 0 1.5em 0; }
.summary h2 { font-size: 1.2em; margin: 0.2em 0 0.5em 0; }
.summary .body { display: flex; flex-wrap: wrap; gap: 1em; align-items: flex-start; }
.summary .chart svg { width: 520px; height: auto; }
.summary td.num, .headline td { text-align: right; font-variant-numeric: tabular-nums; }
.finding { border: 1px solid #ddd; border-radius: 6px; padding: 0.5em 1em; margin: 0 0 1em 0; }
.finding h3 { font-size: 1.05em; margin: 0.2em 0 0.3em 0; }
.finding ul { margin: 0.3em 0; padding-left: 1.3em; }
.finding .question { color: #555; font-style: italic; margin: 0 0 0.3em 0; font-size: 0.92em; }
.headline th { font-weight: normal; }
.links a { margin-right: 1em; }
details > summary { cursor: pointer; color: #335; }
"""

# the box under a report's title (wmbook.render, wmbook.tidy): its findings, and the report's own style fixes
FINDINGS_CLASS = "wmbook-findings"
REPORT_CSS = f"""
.{FINDINGS_CLASS} {{ border: 2px solid #4477aa; border-radius: 6px; background: #f5f8fc; padding: 0.4em 1.2em;
  margin: 0.6em 0 1.2em 0; font: 15px/1.45 system-ui, sans-serif; max-width: 1100px; }}
.{FINDINGS_CLASS} h2 {{ font-size: 1.1em; margin: 0.3em 0; }}
.{FINDINGS_CLASS} li {{ margin: 0.25em 0; }}
.jp-OutputArea-output table, .jp-RenderedHTMLCommon table {{ font-size: 12px; }}
.jp-OutputArea-output {{ overflow-x: auto; }}
.wmbook-nav {{ font: 13px system-ui, sans-serif; margin: 0.5em 1em; }}
details.wmbook-appendix > summary {{ font: 600 15px system-ui, sans-serif; margin: 0.8em 0 0.4em 1em; cursor: pointer; }}
"""


def markdown(text: str) -> str:
    """Markdown as HTML (conclusions and findings are markdown: code spans, emphasis, lists)."""
    try:
        import markdown as md  # noqa: PLC0415  optional: markdown

        return md.markdown(text)
    except ImportError:
        try:
            import mistune  # noqa: PLC0415  optional: mistune

            return mistune.html(text)
        except Exception:  # noqa: BLE001
            return f"<p>{html.escape(text)}</p>"


def inline_markdown(text: str) -> str:
    """Markdown of one paragraph, without its <p>."""
    return re.sub(r"^<p>|</p>\s*$", "", markdown(text).strip())


def headline_table(headline: Mapping[str, Any]) -> str:
    """A one-row table of headline numbers (header: name, cell: value)."""
    if not headline:
        return ""
    e = html.escape
    heads = "".join(f"<th>{e(str(k))}</th>" for k in headline)
    cells = "".join(f"<td>{e(str(v))}</td>" for v in headline.values())
    return f'<table class="headline"><tr>{heads}</tr><tr>{cells}</tr></table>'


def table(rows: Sequence[Mapping[str, Any]], numeric: Sequence[str] = (), raw: Sequence[str] = ()) -> str:
    """An HTML table of dicts (keys: the header); `raw` columns hold HTML, the others text."""
    if not rows:
        return ""
    e = html.escape
    cols = list(rows[0])
    head = "".join(f"<th>{e(c)}</th>" for c in cols)
    body = "".join("<tr>" + "".join(
        f'<td{" class=num" if c in numeric else ""}>{r[c] if c in raw else e(str(r[c]))}</td>' for c in cols)
        + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def bullets_html(items: Sequence[str]) -> str:
    return "<ul>" + "".join(f"<li>{inline_markdown(t)}</li>" for t in items if t) + "</ul>"


def link_list(links: Sequence[tuple[str, str]]) -> str:
    e = html.escape
    return ('<p class="links">' + " · ".join(f'<a href="{e(h)}">{e(t)}</a>' for t, h in links) + "</p>") if links \
        else ""


def finding_html(title: str, question: str | None, headline: Mapping[str, Any], conclusion: str | None,
                 links: Sequence[tuple[str, str]], status_html: str = "", bullets: Sequence[str] = (),
                 anchor: str = "") -> str:
    """A card: title, the question in one line, the findings bullets (or a conclusion), headline numbers, links."""
    e = html.escape
    parts = [f'<div class="finding"{f" id={chr(34)}{e(anchor)}{chr(34)}" if anchor else ""}>'
             f"<h3>{e(title)} {status_html}</h3>"]
    if question:
        parts.append(f'<p class="question">{inline_markdown(question)}</p>')
    if bullets:
        parts.append(bullets_html(bullets))
    elif conclusion:
        parts.append(f'<div class="conclusion">{markdown(conclusion)}</div>')
    parts.append(headline_table(headline))
    parts.append(link_list(links))
    parts.append("</div>")
    return "".join(parts)


def findings_box(bullets: Sequence[str], links: Sequence[tuple[str, str]] = ()) -> str:
    """The box under a report's title: three bullets (headline number, goal met or missed, what to read next)."""
    return (f'<div class="{FINDINGS_CLASS}"><h2>Findings</h2>{bullets_html(bullets)}{link_list(links)}</div>')


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
