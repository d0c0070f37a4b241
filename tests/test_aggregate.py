"""Per-rank reports from a real 2-process gloo run, aggregation (min/max/mean, slowest rank), the CLI;
several paths, grouping by session, where aggregates are written, bad input."""

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from wmbook.cli import main as cli_main
from wmbook.profiling.aggregate import aggregate_reports, aggregate_sessions, group_reports
from wmbook.profiling.session import ProfilingSession

REPO = Path(__file__).resolve().parents[1]
RANK_SCRIPT = REPO / "tests" / "data" / "profiling_rank.py"
SLOW_RANK = 1


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def dist_reports(tmp_path_factory):
    """Two ranks (torchrun, gloo) each write their session report; rank SLOW_RANK runs 3x slower blocks."""
    out = tmp_path_factory.mktemp("dist_reports")
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               OMP_NUM_THREADS="1")
    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2",
           "--master-addr", "127.0.0.1", "--master-port", str(_free_port()), str(RANK_SCRIPT), str(out),
           str(SLOW_RANK)]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120, cwd=REPO)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return out


def test_each_rank_writes_its_report(dist_reports):
    files = sorted(dist_reports.glob("dist_test_*_rank*.json"), key=lambda f: f.stem[-1])
    assert [f.name[-10:] for f in files] == ["rank0.json", "rank1.json"]
    for f in files:
        d = json.loads(f.read_text())
        assert d["session"]["world_size"] == 2 and d["session"]["rank_source"] == "torch.distributed"
        assert f.stem.endswith(f"rank{d['session']['rank']}")
        assert d["summary"]["stream"]["steady_frames"] == 12


def test_aggregate_min_max_mean_and_slowest_rank(dist_reports, tmp_path):
    out = tmp_path / "agg" / "combined.json"
    agg = aggregate_reports(dist_reports, output=out)
    assert agg.session == "dist_test" and agg.world_size == 2 and agg.missing_ranks == []
    assert list(agg.ranks["rank"]) == [0, 1]
    r = agg.ranks.set_index("rank")
    m = agg.metrics.set_index("metric")
    for key in ("session_ms", "fps", "bps", "first_frame_ms", "process_rss_mib_max"):
        assert m.loc[key, "min"] == pytest.approx(r[key].min())
        assert m.loc[key, "max"] == pytest.approx(r[key].max())
        assert m.loc[key, "mean"] == pytest.approx(r[key].mean())
    assert m.loc["fps", "min_rank"] == SLOW_RANK and m.loc["session_ms", "max_rank"] == SLOW_RANK
    assert r.loc[SLOW_RANK, "fps"] < 0.6 * r.loc[1 - SLOW_RANK, "fps"]  # 3x slower blocks
    assert agg.slowest["rank"] == SLOW_RANK and agg.slowest["by"] == "session_ms"
    assert agg.slowest["excess_frac"] > 0.2
    st = agg.stages.set_index("path")
    blk = "Session/Generation/2.3_Block_*"
    assert st.loc[blk, "slowest_rank"] == SLOW_RANK and st.loc[blk, "spread"] > 0.5
    assert aggregate_reports(dist_reports, write=False, by="fps").slowest["rank"] == SLOW_RANK
    assert aggregate_reports(dist_reports, write=False, by=blk).slowest["rank"] == SLOW_RANK
    with pytest.raises(ValueError, match="neither a rank metric"):
        aggregate_reports(dist_reports, write=False, by="Session/nope")

    assert agg.paths == {"json": out, "html": out.with_suffix(".html")}
    d = json.loads(out.read_text())
    assert d["schema"] == "wmbook.profiling.aggregate/1" and d["slowest_rank"]["rank"] == SLOW_RANK
    assert d["n_reports"] == 2 and len(d["rank_table"]) == 2
    page = out.with_suffix(".html").read_text()
    assert "Slowest rank: 1" in page and "http" not in page


