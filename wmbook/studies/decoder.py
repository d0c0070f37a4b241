"""The streaming decoder as an optimization target: the same latents decoded by each decoder stack, ms per steady
block against the decoder's own FLOP floor, PSNR of the frames against the fp32 decoder, the first pass (compile and
capture included), the decoder's memory.

Decoder variants change nothing upstream of the decoder, so they are measured on the decoder alone: the fp32
reference pipeline generates the latents once, and every row decodes exactly those latents, block by block, as the
streaming loop does. A row passes its gate when its frames are within DECODER_PSNR_DB of the fp32 decoder's; a
stand-in decoder with random weights (vae-tiny without a weights file) cannot be judged and says so; its own
variants (layout, compile, graphs) are gated against the plain stand-in's frames (`PSNR dB vs plain stand-in`).
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from .. import check, variants
from .. import results as results_store
from ..bench import DeviceTimer, Samples
from ..device import floor_ms
from ..profiling.analysis.kernels import kernel_summary
from ..profiling.collect import profile_calls
from ..variants import GlobalFlags, VariantContext
from ..variants.builtin import warm_up
from ..variants.compile import reset_compile_state

DECODER_PSNR_DB = 40.0  # dB against the fp32 decoder on the same latents: the gate of a full-decoder variant


def decoder_stacks(workload, device: torch.device, compile_modes=("default",)) -> dict[str, list[str]]:
    """The decoder rows, each a stack of variant names: for a streaming decoder cumulative (bf16 with cuDNN's algorithm
    search, caches in place, channels-last, compile, graphs, a steady block a step call), then the tiny decoder; for a
    per-frame decoder the fp32 one compiled and captured, and bf16 (`frame_decoder_stacks`). On a GPU every row but the
    fp32 reference searches, and none claims the search alone: cuDNN's first pick per shape holds for the process (the
    `cudnn-benchmark` variant), so rows after notebook 06's ladder also take its picks."""
    known = variants.known(workload)
    if "streaming_decoder" not in workload.features:
        return frame_decoder_stacks(workload, device, compile_modes) if "frame_decoder" in workload.features else {}
    gpu = device.type == "cuda"
    low = ["vae-bf16", "cudnn-benchmark"] if gpu else []
    rows = {"fp32 (reference)": []}
    if gpu:
        rows["bf16 + cudnn-benchmark"] = low
    buffers = low + ["vae-stream-buffers"]
    rows["+ vae-stream-buffers"] = buffers
    rows["+ vae-channels-last"] = buffers + ["vae-channels-last"]
    if not gpu:  # on a GPU after the compiled, captured step (below)
        rows["+ vae-channels-last + vae-block-step"] = buffers + ["vae-channels-last", "vae-block-step"]
    for mode in compile_modes:
        name = "vae-compile" + ("" if mode == "default" else "-max-autotune")
        # inductor chooses convolution layouts itself: compiled with and without channels-last input windows (the
        # comparison on a GPU only: on a CPU each compiled row is compile time, and tests/test_decoder.py checks both)
        rows[f"+ {name}"] = buffers + ["vae-channels-last", name]
        if gpu:
            rows[f"{name} on contiguous buffers"] = buffers + [name]
    if gpu:  # the decoder's blocks compiled one shape at a time (the step between them eager): less to compile
        rows["+ vae-compile-regional"] = buffers + ["vae-channels-last", "vae-compile-regional"]
    if gpu:
        rows["+ vae-cuda-graphs (channels-last, eager step)"] = buffers + ["vae-channels-last", "vae-cuda-graphs"]
        rows["+ vae-cuda-graphs (compiled step)"] = buffers + ["vae-channels-last", "vae-compile", "vae-cuda-graphs"]
        # a steady block's latent frames in one call of the compiled, captured step
        rows["+ vae-block-step (compiled step, captured)"] = rows["+ vae-cuda-graphs (compiled step)"] + [
            "vae-block-step"]
        # the head's 3-channel convolution as a GEMM and shifted sums, in that step
        rows["+ vae-head-gemm (block step, compiled, captured)"] = buffers + [
            "vae-channels-last", "vae-head-gemm", "vae-compile", "vae-cuda-graphs", "vae-block-step"]
        # the resamplers' nearest upsampling and 3 x 3 convolution as one stride-2 transposed convolution
        rows["+ vae-upsample-fold (head gemm, block step, compiled, captured)"] = buffers + [
            "vae-channels-last", "vae-upsample-fold", "vae-head-gemm", "vae-compile", "vae-cuda-graphs",
            "vae-block-step"]
    if gpu:  # the window kernels captured in place of the compiled step (a comparison row: Triton kernels on a GPU)
        rows["+ vae-window-kernels + vae-cuda-graphs"] = buffers + ["vae-channels-last", "vae-window-kernels",
                                                                    "vae-cuda-graphs"]
    tiny = ["vae-bf16", "cudnn-benchmark", "vae-tiny"] if gpu else ["vae-tiny"]
    rows["tiny decoder (TAEHV)"] = tiny
    # the tiny decoder's own levers (its 2-D convolutions in channels-last, its block step compiled and captured),
    # each gated against the plain tiny decoder's frames (same random weights)
    tiny = tiny + ["vae-channels-last"]
    rows["tiny + channels-last"] = tiny
    rows["tiny + channels-last + vae-compile"] = tiny + ["vae-compile"]
    if gpu:
        rows["tiny + channels-last + vae-compile + vae-cuda-graphs"] = tiny + ["vae-compile", "vae-cuda-graphs"]
        rows["tiny + channels-last + vae-cuda-graphs (eager step)"] = tiny + ["vae-cuda-graphs"]
    return {k: v for k, v in rows.items() if all(n in known for n in v)}


