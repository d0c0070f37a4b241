"""Per-rank reports from a real 2-process gloo run, aggregation (min/max/mean, slowest rank), the CLI."""

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from wmbook.cli import main as cli_main
from wmbook.profiling.aggregate import aggregate_reports
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


def test_cli_prints_the_summary(dist_reports, capsys):
    assert cli_main(["aggregate", str(dist_reports)]) == 0
    text = capsys.readouterr().out
    assert "=== Aggregation Summary ===" in text
    assert "Total reports processed: 2" in text and "Ranks: 2 (0, 1) of world size 2" in text
    assert "=== GPU Metrics (Aggregated) ===" in text and "=== CPU Metrics (Aggregated) ===" in text
    assert "FPS - Min: " in text and "Avg: " in text
    assert f"Slowest rank: {SLOW_RANK} by session device time" in text
    written = dist_reports / "dist_test_aggregate.json"
    assert written.exists() and f"Wrote: {written}" in text
    # the aggregate in the folder is not mistaken for a rank report on the next run
    assert len(aggregate_reports(dist_reports, write=False).ranks) == 2
    assert "aggregate" in cli_main.__globals__["USAGE"]


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
    with pytest.raises(ValueError, match="different sessions: 'alpha': 1 report.*'beta': 1 report"):
        aggregate_reports(mixed)

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
