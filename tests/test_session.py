"""Profiling config, sessions (stages, blocks, stream metrics, decorators), reports and overhead."""

import json
import re
import time

import pytest
import torch

from wmbook.profiling import report as report_mod
from wmbook.profiling.config import ProfilingConfig, load_config, presets
from wmbook.profiling.decorators import (
    add_profiling_event,
    profile_block_computation,
    profile_diffusion_step,
    profile_method,
    profile_model_parameters,
    profile_session,
)
from wmbook.profiling.labels import label, labels_enabled, set_labels
from wmbook.profiling.overhead import measure_overhead
from wmbook.profiling.session import (
    DEFINITIONS,
    ProfilingSession,
    current_session,
    set_profiling,
)

# fast, quiet, host only, nothing written unless a test asks
QUICK = {"gpu_monitor_interval": 0.05, "cpu_monitor_interval": 0.05, "real_time_display": False,
         "generate_final_report": False, "report_format": "both"}


@pytest.fixture(autouse=True)
def _clean(monkeypatch):
    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(k, raising=False)
    before = labels_enabled()
    set_labels(True)
    yield
    set_labels(before)
    set_profiling(True)
    assert current_session() is None


def cfg(tmp_path=None, **kw):
    d = dict(QUICK, **kw)
    if tmp_path is not None:
        d["output_dir"] = str(tmp_path)
    return d


# --- config ---------------------------------------------------------------------------------------------


def test_presets_load_from_package_yaml():
    assert {"development", "production"} <= set(presets())
    dev, prod = load_config("development"), load_config("production")
    assert dev.gpu_monitor_interval == 0.1 and dev.save_raw_data and dev.real_time_display and dev.monitor_gpu_clocks
    assert prod.report_format == "json" and not prod.monitor_gpu_power and prod.max_data_points == 5000
    assert prod.session_tags == {"mode": "production"}
    assert load_config(None) == ProfilingConfig()
    assert load_config(prod) is prod


def test_yaml_with_and_without_profiling_key(tmp_path):
    a = tmp_path / "a.yaml"
    a.write_text("profiling:\n  gpu_monitor_interval: 0.25\n  report_format: html\n  session_tags:\n    model: x\n")
    b = tmp_path / "b.yml"
    b.write_text("gpu_monitor_interval: 0.25\nreport_format: html\nsession_tags: {model: x}\n")
    ca, cb = load_config(str(a)), load_config(b)
    assert ca == cb and ca.gpu_monitor_interval == 0.25 and ca.report_format == "html"
    assert ca.session_tags == {"model": "x"}
    assert ca.cpu_monitor_interval == ProfilingConfig().cpu_monitor_interval  # defaults for the rest
    assert load_config({"profiling": {"enabled": False}}).enabled is False


def test_config_errors_name_the_key_and_allowed_values(tmp_path):
    with pytest.raises(ValueError, match=r"unknown .* key 'gpu_interval'.*allowed keys.*gpu_monitor_interval"):
        load_config({"gpu_interval": 1})
    with pytest.raises(ValueError, match=r"'report_format' must be one of \['json', 'html', 'both'\], got 'pdf'"):
        load_config({"report_format": "pdf"})
    with pytest.raises(ValueError, match="'gpu_monitor_interval' must be a number of seconds"):
        load_config({"gpu_monitor_interval": 0})
    with pytest.raises(ValueError, match="'enabled' must be true or false"):
        load_config({"enabled": "yes please"})
    with pytest.raises(ValueError, match="'max_data_points' must be an int >= 1"):
        load_config({"max_data_points": 2.5})
    with pytest.raises(ValueError, match="session_tags"):
        load_config({"session_tags": ["a"]})
    bad = tmp_path / "bad.yaml"
    bad.write_text("profiling:\n  real_time_dispaly: true\n")
    with pytest.raises(ValueError, match="real_time_dispaly"):
        load_config(bad)
    with pytest.raises(ValueError, match="beside 'profiling:'"):
        load_config({"profiling": {}, "enabled": True})
    with pytest.raises(ValueError, match="neither a preset"):
        load_config("fastest")
    with pytest.raises(ValueError, match="does not exist"):
        load_config(str(tmp_path / "missing.yaml"))
    with pytest.warns(UserWarning, match="profile_vae_decode"):
        assert load_config({"profile_vae_decode": True}) == ProfilingConfig()
    with pytest.raises(ValueError, match="unknown"):
        ProfilingConfig().replace(colour="red")


