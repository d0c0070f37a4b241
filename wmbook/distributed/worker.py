"""One rank of a job: `python -m wmbook.distributed.worker JOB_DIR`, started by torchrun (wmbook.distributed.launch).

It reads JOB_DIR/job.json, joins the process group (NCCL with one GPU per rank, gloo on CPUs; the job's timeout
bounds every wait on another rank), runs its part of the layout and writes JOB_DIR/rank<r>.json. A rank that fails
writes JOB_DIR/error-rank<r>.json (its error and traceback) and exits non-zero; torchrun then ends the other ranks.
While it runs, JOB_DIR/progress-rank<r>.json says where it is (the launcher's progress bar reads it).
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import traceback
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

from ..atomic import atomic_write_text
from ..profiling.jsonable import jsonable
from .job import NO_MULTICAST_ENV, JobSpec
from .rank import Rank

# layout -> (module, function): a rank imports only its layout's module, after it has joined the group (the decoder
# split's alone pulls in diffusers' autoencoders, seconds per rank), so a rank that fails early fails fast
RUNNERS = {"stage-split": ("stream", "run_stage_split"), "data-parallel": ("rollouts", "run_data_parallel"),
           "dit-pipeline": ("pipeline", "run_dit_pipeline"), "decoder-split": ("decoder_split", "run_decoder_split"),
           "pipeline-split": ("pipeline", "run_dit_pipeline")}


def runner(layout: str):
    """The function that runs `layout` on a rank (RUNNERS)."""
    module, name = RUNNERS[layout]
    return getattr(importlib.import_module(f".{module}", __package__), name)


RANK_GPU_ENV = "WMBOOK_RANK_GPU"  # the host's name of the GPU a rank holds, set when the rank starts over with it


def own_gpu_env(local: int, env=os.environ) -> dict | None:
    """The environment in which this rank sees its own GPU, and only it, as `cuda:0`; None when it already runs in it.

    Why: a compiled graph's cache key holds its inputs' device, and a graph compiled for `cuda:1` is a miss for a rank
    on `cuda:0`, so only ranks that see their GPU alike load each other's compiles from the shared cache
    (rollouts.share_compiles). CUDA reads CUDA_VISIBLE_DEVICES once, when the driver starts, and any import may start
    it (torch.cuda.is_available() does): setting it inside a running process does not hold, so the rank starts over
    (exec) with it set. The host's numbering (or UUIDs) of torchrun's visible set is kept in RANK_GPU_ENV."""
    if env.get(RANK_GPU_ENV):
        return None
    ids = [x.strip() for x in env["CUDA_VISIBLE_DEVICES"].split(",") if x.strip()] \
        if env.get("CUDA_VISIBLE_DEVICES") else None
    gpu = ids[local] if ids is not None and local < len(ids) else str(local)
    return {**env, "CUDA_VISIBLE_DEVICES": gpu, RANK_GPU_ENV: gpu}


def own_gpu(env=os.environ) -> tuple[torch.device, str]:
    """(`cuda:0`, the host's name of the GPU) in a rank started with own_gpu_env's environment; an error naming the
    visible set when the rank sees more than its GPU."""
    n = torch.cuda.device_count()
    if n != 1:
        raise RuntimeError(f"a rank must see exactly its own GPU, it sees {n} (CUDA_VISIBLE_DEVICES="
                           f"{env.get('CUDA_VISIBLE_DEVICES')!r})")
    return torch.device("cuda", 0), env[RANK_GPU_ENV]


@record  # torchrun's error file gets this rank's traceback as well
def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    job_dir = Path(argv[0])
    spec = JobSpec.read(job_dir / "job.json")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    os.environ.update(NO_MULTICAST_ENV)  # also where a rank was started without the launcher: NCCL reads it at init
    try:
        gpu = None
        if spec.device == "cuda":
            env = own_gpu_env(local)
            if env is not None:  # start over seeing only this rank's GPU: same process id, torchrun keeps watching it
                sys.stdout.flush()
                sys.stderr.flush()
                os.execve(sys.executable, [sys.executable, "-m", "wmbook.distributed.worker", *argv], env)
            device, gpu = own_gpu()
            torch.cuda.set_device(device)
            dist.init_process_group("nccl", timeout=timedelta(seconds=spec.timeout_s), device_id=device)
        else:
            device = torch.device("cpu")
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))  # the host's cores shared between ranks
            dist.init_process_group("gloo", timeout=timedelta(seconds=spec.timeout_s))
        rk = Rank(rank, world, device, job_dir, spec)
        rk.progress("starting", 0, 1, force=True)
        rk.fault("start")
        result = runner(spec.layout)(rk)
        result.update(rank=rank, world=world, device=str(device) if gpu is None else f"cuda (GPU {gpu} of the host)")
        atomic_write_text(job_dir / f"rank{rank}.json", json.dumps(jsonable(result), indent=1))
        rk.progress("done", 1, 1, force=True)
        dist.barrier()  # no rank leaves while another may still send to it
        dist.destroy_process_group()
        return 0
    except BaseException as e:
        err = {"rank": rank, "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
        atomic_write_text(job_dir / f"error-rank{rank}.json", json.dumps(err, indent=1))
        raise


if __name__ == "__main__":
    sys.exit(main())
