"""The `mg2` workload: a Matrix-Game-2 / Self-Forcing block-causal Wan DiT with rolling KV caches, keyboard and
mouse action modules and a streaming Wan VAE decode (wmbook.pipelines.causal).

Unit of work: one streaming generation of `num_blocks` blocks; each block is the denoising forwards, the
cache-refresh forward and the decode of its latent frames. Metric: FPS (decoded pixel frames per second over the
steady blocks).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from types import SimpleNamespace

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from ..bench import Samples
from ..check import require_finite
from ..device import floor_ms
from ..graphs import register_input_type
from ..models.action import ActionInputs
from ..models.causal_wan import DIT_FINE_LABELS, DIT_FORWARD_LABEL
from ..models.flops import dit_flops_by_category, dit_forward_flops, wan_decoder_flops
from ..models.vae import pixel_frames_for, wan_vae_config
from ..params import Param, ParameterError, check_fits, integer
from ..pipelines.causal import CausalStreamingPipeline, StreamInputs, StreamOutput
from ..pipelines.solvers import FlowStepAxis
from ..presets import PRESETS, dtype_name
from ..profiling import label_table, profile, stage_table
from ..train.objectives import Mg2Objective
from ..variants import swaps
from ..variants.builtin import buffered_decoder
from ..world.eval import Case
from .base import DecoderStep, E2ESize, EndToEnd, GraphTarget, Labels, Layout, Metric, Probe, Workload

REAL_TIME_FPS = 25.0  # Matrix-Game-2's claimed real-time rate (ANCHORS.md)


def block_bytes(preset) -> int:
    """Bytes a generation holds per block whatever the model: its noise, conditioning and output latents and its
    decoded frames (twice: the blocks' frames and their concatenation), at 4 bytes an element. What a block count is
    checked against before anything is allocated."""
    h, w = preset.latent_hw
    f = preset.num_frame_per_block
    latents = (preset.in_dim + 2 * preset.out_dim) * f * h * w
    frames = 2 * 3 * 4 * f * preset.height * preset.width
    return 4 * (latents + frames)


def check_blocks(preset, name: str, n: int, device: torch.device | None = None) -> None:
    """A block count a generation at `preset` can hold (a full-window KV cache has a capacity) and, with `device`,
    whose latents and frames fit in its memory."""
    if preset.local_attn_size == -1 and n * preset.num_frame_per_block > preset.max_latent_frames:
        raise ParameterError(f"{name}={n} is not allowed for preset {preset.name!r}: at most "
                             f"{preset.max_latent_frames // preset.num_frame_per_block} blocks fit its full-window "
                             f"KV cache")
    if device is not None:
        check_fits(name, n, block_bytes(preset), device, f"block at preset {preset.name!r}")


def _num_blocks(v, ctx):
    n = integer(0)(v, ctx) or ctx["preset"].default_blocks
    check_blocks(ctx["preset"], "num_blocks", n, ctx["device"])
    return n


class Mg2Workload(Workload):
    name = "mg2"
    title = "causal DiT + KV cache (Matrix-Game-2 / Self-Forcing)"
    presets = {k: v for k, v in PRESETS.items()}
    real_preset = "mg2-universal"
    tiny_preset = "tiny"
    features = frozenset({"denoiser", "world", "kv_cache", "action_modules", "cross_attention_cache",
                          "streaming_decoder", "frame_decoder", "block_causal_attention"})
    # notebook 04's goals at the real shape (H100, bf16): forward within 1.5x its FLOP floor with compile,
    # regional cold compile under 60 s
    # notebook 06's: 60 FPS with the full Wan decoder, a fresh stream's first frame within 100 ms; notebook 01 states
    # the real-time mark against its baseline
    goals = {"forward_x_floor": 1.5, "regional_cold_s": 60.0, "fps": 60.0, "first_frame_ms": 100.0,
             "real_time_fps": REAL_TIME_FPS}
    published_title = ("causal DiT (mg2)** — median (p20-p80); steady blocks; FLOP floor at the measured bf16 GEMM "
                       "ceiling")
    published_columns = (("FPS", "fps", "{:.3g}", True), ("first frame ms", "first_frame_ms", "{:.0f}", False),
                         ("DiT forward ms", "dit_forward_ms", "{:.1f}", True),
                         ("x floor", "dit_forward_over_floor", "{:.1f}", False),
                         ("VAE ms/block", "vae_decode_ms_per_block", "{:.0f}", False),
                         ("VAE x floor", "vae_decode_over_floor", "{:.1f}", False),
                         ("peak GiB", "peak_memory_gib", "{:.1f}", False))
    forward_name = "DiT forward"
    metric = Metric("fps", "frames/s", True, "FPS")
    labels = Labels(region="2_Pipeline_Inference", forward=DIT_FORWARD_LABEL, fine=DIT_FINE_LABELS,
                    unit=r"2\.3_Block_\d+")
    params = (Param("num_blocks", 0, _num_blocks, "blocks to generate; 0: the preset's default"),)

    overview_panels = (("plot_time_split", 1.0), ("plot_timeline", 1.6))  # notebook 01's overview figure
    compile_scope = "regional"  # the 30 identical DiT blocks: one compiled region, reused

    def check_e2e(self, preset, name: str, size: E2ESize, device: torch.device | None = None) -> None:
        check_blocks(preset, name, size.blocks, device)

    # --- building --------------------------------------------------------------------------------------
    def new_pipeline(self, preset, device, dtype, vae_dtype, seed: int = 0) -> CausalStreamingPipeline:
        return CausalStreamingPipeline(preset, device=device, dtype=dtype, vae_dtype=vae_dtype, seed=seed)

    def world_case(self, pipe, episode_for, seed: int, start, num_blocks, sample_seed: int):
        """Conditioning: the episode's frame `start` (default 0, the agent at rest) and the true keyboard / mouse of
        the next 1 + 4(F - 1) frames; target: the 4(F - 1) frames after it (the generated frame 0 reconstructs the
        conditioning frame and is not scored)."""
        p = pipe.preset
        nb = p.default_blocks if num_blocks is None else num_blocks
        if isinstance(nb, bool) or not isinstance(nb, int) or nb < 1:
            raise ValueError(f"num_blocks={num_blocks!r} is not allowed; allowed values: a positive integer")
        start = 0 if start is None else start
        if isinstance(start, bool) or not isinstance(start, int) or start < 0:
            raise ValueError(f"start={start!r} is not allowed; allowed values: an integer >= 0")
        n_pix = pixel_frames_for(nb * p.num_frame_per_block, True)
        ep = episode_for(start + n_pix)
        sl = slice(start, start + n_pix)
        img = torch.from_numpy(ep.frames[start]).permute(2, 0, 1).float() / 127.5 - 1
        inputs = pipe.prepare(nb, image=img, seed=sample_seed)
        if inputs.actions is not None:
            inputs.actions = {"keyboard": torch.from_numpy(ep.keyboard[sl])[None].to(pipe.device, pipe.dtype),
                              "mouse": torch.from_numpy(ep.mouse[sl])[None].to(pipe.device, pipe.dtype)}
        tgt = slice(start + 1, start + n_pix)
        return Case(workload=self.name, seed=int(seed), start=start, inputs=inputs, target=ep.frames[tgt],
                    target_xy=ep.agent_xy[tgt], target_visible=ep.agent_visible[tgt], last=ep.frames[start],
                    num_blocks=nb)

    def world_predict(self, pipe, case, **sampling):
        out = pipe.generate(case.inputs, progress=False, **sampling)
        return pipe.postprocess(out.frames)[1:], out

    def training_objective(self, pipe, bank, **options):
        return Mg2Objective(pipe, bank, **options)

    def build(self, cfg) -> tuple[CausalStreamingPipeline, StreamInputs]:
        pipe = self.pipeline(cfg.preset, cfg.device, cfg.dtype, cfg.vae_dtype, cfg.seed)
        return pipe, pipe.prepare(cfg.options.num_blocks, seed=cfg.seed)

    def run_callable(self, pipe, inputs: StreamInputs, cfg):
        """The whole labelled pipeline once (data prep, blocks, post-processing, GIF export), as a 0-arg callable."""
        gif = cfg.output_dir / "video.gif"
        return lambda: pipe.run(inputs.num_blocks, seed=cfg.seed, export_path=gif, progress=False)

    def generate_callable(self, pipe, inputs: StreamInputs, cfg):
        """One generation (all blocks, VAE decode included) as a 0-arg callable: what FPS measures."""
        return lambda: pipe.generate(inputs, progress=False)

    # --- the parts variants act on -----------------------------------------------------------------------
    def compile_regions(self, pipe) -> list[torch.nn.Module]:
        return list(pipe.model.blocks)  # the 30 DiT blocks

    def conv_layouts(self, pipe) -> list[Layout]:
        return [Layout(pipe.vae, torch.channels_last_3d)]  # the Wan VAE's causal 3-D convolutions

    def static_caches(self, pipe) -> str:
        swaps.swap_class(pipe, swaps.StaticGenerationCache)
        return "one set of KV, action and cross-attention caches for every generation, reset and refilled in place"

    def graph_targets(self, pipe) -> list[GraphTarget]:
        """The DiT forward after its eager preamble (`_forward`: tensors in, the caches read and written at slots
        prepared before it), one graph per set of cache write slots (block 0; every later block). Its write slots
        must be prepared outside the graph (kv-slot-write, applied here if the stack lacks it: a graph replays the
        cache bookkeeping of the block it was captured in) and the caches must keep their addresses (static caches)."""
        register_input_type(ActionInputs)
        model = self.denoiser(pipe)
        swaps.swap_class(model, swaps.KVSlotWrites)
        self.static_caches(pipe)
        return [GraphTarget(model, "_forward", "DiT forward", key_fn=_cache_slots)]

    def set_vae(self, pipe, vae) -> None:
        super().set_vae(pipe, vae)
        pipe.decoder.vae = vae  # the same streaming decoder (and what variants swapped into it), a new VAE
        pipe.decoder.reset()

    def streaming_decoder(self, pipe):
        return pipe.decoder

    def decoder_ladder(self, device) -> list[str]:
        """cuDNN's algorithm search, then bf16, the caches in place, channels-last windows, the resamplers'
        upsampling and convolution folded into one transposed convolution, the head's convolution as a GEMM, the
        compiled and captured step (GPU), a steady block's latent frames in one step call. The search is on before
        the bf16 decoder's convolutions first run (the `cudnn-benchmark` variant says why)."""
        gpu = device.type == "cuda"
        return (["cudnn-benchmark", "vae-bf16"] if gpu else []) + ["vae-stream-buffers", "vae-channels-last",
                                                                  "vae-upsample-fold"] + (
            ["vae-head-gemm", "vae-compile", "vae-cuda-graphs"] if gpu else []) + ["vae-block-step"]

    def stand_in_decoder(self, device) -> list[str]:
        """The tiny decoder (TAEHV) in channels-last with its block step compiled: 4.04 ms per block against the Wan
        decoder's 79.8 (bf16, compiled and captured) on the H100 (data/reports/h100/decoder_bench-tiny-*)."""
        gpu = device.type == "cuda"
        return (["vae-bf16", "cudnn-benchmark"] if gpu else []) + ["vae-tiny", "vae-channels-last", "vae-compile"]

    def decoder_step(self, pipe) -> DecoderStep:
        """The streaming decoder's per-latent-frame step: compiled for the steady frames (phase 2: a stream's first
        two frames allocate or change its caches, and compiling them would compile each again once the caches exist);
        captured after its caches are moved into fixed buffers (vae-stream-buffers). Asking for it prepares the decoder
        for that: its stage labels go (a compiled or captured step is one region)."""
        dec = pipe.decoder
        if hasattr(dec, "decoder_step"):  # a stand-in decoder (vae-tiny) says what its step is
            return dec.decoder_step()
        dec.stage_labels = False  # record_function inside a compiled region is a graph break
        return DecoderStep(dec, "decode_frame", compiled=lambda args: args[1] == 2,
                           make_static=lambda p: buffered_decoder(p.decoder))

    def set_streaming_decoder(self, pipe, decoder) -> None:
        pipe.decoder = decoder

    decoder_unit = "steady block of 12 pixel frames"  # 3 latent frames at the real preset

    def decoder_bench(self, ref):
        """The VAE (deep-copied) and a fresh streaming decoder of it, with the attributes decoder variants touch."""
        vae = copy.deepcopy(ref.vae)
        dec = type(ref.decoder)(vae)
        return SimpleNamespace(vae=vae, decoder=dec, vae_dtype=ref.vae_dtype, preset=ref.preset, device=ref.device)

    def decoder_block(self, pipe) -> tuple[int, int]:
        k = pipe.preset.num_frame_per_block
        return k, 4 * k

    @torch.no_grad()
    def decoder_latents(self, pipe, seed: int, size: E2ESize) -> torch.Tensor:
        return pipe.generate(pipe.prepare(max(size.blocks, 2), seed=seed), progress=False, decode=False).latents

    def decoder_flops(self, preset) -> dict:
        return wan_decoder_flops(preset)

    def decoder_size(self, pipe) -> str:
        return pipe.preset.vae

    # --- measuring -------------------------------------------------------------------------------------
    def step_axis(self):
        return FlowStepAxis()

    def kernel_cases(self, preset) -> list:
        """The DiT block's adaLN, gated residual + adaLN and q/k norm + RoPE at one block's tokens; the Wan VAE
        decoder's RMS norm + SiLU."""
        from ..kernels.cases import dit_cases, wan_decoder_cases  # noqa: PLC0415  late: registers the Triton kernel ops

        (lh, lw), (pt, ph, pw) = preset.latent_hw, preset.patch_size
        grid = (preset.num_frame_per_block // pt, lh // ph, lw // pw)  # one block's token grid
        return (dit_cases(preset.dim, preset.num_heads, grid, preset.eps)
                + wan_decoder_cases(preset.latent_hw, wan_vae_config(preset.vae)["base_dim"]))

    def forward_flops(self, preset) -> dict[str, float]:
        return dit_forward_flops(preset, block_idx=1)

    def flops_by_category(self, preset) -> dict[str, float]:
        return dit_flops_by_category(preset, block_idx=1)

    @torch.no_grad()
    def forward_probe(self, pipe, seed: int = 0) -> Probe:
        """The first denoising forward of block 1 with block 0 in the caches (it rewrites block 1's cache slots,
        so it repeats)."""
        p = pipe.preset
        k = p.num_frame_per_block
        inp = pipe.prepare(2, seed=seed)
        cache = pipe.init_cache(inp)
        noisy = inp.noise[:, :, :k]
        x0 = noisy
        for t in pipe.timesteps:  # block 0 fills the caches: its denoising steps and the refresh, as a generation
            x0 = pipe.denoise(noisy, t, inp, cache, 0)
        pipe.denoise(x0, 0.0, inp, cache, 0)
        x1 = inp.noise[:, :, k:2 * k]
        tt = torch.full((1, k), float(pipe.timesteps[0]), device=pipe.device)
        cond = inp.cond_concat[:, :, k:2 * k] if inp.cond_concat is not None else None

        @torch.no_grad()  # inference everywhere it is called (a grad-mode change would also recompile)
        def forward():
            return pipe.model(x1, tt, inp.context, cond_concat=cond, actions=inp.actions, cache=cache,
                              start_frame=k)

        return Probe(forward, self.forward_flops(p)["total"],
                     f"DiT forward on block 1 (t={pipe.timesteps[0]:.0f}, {k} latent frames, KV cache of block 0)")

    @torch.no_grad()
    def end_to_end(self, pipe, seed: int = 0, size: E2ESize = E2ESize()) -> EndToEnd:
        out = pipe.generate(pipe.prepare(size.blocks, seed=seed), progress=False)
        return EndToEnd(frames=out.frames, latents=out.latents, metric=self.metric, value=out.metrics()["fps"],
                         first_frame_ms=out.first_frame_ms, run_s=out.total_ms / 1e3)

    @torch.no_grad()
    def decode(self, pipe, latents: torch.Tensor) -> torch.Tensor:
        k = pipe.preset.num_frame_per_block
        pipe.decoder.reset()
        return torch.cat([pipe.decoder.decode_block(latents[:, :, i:i + k].to(pipe.vae_dtype))
                          for i in range(0, latents.shape[2], k)], dim=2)

    def e2e_description(self, size: E2ESize) -> str:
        return f"{size.blocks}-block run"

    def default_ladder(self, device, attention: str | None) -> list[str]:
        """tf32 -> bf16 -> the hygiene variants [-> attention backend] -> fused action attention (compile follows)."""
        steps = ["tf32", "bf16", "hygiene"]
        if attention:
            steps.append(attention)
        # the action modules' tiny attentions as fusable math, for the compiled row that follows (H100, compiled:
        # SDPA spent 6.8 of 28.7 ms of GPU time per forward on them, padding 3x6 problems to 64x128 tiles)
        return steps + ["action-attn-fused"]

    # --- notebook 01 -------------------------------------------------------------------------------------
    def model_table(self, pipe, inputs: StreamInputs, cfg=None) -> pd.DataFrame:
        p = pipe.preset
        cache = pipe.init_cache(inputs)
        rows = {
            "DiT parameters (M)": sum(t.numel() for t in pipe.model.state_dict().values()) / 1e6,
            "VAE decoder parameters (M)": sum(t.numel() for t in pipe.vae.decoder.parameters()) / 1e6,
            "latent frames per block": p.num_frame_per_block,
            "tokens per latent frame": p.frame_seqlen,
            "query tokens per forward": p.frame_seqlen * p.num_frame_per_block,
            "attention window (latent frames)": p.kv_capacity_frames(),
            "forwards per block (steps + refresh)": p.forwards_per_block,
            "warped timesteps": ", ".join(f"{t:.1f}" for t in pipe.timesteps),
            "KV caches (MiB, all layers)": cache.nbytes() / 2**20,
            "blocks generated": inputs.num_blocks,
        }
        del cache
        return pd.DataFrame({"value": rows}).rename_axis("quantity")

    def benchmark(self, pipe, inputs: StreamInputs, cfg, ceilings: dict) -> "Mg2BaselineResult":
        """Eager streaming baseline: `warmup` untimed generations, then `repeats` timed ones (device events)."""
        for _ in tqdm(range(cfg.warmup), desc="warm-up", leave=False):
            pipe.generate(inputs, progress=False)
        runs = [pipe.generate(inputs, progress=False)
                for _ in tqdm(range(cfg.repeats), desc="timed runs", leave=False)]
        require_finite({"latents": runs[-1].latents, "frames": runs[-1].frames},
                       f"the eager pipeline ({pipe.preset.name})")
        return Mg2BaselineResult(runs=runs, preset=pipe.preset, ceilings=ceilings, timesteps=list(pipe.timesteps))

    def profile_stages(self, pipe, inputs: StreamInputs, cfg):
        """One torch.profiler trace of the whole labelled pipeline: (stage table, trace path, label table)."""
        prof = profile(self.run_callable(pipe, inputs, cfg), wait=0, warmup=1, active=1, out_dir=cfg.output_dir,
                       name="01_baseline_trace")
        labels = label_table(prof.trace_path)
        return stage_table(labels).set_index("label"), prof.trace_path, labels

    def session_run(self, pipe, inputs: StreamInputs, cfg, session) -> None:
        """One labelled run inside a ProfilingSession: data prep, one timed generation (its blocks give FPS, BPS and
        first-frame latency), post-processing and export."""
        fresh = pipe.prepare(inputs.num_blocks, seed=cfg.seed)
        with session.generation():
            out = pipe.generate(fresh, progress=False)
        pipe.export(pipe.postprocess(out.frames), cfg.output_dir / "video.gif")
        session.set_block_frames(out)
        session.set_metrics(workload=self.name, preset=cfg.preset.name, dtype=dtype_name(cfg.dtype),
                            blocks=inputs.num_blocks, pipeline_fps=out.metrics()["fps"],
                            pipeline_first_frame_ms=out.first_frame_ms)

    def interpret_baseline(self, cfg, res: "Mg2BaselineResult") -> list[str]:
        """Sentences computed from the measured numbers."""
        s = res.summary()
        p = cfg.preset
        dev = res.ceilings.get("device_name", str(cfg.device))
        fps = s["fps"].median
        lines = [
            f"On {dev}, `{p.name}` ({dtype_name(cfg.dtype)}) streams at {fps:.2f} FPS "
            f"(p20 {s['fps'].p20:.2f}, p80 {s['fps'].p80:.2f}; {s['bps'].median:.2f} blocks/s); "
            f"the first frame arrives after {s['first_frame_ms'].median:.0f} ms.",
            f"A steady block takes {s['block_ms']:.1f} ms: {p.forwards_per_block} DiT forwards and a VAE decode that "
            f"alone takes {s['vae_decode_ms_per_block']:.1f} ms ({s['vae_share']:.0%} of the block), "
            f"{s['vae_decode_over_floor']:.1f}x the decoder's own FLOP floor of {s['vae_floor_ms']:.3g} ms "
            f"(torch.utils.flop_counter on the streaming decode of one steady block).",
            f"One DiT forward takes {s['dit_forward_ms'].median:.2f} ms, {s['dit_forward_over_floor']:.1f}x its FLOP "
            f"floor of {s['dit_floor_ms']:.3g} ms ({s['dit_forward_tflop']:.3g} TFLOP at the measured "
            f"{res.ceilings.get('gemm_tflops', float('nan')):.3g} TFLOP/s GEMM ceiling); achieved "
            f"{s['achieved_tflops']:.3g} TFLOP/s.",
        ]
        need = p.num_frame_per_block * 4 / REAL_TIME_FPS * 1e3
        if fps >= REAL_TIME_FPS:
            lines.append(f"That is above the {REAL_TIME_FPS:.0f} FPS real-time mark.")
        else:
            lines.append(f"Real time at {REAL_TIME_FPS:.0f} FPS needs a steady block in {need:.0f} ms, "
                         f"{s['block_ms'] / need:.1f}x faster than now.")
        return lines


@dataclass
class Mg2BaselineResult:
    """Timed eager generations of notebook 01 and the tables and figures built from them."""

    runs: list[StreamOutput]
    preset: object
    ceilings: dict
    timesteps: list[float] = field(default_factory=list)
    steady_from: int = 1
    units = {"fps": "frames/s", "bps": "blocks/s", "first_frame_ms": "ms", "dit_forward_ms": "ms",
             "dit_floor_ms": "ms", "dit_forward_over_floor": "x", "achieved_tflops": "TFLOP/s",
             "vae_decode_ms_per_block": "ms", "vae_share": "fraction", "block_ms": "ms",
             "peak_memory_gib": "GiB", "dit_forward_tflop": "TFLOP", "vae_floor_ms": "ms",
             "vae_decode_over_floor": "x"}

    def run_table(self) -> pd.DataFrame:
        rows = []
        for i, r in enumerate(self.runs):
            m = r.metrics(self.steady_from)
            rows.append({"run": i, "fps": m["fps"], "bps": m["bps"], "first_frame_ms": r.first_frame_ms,
                         "block_ms_median": m["block_ms_median"], "total_ms": r.total_ms,
                         "peak_memory_gib": r.peak_memory_bytes / 2**30 if r.peak_memory_bytes else np.nan})
        return pd.DataFrame(rows).set_index("run")

    def block_table(self) -> pd.DataFrame:
        """Per block (median over runs): forwards, cache refresh, VAE decode, total, frames."""
        n = self.preset.forwards_per_block
        rows = []
        for bi in range(len(self.runs[0].block_ms)):
            fw = np.array([r.forward_ms[bi] for r in self.runs])  # [runs, n]
            rows.append({"block": bi,
                         "denoise_ms": float(np.median(fw[:, : n - 1].sum(1))),
                         "cache_refresh_ms": float(np.median(fw[:, n - 1])),
                         "vae_decode_ms": float(np.median([r.decode_ms[bi] for r in self.runs])),
                         "block_ms": float(np.median([r.block_ms[bi] for r in self.runs])),
                         "pixel_frames": self.runs[0].frames_per_block[bi]})
        return pd.DataFrame(rows).set_index("block")

    def step_table(self) -> pd.DataFrame:
        """Per block and forward (median over runs); the last forward of a block is the cache refresh."""
        n = self.preset.forwards_per_block
        ts = list(self.timesteps) + [0.0]
        rows = []
        for bi in range(len(self.runs[0].block_ms)):
            for j in range(n):
                rows.append({"block": bi, "forward": j, "kind": "refresh" if j == n - 1 else "denoise",
                             "t": ts[j] if j < len(ts) else np.nan,
                             "ms": float(np.median([r.forward_ms[bi][j] for r in self.runs]))})
        return pd.DataFrame(rows)

    def forward_samples(self) -> Samples:
        """Every steady-state DiT forward of every run (blocks >= steady_from), ms."""
        return Samples([ms for r in self.runs for bi, fw in enumerate(r.forward_ms)
                        if bi >= min(self.steady_from, len(r.forward_ms) - 1) for ms in fw], "ms")

    def summary(self) -> dict:
        ms = [r.metrics(self.steady_from) for r in self.runs]
        blocks = self.block_table()
        steady = blocks.iloc[min(self.steady_from, len(blocks) - 1):]
        fwd = self.forward_samples()
        flops = dit_forward_flops(self.preset, block_idx=max(1, self.steady_from))["total"]
        fl_ms = floor_ms(flops, self.ceilings)
        peaks = [r.peak_memory_bytes for r in self.runs if r.peak_memory_bytes]
        vae_floor = floor_ms(wan_decoder_flops(self.preset)["steady_block"], self.ceilings)
        vae_ms = float(steady["vae_decode_ms"].median())
        return {
            "fps": Samples([m["fps"] for m in ms], "frames/s"), "bps": Samples([m["bps"] for m in ms], "blocks/s"),
            "first_frame_ms": Samples([r.first_frame_ms for r in self.runs], "ms"),
            "dit_forward_ms": fwd, "dit_forward_tflop": flops / 1e12, "dit_floor_ms": fl_ms,
            "dit_forward_over_floor": fwd.median / fl_ms, "achieved_tflops": flops / (fwd.median * 1e-3) / 1e12,
            "vae_decode_ms_per_block": vae_ms, "vae_floor_ms": vae_floor, "vae_decode_over_floor": vae_ms / vae_floor,
            "vae_share": float(steady["vae_decode_ms"].sum() / steady["block_ms"].sum()),
            "block_ms": float(steady["block_ms"].median()),
            "peak_memory_gib": max(peaks) / 2**30 if peaks else float("nan"),
        }

    def detail_tables(self) -> dict[str, pd.DataFrame]:
        """The workload's detail tables for notebook 01, by title."""
        return {"Per block (median over runs)": self.block_table(),
                "Per block and forward, ms (median over runs; the last forward is the cache refresh)":
                    self.step_table().pivot(index="block", columns="forward", values="ms")}

    def plot_time_split(self, ax=None):
        """Stacked bars per block: denoising forwards, cache refresh, VAE decode (median over runs)."""
        import matplotlib.pyplot as plt  # noqa: PLC0415  heavy: matplotlib.pyplot

        bt = self.block_table()
        if ax is None:
            _, ax = plt.subplots(figsize=(7, 3.2))
        bottom = np.zeros(len(bt))
        for col, color in (("denoise_ms", "#4477aa"), ("cache_refresh_ms", "#66ccee"), ("vae_decode_ms", "#ee6677")):
            ax.bar(bt.index, bt[col], bottom=bottom, label=col.replace("_ms", "").replace("_", " "), color=color)
            bottom += bt[col].to_numpy()
        ax.set_xlabel("block")
        from matplotlib.ticker import MaxNLocator  # noqa: PLC0415  heavy: matplotlib

        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # blocks are whole numbers
        ax.set_ylabel("ms")
        ax.set_title("Time per block (median over runs)")
        ax.legend(fontsize=8)
        return ax

    def plot_timeline(self, ax=None):
        """One run's forwards and decodes on a time axis (device events)."""
        import matplotlib.pyplot as plt  # noqa: PLC0415  heavy: matplotlib.pyplot

        r = self.runs[len(self.runs) // 2]
        if ax is None:
            _, ax = plt.subplots(figsize=(9, 2.2))
        t = 0.0
        n = self.preset.forwards_per_block
        for bi, fw in enumerate(r.forward_ms):
            for j, ms in enumerate(fw):
                ax.barh(0, ms, left=t, color="#66ccee" if j == n - 1 else "#4477aa", edgecolor="white")
                t += ms
            ax.barh(0, r.decode_ms[bi], left=t, color="#ee6677", edgecolor="white")
            ax.text(t - sum(fw) / 2, 0.45, f"block {bi}", ha="center", fontsize=7)
            t += r.decode_ms[bi]
        ax.axvline(r.first_frame_ms, color="k", ls="--", lw=1)
        ax.text(r.first_frame_ms, -0.55, " first frame", fontsize=7)
        ax.set_yticks([])
        ax.set_xlabel("ms since generation start")
        ax.set_title("Timeline of one run: DiT forwards (blue), cache refresh (light), VAE decode (red)")
        return ax


def _cache_slots(args, kwargs):
    """The write slots of every cache a DiT forward reads and writes: a captured graph holds their addresses."""
    cache = kwargs.get("cache")
    if cache is None:
        return None
    action = tuple((a.mouse.slot if a.mouse is not None else None, a.keyboard.slot if a.keyboard is not None else None)
                   for a in cache.action if a is not None)
    return tuple(c.slot for c in cache.kv), action
