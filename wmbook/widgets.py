"""Widgets that degrade to a static figure or table in headless (papermill / HTML) runs, and the filter that drops
console status lines from a cell's output: a frame comparer, the live GPU/CPU monitor view, a variant-stack picker.
Notebooks reach them through wmbook.display (`wd.frame_comparer(...)`)."""

from __future__ import annotations

import math
import re
import sys
import textwrap
import threading
from typing import Sequence

import numpy as np

from .check import frame_psnr as _psnr
from .check import to_uint8_frames
from .frontend import headless, num

# --------------------------------------------------------------------------- widgets with static fallbacks


def frame_psnr(ref, other) -> "list[float]":
    """PSNR (dB) of each frame of `other` against `ref`, on the uint8 frames shown (wmbook.check.frame_psnr)."""
    return [float(x) for x in _psnr(ref, other)]


def _panel_title(text: str) -> str:
    """A panel's title wrapped to its third of the figure's width (a long variant name would run into the next)."""
    return textwrap.fill(text, 34)


def _compare_figure(a, b, i: int, labels: Sequence[str], gain: float):
    import matplotlib.pyplot as plt  # noqa: PLC0415  heavy: matplotlib.pyplot

    diff = np.clip(np.abs(a[i].astype(np.int16) - b[i].astype(np.int16)).max(axis=-1) * gain, 0, 255)
    fig, axes = plt.subplots(1, 3, figsize=(11, 3.6))
    for ax, img, title in zip(axes, (a[i], b[i], diff), (*labels, f"|difference| x{gain:g}")):
        ax.imshow(img, cmap="magma" if img.ndim == 2 else None, vmin=0, vmax=255)
        ax.set_title(_panel_title(title), fontsize=9)
        ax.set_axis_off()
    return fig


