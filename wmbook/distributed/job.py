"""A multi-process job: what it runs (workload, preset, layout, stack) over how many ranks, checked before any
process starts.

A job is a plain, JSON-serialisable description: the launcher writes it to the job folder and every rank reads
it back, so a rank never depends on the notebook's process state.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from .. import workloads

# Process environment of every rank: NVLink SHARP (NVLS) multicast and symmetric memory are off. Multicast objects on a
# shared multi-GPU host can take its GPUs out of service; nothing here needs them (point-to-point sends and small
# collectives only).
NO_MULTICAST_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


@dataclass(frozen=True)
class Layout:
    """How a workload's work is spread over ranks."""

    name: str
    requires: frozenset[str]  # workload features the layout needs
    min_ranks: int
    max_ranks: int | None  # None: any number from min_ranks
    description: str


LAYOUTS = {
    "stage-split": Layout(
        "stage-split", frozenset({"streaming_decoder"}), 2, 2,
        "rank 0 denoises (every DiT forward of a block, the cache refresh included) and sends each block's clean "
        "latents to rank 1, which decodes them with the streaming decoder while rank 0 denoises the next block"),
    "data-parallel": Layout(
        "data-parallel", frozenset({"denoiser"}), 1, None,
        "one independent interaction loop per rank (its own episodes and seeds, nothing exchanged while it runs); "
        "throughput is the sum over ranks, and each rank sweeps the episodes per forward (batch)"),
    "dit-pipeline": Layout(
        "dit-pipeline", frozenset({"streaming_decoder", "kv_cache"}), 2, None,
        "the DiT's blocks split into contiguous ranges over ranks (chosen from measured per-layer times), a forward's "
        "hidden state sent from stage to stage and each step's next input back to the first; from 3 ranks on the "
        "last rank decodes, with 2 the second stage also decodes"),
    "decoder-split": Layout(
        "decoder-split", frozenset({"streaming_decoder", "kv_cache"}), 3, None,
        "rank 0 denoises as in the stage split and sends each block's clean latents to every other rank; those decode "
        "horizontal strips of the frame with the streaming decoder, exchanging halo rows (the causal caches' "
        "included) before every spatial convolution"),
    "pipeline-split": Layout(
        "pipeline-split", frozenset({"streaming_decoder", "kv_cache"}), 4, None,
        "the DiT pipeline over all ranks but the last two (as dit-pipeline), the decoder split over the last two: the "
        "top and bottom halves of the frame with halo exchange (as decoder-split)"),
}
# one stream over the ranks (FPS, first frame, frames gated)
STREAM_LAYOUTS = ("stage-split", "dit-pipeline", "decoder-split", "pipeline-split")
PIPELINE_LAYOUTS = ("dit-pipeline", "pipeline-split")  # the DiT's layers over ranks
HALVES = 2  # pipeline-split: the decoder ranks (the frame's top and bottom halves)


def dit_ranks(nproc: int, layout: str = "dit-pipeline") -> int:
    """How many ranks hold the DiT's layers: dit-pipeline all but the decoder rank from 3 ranks on, both of 2;
    pipeline-split all but the two decoder halves."""
    if layout == "pipeline-split":
        return nproc - HALVES
    return nproc - 1 if nproc >= 3 else nproc


def decoder_ranks(nproc: int, layout: str = "dit-pipeline") -> list[int]:
    """The ranks that decode in a DiT pipeline: the last one (with 2 ranks, the last DiT stage), or the two halves."""
    return list(range(nproc - HALVES, nproc)) if layout == "pipeline-split" else [nproc - 1]


class JobError(ValueError):
    """A job that cannot run as described (raised before any process starts; names the parameter)."""


class JobFailed(RuntimeError):
    """A job whose ranks did not all finish: names each failed rank and its error."""

    def __init__(self, message: str, failures: dict[int, str], partial: dict[int, dict]):
        super().__init__(message)
        self.failures = failures  # rank -> its error (or how it ended)
        self.partial = partial  # rank -> the result it wrote before the job ended (those that finished)


@dataclass(frozen=True)
class JobSpec:
    """One job. `stack`: variant names applied to the reference on every rank (the single-GPU stack the layout is
    gated against). `blocks` (streaming) / `ddim_steps` (UNet) size one run; `repeats` timed runs after `warmup`.
    `batches`: episodes per forward swept by data-parallel rollouts. `fault`: for tests of the failure path,
    {"rank": r, "at": "start" | "run", "kind": "raise" | "exit" | "hang"}."""

    workload: str
    preset: str
    layout: str
    nproc: int
    device: str = "cpu"  # cpu (gloo) | cuda (nccl, one GPU per rank)
    stack: tuple[str, ...] = ()
    compile_backend: str = "inductor"
    blocks: int = 4
    ddim_steps: int = 0
    batches: tuple[int, ...] = (1,)
    warmup: int = 1
    repeats: int = 3
    seed: int = 0
    timeout_s: float = 600.0  # a rank waiting longer than this on another ends the job (process-group timeout)
    fault: dict = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    @classmethod
    def from_json(cls, text: str) -> "JobSpec":
        d = json.loads(text)
        d["stack"], d["batches"] = tuple(d["stack"]), tuple(d["batches"])
        return cls(**d)

    @classmethod
    def read(cls, path) -> "JobSpec":
        return cls.from_json(Path(path).read_text())


