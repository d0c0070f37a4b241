"""The index page of a folder of published reports (data/reports/<device>/index.html): a summary per workload at the
top (eager -> 04 -> 05 -> 06 -> 03, one metric, speedup over eager, quality, a cumulative bar chart; wmbook.summary),
then a short card per notebook, workload and preset (the findings of its stored rows, a few headline numbers, links
to its reports), every number from data/results/results.csv.

    python -m wmbook.published --index data/reports/h200
"""

from __future__ import annotations

import html
import json
import os
import re
import statistics
from pathlib import Path

from . import headlines, results, runtimes, summary, workloads
from .atomic import atomic_write_text
from .html_parts import finding_html, markdown, page, table
from .paths import REPO_ROOT
from .render import WIDGET_VIEW, notebook_question
from .rows import fmt, run_dtype

RUN_CAPTION = re.compile(r"rows of run ([0-9a-f]{12})")  # wmbook.display.rows' caption names the run


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


def report_files(folder: Path, runs: dict) -> dict[tuple, list[tuple[str, Path]]]:
    """{(notebook, workload, preset): [(label, report file)]} of the reports in a folder (label '' for the main one)."""
    groups: dict[tuple, list[tuple[str, Path]]] = {}
    for f in sorted(folder.glob("*.html")):
        if f.name == "index.html":
            continue
        nb, wl, preset, label = _split_report_name(f.stem, runs)
        groups.setdefault((nb, wl, preset), []).append((label, f))
    return groups


def main_report(files: list[tuple[str, Path]], dtype: str | None = None) -> Path:
    """The report that stands for a group: the one of the run's dtype, else the unlabelled one, a whole one first."""
    return min(files, key=lambda t: (t[0] != (dtype or ""), t[0] != "", "partial" in t[0], len(t[1].name)))[1]


def report_run(path: Path, df, fallback=None):
    """The rows of the run a rendered report shows: the run its results caption names (wmbook.display.rows), else
    `fallback` (the published run of its notebook, workload and preset)."""
    m = RUN_CAPTION.search(Path(path).read_text(errors="replace"))
    if m is not None:
        rows = df[df["run_id"] == m.group(1)]
        if len(rows):
            return rows
    return fallback


def _summary_html(df, groups: dict, device: str | None) -> str:
    e = html.escape
    parts = []
    for wl in workloads.all_workloads():
        rows = summary.stages(df, wl)
        if not rows:
            continue

        def link(key):
            files = groups.get(key)
            if not files:
                return ""
            f = main_report(files, wl.eager_dtype if key[0] == "01_baseline_profiling" else None)
            return f'<a href="{e(f.name)}">{e(key[0][:2])} report</a>'

        b = summary.best(rows)
        lead = (f"<p><b>{e(wl.name)}</b> ({e(wl.title)}, preset <code>{e(wl.real_preset)}</code>): "
                + (f"best single-GPU stack <b>{e(fmt(b.stage.value))} {e(b.stage.metric_label)}</b>"
                   + (f", <b>{summary.speedup_text(b.speedup)}</b> eager" if b.speedup == b.speedup else
                      f" (no {e(wl.eager_dtype)} eager run published to compare with)")
                   + f"; quality: {e(b.stage.quality)}." if b is not None else "no optimized stage yet.") + "</p>")
        chart = summary.chart_svg(rows, f"{wl.name}: speedup over eager, stage by stage")
        tab = table(summary.table_rows(rows, link), numeric=("value", "speedup over eager"), raw=("report",))
        parts.append(f'<div class="summary" id="summary-{e(wl.name)}"><h2>{e(wl.name)} · {e(wl.title)}</h2>{lead}'
                     f'<div class="body"><div class="chart">{chart}</div>{tab}</div></div>')
    return "".join(parts)


def _gpu_time_html(folder: Path) -> str:
    """What the folder's set cost (gpu_time.json, written by wmbook.regenerate): minutes per notebook and in all."""
    f, e = folder / "gpu_time.json", html.escape
    if not f.is_file():
        return ""
    try:
        t = json.loads(f.read_text())
        per = sorted(t["notebook_seconds"].items())
        total, goal = t["total_seconds"] / 60, t.get("goal_minutes")
    except (ValueError, KeyError, TypeError, AttributeError):
        return ""
    cells = "".join(f"<td>{e(nb[:2])}</td>" for nb, _ in per) + "<td><b>all</b></td>"
    vals = "".join(f"<td>{s / 60:.1f}</td>" for _, s in per) + f"<td><b>{total:.1f}</b></td>"
    verdict = "" if not goal else f" (goal {goal:g}: {'met' if total <= goal else 'missed'})"
    return (f"<h2>GPU time of this set</h2><p>Minutes per notebook on {e(str(t.get('device', '?')))}, every workload "
            f"of it, commit {e(str(t.get('commit', '?')))}{verdict}; {t.get('queues', 1)} queue(s), "
            f"{t.get('wall_seconds', 0) / 60:.1f} minutes of wall clock.</p>"
            f"<table><tr><th>notebook</th>{cells}</tr><tr><th>minutes</th>{vals}</tr></table>" + _run_minutes_html(t))


