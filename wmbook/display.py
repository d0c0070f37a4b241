"""What the notebooks show, and how: formatted tables, an appendix for wide raw frames, embedded artifacts,
quiet output and widgets that degrade to a static table or figure in headless (papermill / HTML) runs.

    from wmbook import display as wd
    wd.setup()                                   # once, at the top of a notebook
    wd.table(df, caption="Ladder")               # units in headers, 3 significant digits, spread beside the median
    wd.appendix(raw_df, "every ladder column")   # shown in full at the end (wd.show_appendix())
    wd.show_video(path)                          # an animated GIF embedded (nbconvert drops image/gif outputs)
    wd.link(path)                                # a link the report renderer makes relative to the report folder

Column names carry their unit as a suffix (`forward_ms`, `peak_memory_gib`, `share`); `table` turns them into
headers like `forward (ms)`, shows fractions as percentages, and merges `<name>_p20` / `<name>_p80` (or `p20` /
`p80` beside `median`) into the median's cell: `12.3 (11.9-12.8)`. pandas Styler renders every column (the
plain DataFrame repr elides past `display.max_columns`).
"""

from __future__ import annotations

import base64
import html as _html
import io
import logging
import math
import os
import warnings
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import pandas as pd
import torch._logging
from PIL import Image, ImageSequence

from . import results
from .frontend import HEADLESS_ENV, headless, headless_start, num  # noqa: F401  (part of this module's face)
from .widgets import (  # noqa: F401
    MONITOR_STATUS,
    drop_lines,
    frame_comparer,
    frame_psnr,
    ladder_frames,
    monitor_view,
    stack_picker,
    to_uint8_frames,  # noqa: F401
)

# suffix -> (unit shown in the header, scale applied to the values); longest suffixes first
_UNIT_SUFFIXES: tuple[tuple[str, str, float], ...] = (
    ("_tflops", "TFLOP/s", 1.0), ("_tflop_s", "TFLOP/s", 1.0), ("_gb_s", "GB/s", 1.0), ("_gbps", "GB/s", 1.0),
    ("_gflop", "GFLOP", 1.0), ("_gib", "GiB", 1.0),
    ("_mib", "MiB", 1.0), ("_frac_of_ceiling", "% of ceiling", 100.0), ("_share", "%", 100.0),
    ("_frac", "%", 100.0), ("_pct", "%", 1.0), ("_ms", "ms", 1.0), ("_us", "us", 1.0), ("_s", "s", 1.0),
    ("_db", "dB", 1.0), ("_fps", "frames/s", 1.0), ("_x", "x", 1.0),
)
_EXACT_UNITS: dict[str, tuple[str, str, float]] = {
    "share": ("share", "%", 100.0), "fps": ("FPS", "frames/s", 1.0), "bps": ("BPS", "blocks/s", 1.0),
    "speedup": ("speedup", "x", 1.0), "x_floor": ("x floor", "x", 1.0), "busy_x_floor": ("busy x floor", "x", 1.0),
    "e2e_speedup": ("e2e speedup", "x", 1.0), "GFLOP": ("GFLOP", "", 1.0), "ms": ("time", "ms", 1.0),
    "psnr_db": ("PSNR", "dB", 1.0), "rel_l2_vs_fp32": ("rel-L2 vs fp32", "", 1.0),
}
_INTEGER_HINTS = ("launches", "kernels", "count", "recompiles", "graph_breaks", "calls", "forwards", "n", "blocks",
                  "frames", "steps", "syncs", "casts")


# --------------------------------------------------------------------------- numbers


def _percent(x, digits: int = 3) -> str:
    s = num(x, digits)
    return f"{s}%" if s and s not in ("inf", "-inf") else s


# --------------------------------------------------------------------------- tables


_ACRONYMS = {"gpu": "GPU", "cpu": "CPU", "vae": "VAE", "psnr": "PSNR", "dit": "DiT", "fps": "FPS", "kv": "KV",
             "gemm": "GEMM", "sdpa": "SDPA", "unet": "UNet", "ddim": "DDIM", "rope": "RoPE", "ffn": "FFN"}


