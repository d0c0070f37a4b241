"""Stage split of a streaming world model over two ranks: rank 0 denoises, rank 1 decodes.

Rank 0 runs every DiT forward of block k (the denoising steps and the cache refresh) and sends block k's clean
latents to rank 1 (`isend`; NCCL moves them on its own stream, ordered after the forward that wrote them: with
decode-first right after the last denoising step, before the refresh, as one GPU would decode them), then goes
on with block k+1: block k+1 needs block k's refreshed KV caches, not its pixels. Rank 1 receives block k and decodes
it with the streaming decoder while rank 0 denoises k+1. The steady block period is then the slower of the two
stages, not their sum; the first frame still waits for both.

Both ranks build the same pipeline with the same stack (the single-GPU stack the split is gated against) and first
run it whole on their own GPU: rank 0's runs are the single-GPU comparison measured in the same job, rank 1 keeps its
frames for the gate (the split changes no arithmetic: equal frames are expected bit for bit).
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from .. import check
from ..bench import DeviceTimer, Samples, stream_metrics
from ..profiling import ProfilingSession
from ..profiling.labels import label
from ..variants.builtin import warm_up
from .rank import Rank

DENOISER, DECODER = 0, 1


def _single_gpu(pipe, inputs, rk: Rank) -> tuple[dict, object]:
    """The whole stack on this rank's GPU alone (warm-up excluded): FPS, first frame, per-block stage times, and the
    last run's output."""
    spec = rk.spec
    rk.progress("single-GPU warm-up", 0, spec.warmup)  # more runs while a graph a run calls once is not captured
    warm_up(pipe, lambda: pipe.generate(inputs, progress=False), spec.warmup)
    fps, first, denoise, decode, out = Samples(unit="frames/s"), Samples(), Samples(), Samples(), None
    firsts, strides = None, {}
    for i in range(spec.repeats):
        rk.progress("single-GPU runs", i, spec.repeats)
        out = pipe.generate(inputs, progress=False, on_block=lambda bi, x0: strides.setdefault(bi, x0.stride()))
        firsts = out.frames if firsts is None else firsts
        m = out.metrics()
        fps.values.append(m["fps"])
        first.values.append(out.first_frame_ms)
        denoise.values += [sum(f) for f in out.forward_ms[1:]]  # steady blocks: every forward of the block
        decode.values += out.decode_ms[1:]
    return {"fps": fps.summary(), "first_frame_ms": first.summary(), "denoise_ms": denoise.summary(),
            "decode_ms": decode.summary(), "frames_per_block": out.frames_per_block, "forward_ms": out.forward_ms,
            "block_decode_ms": out.decode_ms, "repeat_bit_equal": bool(torch.equal(firsts, out.frames)),
            "latent_strides": [strides[b] for b in sorted(strides)]}, out


def _split_run(pipe, inputs, rk: Rank, strides: list, session=None, dsts=(DECODER,)) -> dict:
    """One generation with the stages on two ranks, from a common start (a barrier); this rank's timeline (ms).
    `strides`: each block's latent strides in the single-GPU run (the decoder rank decodes the same layout); `dsts`:
    the ranks the denoiser sends each block's latents to."""
    stage = session.stage if session is not None else label
    timer = DeviceTimer(pipe.device)
    rk.barrier()
    timer.mark("start")
    if rk.rank == DENOISER:
        return _denoiser_run(pipe, inputs, timer, stage, dsts)
    return _decoder_run(pipe, inputs, timer, stage,
                        lambda x0, bi: decode_received(pipe, x0, strides[bi], timer, bi))


def _denoiser_run(pipe, inputs, timer: DeviceTimer, stage, dsts=(DECODER,)) -> dict:
    """The pipeline's own generation (its static caches and graphs), each block's latents sent instead of decoded (to
    every rank of `dsts`)."""
    sends = []

    def send(bi, x0):
        # a copy the next forwards cannot overwrite (captured graphs reuse their output buffers); the work objects
        # keep it alive until NCCL has sent it
        buf = x0.contiguous().clone()
        sends.append(([dist.isend(buf, dst=d) for d in dsts], buf))

    with stage("Denoise"):
        out = pipe.generate(inputs, decode=False, progress=False, on_block=send)
    with stage("Send_Wait"):
        for works, _ in sends:
            for work in works:
                work.wait()
    timer.mark("done")
    spans, t = [], 0.0  # generate starts its own clock right after the common start
    for bi, ms in enumerate(out.block_ms):
        spans.append({"block": bi, "what": "denoise", "start_ms": t, "end_ms": t + ms})
        t += ms
    return {"spans": spans, "latents": torch.cat([b for _, b in sends], dim=2), "forward_ms": out.forward_ms,
            "busy_ms": sum(out.block_ms), "wall_ms": timer.elapsed_ms("start", "done")}