def _run_minutes_html(t: dict) -> str:
    """The set's GPU-minutes per notebook and workload (a run on several GPUs counts each), '' without per-run
    times: where the set's time goes, for the runs a shorter set would have to cut."""
    e = html.escape
    try:
        gpus = {name: int(t.get("gpus", {}).get(name, 1)) for name in t["seconds"]}
        cell = {tuple(name.split("-", 1)) if "-" in name else (name, ""): (float(s) * gpus[name] / 60, gpus[name])
                for name, s in t["seconds"].items()}
    except (KeyError, TypeError, ValueError, AttributeError):
        return ""
    workloads = sorted({w for _, w in cell}, key=lambda w: (w.startswith("world-"), w))
    if len(workloads) < 2:
        return ""
    body = ""
    for nb in sorted({nb for nb, _ in cell}):
        tds = "".join("<td></td>" if (nb, w) not in cell else
                      f"<td class=num>{cell[nb, w][0]:.1f}{f' ({cell[nb, w][1]} GPUs)' if cell[nb, w][1] > 1 else ''}"
                      "</td>" for w in workloads)
        body += f"<tr><td>{e(nb)}</td>{tds}</tr>"
    head = "".join(f"<th>{e(w)}</th>" for w in workloads)
    return (f"<p>GPU-minutes per notebook and workload (a run on several GPUs counts each of them):</p>"
            f"<table><tr><th>notebook</th>{head}</tr>{body}</table>" + _host_others_html(t) + _core_loop_html(t))


# other work on a run's host, in average CPUs, above which the index names the run: launch-bound timings and compiles
# slow down without the GPU showing it (wmbook.hostload)
OTHER_WORK_CORES = 1.0


def _host_others_html(t: dict) -> str:
    """The set's runs made while other work kept OTHER_WORK_CORES or more of the host's CPUs busy, or that every
    recorded run had its host's CPUs to itself; '' where no run recorded it."""
    try:
        others = {name: float(v) for name, v in (t.get("host_other_cores") or {}).items()}
    except (TypeError, ValueError, AttributeError):
        return ""
    if not others:
        return ""
    busy = {n: v for n, v in sorted(others.items()) if v >= OTHER_WORK_CORES}
    if not busy:
        return (f"<p>Other work on the host kept fewer than {OTHER_WORK_CORES:g} CPU busy on average during each of "
                f"the {len(others)} runs that recorded it (wmbook.hostload).</p>")
    return ("<p>Runs made while other work kept the host's CPUs busy (average CPUs; another queue's run on the same "
            "host counts too): "
            + ", ".join(f"{html.escape(n)} {v:.1f}" for n, v in busy.items())
            + ". Their launch-bound timings and compile times may be slowed; the GPU times are not.</p>")


def _core_loop_html(t: dict) -> str:
    """The range of the runs' hosts' core speed (wmbook.hostload.core_loop_us, median per run) and the slowest run's
    name; '' where fewer than two runs recorded it."""
    try:
        loops = {name: float(v) for name, v in (t.get("host_core_loop_us") or {}).items()}
    except (TypeError, ValueError, AttributeError):
        return ""
    if len(loops) < 2:
        return ""
    slow = max(loops, key=loops.get)
    return (f"<p>A core of the hosts ran the fixed test loop in {min(loops.values()):.0f}-{loops[slow]:.0f} us "
            f"(median per run, {len(loops)} runs; the slowest: {html.escape(slow)}): launch-bound timings follow the "
            "core's speed, GPU times do not (wmbook.hostload).</p>")


# the whole published set's GPU time the workbook aims at (wmbook.regenerate's goal)
SET_GOAL_MINUTES = 60


