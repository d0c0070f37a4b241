"""The `wma` workload: a UnifoLM-WMA style video UNet world model with action and state heads, sampled with DDIM
twice per interaction iteration (decision pass, world-model pass), decoded per frame with the SD VAE
(wmbook.pipelines.ddim).

Unit of work: one interaction iteration. Metric: ms per DDIM step (lower is better); notebook 01 also reports
seconds per iteration and ms per UNet forward.
"""

from __future__ import annotations

import copy
import math
import types
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from ..bench import Samples
from ..check import require_finite
from ..device import floor_ms
from ..models.flops import sd_decoder_flop_parts
from ..models.wma import WMA_FINE_LABELS, WMA_FORWARD_LABEL
from ..models.wma.flops import unet_forward_flops
from ..params import Param, integer, number
from ..pipelines.ddim import (
    DEFAULT_INSTRUCTION,
    ITERATION_LABEL,
    WMAInputs,
    WMAInteractionPipeline,
    WMAOutput,
    check_run_params,
    to_uint8_video,
)
from ..pipelines.solvers import UNetStepAxis
from ..presets import WMA_PRESETS, dtype_name
from ..profiling import label_table, profile, stage_table
from ..profiling.sections import SectionTimer
from ..train.objectives import WMAObjective
from ..world.env import ACTION_DIM, STATE_DIM, strided_actions
from ..world.eval import Case
from .base import DecoderStep, E2ESize, EndToEnd, GraphTarget, Labels, Layout, Metric, Probe, Workload

# The seed's upstream profile (11 iterations, 22 samplings, DDIM 50, CFG 1.0, fp32 eager; GPU not named)
SEED_PROFILE = {"iteration_s": 76.07, "step_s": 0.712, "sampling_share": 0.93, "decode_s_per_pass": 0.566,
                "conditioning_s_per_pass": 0.133, "save_s": 3.52, "peak_gib": 17890.5 / 1024, "ddim_steps": 50}


def _ddim_steps(v, ctx):
    steps = integer(0)(v, ctx) or ctx["preset"].default_steps
    check_run_params(ctx["preset"], steps)  # the same check as the pipeline's
    return steps


