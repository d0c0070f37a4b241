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
    out = tmp_path / "out"
    r = subprocess.run(["bash", str(REPO / "tools" / "gpu_set.sh"), "wait", "0", str(out)], capture_output=True,
                       text=True, env={"GPU_SET_ROOT": str(tmp_path / "root"), "PATH": "/usr/bin:/bin"}, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "01-mg2: ok" in r.stdout and "the slice is still running" in r.stdout
    parts = sorted(out.glob("set-part-*"))
    assert parts
    joined = tmp_path / "joined.tgz"
    joined.write_bytes(b"".join(p.read_bytes() for p in parts))
    with tarfile.open(joined) as t:
        names = t.getnames()
    assert "./set.json" in names and "./runs/01-mg2/summary.json" in names
    assert any(n.startswith("./slice-") and n.endswith(".log") for n in names)
    assert not any(n.startswith("./cache") for n in names)