def frame_decoder_stacks(workload, device: torch.device, compile_modes=("default",)) -> dict[str, list[str]]:
    """A per-frame decoder's rows (the SD VAE of the UNet workload): on a GPU fp32, its step compiled, then captured
    (eager and compiled step), and bf16, compiled and captured too (the reference decodes in fp32: a bf16 SD VAE is
    what the gate is for); on a CPU fp32 and bf16."""
    known = variants.known(workload)
    rows = {"fp32 (reference)": []}
    if device.type != "cuda":  # the compiled SD VAE step needs a GPU here (aot_eager fails on the CPU's group_norm)
        rows["bf16"] = ["vae-bf16"]
        return {k: v for k, v in rows.items() if all(n in known for n in v)}
    low = ["cudnn-benchmark"]  # no row of its own (decoder_stacks)
    for mode in compile_modes:
        name = "vae-compile" + ("" if mode == "default" else "-max-autotune")
        rows[f"+ {name}"] = low + [name]
    rows["+ vae-cuda-graphs (compiled step)"] = low + ["vae-compile", "vae-cuda-graphs"]
    rows["vae-cuda-graphs (eager step)"] = low + ["vae-cuda-graphs"]
    rows["bf16"] = ["vae-bf16"] + low
    rows["bf16 + vae-compile"] = ["vae-bf16"] + low + ["vae-compile"]
    # bf16's compiled step is host-bound (its kernels about half its wall time): captured, its kernels are what is left
    rows["bf16 + vae-compile + vae-cuda-graphs"] = ["vae-bf16"] + low + ["vae-compile", "vae-cuda-graphs"]
    # each upsampling and its 3 x 3 convolution as one stride-2 transposed convolution
    rows["bf16 + vae-upsample-fold + vae-compile + vae-cuda-graphs"] = ["vae-bf16"] + low + [
        "vae-upsample-fold", "vae-compile", "vae-cuda-graphs"]
    # its GroupNorm + SiLU pairs as our kernel, each adding the bias of the convolution before it (inductor's separate
    # bias pass before an opaque kernel gone)
    rows["bf16 + vae-upsample-fold + vae-triton-fused + vae-norm-conv-bias + vae-compile + vae-cuda-graphs"] = [
        "vae-bf16"] + low + [
        "vae-upsample-fold", "vae-triton-fused", "vae-norm-conv-bias", "vae-compile", "vae-cuda-graphs"]
    # its single-head attention (512 channels: no fused SDPA kernel takes it) as two GEMMs and a softmax
    rows["+ vae-attn-gemm"] = ["vae-bf16"] + low + [
        "vae-upsample-fold", "vae-triton-fused", "vae-norm-conv-bias", "vae-attn-gemm", "vae-compile",
        "vae-cuda-graphs"]
    return {k: v for k, v in rows.items() if all(n in known for n in v)}


