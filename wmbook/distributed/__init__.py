"""Several processes, one per GPU (or CPU ranks with gloo), over plain torch.distributed: notebook 08.

Layouts (`LAYOUTS`, checked against the workload, the rank count and the host before any process starts):
- `stage-split` (streaming workloads): rank 0 denoises, rank 1 decodes; each block's clean latents cross with NCCL
  point-to-point while the next block denoises (wmbook.distributed.stream);
- `dit-pipeline` (streaming workloads): the DiT's layers in contiguous ranges over ranks, hidden states sent from
  stage to stage, one rank decoding (wmbook.distributed.pipeline);
- `decoder-split` (streaming workloads): rank 0 denoises, the other ranks decode horizontal strips of the frame with
  halo exchange (wmbook.distributed.decoder_split);
- `pipeline-split` (streaming workloads): the DiT pipeline over all ranks but two, the decoder split over those two
  (the frame's halves);
- `data-parallel` (interaction loops): one independent loop per rank and a batch sweep (wmbook.distributed.rollouts).

`run_job(JobSpec(...), folder)` starts the ranks with torchrun, shows their progress and returns each rank's result
(wmbook.distributed.launch); each rank also writes a ProfilingSession report under `<job>/sessions/`, which
`wmbook aggregate` merges (slowest rank, per-rank busy and idle, communication stages). NVLink multicast stays off
in every rank (`NO_MULTICAST_ENV`).
"""

from .job import (
    HALVES,
    LAYOUTS,
    NO_MULTICAST_ENV,
    PIPELINE_LAYOUTS,
    STREAM_LAYOUTS,
    JobError,
    JobFailed,
    JobSpec,
    Layout,
    check_job,
)
from .launch import JobResult, run_job

__all__ = ["HALVES", "LAYOUTS", "NO_MULTICAST_ENV", "PIPELINE_LAYOUTS", "STREAM_LAYOUTS", "JobError", "JobFailed",
           "JobResult", "JobSpec", "Layout", "check_job", "run_job"]
