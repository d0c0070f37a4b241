"""Side tables of notebook 04 built on the ladder's measurement: each variant alone, the VAE in each dtype and
layout, and the cast/copy/host-read counts of a forward per stack of variants."""

from __future__ import annotations

import copy

import pandas as pd
import torch
from torch.profiler import ProfilerActivity, profile
from tqdm.auto import tqdm

from .. import check
from ..bench import time_fn
from ..presets import DTYPES
from ..profiling.breakdown import CAST_OPS
from ..workloads import E2ESize, get
from .ladder import GateReference, LadderSettings, _changes_precision, apply_stack, flop_floor_ms, measure
from .registry import GlobalFlags, resolve
from .swaps import to_memory_format

VARIANT_COLUMNS = ["variant", "gate", "tolerance", "rel_l2_vs_fp32", "allowed_rel_l2", "budget_rel_l2",
                   "max_rel_same_precision", "mean_rel_same_precision", "forward_ms", "forward_p20", "forward_p80",
                   "speedup", "x_floor", "gpu_busy_ms", "busy_x_floor", "peak_memory_gib", "first_call_s",
                   "graph_breaks", "note"]


def variant_table(ref, workload, names: list[str], *, device: torch.device,
                  settings: LadderSettings = LadderSettings()) -> pd.DataFrame:
    """Each variant alone on the fp32 reference (not stacked): gate, forward time, speedup, x floor."""
    wl = get(workload)
    vs = resolve(names, wl, device)
    flags = GlobalFlags()
    rows = []
    gate_ref, base = None, None
    try:
        for v in tqdm([None, *vs], desc="variants", leave=False):
            flags.restore()
            if gate_ref is not None:  # alone, a variant that keeps the precision keeps fp32: fp32 is its anchor
                keep = not _changes_precision(v)
                gate_ref.same_precision = gate_ref.forward if keep else None
                gate_ref.same_precision_rel_l2 = 0.0 if keep else None
            row, out, _ = measure(ref, wl, [] if v is None else [v], device, settings, gate_ref, e2e=False)
            if v is None:
                gate_ref, base = GateReference(forward=out, frames=None), row.forward.median
            row.variant = "fp32 eager (reference)" if v is None else v.name
            row.finish(flop_floor_ms(row.flops, settings.ceilings), base, None, wl.metric)
            rows.append(row.record())
    finally:
        flags.restore()
    return pd.DataFrame(rows).reindex(columns=VARIANT_COLUMNS).set_index("variant")


def vae_table(ref, workload, dtypes=("fp32", "bf16", "fp16"), *, device: torch.device, seed: int = 0,
              repeats: int = 3, size=None, layouts=(False,)) -> pd.DataFrame:
    """The reference's latents decoded by the VAE in each dtype (and layout): PSNR against the fp32 decode, time.

    The quality column is what matters here: a bf16 VAE has cost a competition team 12 dB PSNR.
    """
    wl = get(workload)
    for d in dtypes:
        if d not in DTYPES:
            raise ValueError(f"dtype {d!r} is not allowed; allowed values: {list(DTYPES)}")
        if d == "fp16" and device.type != "cuda":
            raise ValueError("dtype 'fp16' needs a CUDA device for the VAE table; leave it out on a CPU")
    latents = wl.end_to_end(ref, seed, size or E2ESize(blocks=2, ddim_steps=3)).latents
    rows, ref_frames = [], None
    for d in dtypes:
        for cl in layouts:
            pipe = copy.copy(ref)  # shares the denoiser; only the VAE is replaced
            wl.set_vae(pipe, copy.deepcopy(ref.vae).to(DTYPES[d]))
            if cl:
                for layout in wl.conv_layouts(pipe):
                    if layout.module is pipe.vae:
                        to_memory_format(pipe.vae, layout.memory_format)
            frames = wl.decode(pipe, latents).float()
            with torch.no_grad():
                tm = time_fn(lambda pipe=pipe: wl.decode(pipe, latents), warmup=1, repeats=repeats, device=device)
            if ref_frames is None:
                ref_frames = frames
            q = check.compare(frames, ref_frames, dtype="fp32", frames=True)
            rows.append({"vae_dtype": d, "channels_last": cl, "decode_ms": tm.median, "p20": tm.p20, "p80": tm.p80,
                         "frames": int(frames.shape[2]), "ms_per_frame": tm.median / frames.shape[2],
                         "psnr_db": q.psnr, "max_abs": q.max_abs})
            del pipe
    return pd.DataFrame(rows)


def op_counts(ref, workload, stacks: dict[str, list[str]], *, device: torch.device, seed: int = 0) -> pd.DataFrame:
    """aten ops per forward that cast or copy, host reads (syncs) and kernel launches, for each stack of variants.

    Counted with torch.profiler on one warm forward of the probe (what the hygiene variants are about).
    """
    wl = get(workload)
    flags = GlobalFlags()
    rows = []
    try:
        for name, names in stacks.items():
            flags.restore()
            pipe, _ = apply_stack(ref, wl, names, device)
            probe = wl.forward_probe(pipe, seed)
            with torch.no_grad():
                probe.forward()
                acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
                with profile(activities=acts) as prof:
                    probe.forward()
                    if device.type == "cuda":
                        torch.cuda.synchronize(device)
            ka = {e.key: e.count for e in prof.key_averages()}
            row = {"stack": name, "variants": " + ".join(names) or "-"}
            for op in CAST_OPS:
                row[op] = ka.get(op, 0)
            row["host reads (aten::_local_scalar_dense)"] = ka.get("aten::_local_scalar_dense", 0)
            row["aten ops"] = sum(c for k, c in ka.items() if k.startswith("aten::"))
            if device.type == "cuda":
                row["kernels"] = sum(1 for e in prof.events() if getattr(e, "device_type", None) is not None
                                     and str(e.device_type).endswith("CUDA") and e.name
                                     and not e.name.startswith("aten::"))
            rows.append(row)
            del pipe
    finally:
        flags.restore()
    return pd.DataFrame(rows).set_index("stack")


def casts(row) -> int:
    """Cast and copy ops of one op_counts() row."""
    return int(sum(row[op] for op in CAST_OPS))


__all__ = ["casts", "op_counts", "variant_table", "vae_table"]