@dataclass
class DecoderRow:
    label: str
    stack: list[str]
    block_ms: Samples  # steady blocks (all blocks but the first) of the timed passes
    first_block_ms: float
    first_pass_s: float  # the first decode of the whole stream: compilation and capture included
    psnr_db: float
    gate: str
    pixel_frames_per_block: int
    peak_memory_gib: float = math.nan
    note: str = ""
    gpu_busy_ms: float = math.nan  # one profiled steady block: the union of its kernels
    categories: dict = field(default_factory=dict)  # GPU kernel ms of that block by category
    kernels: object = field(default=None, repr=False)  # its top kernels (a DataFrame)
    frames: torch.Tensor | None = field(default=None, repr=False)
    stand_in_psnr_db: float = math.nan  # a stand-in decoder's variant against the plain stand-in (same weights)


def decoder_bench(ref, workload):
    """A decoder-only copy of the reference pipeline (the workload's `decoder_bench`: its VAE deep-copied, with the
    attributes decoder variants touch)."""
    return workload.decoder_bench(ref)


def decode_stream(decoder, latents: torch.Tensor, block: int, timer: DeviceTimer | None = None) -> torch.Tensor:
    """Decode latents [B, 16, F, h, w] block by block from a reset stream; marks `b{i}` after each block."""
    decoder.reset()
    out = []
    for i in range(0, latents.shape[2], block):
        out.append(decoder.decode_block(latents[:, :, i:i + block]))
        if timer is not None:
            timer.mark(f"b{i // block}")
    return torch.cat(out, dim=2)


