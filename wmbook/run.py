"""Run the workbook's notebooks headlessly and render them to an HTML report.

Each notebook is executed with papermill (parameters injected after the cell tagged
``parameters``), saved as an executed ``.ipynb`` and rendered to standalone HTML with
nbconvert. A report folder looks like::

    <out>/index.html            status table, then per notebook its question, headline numbers (from its
                                results rows), its conclusion and links
    <out>/summary.json          the same, machine readable
    <out>/<name>.html           rendered notebook, self-contained (also for failed ones: shows the error)
    <out>/executed/<name>.ipynb executed notebook with outputs
    <out>/artifacts/<name>/     that run's traces, video and session report (its output_dir, unless -p output_dir
                                is given; files linked from elsewhere are copied here), linked relatively

Kernels started here are headless (wmbook.display.headless): widgets show their static form, tqdm bars are off,
the profiler's USDT lines and the kernel's start-up warnings are silenced; the terminal's progress bar names the
section that is running.

A failing notebook does not stop the others; ``main`` exits 1 if any failed.

From Python::

    from wmbook.run import run_notebooks
    runs = run_notebooks(["01_baseline_profiling"], preset="tiny", out="reports/x")

From a shell (wmbook.cli)::

    wmbook run [NOTEBOOK ...] [--workload NAMES] [--preset NAME] [--out DIR] [-p NAME VALUE ...] [-f params.yaml]
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import os
import platform
import re
import signal
import sys
import time
import traceback
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Sequence

from tqdm.auto import tqdm

from . import runtimes
from .hostload import host_load
from .jupyter_kernel import check_kernel, kernel_for_this_python
from .paths import check_output_dir, git_commit
from .render import STATUS_FAILED, STATUS_OK, STATUS_PENDING, notebook_facts, render_html, write_index

__all__ = [
    "NotebookRun",
    "UnknownNotebookError",
    "discover_notebooks",
    "resolve_notebooks",
    "run_notebooks",
]

NOTEBOOK_GLOB = "[0-9][0-9]_*.ipynb"


# --------------------------------------------------------------------------- locations


def repo_root() -> Path:
    """The workbook checkout: ``$WMBOOK_ROOT``, else the folder holding ``wmbook/`` (editable
    install), else the current directory."""
    env = os.environ.get("WMBOOK_ROOT")
    if env:
        return Path(env).resolve()
    here = Path(__file__).resolve().parents[1]
    if (here / "notebooks").is_dir():
        return here
    return Path.cwd().resolve()


def notebooks_dir() -> Path:
    return repo_root() / "notebooks"


def default_out_dir() -> Path:
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return Path("reports") / stamp


# --------------------------------------------------------------------------- discovery


class UnknownNotebookError(ValueError):
    """A requested notebook does not exist; the message lists the available ones."""


def discover_notebooks(directory: str | os.PathLike | None = None) -> list[Path]:
    """Numbered notebooks (``NN_name.ipynb``) in ``directory`` (default ``notebooks/``), sorted."""
    d = Path(directory) if directory is not None else notebooks_dir()
    if not d.is_dir():
        return []
    return sorted(p.resolve() for p in d.glob(NOTEBOOK_GLOB) if p.is_file())


def resolve_notebooks(
    notebooks: Iterable[str | os.PathLike] | str | os.PathLike | None = None,
    directory: str | os.PathLike | None = None,
) -> list[Path]:
    """Turn user input into notebook paths, validating all of them before anything runs.

    Accepted forms: a path to an ``.ipynb`` file; a notebook name with or without
    ``.ipynb`` (``01_baseline_profiling``); its number prefix (``01``). ``None`` means
    every numbered notebook.
    """
    available = discover_notebooks(directory)
    if notebooks is None:
        return available
    if isinstance(notebooks, (str, os.PathLike)):
        notebooks = [notebooks]

    found: list[Path] = []
    unknown: list[str] = []
    for item in notebooks:
        text = os.fspath(item)
        path = Path(text)
        if path.suffix == ".ipynb" and path.is_file():
            found.append(path.resolve())
            continue
        stem = path.name[: -len(".ipynb")] if path.name.endswith(".ipynb") else path.name
        matches = [p for p in available if p.stem == stem]
        if not matches:
            matches = [p for p in available if p.stem.split("_", 1)[0] == stem]
        if len(matches) == 1:
            found.append(matches[0])
        else:
            unknown.append(text)
    if unknown:
        where = Path(directory) if directory is not None else notebooks_dir()
        names = "\n".join(f"  {p.stem}" for p in available) or "  (none)"
        raise UnknownNotebookError(
            f"unknown notebook(s): {', '.join(unknown)}\n"
            f"available notebooks in {where}:\n{names}"
        )
    return found


# --------------------------------------------------------------------------- results


@dataclass
class NotebookRun:
    """Outcome of one notebook run. Paths are absolute strings (or ``None``)."""

    name: str
    source_path: str
    status: str = STATUS_PENDING  # "ok" | "failed" | "pending"
    seconds: float = 0.0
    executed_path: str | None = None
    html_path: str | None = None
    error: str | None = None  # "ValueError: boom" or a short description
    failed_cell: int | None = None  # index of the failing cell in the source notebook (0-based)
    failed_exec_count: int | None = None  # its "In [n]" number
    failed_source: str | None = None  # the line that raised (else the cell's first non-empty line)
    failed_line: int | None = None  # its line number in the cell (1-based), when the traceback names it
    parameters: dict | None = None  # what papermill injected (the names this notebook declares)
    facts: dict | None = None  # question, conclusion, headline numbers (wmbook.render.notebook_facts)
    host_load: dict | None = None  # the host's CPU use while it ran (wmbook.hostload.HostLoad.record)

    @property
    def ok(self) -> bool:
        return self.status == STATUS_OK

    def failed_where(self) -> str:
        """``cell 3 (In [4]): first line of the cell`` (the parts that are known)."""
        parts = []
        if self.failed_cell is not None:
            parts.append(f"cell {self.failed_cell}")
        if self.failed_exec_count is not None:
            parts.append(f"(In [{self.failed_exec_count}])")
        if self.failed_line is not None:
            parts.append(f"line {self.failed_line}")
        where = " ".join(parts)
        if self.failed_source:
            where = f"{where}: {self.failed_source}" if where else self.failed_source
        return where

    def failure_summary(self) -> str:
        """One or two lines saying which notebook failed where and why."""
        if self.status != STATUS_FAILED:
            return f"{self.name}: {self.status}"
        where = self.failed_where()
        where = f" in {where}" if where else ""
        text = f"FAILED {self.name} after {self.seconds:.1f} s{where}\n    {self.error}"
        if self.executed_path:
            text += f"\n    executed notebook: {self.executed_path}"
        return text


def _first_line(source: str | None) -> str | None:
    for line in (source or "").splitlines():
        if line.strip():
            return line.strip()
    return None


def _one_line(text: str, limit: int = 300) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


# --------------------------------------------------------------------------- helpers


# --------------------------------------------------------------------------- running


def _execute_one(
    run: NotebookRun,
    out: Path,
    parameters: Mapping[str, Any],
    kernel_name: str,
    timeout: float | None,
    progress: bool,
    cwd: Path,
) -> None:
    import papermill as pm  # noqa: PLC0415  heavy: papermill, only to execute
    from papermill.exceptions import PapermillExecutionError  # noqa: PLC0415  heavy: papermill

    src = Path(run.source_path)
    executed = out / "executed" / f"{run.name}.ipynb"
    executed.parent.mkdir(parents=True, exist_ok=True)
    # papermill saves as it goes; keep that in a side file so a re-run into the same folder
    # never leaves a half-written executed notebook in place of a good one.
    partial = executed.with_name(f".{run.name}.partial.ipynb")
    kwargs: dict[str, Any] = {}
    if timeout:
        kwargs["execution_timeout"] = int(timeout) if float(timeout).is_integer() else timeout

    interrupted = False
    t0 = time.perf_counter()
    try:
        with _headless_kernel_env(), _section_progress(run.name), _kernels_ended():
            pm.execute_notebook(
                str(src),
                str(partial),
                parameters=dict(parameters),
                kernel_name=kernel_name,
                progress_bar={"desc": run.name, "leave": False} if progress else False,
                cwd=str(cwd),
                # the kernel's own start-up warnings (e.g. "running over TCP without encryption") mean nothing here
                extra_arguments=KERNEL_ARGUMENTS,
                kernel_manager_class=_tracked_kernel_manager(),
                **kwargs,
            )
        run.status = STATUS_OK
    except PapermillExecutionError as exc:
        run.status = STATUS_FAILED
        # papermill's cell_index counts its injected cell; refined from the saved notebook below
        run.failed_exec_count = exc.exec_count
        run.failed_source = _first_line(exc.source)
        run.error = f"{exc.ename}: {_one_line(exc.evalue)}"
    except Exception as exc:  # kernel died, timeout, missing parameter, ...
        name = type(exc).__name__
        interrupted = "Timeout" in name or "DeadKernel" in name or "died" in str(exc)
        run.status = STATUS_FAILED
        text = str(exc).split("Here is a preview of the cell contents")[0]  # nbclient timeout
        run.error = f"{name}: {_one_line(text)}"
    finally:
        run.seconds = time.perf_counter() - t0

    # the reports a previous run of this name left in the folder are moved aside, good or failed: the folder then
    # shows this run's report alone (never an old good one beside a new failure), and loses nothing
    _retire(out, run.name)
    if partial.exists():
        html = out / f"{run.name}.html"
        if run.status == STATUS_FAILED:
            _locate_failure_in_notebook(run, partial, interrupted)
            # a failed run's report is named as such: it never takes the place of a good one
            executed = executed.with_name(f"{run.name}{FAILED_SUFFIX}.ipynb")
            html = out / f"{run.name}{FAILED_SUFFIX}.html"
        os.replace(partial, executed)
        run.executed_path = str(executed)
        try:
            run.html_path = str(render_html(executed, html, artifacts=out / "artifacts" / run.name))
        except Exception as exc:
            if run.status == STATUS_OK:
                run.status = STATUS_FAILED
                run.error = f"HTML rendering failed: {type(exc).__name__}: {_one_line(str(exc))}"
            else:
                run.error += f" (HTML rendering also failed: {type(exc).__name__})"
        try:
            run.facts = notebook_facts(executed)
        except Exception as exc:  # noqa: BLE001  (the index shows less; the report stands)
            run.facts = {"error": f"{type(exc).__name__}: {_one_line(str(exc))}"}


SUPERSEDED = "superseded"  # <out>/superseded/<UTC time>/: the reports a later run of the same name replaced


def _retire(out: Path, name: str) -> list[Path]:
    """Move the report files of an earlier run of `name` in `out` (its HTML and executed notebook, ok or .FAILED) into
    out/superseded/<UTC time>/, keeping their relative paths; returns where they went."""
    olds = [out / f"{name}{sfx}.html" for sfx in ("", FAILED_SUFFIX)]
    olds += [out / "executed" / f"{name}{sfx}.ipynb" for sfx in ("", FAILED_SUFFIX)]
    olds = [p for p in olds if p.exists()]
    if not olds:
        return []
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ")
    moved = []
    for p in olds:
        dest = out / SUPERSEDED / stamp / p.relative_to(out)
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.replace(p, dest)
        moved.append(dest)
    return moved


# what the kernels wmbook.run starts see (unless the caller's environment sets it): no live widgets or tqdm bars
# (they render as empty boxes in HTML; the runner's own progress names the section instead), no profiler USDT lines
HEADLESS_KERNEL_ENV = {"WMBOOK_HEADLESS": "1", "TQDM_DISABLE": "1", "KINETO_LOG_LEVEL": "6"}
# the kernel's own start-up warnings ("running over TCP without encryption") mean nothing to a report's reader;
# tqdm.auto would pick its widget bars in a kernel (tqdm.notebook ignores TQDM_DISABLE): text tqdm, disabled
KERNEL_ARGUMENTS = [
    "--IPKernelApp.log_level=ERROR",
    "--IPKernelApp.exec_lines=['import wmbook.display as _wmd; _wmd.headless_start(); del _wmd']",
]


@contextlib.contextmanager
def _headless_kernel_env() -> Iterator[None]:
    """Set HEADLESS_KERNEL_ENV (where unset) for the kernel started inside; restored afterwards."""
    added = {k: v for k, v in HEADLESS_KERNEL_ENV.items() if k not in os.environ}
    os.environ.update(added)
    try:
        yield
    finally:
        for k in added:
            os.environ.pop(k, None)


_HEADING = re.compile(r"^\s*#{1,3}\s+(.+?)\s*$", re.M)


# the kernels this process started (a kernel runs in a session of its own, so Ctrl-C in the terminal does not reach it)
_KERNELS: weakref.WeakSet = weakref.WeakSet()


def _tracked_kernel_manager():
    """nbclient's kernel manager class, each instance remembered in _KERNELS."""
    from jupyter_client.manager import AsyncKernelManager  # noqa: PLC0415  heavy: jupyter_client, only to execute

    class TrackedKernelManager(AsyncKernelManager):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            _KERNELS.add(self)

    return TrackedKernelManager


