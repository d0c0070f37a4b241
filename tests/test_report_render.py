"""Rendered reports: self-contained HTML (GIFs embedded, artifacts copied and linked relatively, noise dropped), the
report index with each notebook's finding, the index of a folder of published reports, and what headless Chromium
shows of them (figures drawn, tables whole: no '...' columns).

The Chromium tests need Debian's `chromium` package (`make chromium`, or `apt-get install -y chromium`); without it
they are skipped with that reason. Everything else runs without a kernel.
"""

from __future__ import annotations

import base64
import io
import re
import shutil
import subprocess
from pathlib import Path

import nbformat
import numpy as np
import pandas as pd
import pytest

from wmbook import display as wd
from wmbook import html_clean, render, report_index, results
from wmbook.run import NotebookRun

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="Debian's `chromium` is not installed: `make chromium` "
                                                            "(apt-get install -y chromium) to run the screenshot tests")

# a 2x2 two-frame animated GIF
GIF = base64.b64decode("R0lGODlhAgACAPABAAAAAP///yH/C05FVFNDQVBFMi4wAwEAAAAh+QQAAAAAACwAAAAAAgACAAACAoRRACH5BAAA"
                       "AAAALAAAAAACAAIAAAIChFEAOw==")


def _png_figure() -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(4, 2.5))
    ax.bar(["fp32 eager", "bf16", "compile"], [1.0, 2.1, 5.2], color="#4477aa")
    ax.set_ylabel("speedup")
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80)
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _wide_ladder(n_cols: int = 25) -> pd.DataFrame:
    """A ladder-like table wider than pandas' default display.max_columns (20)."""
    rng = np.random.default_rng(0)
    d = {"variant": ["fp32 eager", "+ bf16", "+ compile"], "gate": ["reference", "pass", "pass"],
         "forward_ms": [287.0, 136.0, 55.0], "forward_p20": [285.0, 130.0, 54.4], "forward_p80": [304.0, 140.0, 56.7]}
    for i in range(n_cols - len(d)):
        d[f"extra_{i}_ms"] = rng.random(3) * 10
    return pd.DataFrame(d)


def _executed_notebook(tmp: Path, artifact: Path, run_id: str, results_path: Path) -> Path:
    """An executed notebook as the kernel would leave it: question, a wide key table (wd.table), a figure, a GIF, an
    artifact link, noise on stderr, an unsaved progress widget, a results-rows output and an interpretation."""
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "language": "python", "display_name": "Python 3"}
    cells = [nbformat.v4.new_markdown_cell("# 04 · A test notebook\n\n**Question.** How much faster is the ladder?\n\n"
                                           "Then [the next notebook](05_triton_kernels.ipynb).")]

    def code(*outputs):
        c = nbformat.v4.new_code_cell("pass")
        c.outputs = list(outputs)
        cells.append(c)

    disp = nbformat.v4.new_output
    code(disp("stream", name="stderr", text="USDT:2026-11-25 13:04:30 2076:2076 SyncActivityProfilerHandler.cpp:52] "
                                            "profiler_start\nreal warning kept\n"),
         disp("display_data", data={"application/vnd.jupyter.widget-view+json": {"model_id": "x", "version_major": 2,
                                                                                 "version_minor": 0},
                                    "text/plain": "ladder:   0%|          | 0/3"}))
    code(disp("display_data", data={"text/html": wd.table(_wide_ladder(), caption="The ladder").to_html(),
                                    "text/plain": "table"}))
    code(disp("display_data", data={"image/png": _png_figure(), "text/plain": "<Figure>"}))
    code(disp("display_data", data={"image/gif": base64.b64encode(GIF).decode("ascii"), "text/plain": "<Image>"}))
    link = wd.link(artifact, note="(trace)")
    code(disp("display_data", data={"text/html": link.data, "text/plain": "link"}))
    code(disp("display_data", data={"text/html": "<p>rows</p>", "text/plain": "rows"},
              metadata={"wmbook": {"run_id": run_id, "results_path": str(results_path)}}))
    cells.append(nbformat.v4.new_markdown_cell("## Interpretation"))
    code(disp("execute_result", data={"text/markdown": "The ladder takes one forward from 287 ms to **55 ms**.",
                                      "text/plain": "<Markdown>"}, execution_count=9))
    nb.cells = cells
    path = tmp / "executed" / "04_compile_autocast-mg2.ipynb"
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, path)
    return path


