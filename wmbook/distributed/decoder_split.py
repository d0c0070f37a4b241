"""Layout `decoder-split`: rank 0 denoises (as in the stage split), the streaming decoder is spread over the other
ranks by horizontal strips of the frame, with halo exchange.

Each decoder rank decodes the latent rows of its strip (as equal as the latent height allows: 44 rows over 3 ranks
are 15, 15 and 14) through a copy of the pipeline's Wan decoder whose spatial convolutions take their missing rows from
the neighbouring strips: before every convolution with a 3 x 3 spatial kernel the rank sends its top and bottom rows
to the ranks above and below and receives theirs (zero rows at the frame's top and bottom edge, as the convolution's
own zero padding has there). A causal convolution concatenates its cached frames to the new ones before that
exchange, so the cached frames' halo rows travel too: a strip's caches hold exactly the rows the whole decoder's
caches hold. The middle block's spatial self-attention sees the whole frame: its input is gathered from every strip
(at the latent resolution, the decoder's smallest) and each rank keeps its rows of the output. Everything else in the
decoder (RMS norms over channels, SiLU, nearest upsampling, 1 x 1 and temporal-only convolutions) is per pixel or
per column and needs nothing from the neighbours. So each strip's pixels are the whole decoder's, up to the
convolution algorithms' rounding on a different shape.

The decoder ranks run the strip decoder in the pipeline's VAE dtype; where the stack compiles the decoder
(`vae-compile`), the strip decoder's per-frame step is compiled too, its graph broken at every halo exchange (the
exchanges run between the compiled pieces); CUDA graphs of the strip decoder are not built. The block's frames are there
when the slowest strip is: the last rank collects every decoder rank's block-end times (device events from the
common start) and counts FPS and the first frame from their maxima; it also gathers the strips once after the timed
runs for the gate against the single-GPU frames.
"""

from __future__ import annotations

import copy
import types

import torch
import torch.distributed as dist
import torch.nn.functional as F
from diffusers.models.autoencoders import autoencoder_kl_wan as _wan
from torch import nn

from ..bench import DeviceTimer, stream_metrics
from ..models.vae import StreamingWanDecoder
from ..profiling import ProfilingSession
from ..profiling.labels import label
from .rank import Rank
from .stream import DENOISER, _decoder_run, _single_gpu, _split_run, frames_gate, latents_gate, timed_runs, wire


def strip_rows(height: int, parts: int) -> list[tuple[int, int]]:
    """The latent rows [start, end) of each of `parts` strips of `height` rows, from the top, the first ones a row
    longer where the rows do not divide evenly (ValueError for more strips than rows)."""
    if parts < 1 or parts > height:
        raise ValueError(f"a latent height of {height} rows does not split into {parts} strips; allowed: 1 to "
                         f"{height} decoder ranks")
    n, extra = divmod(height, parts)
    bounds = [0]
    for i in range(parts):
        bounds.append(bounds[-1] + n + (i < extra))
    return list(zip(bounds[:-1], bounds[1:]))


