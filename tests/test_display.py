"""wmbook.display: formatted key tables, the appendix, embedded videos, quiet output and widgets that degrade to
static output in headless runs. No kernel: IPython's display() is captured."""

from __future__ import annotations

import base64
import logging
import math
import sys

import numpy as np
import pandas as pd
import pytest

from wmbook import display as wd


@pytest.fixture
def shown(monkeypatch):
    """What display() would have shown, in order."""
    import IPython.display

    out = []
    monkeypatch.setattr(IPython.display, "display", lambda *objs, **kw: out.extend(objs))
    return out


@pytest.mark.parametrize("value, text", [(None, ""), (float("nan"), ""), (math.inf, "inf"), (0, "0"), (3, "3"),
                                         (np.int64(1234), "1,234"), (2.0, "2.00"), (0.5, "0.500"),
                                         (123.456, "123"), (98765.4, "98,765"), (4.6e-05, "4.60e-05"),
                                         (-3.14159, "-3.14"), (True, "True")])
def test_num(value, text):
    assert wd.num(value) == text


def test_units_spread_and_percent():
    df = pd.DataFrame({"variant": ["fp32", "bf16"], "forward_ms": [287.0, 55.0], "forward_p20": [285.0, 54.4],
                       "forward_p80": [304.0, 56.7], "flop_share": [0.9, 0.1], "speedup": [1.0, 5.22],
                       "launches": [4176.0, float("nan")], "psnr_db": [math.inf, 41.23]})
    f = wd.format_frame(df)
    assert list(f.columns) == ["variant", "forward (ms), median (p20-p80)", "flop share", "speedup (x)", "launches",
                               "PSNR (dB)"]
    assert f.iloc[0].tolist() == ["fp32", "287 (285-304)", "90.0%", "1.00", "4,176", "-"]  # inf PSNR: '-'
    assert f.iloc[1].tolist() == ["bf16", "55.0 (54.4-56.7)", "10.0%", "5.22", "-", "41.2"]


def test_per_row_units_and_bare_spread():
    s = pd.DataFrame({"metric": ["fps", "vae_share"], "median": [1.94, 0.3], "p20": [1.9, 0.29], "p80": [2.0, 0.31],
                      "unit": ["frames/s", "fraction"]}).set_index("metric")
    f = wd.format_frame(s)
    assert f.loc["fps", "median (p20-p80)"] == "1.94 (1.90-2.00)"
    assert f.loc["vae_share", "median (p20-p80)"] == "30.0% (29.0%-31.0%)"
    d = pd.DataFrame({"vae_dtype": ["bf16"], "decode_ms": [9.0], "p20": [8.0], "p80": [10.0], "ms_per_frame": [2.0]})
    f = wd.format_frame(d)
    assert f["decode (ms), median (p20-p80)"].iloc[0] == "9.00 (8.00-10.0)"
    assert f["per frame (ms)"].iloc[0] == "2.00"  # not paired with a spread that is not its own
    # notebook 03's spelling: "fps median" / "fps p20" / "fps p80" in one cell
    n = pd.DataFrame({"point": ["a"], "fps median": [125.4], "fps p20": [122.3], "fps p80": [128.3],
                      "speedup (x)": [1.0]})
    f = wd.format_frame(n)
    assert list(f.columns)[1] == "fps, median (p20-p80)" and f.iloc[0, 1] == "125 (122-128)", f
    k = pd.DataFrame({"kernel": ["adaln"], "fused us": [26.0], "fused us p20": [10.1], "fused us p80": [43.1]})
    assert wd.format_frame(k).iloc[0].tolist() == ["adaln", "26 (10.1-43.1)"]  # notebook 05's spelling


def test_key_columns_and_errors():
    df = pd.DataFrame({"a_ms": [1.0], "b": ["x"]})
    with pytest.raises(ValueError, match=r"columns \['nope'\].*allowed values: \['a_ms', 'b'\]"):
        wd.format_frame(df, columns=["a_ms", "nope"])
    assert list(wd.format_frame(df, columns=["nope", "b"], strict=False).columns) == ["b"]
    with pytest.raises(ValueError, match="df must be a pandas DataFrame"):
        wd.format_frame([1, 2])
    with pytest.raises(ValueError, match="highlight.*allowed values: 'min', 'max'"):
        wd.table(df, highlight={"a_ms": "best"})


def test_wide_table_has_every_column():
    df = pd.DataFrame({f"c{i}_ms": [float(i)] for i in range(30)})
    html = wd.table(df).to_html()
    assert html.count("<th") >= 30 and "..." not in html and "(ms)" in html