def _decoder_run(pipe, inputs, timer: DeviceTimer, stage, decode, src: int = DENOISER, decoder=None) -> dict:
    """Each block's latents received from `src` and decoded by `decode(latents, bi)`, which marks b{bi}_end when the
    block's frames are there (decode_received: the pipeline's streaming decoder, in the layout the denoiser produced
    them in; a compiled decoder specializes on its input's strides: another layout is other kernels and other
    rounding). `decoder`: the streaming decoder reset at the stream's start (the pipeline's)."""
    p, (h, w) = pipe.preset, pipe.preset.latent_hw
    buf = torch.empty(inputs.noise.shape[0], p.out_dim, p.num_frame_per_block, h, w, device=pipe.device,
                      dtype=pipe.dtype)
    frames, fpb = [], []
    with label("2_Pipeline_Inference"):
        (decoder or pipe.decoder).reset()
        for bi in range(inputs.num_blocks):
            with label(f"2.3_Block_{bi}"):
                with stage("Wait_For_Latents"):
                    dist.recv(buf, src=src)  # NCCL: the decoding stream waits for the data, the host goes on
                timer.mark(f"b{bi}_recv")
                with stage("Decode"):
                    fr = decode(buf, bi)
                frames.append(fr)
                fpb.append(fr.shape[2])
    timer.synchronize()
    return {**decoder_timeline(timer, inputs.num_blocks), "frames": torch.cat(frames, dim=2), "fpb": fpb,
            **decoded_stream(pipe, timer, inputs.num_blocks, fpb)}


def decoder_timeline(timer: DeviceTimer, blocks: int) -> dict:
    """A decoding rank's timeline from its marks (b{bi}_recv, b{bi}_end, from the common start): per block its wait
    for the latents and its decode; the rank's wall and busy (decoding) time."""
    spans, prev = [], "start"
    for bi in range(blocks):
        spans.append({"block": bi, "what": "wait", "start_ms": timer.elapsed_ms("start", prev),
                      "end_ms": timer.elapsed_ms("start", f"b{bi}_recv")})
        spans.append({"block": bi, "what": "decode", "start_ms": timer.elapsed_ms("start", f"b{bi}_recv"),
                      "end_ms": timer.elapsed_ms("start", f"b{bi}_end")})
        prev = f"b{bi}_end"
    return {"spans": spans, "wall_ms": timer.elapsed_ms("start", prev),
            "busy_ms": sum(s["end_ms"] - s["start_ms"] for s in spans if s["what"] == "decode")}


def latents_gate(latents: torch.Tensor, single_out) -> dict:
    """The clean latents a layout made against the single-GPU run's: bit-equal, and the largest difference."""
    return {"latents_bit_equal": bool(torch.equal(latents, single_out.latents)),
            "latents_max_abs_diff": float((latents.float() - single_out.latents.float()).abs().max())}


def frames_gate(frames: torch.Tensor, fpb: list[int], single_out, single: dict) -> dict:
    """The frames a layout decoded against the single-GPU run's: PSNR and largest difference (wmbook.check), bit
    equality, the largest difference block by block (where they part), and whether one GPU repeats itself."""
    gate = check.compare(frames.float(), single_out.frames.float(), dtype="fp32", frames=True)
    per_block, k = [], 0
    for n in fpb:
        diff = frames[:, :, k:k + n].float() - single_out.frames[:, :, k:k + n].float()
        per_block.append(float(diff.abs().max()))
        k += n
    return {"psnr_db": gate.psnr, "max_abs_diff": gate.max_abs,
            "bit_equal": bool(torch.equal(frames, single_out.frames)), "frames_max_abs_diff_per_block": per_block,
            "single_repeat_bit_equal": single["repeat_bit_equal"]}


def decode_received(pipe, x0: torch.Tensor, strides, timer: DeviceTimer, bi: int) -> torch.Tensor:
    """Block bi's clean latents decoded as the single-GPU run decodes them: in the layout the denoiser produced them
    in (a compiled decoder specializes on its input's strides: another layout is other kernels and other rounding);
    marks b{bi}_end when the block's frames are there, and b0_px at the stream's first frame."""
    if x0.stride() != tuple(strides):
        lat = torch.empty_strided(x0.shape, strides, dtype=x0.dtype, device=x0.device)
        lat.copy_(x0)
        x0 = lat
    return pipe.decode_block(x0, timer, f"b{bi}_end", pipe._frames_hook(timer, "b0_px" if bi == 0 else None, None))