class Halo:
    """Row exchange between the strips of one frame: `ranks` are the global ranks of the strips from top to bottom,
    `index` this rank's place among them, `rows` every strip's latent rows; `group` the process group of those ranks
    (the middle block's gather)."""

    def __init__(self, ranks: list[int], index: int, rows: list[int], group=None):
        self.ranks, self.index, self.rows, self.group = list(ranks), index, list(rows), group
        self.above = ranks[index - 1] if index > 0 else None
        self.below = ranks[index + 1] if index + 1 < len(ranks) else None
        self.exchanges = 0

    @torch.compiler.disable  # a compiled strip decoder breaks its graph here: the exchange runs as it is
    def pad(self, x: torch.Tensor, dim: int, width: int) -> torch.Tensor:
        """x with `width` rows of the strip above before its rows along `dim` and `width` rows of the strip below
        after them (zeros at the frame's edges)."""
        if width == 0:
            return x
        n = x.shape[dim]
        if n < width:
            raise ValueError(f"a strip of {n} rows cannot lend a halo of {width}: fewer decoder ranks")
        shape = list(x.shape)
        shape[dim] = width
        # rows a neighbour sends are received into empty buffers; only the frame's edges are zeros
        top = x.new_empty(shape) if self.above is not None else x.new_zeros(shape)
        bottom = x.new_empty(shape) if self.below is not None else x.new_zeros(shape)
        ops = []
        if self.above is not None:
            ops += [dist.P2POp(dist.isend, x.narrow(dim, 0, width).contiguous(), self.above),
                    dist.P2POp(dist.irecv, top, self.above)]
        if self.below is not None:
            ops += [dist.P2POp(dist.isend, x.narrow(dim, n - width, width).contiguous(), self.below),
                    dist.P2POp(dist.irecv, bottom, self.below)]
        if ops:
            for work in dist.batch_isend_irecv(ops):
                work.wait()
        self.exchanges += 1
        return torch.cat([top, x, bottom], dim)

    @torch.compiler.disable
    def gather(self, x: torch.Tensor, dim: int) -> torch.Tensor:
        """Every strip's x, concatenated along `dim` from top to bottom. Strips may differ by a row: each is sent
        padded to the longest (all_gather takes equal shapes) and cut back to its rows (at x's resolution: its latent
        rows times the upsampling so far)."""
        scale = x.shape[dim] // self.rows[self.index]
        longest = max(self.rows) * scale
        pad = longest - x.shape[dim]
        if pad:
            shape = list(x.shape)
            shape[dim] = pad
            x = torch.cat([x, x.new_zeros(shape)], dim)
        parts = [torch.empty_like(x) for _ in self.ranks]
        dist.all_gather(parts, x.contiguous(), group=self.group)
        return torch.cat([p.narrow(dim, 0, r * scale) for p, r in zip(parts, self.rows)], dim)


def _halo_causal_conv(self, x, cache_x=None):
    """WanCausalConv3d.forward on a strip: cached frames first, then the halo rows of both (the cache's halo is the
    neighbour's cached rows), then the causal time padding and the width padding; no height padding left to add."""
    padding = list(self._padding)  # (w, w, h, h, 2 t, 0)
    if cache_x is not None and padding[4] > 0:
        x = torch.cat([cache_x.to(x.device), x], dim=2)
        padding[4] -= cache_x.shape[2]
    x = self._halo.pad(x, 3, padding[2])
    padding[2] = padding[3] = 0
    return nn.Conv3d.forward(self, F.pad(x, padding))


class _HaloConv2d(nn.Module):
    """The upsamplers' 3 x 3 Conv2d ([B*T, C, H, W]) on a strip: halo rows in, height padding off."""

    def __init__(self, conv: nn.Conv2d, halo: Halo):
        super().__init__()
        self.conv, self.halo, self.width = conv, halo, conv.padding[0]
        conv.padding = (0, conv.padding[1])

    def forward(self, x):
        return self.conv(self.halo.pad(x, 2, self.width))


def _gathered_attention(self, x):
    """WanAttentionBlock.forward on a strip: the block over the whole frame (every strip gathered), this strip's rows
    of its output."""
    halo = self._halo
    scale = x.shape[3] // halo.rows[halo.index]
    start = sum(halo.rows[:halo.index]) * scale
    return self._whole_forward(halo.gather(x, 3)).narrow(3, start, x.shape[3])


def split_vae(vae, halo: Halo):
    """A copy of the Wan VAE whose decoder decodes one strip (module docstring); the encoder is left as it is."""
    foreign = sorted({type(m).__name__ for m in vae.decoder.modules() if type(m).__module__.startswith("wmbook")})
    if foreign:  # a decoder variant swapped modules this split does not know how to feed rows to
        raise ValueError(f"decoder-split splits the Wan decoder's own modules; this stack replaced some ({foreign}): "
                         "allowed: a stack without decoder module swaps (vae-stream-buffers, vae-window-kernels)")
    v = copy.deepcopy(vae)
    dec = v.decoder
    for name, m in list(dec.named_modules()):
        if isinstance(m, _wan.WanCausalConv3d):
            if m._padding[2] > 0:  # a spatial kernel: rows from the neighbours
                m._halo = halo
                m.forward = types.MethodType(_halo_causal_conv, m)
        elif isinstance(m, _wan.WanAttentionBlock):
            m._halo = halo
            m._whole_forward = m.forward
            m.forward = types.MethodType(_gathered_attention, m)
        elif isinstance(m, nn.Sequential):
            for j, c in enumerate(m):
                if isinstance(c, nn.Conv2d) and c.padding[0] > 0:
                    m[j] = _HaloConv2d(c, halo)
    return v