def _rows(path: Path, run_id: str) -> None:
    common = dict(notebook="04_compile_autocast", workload="mg2", preset="tiny", params={}, unit="ms")
    rows = [results.make_row(variant="fp32-eager", metric="forward_ms", value=287.0, gate="reference", **common),
            results.make_row(variant="bf16 + compile-regional", metric="forward_ms", value=55.0, gate="pass", **common),
            results.make_row(variant="tf32 + bf16", metric="forward_ms", value=20.0, gate="FAIL", **common)]
    results.append([r | {"run_id": run_id} for r in rows], path)


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """A report folder with one rendered notebook and its index, as wmbook.run writes it."""
    tmp = tmp_path_factory.mktemp("report")
    out = tmp / "out"
    outside = tmp / "elsewhere"
    outside.mkdir()
    artifact = outside / "trace.json.gz"
    artifact.write_bytes(b"\x1f\x8b fake trace")
    results_path = tmp / "results.csv"
    _rows(results_path, "run1")
    executed = _executed_notebook(out, artifact, "run1", results_path)
    run = NotebookRun(name="04_compile_autocast-mg2", source_path="x", status="ok", seconds=1.5,
                      executed_path=str(executed))
    render.write_index(out, [run], {"started": "now"})  # the runner writes the index first, then each report
    run.html_path = str(render.render_html(executed, out / f"{run.name}.html"))
    run.facts = render.notebook_facts(executed)
    render.write_index(out, [run], {"started": "now"})
    return out, run, artifact


def test_report_is_self_contained(report):
    out, run, artifact = report
    page = Path(run.html_path).read_text()
    assert "data:image/gif;base64," in page  # nbconvert alone drops image/gif outputs
    assert "data:image/png;base64," in page
    copied = out / "artifacts" / "04_compile_autocast-mg2" / artifact.name
    assert copied.read_bytes() == artifact.read_bytes()
    assert 'href="artifacts/04_compile_autocast-mg2/trace.json.gz"' in page
    assert str(artifact.parent) not in page  # no absolute path into another folder
    assert "USDT" not in page and "real warning kept" in page
    assert "ladder:   0%" not in page  # the unsaved progress widget
    assert 'href="index.html"' in page
    assert "the next notebook" in page and "05_triton_kernels.ipynb" not in page  # no report of 05 here: text
    assert "cdnjs" not in page and "<script src=" not in page  # nothing from the network
    assert html_clean.problems(page, out, published=False) == []


def test_wide_key_table_is_whole(report):
    _, run, _ = report
    page = Path(run.html_path).read_text()
    table = page[page.index("The ladder"):]
    table = table[: table.index("</table>")]
    headers = re.findall(r"<th[^>]*>(.*?)</th>", table, re.S)
    assert "..." not in headers and "&hellip;" not in table
    assert "forward (ms), median (p20-p80)" in headers  # unit in the header, spread beside the median
    assert "287 (285-304)" in table
    assert sum(h.startswith("extra ") for h in headers) == 20  # every column of a 24-column frame


def test_index_has_the_finding(report):
    out, run, _ = report
    index = (out / "index.html").read_text()
    assert "How much faster is the ladder?" in index
    assert "<strong>55 (55-55) ms</strong>" in index or "<strong>55 ms</strong>" in index  # the findings, as markdown
    assert run.facts["headline"]["forward ms (best row)"] == "55"  # the FAIL row (20 ms) does not count
    assert "rows failing the gate" in run.facts["headline"]
    assert len(run.facts["findings"]) == 3
    assert 'href="04_compile_autocast-mg2.html"' in index


def test_missing_artifact_keeps_its_text(tmp_path):
    nb = nbformat.v4.new_notebook()
    c = nbformat.v4.new_code_cell("pass")
    c.outputs = [nbformat.v4.new_output("display_data", data={"text/html": wd.link(tmp_path / "gone.json").data})]
    nb.cells = [c]
    ready, copied = render.prepare_for_html(nb, tmp_path / "out", tmp_path / "out" / "artifacts")
    h = ready.cells[0].outputs[0]["data"]["text/html"]
    assert not copied and 'data-wmbook-artifact="missing"' in h
    assert 'title="not kept with this report: gone.json"' in h and str(tmp_path) not in h  # no path of the run's host