class WMAWorkload(Workload):
    name = "wma"
    title = "video UNet + DDIM (UnifoLM-WMA)"
    presets = {k: v for k, v in WMA_PRESETS.items()}
    real_preset = "wma"
    tiny_preset = "tiny-wma"
    features = frozenset({"denoiser", "world", "unet", "ddim", "frame_decoder", "independent_frames", "decision_pass"})
    # notebook 04's goal: at least 2x per DDIM step over fp32 eager; notebook 06's: the whole iteration 2x faster than
    # notebook 04's best stack
    goals = {"ddim_step_speedup": 2.0, "run_speedup": 2.0}
    eager_dtype = "fp32"  # upstream samples the UNet in fp32 (the seed's profile)
    published_title = ("video UNet + DDIM (wma)** — 50 DDIM steps per pass, two passes per iteration, CFG 1.0, "
                       "VAE fp32")
    published_columns = (("s / iteration", "iteration_s", "{:.3g}", True),
                         ("ms / DDIM step", "ddim_step_ms", "{:.1f}", True),
                         ("UNet forward ms", "unet_forward_ms", "{:.1f}", True),
                         ("x floor", "unet_forward_over_floor", "{:.1f}", False),
                         ("VAE share", "vae_decode_share", "{:.1%}", False),
                         ("peak GiB", "peak_memory_gib", "{:.1f}", False))
    forward_name = "UNet forward"
    metric = Metric("ddim_step_ms", "ms", False, "ms per DDIM step")
    # an interaction iteration (notebook 01's iteration_s, notebook 05/06's run_s, notebook 03's points) first; the
    # ladder of notebook 04 times DDIM steps only
    summary_metrics = (Metric("iteration_s", "s", False, "s / iteration", aliases=("run_s",)), metric)
    labels = Labels(region=ITERATION_LABEL, forward=WMA_FORWARD_LABEL, fine=tuple(WMA_FINE_LABELS))
    params = (Param("ddim_steps", 0, _ddim_steps, "DDIM steps per pass; 0: the preset's default (50)"),
              Param("guidance_scale", 1.0, number(1.0), "classifier-free guidance scale; above 1 doubles the "
                                                         "UNet forwards"))
    # the UNet compiles whole: regionally its ~20 distinct blocks cost more host time per forward than they save
    # (H100: 128 ms regional vs 89 ms whole, same kernels within 10%), and it has no per-block Python ints
    overview_panels = (("plot_time_split", 1.2), ("plot_step_times", 1.0))  # notebook 01's overview figure
    compile_scope = "whole"
    # each configuration is a cold compile of the whole UNet's graphs, minutes each (H200: 185 s for notebook 04's
    # stack, most of it inductor's single-threaded lowering and code generation), so the table keeps what speaks to
    # this scope: whole against regional after hygiene. The reference code differs from it only in a norm's input
    # dtype (nothing that recompiles), and regional dynamic=True lost on both devices it ran on (H200: cold 342 s,
    # 97.6 ms a forward against whole's 197 s, 67.7 ms; their rows stay in the store); `compile_table` asks for them
    compile_table = ("hygiene", "whole")

    def default_vae_dtype(self, dtype: torch.dtype) -> torch.dtype:
        # upstream decodes in fp32 (a bf16 VAE cost one competitor 12 dB PSNR)
        return torch.float32

    # --- building --------------------------------------------------------------------------------------
    def new_pipeline(self, preset, device, dtype, vae_dtype, seed: int = 0) -> WMAInteractionPipeline:
        return WMAInteractionPipeline(preset, device=device, dtype=dtype, vae_dtype=vae_dtype, seed=seed)

    def world_case(self, pipe, episode_for, seed: int, start, num_blocks, sample_seed: int):
        """With s the preset's frame_stride (1 unless a world preset sets it): observation: frames (and states)
        start - (n_obs - 1) s .. start, s apart (default start (n_obs + 6) s: the agent already moves); the
        world-model pass gets the true actions of the T steps from start (each the mean over the s rendered frames it
        spans; the decision pass still runs, as in the reference iteration); target: frames start + s .. start + T s,
        s apart."""
        p, dev = pipe.preset, pipe.device
        if num_blocks is not None:
            raise ValueError("num_blocks is an mg2 option; the wma workload predicts the preset's `frames` frames")
        if (p.agent_state_dim, p.agent_action_dim) != (STATE_DIM, ACTION_DIM):
            raise ValueError(f"preset {p.name!r} has state/action dims {p.agent_state_dim}/{p.agent_action_dim}; the "
                             f"world's are {(STATE_DIM, ACTION_DIM)}")
        n_obs, t, s = p.n_obs_steps, p.frames, p.frame_stride
        start = (n_obs + 6) * s if start is None else start
        if isinstance(start, bool) or not isinstance(start, int) or start < (n_obs - 1) * s:
            raise ValueError(f"start={start!r} is not allowed; allowed values: an integer >= {(n_obs - 1) * s}")
        ep = episode_for(start + t * s + 1)
        obs = slice(start - (n_obs - 1) * s, start + 1, s)
        images = torch.from_numpy(ep.frames[obs]).permute(3, 0, 1, 2).float() / 127.5 - 1  # [3, n_obs, H, W]
        inputs = WMAInputs(seed=sample_seed, observation_images=images[None].to(dev),
                           observation_states=torch.from_numpy(ep.state[obs])[None].to(dev),
                           actions=torch.zeros(1, p.horizon, p.agent_action_dim, device=dev),
                           instruction=DEFAULT_INSTRUCTION)
        acts = torch.from_numpy(strided_actions(ep.action, start, t, s))[None].to(dev)
        tgt = slice(start + s, start + t * s + 1, s)
        return Case(workload=self.name, seed=int(seed), start=start, inputs=inputs, target=ep.frames[tgt],
                    target_xy=ep.agent_xy[tgt], target_visible=ep.agent_visible[tgt], last=ep.frames[start],
                    world_actions=acts)

    def world_predict(self, pipe, case, **sampling):
        given = {"ddim_steps", "decision_steps", "world_steps"} & sampling.keys()
        if not given and getattr(pipe.preset, "sample_steps", 0):
            sampling["ddim_steps"] = pipe.preset.sample_steps  # the count the shipped weights are scored at
        out = pipe.run_iteration(case.inputs, world_actions=case.world_actions, progress=False, **sampling)
        return to_uint8_video(out.world.frames), out

    def training_objective(self, pipe, bank, **options):
        return WMAObjective(pipe, bank, **options)

    def build(self, cfg) -> tuple[WMAInteractionPipeline, WMAInputs]:
        pipe = self.pipeline(cfg.preset, cfg.device, cfg.dtype, cfg.vae_dtype, cfg.seed)
        return pipe, pipe.prepare(seed=cfg.seed)

    def _iteration_kw(self, cfg) -> dict:
        return dict(ddim_steps=cfg.options.ddim_steps, guidance_scale=cfg.options.guidance_scale, progress=False)

    def run_callable(self, pipe, inputs: WMAInputs, cfg):
        """One labelled interaction iteration with its results saved under output_dir, as a 0-arg callable."""
        return lambda: pipe.run_iteration(inputs, save_dir=cfg.output_dir / "iteration", **self._iteration_kw(cfg))

    def generate_callable(self, pipe, inputs: WMAInputs, cfg):
        """One interaction iteration without saving (both passes, both decodes), as a 0-arg callable."""
        return lambda: pipe.run_iteration(inputs, **self._iteration_kw(cfg))

    # --- the parts variants act on -----------------------------------------------------------------------
    def compile_target(self, pipe) -> torch.nn.Module:
        return pipe.model.diffusion_model  # the UNet with its heads (what one forward runs)

    def compile_regions(self, pipe) -> list[torch.nn.Module]:
        unet = pipe.model.diffusion_model
        return [m for blocks in (unet.input_blocks, [unet.middle_block], unet.output_blocks) for m in blocks]

    def graph_targets(self, pipe) -> list[GraphTarget]:
        """One DDIM step as two graphs, each replayed for every step of both passes (every input a tensor, the same
        shapes for all 2 x steps of an iteration): the UNet forward with both heads, and the DDIM update of video,
        actions and states (`pipe.update_step`, switched on here with `pipe.device_update`: the step's coefficients
        are rows of per-pass device tables, copied into the graph's inputs, not host floats). The noise of a step
        is drawn eagerly between the two (the same draw as the eager update's), and so is classifier-free
        guidance when on. The multistep solvers ('dpmsolver++', 'unipc') keep their eager update."""
        pipe.device_update = True
        unet = pipe.model.diffusion_model

        def heads_run(args, kwargs):  # skip-unused-heads: a pass without one head is a graph of its own
            return getattr(unet.action_unet, "skip", False), getattr(unet.state_unet, "skip", False)

        return [GraphTarget(pipe.model, "forward", "UNet + action/state heads forward", key_fn=heads_run),
                GraphTarget(pipe, "update_step", "DDIM update (video + action/state heads)")]

    def decoder_ladder(self, device) -> list[str]:
        """On a GPU: the SD VAE's decoder in bf16 (upstream decodes in fp32, and a bf16 VAE cost a competitor 12 dB:
        the row's frames are gated against the fp32 reference like every row's; the encoder, whose latent conditions
        the UNet, has a row of its own among the graph rows: vae-encoder-bf16), a pass's frames as one batch, each
        upsampling and its convolution folded into one transposed convolution, its GroupNorm + SiLU pairs as our
        Triton kernel with the bias of the convolution before each added inside it (vae-triton-fused,
        vae-norm-conv-bias: 52.8 -> 48.1 ms a 16-frame decode on the H200, NOTES.md), its single-head attention as
        GEMMs (vae-attn-gemm: the world-model pass's decode 44.4 -> 43.7 ms on the H200), then the step compiled and
        captured. At few DDIM steps the world-model pass's decode is a large share of an iteration."""
        return (["vae-decoder-bf16", "vae-batch-frames", "vae-upsample-fold", "vae-triton-fused", "vae-norm-conv-bias",
                 "vae-attn-gemm", "vae-compile", "vae-cuda-graphs"] if device.type == "cuda" else [])

    def decoder_step(self, pipe) -> DecoderStep:
        """The SD VAE decode of one frame (no state across frames: every call compiles and captures alike)."""
        return DecoderStep(pipe, "decode_step")

    decoder_unit = "frame"

    def decoder_bench(self, ref):
        """The SD VAE (deep-copied) with the pipeline's per-frame decode step bound to it: what vae-bf16, vae-compile
        and vae-cuda-graphs swap."""
        bench = types.SimpleNamespace(vae=copy.deepcopy(ref.vae), vae_dtype=ref.vae_dtype, preset=ref.preset,
                                      device=ref.device)
        bench.decode_step = types.MethodType(type(ref).decode_step, bench)
        return bench

    def decoder_stream(self, bench):
        return FrameStream(bench)

    def decoder_block(self, pipe) -> tuple[int, int]:
        return 1, 1  # the SD VAE decodes frame by frame (upstream's perframe_ae)

    @torch.no_grad()
    def decoder_latents(self, pipe, seed: int, size: E2ESize) -> torch.Tensor:
        """The world-model pass's latents after 2 DDIM steps: a decoder's speed and its agreement with the fp32 one
        do not depend on how far the latents were denoised (random weights either way), and 50 fp32 steps would
        cost half a minute."""
        return pipe.run_iteration(pipe.prepare(seed=seed), ddim_steps=2, progress=False,
                                  decode_decision=False).world.latents

    def decoder_flops(self, preset) -> dict:
        f = sd_decoder_flop_parts(preset)
        return {"first_block": f["total"], "steady_block": f["total"], "steady_block_conv": f["convolution"]}

    def conv_layouts(self, pipe) -> list[Layout]:
        unet = pipe.model.diffusion_model
        # the 2-D convolutions (the temporal Conv3ds stay as they are); NHWC activations from the first conv on
        return [Layout(unet, torch.channels_last), Layout(unet.input_blocks[0], torch.channels_last, inputs=True),
                Layout(pipe.vae, torch.channels_last)]

    # --- measuring -------------------------------------------------------------------------------------
    def kernel_cases(self, preset) -> list:
        """The video UNet's GroupNorm + SiLU (+ time embedding) and temporal self-attention at its top level; the SD VAE
        decoder's GroupNorm + SiLU."""
        from ..kernels.cases import sd_decoder_cases, unet_cases  # noqa: PLC0415  late: registers the Triton kernel ops

        return (unet_cases(preset.model_channels, preset.latent_hw, preset.frames, preset.norm_groups,
                           head_channels=preset.num_head_channels)
                + sd_decoder_cases(preset.height, preset.width, preset.vae_block_out_channels[0],
                                   preset.vae_norm_groups, frames=preset.frames))

    def forward_flops(self, preset) -> dict[str, float]:
        return unet_forward_flops(preset)

    @torch.no_grad()
    def forward_probe(self, pipe, seed: int = 0) -> Probe:
        """One UNet forward with both heads at t = T/2 on seeded latents, decision-pass context."""
        p = pipe.preset
        inp = pipe.prepare(seed=seed)
        cond = pipe.condition(inp, torch.Generator(pipe.device).manual_seed(seed + 1), guidance=False)
        g = torch.Generator("cpu").manual_seed(seed + 2)
        x = torch.randn((1, *p.latent_shape), generator=g).to(pipe.device)
        act = torch.randn((1, p.horizon, p.agent_action_dim), generator=g).to(pipe.device)
        st = torch.randn((1, p.horizon, p.agent_state_dim), generator=g).to(pipe.device)
        obs_i = inp.observation_images.to(pipe.dtype)
        obs_s = inp.observation_states.to(pipe.dtype)
        fs = torch.full((1,), p.default_fs, dtype=torch.long, device=pipe.device)
        t = p.num_train_timesteps // 2

        @torch.no_grad()
        def forward():
            return pipe.denoise(x, act, st, t, cond, cond.decision_context, obs_i, obs_s, fs)

        return Probe(forward, self.forward_flops(p)["total"], f"UNet forward with both heads at t={t}")

    @torch.no_grad()
    def end_to_end(self, pipe, seed: int = 0, size: E2ESize = E2ESize()) -> EndToEnd:
        out = pipe.run_iteration(pipe.prepare(seed=seed), ddim_steps=size.ddim_steps, progress=False)
        steps = out.decision.step_ms + out.world.step_ms
        return EndToEnd(frames=out.world.frames, latents=out.world.latents, metric=self.metric,
                        value=float(np.median(steps)), run_s=out.iteration_ms / 1e3)

    def graph_warmup_size(self, size: E2ESize) -> E2ESize:
        """Two DDIM steps a pass: every step of an iteration runs the same shapes and graphs (graph_targets), so a
        short iteration captures the conditioning's and the decode's graphs, called once an iteration, as a long one
        would (at 50 steps a pass it takes seconds)."""
        return E2ESize(blocks=size.blocks, ddim_steps=min(size.ddim_steps, 2))

    @torch.no_grad()
    def decode(self, pipe, latents: torch.Tensor) -> torch.Tensor:
        return pipe.decode(latents)

    def step_axis(self):
        return UNetStepAxis()

    def e2e_description(self, size: E2ESize) -> str:
        return f"iteration of {size.ddim_steps} DDIM steps per pass"

    def default_ladder(self, device, attention: str | None) -> list[str]:
        """[cuDNN benchmark ->] tf32 -> bf16 -> the hygiene variants -> channels-last -> temporal-channels-last
        [-> attention backend]. The search comes first, so every row's convolutions after the fp32 reference's are
        searched (the `cudnn-benchmark` variant says why)."""
        steps = ["tf32", "bf16", "hygiene", "channels-last", "temporal-channels-last"]
        if device.type == "cuda":
            steps.insert(0, "cudnn-benchmark")
        return steps + ([attention] if attention else [])

    # --- notebook 01 -------------------------------------------------------------------------------------
    def model_table(self, pipe, inputs: WMAInputs, cfg) -> pd.DataFrame:
        """Sizes and shapes of the built pipeline."""
        p, dm = pipe.preset, pipe.model.diffusion_model
        numel = lambda m: sum(t.numel() for t in m.parameters())  # noqa: E731
        heads = numel(dm.action_unet) + numel(dm.state_unet)
        cond = (numel(pipe.clip) + numel(pipe.text) + numel(pipe.model.image_proj_model)
                + numel(pipe.model.state_projector) + numel(pipe.model.action_projector))
        rows = {
            "video UNet parameters (M)": (numel(dm) - heads) / 1e6,
            "action + state head parameters (M)": heads / 1e6,
            "conditioning parameters (M): CLIP, text, resampler, projectors": cond / 1e6,
            "VAE decoder parameters (M)": (numel(pipe.vae.decoder) + numel(pipe.vae.post_quant_conv)) / 1e6,
            "frames x height x width": f"{p.frames} x {p.height} x {p.width}",
            "latent shape [C, T, h, w]": str(list(p.latent_shape)),
            "context tokens per frame (state+action+text+image)":
                p.n_obs_steps + p.horizon * p.num_stem_token + p.text_len + p.resampler_queries,
            "DDIM steps per pass": cfg.options.ddim_steps,
            "UNet forwards per step": 2 if cfg.options.guidance_scale != 1.0 else 1,
            "UNet forward TFLOP (one branch)": self.forward_flops(p)["total"] / 1e12,
            "n_obs_steps": p.n_obs_steps,
            "eta / guidance rescale": f"{p.ddim_eta} / {p.guidance_rescale}",
        }
        return pd.DataFrame({"value": rows}).rename_axis("quantity")

    def benchmark(self, pipe, inputs: WMAInputs, cfg, ceilings: dict) -> "WMABaselineResult":
        """Eager baseline: `warmup` untimed iterations, `repeats` timed ones (device events), then one more with a
        SectionTimer attached for the nested section table (kept out of the timed runs)."""
        kw = self._iteration_kw(cfg)
        for _ in tqdm(range(cfg.warmup), desc="warm-up", leave=False):
            pipe.run_iteration(inputs, **kw)
        runs = [pipe.run_iteration(inputs, **kw) for _ in tqdm(range(cfg.repeats), desc="timed iterations",
                                                                leave=False)]
        require_finite(runs[-1].reference(), f"the eager pipeline ({pipe.preset.name})")
        timer = SectionTimer(pipe.device)
        with timer.attached():
            pipe.run_iteration(inputs, **kw)
        return WMABaselineResult(runs=runs, preset=pipe.preset, ceilings=ceilings, sections=timer.table())

    # the DDIM sampling label of each pass, by the pass's stage label (wmbook.pipelines.ddim's hierarchy)
    SAMPLING_LABELS = {"2_Decision_Pass": "2.1_DDIM_Sampling", "3_World_Model_Pass": "3.1_DDIM_Sampling"}

    def profile_stages(self, pipe, inputs: WMAInputs, cfg, trace_steps: int = 3):
        """Stage table of one iteration by label device time (README: a label's device time), from a torch.profiler
        trace of a short iteration (`trace_steps` DDIM steps per pass, results saved): every DDIM step runs the same
        kernels, so each pass's sampling label is scaled to the configured step count (a 50-step trace would hold
        ~10^6 events). Also the full iteration's nested section table from device events (elapsed stream time,
        idle included: the seed's table). Returns (stage table, trace path, section table)."""
        timer = SectionTimer(pipe.device)
        with timer.attached():
            self.run_callable(pipe, inputs, cfg)()
        sec = timer.table()
        steps = cfg.options.ddim_steps
        k = min(trace_steps, steps)
        kw = self._iteration_kw(cfg) | {"ddim_steps": k}
        prof = profile(lambda: pipe.run_iteration(inputs, save_dir=cfg.output_dir / "iteration", **kw), wait=0,
                       warmup=1, active=1, out_dir=cfg.output_dir, name=f"01_baseline_trace_{k}steps")
        labels = label_table(prof.trace_path)
        stages = stage_table(labels).set_index("label")
        if k < steps:
            per_label = labels.set_index("label")
            for stage, sampling in self.SAMPLING_LABELS.items():
                if stage in stages.index and sampling in per_label.index:
                    extra = per_label.loc[sampling, ["cpu_total_ms", "gpu_total_ms"]].astype(float) * (steps / k - 1)
                    stages.loc[stage, "cpu_ms"] += extra["cpu_total_ms"]
                    stages.loc[stage, "gpu_ms"] += extra["gpu_total_ms"]
                    stages.loc[stage, "ms"] += extra["gpu_total_ms" if stages.loc[stage, "source"] == "gpu"
                                                     else "cpu_total_ms"]
            stages["source"] = stages["source"] + f" ({k}-step trace, DDIM sampling x{steps / k:g})"
            stages["share"] = stages["ms"] / stages["ms"].sum()
        return stages, prof.trace_path, sec

    def session_run(self, pipe, inputs: WMAInputs, cfg, session) -> None:
        """One labelled interaction iteration inside a ProfilingSession (no blocks: FPS does not apply; the
        iteration's own device-event timings go into the session metrics)."""
        out = self.run_callable(pipe, inputs, cfg)()
        steps = out.decision.step_ms + out.world.step_ms
        session.set_metrics(workload=self.name, preset=cfg.preset.name, dtype=dtype_name(cfg.dtype),
                            ddim_steps=cfg.options.ddim_steps, guidance_scale=cfg.options.guidance_scale,
                            iteration_s=out.iteration_ms / 1e3, ddim_step_ms_median=float(np.median(steps)),
                            unet_forwards=out.unet_forwards)

    def interpret_baseline(self, cfg, res: "WMABaselineResult") -> list[str]:
        """Sentences computed from the measured numbers, with the seed's upstream profile beside them."""
        s = res.summary()
        p = cfg.preset
        steps = cfg.options.ddim_steps
        dev = res.ceilings.get("device_name", str(cfg.device))
        it = s["iteration_s"]
        n_fwd = res.runs[0].unet_forwards
        lines = [
            f"On {dev}, `{p.name}` ({dtype_name(cfg.dtype)} model, {dtype_name(cfg.vae_dtype)} VAE) runs one "
            f"interaction iteration (2 passes x {steps} DDIM steps = {n_fwd} UNet forwards, "
            f"{2 * p.frames} frames decoded) in {it.median:.3g} s (p20 {it.p20:.3g}, p80 {it.p80:.3g}).",
            f"A DDIM step takes {s['ddim_step_ms'].median:.3g} ms; one UNet forward takes "
            f"{s['unet_forward_ms'].median:.3g} ms, {s['unet_forward_over_floor']:.1f}x its FLOP floor of "
            f"{s['unet_floor_ms']:.3g} ms ({s['unet_forward_tflop']:.3g} TFLOP at the measured "
            f"{res.ceilings.get('gemm_tflops', float('nan')):.3g} TFLOP/s GEMM ceiling), so it achieves "
            f"{s['achieved_tflops']:.3g} TFLOP/s; the three scheduler updates add {s['ddim_update_ms']:.3g} ms per "
            f"step.",
            f"DDIM sampling holds {s['sampling_share']:.0%} of the iteration, VAE decoding "
            f"{s['vae_decode_share']:.0%} ({s['vae_decode_ms_per_frame']:.3g} ms per frame), conditioning "
            f"{s['conditioning_share']:.0%} and saving {s['save_share']:.0%}.",
        ]
        seed = SEED_PROFILE
        line = (f"The original project's published profile of this model (fp32 eager, DDIM {seed['ddim_steps']}, GPU "
                f"not named) reported {seed['iteration_s']:.0f} s per iteration, {seed['step_s']:.2f} s per step and "
                f"{seed['sampling_share']:.0%} in sampling; we measure {it.median:.3g} s, "
                f"{s['ddim_step_ms'].median / 1e3:.3g} s per step and {s['sampling_share']:.0%} in sampling")
        if steps != seed["ddim_steps"]:
            line += f", with {steps} steps per pass instead of {seed['ddim_steps']}"
        if not p.tiny:
            ratio = it.median / seed["iteration_s"]
            line += (f" ({1 / ratio:.1f}x faster per iteration)" if ratio < 1
                     else f" ({ratio:.1f}x slower per iteration)")
        lines.append(line + ".")
        if not math.isnan(s["peak_memory_gib"]):
            lines.append(f"Peak device memory is {s['peak_memory_gib']:.1f} GiB (seed: {seed['peak_gib']:.1f} GiB).")
        floor_it = n_fwd * s["unet_floor_ms"] / 1e3
        lines.append(f"At the FLOP floor the {n_fwd} forwards would take {floor_it:.3g} s, "
                     f"{floor_it / it.median:.1%} of today's iteration.")
        return lines


