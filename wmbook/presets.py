"""Named shapes: tiny presets for the CPU, the real Matrix-Game-2 / Self-Forcing / WMA shapes for the GPU."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

import torch


@dataclass(frozen=True)
class ActionConfig:
    """Matrix-Game-2 action modules (keyboard + mouse), upstream `action_config` names."""

    blocks: tuple[int, ...] = tuple(range(15))
    keyboard_dim_in: int = 4
    mouse_dim_in: int = 2
    hidden_size: int = 128
    img_hidden_size: int = 1536
    keyboard_hidden_dim: int = 1024
    mouse_hidden_dim: int = 1024
    heads_num: int = 16
    windows_size: int = 3
    vae_time_compression_ratio: int = 4
    rope_dim_list: tuple[int, int, int] = (8, 28, 28)
    rope_theta: float = 256.0
    qk_norm: bool = True
    qkv_bias: bool = False


@dataclass(frozen=True)
class CausalWanPreset:
    """One block-causal Wan DiT configuration plus its streaming run settings."""

    name: str
    model_type: str  # "i2v" (CLIP image context + cond_concat) or "t2v" (text context)
    height: int  # pixels
    width: int
    num_frame_per_block: int  # latent frames per block
    local_attn_size: int  # latent frames in the attention window; -1 = full causal
    max_latent_frames: int  # capacity of the KV cache when the window is full (-1)
    denoising_steps: tuple[int, ...]  # before warping onto the shifted flow schedule
    default_blocks: int
    dim: int = 1536
    ffn_dim: int = 8960
    num_heads: int = 12
    num_layers: int = 30
    freq_dim: int = 256
    in_dim: int = 36
    out_dim: int = 16
    patch_size: tuple[int, int, int] = (1, 2, 2)
    text_len: int = 512
    text_dim: int = 4096
    clip_dim: int = 1280
    clip_tokens: int = 257
    cross_attn_norm: bool = True
    qk_norm: bool = True
    eps: float = 1e-6
    shift: float = 5.0
    action: ActionConfig | None = None
    vae: str = "real"  # key for wmbook.models.vae.wan_vae_config
    clip: str = "real"  # key for wmbook.models.clip.clip_vision_config
    tiny: bool = False

    def __post_init__(self):
        # the action modules add into the DiT's residual stream, so their image width is the model width (upstream
        # Matrix-Game-2: action_config.img_hidden_size == dim); a mismatch would fail deep inside the first forward
        if self.action is not None and self.action.img_hidden_size != self.dim:
            raise ValueError(f"preset {self.name!r}: action.img_hidden_size={self.action.img_hidden_size} must equal "
                             f"dim={self.dim} (the action modules write into the DiT's residual stream); "
                             f"change both, e.g. preset.with_(dim=d, action=replace(preset.action, img_hidden_size=d))")
        if self.dim % self.num_heads:
            raise ValueError(f"preset {self.name!r}: dim={self.dim} must be a multiple of num_heads={self.num_heads}")

    @property
    def latent_hw(self) -> tuple[int, int]:
        return self.height // 8, self.width // 8

    @property
    def frame_seqlen(self) -> int:
        h, w = self.latent_hw
        return (h // self.patch_size[1]) * (w // self.patch_size[2])

    @property
    def head_dim(self) -> int:
        return self.dim // self.num_heads

    @property
    def forwards_per_block(self) -> int:
        return len(self.denoising_steps) + 1  # + the cache-refresh pass at t=0

    def kv_capacity_frames(self) -> int:
        return self.local_attn_size if self.local_attn_size != -1 else self.max_latent_frames

    def with_(self, **kw) -> "CausalWanPreset":
        return replace(self, **kw)

    def to_dict(self) -> dict:
        return asdict(self)


MG2_ACTION = ActionConfig()

PRESETS: dict[str, CausalWanPreset] = {
    # Same code paths as mg2-universal at toy width: 2 blocks of 3 frames, window 6 (eviction from block 2).
    "tiny": CausalWanPreset(
        name="tiny", model_type="i2v", height=64, width=64, num_frame_per_block=3, local_attn_size=6,
        max_latent_frames=12, denoising_steps=(1000, 666, 333), default_blocks=3,
        dim=64, ffn_dim=128, num_heads=4, num_layers=2, freq_dim=32, text_len=8, text_dim=32,
        clip_dim=32, clip_tokens=5,
        action=ActionConfig(blocks=(0,), hidden_size=8, img_hidden_size=64, keyboard_hidden_dim=32,
                            mouse_hidden_dim=32, heads_num=2, rope_dim_list=(4, 6, 6)),
        vae="tiny", clip="tiny", tiny=True,
    ),
    "tiny-sf": CausalWanPreset(
        name="tiny-sf", model_type="t2v", height=64, width=64, num_frame_per_block=3, local_attn_size=-1,
        max_latent_frames=9, denoising_steps=(1000, 750, 500, 250), default_blocks=3,
        dim=64, ffn_dim=128, num_heads=4, num_layers=2, freq_dim=32, in_dim=16, text_len=8, text_dim=32,
        vae="tiny", clip="tiny", tiny=True,
    ),
    "mg2-universal": CausalWanPreset(
        name="mg2-universal", model_type="i2v", height=352, width=640, num_frame_per_block=3,
        local_attn_size=6, max_latent_frames=15, denoising_steps=(1000, 666, 333), default_blocks=6,
        action=MG2_ACTION,
    ),
    "self-forcing": CausalWanPreset(
        name="self-forcing", model_type="t2v", height=480, width=832, num_frame_per_block=3,
        local_attn_size=-1, max_latent_frames=21, denoising_steps=(1000, 750, 500, 250), default_blocks=7,
        in_dim=16,
    ),
}

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class WMAPreset:
    """UnifoLM-WMA-0 (DynamiCrafter-style video UNet + action/state heads) shapes and DDIM run settings.

    Field names follow upstream's `configs/inference/world_model_interaction.yaml` where one exists.
    """

    name: str
    height: int = 320  # pixels
    width: int = 512
    frames: int = 16  # temporal_length: video frames per sample (= latent frames; the VAE is per frame)
    # --- video UNet (WMAModel) ---
    in_channels: int = 8  # 4 noisy latent + 4 observation latent (concat condition)
    out_channels: int = 4
    model_channels: int = 320
    channel_mult: tuple[int, ...] = (1, 2, 4, 4)
    num_res_blocks: int = 2
    attention_resolutions: tuple[int, ...] = (4, 2, 1)
    num_head_channels: int = 64
    transformer_depth: int = 1
    context_dim: int = 1024
    init_attn_heads: int = 8  # the extra temporal transformer after the stem conv (addition_attention)
    norm_groups: int = 32
    default_fs: int = 10  # frame-stride condition (fps_embedding)
    # rendered frames from one of the model's frames to the next (observed and predicted alike) where a preset is
    # trained and scored on rendered episodes (wmbook.world); a step's action is the mean of the rendered frames'
    # actions it spans (wmbook.world.env.strided_actions). 1: consecutive frames; world-wma sets 3
    frame_stride: int = 1
    # wmbook's own, off for the reference presets (their state dicts stay upstream's): the raw action vectors and the
    # last observed state vector also enter the UNet's time embedding, per frame (frame f gets an MLP of the last
    # state plus the running sum of an MLP of the actions 0..f; both MLPs end in zero-initialised layers).
    # Upstream's only path for actions is the cross-attention, where a random position embedding (RMS 1) swamps a
    # small action's projection (RMS 0.13) and the token projector's norms dilute it further: at initialisation the
    # world-wma UNet's features moved 0.4% when the actions of a batch were swapped (world-mg2's: 12%)
    action_embedding: bool = False
    num_stem_token: int = 16  # tokens per action step out of the action-token projector
    # upstream builds the output blocks' cross-attention without agent_action_context_len, so they slice the
    # context with its default (16 tokens as "action", the rest shifted); kept for checkpoint fidelity
    output_action_context_len: int = 16
    stem_heads: int = 16
    stem_dim_head: int = 64
    # --- conditioning ---
    n_obs_steps: int = 2  # observed frames/states (n_obs_steps_imagen = n_obs_steps_acting = 2)
    agent_state_dim: int = 16
    agent_action_dim: int = 16
    text_len: int = 77  # OpenCLIP ViT-H/14 text tower, penultimate layer
    text_width: int = 1024
    text_layers: int = 24
    text_heads: int = 16
    clip: str = "real"  # key for wmbook.models.clip.clip_vision_config (ViT-H/14, 257 x 1280 tokens)
    resampler_dim: int = 1024
    resampler_depth: int = 4
    resampler_heads: int = 12
    resampler_dim_head: int = 64
    resampler_queries: int = 16  # image tokens per frame (x frames queries in all)
    # --- action / state heads (ConditionalUnet1D, one each) ---
    head_down_dims: tuple[int, ...] = (256, 512, 1024, 2048)
    head_kernel_size: int = 5
    head_n_groups: int = 8
    head_step_embed_dim: int = 128
    head_act_proj_dim: int = 32
    obs_widths: tuple[int, ...] = (64, 128, 256, 512)  # ResNet-18 stages of the heads' observation encoder
    obs_spatial_kp: int = 128
    # --- VAE (SD-style AutoencoderKL, per frame) ---
    vae_block_out_channels: tuple[int, ...] = (128, 256, 512, 512)
    vae_layers_per_block: int = 2
    vae_norm_groups: int = 32
    latent_channels: int = 4
    scale_factor: float = 0.18215
    # --- sampling (video: v-prediction DDIM on a zero-terminal-SNR scaled-linear schedule) ---
    default_steps: int = 50  # DDIM steps
    ddim_eta: float = 1.0
    guidance_scale: float = 1.0  # 1.0 = one UNet forward per step
    guidance_rescale: float = 0.7  # only acts when guidance_scale > 1
    timestep_spacing: str = "trailing"  # upstream 'uniform_trailing'
    num_train_timesteps: int = 1000
    beta_start: float = 0.00085  # linear_start
    beta_end: float = 0.012  # linear_end
    beta_schedule: str = "scaled_linear"  # upstream 'linear' = linspace(sqrt(start), sqrt(end))**2
    rescale_betas_zero_snr: bool = True
    prediction_type: str = "v_prediction"
    use_dynamic_rescale: bool = True  # DynamiCrafter: pred_x0 *= scale(t_prev) / scale(t)
    base_scale: float = 0.7
    turning_step: int = 400
    # heads: their own DDIM (epsilon, squaredcos_cap_v2, clipped), stepped at the video timesteps
    head_beta_start: float = 0.0001
    head_beta_end: float = 0.02
    head_beta_schedule: str = "squaredcos_cap_v2"
    tiny: bool = False

    def __post_init__(self):
        if isinstance(self.frame_stride, bool) or not isinstance(self.frame_stride, int) or self.frame_stride < 1:
            raise ValueError(f"frame_stride={self.frame_stride!r} is not allowed; allowed values: an integer >= 1")

    @property
    def latent_hw(self) -> tuple[int, int]:
        return self.height // 8, self.width // 8

    @property
    def latent_shape(self) -> tuple[int, int, int, int]:
        """[C, T, h, w] of one sample's video latent."""
        return (self.latent_channels, self.frames, *self.latent_hw)

    @property
    def horizon(self) -> int:
        """Action/state steps predicted per sample (upstream ties it to the frame count)."""
        return self.frames

    def with_(self, **kw) -> "WMAPreset":
        return replace(self, **kw)

    def to_dict(self) -> dict:
        return asdict(self)