def run_decoder_table(ref, workload, latents: torch.Tensor, stacks: dict[str, list[str]], *, warmup: int = 1,
                      repeats: int = 5, compile_backend: str = "inductor",
                      keep_frames: bool = False) -> list[DecoderRow]:
    """Every stack decodes `latents` (warm-up passes, then `repeats` timed passes, device events per block); its frames
    are compared with the first stack's (the fp32 reference)."""
    dev = ref.device
    block, pixel_frames = workload.decoder_block(ref)
    flags = GlobalFlags()
    resolved = {k: variants.resolve(v, workload, dev) for k, v in stacks.items()}  # every name checked first
    weights = bool(os.environ.get("WMBOOK_TAEHV_WEIGHTS"))
    rows, ref_frames, stand_in = [], None, None
    try:
        for label, vs in tqdm(resolved.items(), desc="decoder rows", leave=False):
            flags.restore()
            if any(v.family == "decoder" and v.name.startswith("vae-compile") for v in vs):
                reset_compile_state()
            bench = decoder_bench(ref, workload)
            ctx = VariantContext(workload=workload, device=dev, compile_backend=compile_backend)
            for v in vs:
                v.apply(bench, ctx)
            dec = workload.decoder_stream(bench)
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
                torch.cuda.reset_peak_memory_stats(dev)
            m0 = torch.cuda.memory_allocated(dev) if dev.type == "cuda" else 0
            t0 = time.perf_counter()
            with torch.no_grad():
                decode_stream(dec, latents, block)
                if dev.type == "cuda":
                    torch.cuda.synchronize(dev)
                first_pass_s = time.perf_counter() - t0
                warm_up(bench, lambda d=dec: decode_stream(d, latents, block), warmup)  # graphs a pass calls once
                steady, first, frames = [], [], None
                for _ in range(repeats):
                    timer = DeviceTimer(dev)
                    timer.mark("start")
                    frames = decode_stream(dec, latents, block, timer)
                    n = latents.shape[2] // block
                    first.append(timer.elapsed_ms("start", "b0"))
                    steady += [timer.elapsed_ms(f"b{i - 1}", f"b{i}") for i in range(1, n)]
            peak = (torch.cuda.max_memory_allocated(dev) - m0) / 2**30 if dev.type == "cuda" else math.nan
            busy, cats, top = _profile_block(dec, latents[:, :, :block], dev)  # the stream continues: a steady block
            check.require_finite({"frames": frames}, f"decoder row {label!r}")
            judged = all(v.frames_judged for v in vs) or weights
            own = math.nan
            if ref_frames is None:
                ref_frames, psnr, gate = frames.float(), math.inf, "reference"
            elif not judged:  # the first such row is the plain stand-in; its variants must give its frames
                if stand_in is None:
                    stand_in, own = frames.float(), math.inf
                else:
                    own = check.compare(frames.float(), stand_in, dtype="fp32", frames=True).psnr
                psnr, gate = math.nan, "needs real weights" if own >= DECODER_PSNR_DB else "FAIL"
            else:
                psnr = check.compare(frames.float(), ref_frames, dtype="fp32", frames=True).psnr
                gate = "pass" if psnr >= DECODER_PSNR_DB else "FAIL"
            note = "; ".join(str(x) for x in ctx.notes.values())
            rows.append(DecoderRow(label=label, stack=[v.name for v in vs], block_ms=Samples(steady, "ms"),
                                   first_block_ms=float(np.median(first)), first_pass_s=first_pass_s, psnr_db=psnr,
                                   gate=gate, pixel_frames_per_block=pixel_frames, peak_memory_gib=peak, note=note,
                                   gpu_busy_ms=busy, categories=cats, kernels=top,
                                   frames=frames if keep_frames else None, stand_in_psnr_db=own))
            del bench, dec, frames
            if dev.type == "cuda":
                torch.cuda.empty_cache()
    finally:
        flags.restore()
    return rows


def _profile_block(decoder, block_latents: torch.Tensor, device) -> tuple[float, dict, object]:
    """GPU busy ms, kernel ms by category and the top kernels of one more (steady) block of the stream (NaN and empty
    off CUDA)."""
    with torch.no_grad():
        tr = profile_calls(lambda: decoder.decode_block(block_latents), device)
    if tr is None:
        return math.nan, {}, None
    ks = kernel_summary(tr, top=12)
    cats = ks["categories"]
    return float(cats.attrs["busy_ms"]), dict(zip(cats["category"], cats["ms"])), ks["kernels"]


def categories(rows: list[DecoderRow]) -> pd.DataFrame:
    """GPU kernel ms of one steady block by category (rows: decoder rows; empty off CUDA)."""
    d = pd.DataFrame([r.categories for r in rows], index=[r.label for r in rows]).fillna(0.0)
    return d[d.sum().sort_values(ascending=False).index] if len(d.columns) else pd.DataFrame()


# the columns a reader compares (decoder_table has more: the appendix shows them all)
DECODER_KEY = ["gate", "ms / block", "x floor", "conv % of floor", "speedup", "decoder-only FPS",
               "PSNR dB vs fp32", "first pass s"]


