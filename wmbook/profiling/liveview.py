"""A monitor shown live in a notebook while a cell runs (ipywidgets), with a static snapshot at the end."""

from __future__ import annotations

import threading

from .monitor import ResourceMonitor
from .timelines import draw_timelines, figure_png, png_base64


def _ipython_kernel():
    """The running IPython kernel shell, or None (plain Python, terminal IPython)."""
    try:
        from IPython import get_ipython  # noqa: PLC0415  optional: IPython
    except ImportError:
        return None
    ip = get_ipython()
    return ip if ip is not None and getattr(ip, "kernel", None) is not None else None


class LiveView:
    """A refreshing ipywidgets Output showing a monitor's recent timelines or summary while a cell runs.

    Without a notebook kernel (plain Python), without ipywidgets or with live=False (headless runs: a widget would
    be an empty box in the HTML report), nothing refreshes; in every case `stop()` leaves one static final snapshot
    (so papermill / nbconvert outputs keep it).
    """

    def __init__(self, monitor: ResourceMonitor, interval: float = 1.0, kind: str = "figure", window_s: float = 60.0,
                 final: bool = True, figsize=(8, 3.5), live: bool = True):
        if not isinstance(monitor, ResourceMonitor):
            raise ValueError(f"monitor must be a ResourceMonitor, got {type(monitor).__name__}")
        if isinstance(interval, bool) or not isinstance(interval, (int, float)) or not interval >= 0.1:
            raise ValueError(f"interval must be a number of seconds >= 0.1, got {interval!r}")
        if kind not in ("figure", "table"):
            raise ValueError(f"kind must be 'figure' or 'table', got {kind!r}")
        self.monitor, self.interval, self.kind = monitor, float(interval), kind
        self.window_s, self.final, self.figsize = window_s, final, figsize
        self.refreshes = 0
        self.errors: list[str] = []
        self._widget = None
        self._handle = None
        self._thread = None
        self._stop = threading.Event()
        self.reason = None  # why there is no live widget
        if not live:
            self.reason = "live=False (headless run)"
        elif _ipython_kernel() is None:
            self.reason = "no notebook kernel"
        else:
            try:
                import ipywidgets  # noqa: PLC0415  optional: ipywidgets
                from IPython.display import display  # noqa: PLC0415  optional: IPython

                self._widget = ipywidgets.Output()
                self._handle = display(self._widget, display_id=True)  # stop() replaces it with a static snapshot
            except Exception as e:  # ipywidgets missing or no comm support: static output only
                self.reason = f"no widget support: {type(e).__name__}: {e}"
                self._widget = None

    @property
    def live(self) -> bool:
        return self._widget is not None

    def _bundle(self) -> dict:
        """The current view as a Jupyter display_data mime bundle."""
        if self.kind == "table":
            df = self.monitor.summary()[["metric", "unit", "last", "mean", "max"]]
            return {"text/plain": df.to_string(index=False), "text/html": df.to_html(index=False, float_format="%.1f")}
        png = figure_png(lambda fig: draw_timelines(fig, self.monitor.samples(), last_s=self.window_s),
                         figsize=self.figsize)
        return {"text/plain": self.monitor.status_line(), "image/png": png_base64(png)}

    def refresh(self) -> None:
        """Redraw once (called by the refresh thread; safe to call by hand)."""
        if self._widget is None:
            return
        try:
            data = self._bundle()
            self._widget.outputs = ({"output_type": "display_data", "data": data, "metadata": {}},)
            self.refreshes += 1
        except Exception as e:
            self.errors.append(f"{type(e).__name__}: {e}")

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.refresh()

    def start(self) -> "LiveView":
        if self._widget is not None and self._thread is None:
            self._stop.clear()
            self.refresh()
            self._thread = threading.Thread(target=self._run, name="wmbook-live-view", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stop refreshing and leave a static final snapshot (figure or table)."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=10.0)
            self._thread = None
        if self._widget is not None:
            try:
                self._widget.outputs = ()
                self._widget.close()
            except Exception as e:
                self.errors.append(f"{type(e).__name__}: {e}")
            self._widget = None
            self.reason = "stopped"
        if not self.final:
            return
        if _ipython_kernel() is not None:
            from IPython.display import Image, display  # noqa: PLC0415  optional: IPython

            if self.kind == "figure":
                obj = Image(data=figure_png(lambda fig: draw_timelines(fig, self.monitor.samples()),
                                            figsize=self.figsize))
            else:
                obj = self.monitor.summary()
            if self._handle is not None:
                self._handle.update(obj)  # in place of the live widget
            else:
                display(obj)
        else:
            print(self.monitor.summary().to_string(index=False))
        self.final = False  # once

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
        return False


def live_view(monitor, interval: float = 1.0, kind: str = "figure", window_s: float = 60.0,
              final: bool = True) -> LiveView:
    """Show `monitor` (a ResourceMonitor or a ProfilingSession) live in the notebook; use as a context manager.

    kind: "figure" (timelines of the last window_s seconds) or "table" (last/mean/max per metric).
    Degrades to one static snapshot at the end when there is no notebook frontend (papermill, scripts).
    """
    mon = getattr(monitor, "monitor", monitor)
    if mon is None:
        raise ValueError("this session has no monitor (profiling disabled)")
    return LiveView(mon, interval=interval, kind=kind, window_s=window_s, final=final).start()
