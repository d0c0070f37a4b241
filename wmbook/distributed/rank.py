"""What a layout's code knows about its process: rank, device, the job, progress and the test faults."""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from .. import workloads
from ..atomic import atomic_write_text
from ..variants.ladder import apply_stack
from .job import JobSpec


@dataclass
class Rank:
    """What a layout's code needs to know about its process."""

    rank: int
    world: int
    device: torch.device
    job_dir: Path
    spec: JobSpec
    _last: float = 0.0

    def progress(self, stage: str, done: int, total: int, force: bool = False) -> None:
        """Where this rank is (at most a few writes a second)."""
        now = time.monotonic()
        if force or done >= total or now - self._last > 0.25:
            self._last = now
            atomic_write_text(self.job_dir / f"progress-rank{self.rank}.json",
                              json.dumps({"rank": self.rank, "stage": stage, "done": done, "total": total}))

    def fault(self, at: str) -> None:
        """The job's injected fault, if it is this rank's and due here (tests of the failure path)."""
        f = self.spec.fault
        if f and f["rank"] == self.rank and f["at"] == at:
            if f["kind"] == "exit":
                os._exit(13)  # dies without a word, as a killed process does
            if f["kind"] == "hang":
                while True:  # alive but never reaching the next collective: the others' timeout ends the job
                    time.sleep(60)
            raise RuntimeError(f"injected fault on rank {self.rank} at {at!r}")

    def pipeline(self):
        """(preset, pipeline, VariantContext): the job's reference with its stack applied, on this rank's device (the
        same seed on every rank: the same weights)."""
        wl = workloads.get(self.spec.workload)
        preset = wl.presets[self.spec.preset]
        self.progress("building the pipeline", 0, 1, force=True)
        ref = wl.reference_pipeline(preset, self.device, self.spec.seed)
        pipe, ctx = apply_stack(ref, wl, list(self.spec.stack), self.device, self.spec.compile_backend)
        return preset, pipe, ctx

    def barrier(self) -> None:
        """All ranks here, and (on a GPU) every queued kernel finished: a common start for device clocks."""
        dist.barrier()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