def _recorded_times_html(times: list[dict], groups: dict) -> str:
    """Without a regenerated set's gpu_time.json: how long the run each report shows took (its run id from the report,
    its time from the times file, wmbook.runtimes), and which reports have no recorded time; empty when none has."""
    e = html.escape
    by_run = {r.get("run_id"): r for r in times if r.get("run_id")}
    shown, missing = [], []
    for key in sorted(groups, key=lambda k: (k[0], k[1] or "", k[2] or "")):
        for _, f in groups[key]:
            m = RUN_CAPTION.search(f.read_text(errors="replace"))
            (shown if m and m.group(1) in by_run else missing).append((f.name, by_run.get(m.group(1)) if m else None))
    if not shown:
        return ""
    rows = "".join(f"<tr><td><a href=\"{e(name)}\">{e(name)}</a></td><td>{r['seconds'] / 60:.1f}</td>"
                   f"<td>{e(str(r.get('git_commit', ''))[:7])}</td><td>{e(str(r.get('timestamp', ''))[:10])}</td></tr>"
                   for name, r in shown)
    total = sum(r["seconds"] for _, r in shown) / 60
    return ("<h2>Run time per report on this device</h2><p>How long the run each report shows took (papermill's "
            f"record of the executed notebook; <code>data/results/notebook_times.csv</code>): {len(shown)} of "
            f"{len(shown) + len(missing)} reports, <b>{total:.1f} minutes</b> together"
            + (f"; no time recorded for {e(', '.join(name for name, _ in missing))}" if missing else "")
            + f". These runs come from several commits; the whole set from one command and one commit aims at "
              f"{SET_GOAL_MINUTES} GPU-minutes.</p>"
            "<table><tr><th>report</th><th>minutes</th><th>commit</th><th>date</th></tr>"
            f"{rows}</table>")


def _notebook_times_html(times: list[dict], device: str | None) -> str:
    """Without a regenerated set's gpu_time.json: how long each notebook, workload and preset takes on this folder's
    device (the median of its latest full runs at the notebook's defaults, wmbook.runtimes, published or not), their
    sum, and the runs of a full set (wmbook.studies.set_keys) with no recorded time there; empty without a device or
    a time."""
    if not device:
        return ""
    e, dev = html.escape, device.lower()
    runs: dict[tuple, list[dict]] = {}
    for r in times:
        if r.get("profile", "full") == "full" and dev in str(r.get("device_name", "")).lower() and runtimes.matches(r):
            runs.setdefault((r.get("notebook", ""), r.get("workload", ""), r.get("preset", "")), []).append(r)
    if not runs:
        return ""
    rows, total = [], 0.0
    for key in sorted(runs):
        last = runtimes.latest(runs[key])
        median = statistics.median(r["seconds"] for r in last)  # as runtimes.expected, a notebook's own estimate
        total += median
        rows.append(f"<tr><td>{e(key[0])}</td><td>{e(key[1])}</td><td>{e(key[2])}</td><td>{median / 60:.1f}</td>"
                    f"<td>{len(last)}</td><td>{e(str(last[-1].get('git_commit', ''))[:7])}</td>"
                    f"<td>{e(str(last[-1].get('timestamp', ''))[:10])}</td></tr>")
    from .studies import set_keys  # noqa: PLC0415  heavy: every study

    untimed = [f"{nb[:2]} {wl} / {preset}" for nb, wl, preset in set_keys() if (nb, wl, preset) not in runs]
    return ("<h2>How long each notebook takes on this device</h2><p>The median of the latest full runs of each "
            f"notebook, workload and preset at its default parameters, at the newest commit that ran it (at most "
            f"{runtimes.LAST_RUNS}; "
            "<code>data/results/notebook_times.csv</code>, the runs of unpublished sets included): "
            f"<b>{total / 60:.1f} minutes</b> for these {len(rows)} runs, one each, by wall clock (a notebook that "
            "holds every GPU of its host, 08, costs that many GPU-minutes per minute)"
            + (f"; not timed here yet: {e(', '.join(untimed))}" if untimed else "")
            + ".</p><table><tr><th>notebook</th><th>workload</th><th>preset</th><th>minutes</th><th>runs</th>"
              f"<th>latest commit</th><th>date</th></tr>{''.join(rows)}</table>")


