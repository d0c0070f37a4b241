"""tools/gpu_job.sh: steps run detached in order, a failing step does not stop the next, `wait` returns as soon as
the job is done (exit 0) or says it is still running (exit 3), `pack` bundles the logs."""

import subprocess
import tarfile
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "tools" / "gpu_job.sh"


def _job(*args, env=None, check=False):
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "GPU_JOB_POLL": "0.2", **(env or {})}, check=check)


def test_steps_run_in_order_and_wait_returns_when_done(tmp_path):
    res = tmp_path / "res"
    r = _job("start", str(res), "echo one; exit 3", "sleep 0.5; echo two")
    assert r.returncode == 0 and "started 2 step(s)" in r.stdout
    again = _job("start", str(res), "true")  # one job per folder at a time
    assert again.returncode == 2 and "already running" in again.stderr
    w = _job("wait", str(res), "30")
    assert w.returncode == 0 and w.stdout.rstrip().endswith("done"), w.stdout
    status = (res / "status").read_text().splitlines()
    assert [s.split(" ", 1)[1] for s in status if " rc " in s] == ["step 01 rc 3", "step 02 rc 0"]
    assert (res / "step-01.log").read_text() == "one\n" and (res / "step-02.log").read_text() == "two\n"
    _job("pack", str(res), str(tmp_path / "out"), check=True)
    with tarfile.open(tmp_path / "out" / "results.tgz") as t:
        assert {"./status", "./step-01.log", "./step-02.log", "./done"} <= set(t.getnames())


def test_wait_says_still_running_and_bad_use_is_refused(tmp_path):
    res = tmp_path / "res"
    _job("start", str(res), "sleep 3", check=True)
    w = _job("wait", str(res), "1")
    assert w.returncode == 3 and "still running after 1s" in w.stdout
    assert _job("wait", str(res), "30").returncode == 0
    bad = _job("frobnicate", str(res))
    assert bad.returncode == 2 and "allowed: start, wait, pack" in bad.stderr
    assert _job("start", str(tmp_path / "r2")).returncode == 2