WMA_PRESETS: dict[str, WMAPreset] = {
    # Same code paths as `wma` at toy width: 4 frames at 64x64 (latent 8x8), 4 UNet levels, 2 of 3 DDIM steps.
    "tiny-wma": WMAPreset(
        name="tiny-wma", height=64, width=64, frames=4, model_channels=16, num_head_channels=8, norm_groups=8,
        context_dim=32, init_attn_heads=2, num_stem_token=2, output_action_context_len=4, stem_heads=2,
        stem_dim_head=16, agent_state_dim=6, agent_action_dim=6,
        text_len=8, text_width=32, text_layers=2, text_heads=2, clip="tiny", resampler_dim=32, resampler_depth=1,
        resampler_heads=2, resampler_dim_head=16, resampler_queries=2, head_down_dims=(16, 32, 64, 64),
        head_kernel_size=3, head_step_embed_dim=16, head_act_proj_dim=8, obs_widths=(16, 16, 32, 32),
        obs_spatial_kp=8, vae_block_out_channels=(32, 32, 32, 32), vae_layers_per_block=1, vae_norm_groups=8,
        default_steps=3, tiny=True,
    ),
    "wma": WMAPreset(name="wma"),
}

# --- the world presets: small models trained on the synthetic game world (wmbook.world, wmbook.train) ----------------


