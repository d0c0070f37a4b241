"""``wmbook`` command line: ``wmbook run ...`` (see :mod:`wmbook.run`) and ``wmbook list``."""

from __future__ import annotations

import sys
from typing import Sequence

USAGE = """usage: wmbook <command> [options]

commands:
  run    execute notebooks with papermill and render an HTML report
         (wmbook run --help for options)
  list   list the workbook's notebooks

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
    print(f"wmbook: unknown command {command!r}\n\n{USAGE}", file=sys.stderr, end="")
    return 2


if __name__ == "__main__":
    sys.exit(main())
