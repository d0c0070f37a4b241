"""A rendered report made whole and readable, and checked: the same steps for a new render (wmbook.render) and for a
published report that exists only as HTML (wmbook.tidy).

- no script from the network (nbconvert's template loads require.js, MathJax and mermaid from a CDN; a report needs
  none of them), no machine path (a folder of the host that ran it becomes a path relative to the repository or the
  report folder, or the file's name), no stderr box in a published report;
- the findings box under the title, the results rows and the appendix of raw tables collapsed (`<details>`);
- `problems(page, folder)`: what a report still shows that it should not (the tests and the renderers ask it): no
  findings box, cut cells ('...'), machine paths, broken relative links, network scripts, stderr boxes.
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote, urlparse

from .html_parts import FINDINGS_CLASS

STDERR_MIME = "application/vnd.jupyter.stderr"
# an absolute path on a Linux or macOS host (a home, temporary or checkout folder)
MACHINE_PATH = re.compile(r"(?<![\w.:/-])/(?:root|home|tmp|work|workspace|opt|mnt|scratch|srv|var|usr|lustre|private"
                          r"|Users|data\d*)(?:/[^\s\"'<>:,;()\[\]{}`|=]+)+")
# folders of this repository and of a report folder: a path through one of them is shown from there
REPO_FOLDERS = ("wmbook", "notebooks", "data", "tests", "tools", "reports")
CUT_CELL = re.compile(r"<t[hd][^>]*>\s*(?:\.\.\.|\u2026|&hellip;)\s*</t[hd]>")
# sections whose cells are reference material, collapsed under their heading (by the heading's anchor)
COLLAPSED_SECTIONS = re.compile(r"^(Appendix|Results-rows|Raw-tables)", re.I)


def soup_of(text: str):
    from bs4 import BeautifulSoup  # noqa: PLC0415  heavy: bs4 (wmbook run starts without)

    return BeautifulSoup(text, "html.parser")


def relative_path(path: str) -> str:
    """A machine path as a reader can use it: from the last `artifacts/` (a report folder's files), else from the
    first folder of the repository, else after `site-packages/` (a library's file), else the file's name."""
    parts = path.split("/")
    if "artifacts" in parts:
        i = len(parts) - 1 - parts[::-1].index("artifacts")
        return "/".join(parts[i:])
    for marker in ("site-packages", "dist-packages"):
        if marker in parts:
            return "/".join(parts[parts.index(marker) + 1:])
    for i, p in enumerate(parts[1:], 1):
        if p in REPO_FOLDERS and i < len(parts) - 1:
            return "/".join(parts[i:])
    return parts[-1]


def strip_paths(text: str) -> str:
    return MACHINE_PATH.sub(lambda m: relative_path(m.group(0)), text)


def _text_nodes(soup):
    from bs4 import Comment, NavigableString  # noqa: PLC0415  heavy: bs4

    for node in soup.find_all(string=True):
        if isinstance(node, NavigableString) and not isinstance(node, Comment) \
                and node.parent.name not in ("script", "style"):
            yield node


def remove_machine_paths(soup) -> int:
    """Machine paths in text (tables, printouts, tracebacks) and link titles made relative; returns how many."""
    n = 0
    for node in list(_text_nodes(soup)):
        if MACHINE_PATH.search(node):
            n += len(MACHINE_PATH.findall(node))
            node.replace_with(strip_paths(str(node)))
    for a in soup.find_all(title=MACHINE_PATH):
        a["title"] = strip_paths(a["title"])
        n += 1
    return n


def drop(el) -> None:
    """Remove an element with the blank text after it (so a second pass over the page finds nothing to change)."""
    from bs4 import NavigableString  # noqa: PLC0415  heavy: bs4

    nxt = el.next_sibling
    if isinstance(nxt, NavigableString) and not nxt.strip():
        nxt.extract()
    el.decompose()


def _is_network(url: str) -> bool:
    return bool(re.match(r"^(https?:)?//", url or ""))


def remove_network_scripts(soup) -> int:
    """Scripts that load from the network or configure what would (MathJax, require.js, mermaid, the widget manager)
    removed; returns how many."""
    n = 0
    for s in soup.find_all("script"):
        if _is_network(s.get("src", "")) or "https://" in (s.string or "") or s.get("type") == "text/x-mathjax-config":
            drop(s)
            n += 1
    for link in soup.find_all("link", href=True):
        if _is_network(link["href"]):
            drop(link)
            n += 1
    return n


def _output_box(el):
    """The output area child holding `el` (the box a reader sees), or el."""
    box = el.find_parent(class_="jp-OutputArea-child")
    return box or el


def remove_stderr(soup) -> int:
    """Every stderr output box removed (a published report shows results; the executed notebook keeps its stderr)."""
    boxes = soup.find_all(attrs={"data-mime-type": STDERR_MIME})
    for b in boxes:
        drop(_output_box(b))
    return len(boxes)


def _cells(soup):
    main = soup.find("main") or soup.body
    return [c for c in main.find_all("div", recursive=False) if "jp-Cell" in (c.get("class") or [])] if main else []


def collapse_sections(soup) -> int:
    """The cells of the results-rows and appendix sections wrapped in a collapsed <details> under their heading;
    returns how many sections."""
    cells = _cells(soup)
    n, i = 0, 0
    while i < len(cells):
        head = cells[i].find(["h2", "h3"], id=COLLAPSED_SECTIONS)
        if head is None:
            i += 1
            continue
        level = head.name
        j = i + 1
        while j < len(cells) and cells[j].find(["h1", "h2"] if level == "h2" else ["h1", "h2", "h3"]) is None:
            j += 1
        body = cells[i + 1:j]
        if body:
            details = soup.new_tag("details", attrs={"class": "wmbook-appendix"})
            summary = soup.new_tag("summary")
            summary.string = head.get_text(" ", strip=True).replace("¶", "").strip() + " (click to open)"
            details.append(summary)
            body[0].insert_before(details)
            for c in body:
                details.append(c.extract())
            n += 1
        i = j
    return n


def insert_findings(soup, box_html: str) -> bool:
    """The findings box placed right after the report's title cell (replacing one already there)."""
    for old in soup.find_all(class_=FINDINGS_CLASS):
        old.decompose()
    h1 = soup.find("h1")
    anchor = h1.find_parent(class_="jp-Cell") if h1 is not None else None
    if anchor is None:
        cells = _cells(soup)
        if not cells:
            return False
        anchor = cells[0]
    rendered = anchor.find(class_="jp-RenderedMarkdown") or anchor
    frag = soup_of(box_html)
    # right after the title: inside the first cell, after its h1 paragraph block (the question follows)
    target = h1 if h1 is not None and h1.find_parent(class_="jp-Cell") is anchor else None
    if target is not None:
        target.insert_after(frag)
    else:
        rendered.insert(0, frag)
    return True


def anchor(soup, prefix: str) -> str:
    """'#id' of the first heading whose id starts with `prefix` ('#The-rows' finds '#The-rows:-base,-static-caches...');
    '' when the page has none."""
    want = prefix.lstrip("#").lower()
    for h in soup.find_all(["h1", "h2", "h3", "h4"], id=True):
        if h["id"].lower().startswith(want):
            return "#" + h["id"]
    return ""


def add_style(soup, css: str) -> None:
    head = soup.head
    if head is not None and css not in "".join(s.string or "" for s in head.find_all("style")):
        tag = soup.new_tag("style")
        tag.string = css
        head.append(tag)


# --------------------------------------------------------------------------- links


def report_link(stem: str, report_dir: Path, own: str) -> str | None:
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



def _local_target(href: str) -> str | None:
    """The file path a relative link points at, None for an anchor, data URI or network link."""
    if not href or href.startswith(("#", "data:", "mailto:", "javascript:")) or _is_network(href):
        return None
    u = urlparse(href)
    if u.scheme and u.scheme != "file":
        return None
    return unquote(u.path) if u.path else None


def broken_links(soup, folder: Path) -> list[str]:
    """Relative links (href, src) whose target is not in `folder`; file:// links count as broken (machine paths)."""
    out = []
    for tag in soup.find_all(href=True) + soup.find_all("img", src=True):
        url = tag.get("href") or tag.get("src")
        target = _local_target(url)
        if target is None:
            continue
        if url.startswith("file:") or target.startswith("/") or not (folder / target).exists():
            out.append(url)
    return out


def fix_links(soup, folder: Path, own: str = "", mend_all: bool = False) -> int:
    """A link to a notebook (NN_name.ipynb) pointed at its report in `folder`, or made text when the folder has none;
    with `mend_all` (a stored page whose files stayed on the machine that ran it) every other broken link made text
    too. Returns how many links changed."""
    n = 0
    for a in soup.find_all("a", href=True):
        target = _local_target(a["href"])
        if target is None or (not a["href"].startswith("file:") and not target.startswith("/")
                              and (folder / target).exists()):
            continue
        m = re.fullmatch(r"(\d\d_[A-Za-z0-9_]+)\.ipynb", Path(target).name)
        if m is None and not mend_all:
            continue
        rep = report_link(m.group(1), folder, own) if m else None
        if rep:
            a["href"] = rep
        else:
            a.unwrap()
        n += 1
    return n


# --------------------------------------------------------------------------- checks


def problems(text: str, folder: Path, published: bool = True) -> list[str]:
    """What a rendered report shows that it should not, as short phrases (empty: none)."""
    soup = soup_of(text)
    out = []
    if soup.find(class_=FINDINGS_CLASS) is None:
        out.append("no findings box")
    cut = len(CUT_CELL.findall(text))
    if cut:
        out.append(f"{cut} cut cells ('...')")
    paths = sorted({m for node in _text_nodes(soup) for m in MACHINE_PATH.findall(node)})
    paths += sorted({m for a in soup.find_all(href=True) for m in [a["href"]] if a["href"].startswith("file:")})
    if paths:
        out.append(f"machine paths: {paths[:3]}")
    broken = broken_links(soup, folder)
    if broken:
        out.append(f"broken links: {broken[:3]}")
    net = [s.get("src") or "inline" for s in soup.find_all("script")
           if _is_network(s.get("src", "")) or "https://" in (s.string or "")]
    if net:
        out.append(f"network scripts: {net[:3]}")
    if published and soup.find(attrs={"data-mime-type": STDERR_MIME}) is not None:
        out.append("stderr boxes")
    return out