@dataclass(frozen=True)
class WorldCausalPreset(CausalWanPreset):
    """A causal DiT preset trained on wmbook.world: the same model code; latents from the lossless space-to-depth
    codec `vae = 's2d<N>'` (wmbook.world.codec: 4 pixel frames x 3 colours x N^2 pixels per latent position, so
    out_dim = 48 N^2 and the latent grid is H/N x W/N); weights shipped under data/weights/ (`weights`)."""

    codec_spatial: int = 4
    weights: str = ""  # file name under data/weights/
    encoder_seed: int = 0  # the frozen random CLIP's seed (its weights ship with the model's too)
    # what the model's output is: "x0" (the clean latents; wmbook.pipelines.causal uses it as the x0 prediction
    # directly) or "flow" (noise - x0, as the reference presets). x0: a 2x2 patch of these latents is 768 numbers
    # read out of a 256-wide token, so a flow (which contains the noise) cannot be represented; the clean latents
    # (4 near-equal frames of a rendered scene) can (Li & He 2025, "Back to Basics: Let Denoising Generative Models
    # Denoise").
    prediction: str = "x0"

    def __post_init__(self):
        if self.prediction not in ("x0", "flow"):
            raise ValueError(f"prediction={self.prediction!r} is not allowed; allowed values: ['x0', 'flow']")

    @property
    def latent_hw(self) -> tuple[int, int]:
        return self.height // self.codec_spatial, self.width // self.codec_spatial


