"""What the commands refuse, and how they say it: an InputError names the input, what is wrong with it and what is
allowed; `command` turns it, and a file that cannot be read or written, into one line on stderr and exit code 2 (an
interrupt: one line and 130), so a traceback means a bug in wmbook, never a bad input."""

from __future__ import annotations

import functools
import math
import numbers
import sys


class InputError(ValueError):
    """A bad input, refused before any work with a message naming it and the allowed values. A ValueError, so code
    that catches ValueError around a check keeps working."""


def number_range(lo: float, hi: float = math.inf) -> str:
    """'a finite number >= 1.0' / 'a finite number in [0.0, 1.0]': how a message states an allowed range (never
    'in [1.0, inf]', which reads as if inf were allowed)."""
    return f"a finite number >= {lo}" if hi == math.inf else f"a finite number in [{lo}, {hi}]"


def number_error(name: str, v, lo: float, hi: float = math.inf) -> str | None:
    """Why `v` is not a finite number in [lo, hi] (None when it is): non-finite values named as such."""
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        return f"{name}={v!r} is not allowed: not a number; allowed values: {number_range(lo, hi)}"
    if not math.isfinite(v):
        return f"{name}={v!r} is not allowed: it is not finite; allowed values: {number_range(lo, hi)}"
    if not lo <= v <= hi:
        return f"{name}={v!r} is not allowed; allowed values: {number_range(lo, hi)}"
    return None


EXIT_INPUT = 2  # argparse's own exit code for a bad command line: the same for every refused input
EXIT_INTERRUPTED = 130  # what a shell reports for a process ended by SIGINT


def describe_os_error(e: OSError) -> str:
    """The file an OSError names, then why ("'x/y.csv': No space left on device")."""
    name = e.filename if e.filename is not None else ""
    what = e.strerror or type(e).__name__
    return f"{name!r}: {what}" if name else str(e) or what


def command(prog: str):
    """Decorate a command's `main(argv) -> int`: an InputError or an OSError prints `prog: error: ...` and returns 2;
    Ctrl-C prints that the command was interrupted and returns 130 (every write wmbook makes is atomic, so nothing
    already written was changed). Anything else is a bug and keeps its traceback."""

    def wrap(main):
        @functools.wraps(main)
        def run(*args, **kwargs) -> int:
            try:
                return main(*args, **kwargs)
            except InputError as e:
                print(f"{prog}: error: {e}", file=sys.stderr)
                return EXIT_INPUT
            except OSError as e:
                print(f"{prog}: error: {describe_os_error(e)}", file=sys.stderr)
                return EXIT_INPUT
            except KeyboardInterrupt:
                print(f"{prog}: interrupted; files already written are unchanged", file=sys.stderr)
                return EXIT_INTERRUPTED

        return run

    return wrap
