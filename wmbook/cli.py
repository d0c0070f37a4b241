"""``wmbook`` command line: ``wmbook run ...`` (see :mod:`wmbook.run`), ``wmbook list``, ``wmbook aggregate``,
``wmbook results check``."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any, Sequence

from wmbook import __version__

from .errors import InputError, command

USAGE = """usage: wmbook <command> [options]

commands:
  run    execute notebooks with papermill and render an HTML report
         (wmbook run --help for options)
  list   list the workbook's notebooks
  aggregate PATH [PATH ...] [--session NAME] [--output FILE | --output-dir DIR] [--no-html]
         merge per-rank profiling session reports (JSON files and/or folders of them;
         min/max/mean over ranks, slowest rank), each session separately, and write
         <session>_aggregate.json and its .html to DIR (default ./profiling_reports/aggregate)
         or, for one session, to FILE
  results check [PATH ...]
         check results stores (default: the committed data/results/results.csv, or $WMBOOK_RESULTS):
         every row whole, of the header's width, numbers where numbers belong, no row of the
         last commit lost; exit 2 naming the lines when one fails
  results seal DEVICE [PATH]
         move a closed device's rows (e.g. H100) into the store's sealed part beside it
         (results.h100.csv), which every read and check takes with the store

  regenerate --out DIR [--publish FOLDER] [--gpus N] [--time-limit MIN] [--notebooks ...] [--workloads ...] [--plan]
             [--merge PART ...]
         the published set: every notebook for every workload, one queue per GPU, at one
         commit; fits a time limit and resumes a cut set; publishes only a complete one (--help)

example:
  wmbook run --preset tiny --out reports/x -p num_blocks 2
"""


def _interruptible() -> None:
    """Ctrl-C (SIGINT) stops a command started in the background of a script too. A non-interactive shell starts an
    asynchronous command with SIGINT ignored (POSIX) and Python keeps it ignored, so `regenerate` started that way
    (tools/gpu_set.sh) could not be stopped as Ctrl-C stops it, and the runs it stopped at its time limit ignored the
    signal until they were killed, without ending their notebooks' kernels."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def main(argv: Sequence[str] | None = None) -> int:
    if argv is None:  # a process of its own (the console script, python -m wmbook), not a call from Python
        _interruptible()
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE, end="")
        return 0 if argv else 2
    if argv[0] in ("--version", "-V"):
        print(f"wmbook {__version__}")
        return 0
    command, rest = argv[0], argv[1:]
    if command == "run":
        return run_main(rest, prog="wmbook run")
    if command == "list":
        return run_main(["--list", *rest], prog="wmbook list")
    if command == "aggregate":
        return aggregate_main(rest)
    if command == "results":
        return results_main(rest)
    if command == "regenerate":
        from .regenerate import main as regenerate_main  # noqa: PLC0415  heavy: torch, the studies

        return regenerate_main(rest)
    print(f"wmbook: unknown command {command!r}\n\n{USAGE}", file=sys.stderr, end="")
    return 2


@command("wmbook aggregate")
def aggregate_main(argv: Sequence[str]) -> int:
    """``wmbook aggregate PATH [PATH ...] [--session NAME] [--output FILE | --output-dir DIR] [--no-html]``:
    print each session's aggregation summary, write JSON + HTML."""
    ap = argparse.ArgumentParser(prog="wmbook aggregate",
                                 description="Merge per-rank profiling session reports; each session separately.")
    ap.add_argument("paths", nargs="+", metavar="PATH",
                    help="a session report (*.json) or a folder holding them; several may be given")
    ap.add_argument("--session", "-s", default=None, metavar="NAME",
                    help="aggregate only this session (default: every session found)")
    out = ap.add_mutually_exclusive_group()
    out.add_argument("--output", "-o", default=None, metavar="FILE",
                     help="aggregate JSON path; only with one session (found or picked with --session)")
    out.add_argument("--output-dir", "-d", default=None, metavar="DIR",
                     help="folder for <session>_aggregate.json (+ .html) (default ./profiling_reports/aggregate)")
    ap.add_argument("--no-html", action="store_true", help="skip the HTML page")
    a = ap.parse_args(list(argv))
    from wmbook.profiling.aggregate import aggregate_sessions  # noqa: PLC0415  heavy: torch, pandas

    try:
        aggs = aggregate_sessions(a.paths, session=a.session, output=a.output, output_dir=a.output_dir,
                                  html=not a.no_html)
    except ValueError as e:
        print(f"wmbook aggregate: error: {e}", file=sys.stderr)
        return 2
    for i, agg in enumerate(aggs.values()):
        if i:
            print()
        print(agg.text())
    print()
    for name, agg in aggs.items():
        print(f"Wrote ({name}): " + ", ".join(str(p) for p in agg.paths.values()))
    return 0