def _positive_int(name: str, v, low: int = 1) -> None:
    if isinstance(v, bool) or not isinstance(v, int) or v < low:
        raise JobError(f"{name}={v!r} is not allowed; allowed values: an integer >= {low}")


def check_job(spec: JobSpec, gpus: int | None = None) -> None:
    """Every field of a job against the layout, the workload and the host, before any process starts (JobError naming
    the field and what is allowed). `gpus`: CUDA devices on this host (None: counted here)."""
    if spec.layout not in LAYOUTS:
        raise JobError(f"layout={spec.layout!r} is not allowed; allowed values: {sorted(LAYOUTS)}")
    layout = LAYOUTS[spec.layout]
    try:
        wl = workloads.get(spec.workload)
    except ValueError as e:
        raise JobError(str(e)) from None
    if spec.preset not in wl.presets:
        raise JobError(f"preset={spec.preset!r} is not a preset of workload {wl.name!r}; allowed values: "
                       f"{sorted(wl.presets)}")
    missing = sorted(layout.requires - wl.features)
    if missing:
        fits = sorted(n for n, lay in LAYOUTS.items() if lay.requires <= wl.features)
        raise JobError(f"layout={spec.layout!r} needs a workload with {missing}; {wl.name!r} has none: allowed "
                       f"layouts for it: {fits}")
    _positive_int("nproc", spec.nproc)
    hi = layout.max_ranks
    if spec.nproc < layout.min_ranks or (hi is not None and spec.nproc > hi):
        allowed = str(layout.min_ranks) if hi == layout.min_ranks else (
            f"{layout.min_ranks}..{hi}" if hi is not None else f">= {layout.min_ranks}")
        raise JobError(f"nproc={spec.nproc} is not allowed for layout {spec.layout!r}; allowed values: {allowed}")
    if spec.layout in PIPELINE_LAYOUTS:  # every DiT rank holds at least one layer
        layers = wl.presets[spec.preset].num_layers
        if dit_ranks(spec.nproc, spec.layout) > layers:
            lo = LAYOUTS[spec.layout].min_ranks
            hi = layers + spec.nproc - dit_ranks(spec.nproc, spec.layout)
            raise JobError(f"nproc={spec.nproc} is not allowed for layout {spec.layout!r} at preset {spec.preset!r} "
                           f"({layers} layers); allowed values: {lo}..{hi}")
    if spec.layout == "decoder-split":  # every decoder rank holds at least one latent row
        h = wl.presets[spec.preset].latent_hw[0]
        if spec.nproc - 1 > h:
            raise JobError(f"nproc={spec.nproc} is not allowed for layout 'decoder-split' at preset {spec.preset!r} "
                           f"({h} latent rows); allowed values: 3..{h + 1}")
    if spec.device not in ("cpu", "cuda"):
        raise JobError(f"device={spec.device!r} is not allowed; allowed values: ['cpu', 'cuda']")
    if spec.device == "cuda":
        n = torch.cuda.device_count() if gpus is None else gpus
        if spec.nproc > n:
            raise JobError(f"nproc={spec.nproc} needs {spec.nproc} GPUs (one per rank); this host has {n}")
    _positive_int("blocks", spec.blocks, 2 if spec.layout in STREAM_LAYOUTS else 1)
    _positive_int("ddim_steps", spec.ddim_steps, 0)
    _positive_int("warmup", spec.warmup, 0)
    _positive_int("repeats", spec.repeats)
    _positive_int("seed", spec.seed, 0)
    if not spec.batches or not isinstance(spec.batches, tuple):
        raise JobError(f"batches={spec.batches!r} is not allowed; allowed values: a non-empty list of integers >= 1")
    for b in spec.batches:
        _positive_int("batches", b)
    if isinstance(spec.timeout_s, bool) or not isinstance(spec.timeout_s, (int, float)) \
            or not math.isfinite(spec.timeout_s) or spec.timeout_s <= 0:
        raise JobError(f"timeout_s={spec.timeout_s!r} is not allowed; allowed values: a finite number of seconds > 0")
    if spec.stack:
        from .. import variants  # noqa: PLC0415  heavy: the variants (compile) stack

        try:
            variants.resolve(list(spec.stack), wl, torch.device(spec.device))
        except ValueError as e:
            raise JobError(f"stack: {e}") from None
    if spec.fault:
        if set(spec.fault) != {"rank", "at", "kind"} or spec.fault["at"] not in ("start", "run") \
                or spec.fault["kind"] not in ("raise", "exit", "hang") or not 0 <= spec.fault["rank"] < spec.nproc:
            raise JobError(f"fault={spec.fault!r} is not allowed; allowed values: {{'rank': 0..{spec.nproc - 1}, "
                           f"'at': 'start' | 'run', 'kind': 'raise' | 'exit' | 'hang'}}")