def decoded_stream(pipe, timer: DeviceTimer, blocks: int, fpb: list[int]) -> dict:
    """The decoder rank's block times (from the common start, mark by mark: b{bi}_end), FPS and first frame, as the
    single-GPU run counts them (with stream-frames the first frame is the first latent frame's, b0_px)."""
    block_ms, prev = [], "start"
    for bi in range(blocks):
        block_ms.append(timer.elapsed_ms(prev, f"b{bi}_end"))
        prev = f"b{bi}_end"
    m = stream_metrics(block_ms, fpb, timer.elapsed_ms("start", "b0_px" if pipe.stream_frames else "b0_end"))
    return {"block_ms": block_ms, "fps": m["fps"], "first_frame_ms": m["first_frame_ms"]}


def wire(x: torch.Tensor, rk: Rank, repeats: int = 20) -> dict | None:
    """One-way time of `x` from rank 0 to rank 1: half the median round trip (rank 0 sends, rank 1 sends it back).
    Every rank calls it (each round starts at a barrier); ranks past 1 only join the barriers and get None."""
    buf = torch.empty_like(x)
    times = []
    for i in range(3 + repeats):
        rk.barrier()
        if rk.rank > DECODER:
            continue
        timer = DeviceTimer(x.device)
        timer.mark("a")
        if rk.rank == DENOISER:
            dist.send(x, dst=DECODER)
            dist.recv(buf, src=DECODER)
        else:
            dist.recv(buf, src=DENOISER)
            dist.send(buf, dst=DENOISER)
        timer.mark("b")
        if i >= 3:
            times.append(timer.elapsed_ms("a", "b") / 2)
    if rk.rank > DECODER:
        return None
    s = Samples(times).summary()
    nbytes = x.numel() * x.element_size()
    return {"bytes": nbytes, "one_way_ms": s, "gbps": nbytes / (s["median"] * 1e-3) / 1e9 if s["median"] > 0
            else math.nan}


def timed_runs(rk: Rank, run, decoder: int, what: str):
    """The job's warm-up runs, then its timed ones (`run()`: one run's result on this rank): FPS and first frame (on
    the decoder rank), busy and wall time (Samples), the last run's result and every timed run's timeline."""
    fps, first, busy, wall, last = Samples(unit="frames/s"), Samples(), Samples(), Samples(), None
    runs_spans = []
    n = rk.spec.warmup + rk.spec.repeats
    for i in range(n):
        rk.progress(what, i, n)
        r = run()
        if i >= rk.spec.warmup:
            runs_spans.append(r["spans"])
            busy.values.append(r["busy_ms"])
            wall.values.append(r["wall_ms"])
            if rk.rank == decoder:
                fps.values.append(r["fps"])
                first.values.append(r["first_frame_ms"])
        last = r
    return fps, first, busy, wall, last, runs_spans


def run_stage_split(rk: Rank) -> dict:
    """This rank's part of a stage-split job (module docstring); the result JSON of the rank."""
    spec = rk.spec
    preset, pipe, ctx = rk.pipeline()
    inputs = pipe.prepare(spec.blocks, seed=spec.seed)
    single, single_out = _single_gpu(pipe, inputs, rk)
    rk.fault("run")
    fps, first, busy, wall, last, runs_spans = timed_runs(
        rk, lambda: _split_run(pipe, inputs, rk, single["latent_strides"]), DECODER, "split runs")
    out = {"layout": "stage-split", "role": "denoiser" if rk.rank == DENOISER else "decoder",
           "stack": list(spec.stack), "notes": ctx.notes, "single": single, "busy_ms": busy.summary(),
           "wall_ms": wall.summary(), "spans": last["spans"], "runs_spans": runs_spans}
    if rk.rank == DENOISER:  # the latents it sent against the single-GPU run's: the denoiser's share of the gate
        out.update(forward_ms=last["forward_ms"], **latents_gate(last["latents"], single_out))
    if rk.rank == DECODER:
        out.update(fps=fps.summary(), first_frame_ms=first.summary(), frames_per_block=last["fpb"],
                   **frames_gate(last["frames"], last["fpb"], single_out, single))
    rk.progress("wire", 0, 1, force=True)
    k = preset.num_frame_per_block
    out["wire"] = wire(single_out.latents[:, :, :k].contiguous(), rk)
    with ProfilingSession("08_stage_split", device=rk.device, output_dir=rk.job_dir / "sessions",
                          tags={"layout": "stage-split", "role": out["role"], "preset": spec.preset}) as s:
        r = _split_run(pipe, inputs, rk, single["latent_strides"], session=s)
        if rk.rank == DECODER:
            s.set_block_frames(r["fpb"])
        s.set_metrics(busy_ms=r["busy_ms"], idle_ms=r["wall_ms"] - r["busy_ms"], wall_ms=r["wall_ms"])
    return out