def test_copied_artifacts_show_no_machine_paths(tmp_path):
    """A session report that names its own output folder by its absolute path (a run with an absolute --out) is copied
    with that path shown from `artifacts/`; binary files and the link itself are left as they are."""
    run = tmp_path / "run" / "artifacts" / "02-mg2"
    run.mkdir(parents=True)
    (run / "s_rank0.json").write_text(f'{{"output_dir": "{run}/session", "n": 1}}')
    (run / "trace.bin").write_bytes(b"\x00/root/keep")
    nb = nbformat.v4.new_notebook()
    c = nbformat.v4.new_code_cell("pass")
    c.outputs = [nbformat.v4.new_output("display_data", data={"text/html": wd.link(run / "s_rank0.json").data
                                                              + wd.link(run / "trace.bin").data})]
    nb.cells = [c]
    _, copied = render.prepare_for_html(nb, tmp_path / "out", tmp_path / "out" / "artifacts")
    assert len(copied) == 2
    got = (tmp_path / "out" / "artifacts" / "s_rank0.json").read_text()
    assert got == '{"output_dir": "artifacts/02-mg2/session", "n": 1}'
    assert (tmp_path / "out" / "artifacts" / "trace.bin").read_bytes() == b"\x00/root/keep"


def test_cross_links_prefer_the_same_workload(tmp_path):
    for n in ("01_baseline_profiling-mg2-universal", "01_baseline_profiling-wma-bf16", "01_baseline_profiling-wma-fp32",
              "04_compile_autocast-mg2-universal-compile", "04_compile_autocast-wma", "04_compile_autocast-wma-compile",
              "05_triton_kernels-mg2-universal.PARTIAL", "05_triton_kernels-wma-kernels", "05_triton_kernels-zz",
              "03_step_reduction-world-mg2", "03_step_reduction-wma"):
        (tmp_path / f"{n}.html").write_text("x")
    link = html_clean.report_link
    assert link("01_baseline_profiling", tmp_path, "02_bottleneck_breakdown-wma-bf16") == \
        "01_baseline_profiling-wma-bf16.html"
    assert link("04_compile_autocast", tmp_path, "02_bottleneck_breakdown-wma-bf16") == "04_compile_autocast-wma.html"
    assert link("04_compile_autocast", tmp_path, "02_bottleneck_breakdown-mg2-universal") == \
        "04_compile_autocast-mg2-universal-compile.html"
    # partial last
    assert link("05_triton_kernels", tmp_path, "06_cuda_graphs-mg2-universal") == "05_triton_kernels-zz.html"
    assert link("03_step_reduction", tmp_path, "02_bottleneck_breakdown-wma-bf16") == "03_step_reduction-wma.html"
    assert link("03_step_reduction", tmp_path, "02_bottleneck_breakdown-world-mg2") == \
        "03_step_reduction-world-mg2.html"
    assert link("07_motion_data_loading", tmp_path, "02_bottleneck_breakdown-wma") is None


def test_publish_renders_into_the_folder_and_refuses_bad_input(tmp_path):
    from wmbook import published

    folder = tmp_path / "h100"
    folder.mkdir()
    (folder / "01_baseline_profiling-wma-bf16.html").write_text("x")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    session = run_dir / "session.html"
    session.write_text("<p>session</p>")
    nb = nbformat.v4.new_notebook()
    c = nbformat.v4.new_code_cell("pass")
    c.outputs = [nbformat.v4.new_output("display_data", data={"text/html": wd.link(session).data + wd.link(
        run_dir / "trace.json.gz").data})]
    nb.cells = [nbformat.v4.new_markdown_cell("See [notebook 01](01_baseline_profiling.ipynb)."), c]
    executed = run_dir / "02_bottleneck_breakdown.ipynb"
    nbformat.write(nb, executed)
    for args, msg in (((run_dir / "nope.ipynb", "02_bottleneck_breakdown-wma"), "executed="),
                      ((executed, "02_bottleneck_breakdown"), "name="),
                      ((executed, "01_baseline_profiling-wma"), "name="),
                      ((executed, "02_bottleneck_breakdown-wma"), "folder=")):
        with pytest.raises(ValueError, match=msg):
            published.publish(*args, folder=folder if msg != "folder=" else tmp_path / "none")
    assert sorted(p.name for p in folder.iterdir()) == ["01_baseline_profiling-wma-bf16.html"]  # nothing written
    out = published.publish(executed, "02_bottleneck_breakdown-wma-bf16", folder=folder)
    h = out.read_text()
    assert out == folder / "02_bottleneck_breakdown-wma-bf16.html"
    assert (folder / "artifacts" / "02_bottleneck_breakdown" / "session.html").read_text() == "<p>session</p>"
    assert 'href="artifacts/02_bottleneck_breakdown/session.html"' in h
    assert 'href="01_baseline_profiling-wma-bf16.html"' in h and "not kept with this report: trace.json.gz" in h
    assert str(run_dir) not in h


