"""Monitor timelines as figures: one panel per unit of tidy samples, drawn onto a matplotlib figure, and PNG bytes
of a fresh figure (reports, live views). matplotlib is imported only when a figure is drawn."""

from __future__ import annotations

import base64
import io

import pandas as pd

SAMPLE_COLUMNS = ["time_s", "metric", "value", "device"]  # the tidy samples of ResourceMonitor.samples()


_PANELS = [  # (title, unit, metrics)
    ("memory", "MiB", ("gpu_memory_used_mib", "system_memory_used_mib", "process_rss_mib")),
    ("utilisation", "%", ("gpu_utilization_pct", "gpu_memory_utilization_pct", "cpu_percent")),
    ("temperature", "degC", ("gpu_temperature_c",)),
    ("power", "W", ("gpu_power_w",)),
    ("clocks", "MHz", ("gpu_sm_clock_mhz", "gpu_memory_clock_mhz")),
]


def samples_frame(samples) -> pd.DataFrame:
    """A tidy samples DataFrame from monitor.samples() or a report's {metric: {time_s, value, device}}."""
    if isinstance(samples, pd.DataFrame):
        return samples
    rows = [(t, m, v, s.get("device", "")) for m, s in (samples or {}).items()
            for t, v in zip(s["time_s"], s["value"])]
    return pd.DataFrame(rows, columns=SAMPLE_COLUMNS)


def draw_timelines(fig, samples, metrics=None, last_s: float | None = None) -> None:
    """Draw one panel per unit of `samples` (tidy DataFrame) onto `fig`; `last_s` keeps only the recent window."""
    df = samples_frame(samples)
    if metrics is not None:
        df = df[df["metric"].isin(list(metrics))]
    if last_s is not None and len(df):
        df = df[df["time_s"] >= df["time_s"].max() - last_s]
    present = set(df["metric"])
    panels = [(t, u, [m for m in ms if m in present]) for t, u, ms in _PANELS]
    panels = [p for p in panels if p[2]]
    if not panels:
        ax = fig.add_subplot(1, 1, 1)
        ax.text(0.5, 0.5, "no monitor samples", ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
        return
    axes = fig.subplots(len(panels), 1, sharex=True, squeeze=False)[:, 0]
    for ax, (title, unit, ms) in zip(axes, panels):
        for m in ms:
            s = df[df["metric"] == m]
            ax.plot(s["time_s"], s["value"], label=m, lw=1.2)
        ax.set_ylabel(unit)
        ax.set_title(title, fontsize=9, loc="left")
        ax.legend(fontsize=7, loc="upper left")
        ax.grid(alpha=0.3)
    axes[-1].set_xlabel("time since monitor start, s (host clock)")
    fig.tight_layout()


def figure_png(draw, figsize=(9, 5), dpi: int = 90) -> bytes:
    """PNG bytes of a fresh (non-pyplot, thread-safe) figure filled by draw(fig)."""
    from matplotlib.figure import Figure  # noqa: PLC0415  heavy: matplotlib, only to draw

    fig = Figure(figsize=figsize, dpi=dpi)
    draw(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def png_base64(png: bytes) -> str:
    return base64.b64encode(png).decode("ascii")