# --- sessions -------------------------------------------------------------------------------------------


def test_stage_table_self_and_total(tmp_path):
    with ProfilingSession("nest", config=cfg(), device="cpu") as s:
        with s.stage("outer"):
            time.sleep(0.02)
            for _ in range(2):
                with label("inner"):  # a plain label inside the session is timed too
                    time.sleep(0.03)
    t = s.stages().set_index("path")
    outer, inner = t.loc["Session/outer"], t.loc["Session/outer/inner"]
    assert inner["count"] == 2 and inner["total_ms"] >= 60
    assert outer["total_ms"] >= 80
    assert outer["self_ms"] == pytest.approx(outer["total_ms"] - inner["total_ms"], abs=1e-6)
    assert 18 <= outer["self_ms"] < outer["total_ms"] - 55
    assert t.loc["Session", "total_ms"] >= outer["total_ms"]


def test_synthetic_stream_metrics_match_hand_computation():
    frames = [1, 4, 4, 4]
    with ProfilingSession("synthetic", config=cfg(), device="cpu") as s:
        with s.generation(warmup=True):  # excluded from the summary
            for i in range(2):
                with s.block(i, frames=frames[i]):
                    time.sleep(0.005)
        with s.generation():
            time.sleep(0.03)  # before block 0: counts in first-frame latency, not in FPS
            for i, f in enumerate(frames):
                with s.block(i, frames=f):
                    time.sleep(0.08 if i == 0 else 0.04)
                time.sleep(0.01)  # a host gap between blocks counts in the steady-state time
    summ = s.summary()
    b = s.blocks()
    g = b[~b["warmup"]]
    assert list(g["index"]) == [0, 1, 2, 3] and list(g["frames"]) == frames
    steady_ms = g["end_ms"].iloc[-1] - g["end_ms"].iloc[0]
    assert summ["fps"] == pytest.approx(12 / steady_ms * 1e3, rel=1e-9)
    assert summ["bps"] == pytest.approx(3 / steady_ms * 1e3, rel=1e-9)
    ev = s.timer.events()
    gen_start = ev[ev["path"] == "Session/Generation"]["start_ms"].iloc[0]
    assert summ["first_frame_ms"] == pytest.approx(g["end_ms"].iloc[0] - gen_start, rel=1e-9)
    # sleeps only overshoot: nominal 150 ms steady for 12 frames -> <= 80 FPS; first frame >= 110 ms
    assert 20 < summ["fps"] <= 80.5 and 5 < summ["bps"] <= 20.1
    assert 109 <= summ["first_frame_ms"] < 500
    assert steady_ms >= 150  # gaps included: 3 x (40 + 10) ms
    assert summ["stream"]["steady_blocks"] == 3 and summ["stream"]["steady_frames"] == 12
    assert [x["warmup"] for x in summ["generations"]] == [True, False]
    assert summ["blocks"] == 6


def test_blocks_without_frames_give_a_note_not_a_number():
    with ProfilingSession("noframes", config=cfg(), device="cpu") as s:
        for i in range(2):
            with s.block(i):
                pass
    summ = s.summary()
    assert summ["fps"] is None and "set_block_frames" in summ["stream_note"]
    s.set_block_frames([1, 4])
    assert s.summary()["fps"] is not None
    with pytest.raises(ValueError, match="has 3 entries but generation 0 has 2"):
        s.set_block_frames([1, 4, 4])


