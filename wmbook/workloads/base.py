"""The Workload interface and the value types workloads hand to the notebooks (wmbook.workloads explains)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from ..models.decoder_step import DecoderStep  # noqa: F401  (part of the workloads' face)
from ..params import Param, ParameterError
from ..world.weights import build_world_pipeline, is_world_preset, weights_path


@dataclass(frozen=True)
class Metric:
    """The end-to-end speed metric of a workload: e.g. FPS (higher is better) or ms per DDIM step (lower)."""

    name: str
    unit: str
    higher_is_better: bool
    label: str  # how a sentence names it: "FPS", "ms per DDIM step"
    aliases: tuple[str, ...] = ()  # other stored metric names of the same quantity (a UNet run_s is an iteration)

    @property
    def names(self) -> tuple[str, ...]:
        return (self.name, *self.aliases)

    def speedup(self, value: float, base: float) -> float:
        """How many times better `value` is than `base`."""
        return value / base if self.higher_is_better else base / value


@dataclass(frozen=True)
class Labels:
    """The labels a workload's traces carry (wmbook.profiling.label)."""

    region: str  # the labelled range whose device time the breakdown splits
    forward: str  # one denoiser forward
    fine: tuple[str, ...]  # fine labels splitting one forward
    unit: str = ""  # regex fully matching the label of one repeated unit of a run (a streaming block); "": none
    unit_skip: int = 1  # leading units that are not steady (the first block's other shapes)


@dataclass
class Probe:
    """A steady-state denoiser forward (0-arg callable returning what the gate compares) and its FLOPs."""

    forward: Callable[[], Any]
    flops: float
    description: str


@dataclass(frozen=True)
class E2ESize:
    """How long a short end-to-end run is: generated blocks (causal DiT) or DDIM steps per pass (UNet)."""

    blocks: int = 3
    ddim_steps: int = 5


@dataclass(frozen=True)
class Layout:
    """A module whose convolution weights the channels-last variant converts, and whether its input activation is
    converted too (a forward pre-hook; the layout then carries through the convolutions that follow)."""

    module: torch.nn.Module
    memory_format: torch.memory_format
    inputs: bool = False


@dataclass(frozen=True)
class GraphTarget:
    """A callable the cuda-graphs variant captures: `getattr(owner, attr)`, replaced by a GraphedCallable.
    key_fn(args, kwargs): what else its kernels' addresses depend on (e.g. the KV caches' write slots)."""

    owner: Any
    attr: str
    name: str
    key_fn: Callable | None = None


@dataclass
class EndToEnd:
    """A short real run: its decoded frames and latents (for PSNR) and the workload's metric value."""

    frames: torch.Tensor | None
    latents: torch.Tensor
    metric: Metric
    value: float
    first_frame_ms: float = float("nan")  # start of the run to its first decoded frame (streaming workloads)
    run_s: float = float("nan")  # the whole run, device-event timed (an interaction iteration for the UNet)