def test_folder_index(tmp_path):
    """The published folder's index: a question per notebook (from the sources), the stored rows' headline, the
    report's conclusion, links; other files listed; a missing folder is refused naming it."""
    folder = tmp_path / "h100"
    folder.mkdir()
    page = ('<html><body><h2 id="Interpretation">Interpretation</h2><div class="jp-OutputArea-output">'
            '<div class="jp-RenderedMarkdown"><p>The ladder takes one forward to 55 ms.</p></div></div></body></html>')
    (folder / "04_compile_autocast-mg2-universal-ladder.html").write_text(page)
    (folder / "04_compile_autocast-mg2-universal.html").write_text("<html><body>no interpretation</body></html>")
    (folder / "bench.csv").write_text("a,b\n")
    rows = [results.make_row(notebook="04_compile_autocast", workload="mg2", preset="mg2-universal", variant=v,
                             metric="forward_ms", value=x, unit="ms", params={}, gate=g)
            | {"device_kind": "cuda", "device_name": "Test GPU", "run_id": "r1", "git_commit": "abc"}
            for v, x, g in (("fp32-eager", 300.0, "reference"), ("bf16", 100.0, "pass"))]
    results.append(rows, tmp_path / "r.csv")
    index = report_index.write_folder_index(folder, results_path=tmp_path / "r.csv").read_text()
    assert index.count('class="finding"') == 1  # both files are the one notebook-workload-preset
    assert "How much of the distance to the FLOP floor" in index  # notebook 04's question
    assert "Best gated row <strong>bf16</strong>" in index  # the card's findings, from the rows
    assert "3.00x" in index and "Test GPU" in index
    assert 'href="04_compile_autocast-mg2-universal-ladder.html"' in index and 'href="bench.csv"' in index
    assert "older render" not in index
    with pytest.raises(ValueError, match="folder="):
        report_index.write_folder_index(tmp_path / "nope")
    # a report made before the display helpers: its link says what it shows that today's rendering does not
    with pd.option_context("display.max_columns", 20):
        cut = _wide_ladder()._repr_html_()
    (folder / "04_compile_autocast-mg2-universal.html").write_text(
        f"<html><body>{cut}<script type='application/vnd.jupyter.widget-view+json'>{{}}</script></body></html>")
    index = report_index.write_folder_index(folder, results_path=tmp_path / "r.csv").read_text()
    assert "04_compile_autocast-mg2-universal.html (tables cut (&#x27;...&#x27;), empty progress boxes)" in index
    assert "04_compile_autocast-mg2-universal-ladder.html</a>" in index  # the whole one stays unmarked


def test_render_flaws_names_what_an_older_render_shows(tmp_path):
    page = tmp_path / "r.html"
    page.write_text(f"<html><body>{wd.table(_wide_ladder()).to_html()}"
                    "<img src='data:image/png;base64,AA'></body></html>")
    assert report_index.render_flaws(page) == []
    page.write_text('<table><tr><th>a</th><th>\u2026</th></tr></table><img alt="x" src="fig.png">')
    assert report_index.render_flaws(page) == ["tables cut ('...')", "images not embedded"]