@command("wmbook results")
def results_main(argv: Sequence[str]) -> int:
    """``wmbook results check [PATH ...]``: each store's rows and runs when it is sound; its problems, line by line,
    and exit 2 when it is not (wmbook.results.check). ``wmbook results seal DEVICE [PATH]``: a device's rows moved
    into the store's sealed part (wmbook.results.seal)."""
    ap = argparse.ArgumentParser(prog="wmbook results", description="Check results stores (wmbook.results.check); "
                                 "seal a closed device's rows into a part of the store (wmbook.results.seal).")
    sub = ap.add_subparsers(dest="action", required=True, metavar="{check,seal}")
    chk = sub.add_parser("check", help="check stores and their sealed parts: every row whole and well formed, "
                         "nothing committed lost")
    chk.add_argument("paths", nargs="*", metavar="PATH",
                     help="results CSV files (default: $WMBOOK_RESULTS, else data/results/results.csv)")
    seal = sub.add_parser("seal", help="move the rows of a device whose record is closed (e.g. H100) into the "
                          "store's part <stem>.<device>.csv, read and checked with it, never appended to")
    seal.add_argument("device", help="part of the device name, e.g. H100")
    seal.add_argument("path", nargs="?", default=None, help="the store (default: as for check)")
    a = ap.parse_args(list(argv))
    from . import results  # noqa: PLC0415  heavy: torch, pandas

    if a.action == "seal":
        part, n = results.seal(a.device, a.path)
        print(f"{n} rows moved to {part} (read and checked with the store)")
        return 0
    failed = False
    for path in [Path(p) for p in a.paths] or [results.default_path()]:
        if not path.is_file():
            why = "it is a folder" if path.exists() else "no such file"
            print(f"wmbook results: error: {str(path)!r} is not allowed: {why}; allowed values: a results CSV file",
                  file=sys.stderr)
            failed = True
            continue
        found = results.check(path)
        if found:
            failed = True
            print(f"{path}: fails its check ({len(found)} problem(s)):", file=sys.stderr)
            for line in found:
                print(f"  {line}", file=sys.stderr)
            continue
        df = results.read(path)
        print(f"{path}: ok, {len(df)} rows of {df['run_id'].nunique()} runs")
    return 2 if failed else 0


def _yaml_scalar(text: str) -> Any:
    import yaml  # noqa: PLC0415  heavy: yaml (~20 ms), -p/-f only: --help stays fast

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def load_parameters_file(path) -> dict[str, Any]:
    """The mapping of a `-f` YAML file, every key a parameter name given once: a file that is missing, not UTF-8, not
    YAML, not a mapping, or that repeats a key (where YAML would silently keep the last) or has a key that is not a
    name raises InputError naming the file, the line and what is allowed."""
    import yaml  # noqa: PLC0415  heavy: yaml

    path = Path(path)
    allowed = "a UTF-8 YAML file with one mapping of parameter names to values, each name once"

    def refuse(why: str) -> InputError:
        return InputError(f"-f {str(path)!r} is not allowed: {why}; allowed values: {allowed}")

    if not path.is_file():
        raise refuse("it is a folder" if path.is_dir() else "no such file")
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise refuse(f"bytes at offset {e.start} are not UTF-8") from None

    class Loader(yaml.SafeLoader):
        """SafeLoader whose mappings refuse repeated and non-name keys."""

    def mapping(loader, node, deep=False):
        seen: dict[str, int] = {}
        for key_node, _ in node.value:
            key, line = loader.construct_object(key_node, deep=True), key_node.start_mark.line + 1
            if not isinstance(key, str) or not key.isidentifier():
                raise refuse(f"line {line}: key {key!r} is not a parameter name (a Python identifier)")
            if key in seen:
                raise refuse(f"line {line}: key {key!r} is given again (first on line {seen[key]})")
            seen[key] = line
        return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)

    Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, mapping)
    try:
        loaded = yaml.load(text, Loader=Loader)
    except yaml.YAMLError as e:
        raise refuse(f"it is not valid YAML ({' '.join(str(e).split())})") from None
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise refuse(f"it holds a {type(loaded).__name__}, not a mapping")
    return loaded


def _workload_list(text: str | None) -> list[str] | None:
    if text is None:
        return None
    if text.strip() == "all":
        from . import workloads  # noqa: PLC0415  heavy: torch

        return workloads.names()
    return [w.strip() for w in text.split(",") if w.strip()]


