"""The published GPU numbers, rendered from the results store (never typed by hand): the README's results at a glance,
each published folder's own page of tables (data/reports/<device>/README.md) and index, and its reports.

    python -m wmbook.published            # print the reference device's tables (markdown)
    python -m wmbook.published --write    # the README's glance table and every folder page's tables, in place
    python -m wmbook.published --index data/reports/h200   # that folder's index.html (summary, findings, links)
    python -m wmbook.published --publish EXECUTED.ipynb 02_bottleneck_breakdown-wma-bf16   # into data/reports/h200
    python -m wmbook.published --tidy data/reports/h100   # make that folder's stored HTML reports whole (wmbook.tidy)
    python -m wmbook.published --cut RUN_ID "device time ran out after row 4"   # a run whose notebook did not finish
    python -m wmbook.published --partial RUN_ID "decoder table only"   # a finished run that measured part of it

For each notebook, workload, preset and dtype the latest run in data/results/results.csv is shown, leaving out runs
marked cut (wmbook.results.mark_cut: a run stopped before its notebook finished, whose report is not published) and
runs marked partial (wmbook.results.mark_partial: a finished run that measured part of its notebook by choice; the
tables only some runs have, notebook 06's decoder table, take the latest run that has them, partial or not).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from . import headlines, results, summary
from .atomic import atomic_open
from .errors import InputError
from .paths import REPO_ROOT
from .render import notebook_runs, render_html
from .report_index import main_report, report_files, write_folder_index
from .rows import md_table
from .studies import REPORTS, report_for
from .tidy import tidy_folder

H100 = REPO_ROOT / "data" / "reports" / "h100"
H200 = REPO_ROOT / "data" / "reports" / "h200"
# each published folder's own page holds its device's generated tables (README.md: GitHub shows it with the folder)
FOLDER_PAGES = {H200: "H200", H100: "H100"}
README_DEVICE = "H200"  # the reference device: the README's results at a glance
BEGIN, END = "<!-- published:begin (python -m wmbook.published --write) -->", "<!-- published:end -->"
GLANCE_BEGIN, GLANCE_END = "<!-- glance:begin (python -m wmbook.published --write) -->", "<!-- glance:end -->"
INDEX_NOTES = {
    H200: "The reference device's published runs.",
    H100: "The H100's published runs, kept as the older device's record (the reference device is now the H200: "
          "data/reports/h200). Numbers compare only with numbers of the same device.",
}


def folder_device(folder) -> str | None:
    """The device a published folder holds the runs of (FOLDER_PAGES: data/reports/h200 -> 'H200'); None for any
    other folder (a scratch folder holds whatever was run)."""
    if folder is None:
        return None
    here = Path(folder).resolve()
    return next((dev for f, dev in FOLDER_PAGES.items() if f.resolve() == here), None)


def device_matches(name, want: str) -> bool:
    """Whether the device name `name` (as a run records it, e.g. 'NVIDIA H100 80GB HBM3') names the card `want`
    ('H200'): `want` as a whole word, case aside, so that 'H200' does not match 'GH200'."""
    return re.search(rf"(?<![A-Za-z0-9]){re.escape(want.strip())}(?![A-Za-z0-9])", str(name), re.IGNORECASE) is not None


def check_folder_device(folder, devices, what: str) -> None:
    """InputError, before anything is written, where `folder` is a device's published folder and one of `devices`
    (device names as runs record them) is not that device, or none is known: a published folder holds one device's
    runs, and a host may give another card than the one asked for."""
    want = folder_device(folder)
    if want is None:
        return
    wrong = sorted({str(d) for d in devices if not device_matches(d, want)})
    if wrong or not devices:
        ran = f"ran on {', '.join(wrong)}" if wrong else "has no results rows here, so its device is unknown"
        raise InputError(f"{what} {ran}; folder={str(folder)!r} holds the {want}'s runs only (allowed: runs whose "
                         f"device name has the word {want!r}): publish it into a folder of its own device, or run "
                         "it again on that device")


def check_host(folder) -> str | None:
    """InputError where `folder` is a device's published folder and this host's GPU is not that device (or there is
    none): what `make publish` checks before it runs anything, so that another card's rows never reach the store.
    Returns the folder's device (None: any host)."""
    want = folder_device(folder)
    if want is None:
        return None
    import torch  # noqa: PLC0415  heavy: torch

    here = torch.cuda.get_device_name(0) if torch.cuda.is_available() and torch.cuda.device_count() else "no GPU"
    if not device_matches(here, want):
        raise InputError(f"folder={str(folder)!r} holds the {want}'s runs only and this host has {here}; allowed: a "
                         f"host whose GPU's name has the word {want!r} (or publish into a folder of this device)")
    return want


