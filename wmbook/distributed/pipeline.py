"""A pipeline of the DiT's layers over ranks (layout `dit-pipeline`): each DiT rank holds a contiguous range of the
transformer blocks, one decoder rank decodes.

Ranks 0..P-1 are the DiT's stages. Rank 0 embeds a forward's input and runs its layers, sends the hidden state
[B, tokens, dim] to rank 1, and so on; the last stage runs the head, turns the prediction into clean latents,
re-noises them for the next step and sends that input back to rank 0 (the ring of a denoising step). After a block's
last step the last stage sends the clean latents to rank 0 for the cache refresh and to the decoder. Every stage
keeps the KV caches of its own layers; a block's next step waits for the step before it on every stage, but the
refresh of block k and the first step of block k+1 overlap (block k+1 needs, at each stage, only that stage's
caches of block k), so the ranks run ahead of each other by themselves (point-to-point sends, no barrier per step).

With 3 or more ranks the last rank only decodes (P = nproc - 1); with 2 ranks both hold layers and the second also
decodes. Layout `pipeline-split` keeps the last two ranks for decoding, the top and bottom halves of the frame with
halo exchange (wmbook.distributed.decoder_split), so P = nproc - 2. The layer ranges are chosen from measured
per-layer times (rank 0 times every layer of a steady block's forwards and sends them to the others): contiguous
ranges that make the busiest rank's work per block smallest, a rank that also decodes counted with the decode. With
`cuda-graphs` in the stack each stage's forward is captured on its own (the sends and receives stay outside the
graphs).

Every rank first runs the whole stack on its own GPU (the single-GPU comparison and the gate's frames, as in the
stage split). The pipeline changes no arithmetic: on CPU ranks (gloo) latents and frames are bit-equal to the single
process's; on GPUs the stages' kernels run on different devices, which may round differently (two H200s: 49.5 dB),
so the gate is wmbook.studies.multi_gpu.GATE_DB.
"""

from __future__ import annotations

import contextlib
import functools
import math
from unittest import mock

import torch
import torch.distributed as dist

from .. import check
from ..bench import DeviceTimer, Samples
from ..graphs import GraphedCallable
from ..models.causal_wan import LayerStage
from ..profiling import ProfilingSession
from ..profiling.labels import label
from .decoder_split import Strips
from .job import decoder_ranks, dit_ranks
from .rank import Rank
from .stream import _single_gpu, decode_received, decoded_stream, latents_gate, timed_runs, wire


def split_layers(costs: list[float], parts: int, tail: float = 0.0) -> list[tuple[int, int]]:
    """Contiguous [start, end) ranges of `costs` (one per layer, e.g. its ms per block) over `parts` ranks, each at
    least one layer, that make the largest rank's load smallest; the last rank's load has `tail` added (the decode
    of a rank that also decodes). Ties: the earlier ranks take fewer layers."""
    n = len(costs)
    if isinstance(parts, bool) or not isinstance(parts, int) or not 1 <= parts <= n:
        raise ValueError(f"parts={parts!r} is not allowed; allowed values: 1..{n} (the layers to split)")
    pre = [0.0]
    for c in costs:
        pre.append(pre[-1] + float(c))
    # best[j][i]: the smallest largest load of the first i layers over j ranks (no tail); cut[j][i] its last cut
    best = [[math.inf] * (n + 1) for _ in range(parts + 1)]
    cut = [[0] * (n + 1) for _ in range(parts + 1)]
    best[0][0] = 0.0
    for j in range(1, parts + 1):
        for i in range(j, n + 1):
            for s in range(j - 1, i):
                load = pre[i] - pre[s] + (tail if j == parts and i == n else 0.0)
                v = max(best[j - 1][s], load)
                if v < best[j][i] - 1e-12:
                    best[j][i], cut[j][i] = v, s
    ranges, i = [], n
    for j in range(parts, 0, -1):
        s = cut[j][i]
        ranges.append((s, i))
        i = s
    return ranges[::-1]