def _words(name: str) -> str:
    """snake_case -> words, acronyms in capitals (gpu_busy -> GPU busy)."""
    return " ".join(_ACRONYMS.get(w, w) for w in name.split("_") if w != "") if name == name.lower() else name


def _unit_of(col: str) -> tuple[str, str, float] | None:
    """(header without unit, unit, scale) from a column name, or None when it carries no unit."""
    info = _unit_of_raw(col)
    return None if info is None else (_words(info[0].replace(" ", "_")) if info[0] == info[0].lower() else info[0],
                                      info[1], info[2])


def _unit_of_raw(col: str) -> tuple[str, str, float] | None:
    if col in _EXACT_UNITS:
        return _EXACT_UNITS[col]
    if col.endswith("_median"):  # ms_median -> time (ms); forward_ms_median -> forward (ms)
        base = _unit_of_raw(col.removesuffix("_median"))
        if base is not None:
            return base
    for prefix, unit in (("ms_", "ms"), ("us_", "us"), ("s_", "s")):  # ms_per_frame -> per frame (ms)
        if col.startswith(prefix) and len(col) > len(prefix) and not col.endswith(("_p20", "_p80")):
            return col[len(prefix):].replace("_", " "), unit, 1.0
    for suffix, unit, scale in _UNIT_SUFFIXES:
        if col.endswith(suffix) and len(col) > len(suffix):
            if unit.startswith("%"):  # flop_share -> "flop share" in %, gemm_frac_of_ceiling -> "gemm (% of ceiling)"
                return (col.replace("_", " ") if unit == "%" else col[: -len(suffix)].replace("_", " ")), unit, scale
            return col[: -len(suffix)].replace("_", " "), unit, scale
    return None


def _is_integer_col(name: str, s: pd.Series) -> bool:
    """A count: every value a whole number (counts are often stored as floats, with NaN for 'not measured')."""
    if not pd.api.types.is_numeric_dtype(s) or pd.api.types.is_bool_dtype(s):
        return False
    vals = [float(v) for v in s.dropna() if not math.isinf(float(v))]
    if not vals or not all(v.is_integer() for v in vals):
        return False
    unit = _unit_of(name)
    return unit is None or unit[1] in ("", "x") or any(h in name.lower() for h in _INTEGER_HINTS)


def _spread_pairs(cols: Sequence[str]) -> dict[str, tuple[str, str]]:
    """{median column: (p20 column, p80 column)} found among `cols`."""
    pairs, prefixed = {}, []
    cs = set(cols)
    for c in cols:
        if c in ("median", "value") and {"p20", "p80"} <= cs:
            pairs[c] = ("p20", "p80")
            continue
        if c.endswith(("_p20", "_p80", " p20", " p80")) or c in ("p20", "p80"):
            continue
        if {f"{c} p20", f"{c} p80"} <= cs:  # "fused us" with "fused us p20" / "fused us p80" (notebook 05's)
            pairs[c] = (f"{c} p20", f"{c} p80")
            continue
        if c.endswith(" median"):  # "fps median" with "fps p20" / "fps p80" (notebook 03's tables)
            base = c[: -len(" median")]
            if {f"{base} p20", f"{base} p80"} <= cs:
                pairs[c] = (f"{base} p20", f"{base} p80")
            continue
        parts = c.split("_")
        if parts[-1] not in ("ms", "us", "s", "median", "value", "gbps", "tflops", "gib", "mib", "x", "fps", "db"):
            continue  # ms_per_frame is not the median of ms_p20/ms_p80
        prefixed.append((c, parts))
    # steady_forward_ms -> steady_forward_p20, or else steady_p20; a spread belongs to one column, the one it names
    # exactly first (e2e_value owns e2e_p20 / e2e_p80: e2e_first_frame_ms, whose own spread is not stored, once showed
    # the end-to-end FPS spread under its median)
    for exact in (True, False):
        for c, parts in prefixed:
            if c in pairs:
                continue
            for k in ([len(parts) - 1] if exact else range(len(parts) - 2, 0, -1)):
                base = "_".join(parts[:k])
                pair = (f"{base}_p20", f"{base}_p80")
                if set(pair) <= cs and pair not in pairs.values():
                    pairs[c] = pair
                    break
    if {"p20", "p80"} <= cs and not any(p == ("p20", "p80") for p in pairs.values()):
        i = list(cols).index("p20")  # bare p20/p80 belong to the column before them (decode_ms, p20, p80)
        if i > 0 and list(cols)[i - 1] not in pairs:
            pairs[list(cols)[i - 1]] = ("p20", "p80")
    return pairs