@contextlib.contextmanager
def _kernels_ended() -> Iterator[None]:
    """However execution ends (Ctrl-C included), no kernel started in it outlives it. nbclient shuts its kernel down
    when a notebook ends, but an interrupt can leave the run before that shutdown ran: the kernel, in a session of its
    own, would keep computing (and holding a GPU, and the terminal's output) until its cell ended."""
    try:
        yield
    finally:
        for km in list(_KERNELS):
            proc = getattr(getattr(km, "provisioner", None), "process", None)
            if proc is None or proc.poll() is not None:
                continue
            try:  # its session's group: the kernel and what it started
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                proc.kill()
            proc.wait(timeout=10)


def _section_of(nb, cell) -> str | None:
    """The heading of the markdown cell above `cell` (the section it belongs to), shortened."""
    title = None
    for c in nb.cells:
        if c is cell:
            break
        if c.cell_type == "markdown":
            m = _HEADING.search(c.source)
            if m:
                title = m.group(1).replace("`", "").replace("*", "")
    if title and len(title) > 48:
        title = title[:47] + "…"
    return title


@contextlib.contextmanager
def _section_progress(name: str) -> Iterator[None]:
    """While papermill executes, its progress bar names the notebook and the section running (the last heading
    above the cell) instead of 'Executing'."""
    from papermill.engines import NotebookExecutionManager  # noqa: PLC0415  heavy: papermill

    original = NotebookExecutionManager.get_cell_description

    def describe(self, cell, escape_str="papermill_description="):
        own = original(self, cell, escape_str)
        if own is not None:
            return own
        section = _section_of(self.nb, cell)
        if section and getattr(self, "pbar", None):
            self.pbar.set_description(f"{name} · {section}"[:70], refresh=False)
        return None

    NotebookExecutionManager.get_cell_description = describe
    try:
        yield
    finally:
        NotebookExecutionManager.get_cell_description = original