def _layer_ms(pipe, rk: Rank) -> tuple[list[float], str]:
    """Each layer's ms per forward (medians over the forwards of a steady block of a 2-block generation, eager), and
    the dtype of the hidden state between layers."""
    model = pipe.model
    n = len(model.blocks)
    seen, dtypes = [], []

    def timed(*args, **kw):
        timer = DeviceTimer(pipe.device)

        def mark(i, h):
            timer.mark(f"l{i}")
            if not dtypes:
                dtypes.append(str(h.dtype).removeprefix("torch."))

        timer.mark("in")
        out = type(model)._forward(model, *args, marks=mark, **kw)
        seen.append(timer)
        return out

    rk.progress("timing the layers", 0, 1, force=True)
    with mock.patch.object(model, "_forward", timed):
        pipe.generate(pipe.prepare(2, seed=rk.spec.seed), decode=False, progress=False)
    steady = seen[len(seen) // 2:]  # the second block's forwards
    per = []
    for i in range(n):
        prev = "in" if i == 0 else f"l{i - 1}"
        per.append(Samples([tm.elapsed_ms(prev, f"l{i}") for tm in steady]).median)
    return per, dtypes[0]


def _plan(pipe, rk: Rank, single: dict) -> tuple[list[tuple[int, int]], str, list[float]]:
    """The layer ranges (chosen on rank 0 from its measured layer times, sent to every rank), the hidden dtype and the
    layer times."""
    p = dit_ranks(rk.world, rk.spec.layout)
    box = [None]
    if rk.rank == 0:
        per, dtype = _layer_ms(pipe, rk)
        forwards = len(single["forward_ms"][-1])
        decode = single["decode_ms"]["median"] if p == rk.world else 0.0  # the last DiT rank also decodes
        box[0] = (split_layers([c * forwards for c in per], p, tail=decode), dtype, per)
    dist.broadcast_object_list(box, src=0)
    ranges, dtype, per = box[0]
    return [tuple(r) for r in ranges], dtype, per


def _send(x: torch.Tensor, dst: int, pending: list) -> None:
    """Send `x`, kept alive until it is sent. No copy: what is sent is never written again (a forward's output is
    its own tensor, GraphedCallable clones a replay's outputs; the latents are made fresh by every step)."""
    x = x.contiguous()  # a no-op for all of them; NCCL sends contiguous memory only
    pending.append((dist.isend(x, dst=dst), x))


class _Run:
    """One generation over the pipeline, as one rank sees it: its stage's forwards (the ring of each step), or the
    decodes, with device marks for the timeline."""

    def __init__(self, pipe, inputs, rk: Rank, stage: LayerStage | None, strides: list, stage_label):
        self.pipe, self.inputs, self.rk, self.stage, self.strides, self.stage_label = (pipe, inputs, rk, stage,
                                                                                      strides, stage_label)
        self.p_ranks, self.decoder = dit_ranks(rk.world, rk.spec.layout), rk.world - 1
        self.decoders = decoder_ranks(rk.world, rk.spec.layout)
        p, dev = pipe.preset, pipe.device
        self.k, self.ts = p.num_frame_per_block, pipe.sampling_timesteps()
        h, w = p.latent_hw
        self.timer = DeviceTimer(dev)
        self.pending, self.spans, self.frames, self.fpb, self.latents = [], [], [], [], []
        self.gen = torch.Generator(dev).manual_seed(inputs.seed + 1)  # the re-noising draws: the last stage's
        self.x0_buf = torch.empty(inputs.noise.shape[0], p.out_dim, self.k, h, w, device=dev, dtype=pipe.dtype)
        self.cache, self.last_mark, self.x0 = None, "start", None

    def span(self, bi: int, what: str, start: str, end: str) -> None:
        self.spans.append({"block": bi, "what": what, "start_ms": start, "end_ms": end})

    def dit_block(self, bi: int) -> None:
        """Block bi's steps and cache refresh on this stage."""
        st, rank, pipe, inputs = self.stage, self.rk.rank, self.pipe, self.inputs
        n, start = len(self.ts), bi * self.k
        sl = slice(start, start + self.k)
        cond = inputs.cond_concat[:, :, sl] if inputs.cond_concat is not None else None
        noisy = inputs.noise[:, :, sl].contiguous()  # the first step's input; the shape of every later one
        for j in range(n + 1):  # the block's steps, then its cache refresh at t=0
            t, tag = (self.ts[j] if j < n else 0.0), f"b{bi}_f{j}"
            with self.stage_label("Wait_For_Input"):
                if st.first and j > 0:  # this step's input (the refresh: the clean latents) from the last stage
                    dist.recv(self.x0_buf, src=self.p_ranks - 1)  # the next receive is ordered after this forward
                    noisy = self.x0_buf
                elif not st.first:
                    dist.recv(st.hidden, src=rank - 1)
            self.timer.mark(f"{tag}_in")
            if st.last and j == n:
                noisy = self.x0
            with self.stage_label("Denoise"), label(f"2.3.{bi}_Stage_Forward_{j}"):
                tt = torch.full((noisy.shape[0], self.k), t, device=pipe.device, dtype=torch.float32)
                out = pipe.model(noisy, tt, inputs.context, cond_concat=cond, actions=inputs.actions,
                                 cache=self.cache, start_frame=start)
            self.timer.mark(f"{tag}_out")
            self.span(bi, "wait", self.last_mark, f"{tag}_in")
            self.span(bi, "denoise", f"{tag}_in", f"{tag}_out")
            self.last_mark = f"{tag}_out"
            if not st.last:
                _send(out, rank + 1, self.pending)
            elif j < n:
                noisy = self._step(j, noisy, out, t)

    def _step(self, j: int, noisy, out, t: float):
        """The last stage after step j: the clean latents, then the next step's input (re-noised as the reference
        does) for the first stage, or after the last step the clean latents for the refresh and the decoder."""
        if getattr(self.pipe.preset, "prediction", "flow") == "x0":
            x0 = out.to(noisy.dtype)
        else:  # flow = noise - x0, x_t = x0 + sigma * flow (the pipeline's own conversion)
            x0 = (noisy.float() - (t / 1000.0) * out.float()).to(noisy.dtype)
        self.x0 = x0
        if j < len(self.ts) - 1:
            sigma = self.ts[j + 1] / 1000.0
            eps = torch.randn(x0.shape, generator=self.gen, device=self.pipe.device, dtype=torch.float32)
            noisy = ((1 - sigma) * x0.float() + sigma * eps).to(x0.dtype)
            _send(noisy, 0, self.pending)
            return noisy
        self.latents.append(x0)
        _send(x0, 0, self.pending)
        for d in self.decoders:
            if d != self.rk.rank:
                _send(x0, d, self.pending)
        return noisy

    def decode_block(self, bi: int) -> None:
        """Block bi's clean latents (received, or this rank's own as the last stage) decoded."""
        pipe, x0 = self.pipe, self.x0
        if self.stage is None:
            with self.stage_label("Wait_For_Latents"):
                dist.recv(self.x0_buf, src=self.p_ranks - 1)
            x0 = self.x0_buf
        self.timer.mark(f"b{bi}_recv")
        with self.stage_label("Decode"), label(f"2.3.{bi}_VAE_Decode"):
            fr = decode_received(pipe, x0, self.strides[bi], self.timer, bi)
        self.span(bi, "wait", self.last_mark, f"b{bi}_recv")
        self.span(bi, "decode", f"b{bi}_recv", f"b{bi}_end")
        self.last_mark = f"b{bi}_end"
        self.frames.append(fr)
        self.fpb.append(fr.shape[2])

    def __call__(self) -> dict:
        rank, timer = self.rk.rank, self.timer
        self.rk.barrier()
        timer.mark("start")
        if self.stage is not None:
            self.cache = self.pipe.generation_cache(self.inputs)
        if rank == self.decoder:
            self.pipe.decoder.reset()
        with label("2_Pipeline_Inference"):
            for bi in range(self.inputs.num_blocks):
                with label(f"2.3_Block_{bi}"):  # the session's block sections (frames per block)
                    if self.stage is not None:
                        self.dit_block(bi)
                    if rank == self.decoder:
                        self.decode_block(bi)
        with self.stage_label("Send_Wait"):
            for work, _ in self.pending:
                work.wait()
        timer.mark("done")
        timer.synchronize()
        spans = []
        for s in self.spans:
            a, b = timer.elapsed_ms("start", s["start_ms"]), timer.elapsed_ms("start", s["end_ms"])
            if b > a or s["what"] != "wait":
                spans.append({**s, "start_ms": a, "end_ms": b})
        out = {"spans": spans, "wall_ms": timer.elapsed_ms("start", "done"),
               "busy_ms": sum(s["end_ms"] - s["start_ms"] for s in spans if s["what"] != "wait")}
        if self.latents:
            out["latents"] = torch.cat(self.latents, dim=2)
        if rank == self.decoder:
            out.update(frames=torch.cat(self.frames, dim=2), fpb=self.fpb,
                       **decoded_stream(self.pipe, timer, self.inputs.num_blocks, self.fpb))
        return out


def _pipeline_run(pipe, inputs, rk: Rank, stage: LayerStage | None, strides: list, session=None) -> dict:
    """One generation over the pipeline from a common start (a barrier): this rank's timeline (ms) and, on the
    decoder rank, the frames and block times."""
    return _Run(pipe, inputs, rk, stage, strides, session.stage if session is not None else label)()


def _dry_run(pipe, inputs, stage: LayerStage) -> None:
    """Every forward of a generation on this stage alone, no sends: the stage's graphs are warmed and captured here,
    never while point-to-point transfers are in flight (a capture may not overlap other CUDA work of the process).
    What it writes into the caches is reset by the next generation; a later stage reads whatever its hidden buffer
    holds (the captured kernels, not the values, are what this run is for)."""
    k, n, b = pipe.preset.num_frame_per_block, len(pipe.sampling_timesteps()), inputs.noise.shape[0]
    cache = pipe.generation_cache(inputs)
    ts = pipe.sampling_timesteps() + [0.0]
    for bi in range(inputs.num_blocks):
        sl = slice(bi * k, bi * k + k)
        cond = inputs.cond_concat[:, :, sl] if inputs.cond_concat is not None else None
        noisy = inputs.noise[:, :, sl].contiguous()
        for j in range(n + 1):
            tt = torch.full((b, k), ts[j], device=pipe.device, dtype=torch.float32)
            pipe.model(noisy, tt, inputs.context, cond_concat=cond, actions=inputs.actions, cache=cache,
                       start_frame=bi * k)
    if pipe.device.type == "cuda":
        torch.cuda.synchronize(pipe.device)


def _stage_forward(pipe, stage: LayerStage, device: torch.device):
    """The stage's forward (the model's own, restricted to the stage): captured in graphs of its own when the stack
    captured the whole forward (the same cache-slot signature), else run as it is."""
    model = pipe.model
    fn = functools.partial(type(model)._forward, model, stage=stage)
    whole = model.__dict__.get("_forward")
    if isinstance(whole, GraphedCallable):
        fn = GraphedCallable(fn, name=f"DiT layers {stage.start}-{stage.end - 1}", key_fn=whole.key_fn,
                             device=device)
    return fn


def run_dit_pipeline(rk: Rank) -> dict:
    """This rank's part of a dit-pipeline job (module docstring); the result JSON of the rank."""
    spec = rk.spec
    preset, pipe, ctx = rk.pipeline()
    inputs = pipe.prepare(spec.blocks, seed=spec.seed)
    p_ranks, decoder = dit_ranks(rk.world, spec.layout), rk.world - 1
    # pipeline-split: the two decoder halves (every rank takes part in making their process group)
    strips = Strips(pipe, rk, decoder_ranks(rk.world, spec.layout), src=p_ranks - 1) \
        if spec.layout == "pipeline-split" else None
    single, single_out = _single_gpu(pipe, inputs, rk)
    ranges, hidden_dtype, layer_ms = _plan(pipe, rk, single)
    stage = None
    if rk.rank < p_ranks:
        a, e = ranges[rk.rank]
        stage = LayerStage(a, e, rk.rank == 0, rk.rank == p_ranks - 1)
        if not stage.first:
            tokens = preset.num_frame_per_block * preset.frame_seqlen
            stage.hidden = torch.empty(inputs.noise.shape[0], tokens, preset.dim, device=pipe.device,
                                       dtype=getattr(torch, hidden_dtype))
    rk.fault("run")
    roles = []
    if stage is not None:
        roles.append(f"DiT layers {stage.start}-{stage.end - 1}")
    if strips is not None and rk.rank in strips.ranks:
        roles.append(strips.role)
    elif rk.rank == decoder:
        roles.append("decoder")
    fn = _stage_forward(pipe, stage, rk.device) if stage is not None else None
    with mock.patch.object(pipe.model, "_forward", fn) if fn is not None else contextlib.nullcontext():
        if isinstance(fn, GraphedCallable) and fn.disabled_reason is None:
            rk.progress("capturing the stage", 0, 1, force=True)
            _dry_run(pipe, inputs, stage)  # a block's forwards share a signature: 2 warm-up calls, the capture
        def run(session=None):
            if strips is not None and rk.rank in strips.ranks:
                return strips.run(inputs, session)
            return _pipeline_run(pipe, inputs, rk, stage, single["latent_strides"], session)

        fps, first, busy, wall, last, runs_spans = timed_runs(rk, run, decoder, "pipeline runs")
        out = {"layout": spec.layout, "role": " + ".join(roles), "stack": list(spec.stack), "notes": ctx.notes,
               "single": single, "busy_ms": busy.summary(), "wall_ms": wall.summary(), "spans": last["spans"],
               "runs_spans": runs_spans, "layer_ranges": ranges, "layer_ms": layer_ms, "hidden_dtype": hidden_dtype}
        if stage is not None and stage.last:  # the clean latents against the single-GPU run's
            out.update(latents_gate(last["latents"], single_out))
        if strips is not None and rk.rank in strips.ranks:
            out.update(strips.results(last, single, single_out, fps, first, spec.warmup + spec.repeats))
        elif rk.rank == decoder:
            gate = check.compare(last["frames"].float(), single_out.frames.float(), dtype="fp32", frames=True)
            out.update(fps=fps.summary(), first_frame_ms=first.summary(), frames_per_block=last["fpb"],
                       psnr_db=gate.psnr, max_abs_diff=gate.max_abs,
                       bit_equal=bool(torch.equal(last["frames"], single_out.frames)),
                       single_repeat_bit_equal=single["repeat_bit_equal"])
        rk.progress("wire", 0, 1, force=True)
        tokens = preset.num_frame_per_block * preset.frame_seqlen  # one hidden state, rank 0 -> 1
        link = wire(torch.zeros(inputs.noise.shape[0], tokens, preset.dim, device=pipe.device,
                                dtype=getattr(torch, hidden_dtype)), rk)
        if link is not None and rk.rank == 0:
            out["wire"] = link
        rk.barrier()
        with ProfilingSession(f"08_{spec.layout.replace('-', '_')}", device=rk.device,
                              output_dir=rk.job_dir / "sessions",
                              tags={"layout": spec.layout, "role": out["role"], "preset": spec.preset}) as s:
            r = run(s)
            if rk.rank == decoder:
                s.set_block_frames(r["fpb"])
            s.set_metrics(busy_ms=r["busy_ms"], idle_ms=r["wall_ms"] - r["busy_ms"], wall_ms=r["wall_ms"])
    return out
