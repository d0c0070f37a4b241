"""Published reports that exist only as HTML (no executed notebook was kept, so they cannot be re-rendered without a
GPU) made whole by one deterministic pass over the stored page: the findings box from the stored rows of the run the
report shows, no network scripts, machine paths made relative, broken links mended or made text, no stderr or empty
widget boxes, the results rows and appendix collapsed (the same steps as a new render: wmbook.render.finish_page).
A report that cannot be made whole (cells cut to '...' by an older rendering: the numbers are not in the page) is
removed; its rows stay in the results table.

    python -m wmbook.published --tidy data/reports/h100
"""

from __future__ import annotations

from pathlib import Path

from . import headlines, html_clean, results
from .atomic import atomic_write_text
from .render import finish_page
from .report_index import report_files, report_run

WIDGET_VIEW_TYPE = "application/vnd.jupyter.widget-view+json"


def tidy_page(text: str, folder: Path, own: str, rows) -> str:
    """One stored report page made whole; `rows`: the results rows of the run it shows (None: no findings)."""
    soup = html_clean.soup_of(text)
    for s in soup.find_all("script", type=WIDGET_VIEW_TYPE):  # a widget whose state was not saved: an empty box
        box = s.find_parent(class_="jp-OutputArea-child")
        html_clean.drop(box or s)
    found = headlines.findings(rows) if rows is not None and len(rows) else None
    return finish_page(str(soup), folder, own, found.bullets() if found else None, found.next_links if found else (),
                       published=True, mend_all=True)


def tidy_folder(folder, results_path=None) -> list[str]:
    """Every report of a published folder tidied (tidy_page) or, when it cannot be made whole, removed; one line per
    report saying what was done."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(f"folder={str(folder)!r} is not allowed: not a folder; allowed values: a folder of rendered "
                         f"reports (*.html)")
    df = results.read(results_path or results.default_path())
    device = folder.name if len(results.of_device(df, folder.name)) else None
    df = results.of_device(df, device)
    runs = headlines.published_runs(df)
    out = []
    for key, files in report_files(folder, runs).items():
        for _, f in files:
            text = f.read_text(errors="replace")
            if html_clean.CUT_CELL.search(text):
                f.unlink()
                out.append(f"removed {f.name}: {len(html_clean.CUT_CELL.findall(text))} cut cells ('...') cannot be "
                           f"restored from the page")
                continue
            new = tidy_page(text, folder, f.stem, report_run(f, df, runs.get(key)))
            left = html_clean.problems(new, folder)
            if new != text:
                atomic_write_text(f, new)
            out.append(f"{'tidied' if new != text else 'unchanged'} {f.name}" + (f" (still: {left})" if left else ""))
    return out
