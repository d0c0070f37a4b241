"""Data-parallel rollouts: one independent interaction loop per rank (its own episodes; nothing exchanged while it
runs), each sweeping the episodes per forward (batch).

Two phases, each timed with device events after warm-up: rank 0 alone (the other ranks wait at a barrier: one GPU's
throughput, measured in the same job) and then every rank at once (the job's throughput: the sum over ranks). Per
batch size, every rank first runs one untimed iteration on the same seed; its world-model frames are compared with
rank 0's (same stack, same seed, same kind of GPU). They need not be bit-equal: on two H200s notebook 06's wma
stack gave frames 48.3 dB apart while each GPU repeated itself bit for bit (data/reports/NOTES.md), so the gate
is a PSNR (wmbook.studies.multi_gpu.GATE_DB). Before the sweep the ranks split its compiles (share_compiles).
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from .. import check, workloads
from ..bench import Samples
from ..profiling import ProfilingSession
from ..variants.builtin import warm_up
from ..workloads import E2ESize
from .rank import Rank


def _iterations(pipe, inputs, steps: int, n: int, rk: Rank, what: str) -> Samples:
    """n timed iterations (ms each, device events), after the job's warm-up."""
    rk.progress(f"{what} warm-up", 0, rk.spec.warmup)  # then shorter iterations while a graph is not captured
    short = workloads.get(rk.spec.workload).graph_warmup_size(E2ESize(ddim_steps=steps)).ddim_steps
    warm_up(pipe, lambda: pipe.run_iteration(inputs, ddim_steps=steps, progress=False), rk.spec.warmup,
            again=lambda: pipe.run_iteration(inputs, ddim_steps=short, progress=False))
    ms = Samples()
    for i in range(n):
        rk.progress(what, i, n)
        ms.values.append(pipe.run_iteration(inputs, ddim_steps=steps, progress=False).iteration_ms)
    return ms


def share_compiles(pipe, batches: list[int], steps: int, rk: Rank) -> list[int]:
    """Each batch size compiled by one rank: rank r first runs one untimed iteration at batches r, r + world, ...,
    then every rank waits for all. A compiled stack's graphs are static, so each batch size is a compile of its own
    (a cold one of the whole UNet: minutes); the ranks share one compile cache (inductor's, on disk) and each sees its
    GPU as `cuda:0` (worker.own_gpu_env: a cached graph is keyed by its inputs' device), so the sweep's first
    iteration at a batch another rank compiled loads its graphs instead of compiling them again, and the sweep pays
    about one cold compile per `world` batch sizes instead of one per batch size on every rank at once. Returns this
    rank's batch sizes."""
    mine = batches[rk.rank::rk.world] if rk.world > 1 else []
    for i, b in enumerate(mine):
        rk.progress(f"compiling batch {b}", i, len(mine))
        pipe.run_iteration(pipe.prepare(seed=rk.spec.seed, batch=b), ddim_steps=steps, progress=False)
    rk.barrier()
    return mine


def run_data_parallel(rk: Rank) -> dict:
    """This rank's part of a data-parallel job (module docstring); the result JSON of the rank."""
    spec = rk.spec
    preset, pipe, ctx = rk.pipeline()
    steps = spec.ddim_steps or preset.default_steps
    compiled = share_compiles(pipe, list(spec.batches), steps, rk)
    rows = []
    for b in spec.batches:
        if rk.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(rk.device)
        same = pipe.prepare(seed=spec.seed, batch=b)
        mine = pipe.prepare(seed=spec.seed + 1000 * rk.rank, batch=b)  # this rank's own episodes
        frames = pipe.run_iteration(same, ddim_steps=steps, progress=False).world.frames.float().contiguous()
        theirs = frames.clone()
        dist.broadcast(theirs, src=0)
        gate = check.compare(frames, theirs, dtype="fp32", frames=True)
        rk.fault("run")
        alone = None
        rk.barrier()
        if rk.rank == 0:
            alone = _iterations(pipe, mine, steps, spec.repeats, rk, f"batch {b}, one GPU")
        rk.barrier()
        t0 = time.perf_counter()
        together = _iterations(pipe, mine, steps, spec.repeats, rk, f"batch {b}, all ranks")
        mine_s = time.perf_counter() - t0  # this rank's timed phase (its warm-up included), before waiting for the rest
        rk.barrier()
        phase_s = time.perf_counter() - t0
        row = {"batch": b, "iteration_ms": together.summary(), "phase_s": phase_s, "own_s": mine_s,
               "episodes_per_s": b / (together.median / 1e3),
               "psnr_vs_rank0_db": gate.psnr, "bit_equal_to_rank0": bool(torch.equal(frames, theirs)),
               "peak_memory_gib": torch.cuda.max_memory_allocated(rk.device) / 2**30
               if rk.device.type == "cuda" else float("nan")}
        if alone is not None:
            row.update(alone_iteration_ms=alone.summary(), alone_episodes_per_s=b / (alone.median / 1e3))
        rows.append(row)
    with ProfilingSession("08_data_parallel", device=rk.device, output_dir=rk.job_dir / "sessions",
                          tags={"layout": "data-parallel", "preset": spec.preset}) as s:
        with s.stage("Interaction_Iteration"):
            out = pipe.run_iteration(pipe.prepare(seed=spec.seed + 1000 * rk.rank, batch=spec.batches[0]),
                                     ddim_steps=steps, progress=False)
        s.set_metrics(iteration_ms=out.iteration_ms, batch=spec.batches[0])
    dist.barrier()
    last = rows[-1]  # the largest batch: busy is this rank's own timed phase, idle its wait for the slowest rank
    return {"layout": "data-parallel", "stack": list(spec.stack), "notes": ctx.notes, "ddim_steps": steps,
            "batches": rows, "compiled_batches": compiled, "busy_ms": {"median": last["own_s"] * 1e3},
            "wall_ms": {"median": last["phase_s"] * 1e3}}