def _med(xs) -> float:
    return float(np.median(xs)) if len(xs) else float("nan")


@dataclass
class WMABaselineResult:
    """Timed eager interaction iterations of notebook 01 and the tables and figures built from them."""

    runs: list[WMAOutput]
    preset: object
    ceilings: dict
    sections: pd.DataFrame | None = None
    extra: dict = field(default_factory=dict)
    units = {"iteration_s": "s", "ddim_step_ms": "ms", "unet_forward_ms": "ms", "ddim_update_ms": "ms",
             "unet_forward_tflop": "TFLOP", "unet_floor_ms": "ms", "unet_forward_over_floor": "x",
             "achieved_tflops": "TFLOP/s", "unet_forwards_per_iteration": "count", "sampling_share": "fraction",
             "vae_decode_share": "fraction", "vae_decode_ms_per_frame": "ms", "conditioning_share": "fraction",
             "save_share": "fraction", "peak_memory_gib": "GiB"}

    def run_table(self) -> pd.DataFrame:
        """One row per timed iteration (device events)."""
        rows = []
        for i, r in enumerate(self.runs):
            rows.append({"run": i, "iteration_s": r.iteration_ms / 1e3, "conditioning_ms": r.conditioning_ms,
                         "decision_sampling_ms": r.decision.sampling_ms, "decision_decode_ms": r.decision.decode_ms,
                         "world_sampling_ms": r.world.sampling_ms, "world_decode_ms": r.world.decode_ms,
                         "save_ms": r.save_ms,
                         "peak_memory_gib": r.peak_memory_bytes / 2**30 if r.peak_memory_bytes else np.nan})
        return pd.DataFrame(rows).set_index("run")

    def phase_table(self) -> pd.DataFrame:
        """Median ms per phase of the iteration and its share; 'other' = labels between phases, host gaps."""
        rt = self.run_table()
        ph = {"conditioning": rt["conditioning_ms"], "decision sampling": rt["decision_sampling_ms"],
              "decision decode": rt["decision_decode_ms"], "world-model sampling": rt["world_sampling_ms"],
              "world-model decode": rt["world_decode_ms"], "save": rt["save_ms"]}
        it = rt["iteration_s"] * 1e3
        ph["other"] = it - sum(ph.values())
        df = pd.DataFrame({"ms": {k: float(v.median()) for k, v in ph.items()}})
        df["share"] = df["ms"] / float(it.median())
        return df.rename_axis("phase")

    def step_table(self) -> pd.DataFrame:
        """Per pass and DDIM step (median over runs): step, UNet forward(s), scheduler update."""
        r0 = self.runs[0]
        rows = []
        for name, get in (("decision", lambda r: r.decision), ("world_model", lambda r: r.world)):
            for j, t in enumerate(r0.timesteps):
                rows.append({"pass": name, "step": j, "t": t,
                             "step_ms": _med([get(r).step_ms[j] for r in self.runs]),
                             "forward_ms": _med([get(r).forward_ms[j] for r in self.runs]),
                             "update_ms": _med([get(r).update_ms[j] for r in self.runs])})
        return pd.DataFrame(rows)

    def summary(self) -> dict:
        r0 = self.runs[0]
        fpp = r0.forwards_per_step
        passes = [x for r in self.runs for x in (r.decision, r.world)]
        step = Samples([ms for ps in passes for ms in ps.step_ms], "ms")
        fwd = Samples([ms / fpp for ps in passes for ms in ps.forward_ms], "ms")
        it_ms = [r.iteration_ms for r in self.runs]
        flops = unet_forward_flops(self.preset)["total"]
        fl_ms = floor_ms(flops, self.ceilings)
        total = float(np.sum(it_ms))
        decoded = [ps for ps in passes if ps.frames is not None]
        frames_decoded = sum(ps.frames.shape[2] for ps in decoded)
        peaks = [r.peak_memory_bytes for r in self.runs if r.peak_memory_bytes]
        return {
            "iteration_s": Samples([ms / 1e3 for ms in it_ms], "s"),
            "ddim_step_ms": step,
            "unet_forward_ms": fwd,
            "ddim_update_ms": _med([ms for ps in passes for ms in ps.update_ms]),
            "unet_forward_tflop": flops / 1e12,
            "unet_floor_ms": fl_ms,
            "unet_forward_over_floor": fwd.median / fl_ms,
            "achieved_tflops": flops / (fwd.median * 1e-3) / 1e12,
            "unet_forwards_per_iteration": float(r0.unet_forwards),
            "sampling_share": sum(ps.sampling_ms for ps in passes) / total,
            "vae_decode_share": sum(ps.decode_ms for ps in passes) / total,
            "vae_decode_ms_per_frame": sum(ps.decode_ms for ps in decoded) / max(frames_decoded, 1),
            "conditioning_share": sum(r.conditioning_ms for r in self.runs) / total,
            "save_share": sum(r.save_ms for r in self.runs) / total,
            "peak_memory_gib": max(peaks) / 2**30 if peaks else float("nan"),
        }

    def detail_tables(self) -> dict[str, pd.DataFrame]:
        """The workload's detail tables for notebook 01, by title."""
        out = {"Per phase of the iteration (median over runs)": self.phase_table(),
               "Per pass and DDIM step, ms (median over runs)":
                   self.step_table().pivot(index="step", columns="pass", values="step_ms")}
        if self.sections is not None:
            out["Nested section table of one iteration (count, total, mean, self vs total; device events)"] = \
                self.sections[["path", "count", "total_ms", "mean_ms", "self_ms", "share_of_parent"]]
        return out

    def plot_time_split(self, ax=None):
        """One stacked bar: where an iteration's time goes (median over runs)."""
        import matplotlib.pyplot as plt  # noqa: PLC0415  heavy: matplotlib.pyplot

        pt = self.phase_table()
        if ax is None:
            _, ax = plt.subplots(figsize=(8, 2.2))
        colors = ["#228833", "#4477aa", "#aa3377", "#66ccee", "#ee6677", "#ccbb44", "#bbbbbb"]
        left = 0.0
        for (name, row), c in zip(pt.iterrows(), colors):
            ms = max(float(row["ms"]), 0.0)
            ax.barh(0, ms, left=left, color=c, label=f"{name} ({row['share']:.0%})")
            left += ms
        ax.set_yticks([])
        ax.set_xlabel("ms per interaction iteration")
        ax.set_title("Time split of one iteration (median over runs)")
        ax.legend(fontsize=7, ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.45))
        return ax

    def plot_step_times(self, ax=None):
        """ms per DDIM step in each pass (median over runs), with the UNet forward(s)' FLOP floor."""
        import matplotlib.pyplot as plt  # noqa: PLC0415  heavy: matplotlib.pyplot

        st = self.step_table()
        if ax is None:
            _, ax = plt.subplots(figsize=(7, 3))
        for name, g in st.groupby("pass", sort=False):
            ax.plot(g["step"], g["step_ms"], marker=".", label=f"{name}: step")
            ax.plot(g["step"], g["forward_ms"], ls="--", lw=1, label=f"{name}: UNet forward(s)")
        ax.axhline(self.summary()["unet_floor_ms"] * self.runs[0].forwards_per_step, color="k", lw=1, ls=":",
                   label="FLOP floor")
        ax.set_xlabel("DDIM step")
        ax.set_ylabel("ms")
        ax.set_title("DDIM step times")
        ax.legend(fontsize=7)
        return ax


class FrameStream:
    """A per-frame decoder seen as a stream, for the decoder table: no state across frames (reset does nothing);
    decode_block decodes each latent frame with the bench's decode_step (what the decoder variants swapped in)."""

    def __init__(self, owner):
        self.owner = owner

    def reset(self) -> None:
        pass

    def decode_block(self, latents: torch.Tensor) -> torch.Tensor:
        """[B, C, F, h, w] -> [B, 3, F, H, W]."""
        return torch.stack([self.owner.decode_step(latents[:, :, k].contiguous())  # the pipeline's layout per frame
                            for k in range(latents.shape[2])], dim=2)