def test_pipeline_blocks_timed_by_session_match_pipeline_metrics():
    from wmbook.pipelines.causal import CausalStreamingPipeline

    pipe = CausalStreamingPipeline("tiny", device="cpu", dtype="fp32", seed=0)
    inputs = pipe.prepare(3)
    with ProfilingSession("pipe", config=cfg(), device="cpu") as s:
        with s.generation():
            out = pipe.generate(inputs, progress=False)
        s.set_block_frames(out)
    ref = out.metrics()
    summ = s.summary()
    assert out.frames_per_block == [9, 12, 12]
    assert summ["stream"]["steady_frames"] == ref["steady_frames"] == 24
    for k in ("fps", "bps"):
        assert summ[k] == pytest.approx(ref[k], rel=0.03), k
    # the session's generation starts before the pipeline's own clock does (the call into generate, its setup): a few
    # ms of host time on the first frame (6.4 ms of 209 on a 2-core CI machine), never a different span
    assert summ["first_frame_ms"] == pytest.approx(ref["first_frame_ms"], rel=0.03, abs=15.0)
    assert summ["first_frame_ms"] >= ref["first_frame_ms"] - 1.0
    t = s.stages().set_index("path")
    blk = "Session/Generation/2_Pipeline_Inference/2.3_Block_*"
    assert t.loc[blk, "count"] == 3
    assert t.loc[f"{blk}/2.3.*_VAE_Decode", "count"] == 3
    assert t.loc[f"{blk}/2.3.*_Update_KV_Cache", "count"] == 3  # the cache-refresh pass is inside the block


