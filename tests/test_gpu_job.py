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


QUEUES = SCRIPT.parent / "gpu_queues.sh"


def _queues(*args, root, cwd, env=None):
    return subprocess.run(["bash", str(QUEUES), *args], capture_output=True, text=True, timeout=60, cwd=cwd,
                          env={"PATH": "/usr/bin:/bin", "GPU_JOB_POLL": "0.2", "GPU_QUEUES_ROOT": str(root),
                               **(env or {})})


def test_queues_run_over_a_snapshot_one_per_gpu_and_pack_their_folders(tmp_path):
    tree, root, out = tmp_path / "tree", tmp_path / "root", tmp_path / "out"
    tree.mkdir()
    (tree / "file.txt").write_text("v1\n")
    r = _queues("launch", "abc123", f"sleep 1.5; mkdir -p {root}/n0a; cat file.txt > {root}/n0a/seen;;"
                f"echo $CUDA_VISIBLE_DEVICES $WMBOOK_GIT_COMMIT > gpu; echo t > {root}/n0a/trace.json.gz",
                f"mkdir -p {root}/n1a; echo $CUDA_VISIBLE_DEVICES > {root}/n1a/gpu", root=root, cwd=tree)
    assert r.returncode == 0, r.stderr
    (tree / "file.txt").write_text("v2\n")  # a later call re-sends the tree: the running steps keep the snapshot
    again = _queues("launch", "x", "true", root=root, cwd=tree)  # refused while a queue runs
    assert again.returncode == 2 and "still running" in again.stderr
    w = _queues("wait", "30", str(out), root=root, cwd=tree)
    assert w.returncode == 0, w.stdout + w.stderr
    with tarfile.open(out / "q0.tgz") as t:
        names = set(t.getnames())
        assert {"q0/status", "q0/done", "n0a/seen"} <= names and "n1a/gpu" not in names
        assert "n0a/trace.json.gz" not in names and (root / "n0a" / "trace.json.gz").exists()  # left on the machine
        assert t.extractfile("n0a/seen").read() == b"v1\n"
    with tarfile.open(out / "q1.tgz") as t:
        assert t.extractfile("n1a/gpu").read() == b"1\n"
    assert (root / "snap" / "gpu").read_text() == "0 abc123\n"


def test_relative_output_folders_are_packed_and_outlive_the_next_snapshot(tmp_path):
    """A step writing n0b/ (relative: inside the snapshot) has it packed, and a later launch, which replaces the
    snapshot, keeps it (and a relative compile cache) next to the snapshot instead of deleting it."""
    tree, root, out = tmp_path / "tree", tmp_path / "root", tmp_path / "out"
    tree.mkdir()
    r = _queues("launch", "abc", "mkdir -p n0b cache; echo rel > n0b/seen; echo c > cache/x", root=root, cwd=tree)
    assert r.returncode == 0, r.stderr
    assert _queues("wait", "30", str(out), root=root, cwd=tree).returncode == 0
    with tarfile.open(out / "q0.tgz") as t:
        assert t.extractfile("snap/n0b/seen").read() == b"rel\n"
    assert _queues("launch", "abc", "true", root=root, cwd=tree).returncode == 0
    assert _queues("wait", "30", str(out), root=root, cwd=tree).returncode == 0
    assert (root / "n0b" / "seen").read_text() == "rel\n" and (root / "cache" / "x").exists()
    with tarfile.open(out / "q0.tgz") as t:
        assert "n0b/seen" in t.getnames()


def test_queues_refuse_bad_use_and_a_gpu_they_were_not_asked_for(tmp_path):
    tree = tmp_path / "tree"
    tree.mkdir()
    bad = _queues("frobnicate", root=tmp_path / "root", cwd=tree)
    assert bad.returncode == 2 and "allowed: launch, wait" in bad.stderr
    assert _queues("launch", "abc", root=tmp_path / "root", cwd=tree).returncode == 2
    no_gpu = _queues("launch", "abc", "true", root=tmp_path / "root", cwd=tree, env={"REQUIRE_GPU": "H100"})
    assert no_gpu.returncode == 5 and "not a H100" in no_gpu.stderr and not (tmp_path / "root" / "q0").exists()


def test_queue_cpus_pins_each_queue_to_its_own_cores_and_bad_values_are_refused(tmp_path):
    import os
    tree, root, out = tmp_path / "tree", tmp_path / "root", tmp_path / "out"
    tree.mkdir()
    cores = os.cpu_count() or 1
    n = 2 if cores >= 2 else 1
    step = "mkdir -p {root}/n{i}a; grep Cpus_allowed_list /proc/self/status > {root}/n{i}a/cpus"
    r = _queues("launch", "abc", *[step.format(root=root, i=i) for i in range(n)], root=root, cwd=tree,
                env={"QUEUE_CPUS": "1"})
    assert r.returncode == 0, r.stderr
    assert _queues("wait", "30", str(out), root=root, cwd=tree).returncode == 0
    for i in range(n):  # queue i on core i alone
        assert (root / f"n{i}a" / "cpus").read_text().split() == ["Cpus_allowed_list:", str(i)]
    for bad, why in (("0", "not allowed"), ("x", "not allowed"), (str(cores + 1), "needs")):
        b = _queues("launch", "abc", "true", root=tmp_path / f"r{bad}", cwd=tree, env={"QUEUE_CPUS": bad})
        assert b.returncode == 2 and f"QUEUE_CPUS={bad}" in b.stderr and why in b.stderr, b.stderr
        assert not (tmp_path / f"r{bad}" / "q0").exists()
