"""Compile a ladder's compiled rows ahead, side by side, so that the rows read their compiles from the cache.

A cold compile of a whole denoiser is minutes of single-threaded Python in inductor (its lowering and code
generation; NOTES.md: 116 of a whole UNet's 185 s), and a ladder compiles one per row that changes the denoiser's
graphs: notebook 05's kernel rows at wma, six of them, were 705 s of a 20-minute run. More cores do not shorten one
compile; several processes compiling different stacks at once do. Before the timed rows, one process per such
stack builds the fp32 reference, applies the stack, runs the probe's forward and a short end-to-end run, and
leaves the compiled code in the on-disk compile cache (TORCHINDUCTOR_CACHE_DIR and TRITON_CACHE_DIR, inherited);
each row then compiles from that cache (dynamo's tracing again, the FX graphs and kernels loaded). Nothing is timed
while they run. A process that fails or runs past its time only costs the row its cold compile, as before.

    ahead = compile_ahead(workload, preset, stacks, device, processes="auto", seed=0, e2e=E2ESize(...))
    ahead.first_call_s(stack)   # that stack's cold first call in its own process (beside the others)

`python -m wmbook.variants.compile_ahead --workload W --preset P --stack a,b,c --json PATH` is one such process.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm.auto import tqdm

from ..atomic import atomic_write_text
from ..process_group import package_env, stop_group

_GIB = 2**30


def check_processes(v) -> int | str:
    """`compile_ahead`: 'auto' or an integer >= 0 (0: none, each row compiles in turn)."""
    if v == "auto" or (isinstance(v, int) and not isinstance(v, bool) and v >= 0):
        return v
    raise ValueError(f"compile_ahead={v!r} is not allowed; allowed values: 'auto' or an integer >= 0 (processes; 0: "
                     "none)")


def planned(steps: list, from_row: int, comparisons: dict, builds_afresh) -> list[list]:
    """The stacks a ladder compiles afresh, each once, in the order it measures them, every row taken to pass:
    row 0 and rows from_row.. (the ladder's own `builds_afresh(stack, i, built_row)` decides which build a new
    pipeline), then the comparison rows; only those holding a compile variant."""
    out, built = [], None
    for i in [0, *range(from_row, len(steps) + 1)]:
        stack = steps[:i]
        if builds_afresh(stack, i, built) and any(v.family == "compile" for v in stack):
            out.append(stack)
        built = i
    out += [list(s) for s in comparisons.values() if any(v.family == "compile" for v in s)]
    return list({Ahead.key(s): s for s in out}.values())  # each stack once, at its first place


@dataclass
class Ahead:
    """What the processes did: per stack (its names joined with ','), ok, its cold first call, its seconds."""

    processes: int
    wall_s: float = math.nan
    runs: dict = field(default_factory=dict)  # key -> {"ok", "first_call_s", "s", "error"}
    skipped: str = ""  # why no process ran ('' when they did)
    fewer: str = ""  # why fewer processes than stacks ran at once ('' when one per stack)

    @staticmethod
    def key(stack) -> str:
        return ",".join(v if isinstance(v, str) else v.name for v in stack)

    def first_call_s(self, stack) -> float:
        r = self.runs.get(self.key(stack))
        return float(r["first_call_s"]) if r and r.get("ok") else math.nan

    def note(self, stack) -> str:
        """A row's note: compiled ahead (its cold first call there), or why its compile was not."""
        r = self.runs.get(self.key(stack))
        if r is None:
            return ""
        if r.get("ok"):
            e2e = f"; its end-to-end run there failed ({r['e2e_error']})" if r.get("e2e_error") else ""
            return (f"compiled ahead beside {self.processes - 1} other process(es): cold first call "
                    f"{r['first_call_s']:.1f} s there; the first call here reads that compile from the cache{e2e}")
        return f"not compiled ahead ({r.get('error') or 'no result'}): its first call here is a cold compile"

    def mark(self, row, stack) -> None:
        """A measured row's cold first call in its process (LadderRow.compiled_ahead_s) and note."""
        row.compiled_ahead_s = self.first_call_s(stack)
        row.note = "; ".join(n for n in (row.note, self.note(stack)) if n)

    def summary(self) -> str:
        if self.skipped:
            return f"no compile ahead: {self.skipped}"
        ok = sum(1 for r in self.runs.values() if r.get("ok"))
        return (f"{ok} of {len(self.runs)} compiled stacks compiled ahead in {self.wall_s:.0f} s by "
                f"{self.processes} process(es) side by side" + (f" (no more for {self.fewer})" if self.fewer else ""))