def test_cli_prints_the_summary(dist_reports, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    before = sorted(f.name for f in dist_reports.iterdir())
    assert cli_main(["aggregate", str(dist_reports)]) == 0
    text = capsys.readouterr().out
    assert "=== Aggregation Summary ===" in text
    assert "Total reports processed: 2" in text and "Ranks: 2 (0, 1) of world size 2" in text
    assert "=== GPU Metrics (Aggregated) ===" in text and "=== CPU Metrics (Aggregated) ===" in text
    assert "FPS - Min: " in text and "Avg: " in text
    assert f"Slowest rank: {SLOW_RANK} by session device time" in text
    # default: ./profiling_reports/aggregate of the working directory, not the input folder
    written = tmp_path / "profiling_reports" / "aggregate" / "dist_test_aggregate.json"
    assert written.exists() and written.with_suffix(".html").exists()
    assert f"Wrote (dist_test): {written}, {written.with_suffix('.html')}" in text
    assert sorted(f.name for f in dist_reports.iterdir()) == before
    assert "aggregate PATH [PATH ...]" in cli_main.__globals__["USAGE"]


def test_several_files_of_one_session(dist_reports, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    files = sorted(dist_reports.glob("dist_test_*_rank*.json"))
    assert len(files) == 2
    assert group_reports(files) == {"dist_test": files}
    # a file named twice (itself and through its folder) counts once
    assert group_reports([dist_reports, files[0]]) == {"dist_test": files}
    agg = aggregate_reports([str(f) for f in files], write=False)
    assert list(agg.ranks["rank"]) == [0, 1] and agg.sources == [str(f) for f in files]
    out = tmp_path / "one" / "dist.json"
    assert cli_main(["aggregate", str(files[0]), str(files[1]), "--output", str(out), "--no-html"]) == 0
    text = capsys.readouterr().out
    assert "Ranks: 2 (0, 1) of world size 2" in text and f"Wrote (dist_test): {out}" in text
    assert json.loads(out.read_text())["n_reports"] == 2 and not out.with_suffix(".html").exists()
    assert not (tmp_path / "profiling_reports").exists()

    # an aggregate written into the report folder is skipped when the folder is read again
    copy = tmp_path / "copy"
    shutil.copytree(dist_reports, copy)
    aggregate_reports(copy, output_dir=copy)
    assert (copy / "dist_test_aggregate.json").exists()
    assert len(aggregate_reports(copy, write=False).ranks) == 2


def _report(folder, name, rank, world=2, monkeypatch=None):
    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv("WORLD_SIZE", str(world))
    cfg = {"cpu_monitor_interval": 0.05, "generate_final_report": False, "report_format": "json",
           "output_dir": str(folder)}
    with ProfilingSession(name, config=cfg, device="cpu") as s:
        with s.block(0, frames=1):
            time.sleep(0.002)
    return s.write_report()["json"]


def test_rejects_empty_mixed_and_duplicate(tmp_path, monkeypatch, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "notes.json").write_text('{"hello": 1}')
    with pytest.raises(ValueError, match="no wmbook session reports"):
        aggregate_reports(empty)
    assert cli_main(["aggregate", str(empty)]) == 2
    assert "error: no wmbook session reports" in capsys.readouterr().err

    mixed = tmp_path / "mixed"
    _report(mixed, "alpha", 0, monkeypatch=monkeypatch)
    _report(mixed, "beta", 1, monkeypatch=monkeypatch)
    with pytest.raises(ValueError, match=r"different sessions: 'alpha' \(1 report\), 'beta' \(1 report\)"):
        aggregate_reports(mixed)  # one AggregateReport: pick a session (aggregate_sessions does each)
    assert aggregate_reports(mixed, session="beta", write=False).session == "beta"

    dup = tmp_path / "dup"
    a = _report(dup, "run", 0, monkeypatch=monkeypatch)
    time.sleep(0.002)
    b = _report(dup, "run", 0, monkeypatch=monkeypatch)
    assert a != b
    with pytest.raises(ValueError, match="rank 0 appears in 2 reports"):
        aggregate_reports(dup)
    one = aggregate_reports([a], write=False)  # a list of paths: one run, rank 1 missing
    assert one.missing_ranks == [1] and "Missing ranks: [1]" in one.text()
    with pytest.raises(ValueError, match="not a wmbook session report"):
        aggregate_reports([empty / "notes.json"])
    assert not list(dup.glob("*aggregate*"))
    assert not (tmp_path / "profiling_reports").exists()


@pytest.fixture
def two_sessions(tmp_path, monkeypatch):
    """A folder with session 'alpha' (ranks 0, 1 of 2) and session 'beta' (rank 0 of 2); cwd: tmp_path/work."""
    folder = tmp_path / "reports"
    for name, rank in (("alpha", 0), ("alpha", 1), ("beta", 0)):
        _report(folder, name, rank, monkeypatch=monkeypatch)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    return folder


def test_folder_of_two_sessions_aggregates_each(two_sessions, capsys):
    groups = group_reports(two_sessions)
    assert list(groups) == ["alpha", "beta"] and [len(v) for v in groups.values()] == [2, 1]
    assert all(p.parent == two_sessions for v in groups.values() for p in v)
    before = sorted(f.name for f in two_sessions.iterdir())

    assert cli_main(["aggregate", str(two_sessions)]) == 0
    text = capsys.readouterr().out
    assert "Session: alpha" in text and "Session: beta" in text
    assert "Ranks: 2 (0, 1) of world size 2" in text and "Missing ranks: [1]" in text
    out = Path.cwd() / "profiling_reports" / "aggregate"
    assert sorted(f.name for f in out.iterdir()) == ["alpha_aggregate.html", "alpha_aggregate.json",
                                                       "beta_aggregate.html", "beta_aggregate.json"]
    assert f"Wrote (alpha): {out / 'alpha_aggregate.json'}" in text
    assert f"Wrote (beta): {out / 'beta_aggregate.json'}" in text
    a, b = (json.loads((out / f"{n}_aggregate.json").read_text()) for n in ("alpha", "beta"))
    assert (a["session"], a["n_reports"], b["session"], b["n_reports"]) == ("alpha", 2, "beta", 1)
    assert sorted(f.name for f in two_sessions.iterdir()) == before  # nothing written into the input folder

    aggs = aggregate_sessions(two_sessions, write=False)
    assert {k: len(v.ranks) for k, v in aggs.items()} == {"alpha": 2, "beta": 1}


def test_session_picks_one_and_unknown_session_is_an_error(two_sessions, tmp_path, capsys):
    out = tmp_path / "picked"
    assert cli_main(["aggregate", str(two_sessions), "--session", "beta", "--output-dir", str(out)]) == 0
    assert "Session: beta" in (text := capsys.readouterr().out) and "Session: alpha" not in text
    assert sorted(f.name for f in out.iterdir()) == ["beta_aggregate.html", "beta_aggregate.json"]

    assert cli_main(["aggregate", str(two_sessions), "--session", "gamma"]) == 2
    err = capsys.readouterr().err
    assert "session 'gamma' is not among the sessions found" in err
    assert "'alpha' (2 reports)" in err and "'beta' (1 report)" in err
    with pytest.raises(ValueError, match="session 'gamma' is not among.*'alpha'.*'beta'"):
        aggregate_sessions(two_sessions, session="gamma")
    assert not (Path.cwd() / "profiling_reports").exists()  # nothing written
    assert sorted(f.name for f in out.iterdir()) == ["beta_aggregate.html", "beta_aggregate.json"]


def test_output_file_needs_one_session(two_sessions, tmp_path, capsys):
    out = tmp_path / "one.json"
    assert cli_main(["aggregate", str(two_sessions), "--output", str(out)]) == 2
    err = capsys.readouterr().err
    assert "output names one file, but 2 sessions were found" in err and "--session" in err
    assert "--output-dir" in err
    with pytest.raises(ValueError, match="output names one file"):
        aggregate_sessions(two_sessions, output=out)
    assert not out.exists() and not (Path.cwd() / "profiling_reports").exists()
    with pytest.raises(ValueError, match="output .* or output_dir .*not both"):
        aggregate_sessions(two_sessions, output=out, output_dir=tmp_path)
    with pytest.raises(SystemExit):  # argparse: --output and --output-dir exclude each other
        cli_main(["aggregate", str(two_sessions), "--output", str(out), "--output-dir", str(tmp_path)])
    capsys.readouterr()

    assert cli_main(["aggregate", str(two_sessions), "--session", "alpha", "--output", str(out)]) == 0
    assert json.loads(out.read_text())["session"] == "alpha" and out.with_suffix(".html").exists()
    assert f"Wrote (alpha): {out}" in capsys.readouterr().out


def test_bad_paths_are_rejected_before_anything_is_written(two_sessions, tmp_path, capsys):
    agg_json = tmp_path / "an_aggregate.json"
    aggregate_reports(two_sessions, session="alpha", output=agg_json, html=False)
    not_json = tmp_path / "page.html"
    not_json.write_text("<html></html>")
    a_list = tmp_path / "list.json"
    a_list.write_text("[1, 2]")
    missing = tmp_path / "nope"
    cases = [
        (agg_json, "is not a wmbook session report: it has schema 'wmbook.profiling.aggregate/1'"),
        (not_json, "is not a wmbook session report: it is not valid JSON"),
        (a_list, "is not a wmbook session report: it holds a JSON list"),
        (missing, "report path '.*nope' does not exist"),
    ]
    for bad, msg in cases:
        with pytest.raises(ValueError, match=msg):
            group_reports([two_sessions, bad])
        assert cli_main(["aggregate", str(two_sessions), str(bad)]) == 2
        err = capsys.readouterr().err
        assert err.startswith("wmbook aggregate: error: ")
        assert "session report (*.json)" in err or "wmbook.profiling.session/1" in err  # what is expected
    assert not (Path.cwd() / "profiling_reports").exists()
    with pytest.raises(ValueError, match="no report paths given"):
        group_reports([])
