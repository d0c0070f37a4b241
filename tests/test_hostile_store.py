"""Faults against what is written: the results store (torn and malformed files, a failing disk, concurrent appends,
a killed writer, rows lost since the last commit, an interrupted run) and the files the loaders read (cut, random,
empty, malicious, EMA-only checkpoints), and shipping weights all or nothing. Each case asserts the message, and that
nothing already written changed."""

from __future__ import annotations

import errno
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from hostile import GUARDED, ROOT, fingerprint

from wmbook import results
from wmbook.errors import InputError
from wmbook.models.checkpoint import CheckpointFileError, read_state_dict

STORE = ROOT / "data" / "results" / "results.csv"


@pytest.fixture(autouse=True)
def nothing_written_changes():
    before = fingerprint(GUARDED)
    yield
    assert fingerprint(GUARDED) == before, "a fault changed the README, the store or the shipped weights"


def _row(i=0, **kw):
    return results.make_row(notebook="t", workload="mg2", preset="tiny", variant=f"v{i}", metric="m", value=float(i),
                             unit="ms", params={"i": i, "quote": 'a "b", c'}, warmup=0, repeats=1) | kw


def _store(tmp_path, n=6) -> Path:
    p = tmp_path / "r.csv"
    results.append([_row(i) for i in range(n)], p)
    return p


def _torn(raw: bytes, how: str) -> bytes:
    lines = raw.splitlines(keepends=True)
    if how == "cut mid row":
        return raw[: len(raw) - len(lines[-1]) // 2]
    if how == "cut inside a quoted field":
        return raw[: raw.rindex(b'"{') + 6]
    if how == "last line end missing":
        return raw[:-1]
    if how == "a field too many":
        return b"".join(lines[:3]) + lines[3].replace(b",", b",,", 1) + b"".join(lines[4:])
    if how == "a value that is not a number":
        head = lines[0].decode().split(",")
        cells = lines[2].decode().split(",")
        cells[head.index("value")] = "fractio"
        return b"".join(lines[:2]) + ",".join(cells).encode() + b"".join(lines[3:])
    if how == "bytes that are not UTF-8":
        return b"".join(lines[:4]) + b"\xff\xfe" + b"".join(lines[4:])
    if how == "an empty run_id":
        return lines[0] + lines[1].replace(lines[1].split(b",")[1], b"", 1) + b"".join(lines[2:])
    if how == "a header without run_id":
        return lines[0].replace(b"run_id,", b"runid,") + b"".join(lines[1:])
    if how == "a repeated header column":
        return lines[0].replace(b"variant,", b"metric,") + b"".join(lines[1:])
    raise ValueError(how)


TORN = ["cut mid row", "cut inside a quoted field", "last line end missing", "a field too many",
        "a value that is not a number", "bytes that are not UTF-8", "an empty run_id", "a header without run_id",
        "a repeated header column"]


@pytest.mark.parametrize("how", TORN)
def test_a_torn_or_malformed_store_is_named_on_read_and_never_padded(tmp_path, how):
    p = _store(tmp_path)
    bad = _torn(p.read_bytes(), how)
    p.write_bytes(bad)
    found = results.problems(p)
    assert found and all(f.startswith("line ") for f in found), found
    with pytest.raises(results.StoreError, match=r"fails its check: line \d+"):
        results.read(p)
    with pytest.raises(results.StoreError, match="Nothing was read or written"):
        results.append([_row(99)], p)
    assert p.read_bytes() == bad  # the half row is not padded into a full-width one


def test_the_committed_store_is_sound():
    assert results.check(STORE) == []


def test_append_to_a_folder_is_refused(tmp_path):
    with pytest.raises(InputError, match="results_path=.* is a folder"):
        results.append([_row()], tmp_path)


def test_rows_that_would_break_the_store_are_refused(tmp_path):
    p = _store(tmp_path)
    before = p.read_bytes()
    with pytest.raises(results.StoreError, match="value='abc' is not a number.*nothing was written"):
        results.append([_row(7, value="abc")], p)
    with pytest.raises(results.StoreError, match="run_id is empty"):
        results.append([_row(7, run_id="")], p)
    assert p.read_bytes() == before


@pytest.mark.parametrize("where", ["fsync", "replace"])
def test_a_failing_disk_leaves_the_store_as_it_was(tmp_path, monkeypatch, where):
    """A full disk at the sync or the rename of an append: the store keeps its bytes, no temporary file is left."""
    from wmbook import atomic

    p = _store(tmp_path)
    before = p.read_bytes()

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(atomic.os, where, full)
    with pytest.raises(OSError, match="No space"):
        results.append([_row(9)], p)
    monkeypatch.undo()
    assert p.read_bytes() == before and results.problems(p) == []
    assert sorted(f.name for f in tmp_path.iterdir()) == ["r.csv", "r.csv.lock"]


def _git(repo, *args):
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args], check=True,
                   capture_output=True)