def run_devices(executed, store=None) -> set[str]:
    """The device names of the rows of the runs an executed notebook names (empty where none are found)."""
    import nbformat  # noqa: PLC0415  heavy: nbformat

    from .render import run_rows  # noqa: PLC0415

    names: set[str] = set()
    for rec in notebook_runs(nbformat.read(Path(executed), as_version=4)):
        rows = run_rows(rec, store)
        if rows is not None and "device_name" in rows:
            names |= set(rows["device_name"].astype(str))
    return names


def commits_note(rows) -> str:
    """'Its rows come from N commits, <first> (<day>) to <last> (<day>).' for a device's stored rows."""
    rows = rows[rows["git_commit"].astype(str).str.len() > 0].sort_values("timestamp")
    if rows.empty:
        return ""
    first, last = rows.iloc[0], rows.iloc[-1]
    n = rows["git_commit"].astype(str).str.removesuffix("+dirty").nunique()
    return (f"Its rows come from {n} commits, {first['git_commit']} ({str(first['timestamp'])[:10]}) to "
            f"{last['git_commit']} ({str(last['timestamp'])[:10]}).")


def markdown(path=None, device: str | None = None, folder=None) -> str:
    """Every notebook's published tables as markdown (each study's report module writes its own); with `device`,
    only rows of devices whose name contains it, so that no table takes one configuration's latest row from another
    machine's run; where `folder` holds a published set, only its commit's rows (results.of_set)."""
    df = results.without_cut(results.read(path or results.default_path()))
    df = results.of_set(results.of_device(df, device), folder, device)
    return "".join(part for nb in REPORTS for part in report_for(nb).published(df))


def glance(path=None, devices=(README_DEVICE, "H100")) -> str:
    """The README's results at a glance (markdown): per workload and device (the reference device first) eager, the
    best single-GPU stack, speedup, quality and its report (wmbook.summary)."""
    df = results.without_cut(results.read(path or results.default_path()))
    folders = {dev: folder for folder, dev in FOLDER_PAGES.items()}
    for dev, folder in folders.items():  # a folder that holds a set shows its commit's rows (of_set)
        df = results.of_set(df, folder, dev)

    def link_for(dev, key):
        folder = folders.get(dev)
        if folder is None or not folder.is_dir():
            return ""
        files = report_files(folder, headlines.published_runs(results.of_device(df, dev))).get(key)
        if not files:
            return ""
        f = main_report(files)
        return f"[{f.stem.split('-', 1)[0][:2]} report]({f.relative_to(REPO_ROOT).as_posix()})"

    return md_table(summary.glance_rows(df, list(devices), link_for))


def replace_block(page: Path, text: str, begin: str = BEGIN, end: str = END) -> bool:
    """Replace what stands between `begin` and `end` in `page`; True when it changed."""
    page = Path(page)
    old = page.read_text()
    if begin not in old or end not in old:
        raise ValueError(f"{page} has no generated block ({begin} ... {end})")
    head, rest = old.split(begin, 1)
    _, tail = rest.split(end, 1)
    new = f"{head}{begin}\n{text}{end}{tail}"
    if new != old:
        with atomic_open(page, "w") as f:
            f.write(new)
    return new != old


def folder_page_text(folder: Path, device: str) -> str:
    return (f"# Published {device} runs\n\nStart at [index.html](index.html): the summary per workload and each "
            f"report's findings. Below, every table of the {device}'s stored rows, generated from "
            f"`data/results/results.csv` (`python -m wmbook.published --write`; a test keeps it in step). Medians "
            f"with p20-p80 in brackets, warm-up excluded. Run notes: [NOTES.md](../NOTES.md).\n\n{BEGIN}\n{END}\n")


def check_store(path=None, device: str | None = None):
    """The store to publish from, checked before anything is written: results.check (torn or malformed rows, rows of
    the last commit lost) and, with `device`, that the filter matches some row. InputError naming what failed."""
    src = results.require_sound(path)
    df = results.read(src)
    if device and not len(results.of_device(df, device)):
        names = sorted(set(df["device_name"].astype(str)) - {""})
        raise InputError(f"--device={device!r} is not allowed: it matches no row of {str(src)!r}; allowed values: a "
                         f"part of a stored device name, e.g. one of {names}")
    return df