def decoder_table(rows: list[DecoderRow], flops: dict | None = None, ceilings: dict | None = None) -> pd.DataFrame:
    """One line per decoder row: ms per steady block (median, p20-p80), x its FLOP floor, pixel-frame rate of the
    decoder alone, PSNR against fp32 and the gate, first pass, memory; on a GPU also the convolution kernels' ms of
    one profiled block and the share of the convolutions' own FLOP floor they reach."""
    counted = bool(flops and ceilings and ceilings.get("gemm_tflops"))
    fl = floor_ms(flops["steady_block"], ceilings) if counted else math.nan
    conv_fl = floor_ms(flops["steady_block_conv"], ceilings) if counted and flops.get("steady_block_conv") else math.nan
    base = rows[0].block_ms.median if rows else math.nan
    out = []
    for r in rows:
        ms = r.block_ms.median
        conv_ms = float((r.categories or {}).get("convolution", math.nan))
        out.append({"decoder": r.label, "gate": r.gate, "ms / block": ms, "p20": r.block_ms.p20, "p80": r.block_ms.p80,
                    "x floor": ms / fl if fl == fl else math.nan, "GPU busy ms": r.gpu_busy_ms,
                    "conv ms": conv_ms, "conv % of floor": 100 * conv_fl / conv_ms if conv_ms > 0 else math.nan,
                    "speedup": base / ms if r.gate in ("pass", "reference", "needs real weights") else math.nan,
                    "decoder-only FPS": r.pixel_frames_per_block / ms * 1e3, "PSNR dB vs fp32": r.psnr_db,
                    "PSNR dB vs plain stand-in": r.stand_in_psnr_db,
                    "first block ms": r.first_block_ms, "first pass s": r.first_pass_s,
                    "peak GiB": r.peak_memory_gib, "stack": " + ".join(r.stack) or "-"})
    t = pd.DataFrame(out).set_index("decoder")
    t.attrs["floor_ms"] = fl
    t.attrs["conv_floor_ms"] = conv_fl
    return t


def plot_decoder(table: pd.DataFrame, ax=None):
    """ms per steady block per decoder row (grey: gate failed) with the full decoder's FLOP floor."""
    import matplotlib.pyplot as plt  # noqa: PLC0415  heavy: matplotlib.pyplot

    if ax is None:
        _, ax = plt.subplots(figsize=(8, 0.42 * len(table) + 1.2))
    ok = table["gate"].isin(["pass", "reference", "needs real weights"])
    y = np.arange(len(table))[::-1]
    ax.barh(y, table["ms / block"], xerr=[table["ms / block"] - table["p20"], table["p80"] - table["ms / block"]],
            color=["#4477aa" if o else "#cccccc" for o in ok], capsize=2)
    ax.set_yticks(y, table.index)
    for yi, (ms, psnr, g) in zip(y, zip(table["ms / block"], table["PSNR dB vs fp32"], table["gate"])):
        q = "ref" if g == "reference" else ("no weights" if g == "needs real weights" else f"{psnr:.1f} dB")
        ax.text(ms, yi, f" {ms:.3g} ms, {q}" + ("" if g != "FAIL" else " (gate failed)"), va="center", fontsize=8)
    fl = table.attrs.get("floor_ms", math.nan)
    if fl == fl:
        ax.axvline(fl, color="k", ls="--", lw=1, label=f"full decoder's FLOP floor {fl:.3g} ms")
        ax.legend(fontsize=8, loc="lower right")
    ax.set_xlabel("ms per steady block (median, p20-p80 whiskers)")
    ax.set_title("Streaming decode of one block: the same latents through each decoder")
    return ax


def result_rows(cfg, rows: list[DecoderRow]) -> list[dict]:
    """Each decoder row's ms per block (with spread), PSNR and first pass as results rows."""
    common = dict(notebook=cfg.notebook, workload=cfg.workload.name, preset=cfg.preset.name, params=cfg.params(),
                  warmup=cfg.warmup, repeats=cfg.repeats)
    out = []
    for r in rows:
        v = "decoder: " + (" + ".join(r.stack) or "fp32")
        out.append(results_store.make_row(metric="decoder_ms_per_block", value=r.block_ms.median, unit="ms",
                                          variant=v, timing=r.block_ms, gate=r.gate, **common))
        for metric, value, unit in (("decoder_psnr_db", r.psnr_db, "dB"),
                                    ("decoder_first_pass_s", r.first_pass_s, "s")):
            if np.isfinite(value):
                out.append(results_store.make_row(metric=metric, value=float(value), unit=unit, variant=v, **common))
        # one profiled steady block's GPU time, whole and by category (a GPU run's): where a decoder's time goes
        parts = [("decoder_gpu_busy_ms", r.gpu_busy_ms)]
        parts += [(f"decoder_category_ms:{c}", ms) for c, ms in (r.categories or {}).items()]
        for metric, value in parts:
            if value is not None and np.isfinite(value):
                out.append(results_store.make_row(metric=metric, value=float(value), unit="ms", variant=v, **common))
    return out