def test_rows_lost_since_the_last_commit_are_named(tmp_path, monkeypatch, capsys):
    """A committed store cut at a row boundary is well formed, but the last commit holds rows it lost: check()
    names the run, and published refuses to write from it."""
    from wmbook import published

    _git(tmp_path, "init", "-q")
    p = tmp_path / "results.csv"
    results.append([_row(i, run_id="old") for i in range(3)] + [_row(i, run_id="new") for i in range(3)], p)
    _git(tmp_path, "add", "results.csv")
    _git(tmp_path, "commit", "-q", "-m", "rows")
    assert results.check(p) == []
    cut = b"".join(p.read_bytes().splitlines(keepends=True)[:4])
    p.write_bytes(cut)
    assert results.problems(p) == []
    (lost,) = results.lost_since_commit(p)
    assert "3 row(s) of run new" in lost
    monkeypatch.setenv("WMBOOK_RESULTS", str(p))
    assert published.main(["--write"]) == 2
    assert "no longer in the file" in capsys.readouterr().err
    assert p.read_bytes() == cut


def test_sealed_rows_move_to_a_part_read_and_checked_with_the_store(tmp_path, capsys):
    """`wmbook results seal H100` moves the H100 rows into results.h100.csv: every read sees the same rows, appends
    go to the store alone, check() follows moved rows (none lost), names a deleted part's rows as lost and rows left in
    both files; a device with no rows is refused naming the parameter, and nothing changes."""
    from wmbook import cli

    _git(tmp_path, "init", "-q")
    p = tmp_path / "results.csv"
    old = [_row(i, run_id="old", device_name="NVIDIA H100 80GB HBM3") for i in range(3)]
    results.append(old + [_row(i, run_id="new", device_name="NVIDIA H200") for i in range(3)], p)
    _git(tmp_path, "add", "results.csv")
    _git(tmp_path, "commit", "-q", "-m", "rows")
    before = results.read(p)
    assert cli.main(["results", "seal", "H100", str(p)]) == 0
    part = tmp_path / "results.h100.csv"
    assert "3 rows moved to" in capsys.readouterr().out and results.sealed_parts(p) == [part]
    assert len(results.read(part)) == 3 and set(results.read(p)["device_name"]) == set(before["device_name"])
    assert results.read(p).sort_values(["run_id", "variant"]).reset_index(drop=True).equals(
        before.sort_values(["run_id", "variant"]).reset_index(drop=True))
    assert results.check(p) == []  # the moved rows are in the part, not lost
    sealed = part.read_bytes()
    results.append([_row(9, run_id="later", device_name="NVIDIA H200")], p)
    assert part.read_bytes() == sealed and len(results.read(p)) == 7
    store = p.read_bytes()
    with pytest.raises(InputError, match=r"device='B200' is not allowed.*allowed values: part of one of"):
        results.seal("B200", p)
    assert p.read_bytes() == store and part.read_bytes() == sealed
    p.write_bytes(store + b"".join(sealed.splitlines(keepends=True)[1:2]))  # a seal cut short: a row in both files
    assert results.problems(p) == ["results.h100.csv: 1 row(s) are in results.csv too (a seal cut short: remove "
                                   "them from results.csv)"]
    p.write_bytes(store)
    part.unlink()
    (lost,) = results.check(p)
    assert "3 row(s) of run old" in lost