def frame_comparer(ref, other, labels: Sequence[str] = ("reference", "optimized"), gain: float = 8.0,
                   static_frames: int = 3, interactive: bool | None = None):
    """Step through two videos frame by frame: both frames and their amplified difference, with per-frame PSNR.

    Interactive (ipywidgets slider) in a notebook frontend; in headless runs (wmbook.run, or interactive=False) a
    static figure of `static_frames` frames (first, middle, last) and the PSNR of every frame."""
    import matplotlib.pyplot as plt  # noqa: PLC0415  heavy: matplotlib.pyplot
    from IPython.display import display  # noqa: PLC0415  optional: IPython

    a, b = to_uint8_frames(ref), to_uint8_frames(other)
    if a.shape != b.shape:
        raise ValueError(f"the two videos differ in shape: {labels[0]} {a.shape} vs {labels[1]} {b.shape}")
    if len(labels) != 2:
        raise ValueError(f"labels must name the two videos, got {labels!r}")
    psnr = frame_psnr(a, b)
    interactive = (not headless()) if interactive is None else interactive
    if interactive:
        try:
            import ipywidgets as w  # noqa: PLC0415  optional: ipywidgets

            out = w.Output()
            slider = w.IntSlider(value=0, min=0, max=len(a) - 1, description="frame", continuous_update=False)
            info = w.HTML()

            def show(change=None):
                i = slider.value
                info.value = f"frame {i} of {len(a)}: PSNR {num(psnr[i])} dB"
                with out:
                    out.clear_output(wait=True)
                    fig = _compare_figure(a, b, i, labels, gain)
                    plt.show()
                    plt.close(fig)

            slider.observe(show, names="value")
            show()
            display(w.VBox([w.HBox([slider, info]), out]))
            return
        except ImportError:
            pass
    picks = sorted({0, len(a) // 2, len(a) - 1})[:static_frames]
    # small: three frames and the PSNR curve are what a report needs (the slider in JupyterLab shows every frame)
    fig, axes = plt.subplots(len(picks) + 1, 3, figsize=(7.5, 2.2 * len(picks) + 1.6),
                             gridspec_kw={"height_ratios": [3] * len(picks) + [1.6]})
    axes = np.atleast_2d(axes)
    for row, i in zip(axes, picks):
        diff = np.clip(np.abs(a[i].astype(np.int16) - b[i].astype(np.int16)).max(axis=-1) * gain, 0, 255)
        for ax, img, title in zip(row, (a[i], b[i], diff), (*labels, f"|difference| x{gain:g}")):
            ax.imshow(img, cmap="magma" if img.ndim == 2 else None, vmin=0, vmax=255)
            extra = f" ({num(psnr[i])} dB)" if title.startswith("|") else ""
            ax.set_title(_panel_title(f"frame {i}: {title}{extra}"), fontsize=9)
            ax.set_axis_off()
    gs = axes[-1, 0].get_gridspec()
    for ax in axes[-1]:
        ax.remove()
    ax = fig.add_subplot(gs[-1, :])
    finite = [p if math.isfinite(p) else float("nan") for p in psnr]
    if any(math.isfinite(p) for p in psnr):
        from matplotlib.ticker import MaxNLocator  # noqa: PLC0415  heavy: matplotlib

        ax.plot(range(len(psnr)), finite, "o-", ms=3)
        ax.set_xlabel("frame")
        ax.set_ylabel("PSNR, dB")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_title(textwrap.fill(f"PSNR of {labels[1]} against {labels[0]}, every frame (identical frames: not "
                                   "drawn)", 110), fontsize=9)
    else:
        ax.set_axis_off()
        ax.text(0.5, 0.5, f"all {len(psnr)} frames identical (PSNR infinite)", ha="center", va="center")
    fig.tight_layout()
    plt.show()


def ladder_frames(lad) -> str:
    """A ladder's fp32 reference frames against its last judged row's (Ladder.frames), in a frame comparer; returns
    what was shown, or why nothing was."""
    if len(lad.frames) < 2:
        return "No frames to compare: no row after the reference decoded frames that were judged and passed."
    (_, ref), (label, other) = list(lad.frames.items())[:2]
    frame_comparer(ref, other, labels=("fp32 reference", f"{label.removeprefix('+ ')} (optimized)"))
    return f"The fp32 reference's frames against those of the last judged row, `{label}`."


def monitor_view(session_or_monitor, kind: str = "figure", interval: float = 1.0):
    """The GPU/CPU monitor of a ProfilingSession (or a ResourceMonitor) shown live while a cell runs (LiveView);
    headless, it only leaves its final static snapshot. Use as a context manager around the work."""
    from .profiling.liveview import LiveView  # noqa: PLC0415  heavy: the profiling package, monitor_view only

    mon = getattr(session_or_monitor, "monitor", session_or_monitor)
    if mon is None:
        raise ValueError("this session has no monitor (profiling disabled): nothing to show")
    return LiveView(mon, interval=interval, kind=kind, live=not headless())


def stack_picker(choices: Sequence[str], run, default: Sequence[str] = (), interactive: bool | None = None,
                 description: str = "variants", static=None):
    """Pick a variant stack and run it: `run(stack)` does the work (apply, gate, time) and displays its result.

    Interactive: a multi-select of `choices` (applied in the order listed) and a Run button, both disabled while a
    stack runs; headless (no frontend attached: wmbook.display.headless, or interactive=False) it calls `static()`
    when given (e.g. shows the measured row of that stack: a GPU report need
    not spend minutes repeating it), else runs `default` once, so the report shows what the picker shows."""
    from IPython.display import Markdown, display  # noqa: PLC0415  optional: IPython

    unknown = [c for c in default if c not in choices]
    if unknown:
        raise ValueError(f"default has {unknown}; allowed values: a subset of {list(choices)}")
    interactive = (not headless()) if interactive is None else interactive
    if interactive:
        try:
            import ipywidgets as w  # noqa: PLC0415  optional: ipywidgets

            sel = w.SelectMultiple(options=list(choices), value=tuple(default), rows=min(len(choices), 10),
                                   description=description, layout=w.Layout(width="60%"))
            button = w.Button(description="apply, gate, time", button_style="primary")
            out = w.Output()

            def go(_):
                stack = [c for c in choices if c in sel.value]  # the order of the list, not of the clicks
                # one trial at a time: a click while a stack compiles (minutes at real shapes) would queue another
                button.disabled, sel.disabled, label = True, True, button.description
                button.description = "working ..."
                try:
                    with out:
                        out.clear_output()
                        display(Markdown(f"Running `{' + '.join(stack) or 'fp32 eager'}` ..."))
                        run(stack)
                finally:
                    button.disabled, sel.disabled, button.description = False, False, label

            button.on_click(go)
            display(w.VBox([sel, button, out]))
            return
        except ImportError:
            pass
    display(Markdown(f"Headless run: the picker's default stack, `{' + '.join(default) or 'fp32 eager'}` "
                     f"(in JupyterLab, pick any subset and press the button)."))
    if static is not None:
        static()
    else:
        run(list(default))


# --------------------------------------------------------------------------- dropping console status lines


MONITOR_STATUS = r"^\[[^\]\n]*\s+\d+\.\ds\] "  # ResourceMonitor.status_line: "[name   12.3s] GPU ..."


class _LineFilter:
    """A text stream that passes everything to `target` except whole lines matching `pattern`."""

    def __init__(self, target, pattern: str):
        self.target, self.pattern = target, re.compile(pattern)
        self._buf = ""
        self._lock = threading.Lock()
        self.dropped = 0

    def write(self, s: str) -> int:
        with self._lock:
            self._buf += s
            *lines, self._buf = self._buf.split("\n")
            for line in lines:
                if self.pattern.search(line):
                    self.dropped += 1
                else:
                    self.target.write(line + "\n")
        return len(s)

    def flush(self) -> None:
        with self._lock:
            if self._buf and not self.pattern.search(self._buf):
                self.target.write(self._buf)
            self._buf = ""
        self.target.flush()

    def __getattr__(self, name):
        return getattr(self.target, name)


class drop_lines:
    """Context manager: lines printed to stdout (by any thread) that match `pattern` are left out, e.g. a profiling
    session's monitor status lines while monitor_view shows the same samples as a figure."""

    def __init__(self, pattern: str = MONITOR_STATUS):
        self.pattern = pattern
        self.filter = None

    def __enter__(self):

        self._old = sys.stdout
        self.filter = _LineFilter(self._old, self.pattern)
        sys.stdout = self.filter
        return self.filter

    def __exit__(self, *exc):

        try:
            self.filter.flush()
        finally:
            sys.stdout = self._old
        return False