class Strips:
    """The decoder ranks of a job that decode strips of the frame (`ranks`, from top to bottom; every rank of the job
    builds it, since making the ranks' process group takes all of them): this rank's strip decoder, its runs and, on
    the last of them, the frame's times and frames gathered from every strip. `src`: the rank that sends each block's
    clean latents."""

    def __init__(self, pipe, rk: Rank, ranks: list[int], src: int):
        self.pipe, self.rk, self.ranks, self.src = pipe, rk, list(ranks), src
        self.group = dist.new_group(self.ranks)  # every rank takes part in making a group, members or not
        h = pipe.preset.latent_hw[0]
        self.strips = strip_rows(h, len(self.ranks))
        self.rows_each = [b - a for a, b in self.strips]
        self.last = self.ranks[-1]
        self.halo = self.dec = self.rows = None
        if rk.rank in self.ranks:
            i = self.ranks.index(rk.rank)
            self.halo = Halo(self.ranks, i, self.rows_each, self.group)
            self.dec = StreamingWanDecoder(split_vae(pipe.vae, self.halo), stage_labels=False)
            self.rows = self.strips[i]
            self.role = f"decoder rows {self.rows[0]}-{self.rows[1] - 1} of {h}"
            if getattr(pipe.decoder, "compiled_step", False):  # the stack compiles the decoder: the strip's too
                from ..variants.builtin.compile import raise_recompile_limit_for_regions  # noqa: PLC0415  heavy

                # a graph break inside a block compiles that block's code as a frame of its own, once per
                # resolution and frame phase: more entries than dynamo's default limit of 8
                raise_recompile_limit_for_regions()
                self.dec.decode_frame = torch.compile(self.dec.decode_frame, backend=rk.spec.compile_backend,
                                                      dynamic=False)
                self.role += ", compiled between its halo exchanges"

    def run(self, inputs, session=None) -> dict:
        """One generation's decode on this strip rank (module docstring)."""
        return _strip_run(self.pipe, inputs, self.rk, self.dec, self.rows, self.src, self.ranks, session)

    def results(self, last: dict, single: dict, single_out, fps, first, runs: int) -> dict:
        """This strip rank's result fields; on the last strip rank also the frame's FPS and first frame (from the
        slowest strip) and the gate of the gathered frames against the single-GPU run's."""
        out = {"strips": self.strips, "halo_exchanges_per_run": self.halo.exchanges // max(1, runs)}
        frames = _gather_frames(last["frames"], self.rk, self.ranks, self.rows_each)
        if frames is not None:
            out.update(fps=fps.summary(), first_frame_ms=first.summary(), frames_per_block=last["fpb"],
                       **frames_gate(frames, last["fpb"], single_out, single))
        return out


def _strip_run(pipe, inputs, rk: Rank, dec: StreamingWanDecoder, rows: tuple[int, int], src: int, ranks: list[int],
               session=None) -> dict:
    """One generation's decode on a strip rank: each block's latents received from `src`, this strip decoded; the
    block-end times (from the common start) for the last strip rank's count."""
    stage = session.stage if session is not None else label
    timer = DeviceTimer(pipe.device)
    rk.barrier()
    timer.mark("start")

    def decode(x0, bi):
        marks = [f"b{bi}_px"]

        def first(_frames):  # the strip's first latent frame's pixels are queued
            if marks:
                timer.mark(marks.pop())

        fr = dec.decode_block(x0[:, :, :, rows[0]:rows[1]].to(pipe.vae_dtype), on_frames=first)
        timer.mark(f"b{bi}_end")
        return fr

    out = _decoder_run(pipe, inputs, timer, stage, decode, src=src, decoder=dec)
    ends = [timer.elapsed_ms("start", f"b{bi}_end") for bi in range(inputs.num_blocks)]
    first_px = timer.elapsed_ms("start", "b0_px")
    # the frame is there when its slowest strip is: the last strip rank counts from every strip's times
    t = torch.tensor([*ends, first_px], dtype=torch.float64, device=rk.device)  # NCCL sends only device tensors
    last = ranks[-1]
    if rk.rank != last:
        dist.send(t, dst=last)
        return out
    worst = t.clone()
    for r in ranks[:-1]:
        other = torch.empty_like(t)
        dist.recv(other, src=r)
        worst = torch.maximum(worst, other)
    ends, first_px = worst[:-1].tolist(), float(worst[-1])
    block_ms = [ends[0]] + [b - a for a, b in zip(ends, ends[1:])]
    m = stream_metrics(block_ms, out["fpb"], first_px if pipe.stream_frames else ends[0])
    out.update(block_ms=block_ms, fps=m["fps"], first_frame_ms=m["first_frame_ms"])
    return out


def _gather_frames(frames: torch.Tensor, rk: Rank, ranks: list[int], rows: list[int]) -> torch.Tensor | None:
    """Every strip's frames on the last strip rank, stacked from top to bottom along the height (None elsewhere);
    `rows`: each strip's latent rows (a strip's pixel rows are its latent rows times the decoder's upsampling)."""
    last = ranks[-1]
    if rk.rank != last:
        dist.send(frames.contiguous(), dst=last)
        return None
    scale = frames.shape[3] // rows[-1]
    parts = []
    for r, n in zip(ranks[:-1], rows):
        shape = list(frames.shape)
        shape[3] = n * scale
        buf = frames.new_empty(shape)
        dist.recv(buf, src=r)
        parts.append(buf)
    return torch.cat([*parts, frames], dim=3)


def run_decoder_split(rk: Rank) -> dict:
    """This rank's part of a decoder-split job (module docstring); the result JSON of the rank."""
    spec = rk.spec
    preset, pipe, ctx = rk.pipeline()
    inputs = pipe.prepare(spec.blocks, seed=spec.seed)
    strips = Strips(pipe, rk, list(range(1, rk.world)), src=DENOISER)
    single, single_out = _single_gpu(pipe, inputs, rk)
    rk.fault("run")
    if rk.rank == DENOISER:
        def run(session=None):
            return _split_run(pipe, inputs, rk, [], session, dsts=strips.ranks)
        role = "denoiser"
    else:
        def run(session=None):
            return strips.run(inputs, session)
        role = strips.role
    fps, first, busy, wall, last, runs_spans = timed_runs(rk, run, strips.last, "split runs")
    out = {"layout": "decoder-split", "role": role, "stack": list(spec.stack), "notes": ctx.notes,
           "single": single, "busy_ms": busy.summary(), "wall_ms": wall.summary(), "spans": last["spans"],
           "runs_spans": runs_spans, "strips": strips.strips}
    if rk.rank == DENOISER:
        out.update(forward_ms=last["forward_ms"], **latents_gate(last["latents"], single_out))
    else:
        out.update(strips.results(last, single, single_out, fps, first, spec.warmup + spec.repeats))
    rk.progress("wire", 0, 1, force=True)
    out["wire"] = wire(single_out.latents[:, :, :preset.num_frame_per_block].contiguous(), rk)
    with ProfilingSession("08_decoder_split", device=rk.device, output_dir=rk.job_dir / "sessions",
                          tags={"layout": "decoder-split", "role": role, "preset": spec.preset}) as s:
        r = run(s)
        if rk.rank == strips.last:
            s.set_block_frames(r["fpb"])
        s.set_metrics(busy_ms=r["busy_ms"], idle_ms=r["wall_ms"] - r["busy_ms"], wall_ms=r["wall_ms"])
    return out