def _published_lines(block: str) -> list[str]:
    """The headings and table rows of a generated block (what a reader sees published)."""
    return [ln for ln in block.splitlines() if ln.startswith(("**", "| ")) and not ln.startswith("|---")]


def _title(heading: str) -> str:
    """A generated table's title: its bold heading without the parenthesis that says which run it shows."""
    return heading.split("** (")[0].split(" (")[0]


def planned_pages(readme=None, path=None) -> list[tuple[Path, str, str, str]]:
    """(page, begin marker, end marker, new block) of every generated page: the README's results at a glance, then
    each published folder's page of tables."""
    plan = [(Path(readme or REPO_ROOT / "README.md"), GLANCE_BEGIN, GLANCE_END, glance(path))]
    for folder, device in FOLDER_PAGES.items():
        if folder.is_dir():
            plan.append((folder / "README.md", BEGIN, END, markdown(path, device, folder)))
    return plan


def dropped_lines(plan) -> dict[Path, list[str]]:
    """Per page, the headings and table rows of its current block that the new block no longer has."""
    out = {}
    for page, begin, end, new in plan:
        old = readme_block(page, begin, end) if page.exists() else ""
        keep = set(_published_lines(new))
        gone = [ln for ln in _published_lines(old) if ln not in keep]
        if gone:
            out[page] = gone
    return out


def update_readme(readme=None, path=None, allow_removal: bool = True) -> bool:
    """The README's results-at-a-glance block and every published folder's page of tables; True when one changed.
    allow_removal=False refuses (InputError, every page unchanged) a new block with fewer tables or table rows than
    the current one: published numbers would go."""
    plan = planned_pages(readme, path)
    if not allow_removal:
        shrunk = []
        for page, begin, end, new in plan:
            if not page.exists():
                continue
            old = _published_lines(readme_block(page, begin, end))
            now = _published_lines(new)
            # a table is known by its title; what follows it (device, commit, base) changes when a newer run replaces
            # the one shown, which removes nothing
            titles = {_title(ln) for ln in now if ln.startswith("**")}
            heads = [ln for ln in old if ln.startswith("**") and _title(ln) not in titles]
            rows = sum(ln.startswith("| ") for ln in old) - sum(ln.startswith("| ") for ln in now)
            if heads or rows > 0:
                shrunk.append(f"{page.relative_to(REPO_ROOT) if page.is_relative_to(REPO_ROOT) else page}: "
                              f"{len(heads)} table(s) and {max(rows, 0)} table row(s) fewer")
        if shrunk:
            raise InputError("the update removes numbers that are published now: " + "; ".join(shrunk)
                             + "; nothing was written; allowed: a store holding those runs, or --allow-removal")
    changed = False
    for page, begin, end, new in plan:
        if page.parent != Path(readme or REPO_ROOT / "README.md").parent and not page.exists():
            page.write_text(folder_page_text(page.parent, FOLDER_PAGES[page.parent]))
        changed |= replace_block(page, new, begin, end)
    return changed


def readme_block(readme=None, begin: str = GLANCE_BEGIN, end: str = GLANCE_END) -> str:
    text = Path(readme or REPO_ROOT / "README.md").read_text()
    return text.split(begin, 1)[1].split(end, 1)[0].strip("\n")


def publish(executed, name: str, folder=H200, store=None) -> Path:
    """Render the executed notebook `executed` as `folder`/`name`.html (wmbook.render.render_html: findings first, no
    stderr, images embedded,
    the files it links copied under `folder`/artifacts/<notebook>/, missing ones kept as text, cross-links to the
    folder's reports of the same workload). Checked before anything is written: the notebook exists and `name`
    is '<its notebook>-<tag>' (the folder index groups reports by that name)."""
    executed, folder = Path(executed), Path(folder)
    if not executed.is_file() or executed.suffix != ".ipynb":
        raise ValueError(f"executed={str(executed)!r} is not allowed: not a notebook file; allowed values: an executed "
                         f"notebook (.ipynb)")
    stem = executed.stem.removesuffix(".FAILED").split("-", 1)[0]  # the notebook ('04_compile_autocast-mg2': a run's)
    if not re.fullmatch(re.escape(stem) + r"-[A-Za-z0-9][A-Za-z0-9_.-]*", name or ""):
        raise ValueError(f"name={name!r} is not allowed; allowed values: '{stem}-<tag>' (letters, digits, '-', '_', "
                         "'.')")
    if not folder.is_dir():
        raise ValueError(f"folder={str(folder)!r} is not allowed: not a folder; allowed values: an existing folder")
    if folder_device(folder):
        check_folder_device(folder, run_devices(executed, store), f"{executed.name}'s run")
    out = render_html(executed, folder / f"{name}.html", published=True, store=store)
    record_time(executed, store)
    return out


