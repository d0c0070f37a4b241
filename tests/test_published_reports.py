"""Every published report and index (data/reports/<device>/*.html) is whole and readable offline: it opens with its
findings box, shows no cut cells ('...'), no machine paths, no broken relative links, no script from the network and
no stderr box. The static checks (wmbook.html_clean.problems) run on every report in `make test`; headless Chromium
opens the indexes and a report of each folder there (every report with --slow), with the network unreachable, and
checks what a reader sees: the findings box drawn near the top, the summary's charts, tables whole.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from wmbook import html_clean
from wmbook.paths import REPO_ROOT

REPORTS = REPO_ROOT / "data" / "reports"
PAGES = sorted(p for p in REPORTS.glob("*/*.html") if p.name != "index.html")
INDEXES = sorted(REPORTS.glob("*/index.html"))
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="Debian's `chromium` is not installed: `make chromium` "
                                                            "(apt-get install -y chromium) to run the browser checks")


def _rel(p: Path) -> str:
    return p.relative_to(REPORTS).as_posix()


def test_every_folder_has_reports_and_an_index():
    assert PAGES and {p.parent for p in INDEXES} == {p.parent for p in PAGES}


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_published_report_is_whole(page):
    assert html_clean.problems(page.read_text(errors="replace"), page.parent) == []


@pytest.mark.parametrize("index", INDEXES, ids=_rel)
def test_published_index_is_whole(index):
    text = index.read_text()
    problems = [p for p in html_clean.problems(text, index.parent) if p != "no findings box"]
    assert problems == []
    assert 'class="summary"' in text and "<svg" in text  # the summary per workload with its cumulative chart
    for page in sorted(index.parent.glob("*.html")):  # every report is linked from its folder's index
        assert page.name == "index.html" or f'href="{page.name}"' in text


def test_problems_name_what_a_report_must_not_show(tmp_path):
    bad = ('<html><head><script src="https://cdnjs.cloudflare.com/x.js"></script></head><body><main>'
           '<table><tr><td>...</td></tr></table><p>/root/n0a/results.csv</p><a href="gone.html">x</a>'
           '<div data-mime-type="application/vnd.jupyter.stderr">warn</div></main></body></html>')
    got = html_clean.problems(bad, tmp_path)
    assert [g.split(":")[0].split(" (")[0] for g in got] == [
        "no findings box", "1 cut cells", "machine paths", "broken links", "network scripts", "stderr boxes"]
    assert html_clean.relative_path("/root/n0a/artifacts/06-wma/trace.json") == "artifacts/06-wma/trace.json"
    assert html_clean.relative_path("/work/main/wmbook/models/attention.py") == "wmbook/models/attention.py"
    assert html_clean.relative_path("/opt/v/lib/python3.12/site-packages/torchao/q.py") == "torchao/q.py"
    assert html_clean.relative_path("/tmp/o/results.csv") == "results.csv"


def test_tidy_is_deterministic_and_idempotent(tmp_path):
    """The pass over a stored report gives the same page when run again (the published pages are its fixed point)."""
    from wmbook.tidy import tidy_page

    page = PAGES[0]
    text = page.read_text()
    assert tidy_page(text, page.parent, page.stem, None) == text


def _dom(url: str) -> str:
    # the network is unreachable (a proxy that does not exist): a page that needs it shows it
    r = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                        "--disable-background-networking", "--disable-component-update", "--disable-sync",
                        "--disable-dev-shm-usage", "--proxy-server=http://127.0.0.1:9", "--window-size=1400,2000",
                        "--virtual-time-budget=3000", "--dump-dom", url], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "<html" in r.stdout.lower(), r.stderr[-2000:]
    return r.stdout


def _browser_check(page: Path) -> None:
    dom = _dom(page.as_uri())
    soup = html_clean.soup_of(dom)
    if page.name == "index.html":
        assert soup.find(class_="summary") is not None and soup.find("svg") is not None
    else:
        box = soup.find(class_="wmbook-findings")
        assert box is not None and len(box.find_all("li")) == 3
        # under the title: nothing but the title cell's heading comes before it
        assert soup.find("h1").find_next(class_="wmbook-findings") is box
    assert html_clean.problems(dom, page.parent, published=page.name != "index.html") in (
        [], ["no findings box"] if page.name == "index.html" else [])


# in `make test`: each folder's index and one report of each folder; --slow: every report
QUICK = INDEXES + [next(p for p in PAGES if p.parent == f.parent) for f in INDEXES]


@needs_chromium
@pytest.mark.parametrize("page", QUICK, ids=_rel)
def test_chromium_shows_findings_and_summary(page):
    _browser_check(page)


@needs_chromium
@pytest.mark.slow
@pytest.mark.parametrize("page", [p for p in PAGES if p not in QUICK], ids=_rel)
def test_chromium_on_every_published_report(page):
    _browser_check(page)


def test_tidy_makes_a_stored_page_whole(tmp_path):
    """A stored nbconvert page as the GPU hosts left it: CDN scripts, a machine path, a stderr box, a link to a notebook
    and one to a trace that stayed on the host, the results rows and appendix open. Tidied with its run's rows it
    opens with the findings, and nothing html_clean.problems names is left."""
    from wmbook import results
    from wmbook.tidy import tidy_page

    def cell(inner):
        return f'<div class="jp-Cell jp-MarkdownCell">{inner}</div>'

    page = ('<html><head><script src="https://cdnjs.cloudflare.com/require.js"></script>'
            '<script type="text/x-mathjax-config">MathJax.Hub.Config({})</script></head><body><main>'
            + cell('<div class="jp-RenderedMarkdown"><h1 id="07">07 · Motion</h1><p>Then '
                   '<a href="04_compile_autocast.ipynb">04</a>, <a href="artifacts/07/trace.json.gz">trace</a>.</p>'
                   '</div>')
            + '<div class="jp-Cell jp-CodeCell"><div class="jp-OutputArea-child"><div class="jp-OutputArea-output" '
              'data-mime-type="application/vnd.jupyter.stderr"><pre>/opt/x/site-packages/torchao/q.py:1: '
              'SyntaxWarning</pre></div></div><p>rows to /root/n0a/results.csv</p></div>'
            + cell('<h2 id="Results-rows">Results rows</h2>')
            + '<div class="jp-Cell jp-CodeCell"><table><tr><td>12 rows of run abcdef012345 in results.csv</td></tr>'
              '</table></div>'
            + cell('<h2 id="Interpretation">Interpretation</h2>') + '</main></body></html>')
    (tmp_path / "04_compile_autocast-wma.html").write_text("<html></html>")
    rows = [results.make_row(notebook="07_motion_data_loading", workload="motion", preset="g1-4096", variant=v,
                             metric="fetch_ms", value=x, unit="ms", params={}, gate=g) | {"run_id": "abcdef012345"}
            for v, x, g in (("eager", 2.4, "reference"), ("packed-gather + triton", 0.03, "pass"))]
    results.append(rows, tmp_path / "r.csv")
    out = tidy_page(page, tmp_path, "07_motion_data_loading-g1-4096", results.read(tmp_path / "r.csv"))
    assert html_clean.problems(out, tmp_path) == []
    soup = html_clean.soup_of(out)
    assert soup.find("h1").find_next(class_="wmbook-findings") is not None
    assert 'href="04_compile_autocast-wma.html"' in out  # the notebook link points at its report here
    assert 'href="artifacts/07/trace.json.gz"' not in out and ", trace." in out  # the lost trace: text
    assert "results.csv" in out and "/root/" not in out
    details = soup.find("details")
    assert details is not None and "12 rows of run" in details.get_text()
    assert tidy_page(out, tmp_path, "07_motion_data_loading-g1-4096", results.read(tmp_path / "r.csv")) == out


def test_published_artifacts_hold_no_machine_paths():
    """The session reports and tables a published report links (its artifacts folder) show no machine's paths."""
    found = {_rel(p): html_clean.MACHINE_PATH.findall(p.read_text(errors="replace"))
             for p in REPORTS.glob("*/artifacts/**/*") if p.is_file() and p.suffix in (".html", ".json", ".md")}
    assert {k: v for k, v in found.items() if v} == {}
