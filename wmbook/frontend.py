"""What both the tables (wmbook.display) and the widgets (wmbook.widgets) need: how a number is written and whether
a frontend is attached to show live widgets."""

from __future__ import annotations

import math
import os

__all__ = ["HEADLESS_ENV", "headless", "headless_start", "num"]

HEADLESS_ENV = "WMBOOK_HEADLESS"  # set by wmbook.run for the kernels it starts: no live widgets ("0": live)


def num(x, digits: int = 3) -> str:
    """A number with `digits` significant digits, thousands separators, no scientific notation between 1e-3 and
    1e15; '' for None/NaN, 'inf' for infinities, ints and bools as they are."""
    if x is None:
        return ""
    if isinstance(x, bool):
        return str(x)
    if isinstance(x, int) or type(x).__name__.startswith(("int", "uint")):
        return f"{int(x):,}"
    try:
        v = float(x)
    except (TypeError, ValueError):
        return str(x)
    if math.isnan(v):
        return ""
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    if v == 0:
        return "0"
    a = abs(v)
    if a < 1e-3:
        return f"{v:.{max(digits - 1, 0)}e}"
    if a >= 10 ** (digits - 1) and a < 1e15:
        return f"{v:,.0f}"
    decimals = max(digits - 1 - math.floor(math.log10(a)), 0)
    return f"{v:,.{decimals}f}"


def headless_start() -> None:
    """Run at the start of a headless kernel (wmbook.run): tqdm.auto gives the text bar, which TQDM_DISABLE (set by
    the runner) turns off; the widget bar would be an empty box in the HTML report and ignores TQDM_DISABLE."""
    if not headless():
        return
    try:
        import tqdm.auto  # noqa: PLC0415  optional: tqdm
        import tqdm.autonotebook  # noqa: PLC0415  optional: tqdm
        import tqdm.std  # noqa: PLC0415  optional: tqdm
    except ImportError:
        return
    for mod in (tqdm.auto, tqdm.autonotebook):
        mod.tqdm, mod.trange = tqdm.std.tqdm, tqdm.std.trange


def headless() -> bool:
    """True when no frontend is attached to show widgets, so views are static: a kernel started by wmbook.run
    (WMBOOK_HEADLESS), plain papermill or nbconvert (nbclient executes with stdin closed; JupyterLab, Notebook and
    VS Code allow it), or no IPython kernel at all (a script). WMBOOK_HEADLESS=0 forces live widgets."""
    env = os.environ.get(HEADLESS_ENV, "")
    if env:
        return env != "0"
    try:
        from IPython import get_ipython  # noqa: PLC0415  optional: IPython
    except ImportError:
        return True
    kernel = getattr(get_ipython(), "kernel", None)
    if kernel is None:
        return True
    # ipykernel records, per execute request, whether the client can answer input(): a frontend that shows the
    # notebook can, a batch executor cannot
    return not bool(getattr(kernel, "_allow_stdin", True))