def write_folder_index(folder: str | os.PathLike, results_path: str | os.PathLike | None = None,
                       notebooks: str | os.PathLike | None = None, title: str | None = None,
                       note: str | None = None, device: str | None = None) -> Path:
    """index.html for a folder of rendered reports (e.g. data/reports/h200): the summary per workload, then per
    notebook (its question once) a card per workload/preset: the findings of the stored rows (wmbook.headlines), a few
    headline numbers and links to every report; other files listed. `device`: only rows whose device name contains it
    (the folder's reports come from one kind of card, the stored rows from several). Written atomically; nothing else
    in the folder is touched."""
    import nbformat  # noqa: PLC0415  heavy: nbformat, for write_folder_index only

    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(f"folder={str(folder)!r} is not allowed: not a folder; allowed values: a folder of rendered "
                         f"reports (*.html)")
    df = results.of_device(results.read(results_path or results.default_path()), device)
    df = df[df["device_kind"] == "cuda"] if "device_kind" in df else df
    commit = results.set_commit(folder)  # a folder that holds a set: its summary and cards by the set's rows (of_set)
    of_the_set = results.of_set(df, folder, device)
    runs = headlines.published_runs(of_the_set)
    nb_dir = Path(notebooks) if notebooks is not None else REPO_ROOT / "notebooks"
    questions = {}
    for p in sorted(nb_dir.glob("[0-9][0-9]_*.ipynb")):
        try:
            questions[p.stem] = notebook_question(nbformat.read(p, as_version=4))
        except Exception:  # noqa: BLE001
            questions[p.stem] = None
    groups = report_files(folder, runs)
    e = html.escape
    cards, current = [], None
    for key in sorted(groups, key=lambda k: (k[0], k[1] or "", k[2] or "")):
        nb, wl, preset = key
        files = groups[key]
        if nb != current:
            current = nb
            q = questions.get(nb)
            cards.append(f'<h2 id="{e(nb)}">{e(nb.replace("_", " ", 1).replace("_", " "))}</h2>'
                         + (f'<p class="question">{markdown(q)}</p>' if q else ""))
        run = runs.get(key)
        main = main_report(files, run_dtype(run))
        own = {f: report_run(f, df) for _, f in files}  # the run each report's caption names
        shown = own[main] if own[main] is not None else run
        found = headlines.findings(shown) if shown is not None else None
        head = dict(list((headlines.headline(shown) if shown is not None else {}).items())[:5])
        if shown is not None:
            head |= {"device": str(shown["device_name"].iloc[0]).replace("NVIDIA ", ""),
                     "commit": ", ".join(sorted({str(c)[:7] for c in shown["git_commit"] if str(c)})) or "?"}
        bullets = list(found.bullets()) if found else []
        for label, f in files:  # a labelled report of a run of its own (another GPU count, dtype, stack): its headline
            other = own[f] if f != main else None
            if (label and other is not None and shown is not None
                    and set(other["run_id"]) != set(shown["run_id"])):
                first = headlines.findings(other).bullets()[:1]
                bullets += [f"**{label}** ({f.name}): {b}" for b in first]
        links = []
        for label, f in files:
            flaws = render_flaws(f)  # a report that cannot show what today's rendering does: said at its link
            if commit and own[f] is not None and not (own[f]["git_commit"].astype(str) == commit).all():
                flaws.append(f"commit {str(own[f]['git_commit'].iloc[0])[:7]}, not part of the set")
            links.append((f"{label or 'report'}: {f.name}" + (f" ({', '.join(flaws)})" if flaws else ""), f.name))
        cards.append(finding_html(f"{wl or '?'} / {preset or '?'}", None, head,
                                  None if found else "No stored rows of this report's run on this device.", links,
                                  bullets=bullets, anchor=f"{nb}-{preset}"))
    times = runtimes.read(runtimes.times_path(results_path or results.default_path()))
    others = sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix not in (".html",)
                    and not p.name.startswith(".") and p.name != "README.md")
    other_html = "".join(f'<li><a href="{e(p.relative_to(folder).as_posix())}">{e(p.relative_to(folder).as_posix())}'
                         f"</a></li>" for p in others)
    body = (f"<h1>{e(title or f'wmbook reports: {folder.name}')}</h1>"
            + (f"<p>{e(note)}</p>" if note else "")
            + "<p>Every number comes from the stored results rows (<code>data/results/results.csv</code>; medians "
              "with p20-p80 in brackets). The summary compares each stage with eager in the same metric; the cards "
              "give each report's findings."
            + (' Every table of the stored rows: <a href="README.md">README.md</a>.' if (folder / "README.md").exists()
               else "") + "</p>"
            + _summary_html(of_the_set, groups, device)
            + (_gpu_time_html(folder) or _recorded_times_html(times, groups) + _notebook_times_html(times, device))
            + "\n".join(cards)
            + (f"<h2>Other files</h2><ul>{other_html}</ul>" if other_html else ""))
    out = folder / "index.html"
    atomic_write_text(out, page(title or f"wmbook reports: {folder.name}", body))
    return out