def _positive_seconds(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        v = float("nan")
    if not v > 0 or v == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not allowed; allowed values: seconds > 0")
    return v


def build_run_parser(prog: str = "wmbook run") -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog=prog,
        description="Execute workbook notebooks with papermill and render an HTML report "
        "(index.html, per-notebook HTML, executed .ipynb, summary.json).",
    )
    ap.add_argument(
        "notebooks",
        nargs="*",
        metavar="NOTEBOOK",
        help="notebook name (01_baseline_profiling), number (01) or .ipynb path; "
        "default: every notebooks/NN_*.ipynb",
    )
    ap.add_argument("--preset", help="preset passed to every notebook (default: the notebooks "
                    "choose: real shapes on a GPU, tiny ones on a CPU)")
    ap.add_argument("--out", "-o", help="report folder (default: reports/<UTC timestamp>)")
    ap.add_argument(
        "-p",
        "--parameter",
        nargs=2,
        action="append",
        default=[],
        metavar=("NAME", "VALUE"),
        help="notebook parameter; VALUE is parsed as a YAML scalar (2 -> int, true -> bool). "
        "Repeatable.",
    )
    ap.add_argument("-f", "--parameters-file", metavar="FILE",
                    help="YAML file with a mapping of parameters (-p wins over it)")
    ap.add_argument("--workload", metavar="NAMES", help="comma-separated workloads, or 'all': a notebook with a "
                    "workload parameter runs once per workload (default: the notebooks' own default)")
    ap.add_argument("--profile", choices=("full", "quick"), default="full",
                    help="full: what the published reports run; quick: each notebook's short parameters (fewer "
                    "repeats, the costliest optional tables off) under the -p ones, its rows into "
                    "<out>/results-quick.csv, never the published store")
    ap.add_argument("--compile-cache", metavar="DIR",
                    help="keep inductor's and Triton's compile caches in DIR across runs (a later run of the same "
                    "models compiles from them); the compile table's cold times use an empty cache of their own")
    ap.add_argument("--kernel", help="Jupyter kernel name (default: python3 of this interpreter)")
    ap.add_argument("--timeout", type=_positive_seconds,
                    help="per-cell execution limit in seconds (> 0; default: none)")
    ap.add_argument("--list", action="store_true", help="list the notebooks and exit")
    ap.add_argument("-q", "--quiet", action="store_true", help="no progress bars")
    return ap


def run_main(argv: Sequence[str] | None = None, prog: str = "wmbook run") -> int:
    return command(prog)(_run_main)(argv, prog)


def _run_main(argv: Sequence[str] | None = None, prog: str = "wmbook run") -> int:
    """``wmbook run ...``: parse, check, execute (wmbook.run.run_notebooks), print where the report is."""
    from . import run as _run  # noqa: PLC0415  heavy: wmbook.run (~0.15 s)
    from .run import (  # noqa: PLC0415  heavy: wmbook.run
        NOTEBOOK_GLOB,
        UnknownNotebookError,
        default_out_dir,
        discover_notebooks,
        notebooks_dir,
        resolve_notebooks,
    )

    ap = build_run_parser(prog)
    args = ap.parse_args(argv)

    if args.list:
        for p in discover_notebooks():
            print(p.stem)
        return 0

    params: dict[str, Any] = {}
    if args.parameters_file:
        try:
            params.update(load_parameters_file(args.parameters_file))
        except InputError as exc:
            print(f"{prog}: error: {exc}", file=sys.stderr)
            return 2
    for name, value in args.parameter:
        if not name.isidentifier():
            ap.error(f"parameter name {name!r} is not a Python identifier")
        params[name] = _yaml_scalar(value)

    try:
        paths = resolve_notebooks(args.notebooks or None)
    except UnknownNotebookError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    if not paths:
        print(
            f"{prog}: error: no notebooks matching {NOTEBOOK_GLOB} in {notebooks_dir()}",
            file=sys.stderr,
        )
        return 2

    out = Path(args.out) if args.out else default_out_dir()
    if args.compile_cache:
        try:
            from .paths import check_output_dir  # noqa: PLC0415
            from .runtimes import compile_cache_env  # noqa: PLC0415

            cache = check_output_dir(args.compile_cache, "compile-cache").resolve()
        except InputError as exc:
            print(f"{prog}: error: {exc}", file=sys.stderr)
            return 2
        os.environ.update(compile_cache_env(cache))
    try:
        runs = _run.run_notebooks(
            paths,
            out=out,
            preset=args.preset,
            parameters=params,
            kernel_name=args.kernel,
            timeout=args.timeout,
            progress=not args.quiet,
            workloads=_workload_list(args.workload),
            profile=args.profile,
        )
    except InputError as exc:  # a parameter, the report folder, the kernel: refused before anything was written
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        # Ctrl-C reaches the kernel too: its cell may still fail inside nbclient's abandoned task, which asyncio
        # would report at exit as "Task exception was never retrieved" with a traceback; this line says it all
        logging.getLogger("asyncio").disabled = True
        print(f"{prog}: interrupted; the reports finished before it are in {out}", file=sys.stderr)
        return 130
    failed = [r for r in runs if not r.ok]
    index = out.resolve() / "index.html"
    print(f"{len(runs) - len(failed)}/{len(runs)} notebooks ok; report: {index}")
    if failed:
        print(f"\n{len(failed)} notebook(s) failed:", file=sys.stderr)
        for r in failed:
            print(r.failure_summary(), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
