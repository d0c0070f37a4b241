"""``wmbook`` command line: ``wmbook run ...`` (see :mod:`wmbook.run`), ``wmbook list`` and ``wmbook aggregate``."""

from __future__ import annotations

import sys
from typing import Sequence

USAGE = """usage: wmbook <command> [options]

commands:
  run    execute notebooks with papermill and render an HTML report
         (wmbook run --help for options)
  list   list the workbook's notebooks
  aggregate DIR [--output FILE] [--no-html]
         merge the per-rank profiling session reports in DIR (min/max/mean over ranks,
         slowest rank) and write FILE (default DIR/<session>_aggregate.json) and its .html

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
    """``wmbook aggregate DIR [--output FILE] [--no-html]``: print the aggregation summary, write JSON + HTML."""
    import argparse

    ap = argparse.ArgumentParser(prog="wmbook aggregate",
                                 description="Merge per-rank profiling session reports of one session.")
    ap.add_argument("dir", help="folder holding the per-rank session reports (*.json)")
    ap.add_argument("--output", "-o", default=None, help="aggregate JSON path (default DIR/<session>_aggregate.json)")
    ap.add_argument("--no-html", action="store_true", help="skip the HTML page")
    a = ap.parse_args(list(argv))
    from wmbook.profiling.aggregate import aggregate_reports

    try:
        agg = aggregate_reports(a.dir, output=a.output, html=not a.no_html)
    except ValueError as e:
        print(f"wmbook aggregate: error: {e}", file=sys.stderr)
        return 2
    print(agg.text())
    print("\nWrote: " + ", ".join(str(p) for p in agg.paths.values()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