WORLD_WMA_OUTPUTS = ("x0-residual", "x0", "v")


@dataclass(frozen=True)
class WorldWMAPreset(WMAPreset):
    """A WMA preset trained on wmbook.world: the same UNet and heads; per-frame latents from the lossless
    space-to-depth codec `vae = 's2d<N>'` (3 N^2 channels at H/N x W/N, times scale_factor); weights shipped under
    data/weights/ (`weights`)."""

    vae: str = "s2d4"
    codec_spatial: int = 4
    weights: str = ""
    encoder_seed: int = 0  # the frozen random CLIP and text towers' seed (their used weights ship with the model's)
    # what the UNet's video output is: "x0" (the pipeline turns it into the v its samplers step), "x0-residual" (x0
    # minus the last observed frame's latent, which the UNet also gets as cond_latent: the change the actions cause;
    # training zero-initialises the output conv, so it starts from the copy-last-frame prediction) or "v" (the
    # reference). Not v: the 48-channel latents (and the 48 channels of the observation beside them) enter a
    # 40-channel stem and leave a 40-channel head, so the noise a v target carries cannot be reproduced (Li & He 2025)
    model_output: str = "x0-residual"
    # DDIM steps a pass that the world evaluation (wmbook.world.eval.predict, training's held-out score, the shipped
    # weights' test) samples with when none are given; 0: default_steps
    sample_steps: int = 0

    def __post_init__(self):
        super().__post_init__()
        if self.model_output not in WORLD_WMA_OUTPUTS:
            raise ValueError(f"model_output={self.model_output!r} is not allowed; allowed values: "
                             f"{list(WORLD_WMA_OUTPUTS)}")
        if isinstance(self.sample_steps, bool) or not isinstance(self.sample_steps, int) or self.sample_steps < 0:
            raise ValueError(f"sample_steps={self.sample_steps!r} is not allowed; allowed values: 0 (default_steps) "
                             "or a positive number of DDIM steps")
        if self.model_output == "x0-residual" and self.use_dynamic_rescale:
            raise ValueError("model_output='x0-residual' needs use_dynamic_rescale=False (the rescaled x0 of "
                             "DynamiCrafter's schedule is no longer the last frame plus a change)")

    @property
    def latent_hw(self) -> tuple[int, int]:
        return self.height // self.codec_spatial, self.width // self.codec_spatial