def auto_processes(n: int, device: torch.device, cpus: int | None = None) -> tuple[int, str]:
    """(processes, why fewer): at most one per stack, one per two cores (each compile is one busy Python thread, its
    Triton compile workers the rest) and as many as the GPU's free memory holds at about 1.3x what this process has
    allocated (the fp32 reference each process builds, with the stack applied in place) plus 2 GiB."""
    cpus = cpus or os.cpu_count() or 1
    k, why = min(n, max(1, cpus // 2)), ""
    if k < n:
        why = f"{cpus} core" + ("s" if cpus != 1 else "")
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        need = 1.3 * torch.cuda.memory_allocated(device) + 2 * _GIB
        by_mem = int(0.9 * free // need)
        if by_mem < k:
            k, why = by_mem, f"{free / _GIB:.0f} GiB free on the GPU, about {need / _GIB:.0f} GiB a process"
    return k, why


def for_ladder(workload, preset, steps: list, from_row: int, comparisons: dict, device: torch.device, settings,
               builds_afresh) -> Ahead | None:
    """The ladder's compiles ahead (LadderSettings.compile_ahead), or None where none are made: off a GPU, with
    another backend than inductor, and with 'auto' where the workload compiles regions (mg2's one DiT block: seconds a
    compile, less than a process takes to build the reference)."""
    n = settings.compile_ahead
    if not n or device.type != "cuda" or settings.compile_backend != "inductor" or (
            n == "auto" and workload.compile_scope != "whole"):
        return None
    stacks = planned(steps, from_row, comparisons, builds_afresh)
    return compile_ahead(workload, preset, stacks, device, processes=n, seed=settings.seed, e2e=settings.e2e,
                         backend=settings.compile_backend)


def _tail(path: Path, lines: int = 3) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return " | ".join(s.strip() for s in text[-lines:])[-400:]


def compile_ahead(workload, preset, stacks: list, device: torch.device, *, processes="auto", seed: int = 0,
                  e2e=None, backend: str = "inductor", timeout_s: float = 600.0, progress: bool = True) -> Ahead:
    """Run one process per stack (at most `processes` at once; 'auto': auto_processes), each compiling its stack
    into the shared on-disk cache; wait for all of them (each at most timeout_s). An interrupt stops them all."""
    processes = check_processes(processes)
    name = getattr(preset, "name", preset)
    if not stacks or processes == 0:
        return Ahead(0, skipped="nothing to compile" if not stacks else "compile_ahead=0")
    known = workload.presets.get(name)
    if known is None or (not isinstance(preset, str) and known != preset):
        return Ahead(0, skipped=f"preset {name!r} is not the workload's preset of that name")
    n, why = (auto_processes(len(stacks), device) if processes == "auto" else (min(processes, len(stacks)), ""))
    if n < 1:
        return Ahead(0, skipped=why)
    if n == 1 and len(stacks) == 1:  # one compile: the row does it itself, nothing to overlap
        return Ahead(0, skipped="one compiled stack: the row compiles it")
    env = package_env(TORCHINDUCTOR_COMPILE_THREADS=str(max(1, (os.cpu_count() or 1) // n)))
    tmp = Path(tempfile.mkdtemp(prefix="wmbook-ahead-"))
    ahead = Ahead(n, fewer=why if n < len(stacks) else "")
    todo = list(enumerate(stacks))
    running: dict[int, tuple] = {}  # index -> (proc, started, key, log path, json path)
    t0 = time.monotonic()
    bar = tqdm(total=len(stacks), desc=f"compiling {len(stacks)} stacks ahead, {n} at once", disable=not progress,
               leave=False)
    try:
        while todo or running:
            while todo and len(running) < n:
                i, stack = todo.pop(0)
                key, out, log = Ahead.key(stack), tmp / f"{i}.json", tmp / f"{i}.log"
                cmd = [sys.executable, "-m", "wmbook.variants.compile_ahead", "--workload", workload.name,
                       "--preset", name, "--device", str(device), "--backend", backend, "--seed", str(seed),
                       "--stack", key, "--json", str(out)]
                if e2e is not None:
                    cmd += ["--e2e-blocks", str(e2e.blocks), "--e2e-ddim-steps", str(e2e.ddim_steps)]
                with open(log, "wb") as f:
                    p = subprocess.Popen(cmd, env=env, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True)
                running[i] = (p, time.monotonic(), key, log, out)
            for i, (p, started, key, log, out) in list(running.items()):
                late = time.monotonic() - started > timeout_s
                if p.poll() is None and not late:
                    continue
                if late and p.poll() is None:
                    stop_group(p, term_wait_s=5)
                    ahead.runs[key] = {"ok": False, "error": f"stopped after timeout_s={timeout_s:.0f} s"}
                else:
                    try:
                        ahead.runs[key] = json.loads(out.read_text()) | {"ok": p.returncode == 0}
                    except (OSError, ValueError):
                        ahead.runs[key] = {"ok": False, "error": f"exit code {p.returncode}; its log ends: "
                                                                 f"{_tail(log)}"}
                del running[i]
                bar.update(1)
            time.sleep(0.2)
    except BaseException:
        for p, *_ in running.values():
            stop_group(p, term_wait_s=5)
        raise
    finally:
        bar.close()
        shutil.rmtree(tmp, ignore_errors=True)
    ahead.wall_s = time.monotonic() - t0
    return ahead


def _child(a) -> dict:
    """One process: the stack compiled and run once (the probe's forward, a short end-to-end run)."""
    from .. import workloads  # noqa: PLC0415  heavy: every workload and variant
    from ..workloads import E2ESize  # noqa: PLC0415
    from .registry import apply_variants, resolve  # noqa: PLC0415

    dev = torch.device(a.device)
    wl = workloads.get(a.workload)
    vs = resolve([s for s in a.stack.split(",") if s], wl, dev)
    t0 = time.perf_counter()
    pipe = wl.reference_pipeline(wl.presets[a.preset], dev, a.seed)
    apply_variants(pipe, wl, vs, dev, a.backend)  # in place: this process needs no reference of its own
    probe = wl.forward_probe(pipe, a.seed)
    t1 = time.perf_counter()
    with torch.no_grad():
        probe.forward()
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    out = {"first_call_s": time.perf_counter() - t1}
    if a.e2e_blocks:  # the shapes and modules the probe does not reach (conditioning, decoder)
        try:  # the forward's compile is in the cache already: a failure here leaves the row only these to compile
            wl.end_to_end(pipe, a.seed, wl.graph_warmup_size(E2ESize(a.e2e_blocks, a.e2e_ddim_steps)))
        except Exception as e:  # noqa: BLE001 - reported with the result
            out["e2e_error"] = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}"
    return out | {"s": time.perf_counter() - t0}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", required=True)
    ap.add_argument("--preset", required=True)
    ap.add_argument("--stack", required=True, help="comma-separated variant names")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--backend", default="inductor")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--e2e-blocks", type=int, default=0, help="0: no end-to-end run")
    ap.add_argument("--e2e-ddim-steps", type=int, default=1)
    ap.add_argument("--json", required=True)
    a = ap.parse_args(argv)
    try:
        res = _child(a)
    except Exception as e:  # noqa: BLE001 - reported to the ladder, whose row then compiles cold
        first = (str(e).splitlines() or [""])[0][:300]
        atomic_write_text(a.json, json.dumps({"error": f"{type(e).__name__}: {first}"}))
        raise
    atomic_write_text(a.json, json.dumps(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
