"""SectionTimer: nested sections, self vs total, grouping, the label hook."""

import time

import pytest

from wmbook.profiling import label, set_labels
from wmbook.profiling.labels import detail_label
from wmbook.profiling.sections import SectionTimer, attach, collapse_indices


@pytest.fixture(autouse=True)
def labels_on():
    set_labels(True, detail=True)
    yield
    set_labels(True, detail=False)


def test_nested_self_and_total():
    t = SectionTimer("cpu")
    with t.attached():
        with label("outer"):
            time.sleep(0.02)  # outer's own work
            for j in range(3):
                with label(f"DDIM_Step_{j}_t{999 - j}"):
                    time.sleep(0.01)
                    with detail_label("UNet_ResBlock"):  # fine labels are never timed
                        pass
    df = t.table().set_index("path")
    assert list(df.index) == ["outer", "outer/DDIM_Step_*"]
    o, s = df.loc["outer"], df.loc["outer/DDIM_Step_*"]
    assert s["count"] == 3 and s["self_ms"] == pytest.approx(s["total_ms"])
    assert o["self_ms"] + s["total_ms"] == pytest.approx(o["total_ms"], rel=1e-9)
    assert 18 <= o["self_ms"] <= 40 and 29 <= s["total_ms"] <= 60
    assert s["mean_ms"] == pytest.approx(s["total_ms"] / 3)
    assert s["min_ms"] <= s["mean_ms"] <= s["max_ms"]
    assert s["share_of_parent"] == pytest.approx(s["total_ms"] / o["total_ms"])
    raw = t.table(collapse=False)
    assert len(raw) == 4 and raw["count"].eq(1).all()
    ev = t.events()
    assert len(ev) == 4 and (ev["end_ms"] >= ev["start_ms"]).all()


def test_same_name_under_different_parents_stays_apart():
    t = SectionTimer("cpu")
    with t.attached():
        for phase in ("2_Decision_Pass", "3_World_Model_Pass"):
            with label(phase):
                with label("DDIM_Sampling"):
                    pass
    paths = t.table()["path"].tolist()
    assert paths == ["2_Decision_Pass", "2_Decision_Pass/DDIM_Sampling", "3_World_Model_Pass",
                     "3_World_Model_Pass/DDIM_Sampling"]


def test_limits_and_errors():
    t = SectionTimer("cpu", max_sections=2)
    for i in range(4):
        with t.section(f"s{i}"):
            pass
    assert len(t) == 2 and t.dropped == 2
    with pytest.raises(RuntimeError, match="without a matching push"):
        t.pop()
    with pytest.raises(ValueError, match="max_sections"):
        SectionTimer("cpu", max_sections=0)
    with pytest.raises(ValueError, match="SectionTimer"):
        with attach("not a timer"):
            pass
    assert SectionTimer("cpu").table().empty


def test_labels_off_time_nothing():
    t = SectionTimer("cpu")
    set_labels(False)
    try:
        with t.attached():
            with label("x"):
                pass
    finally:
        set_labels(True)
    assert len(t) == 0


@pytest.mark.parametrize("name,want", [
    ("2.3_Block_4", "2.3_Block_*"),
    ("2.3.4_Update_KV_Cache", "2.3.*_Update_KV_Cache"),
    ("2.3.4_Denoising_Step_1_t908", "2.3.*_Denoising_Step_1_t908"),
    ("DDIM_Step_17_t520", "DDIM_Step_*"),
    ("VAE_Decode_Frame_3", "VAE_Decode_Frame_*"),
    ("1_Data_Preparation", "1_Data_Preparation"),
])
def test_collapse_indices(name, want):
    assert collapse_indices(name) == want