APPENDER = """
import sys
from wmbook import results
path, tag, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
for i in range(n):
    results.append([results.make_row(notebook="t", workload="w", preset="tiny", variant=f"{tag}{i}", metric="m",
                                     value=float(i), unit="ms", params={"i": i}) | {"run_id": tag} for _ in range(3)],
                   path)
    print(i, flush=True)
"""


def test_concurrent_appends_keep_every_row(tmp_path):
    p = tmp_path / "r.csv"
    procs = [subprocess.Popen([sys.executable, "-c", APPENDER, str(p), tag, "6"], stdout=subprocess.DEVNULL)
             for tag in ("a", "b", "c")]
    assert [q.wait(timeout=300) for q in procs] == [0, 0, 0]
    df = results.read(p)
    assert results.check(p) == [] and len(df) == 3 * 6 * 3
    assert df.groupby("run_id").size().to_dict() == {"a": 18, "b": 18, "c": 18}


def test_a_writer_killed_mid_append_leaves_whole_rows(tmp_path):
    """SIGKILL at any moment of an append loop: the store holds whole appends only (3 rows each) and reads clean."""
    p = tmp_path / "r.csv"
    q = subprocess.Popen([sys.executable, "-c", APPENDER, str(p), "k", "10000"], stdout=subprocess.PIPE, text=True)
    for _ in range(4):
        q.stdout.readline()
    time.sleep(0.05)
    q.send_signal(signal.SIGKILL)
    q.wait(timeout=60)
    assert results.problems(p) == []
    n = len(results.read(p))
    assert n >= 12 and n % 3 == 0
    results.append([_row()], p)  # and the next append goes on from there
    assert len(results.read(p)) == n + 1


SLOW_NB = """
from wmbook import results
results.append([results.make_row(notebook="t", workload="w", preset="tiny", variant="v", metric="m", value=1.0,
                                 unit="ms", params={})], results_path)
print("appended", flush=True)
import time
time.sleep(120)
"""


def _terminal_sigint() -> None:
    """SIGINT as a terminal's foreground job gets it: neither ignored nor blocked. A child inherits both, and a test
    worker that ran other tests before (threads of the libraries they load) does not promise either."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _background_sigint() -> None:
    """SIGINT as an asynchronous command of a non-interactive shell gets it (`cmd &` in a script, as
    tools/gpu_set.sh starts a set): ignored. The command must still stop on it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.mark.parametrize("started", ["terminal", "background"])