def test_rank_from_environment_in_summary_and_file_name(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_RANK", "1")
    with ProfilingSession("ranked run", config=cfg(tmp_path, report_format="json"), device="cpu") as s:
        pass
    paths = s.write_report()
    assert re.fullmatch(r"ranked-run_\d{8}-\d{6}-\d{3}_rank3\.json", paths["json"].name)
    d = json.loads(paths["json"].read_text())
    assert d["session"]["rank"] == 3 and d["session"]["world_size"] == 4 and d["session"]["local_rank"] == 1
    assert d["session"]["rank_source"] == "environment"


def test_one_session_at_a_time_and_cleanup_after_error(tmp_path):
    s = ProfilingSession("outer", config=cfg(tmp_path, generate_final_report=True, report_format="json"),
                         device="cpu")
    with pytest.raises(KeyError):
        with s:
            with pytest.raises(RuntimeError, match="one ProfilingSession at a time"):
                ProfilingSession("inner", config=cfg(), device="cpu").__enter__()
            with s.stage("work"):
                raise KeyError("x")
    assert current_session() is None and not s.monitor.running and not s.active
    t = s.stages().set_index("path")
    assert t.loc["Session/work", "count"] == 1  # the section closed despite the error
    d = json.loads(next(tmp_path.glob("*.json")).read_text())
    assert d["events"][-1]["name"] == "session_failed" and "KeyError" in d["events"][-1]["data"]["error"]


def test_disabled_session_and_global_switch(tmp_path):
    with ProfilingSession("off", config=cfg(tmp_path, enabled=False), device="cpu") as s:
        assert current_session() is None
        with s.stage("a"), s.block(0, frames=1), s.diffusion_step(0, 500):
            pass
        s.event("ignored")
    assert s.monitor is None and s.summary()["enabled"] is False
    with pytest.warns(UserWarning, match="not run with profiling enabled"):
        assert s.write_report() == {}
    set_profiling(False)
    with ProfilingSession("off2", config=cfg(tmp_path), device="cpu") as s2:
        assert current_session() is None
    assert s2.monitor is None and not list(tmp_path.iterdir())


# --- decorators -----------------------------------------------------------------------------------------


class Pipe:
    @profile_method("model_initialization")
    def init(self, n):
        time.sleep(0.01)
        return n * 2

    @add_profiling_event("checkpoint_loaded", lambda result, path, **kw: {"path": path, "result": result,
                                                                          "strict": kw.get("strict")})
    def load(self, path, strict=True):
        return "ok"

    @profile_block_computation(lambda args, kwargs: {"block_index": args[0], "frames": args[1]})
    def block(self, index, frames):
        for j, t in enumerate((1000.0, 500.0)):
            self.step(j, t)

    @profile_diffusion_step(lambda args, kwargs: {"step": args[0], "timestep": args[1]})
    def step(self, step, timestep):
        time.sleep(0.002)

    @profile_model_parameters(lambda args, kwargs: {"model_name": "linear", "model_type": "mlp"})
    def build(self):
        return torch.nn.Linear(4, 3)


def test_decorators_are_noops_without_a_session():
    p = Pipe()
    assert p.init(3) == 6 and p.load("ckpt") == "ok" and p.block(0, 1) is None
    assert isinstance(p.build(), torch.nn.Linear)

    @profile_session("never", config={"enabled": False})
    def f(x):
        assert current_session() is None
        return x + 1

    assert f(1) == 2


def test_decorators_record_inside_a_session():
    p = Pipe()
    with ProfilingSession("deco", config=cfg(), device="cpu") as s:
        assert current_session() is s
        p.init(2)
        p.load("/ckpt.pt", strict=False)
        for i in range(3):
            p.block(i, 1 if i == 0 else 4)
        p.build()
    t = s.stages().set_index("path")
    assert t.loc["Session/model_initialization", "count"] == 1
    assert t.loc["Session/model_initialization", "total_ms"] >= 9
    assert t.loc["Session/2.3_Block_*", "count"] == 3
    assert t.loc["Session/2.3_Block_*/2.3.*_Denoising_Step_1_t500", "count"] == 3
    assert s.diffusion_steps == 6
    ev = s.events()
    assert list(ev["name"]) == ["checkpoint_loaded"]
    assert ev["data"][0] == {"path": "/ckpt.pt", "result": "ok", "strict": False}
    assert s.models == [{"model_name": "linear", "parameters_count": 15, "model_type": "mlp"}]
    summ = s.summary()
    assert summ["stream"]["steady_frames"] == 8 and summ["fps"] > 0
    assert not s.errors


def test_profile_session_decorator_writes_a_report(tmp_path):
    @profile_session("decorated", tags={"mode": "t2v"}, config=cfg(tmp_path, generate_final_report=True))
    def run(n):
        s = current_session()
        assert s is not None and s.tags["mode"] == "t2v"
        with s.stage("inner"):
            return n

    assert run(5) == 5
    names = sorted(p.suffix for p in tmp_path.iterdir())
    assert names == [".html", ".json"]
    with pytest.raises(ValueError, match="report_format"):
        profile_session("bad", config={"report_format": "xml"})


def test_broken_extractor_is_reported_not_raised():
    @profile_block_computation(lambda args, kwargs: {"block_index": args[5]})
    def work(x):
        return x

    with ProfilingSession("broken", config=cfg(), device="cpu") as s:
        assert work(7) == 7
    assert any("IndexError" in e for e in s.errors)


# --- reports --------------------------------------------------------------------------------------------


class FakeBreakdown:
    """What a Breakdown offers the report: to_dict() with summary and tables."""

    def to_dict(self):
        return {"region": "2_Pipeline_Inference", "source": "cpu",
                "summary": {"busy_ms": 12.5, "top_categories": [{"category": "GEMM/linear", "share": 0.6}]},
                "tables": {"categories": [{"category": "GEMM/linear", "gpu_ms": 7.5, "share": 0.6},
                                          {"category": "attention", "gpu_ms": 5.0, "share": 0.4}],
                           "suggestions": [{"rank": 1, "finding": "denoiser forwards dominate",
                                            "evidence": "forwards 90%", "estimated_saving_ms": 3.0,
                                            "notebook": "03_step_reduction", "action": "fewer <steps>"}]},
                "ceilings": None}


def _session_with_data(tmp_path, name="rep", **kw):
    with ProfilingSession(name, config=cfg(tmp_path, **kw), device="cpu", tags={"preset": "tiny"}) as s:
        with s.generation():
            for i in range(3):
                with s.block(i, frames=1 if i == 0 else 4):
                    time.sleep(0.01)
        s.event("done", shape=[1, 3, 9, 64, 64], note="<b>escaped</b>")
        s.set_metrics({"preset": "tiny"}, steps=3)
    return s


def test_report_json_round_trip_and_self_contained_html(tmp_path):
    s = _session_with_data(tmp_path, save_raw_data=True)
    s.attach_breakdown(FakeBreakdown())
    s.set_overhead({"overhead_frac": 0.01, "overhead_ms": 0.1, "baseline_ms": {"median": 10.0},
                    "session_ms": {"median": 10.1}, "config": "production"})
    paths = s.write_report()
    assert set(paths) == {"json", "html"}
    stem = paths["json"].stem
    assert stem == paths["html"].stem == s.report_stem and stem.startswith("rep_") and stem.endswith("_rank0")
    d = report_mod.load_report(paths["json"])
    assert d == json.loads(json.dumps(s.to_dict(raw=True) | {"written_at": d["written_at"]}))
    assert d["summary"]["fps"] == pytest.approx(s.summary()["fps"])
    assert d["definitions"]["fps"] == DEFINITIONS["fps"] and "pixel frames" in d["definitions"]["fps"]
    assert [r["path"] for r in d["stages"]] == list(s.stages()["path"])
    assert d["monitor"]["samples"]["process_rss_mib"]["value"]
    assert d["breakdown"]["tables"]["suggestions"][0]["notebook"] == "03_step_reduction"
    assert d["overhead"]["overhead_frac"] == 0.01
    assert d["metrics"] == {"preset": "tiny", "steps": 3} and d["session"]["tags"] == {"preset": "tiny"}
    assert d["environment"]["torch"] == torch.__version__ and d["config"]["save_raw_data"] is True
    import diffusers
    import transformers

    assert d["environment"]["diffusers"] == diffusers.__version__
    assert d["environment"]["transformers"] == transformers.__version__

    page = paths["html"].read_text()
    assert not re.search(r"""(src|href)\s*=\s*['"]?\s*(https?:)?//""", page)
    assert "<script" not in page and "<link" not in page
    assert page.count("data:image/png;base64,") == 2  # monitor timelines + breakdown categories
    assert "denoiser forwards dominate" in page and "fewer &lt;steps&gt;" in page
    assert "&lt;b&gt;escaped&lt;/b&gt;" in page and "<b>escaped</b>" not in page
    assert "FPS" in page and "profiling overhead" in page


def test_json_without_raw_samples_but_html_keeps_timelines(tmp_path):
    s = _session_with_data(tmp_path, save_raw_data=False)
    paths = s.write_report(formats=["json", "html"])
    d = json.loads(paths["json"].read_text())
    assert "samples" not in d["monitor"] and d["monitor"]["summary"]
    assert "data:image/png;base64," in paths["html"].read_text()
    assert set(s.write_report(formats="json")) == {"json"}
    with pytest.raises(ValueError, match="formats"):
        s.write_report(formats="pdf")


def test_interrupted_writes_keep_the_previous_report(tmp_path, monkeypatch):
    s = _session_with_data(tmp_path)
    paths = s.write_report()
    old_html = paths["html"].read_text()
    s.event("after_first_report")

    def broken_render(report):
        raise MemoryError("figure too large")

    monkeypatch.setattr(report_mod, "render_html", broken_render)
    with pytest.raises(RuntimeError, match="HTML report failed.*JSON report is at"):
        s.write_report()
    assert paths["html"].read_text() == old_html  # the old HTML survives
    assert "after_first_report" in paths["json"].read_text()  # the JSON was written first
    monkeypatch.undo()

    new_json = paths["json"].read_text()

    def half_dump(obj, f, **kw):
        f.write('{"schema": "wmbook.profiling.sess')
        raise KeyboardInterrupt

    monkeypatch.setattr(report_mod.json, "dump", half_dump)
    with pytest.raises(KeyboardInterrupt):
        s.write_report(formats="json")
    monkeypatch.undo()
    assert paths["json"].read_text() == new_json
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([paths["json"].name, paths["html"].name])


def test_auto_report_failure_warns_and_keeps_json(tmp_path, monkeypatch):
    monkeypatch.setattr(report_mod, "render_html", lambda r: 1 / 0)
    with pytest.warns(UserWarning, match="report of session 'auto' failed"):
        with ProfilingSession("auto", config=cfg(tmp_path, generate_final_report=True), device="cpu") as s:
            pass
    assert "ZeroDivisionError" in s.report_error
    assert [p.suffix for p in tmp_path.iterdir()] == [".json"]


# --- overhead -------------------------------------------------------------------------------------------


def test_measure_overhead_reports_both_timings():
    a = torch.randn(64, 64)

    def fn():
        with label("work"):
            for _ in range(20):
                a @ a

    ov = measure_overhead(fn, config="production", pairs=6, warmup=1)
    assert ov["baseline_ms"]["n"] == 6 and ov["session_ms"]["n"] == 6
    lo, hi = ov["overhead_ci90"]
    assert lo <= ov["overhead_frac"] <= hi and ov["overhead_p20"] <= ov["overhead_frac"] <= ov["overhead_p80"]
    assert ov["monitor"]["groups"] == ["gpu_memory", "gpu_utilization", "system_memory"]
    assert ov["timing"] == "host perf_counter" and ov["time_labels"] is True
    assert 0 < ov["monitor"]["duration_s"] and ov["monitor"]["sampling_share_of_wall"] is not None
    acc = ov["accounted"]  # one timed label per call, at its measured host cost, plus the sampler's share
    assert acc["timed_labels_per_call"] == 1 and acc["us_per_timed_label"] >= 0
    assert acc["labels_ms"] == pytest.approx(acc["us_per_timed_label"] / 1e3)
    assert ov["accounted_frac"] == pytest.approx(acc["labels_frac"] + acc["sampler_frac"])
    assert acc["sampler_frac"] == ov["monitor"]["sampling_share_of_wall"]
    assert current_session() is None
    with pytest.raises(ValueError, match="pairs"):
        measure_overhead(fn, pairs=1)
    with ProfilingSession("busy", config=cfg(), device="cpu"):
        with pytest.raises(RuntimeError, match="outside a ProfilingSession"):
            measure_overhead(fn)


def test_measure_overhead_pairs_alternate_and_see_a_real_cost():
    """ABBA order, and a cost the session really adds (a label that sleeps only inside a session) is found with an
    interval above zero, while the same function without that cost gives an interval that holds zero or is small."""
    calls = []

    def fn():
        inside = current_session() is not None
        calls.append(inside)
        time.sleep(0.02 + (0.01 if inside else 0.0))  # long enough that a loaded machine's jitter stays small

    ov = measure_overhead(fn, config="production", pairs=4, warmup=0)
    assert calls == [False, True, True, False, False, True, True, False]
    assert ov["overhead_ci90"][0] > 0.2 and ov["overhead_frac"] == pytest.approx(0.5, abs=0.25)


def test_session_argument_errors():
    with pytest.raises(ValueError, match="name"):
        ProfilingSession("")
    with pytest.raises(ValueError, match="tags"):
        ProfilingSession("x", tags=["a"])
    with pytest.raises(ValueError, match="unknown profiling config key"):
        ProfilingSession("x", config={"bogus": 1})
    s = ProfilingSession("x", config=cfg(), device="cpu")
    with pytest.raises(ValueError, match="block index"):
        with s.block(-1):
            pass
    with pytest.raises(ValueError, match="frames"):
        with s.block(0, frames=2.5):
            pass
    with pytest.raises(ValueError, match="breakdown"):
        s.attach_breakdown(42)