def test_table_with_repeated_row_labels_renders_every_row():
    """On a GPU the profiler lists a record_function range twice (CPU range and GPU annotation): a table indexed by
    operation name then has repeated labels, which pandas' Styler refuses to style (notebook 07 failed on the H100)."""
    df = pd.DataFrame({"device_ms": [2.0, 1.0, 0.5]}, index=pd.Index(["fetch", "fetch", "gather"], name="operation"))
    html = wd.table(df, highlight={"device_ms": "max"}).to_html()
    assert html.count(">fetch<") == 2 and ">gather<" in html and "operation" in html
    with pytest.raises(ValueError, match=r"columns must be unique; repeated: \['a'\]"):
        wd.table(pd.DataFrame([[1, 2]], columns=["a", "a"]))


def test_appendix_shows_every_column(shown):
    df = pd.DataFrame({f"col{i}": [i] for i in range(26)})
    wd.appendix(df, "wide")
    wd.show_appendix()
    html = "".join(getattr(o, "data", "") or "" for o in shown)
    assert "A1 · wide" in html and "col25" in html and "..." not in html
    with pytest.raises(ValueError, match="title"):
        wd.appendix(df, "")


def test_show_video_embeds_and_refuses(tmp_path):
    gif = tmp_path / "v.gif"
    gif.write_bytes(b"GIF89a fake")
    html = wd.show_video(gif, caption="video").data
    assert f"data:image/gif;base64,{base64.b64encode(b'GIF89a fake').decode()}" in html
    with pytest.raises(ValueError, match="path=.*no such file"):
        wd.show_video(tmp_path / "missing.gif")
    (tmp_path / "v.txt").write_text("x")
    with pytest.raises(ValueError, match=r"allowed values: a \.gif, \.webp or \.mp4 file"):
        wd.show_video(tmp_path / "v.txt")


def test_show_video_embeds_a_preview_of_a_large_gif(tmp_path):
    """A GIF over the byte budget (noise frames, as a random-weights video at a real shape) is embedded downscaled,
    under the budget, shown at the file's width, with a caption saying so and an artifact link to the file."""
    import io
    import re

    from PIL import Image

    rng = np.random.default_rng(0)
    frames = [Image.fromarray(rng.integers(0, 256, (96, 160, 3), dtype=np.uint8)) for _ in range(6)]
    gif = tmp_path / "noise.gif"
    frames[0].save(gif, "GIF", save_all=True, append_images=frames[1:], duration=50, loop=0)
    size = gif.stat().st_size
    budget = size // 3
    data, note = wd.gif_preview(gif.read_bytes(), budget)
    assert len(data) <= budget and "preview" in note
    small = Image.open(io.BytesIO(data))
    assert small.size[0] < 160 and small.n_frames >= 1
    html = wd.show_video(gif, caption="noise", max_bytes=budget).data
    b64 = re.search(r"base64,([^\"]+)", html).group(1)
    assert len(base64.b64decode(b64)) <= budget and 'width="160"' in html and "preview" in html
    assert wd.LINK_ATTR in html and "the full video" in html
    assert wd.gif_preview(gif.read_bytes(), size + 1) == (gif.read_bytes(), "")  # fits: unchanged
    with pytest.raises(ValueError, match="max_bytes=.*allowed values"):
        wd.gif_preview(b"", 10)


def test_frame_comparer_static_when_headless(monkeypatch, shown):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    monkeypatch.setenv(wd.HEADLESS_ENV, "1")
    shows = []
    monkeypatch.setattr(plt, "show", lambda *a, **k: shows.append(plt.gcf()))
    ref = np.zeros((5, 3, 8, 8), dtype=np.float32)  # (T, C, H, W) in [-1, 1]
    other = ref.copy()
    other[2] += 0.5
    wd.frame_comparer(ref, other)
    assert len(shows) == 1 and len(shows[0].axes) == 3 * 3 + 1  # 3 frames x (ref, other, diff) + the PSNR line
    psnr = wd.frame_psnr(wd.to_uint8_frames(ref), wd.to_uint8_frames(other))
    assert math.isinf(psnr[0]) and psnr[2] < 20
    with pytest.raises(ValueError, match="differ in shape"):
        wd.frame_comparer(ref, ref[:2])
    with pytest.raises(ValueError, match="4 dimensions"):
        wd.frame_comparer(ref[0], ref[0])
    plt.close("all")


def test_stack_picker_runs_its_default_when_headless(monkeypatch, shown):
    monkeypatch.setenv(wd.HEADLESS_ENV, "1")
    ran = []
    wd.stack_picker(["tf32", "bf16", "compile"], ran.append, default=["tf32", "bf16"])
    assert ran == [["tf32", "bf16"]]
    with pytest.raises(ValueError, match="default has \\['fp8'\\]"):
        wd.stack_picker(["tf32"], ran.append, default=["fp8"])


def test_monitor_view_is_static_when_headless(monkeypatch):
    from wmbook.profiling.monitor import ResourceMonitor

    monkeypatch.setenv(wd.HEADLESS_ENV, "1")
    mon = ResourceMonitor("cpu", cpu_interval=0.05)
    view = wd.monitor_view(mon)
    assert not view.live and "headless" in view.reason
    with pytest.raises(ValueError, match="no monitor"):
        wd.monitor_view(type("S", (), {"monitor": None})())