def category_account(rows: list[DecoderRow], conv_floor_ms: float = math.nan) -> str:
    """Where the fastest gated full decoder's GPU time goes (one profiled steady block: convolution against the
    rest, the top categories; with `conv_floor_ms`, decoder_table's attrs, the share of the convolutions' FLOP floor
    their kernels reach); empty without a profiled row (a CPU run)."""
    ok = [r for r in rows if r.gate in ("pass", "reference") and r.categories and np.isfinite(r.block_ms.median)]
    if not ok:
        return ""
    best = min(ok, key=lambda r: r.block_ms.median)
    cats = pd.Series(best.categories, dtype=float).sort_values(ascending=False)
    total = float(cats.sum())
    if total <= 0:
        return ""
    conv = float(cats.get("convolution", 0.0))
    top = ", ".join(f"{c} {ms:.3g} ms ({ms / total:.0%})" for c, ms in cats.head(4).items())
    floor = (f" The convolutions' own FLOP floor at the measured GEMM ceiling is {conv_floor_ms:.3g} ms: their "
             f"kernels reach {conv_floor_ms / conv:.0%} of it." if conv > 0 and conv_floor_ms == conv_floor_ms else "")
    return (f"Of the fastest gated decoder's ({best.label}) {total:.3g} ms of kernel time in a steady block, "
            f"convolution takes {conv:.3g} ms ({conv / total:.0%}) and everything else {total - conv:.3g} ms: {top}."
            + floor)


def interpret(table: pd.DataFrame, block_ms_e2e: float | None = None) -> str:
    """Sentences computed from the decoder table."""
    if table.empty:
        return "This workload has no streaming decoder to study."
    ref = table.iloc[0]
    ok = table[table["gate"] == "pass"]
    lines = [f"The fp32 decoder takes {ref['ms / block']:.3g} ms per steady block"
             + (f", {ref['x floor']:.1f}x its FLOP floor of {table.attrs['floor_ms']:.3g} ms"
                if table.attrs.get("floor_ms", math.nan) == table.attrs.get("floor_ms", math.nan) else "") + "."]
    if len(ok):
        best = ok["ms / block"].idxmin()
        b = ok.loc[best]
        lines.append(f"The fastest full decoder within {DECODER_PSNR_DB:.0f} dB of it is `{best}`: "
                     f"{b['ms / block']:.3g} ms "
                     f"({b['speedup']:.1f}x, {b['PSNR dB vs fp32']:.1f} dB"
                     + (f", {b['x floor']:.1f}x the floor" if b["x floor"] == b["x floor"] else "")
                     + f"; its first pass took {b['first pass s']:.3g} s).")
    failed = table[table["gate"] == "FAIL"]
    if len(failed):
        psnr = failed["PSNR dB vs fp32"].fillna(failed["PSNR dB vs plain stand-in"])  # a stand-in's: vs itself
        lines.append("Rows below the PSNR budget (their time does not count): "
                     + ", ".join(f"`{i}` ({p:.1f} dB)" for i, p in psnr.items()) + ".")
    tiny = table[table["gate"] == "needs real weights"]
    if len(tiny):
        plain, best = tiny.iloc[0], tiny["ms / block"].idxmin()
        lines.append(f"The tiny decoder takes {plain['ms / block']:.3g} ms per block"
                     + (f", `{best}` {tiny.loc[best, 'ms / block']:.3g} ms (its frames within "
                        f"{tiny.loc[best, 'PSNR dB vs plain stand-in']:.1f} dB of the plain tiny decoder's)"
                        if best != tiny.index[0] else "")
                     + "; with random weights its frames cannot be judged against the full decoder (set "
                       "WMBOOK_TAEHV_WEIGHTS to a taew2_1.pth to get its PSNR against it).")
    return " ".join(lines)
