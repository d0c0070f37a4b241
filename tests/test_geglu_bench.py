"""tools/geglu_bench.py: the feed-forward shapes it times at a preset, and its refusals before any GPU work."""

from __future__ import annotations

import pytest
from conftest import load_tool

from wmbook.presets import WMA_PRESETS


@pytest.fixture(scope="module")
def bench():
    return load_tool("geglu_bench")


def test_shapes_follow_the_preset(bench):
    """wma: 40x64 latents, 16 frames, widths 320 / 640 / 1280 at the three attention levels, GEGLU inner 4x."""
    assert bench.shapes(WMA_PRESETS["wma"]) == [("level 0 (40x64 x 16 frames)", 40960, 320, 1280),
                                            ("level 1 (20x32 x 16 frames)", 10240, 640, 2560),
                                            ("level 2 (10x16 x 16 frames)", 2560, 1280, 5120)]


def test_refuses_bad_arguments_first(bench, capsys):
    for argv, message in ((["--repeats", "0"], "--repeats=0 is not allowed"),
                          (["--preset", "mg2-universal"], "invalid choice: 'mg2-universal'")):
        with pytest.raises(SystemExit) as e:
            bench.main(argv)
        assert e.value.code == 2 and message in capsys.readouterr().err