def test_drop_lines_keeps_other_output(capsys):
    with wd.drop_lines() as f:
        print("[profiled run   12.3s] GPU: n/a, CPU 50%")
        print("a line that stays")
        sys.stdout.write("partial ")
        print("end")
    assert f.dropped == 1
    assert capsys.readouterr().out == "a line that stays\npartial end\n"


def test_setup_drops_graph_break_warnings():
    wd.setup()
    log = logging.getLogger("torch._dynamo.variables.tensor")
    seen = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())
    log.addHandler(handler)  # sees what the logger's filters let through
    try:
        log.warning("Graph break from `Tensor.item()`, consider setting: ...")
        log.warning("something else")
    finally:
        log.removeHandler(handler)
    assert seen == ["something else"]
    assert pd.get_option("display.max_columns") is None
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        wd.setup()  # inside catch_warnings: its filters apply here, then go with the block
        warnings.warn("Profiler clears events at the end of each cycle. Only events from the current cycle ...")
        warnings.warn("another note")
    assert [str(w.message) for w in caught] == ["another note"]


def test_diffusers_torchao_checkpoint_notice_is_dropped():
    """The one diffusers warning a torchao 0.18 install prints on import (it cluttered every H100 report) is dropped;
    other warnings of that logger still show. (A handler on the logger itself: diffusers stops its loggers'
    propagation to the root once it is imported, so pytest's caplog would see nothing either way.)"""
    import logging

    import wmbook  # noqa: F401  (installs the filter)

    seen = []

    class ListHandler(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())

    log = logging.getLogger("diffusers.quantizers.torchao.torchao_quantizer")
    h = ListHandler(level=logging.WARNING)
    log.addHandler(h)
    try:
        log.warning("Unable to import `torchao` Tensor objects. This may affect loading checkpoints serialized with "
                    "`torchao`")
        log.warning("something else")
    finally:
        log.removeHandler(h)
    assert seen == ["something else"]


def test_torchaos_syntax_warning_is_dropped_and_nothing_else():
    """torchao 0.18's quant_api.py compiles with a SyntaxWarning that landed in every H100 report's first import cell
    (diffusers imports torchao wherever it is installed); importing wmbook drops that warning from torchao's files
    only. The compiler issues it as warn_explicit with the file's path and no module name, as here. In a fresh
    process: pytest restores the warning filters after collection, which would undo an import-time filter here."""
    import subprocess
    import sys

    code = ("import warnings, wmbook\n"
            "for f in ('/opt/venv/site-packages/torchao/quantization/quant_api.py', '/work/wmbook/mine.py'):\n"
            "    warnings.warn_explicit(\"invalid escape sequence '\\\\.'\", SyntaxWarning, f, 1542)\n")
    err = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stderr
    assert "mine.py:1542: SyntaxWarning: invalid escape sequence" in err and "quant_api" not in err, err


def test_a_spread_goes_to_the_column_it_names():
    """notebook 05's ladder table stores the end-to-end FPS as e2e_value with e2e_p20 / e2e_p80, and a first-frame
    median e2e_first_frame_ms without a spread of its own: the spread belongs to e2e_value (the H100 reports of
    2026-11-27 showed the FPS spread under the first-frame median: '459 (26.6-29.1)')."""
    from wmbook.display import _spread_pairs

    cols = ["variant", "forward_ms", "forward_p20", "forward_p80", "e2e_first_frame_ms", "e2e_value", "e2e_p20",
            "e2e_p80", "steady_forward_ms", "steady_p20", "steady_p80"]
    assert _spread_pairs(cols) == {"forward_ms": ("forward_p20", "forward_p80"), "e2e_value": ("e2e_p20", "e2e_p80"),
                                   "steady_forward_ms": ("steady_p20", "steady_p80")}


def test_headless_whenever_no_frontend_is_attached(monkeypatch):
    """Widgets fall back to their static form under plain papermill or nbconvert (nbclient executes with stdin
    closed), in a script, and under wmbook.run; a frontend (stdin allowed) gets live widgets; WMBOOK_HEADLESS decides
    when set."""
    import types

    import IPython

    monkeypatch.delenv(wd.HEADLESS_ENV, raising=False)
    monkeypatch.setattr(IPython, "get_ipython", lambda: None)
    assert wd.headless()  # no kernel: a script
    shell = types.SimpleNamespace(kernel=types.SimpleNamespace(_allow_stdin=False))
    monkeypatch.setattr(IPython, "get_ipython", lambda: shell)
    assert wd.headless()  # papermill / nbconvert
    shell.kernel._allow_stdin = True
    assert not wd.headless()  # JupyterLab
    monkeypatch.setenv(wd.HEADLESS_ENV, "1")
    assert wd.headless()
    monkeypatch.setenv(wd.HEADLESS_ENV, "0")
    shell.kernel._allow_stdin = False
    assert not wd.headless()