_PAPERMILL_TAGS = ("papermill-error-cell-tag", "injected-parameters")
FAILED_SUFFIX = ".FAILED"  # executed/<name>.FAILED.ipynb, <name>.FAILED.html
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_ARROW = re.compile(r"^-+> ?(\d+)\s?(.*)$")


def _raising_line(cell) -> tuple[int | None, str | None]:
    """(line number, text) of the cell's line that raised, from the IPython traceback in its error output: the
    first '---->' marker belongs to the cell's own frame."""
    for out in cell.get("outputs", []):
        if out.get("output_type") != "error":
            continue
        for frame_line in out.get("traceback", []):
            for line in _ANSI.sub("", frame_line).splitlines():
                m = _ARROW.match(line.strip())
                if m:
                    return int(m.group(1)), m.group(2).strip() or None
    return None, None


def _locate_failure_in_notebook(run: NotebookRun, executed: Path, interrupted: bool) -> bool:
    """Find the failing cell in a saved executed notebook: the one papermill marked
    ``failed`` (an exception in a cell) or, when execution was ``interrupted`` (cell timeout,
    dead kernel), the last cell that started.

    ``failed_cell`` is set to the cell's index in the *source* notebook (papermill's own
    index counts its injected parameters cell and error banners). Returns True if found.
    """
    try:
        import nbformat  # noqa: PLC0415  heavy: nbformat

        nb = nbformat.read(executed, as_version=4)
    except Exception:
        return False
    found = None
    source_index = 0
    for cell in nb.cells:
        md = cell.get("metadata", {})
        tags = md.get("tags", [])
        pm_md = md.get("papermill", {})
        if pm_md.get("status") == "failed":
            found = (cell, source_index)
            break
        if interrupted and pm_md.get("start_time"):
            found = (cell, source_index)
        if not any(t in tags for t in _PAPERMILL_TAGS):
            source_index += 1
    if found is None:
        return False
    cell, index = found
    injected = "injected-parameters" in cell.get("metadata", {}).get("tags", [])
    run.failed_cell = None if injected else index
    run.failed_exec_count = cell.get("execution_count")
    first = _first_line(cell.get("source"))
    line, text = _raising_line(cell)
    if text is not None and not injected:
        run.failed_line, first = line, text
    run.failed_source = f"(papermill's injected parameters) {first}" if injected else first
    return True