# 64x64 frames, 4x space-to-depth: 16x16 latents of 192 channels, 2x2 patches -> 64 tokens per latent frame
PRESETS["world-mg2"] = WorldCausalPreset(
    name="world-mg2", model_type="i2v", height=64, width=64, num_frame_per_block=3, local_attn_size=6,
    max_latent_frames=12, denoising_steps=(1000, 750, 500, 250), default_blocks=4,
    dim=256, ffn_dim=768, num_heads=4, num_layers=6, freq_dim=256, in_dim=4 + 2 * 192, out_dim=192,
    text_len=8, text_dim=32, clip_dim=32, clip_tokens=5,
    action=ActionConfig(blocks=(0, 1, 2, 3), hidden_size=32, img_hidden_size=256, keyboard_hidden_dim=128,
                        mouse_hidden_dim=128, heads_num=4, rope_dim_list=(8, 12, 12)),
    vae="s2d4", clip="tiny", codec_spatial=4, weights="world-mg2.pt",
)
# 64x64 frames, 4x space-to-depth: 16x16 latents of 48 channels (x 2.0), 8 frames per sample
WMA_PRESETS["world-wma"] = WorldWMAPreset(
    name="world-wma", height=64, width=64, frames=8, in_channels=96, out_channels=48, latent_channels=48,
    scale_factor=2.0, model_channels=40, channel_mult=(1, 2, 2, 2), num_res_blocks=1, attention_resolutions=(4, 2, 1),
    num_head_channels=20, norm_groups=8, context_dim=64, init_attn_heads=2, num_stem_token=2,
    output_action_context_len=16, stem_heads=2, stem_dim_head=32, agent_state_dim=6, agent_action_dim=6,
    text_len=8, text_width=64, text_layers=1, text_heads=2, clip="tiny", resampler_dim=64, resampler_depth=1,
    resampler_heads=2, resampler_dim_head=32, resampler_queries=4, head_down_dims=(16, 32, 64, 64),
    head_kernel_size=3, head_step_embed_dim=32, head_act_proj_dim=8, obs_widths=(16, 16, 32, 32), obs_spatial_kp=16,
    vae_block_out_channels=(32, 32, 32, 32), vae_layers_per_block=1, vae_norm_groups=8,
    vae="s2d4", codec_spatial=4, weights="world-wma.pt", action_embedding=True,
    # UnifoLM samples its videos with a frame stride; the world renders at a rate where over 8 consecutive frames the
    # agent hardly moves: on 8 held-out episodes copy-last scores 19.67 dB / SSIM 0.471 / agent error 6.8 px at stride
    # 1 and 16.47 dB / 0.286 / 16.2 px at stride 3; at stride 1 none of seven trained runs beat copy-last
    # (data/weights/README.md) and action following hardly shows
    frame_stride=3,
    # no DynamiCrafter x0 rescale: trained from scratch, the model need not learn x0 * scale(t); with it, DDIM ends
    # on scale(t_last) x0 (a perfect model: 42.1 dB at 50 steps, 36.1 at 10, 30.8 at 5 on held-out seed 0), a
    # contrast loss notebook 03 would book as step-count error, and DPM-Solver++ / UniPC cannot apply it
    use_dynamic_rescale=False,
    # the shipped weights (run o) are scored with 5 DDIM steps a pass: chosen on the selection episodes 8-15 by
    # wmbook.world.eval.choose_steps (the fewest of 1, 2, 5, 10 whose PSNR and SSIM beat copy-last's and whose agent
    # error is at most half of copy-last's, over 8 draws of the sampling noise, each mean moved against the model by
    # its standard error). 2 steps passes on the plain mean (5.2 px against 5.7) but not by its standard error (0.8
    # px): single draws put it anywhere from 3.2 to 9.4 px. 1 step blurs the agent; from 10 steps on the samples carry
    # grain and SSIM falls below copy-last's (data/weights/README.md). The reference sampler (notebook 03's full-step
    # run) keeps default_steps = 50
    sample_steps=5,
)

ALL_PRESETS: dict = {**PRESETS, **WMA_PRESETS}


def get_preset(name: str) -> CausalWanPreset | WMAPreset:
    """Look up a preset of either workload by name (ValueError lists the known ones)."""
    if name not in ALL_PRESETS:
        raise ValueError(f"preset={name!r} is not known; allowed values: {sorted(ALL_PRESETS)}")
    return ALL_PRESETS[name]


def resolve_device(device="auto") -> torch.device:
    """'auto' (or None) -> cuda when present, else cpu; 'cuda' without a GPU is an error; a torch.device is kept."""
    if isinstance(device, torch.device):
        return device
    if device is None:
        device = "auto"
    allowed = ("auto", "cpu", "cuda")
    if device not in allowed and not str(device).startswith("cuda:"):
        raise ValueError(f"device={device!r} is not allowed; allowed values: {list(allowed)} or 'cuda:N'")
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if str(device).startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device={device!r} asked for, but torch sees no CUDA GPU; use device='cpu' or 'auto'")
    return torch.device(device)


def resolve_dtype(name, device: torch.device) -> torch.dtype:
    """'auto' -> bf16 on a GPU, fp32 on a CPU; a name of DTYPES; a torch.dtype is kept."""
    if isinstance(name, torch.dtype):
        return name
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if name not in DTYPES:
        raise ValueError(f"dtype={name!r} is not allowed; allowed values: {['auto', *DTYPES]}")
    return DTYPES[name]


def dtype_name(dtype: torch.dtype) -> str:
    """'fp32' | 'bf16' | 'fp16' (the names DTYPES knows)."""
    for k, v in DTYPES.items():
        if v == dtype:
            return k
    raise ValueError(f"dtype {dtype} has no name; known: {list(DTYPES.values())}")