class Workload:
    """The interface every workload implements (see the module docstring); one instance per workload."""

    name: str = ""
    title: str = ""
    presets: dict = {}
    real_preset: str = ""
    tiny_preset: str = ""
    features: frozenset[str] = frozenset()  # what variants may require: "kv_cache", "action_modules", ...
    forward_name: str = "forward"  # "DiT forward" | "UNet forward"
    metric: Metric
    labels: Labels
    params: tuple[Param, ...] = ()  # the workload's own run parameters (num_blocks, ddim_steps, ...)
    goals: dict = {}  # notebook targets: forward_x_floor, regional_cold_s, ddim_step_speedup, fps, run_speedup
    eager_dtype: str = "bf16"  # the precision upstream runs the model eagerly: the reports' eager baseline

    @property
    def summary_metrics(self) -> tuple[Metric, ...]:
        """The metrics a report's workload summary compares stages in, in order of preference (a stage shows the first
        one its run stored, against the eager run's value of the same one)."""
        return (self.metric,)
    # the README's published notebook-01 table: its title and (header, metric, format, with spread) columns
    published_title: str = ""
    published_columns: tuple[tuple[str, str, str, bool], ...] = ()

    def __repr__(self) -> str:
        return f"<Workload {self.name}: {self.title}>"

    def owns_preset(self, preset) -> bool:
        """True when `preset` (a preset object) is one of this workload's: one of its named presets, or a variation
        of one (`preset.with_(...)`, a smaller test preset: the same preset class)."""
        return any(type(preset) is type(p) for p in self.presets.values())

    # --- configuration ---------------------------------------------------------------------------------
    def default_vae_dtype(self, dtype: torch.dtype) -> torch.dtype:
        """vae_dtype 'auto'."""
        return dtype

    def check_config(self, cfg) -> None:
        """Cross checks of a validated RunConfig (ParameterError naming the parameter): here, that a trained world
        preset's weights exist before any notebook builds it."""
        if is_world_preset(cfg.preset) and not weights_path(cfg.preset).exists():
            raise ParameterError(f"preset={cfg.preset.name!r} is a trained world model and its weights "
                                 f"{str(weights_path(cfg.preset))!r} are not there; train them first with `python -m "
                                 f"wmbook.train --workload {self.name} --minutes M --ship` (they ship when they beat "
                                 f"copy-last) or pick another preset")

    # --- building --------------------------------------------------------------------------------------
    def pipeline(self, preset, device: torch.device, dtype: torch.dtype, vae_dtype: torch.dtype, seed: int = 0):
        """The reference pipeline at `preset`; a trained world preset's comes with its shipped weights, loaded strictly
        (wmbook.world.weights; `seed` then seeds sampling only)."""
        if is_world_preset(preset):
            return build_world_pipeline(self, preset, device=device, dtype=dtype, vae_dtype=vae_dtype)
        return self.new_pipeline(preset, device, dtype, vae_dtype, seed)

    def new_pipeline(self, preset, device, dtype, vae_dtype, seed: int = 0):
        """A freshly built pipeline of this workload (random weights): what `pipeline` and the world models build on."""
        raise NotImplementedError(f"workload {self.name!r} builds no denoising pipeline")

    # --- the trained world models (wmbook.world: workloads with the `world` feature) ----------------------
    def world_case(self, pipe, episode_for, seed: int, start, num_blocks, sample_seed: int):
        """The pipeline inputs and ground truth of a held-out episode: a wmbook.world.eval.Case. episode_for(n) renders
        the held-out episode's first n frames."""
        raise NotImplementedError(f"workload {self.name!r} has no world model")

    def world_predict(self, pipe, case, **sampling):
        """(uint8 [T, H, W, 3] frames aligned with case.target, the pipeline's output): one run on a Case."""
        raise NotImplementedError(f"workload {self.name!r} has no world model")

    def training_objective(self, pipe, bank, **options):
        """The wmbook.train objective of this workload's world model on a trainable `pipe` and an EpisodeBank
        (options: change_weight, agent_weight, sigma_min; wmbook.train.objectives)."""
        raise NotImplementedError(f"workload {self.name!r} has no world model")

    def reference_pipeline(self, preset, device: torch.device, seed: int = 0):
        """The fp32 eager reference (fp32 VAE too): every ladder row starts from a copy of it."""
        return self.pipeline(preset, device, torch.float32, torch.float32, seed)

    def build(self, cfg):
        """(pipeline, inputs) for a validated RunConfig."""
        raise NotImplementedError

    # --- the parts variants act on -----------------------------------------------------------------------
    def denoiser(self, pipe) -> torch.nn.Module:
        """The module one forward runs."""
        return pipe.model

    def conditioning_modules(self, pipe) -> list[torch.nn.Module]:
        return [m for m in (getattr(pipe, "clip", None), getattr(pipe, "text", None))
                if isinstance(m, torch.nn.Module)]

    def compile_target(self, pipe) -> torch.nn.Module:
        """What a whole-model compile compiles."""
        return self.denoiser(pipe)

    def compile_regions(self, pipe) -> list[torch.nn.Module]:
        """The repeated blocks a regional compile compiles."""
        raise NotImplementedError

    def conv_layouts(self, pipe) -> list[Layout]:
        """What the channels-last variant converts: the conv-heavy parts."""
        return []

    def static_caches(self, pipe) -> str:
        """Make the state the pipeline carries across calls static (allocated once, updated in place, so CUDA-graph
        replays find it where they were captured); returns what it did."""
        return "nothing to do: no state carried across calls"

    def graph_targets(self, pipe) -> list[GraphTarget]:
        """What the cuda-graphs variant captures (after making what it needs static)."""
        raise NotImplementedError

    def decoder_ladder(self, device: torch.device) -> list[str]:
        """The decoder rows notebook 06 adds after the captured denoiser (cumulative; GPU-only ones only on a GPU)."""
        return []

    def stand_in_decoder(self, device: torch.device) -> list[str]:
        """The variants that swap in a faster stand-in decoder and make it fast (notebook 06's comparison row); none
        by default."""
        return []

    def decoder_step(self, pipe) -> DecoderStep:
        """The per-frame decode step (workloads with the `frame_decoder` feature)."""
        raise NotImplementedError(f"workload {self.name!r} has no per-frame decode step")

    def streaming_decoder(self, pipe):
        """The object that decodes a stream block by block (decode_block, reset), for workloads with the
        `streaming_decoder` feature."""
        raise NotImplementedError(f"workload {self.name!r} has no streaming decoder")

    def set_streaming_decoder(self, pipe, decoder) -> None:
        raise NotImplementedError(f"workload {self.name!r} has no streaming decoder")

    # --- the decoder table (notebook 06): the decoder alone, on the reference's latents -------------------------
    decoder_unit: str = "steady block"  # what one timed decode is, in words

    def decoder_bench(self, ref):
        """A decoder-only copy of the reference pipeline (its VAE deep-copied) that decoder variants act on."""
        raise NotImplementedError(f"workload {self.name!r} has no decoder table")

    def decoder_stream(self, bench):
        """What decodes latents block by block on a decoder bench: an object with reset() and decode_block(latents)
        (by default the bench's streaming decoder)."""
        return self.streaming_decoder(bench)

    def decoder_block(self, pipe) -> tuple[int, int]:
        """(latent frames, pixel frames) of one timed decode."""
        raise NotImplementedError(f"workload {self.name!r} has no decoder table")

    def decoder_latents(self, pipe, seed: int, size: E2ESize) -> torch.Tensor:
        """Latents [B, C, F, h, w] the reference pipeline makes, for every decoder row to decode."""
        raise NotImplementedError(f"workload {self.name!r} has no decoder table")

    def decoder_flops(self, preset) -> dict | None:
        """{"first_block", "steady_block", "steady_block_conv"}: FLOPs of one timed decode (its floor) and of its
        convolutions alone; None when not counted."""
        return None

    def decoder_size(self, pipe) -> str:
        """'real' or 'tiny': the decoder size a stand-in decoder should match."""
        return "tiny" if getattr(pipe.preset, "name", "").startswith("tiny") else "real"

    def set_vae(self, pipe, vae) -> None:
        """Replace the pipeline's VAE (and what wraps it)."""
        pipe.vae = vae
        pipe.vae_dtype = next(vae.parameters()).dtype

    # --- measuring -------------------------------------------------------------------------------------
    def forward_probe(self, pipe, seed: int = 0) -> Probe:
        raise NotImplementedError

    def end_to_end(self, pipe, seed: int = 0, size: E2ESize = E2ESize()) -> EndToEnd:
        raise NotImplementedError

    def graph_warmup_size(self, size: E2ESize) -> E2ESize:
        """The size of the untimed end-to-end runs after the first that finish capturing the graphs a run calls once
        (wmbook.variants.builtin.warm_up): one whose runs have `size`'s shapes, as short as that allows. By default
        `size` itself (a stream's blocks fill its caches to other lengths, so fewer blocks would not do)."""
        return size

    def decode(self, pipe, latents: torch.Tensor) -> torch.Tensor:
        """Latents of an end-to-end run -> frames, the way the pipeline decodes them."""
        raise NotImplementedError

    def step_axis(self):
        """What notebook 03 sweeps: the sampler's step counts and solvers (wmbook.pipelines.solvers)."""
        raise NotImplementedError(f"workload {self.name!r} has no denoising steps to sweep")

    def kernel_cases(self, preset) -> list:
        """Where notebook 05's fused kernels run in this workload, at `preset`'s shapes (wmbook.kernels.cases)."""
        return []

    def forward_flops(self, preset) -> dict[str, float]:
        """FLOPs of one steady denoiser forward by part ('total' included)."""
        raise NotImplementedError

    def flops_by_category(self, preset) -> dict[str, float]:
        """forward_flops by the kernel category (wmbook.profiling's: GEMM/linear, attention, convolution) whose
        kernels compute them, for the rate each category reaches; empty where the workload does not split them."""
        return {}

    compile_scope: str = "regional"  # how the ladder compiles this workload: "regional" | "whole"
    # notebook 04's compile table by default (its `compile_table` "auto" on a GPU); None: every configuration
    compile_table: tuple[str, ...] | None = None
    # notebook 01's overview figure: (method of the baseline result drawing one panel, its width ratio)
    overview_panels: tuple[tuple[str, float], ...] = ()

    def plot_overview(self, res):
        """Notebook 01's overview: the baseline result's panels (overview_panels) side by side."""
        import matplotlib.pyplot as plt  # noqa: PLC0415  heavy: matplotlib.pyplot

        fig, axes = plt.subplots(1, len(self.overview_panels), figsize=(12.5, 3.4), squeeze=False,
                                 gridspec_kw={"width_ratios": [r for _, r in self.overview_panels]})
        for (name, _), ax in zip(self.overview_panels, axes[0]):
            getattr(res, name)(ax=ax)
        fig.tight_layout()
        return fig

    def default_ladder(self, device: torch.device, attention: str | None) -> list[str]:
        """Notebook 04's cumulative ladder up to compile (the study appends the compile rows; a group name such as
        `hygiene` stands for its variants); `attention` is the attention-backend variant to include, or None."""
        raise NotImplementedError

    def check_e2e(self, preset, name: str, size: E2ESize, device: torch.device | None = None) -> None:
        """ParameterError naming `name` when an end-to-end run of `size` cannot run at `preset` (or, with `device`,
        cannot fit in its memory)."""

    def e2e_description(self, size: E2ESize) -> str:
        """'4-block run' / 'iteration of 5 DDIM steps per pass'."""
        raise NotImplementedError