def run_notebooks(
    notebooks: Iterable[str | os.PathLike] | str | os.PathLike | None = None,
    *,
    out: str | os.PathLike | None = None,
    preset: str | None = None,
    parameters: Mapping[str, Any] | None = None,
    kernel_name: str | None = None,
    timeout: float | None = None,
    progress: bool = True,
    cwd: str | os.PathLike | None = None,
    workloads: Sequence[str] | None = None,
    profile: str = "full",
) -> list[NotebookRun]:
    """Execute notebooks with papermill and render each to HTML, never stopping at a failure.

    notebooks:   names (``01_baseline_profiling``, ``01``), paths, or None for every
                 ``notebooks/NN_*.ipynb``. All are validated before anything runs
                 (:class:`UnknownNotebookError` lists what exists).
    out:         report folder (default ``reports/<UTC timestamp>``).
    preset:      if given, passed as the ``preset`` parameter; otherwise the notebooks'
                 own default (``"auto"``: a tiny preset without a GPU) applies.
    parameters:  extra papermill parameters (``preset`` above wins over a ``preset`` key).
    kernel_name: Jupyter kernel; default: ``python3`` running in this interpreter.
    timeout:     per-cell execution limit in seconds (default: none).
    cwd:         working directory of the kernels; default: each notebook's own folder,
                 which is where JupyterLab starts its kernel too.
    workloads:   workload names: a notebook with a ``workload`` parameter runs once per workload
                 (reports ``<name>-<workload>.html``); None: once, with its own default.
    profile:     ``full`` (what the published reports run) or ``quick`` (each notebook's short parameters,
                 NotebookSpec.quick, under the given ones; rows into ``<out>/results-quick.csv`` unless
                 ``results_path`` is given, never into the published store).

    Each notebook that finishes leaves its time in ``notebook_times.csv`` beside its results file
    (wmbook.runtimes): the next run of it on this device says at its start how long it expects to take.

    Parameter names and values are checked first (``runconfig.notebook_parameters``): a refused
    batch raises ParameterError before anything is written or a kernel starts.

    Returns one :class:`NotebookRun` per notebook; writes ``index.html`` and
    ``summary.json`` into ``out`` after every notebook, so a killed run still leaves an index.
    """
    from .runconfig import _declared_parameters, notebook_parameters  # noqa: PLC0415  heavy: torch, workloads

    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0):
        raise ValueError(f"timeout={timeout!r} is not allowed; allowed values: None (no limit) or seconds > 0")
    paths = resolve_notebooks(notebooks)
    params: dict[str, Any] = dict(parameters or {})
    if preset is not None:
        params["preset"] = preset
    # names and values, the report folder and the kernel checked before anything is written or a kernel starts
    jobs = notebook_parameters(paths, params, workloads, profile)

    out_dir = check_output_dir(out if out is not None else default_out_dir(), "out").resolve()
    if profile == "quick" and "results_path" not in params:
        jobs = [(p, w, rp | {"results_path": str(out_dir / "results-quick.csv")}
                 if "results_path" in _declared_parameters(p) else rp) for p, w, rp in jobs]
    if kernel_name is not None:
        check_kernel(kernel_name)
    out_dir.mkdir(parents=True, exist_ok=True)

    names: list[str] = []
    runs: list[NotebookRun] = []
    declared: dict[Path, set] = {}
    for p, workload, run_params in jobs:
        name = p.stem if workload is None else f"{p.stem}-{workload}"
        if name in names:  # same stem from two folders: keep both reports
            name = f"{name}-{len(names)}"
        names.append(name)
        if "output_dir" not in run_params and "output_dir" in declared.setdefault(p, set(_declared_parameters(p))):
            # each run's artifacts (trace, video, session report) in its own folder of the report: no run overwrites
            # another's, and the report links them relatively
            run_params = run_params | {"output_dir": str(out_dir / "artifacts" / name)}
        runs.append(NotebookRun(name=name, source_path=str(p), parameters=run_params))

    meta: dict[str, Any] = {
        "started": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(),
        "python": sys.version.split()[0],
        "git_commit": git_commit() or None,
        "parameters": params,
        "kernel": kernel_name or "python3",
        "timeout_s": timeout,
        "profile": profile,
    }
    write_index(out_dir, runs, meta)

    t_all = time.perf_counter()
    bar = tqdm(runs, desc="notebooks", unit="nb", disable=not progress, file=sys.stderr)
    with kernel_for_this_python(kernel_name) as kname, runtimes.profile_env(profile):
        for run in bar:
            bar.set_postfix_str(run.name)
            kcwd = Path(cwd).resolve() if cwd is not None else Path(run.source_path).parent
            with host_load() as hl:  # other work on the host slows timings and compiles, not the GPU: recorded
                try:
                    _execute_one(run, out_dir, run.parameters, kname, timeout, progress, kcwd)
                except Exception as exc:  # runner bug or I/O error: record it, keep going
                    run.status, run.error = STATUS_FAILED, f"{type(exc).__name__}: {_one_line(str(exc))}"
                    if progress:
                        traceback.print_exc()
            run.host_load = (load := hl["load"]) and load.record()
            if run.ok:
                given = runtimes.given_params(run.source_path, run.parameters or {}, profile)
                runtimes.record_run((run.facts or {}).get("results", []), run.seconds, profile, given, host=load)
            if progress:
                host = f"; {load.describe()}" if load is not None else ""
                bar.write(f"{run.name}: ok ({run.seconds:.1f} s{host})" if run.ok else run.failure_summary(),
                          file=sys.stderr)
            meta["elapsed_s"] = round(time.perf_counter() - t_all, 2)
            write_index(out_dir, runs, meta)
    bar.close()
    # once every report exists, links between notebooks point at the reports of this folder (01 -> 02 and so on)
    for run in runs:
        if run.executed_path and run.html_path:
            try:
                render_html(run.executed_path, run.html_path, artifacts=out_dir / "artifacts" / run.name)
            except Exception:  # noqa: BLE001  (the first rendering stands)
                pass
    meta["finished"] = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    meta["elapsed_s"] = round(time.perf_counter() - t_all, 2)
    write_index(out_dir, runs, meta)
    return runs