def record_time(executed, store=None) -> bool:
    """The time papermill recorded for an executed notebook, into the times file (wmbook.runtimes) beside `store`
    (default: the results store) under its run's notebook, workload, preset, device and commit, from its rows, with
    the parameters papermill was given; True when recorded. A notebook without that record or without rows records
    nothing."""
    import nbformat  # noqa: PLC0415  heavy: nbformat

    from . import runtimes  # noqa: PLC0415
    from .render import run_rows  # noqa: PLC0415

    nb = nbformat.read(Path(executed), as_version=4)
    seconds = runtimes.papermill_seconds(nb)
    if seconds is None:
        return False
    for rec in notebook_runs(nb):
        df = run_rows(rec, store)
        if df is not None and len(df):
            r = df.iloc[0]
            ids = {k: str(r[k]) for k in ("notebook", "workload", "preset", "device_name", "git_commit", "run_id")}
            given = (nb.get("metadata", {}).get("papermill") or {}).get("parameters") or {}
            runtimes.record(store or results.default_path(), seconds=seconds, profile="full",
                            timestamp=str(r["timestamp"]), params=runtimes.params_key(dict(given)), **ids)
            return True
    return False


def publish_report(report, folder=H200, store=None) -> list[Path]:
    """Publish every executed notebook of a `wmbook run` report folder that finished (REPORT/executed/*.ipynb) into
    `folder` as '<notebook>-<preset>.html' ('-<dtype>' added where the folder keeps that notebook per dtype), the preset
    and dtype read from its results rows (a run without rows is skipped)."""
    import nbformat  # noqa: PLC0415  heavy: nbformat, for publish_report only

    from .render import run_rows  # noqa: PLC0415

    done = [p for p in sorted(Path(report).glob("executed/*.ipynb")) if not p.stem.endswith(".FAILED")]
    for nb_path in done if folder_device(folder) else []:  # every run's device checked before any report is written
        devices = run_devices(nb_path, store)
        if devices:  # a notebook without rows is not published (below)
            check_folder_device(folder, devices, f"{nb_path.name}'s run")
    out = []
    for nb_path in done:
        presets, dtypes = set(), set()
        for rec in notebook_runs(nbformat.read(nb_path, as_version=4)):
            rows = run_rows(rec, store)  # where the run wrote them, else the store (a set made on another host)
            if rows is None:
                continue
            presets |= set(rows["preset"])
            dtypes |= {results.params_of(r).get("dtype") for _, r in rows.head(1).iterrows()}
        if len(presets) != 1:
            continue
        name = f"{nb_path.stem.split('-', 1)[0]}-{presets.pop()}"
        dtype = next(iter(dtypes)) if len(dtypes) == 1 else None
        if dtype and (Path(folder) / f"{name}-{dtype}.html").exists():  # the folder keeps this notebook per dtype
            name += f"-{dtype}"
        out.append(publish(nb_path, name, folder, store))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m wmbook.published", description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true",
                    help="update the README's results at a glance and each published folder's README.md tables, after "
                         "checking the store (wmbook results check); the lines it drops are printed first")
    ap.add_argument("--allow-removal", action="store_true",
                    help="with --write: allow blocks with fewer tables or table rows than the current ones (without it "
                         "such blocks are refused and every page stays as it is)")
    ap.add_argument("--index", metavar="FOLDER", default=None,
                    help="write FOLDER/index.html for a folder of rendered reports (e.g. data/reports/h200): the "
                         "summary per workload, each report's findings and headline numbers from the stored rows, "
                         "links")
    ap.add_argument("--tidy", metavar="FOLDER", default=None,
                    help="make the stored HTML reports of FOLDER whole (wmbook.tidy: findings box from the stored "
                         "rows, no network scripts, machine paths or stderr boxes, links mended)")
    ap.add_argument("--device", default=None,
                    help=f"only rows of devices whose name contains this (default: {README_DEVICE!r}, the README "
                         "block's device; with --index, the folder's name when a stored device name contains it, e.g. "
                         "data/reports/h200 -> 'H200', else every device)")
    ap.add_argument("--publish", nargs=2, metavar=("EXECUTED", "NAME"), default=None,
                    help="render an executed notebook (a GPU run's artifacts/<NB>-<TAG>/<notebook>.ipynb) as "
                         "FOLDER/NAME.html: the artifacts it links copied under FOLDER/artifacts/<notebook>/, links to "
                         "files no longer there (traces left on the GPU host) kept as text, links to other notebooks "
                         "pointed at their reports in FOLDER")
    ap.add_argument("--publish-report", metavar="REPORT", default=None,
                    help="publish every finished notebook of a `wmbook run` report folder into --to, each as "
                         "<notebook>-<preset>.html (make publish)")
    ap.add_argument("--to", metavar="FOLDER", default=str(H200),
                    help="with --publish / --publish-report: the folder (data/reports/h200)")
    ap.add_argument("--cut", nargs=2, metavar=("RUN_ID", "REASON"), default=None,
                    help="mark a stored run as cut before its notebook finished (its rows stay; the published tables "
                         "and indexes show the latest run that was not cut)")
    ap.add_argument("--check-host", type=Path, default=None, metavar="FOLDER",
                    help="refuse (exit 2) where FOLDER is a device's published folder (data/reports/h200: H200) and "
                         "this host's GPU is another: what `make publish` checks before it runs anything")
    ap.add_argument("--partial", nargs=2, metavar=("RUN_ID", "REASON"), default=None,
                    help="mark a stored run that finished as partial: it measured part of its notebook by choice "
                         "(e.g. notebook 06 for its decoder table); the notebook's tables and headlines keep the "
                         "latest full run, a table only some runs have takes the latest run that has it")
    a = ap.parse_args(argv)
    if a.check_host is not None:
        try:
            want = check_host(a.check_host)
        except InputError as e:
            ap.error(str(e))
        print(f"this host's GPU is an {want}: its runs may go into {a.check_host}" if want
              else f"{a.check_host} is no device's folder: any host's runs may go into it")
        return 0
    for flag, mark in (("cut", results.mark_cut), ("partial", results.mark_partial)):
        if getattr(a, flag) is not None:
            try:
                print(mark(*getattr(a, flag), path=results.default_path()))
            except ValueError as e:
                ap.error(str(e))
            return 0
    if a.publish is not None:
        try:
            print(publish(*a.publish, folder=a.to))
        except ValueError as e:
            ap.error(str(e))
        return 0
    if a.publish_report is not None:
        try:
            for p in publish_report(a.publish_report, a.to):
                print(p)
        except InputError as e:
            ap.error(str(e))
        return 0
    if a.tidy is not None:
        try:
            for line in tidy_folder(a.tidy):
                print(line)
        except ValueError as e:
            ap.error(str(e))
        return 0
    if a.index is not None:
        device = a.device
        if device is None:
            name = Path(a.index).name
            device = name if len(results.of_device(results.read(results.default_path()), name)) else None
        else:
            try:
                check_store(device=device)
            except InputError as e:
                ap.error(str(e))
        try:
            note = next((n for f, n in INDEX_NOTES.items() if Path(a.index).resolve() == f.resolve()), None)
            if note is not None and Path(a.index).resolve() == H100.resolve():
                note += " " + commits_note(results.of_device(results.read(results.default_path()), "H100"))
            print(write_folder_index(a.index, note=note, device=device))
        except ValueError as e:
            ap.error(str(e))
        return 0
    try:
        check_store(device=a.device)  # an explicit --device must match some row
        if a.write:
            for page, lines in dropped_lines(planned_pages()).items():  # said before anything is written
                print(f"the published block drops {len(lines)} line(s) of {page.relative_to(REPO_ROOT)}:")
                for ln in lines:
                    print(f"  - {ln}")
            changed = update_readme(allow_removal=a.allow_removal)
            print("README.md updated (and the folder pages)" if changed else "README.md already up to date")
        else:
            sys.stdout.write(markdown(device=a.device or README_DEVICE))
    except InputError as e:
        print(f"python -m wmbook.published: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