def test_folder_index_follows_the_device_and_dtype(tmp_path):
    """Rows of another device are left out when a device is named; with reports per dtype the card's findings are
    those of the run its report shows."""
    folder = tmp_path / "h200"
    folder.mkdir()
    for dtype, run in (("bf16", "r1aaaaaaaaaa"), ("fp32", "r2aaaaaaaaaa")):
        (folder / f"01_baseline_profiling-wma-{dtype}.html").write_text(
            f"<html><body><p>12 rows of run {run} in results.csv</p></body></html>")
    rows = []
    for dev, dtype, run, x, t in (("GPU B", "fp32", "r2aaaaaaaaaa", 30.0, "2026-01-02"),
                                  ("GPU A", "bf16", "r1aaaaaaaaaa", 10.0, "2026-01-03")):
        rows.append(results.make_row(notebook="01_baseline_profiling", workload="wma", preset="wma", variant="eager",
                                     metric="iteration_s", value=x, unit="s", params={"dtype": dtype})
                    | {"device_kind": "cuda", "device_name": dev, "run_id": run, "git_commit": "abc", "timestamp": t})
    results.append(rows, tmp_path / "r.csv")
    index = report_index.write_folder_index(folder, results_path=tmp_path / "r.csv", device="gpu b").read_text()
    assert "Eager fp32" in index and "30 s / iteration" in index and "GPU A" not in index
    index = report_index.write_folder_index(folder, results_path=tmp_path / "r.csv").read_text()
    assert "Eager bf16" in index  # without a device the latest run (GPU A's bf16)
    assert "Run time per report" not in index  # no time recorded: no section
    # recorded notebook times (wmbook.runtimes): each report's own run (its caption's run id), the rest named
    from wmbook import runtimes

    (folder / "01_baseline_profiling-wma-fp32.html").write_text(
        "<html><body><p>12 rows of run 0123456789ab in results.csv</p></body></html>")
    for run, secs, when in (("0123456789ab", 300.0, "2026-01-02"), ("fedcba987654", 900.0, "2026-01-04")):
        runtimes.record(tmp_path / "r.csv", notebook="01_baseline_profiling", workload="wma", preset="wma",
                        device_name="GPU B", git_commit="abcdef1234", run_id=run, seconds=secs, timestamp=when)
    index = report_index.write_folder_index(folder, results_path=tmp_path / "r.csv", device="gpu b").read_text()
    assert "Run time per report" in index and "<td>5.0</td><td>abcdef1</td><td>2026-01-02</td>" in index
    assert "1 of 2 reports, <b>5.0 minutes</b>" in index and "15.0" not in index
    assert "no time recorded for 01_baseline_profiling-wma-bf16.html" in index
    # per notebook, workload and preset on the folder's device: the median of its latest runs (300 and 900 s), and
    # the runs of a full set with no time there
    notebook_times = index[index.index("How long each notebook takes on this device"):]
    assert "<td>01_baseline_profiling</td><td>wma</td><td>wma</td><td>10.0</td><td>2</td>" in notebook_times
    assert "not timed here yet: 01 mg2 / mg2-universal" in notebook_times and "07 motion / g1-4096" in notebook_times
    assert "01 wma / wma" not in notebook_times
    index = report_index.write_folder_index(folder, results_path=tmp_path / "r.csv").read_text()
    assert "How long each notebook" not in index  # no device: times of every device would mix


def test_a_folder_that_holds_a_set_shows_the_sets_rows_and_names_the_reports_outside_it(tmp_path):
    """A published set (its gpu_time.json) is what the folder's summary, cards and tables show, though a later run of
    another commit is stored; a report of a run outside the set stays, its link saying so."""
    import json

    from wmbook import published, published_set

    folder = tmp_path / "h200"
    folder.mkdir()
    rows = []
    for dev, dtype, run, commit, x, t in (("GPU A", "bf16", "0000000000a1", "set0000", 10.0, "2026-01-02"),
                                          ("GPU A", "fp32", "0000000000a2", "old0000", 30.0, "2026-01-03"),
                                          ("GPU B", "fp32", "0000000000a3", "old0000", 50.0, "2026-01-03")):
        (folder / f"01_baseline_profiling-wma-{dtype}.html").write_text(
            f"<html><body><p>12 rows of run {run} in results.csv</p></body></html>") if dev == "GPU A" else None
        rows.append(results.make_row(notebook="01_baseline_profiling", workload="wma", preset="wma", variant="eager",
                                     metric="iteration_s", value=x, unit="s", params={"dtype": dtype})
                    | {"device_kind": "cuda", "device_name": dev, "run_id": run, "git_commit": commit, "timestamp": t})
    results.append(rows, tmp_path / "r.csv")
    index = report_index.write_folder_index(folder, results_path=tmp_path / "r.csv", device="gpu a").read_text()
    assert "Eager fp32" in index and "not part of the set" not in index  # no set: the latest run
    (folder / published_set.GPU_TIME_FILE).write_text(json.dumps({"commit": "set0000", "notebook_seconds": {},
                                                                  "total_seconds": 60.0}))
    index = report_index.write_folder_index(folder, results_path=tmp_path / "r.csv", device="gpu a").read_text()
    assert "Eager bf16" in index and "10 s / iteration" in index
    assert "01_baseline_profiling-wma-fp32.html (commit old0000, not part of the set)" in index
    df = results.read(tmp_path / "r.csv")
    assert set(results.of_set(df, folder, "GPU A")["run_id"]) == {"0000000000a1", "0000000000a3"}
    assert len(results.of_set(df, tmp_path, "GPU A")) == 3  # a folder without a set: every row
    assert "commit old0000" in published.markdown(tmp_path / "r.csv", "GPU A")  # the tables page: without a set
    assert "commit old0000" not in published.markdown(tmp_path / "r.csv", "GPU A", folder)  # and with one


