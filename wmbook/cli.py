"""``wmbook`` command line: ``wmbook run ...`` (see :mod:`wmbook.run`), ``wmbook list`` and ``wmbook aggregate``."""

from __future__ import annotations

import sys
from typing import Sequence

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

example:
  wmbook run --preset tiny --out reports/x -p num_blocks 2
"""


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE, end="")
        return 0 if argv else 2
    if argv[0] in ("--version", "-V"):
        from wmbook import __version__

        print(f"wmbook {__version__}")
        return 0
    command, rest = argv[0], argv[1:]
    if command == "run":
        from wmbook.run import main as run_main

        return run_main(rest, prog="wmbook run")
    if command == "list":
        from wmbook.run import main as run_main

        return run_main(["--list", *rest], prog="wmbook list")
    if command == "aggregate":
        return aggregate_main(rest)
    print(f"wmbook: unknown command {command!r}\n\n{USAGE}", file=sys.stderr, end="")
    return 2


def aggregate_main(argv: Sequence[str]) -> int:
    """``wmbook aggregate PATH [PATH ...] [--session NAME] [--output FILE | --output-dir DIR] [--no-html]``:
    print each session's aggregation summary, write JSON + HTML."""
    import argparse

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
    from wmbook.profiling.aggregate import aggregate_sessions

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


if __name__ == "__main__":
    sys.exit(main())
