"""tools/gpu_set.sh's `wait SECONDS OUT`: the slice's progress, then the slice so far packed into OUT, so a command
that ends brings back the runs finished by then even if the machine is gone before the next one."""

import json
import subprocess
import tarfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_wait_with_an_out_folder_packs_the_slice_so_far(tmp_path):
    slice_dir = tmp_path / "root" / "set-slice"
    (slice_dir / "set" / "runs" / "01-mg2").mkdir(parents=True)
    (slice_dir / "set" / "set.json").write_text(json.dumps({"jobs": []}))
    (slice_dir / "set" / "runs" / "01-mg2" / "summary.json").write_text("{}")
    (slice_dir / "set" / "cache").mkdir()  # the compile cache stays on the machine
    (slice_dir / "set" / "cache" / "big.bin").write_bytes(b"x" * 1000)
    (slice_dir / "log").write_text("[q0] 01-mg2: ok (1.0 min)\n")
    (slice_dir / "started").write_text("20261204T153000\n")
    out = tmp_path / "out"
    out.mkdir()
    (out / "set-part-zz").write_bytes(b"an earlier pack's last part")
    for _ in range(2):  # each pack of the slice keeps one log, named by the slice's start
        r = subprocess.run(["bash", str(REPO / "tools" / "gpu_set.sh"), "wait", "0", str(out)], capture_output=True,
                           text=True, env={"GPU_SET_ROOT": str(tmp_path / "root"), "PATH": "/usr/bin:/bin"},
                           timeout=60)
        assert r.returncode == 0, r.stderr
    assert [f.name for f in (slice_dir / "set").glob("slice-*.log")] == ["slice-20261204T153000.log"]
    assert "01-mg2: ok" in r.stdout and "the slice is still running" in r.stdout
    parts = sorted(out.glob("set-part-*"))
    assert parts and out / "set-part-zz" not in parts
    joined = tmp_path / "joined.tgz"
    joined.write_bytes(b"".join(p.read_bytes() for p in parts))
    with tarfile.open(joined) as t:
        names = t.getnames()
    assert "./set.json" in names and "./runs/01-mg2/summary.json" in names
    assert "./slice-20261204T153000.log" in names
    assert not any(n.startswith("./cache") for n in names)