def _row_units(df: pd.DataFrame) -> pd.Series | None:
    for c in ("unit", "units"):
        if c in df.columns and not pd.api.types.is_numeric_dtype(df[c]):
            return df[c]
    return None


MISSING = "-"  # a table cell without a finite value


def format_frame(df: pd.DataFrame, columns: Sequence[str] | None = None, units: Mapping[str, str] | None = None,
                 rename: Mapping[str, str] | None = None, spread: bool = True, digits: int = 3,
                 percent: Iterable[str] = (), strict: bool = True) -> pd.DataFrame:
    """The frame as strings for reading: chosen `columns` in order, units in the headers (from the column suffix or
    `units`), fractions as percentages, each median with its p20-p80 spread in one cell, `digits` significant
    digits. Numbers of a table with a per-row `unit` column are kept in that unit (a 'fraction' row as %)."""
    if not isinstance(df, pd.DataFrame):
        if isinstance(df, pd.Series):
            df = df.to_frame()
        else:
            raise ValueError(f"df must be a pandas DataFrame or Series, got {type(df).__name__}")
    if any(not isinstance(c, str) for c in df.columns):  # pivoted frames have int or tuple column labels
        df = df.copy()
        df.columns = [" / ".join(map(str, c)) if isinstance(c, tuple) else str(c) for c in df.columns]
    if columns is not None:
        missing = [c for c in columns if c not in df.columns]
        if not strict:  # the columns of a key view that this run's table has
            columns, missing = [c for c in columns if c in df.columns], []
        if missing:
            raise ValueError(f"columns {missing} are not in the table; allowed values: {list(df.columns)}")
    units = dict(units or {})
    rename = dict(rename or {})
    percent = set(percent)
    pairs = _spread_pairs(list(df.columns)) if spread else {}
    hidden = {c for p in pairs.values() for c in p}
    show = [c for c in (columns if columns is not None else df.columns) if c not in hidden or c in (columns or ())]
    row_units = _row_units(df)
    out = {}
    sources = []
    for c in show:
        s = df[c]
        name = str(c)
        info = None if name in units else _unit_of(name)
        scale = 1.0
        if name in units:
            label, unit = name.replace("_", " "), units[name]
        elif info is not None:
            label, unit, scale = info
        else:
            label, unit = _words(name), ""
        if name in percent:
            unit, scale = "%", 100.0
        is_pct = unit.startswith("%")

        def fmt(v, row_unit=None, scale=scale, is_pct=is_pct):
            if isinstance(v, float) and not math.isfinite(v):
                return MISSING  # NaN (not measured) and inf (identical frames' PSNR) read alike in a table
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                local_scale, local_pct = scale, is_pct
                if row_unit == "fraction":
                    local_scale, local_pct = 100.0, True
                v = v * local_scale if v == v else v
                return _percent(v, digits) if local_pct else num(v, digits)
            if v is None:
                return MISSING
            return str(v)

        integer = _is_integer_col(name, s)
        vals = []
        for i, v in enumerate(s.tolist()):
            ru = (row_units.iloc[i] if row_units is not None and c in ("median", "value", "mean", "last", "max")
                  else None)
            mixed = not pd.api.types.is_numeric_dtype(s)  # a column of quantities: 3.0 frames is 3
            if (integer or mixed) and isinstance(v, (int, float)) and not isinstance(v, bool) and v == v \
                    and not math.isinf(v) and float(v).is_integer() and row_units is None:
                text = f"{int(v):,}"
            else:
                text = fmt(v, ru)
            if c in pairs:
                lo, hi = df[pairs[c][0]].iloc[i], df[pairs[c][1]].iloc[i]
                lo_t, hi_t = fmt(lo, ru), fmt(hi, ru)
                if lo_t not in ("", MISSING) and hi_t not in ("", MISSING) and text not in ("", MISSING):
                    text = f"{text} ({lo_t}-{hi_t})"
            vals.append(text)
        # a percentage carries its % sign in every cell: the header keeps the name alone
        header = rename.get(name) or (f"{label} ({unit})" if unit and unit != "%" else label)
        if c in pairs:
            header = ("median (p20-p80)" if header == "median" else
                      f"{header.removesuffix(' median')}, median (p20-p80)")
        out[header] = vals
        sources.append(c)
    res = pd.DataFrame(out, index=df.index)
    res.attrs["source_columns"] = sources  # which column of `df` each formatted column shows
    res.index.names = [(n.replace("_", " ") if isinstance(n, str) else n) for n in df.index.names]
    return res