def test_a_labelled_report_of_another_run_adds_its_headline_to_the_card(tmp_path):
    """A group's labelled report of a run of its own (another dtype, GPU count or stack) puts its first finding on
    the group's card, named by its label and file; a labelled report of the card's own run adds nothing."""
    folder = tmp_path / "h200"
    folder.mkdir()
    rows = []
    for dtype, run, x, t in (("fp32", "00000000000b", 30.0, "2026-01-02"),
                             ("bf16", "00000000000a", 10.0, "2026-01-03")):
        (folder / f"01_baseline_profiling-wma-{dtype}.html").write_text(
            f"<html><body><p>12 rows of run {run} in results.csv</p></body></html>")
        rows.append(results.make_row(notebook="01_baseline_profiling", workload="wma", preset="wma", variant="eager",
                                     metric="iteration_s", value=x, unit="s", params={"dtype": dtype})
                    | {"device_kind": "cuda", "device_name": "GPU A", "run_id": run, "git_commit": "abc",
                       "timestamp": t})
    results.append(rows, tmp_path / "r.csv")
    index = report_index.write_folder_index(folder, results_path=tmp_path / "r.csv").read_text()
    assert index.count('class="finding"') == 1 and "Eager bf16" in index
    assert "<strong>fp32</strong> (01_baseline_profiling-wma-fp32.html): Eager fp32" in index
    (folder / "01_baseline_profiling-wma-fp32.html").write_text(
        "<html><body><p>12 rows of run 00000000000a in results.csv</p></body></html>")  # the card's own run
    index = report_index.write_folder_index(folder, results_path=tmp_path / "r.csv").read_text()
    assert "Eager fp32" not in index and "<strong>fp32</strong>" not in index


# --------------------------------------------------------------------------- headless Chromium


def _chromium(args: list[str], timeout: float = 90.0) -> subprocess.CompletedProcess:
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
           "--disable-dev-shm-usage", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def screenshot(url: str, png: Path, width: int = 1400, height: int = 2400) -> Path:
    """A headless-Chromium screenshot of `url` (what a reader sees at the top of the page)."""
    r = _chromium([f"--window-size={width},{height}", f"--screenshot={png}", url])
    assert png.is_file(), f"chromium wrote no screenshot: {r.stderr[-2000:]}"
    return png


def rendered_dom(url: str) -> str:
    """The page's DOM after Chromium loaded and laid it out."""
    r = _chromium(["--virtual-time-budget=5000", "--dump-dom", url])
    assert r.returncode == 0 and "<html" in r.stdout.lower(), r.stderr[-2000:]
    return r.stdout


def _assert_drawn(png: Path, figure: bool = True) -> None:
    from PIL import Image

    im = np.asarray(Image.open(png).convert("RGB"))
    assert im.std() > 5, f"{png} is blank"
    if not figure:
        return
    colored = (np.abs(im[..., 0].astype(int) - im[..., 2].astype(int)) > 40).mean()
    assert colored > 0.001, f"{png}: no coloured pixels (no figure drawn)"


def _assert_whole_tables(dom: str, min_tables: int) -> None:
    from bs4 import BeautifulSoup

    soup = BeautifulSoup(dom, "html.parser")
    tables = soup.find_all("table")
    assert len(tables) >= min_tables
    for t in tables:
        cells = [c.get_text(strip=True) for c in t.find_all(["th", "td"])]
        assert "..." not in cells and "…" not in cells, "a table with elided ('...') columns or rows"
    for img in soup.find_all("img"):
        src = img.get("src", "")
        assert src.startswith("data:image/"), f"an image that is not embedded: {src[:80]}"
        from PIL import Image

        Image.open(io.BytesIO(base64.b64decode(src.split(",", 1)[1]))).verify()  # a real, whole image


@needs_chromium
def test_chromium_renders_index_and_report(report, tmp_path):
    out, run, _ = report
    shots = tmp_path / "shots"
    shots.mkdir()
    for name, min_tables in (("index.html", 2), (Path(run.html_path).name, 1)):
        url = (out / name).as_uri()
        _assert_drawn(screenshot(url, shots / f"{name}.png"), figure=name != "index.html")
        _assert_whole_tables(rendered_dom(url), min_tables)