def test_an_interrupted_run_leaves_no_success_report_and_whole_rows(tmp_path, started):
    """Ctrl-C during `wmbook run`: exit 130, rows appended before it whole, no report that looks like a success;
    the same for a run started in the background of a script (SIGINT ignored when it starts)."""
    import nbformat

    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("results_path = ''")
    cell.metadata["tags"] = ["parameters"]
    nb.cells = [cell, nbformat.v4.new_code_cell(SLOW_NB)]
    nb.metadata["kernelspec"] = {"name": "python3", "language": "python", "display_name": "Python 3"}
    nbformat.write(nb, tmp_path / "nb_slow.ipynb")
    store, out = tmp_path / "r.csv", tmp_path / "report"
    q = subprocess.Popen([sys.executable, "-m", "wmbook", "run", str(tmp_path / "nb_slow.ipynb"), "--out", str(out),
                          "-p", "results_path", str(store), "-q"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, cwd=ROOT, start_new_session=True,
                         preexec_fn=_terminal_sigint if started == "terminal" else _background_sigint)
    deadline = time.time() + 240
    while (not (store.exists() and results.problems(store) == [] and len(results.read(store)))
           and time.time() < deadline):
        time.sleep(0.5)
    os.killpg(q.pid, signal.SIGINT)  # Ctrl-C in a terminal: the whole foreground group, the kernel too
    t0 = time.time()
    try:
        _, err = q.communicate(timeout=120)
    except subprocess.TimeoutExpired:  # say what the runner had written, not only that it hung
        ended = q.poll()
        os.killpg(q.pid, signal.SIGKILL)
        try:
            _, err = q.communicate(timeout=10)
        except subprocess.TimeoutExpired:  # a kernel of its own session still holds the pipes
            err = "(its stderr still held open by another process)"
        pytest.fail(f"`wmbook run` {'ended with ' + str(ended) if ended is not None else 'still ran'} "
                    f"{time.time() - t0:.0f} s after Ctrl-C, its pipes still open; success report written: "
                    f"{(out / 'nb_slow.html').exists()}; stderr: {err[-3000:]}")
    # the runner's own line; the kernel, stopped mid-reply, may log its socket closing (its stderr is the terminal's)
    assert q.returncode == 130 and "wmbook run: interrupted" in err and not re.search(r'File ".*/wmbook/', err), err
    assert len(results.read(store)) == 1 and results.problems(store) == []
    assert not (out / "nb_slow.html").exists() and not (out / "executed" / "nb_slow.ipynb").exists()


# --- checkpoint files ---------------------------------------------------------------------------------------------
class _Evil:
    """A pickle whose loading would run a command (what a malicious checkpoint holds)."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _bad_file(tmp_path, kind) -> Path:
    good = tmp_path / "good.pt"
    torch.save({"w": torch.ones(64, 64)}, good)
    p = tmp_path / ("x.safetensors" if "safetensors" in kind else "x.pt")
    if kind == "truncated .pt":
        p.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    elif kind == "random .pt":
        p.write_bytes(random.Random(0).randbytes(2048))  # seeded: the unpickler's failure depends on the bytes
    elif kind == "empty .pt":
        p.write_bytes(b"")
    elif kind == "a folder":
        p.mkdir()
    elif kind == "malicious .pt":
        torch.save({"w": _Evil(tmp_path / "pwned")}, p)
    elif kind == "a list, not a dict":
        torch.save([torch.zeros(2)], p)
    elif kind in ("truncated .safetensors", "random .safetensors"):
        from safetensors.torch import save_file

        save_file({"w": torch.ones(64, 64)}, p)
        p.write_bytes(p.read_bytes()[:-100] if kind.startswith("truncated") else os.urandom(512))
    return p


LOADS = {"truncated .pt": "cut short or corrupted", "random .pt": "not a torch checkpoint", "empty .pt": "it is empty",
         "missing .pt": "no such file", "a folder": "it is a folder", "malicious .pt": "holds pickled Python objects",
         "a list, not a dict": "not a dict of tensors", "truncated .safetensors": "not a valid .safetensors file",
         "random .safetensors": "not a valid .safetensors file"}


@pytest.mark.parametrize("kind", list(LOADS))
def test_a_file_that_is_not_a_checkpoint_is_named_and_refused(tmp_path, kind):
    p = _bad_file(tmp_path, kind)
    with pytest.raises(CheckpointFileError) as e:
        read_state_dict(p)
    msg = str(e.value)
    assert str(p) in msg and LOADS[kind] in msg and "allowed values" in msg
    assert "weights_only=False" not in msg and "Weights only load failed" not in msg
    assert not (tmp_path / "pwned").exists()  # the malicious pickle's command never ran


def test_random_bytes_are_named_not_a_checkpoint_whatever_the_unpickler_trips_on(tmp_path):
    """Random bytes fail inside the unpickler in many ways (IndexError, KeyError, UnicodeDecodeError, ...): each is
    the one message, never the unpickler's own words."""
    p = tmp_path / "x.pt"
    for seed in range(200):
        p.write_bytes(random.Random(seed).randbytes(2048))
        with pytest.raises(CheckpointFileError, match="not a torch checkpoint"):
            read_state_dict(p)


def test_loaders_refuse_bad_files_and_leave_the_model_unchanged(tmp_path):
    from wmbook.models.causal_wan import CausalWanModel, load_checkpoint
    from wmbook.models.taehv import build_taehv, load_taehv_decoder
    from wmbook.presets import get_preset

    torch.manual_seed(0)
    model = CausalWanModel(get_preset("tiny"))
    dec = build_taehv("tiny")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    dbefore = {k: v.clone() for k, v in dec.state_dict().items()}
    for kind in ("truncated .pt", "malicious .pt", "random .safetensors"):
        p = _bad_file(tmp_path, kind)
        with pytest.raises(CheckpointFileError, match="x\\."):
            load_checkpoint(model, p)
        with pytest.raises(CheckpointFileError):
            load_taehv_decoder(dec, p)
        p.unlink()
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(torch.equal(dbefore[k], v) for k, v in dec.state_dict().items())
    assert not (tmp_path / "pwned").exists()


def test_a_wma_checkpoint_of_ema_weights_only_says_so(tmp_path):
    from wmbook.models.wma import WMAWorldModel
    from wmbook.models.wma.mapping import load_upstream_checkpoint, to_upstream_keys, upstream_ema_key
    from wmbook.presets import get_preset

    torch.manual_seed(0)
    src = WMAWorldModel(get_preset("tiny-wma")).eval()
    torch.manual_seed(1)
    dst = WMAWorldModel(get_preset("tiny-wma")).eval()
    ema = {upstream_ema_key(to_upstream_keys(k)[0]): v.clone() for k, v in src.named_parameters()
           if k.startswith("diffusion_model.")}
    ema = {k: v for k, v in ema.items() if k is not None}
    before = {k: v.clone() for k, v in dst.state_dict().items()}
    with pytest.raises(ValueError, match="holds only EMA weights.*use_ema=True"):
        load_upstream_checkpoint(dst, {"state_dict": ema})
    assert all(torch.equal(before[k], v) for k, v in dst.state_dict().items())


@pytest.mark.parametrize("kind", ["truncated .pt", "random .pt", "malicious .pt"])
def test_world_weights_that_are_not_weights(tmp_path, kind):
    from wmbook.world.weights import read_weights

    p = _bad_file(tmp_path, kind)
    with pytest.raises(CheckpointFileError, match=LOADS[kind]) as e:
        read_weights(p)
    assert "weights_only=False" not in str(e.value)


# --- shipping weights ---------------------------------------------------------------------------------------------
def test_the_shipping_rule_names_why_a_run_does_not_ship():
    from wmbook.world.eval import shipping_failures

    base = {"psnr": 17.3, "ssim": 0.31, "agent_err_px": 24.2}
    assert shipping_failures({"psnr": 20.4, "ssim": 0.49, "agent_err_px": 7.7}, base) == []
    fails = shipping_failures({"psnr": 14.1, "ssim": 0.2, "agent_err_px": float("nan")}, base)
    assert len(fails) == 3 and fails[0].startswith("PSNR 14.1 is not above")
    assert len(shipping_failures({}, base)) == 3  # no scores: no shipping


def test_shipping_is_all_or_nothing(tmp_path, monkeypatch):
    """A failure while the run's files are copied over the shipped ones leaves every shipped file as it was."""
    import json

    from wmbook import atomic
    from wmbook.world.weights import ship_weights

    run, shipped = tmp_path / "run", tmp_path / "shipped"
    run.mkdir()
    shipped.mkdir()
    (run / "world-mg2.pt").write_bytes(b"new")
    (run / "world-mg2.pt.json").write_text(json.dumps({"loss_csv": "world-mg2.loss.csv"}, indent=2) + "\n")
    (run / "world-mg2.loss.csv").write_text("step,loss\n1,0.5\n")
    for name in ("world-mg2.pt", "world-mg2.pt.json", "world-mg2.loss.csv"):
        (shipped / name).write_text("old " + name)
    before = fingerprint([shipped])
    calls = []
    real = atomic.os.fsync

    def fail_third(fd):
        calls.append(fd)
        if len(calls) == 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd)

    monkeypatch.setattr(atomic.os, "fsync", fail_third)
    with pytest.raises(OSError, match="No space"):
        ship_weights(run / "world-mg2.pt", shipped / "world-mg2.pt")
    monkeypatch.undo()
    assert fingerprint([shipped]) == before  # no file replaced, no temporary file left
    for dst in ship_weights(run / "world-mg2.pt", shipped / "world-mg2.pt"):
        assert dst.read_bytes() == (run / dst.name).read_bytes()