_TABLE_CSS = [
    {"selector": "", "props": "border-collapse: collapse; font-size: 12px; margin: 0.3em 0 1em 0;"},
    {"selector": "th", "props": "background: #f4f4f4; padding: 3px 8px; border-bottom: 1px solid #bbb; "
                                "text-align: left; white-space: nowrap;"},
    {"selector": "td", "props": "padding: 3px 8px; border-bottom: 1px solid #e4e4e4; "
                                "font-variant-numeric: tabular-nums;"},
    {"selector": "caption", "props": "caption-side: top; text-align: left; font-weight: bold; padding: 4px 0;"},
]


def table(df: pd.DataFrame, caption: str | None = None, columns: Sequence[str] | None = None,
          units: Mapping[str, str] | None = None, rename: Mapping[str, str] | None = None, spread: bool = True,
          digits: int = 3, percent: Iterable[str] = (), highlight: Mapping[str, str] | None = None,
          strict: bool = True):
    """A key table for reading (pandas Styler): see format_frame. Every column is rendered (no '...'), numbers are
    right-aligned; `highlight` = {column: 'min' | 'max'} marks the best value of a column in bold. strict=False:
    `columns` names a key view, and those this table lacks are skipped."""
    if not df.columns.is_unique:
        raise ValueError(f"table columns must be unique; repeated: {sorted(set(df.columns[df.columns.duplicated()]))}")
    if not df.index.is_unique:
        # pandas' Styler cannot style cells of a repeated row label (the profiler's key_averages names a
        # record_function range twice on a GPU: its CPU range and its GPU annotation): number the rows instead
        df = df.reset_index() if not isinstance(df.index, pd.RangeIndex) else df.reset_index(drop=True)
    f = format_frame(df, columns=columns, units=units, rename=rename, spread=spread, digits=digits, percent=percent,
                     strict=strict)
    st = f.style.set_table_styles(_TABLE_CSS)
    if any(not isinstance(c, str) for c in df.columns):
        df = df.set_axis([str(c) for c in df.columns], axis=1)
    text_cols = [h for h, col in zip(f.columns, f.attrs["source_columns"])
                 if col is None or not pd.api.types.is_numeric_dtype(df[col]) or pd.api.types.is_bool_dtype(df[col])]
    num_cols = [h for h in f.columns if h not in text_cols]
    # words read left to right and may wrap; numbers stay right-aligned on one line (cell-level rules: they outrank
    # the table's own and JupyterLab's td styles)
    if text_cols:
        st = st.set_properties(subset=text_cols, **{"text-align": "left", "white-space": "normal",
                                                    "min-width": "4em", "max-width": "36em"})
    if num_cols:
        st = st.set_properties(subset=num_cols, **{"text-align": "right", "white-space": "nowrap"})
    if caption:
        st = st.set_caption(caption)
    for col, how in (highlight or {}).items():
        if how not in ("min", "max"):
            raise ValueError(f"highlight[{col!r}]={how!r} is not allowed; allowed values: 'min', 'max'")
        if col not in df.columns:
            raise ValueError(f"highlight column {col!r} is not in the table; allowed values: {list(df.columns)}")
        s = pd.to_numeric(df[col], errors="coerce")
        if s.notna().any():
            best = s.idxmin() if how == "min" else s.idxmax()
            header = [h for h in f.columns if h == col or h.startswith(col.replace("_", " ").split(" (")[0])]
            if header:
                st = st.set_properties(subset=pd.IndexSlice[[best], [header[0]]], **{"font-weight": "bold"})
    return st