def test_notebook_01_tiny_end_to_end_and_its_report(tmp_path):
    """Notebook 01 on the tiny preset through the runner (what `make report` does on a CPU): its rows, its
    artifacts inside the report folder, and, where Chromium is installed, its report and index in it (figures drawn,
    every table whole)."""
    from wmbook.run import run_notebooks

    out, results_path = tmp_path / "report", tmp_path / "results.csv"
    (r,) = run_notebooks(["01_baseline_profiling"], out=out, progress=False, workloads=["mg2"],
                         parameters={"preset": "tiny", "num_blocks": 3, "warmup": 0, "repeats": 2,
                                     "results_path": str(results_path)})
    assert r.ok, r.failure_summary()
    art = out / "artifacts" / r.name  # the run's own artifacts folder
    assert (art / "video.gif").is_file() and (art / "01_baseline_trace.json.gz").stat().st_size > 0
    assert (out / "index.html").exists()
    df = pd.read_csv(results_path)
    assert {"fps", "dit_forward_ms", "vae_share", "stage_share:2_Pipeline_Inference"} <= set(df["metric"])
    assert (df["preset"] == "tiny").all() and df.loc[df.metric == "fps", "value"].iloc[0] > 0
    page = Path(r.html_path).read_text()
    assert "data:image/gif;base64," in page and "USDT" not in page and "without encryption" not in page
    assert r.facts["headline"].get("FPS") and r.facts["conclusion"]
    if CHROMIUM is None:  # the screenshot part: `make chromium` installs it (CI does)
        return
    for name in ("index.html", Path(r.html_path).name):
        url = (out / name).as_uri()
        _assert_drawn(screenshot(url, tmp_path / f"{name}.png", height=4000), figure=name != "index.html")
        _assert_whole_tables(rendered_dom(url), 2)


def test_whole_table_check_catches_elided_columns():
    """The check the Chromium tests apply fails on what pandas' plain repr makes of a wide frame."""
    with pd.option_context("display.max_columns", 20):
        elided = _wide_ladder()._repr_html_()
    with pytest.raises(AssertionError, match="elided"):
        _assert_whole_tables(f"<html><body>{elided}</body></html>", 1)
    _assert_whole_tables(f"<html><body>{wd.table(_wide_ladder()).to_html()}</body></html>", 1)


def test_publish_report_names_each_notebook_by_its_preset(report, tmp_path):
    """`make publish`: every finished notebook of a run folder goes into the published folder as
    <notebook>-<preset>.html (preset from its rows), findings first, no stderr box, nothing html_clean objects to."""
    from wmbook import published

    out, _, _ = report
    folder = tmp_path / "h200"
    folder.mkdir()
    (page,) = published.publish_report(out, folder)
    assert page == folder / "04_compile_autocast-tiny.html"
    text = page.read_text()
    assert html_clean.problems(text, folder) == [] and "real warning kept" not in text  # a published page: no stderr


def test_findings_come_from_the_store_when_the_runs_results_file_stayed_on_another_host(tmp_path, monkeypatch):
    """A GPU run's notebook names the results file of the host that ran it; once its rows are merged into the store,
    the report rendered here still opens with its findings (read from the store by run id)."""
    from wmbook import render, results
    from wmbook.paths import REPO_ROOT

    rows = pd.read_csv(REPO_ROOT / "data" / "results" / "results.csv", dtype=str, keep_default_na=False)
    run = rows[rows.notebook == "06_cuda_graphs"].run_id.iloc[-1]
    store = tmp_path / "results.csv"
    rows[rows.run_id == run].to_csv(store, index=False)
    monkeypatch.setenv("WMBOOK_RESULTS", str(store))
    nb = nbformat.v4.new_notebook()
    out = nbformat.v4.new_output("display_data", data={"text/plain": "rows"},
                                 metadata={render.META_KEY: {"run_id": run, "results_path": "/gone/results.csv"}})
    cell = nbformat.v4.new_code_cell("rows")
    cell.outputs = [out]
    nb.cells = [cell]
    found = render.report_findings(nb)
    assert found is not None and found[0]
    assert results.default_path() == store
    monkeypatch.setenv("WMBOOK_RESULTS", str(tmp_path / "none.csv"))
    assert render.report_findings(nb) is None  # neither holds them: the report stands without findings


def test_set_gpu_minutes_per_notebook_and_workload():
    """The set's index says where its GPU time goes: GPU-minutes per notebook and workload, a run on two GPUs counted
    twice and marked; nothing without per-run times."""
    from wmbook import report_index

    t = {"seconds": {"01_baseline_profiling-mg2": 120.0, "01_baseline_profiling-wma": 60.0,
                     "03_step_reduction-world-wma": 30.0, "08_multi_gpu-wma": 90.0},
         "gpus": {"08_multi_gpu-wma": 2}}
    got = report_index._run_minutes_html(t)
    assert "<th>mg2</th><th>wma</th><th>world-wma</th>" in got
    assert "<tr><td>01_baseline_profiling</td><td class=num>2.0</td><td class=num>1.0</td><td></td></tr>" in got
    assert "<td class=num>3.0 (2 GPUs)</td>" in got
    assert report_index._run_minutes_html({}) == ""
    # the runs other work on the host may have slowed are named (wmbook.hostload), or that none was
    named = report_index._run_minutes_html(t | {"host_other_cores": {"01_baseline_profiling-mg2": 0.2,
                                                                     "08_multi_gpu-wma": 11.2}})
    assert "other work kept the host's CPUs busy" in named and "08_multi_gpu-wma 11.2" in named
    assert "01_baseline_profiling-mg2" not in named.split("other work kept")[1]
    calm = report_index._run_minutes_html(t | {"host_other_cores": {"01_baseline_profiling-mg2": 0.2}})
    assert "fewer than 1 CPU busy on average during each of the 1 runs" in calm
    assert "other work" not in got  # a set from before it was recorded: nothing said
    # the range of the hosts' core speed, the slowest run named; one run alone says nothing
    loops = report_index._run_minutes_html(t | {"host_core_loop_us": {"01_baseline_profiling-mg2": 950,
                                                                      "08_multi_gpu-wma": 1210}})
    assert "test loop in 950-1210 us" in loops and "the slowest: 08_multi_gpu-wma" in loops
    assert "test loop" not in report_index._run_minutes_html(t | {"host_core_loop_us": {"08_multi_gpu-wma": 1210}})
    assert "test loop" not in got


def test_a_device_folder_refuses_a_run_of_another_device_before_writing(report, tmp_path, monkeypatch, capsys):
    """A published folder of one device (data/reports/h200: H200) takes that device's runs only: `make publish` of a
    run made on another card is refused, naming the run's device and the folder's, before any report is written; so is
    a notebook whose rows cannot be found (its device unknown), and `make publish` on a host of another card stops
    before it runs anything. The folder's device here is made up, so no machine running the tests has it."""
    from wmbook import published
    from wmbook.errors import InputError

    out, _, _ = report
    folder = tmp_path / "testcard"
    folder.mkdir()
    monkeypatch.setitem(published.FOLDER_PAGES, folder, "TESTCARD")
    with pytest.raises(InputError, match=r"04_compile_autocast-mg2.ipynb's run ran on .*holds the TESTCARD's runs"):
        published.publish_report(out, folder)
    executed = out / "executed" / "04_compile_autocast-mg2.ipynb"
    with pytest.raises(InputError, match="holds the TESTCARD's runs only"):
        published.publish(executed, "04_compile_autocast-tiny", folder)
    rowless = tmp_path / "executed" / "04_compile_autocast-x.ipynb"
    rowless.parent.mkdir()
    nbformat.write(nbformat.v4.new_notebook(), rowless)
    with pytest.raises(InputError, match="has no results rows here, so its device is unknown"):
        published.publish(rowless, "04_compile_autocast-x", folder)
    assert list(folder.iterdir()) == []
    assert published.publish_report(tmp_path, folder) == []  # a run folder of rowless notebooks: nothing to publish
    assert published.folder_device(folder) == "TESTCARD" and published.folder_device(tmp_path) is None
    assert published.device_matches("NVIDIA H200", "H200") and published.device_matches("NVIDIA H200 NVL", "h200")
    assert not published.device_matches("NVIDIA GH200 480GB", "H200")
    assert not published.device_matches("NVIDIA H100 80GB HBM3", "H200")

    # make publish's first step: this host (a CPU here, or another card) is refused for the folder, any for another
    with pytest.raises(SystemExit):
        published.main(["--check-host", str(folder)])
    assert "holds the TESTCARD's runs only and this host has" in capsys.readouterr().err
    assert published.main(["--check-host", str(tmp_path)]) == 0
    assert "no device's folder" in capsys.readouterr().out