def series(values: Mapping, caption: str | None = None, units: Mapping[str, str] | None = None, digits: int = 3):
    """A one-column table of named values (ceilings, a summary dict): each name's unit from its suffix."""
    rows = []
    units = dict(units or {})
    for k, v in dict(values).items():
        info = _unit_of(str(k))
        unit = units.get(k, info[1] if info else "")
        scale = info[2] if info and k not in units else 1.0
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            text = (_percent(v * scale, digits) if unit.startswith("%") else num(v * scale, digits))
        else:
            text = "" if v is None else str(v)
        rows.append({"name": str(k), "value": text, "unit": unit.replace("%", "percent") if unit == "%" else unit})
    st = pd.DataFrame(rows).set_index("name").style.set_table_styles(_TABLE_CSS)
    return st.set_caption(caption) if caption else st


# --------------------------------------------------------------------------- appendix


_APPENDIX: list[tuple[str, pd.DataFrame]] = []


def categories(lad) -> None:
    """A ladder's GPU kernel ms per forward by category (Ladder.categories) as a table and its stacked bars; a line
    saying why there are none (no ladder, or a CPU run) otherwise. Notebooks 04, 05 and 06 show it per row."""
    import matplotlib.pyplot as plt  # noqa: PLC0415  heavy: matplotlib.pyplot
    from IPython.display import display  # noqa: PLC0415  optional: IPython

    cats = lad.categories() if lad is not None else pd.DataFrame()
    if cats.empty:
        print("no GPU kernel times by category (no ladder, or a CPU run)")
        return
    display(table(cats, caption="GPU kernel ms per forward by category", units={c: "ms" for c in cats.columns}))
    lad.plot_categories()
    plt.show()


def appendix(df: pd.DataFrame, title: str, note: bool = True) -> None:
    """Keep a wide raw frame for the appendix (wd.show_appendix() at the notebook's end shows every one, all
    columns); shows a one-line pointer here."""
    if not isinstance(title, str) or not title:
        raise ValueError(f"title must be a non-empty string, got {title!r}")
    _APPENDIX.append((title, df))
    if note:
        _display_markdown(f"<small>Every column: appendix A{len(_APPENDIX)} ({_html.escape(title)}).</small>")


def show_appendix(clear: bool = True) -> None:
    """Every frame given to appendix(), full width, in the order given."""
    from IPython.display import HTML, display  # noqa: PLC0415  optional: IPython

    if not _APPENDIX:
        _display_markdown("_No raw tables._")
    for i, (title, df) in enumerate(_APPENDIX, 1):
        display(HTML(f"<h3>A{i} · {_html.escape(title)}</h3>"))
        with pd.option_context("display.max_columns", None, "display.max_rows", None, "display.width", None,
                               "display.max_colwidth", None, "display.float_format", "{:.4g}".format):
            display(HTML(f'<div style="overflow-x:auto">{df.to_html(float_format="{:.4g}".format)}</div>'))
    if clear:
        _APPENDIX.clear()


def _display_markdown(text: str) -> None:
    from IPython.display import Markdown, display  # noqa: PLC0415  optional: IPython

    display(Markdown(text))


# --------------------------------------------------------------------------- artifacts


LINK_ATTR = "data-wmbook-artifact"  # wmbook.render copies these files into the report folder


def link(path: str | os.PathLike, text: str | None = None, note: str = ""):
    """An HTML link to a file the notebook wrote (a trace, a session report). In a rendered report the file is
    copied into the report folder and the link made relative (wmbook.render)."""
    from IPython.display import HTML  # noqa: PLC0415  optional: IPython

    p = Path(path).resolve()
    label = _html.escape(text or p.name)
    extra = f" {_html.escape(note)}" if note else ""
    return HTML(f'<a href="{_html.escape(p.as_uri())}" {LINK_ATTR}="1" target="_blank">{label}</a>{extra}')


VIDEO_EMBED_BYTES = 1_500_000  # an animated GIF above this is embedded as a smaller preview (report size)


def gif_preview(data: bytes, max_bytes: int = VIDEO_EMBED_BYTES) -> tuple[bytes, str]:
    """An animated GIF at most `max_bytes` long: the same one when it fits, else its frames downscaled (1/2, 1/3, ...
    of the size) and, if that is not enough, every k-th frame with k times the duration. Returns (GIF bytes, what
    was done, "" when nothing)."""
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 10_000:
        raise ValueError(f"max_bytes={max_bytes!r} is not allowed; allowed values: an integer >= 10000")
    if len(data) <= max_bytes:
        return data, ""
    im = Image.open(io.BytesIO(data))
    frames, durations = [], []
    for f in ImageSequence.Iterator(im):
        frames.append(f.convert("RGB"))
        durations.append(int(f.info.get("duration", im.info.get("duration", 100)) or 100))
    w, h = frames[0].size
    for stride in (1, 2, 4, 8):
        for scale in (2, 3, 4, 6, 8):
            size = (max(1, w // scale), max(1, h // scale))
            small = [f.resize(size, Image.BILINEAR) for f in frames[::stride]]
            dur = [sum(durations[i:i + stride]) for i in range(0, len(frames), stride)]
            buf = io.BytesIO()
            small[0].save(buf, "GIF", save_all=True, append_images=small[1:], duration=dur, loop=0)
            out = buf.getvalue()
            if len(out) <= max_bytes:
                every = "every frame" if stride == 1 else f"every {stride}th frame"
                return out, (f"preview: {every} at {size[0]}x{size[1]} (the file: {len(frames)} frames at {w}x{h}, "
                             f"{len(data) / 1e6:.1f} MB)")
    return out, f"preview: every 8th frame at 1/8 size (the file: {len(frames)} frames at {w}x{h})"


def show_video(path: str | os.PathLike, width: int | None = None, caption: str | None = None,
               max_bytes: int = VIDEO_EMBED_BYTES):
    """An animated GIF (or WebP/MP4) embedded in the output as a data URI, so the notebook and its HTML report carry
    it (nbconvert drops image/gif outputs). A GIF over `max_bytes` is embedded as a smaller preview (gif_preview; a
    real-shape video of random weights is noise that GIF cannot compress: 5 MB for notebook 01's 352x640 frames),
    shown at the file's width, with a link to the file itself."""
    from IPython.display import HTML  # noqa: PLC0415  optional: IPython

    p = Path(path)
    if not p.is_file():
        raise ValueError(f"path={str(path)!r} is not allowed: no such file; allowed values: an existing .gif, .webp "
                         f"or .mp4 file")
    mime = {".gif": "image/gif", ".webp": "image/webp", ".mp4": "video/mp4"}.get(p.suffix.lower())
    if mime is None:
        raise ValueError(f"path={str(path)!r} is not allowed; allowed values: a .gif, .webp or .mp4 file")
    raw = p.read_bytes()
    note = ""
    if mime == "image/gif":
        raw, note = gif_preview(raw, max_bytes)
        if note and width is None:
            width = Image.open(p).size[0]  # the preview scaled back up to the file's size on the page
    data = base64.b64encode(raw).decode("ascii")
    w = f' width="{int(width)}"' if width else ""
    if mime == "video/mp4":
        media = f'<video controls loop autoplay muted{w} src="data:{mime};base64,{data}"></video>'
    else:
        media = f'<img{w} alt="{_html.escape(p.name)}" src="data:{mime};base64,{data}">'
    if note:
        note = f"{_html.escape(note)}; {link(p, 'the full video').data}"
    text = " ".join(x for x in (_html.escape(caption) if caption else "", f"({note})" if note else "") if x)
    cap = f"<figcaption>{text}</figcaption>" if text else ""
    return HTML(f"<figure style='margin:0'>{media}{cap}</figure>")


# --------------------------------------------------------------------------- quiet output


class _DropLines(logging.Filter):
    def __init__(self, *needles: str):
        super().__init__()
        self.needles = needles

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.getMessage()
        return not any(n in msg for n in self.needles)


def setup(quiet: bool = True) -> None:
    """Notebook defaults: pandas shows every column and 4 significant digits; with `quiet`, messages that mean
    nothing to a reader are dropped: the profiler's USDT start/stop lines (KINETO_LOG_LEVEL, unless set),
    torch.compile's per-graph-break warnings (notebook 04 tables the breaks), diffusers' float32-module notice,
    inductor's 'skipping cudagraphs' lines (notebook 06's row note says so)."""
    pd.set_option("display.max_columns", None)
    pd.set_option("display.width", None)
    pd.set_option("display.max_colwidth", 80)
    pd.set_option("display.float_format", "{:.4g}".format)
    pd.set_option("styler.render.max_columns", None)
    if not quiet:
        return
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")  # read by kineto when a profiler starts; 6: silent
    # inductor declining CUDA graphs is said by the row's note (notebook 06); torchao's optional checkpoint types
    drop = _DropLines("Graph break", "graph break", "consider setting", "should be kept in float32",
                      "skipping cudagraphs due to", "Unable to import `torchao` Tensor objects")
    try:
        torch._logging.set_logs(graph_breaks=False, recompiles=False)
    except Exception:  # noqa: BLE001  (torch missing or an old version: the warnings stay)
        pass
    # records propagate to the handlers of their ancestors: filter there (a logger's own filters only see
    # records made on that very logger)
    for name in ("torch", "torch._dynamo", "torch._inductor", "diffusers", ""):
        lg = logging.getLogger(name)
        if drop not in lg.filters:
            lg.addFilter(drop)
        for h in lg.handlers:
            if not any(isinstance(f, _DropLines) for f in h.filters):
                h.addFilter(drop)
    for name in ("torch._dynamo.variables.tensor", "torch._dynamo.variables.builtin", "torch._dynamo.symbolic_convert",
                 "diffusers.models.modeling_utils"):
        logging.getLogger(name).addFilter(drop)
    warnings.filterwarnings("ignore", message=".*TypedStorage is deprecated.*")
    # torch.profiler's note on scheduled profiling: every profile here has one cycle, so nothing is cleared early
    warnings.filterwarnings("ignore", message=".*clears events at the end of each cycle.*")


# --------------------------------------------------------------------------- results rows


def rows(path: str | os.PathLike, run_id: str, columns: Sequence[str] = ("preset", "variant", "metric", "value", "unit",
                                                                        "p20", "p80")):
    """Display a run's results rows and tag the output with the run (display metadata {"wmbook": {"run_id",
    "results_path"}}), so a report's index can read its headline numbers from the rows."""
    from IPython.display import HTML, display  # noqa: PLC0415  optional: IPython

    df = results.read(path, run_id=run_id)
    cols = [c for c in columns if c in df.columns]
    st = table(df[cols], caption=f"{len(df)} rows of run {run_id} in {Path(path).name}")
    display(HTML(st.to_html()), metadata={"wmbook": {"run_id": run_id, "results_path": str(Path(path).resolve())}})
