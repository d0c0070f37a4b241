"""UnifoLM-WMA-0 interaction iteration (upstream `scripts/evaluation/world_model_interaction.py`), labelled.

One iteration = conditioning, then two DDIM samplings of the same UNet:
  decision pass     (sim_mode off): action tokens zeroed, instruction text used -> the action chunk
  world-model pass  (sim_mode on):  the decision pass's actions as tokens, empty text -> the future video, states
Each DDIM step runs the UNet once (twice with classifier-free guidance) and steps the video latents and the
action and state heads. The video's schedule is a diffusers DDIMScheduler (v-prediction, zero-terminal-SNR
scaled-linear betas, trailing spacing); its update (eta 1, DynamiCrafter's dynamic pred-x0 rescale) is
`ddim_update` over a float64 `DDIMTable` (see there why not `DDIMScheduler.step`). The heads step their own
diffusers DDIMSchedulers (epsilon, squaredcos_cap_v2, clipped) at the video's timesteps, as upstream.
Latents are decoded one frame at a time.

Label hierarchy (record_function / NVTX; a SectionTimer attached with `timer.attached()` times them all):
  WMA_Interaction_Iteration
    1_Conditioning_Prep    1.1_Image_Embedding 1.2_VAE_Encode_Observation 1.3_Text_Embedding
                           1.4_State_Action_Embedding
    2_Decision_Pass        2.1_DDIM_Sampling > DDIM_Step_{j}_t{t} > UNet_Forward (x1 or x2), DDIM_Update
                           2.2_Decode_First_Stage > VAE_Decode_Frame_{k}
    3_World_Model_Pass     3.0_Action_Embedding, 3.1_DDIM_Sampling ..., 3.2_Decode_First_Stage ...
    4_Save_Results
Timings come from device events (`DeviceTimer`): no host sync inside the loop.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from diffusers import DDIMScheduler

try:  # the guiders' copy: the Stable Diffusion pipeline's module imports transformers' CLIP classes for nothing here
    from diffusers.guiders.guider_utils import rescale_noise_cfg
except ImportError:  # a diffusers without guiders
    from diffusers.pipelines.stable_diffusion.pipeline_stable_diffusion import rescale_noise_cfg
from tqdm.auto import tqdm

from ..atomic import atomic_open
from ..bench import DeviceTimer
from ..errors import number_error
from ..models.wma import WMA_FORWARD_LABEL, WMAWorldModel
from ..models.wma.conditioning import ClipImageTokens, OpenClipTextEncoder
from ..models.wma.mapping import load_upstream_checkpoint
from ..models.wma.vae import build_sd_vae, decode_frame, encode_frame
from ..presets import WMAPreset, get_preset, resolve_device, resolve_dtype
from ..profiling.labels import label
from .causal import export_gif, load_image
from .ddim_tables import (  # noqa: F401  (re-exported)
    HEAD_COEFS,
    VIDEO_COEFS,
    DDIMTable,
    ddim_table,
    ddim_update,
    dynamic_rescale,
    head_coef_table,
    head_scheduler,
    video_coef_table,
    video_scheduler,
)
from .solvers import WMA_SOLVERS, check_solver, check_steps, video_solver

ITERATION_LABEL = "WMA_Interaction_Iteration"  # one interaction iteration (the breakdown region)
DEFAULT_INSTRUCTION = "pick up the yellow box and place it in the basket"


@dataclass
class WMAInputs:
    """One observation: what the interaction loop holds before an iteration."""

    seed: int
    observation_images: torch.Tensor  # [B, 3, n_obs, H, W] in [-1, 1]
    observation_states: torch.Tensor  # [B, n_obs, S] (normalised to [-1, 1])
    actions: torch.Tensor  # [B, T, A] the action queue (zeros at the start of an episode, as upstream)
    instruction: str


@dataclass
class Conditioning:
    """Everything 1_Conditioning_Prep produces."""

    cond_latent: torch.Tensor  # [B, 4, T, h, w] observation latent repeated over frames
    state: torch.Tensor  # [B, n_obs, C]
    image: torch.Tensor  # [B, T*Q, C]
    text: torch.Tensor  # [B, text_len, C] the instruction
    empty_text: torch.Tensor  # [B, text_len, C] the empty prompt (world-model pass, unconditional branch)
    decision_context: torch.Tensor  # [B, N, C]
    uncond_image: torch.Tensor | None = None  # [B, T*Q, C] from a zero image (only with guidance)


@dataclass
class PassOutput:
    """One DDIM sampling pass (+ decode) and its device-event timings."""

    latents: torch.Tensor  # [B, 4, T, h, w]
    frames: torch.Tensor | None  # [B, 3, T, H, W] (None when not decoded)
    actions: torch.Tensor | None  # [B, T, A] (None: the pass skipped its action head, skip-unused-heads)
    states: torch.Tensor | None  # [B, T, S] (None: the pass skipped its state head)
    step_ms: list[float] = field(default_factory=list)  # whole DDIM step
    forward_ms: list[float] = field(default_factory=list)  # the step's UNet forward(s)
    update_ms: list[float] = field(default_factory=list)  # the three scheduler updates
    sampling_ms: float = float("nan")
    decode_ms: float = 0.0
    pass_ms: float = float("nan")
    solver: str = "ddim"
    timesteps: list[int] = field(default_factory=list)  # the video timesteps stepped, in order


@dataclass
class WMAOutput:
    """One interaction iteration."""

    decision: PassOutput
    world: PassOutput
    ddim_steps: int
    timesteps: list[int]
    forwards_per_step: int
    conditioning_ms: float = float("nan")
    save_ms: float = 0.0
    iteration_ms: float = float("nan")
    peak_memory_bytes: int | None = None
    paths: dict = field(default_factory=dict)
    solver: str = "ddim"
    decision_steps: int | None = None  # None: ddim_steps
    world_steps: int | None = None  # None: ddim_steps

    @property
    def unet_forwards(self) -> int:
        d = self.ddim_steps if self.decision_steps is None else self.decision_steps
        w = self.ddim_steps if self.world_steps is None else self.world_steps
        return (d + w) * self.forwards_per_step

    def reference(self) -> dict[str, torch.Tensor]:
        """The tensors a faster variant must reproduce (fp32 reference gate)."""
        ref = {"decision_latents": self.decision.latents, "actions": self.decision.actions,
               "world_latents": self.world.latents, "states": self.world.states}
        if self.decision.frames is not None:
            ref["decision_frames"] = self.decision.frames
        if self.world.frames is not None:
            ref["world_frames"] = self.world.frames
        return ref


def check_run_params(p: WMAPreset, ddim_steps=None, guidance_scale=None, guidance_rescale=None, eta=None):
    """Validated (steps, guidance_scale, guidance_rescale, eta); None -> the preset's value."""
    steps = p.default_steps if ddim_steps is None else ddim_steps
    if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or not 1 <= steps <= p.num_train_timesteps:
        raise ValueError(f"ddim_steps={ddim_steps!r} is not allowed; allowed values: an integer in "
                         f"[1, {p.num_train_timesteps}]")
    out = [int(steps)]
    for name, v, default, lo, hi in (("guidance_scale", guidance_scale, p.guidance_scale, 1.0, math.inf),
                                     ("guidance_rescale", guidance_rescale, p.guidance_rescale, 0.0, 1.0),
                                     ("eta", eta, p.ddim_eta, 0.0, 1.0)):
        v = default if v is None else v
        why = number_error(name, v, lo, hi)
        if why:
            raise ValueError(why)
        out.append(float(v))
    return tuple(out)


def check_world_actions(p: WMAPreset, world_actions, batch: int) -> None:
    """`run_iteration(world_actions=...)`: None (the world-model pass uses the decision pass's actions, as upstream)
    or a tensor [B, horizon, agent_action_dim] of given actions (a held-out episode's true actions)."""
    if world_actions is None:
        return
    want = (batch, p.horizon, p.agent_action_dim)
    if not isinstance(world_actions, torch.Tensor) or tuple(world_actions.shape) != want:
        got = tuple(world_actions.shape) if isinstance(world_actions, torch.Tensor) else type(world_actions).__name__
        raise ValueError(f"world_actions={got} is not allowed; allowed values: None or a tensor of shape {want}")


class WMAInteractionPipeline:
    """Reference UnifoLM-WMA pipeline at a preset's shapes: world model, CLIP, text tower, VAE (random weights)."""

    def __init__(self, preset: str | WMAPreset = "tiny-wma", device="auto", dtype="auto", vae_dtype="auto",
                 seed: int = 0, checkpoint=None, use_ema: bool = False):
        p = preset if isinstance(preset, WMAPreset) else get_preset(preset)
        if not isinstance(p, WMAPreset):
            raise ValueError(f"preset={p.name!r} is not a UnifoLM-WMA preset; use 'tiny-wma' or 'wma'")
        self.preset = p
        self.device = resolve_device(device)
        self.dtype = resolve_dtype(dtype, self.device)
        # upstream runs the VAE in fp32 (a bf16 VAE cost one competitor 12 dB PSNR), so 'auto' keeps it fp32
        self.vae_dtype = torch.float32 if str(vae_dtype) == "auto" else resolve_dtype(vae_dtype, self.device)
        dev = self.device
        torch.manual_seed(seed)
        with torch.device(dev):  # initialise on the target device: seconds, not minutes, at 2.6 B params
            self.model = WMAWorldModel(p).eval().requires_grad_(False)
        if checkpoint:
            load_upstream_checkpoint(self.model, checkpoint, use_ema=use_ema)  # model.*, or model_ema.* if asked
        self.model.to(self.dtype)
        self.clip = ClipImageTokens(p.clip, dtype=self.dtype, device=dev, seed=seed)
        self.text = OpenClipTextEncoder(p, device=dev, dtype=self.dtype, seed=seed)
        self.vae = build_sd_vae(p, dtype=self.vae_dtype, device=dev, seed=seed)
        self.scheduler = video_scheduler(p)
        self.action_scheduler = head_scheduler(p)
        self.state_scheduler = head_scheduler(p)
        # 'ddim' passes step through `update_step` (device-side coefficients, one CUDA graph for every step; the
        # cuda-graphs variant turns it on) instead of `ddim_update` + the heads' DDIMScheduler.step; same outputs
        self.device_update = False

    # --- inputs ---------------------------------------------------------------------------------
    def prepare(self, seed: int = 0, image=None, instruction: str = DEFAULT_INSTRUCTION, batch: int = 1) -> WMAInputs:
        """The start of an episode: the first frame (and state) fill the n_obs queue, actions are zeros."""
        p = self.preset
        if not isinstance(batch, int) or batch < 1:
            raise ValueError(f"batch={batch!r} must be a positive integer")
        gen = torch.Generator("cpu").manual_seed(seed)
        img = load_image(image, p.height, p.width, gen)  # [1, 3, H, W]
        obs = img[:, :, None].expand(batch, -1, p.n_obs_steps, -1, -1).contiguous()  # [B, 3, n_obs, H, W]
        state = torch.rand(1, 1, p.agent_state_dim, generator=gen) * 2 - 1
        states = state.expand(batch, p.n_obs_steps, -1).contiguous()
        actions = torch.zeros(batch, p.horizon, p.agent_action_dim)
        dev = self.device
        return WMAInputs(seed=seed, observation_images=obs.to(dev), observation_states=states.to(dev),
                         actions=actions.to(dev), instruction=instruction)

    # --- 1. conditioning -------------------------------------------------------------------------
    def condition(self, inputs: WMAInputs, gen: torch.Generator, guidance: bool) -> Conditioning:
        p, m, dt = self.preset, self.model, self.dtype
        b = inputs.observation_images.shape[0]
        last = inputs.observation_images[:, :, -1]  # [B, 3, H, W] the current frame
        with label("1.1_Image_Embedding"):
            last = last.to(dt)
            image = self.image_tokens(last)  # [B, T*Q, C]
            uncond_image = self.embed_zero_image(last) if guidance else None
        with label("1.2_VAE_Encode_Observation"):
            lat = self.encode_observation(inputs.observation_images, gen)
            cond_latent = lat.to(dt)[:, :, None].expand(-1, -1, p.frames, -1, -1)  # [B, 4, T, h, w]
        with label("1.3_Text_Embedding"):
            text, empty = self.embed_text(inputs.instruction, b)
        with label("1.4_State_Action_Embedding"):
            state = m.embed_state(inputs.observation_states)
            zero_actions = m.embed_action(inputs.actions, zero=True)  # decision pass: action tokens zeroed
            ctx = m.build_context(state, zero_actions, text, image)
        return Conditioning(cond_latent=cond_latent, state=state, image=image, text=text, empty_text=empty,
                            decision_context=ctx, uncond_image=uncond_image)

    def encode_observation(self, images: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        """Observed frames [B, 3, T_obs, H, W] -> the last one's scaled latent [B, 4, h, w]: upstream encodes every
        observed frame (one posterior sample each, drawn from `gen`) and keeps the last one."""
        lat = None
        for k in range(images.shape[2]):
            with label(f"VAE_Encode_Frame_{k}"):
                lat = encode_frame(self.vae, images[:, :, k], self.preset.scale_factor, gen)
        return lat

    def image_tokens(self, image: torch.Tensor) -> torch.Tensor:
        """A frame [B, 3, H, W] -> the UNet's image tokens [B, T*Q, C]: CLIP's last block, then the resampler."""
        return self.model.embed_image(self.clip(image))

    def embed_zero_image(self, like: torch.Tensor) -> torch.Tensor:
        """The image tokens of a zero image shaped like `like` (classifier-free guidance's unconditional image)."""
        return self.image_tokens(torch.zeros_like(like))

    def embed_text(self, instruction: str, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(the instruction's text tokens, the empty prompt's) for a batch, as upstream computes them each iteration."""
        return self.text([instruction] * batch), self.text([""] * batch)

    # --- 2./3. sampling ---------------------------------------------------------------------------
    def denoise(self, x, act, st, t, cond: Conditioning, context, obs_images, obs_states, fs, actions=None):
        """One UNet forward (video, action and state heads) at timestep t: (v, action eps, state eps).
        actions: the raw actions [B, T, A] the context's action tokens hold, for presets with action_embedding
        (None there: the decision pass's zeros); the reference presets take none."""
        tt = torch.full((x.shape[0],), t, device=x.device, dtype=torch.long)
        extra = {}
        if getattr(self.preset, "action_embedding", False):  # sample_pass hands them over in the model's dtype
            extra["actions"] = (x.new_zeros(x.shape[0], self.preset.horizon, self.preset.agent_action_dim)
                                if actions is None else actions).to(self.dtype)
        with label(WMA_FORWARD_LABEL):
            out = self.model(x.to(self.dtype), cond.cond_latent, act.to(self.dtype), st.to(self.dtype), tt,
                             context, obs_images, obs_states, fs, **extra)
        kind = getattr(self.preset, "model_output", "v")
        if kind != "v":  # world presets: the UNet predicts x0 (or x0 minus the last observed frame's latent); the
            x0 = out[0].float()  # samplers step v, from x = sqrt(a) x0 + sqrt(1 - a) eps
            if kind == "x0-residual":
                x0 = x0 + cond.cond_latent.float()
            a = float(self.scheduler.alphas_cumprod[int(t)])
            v = (math.sqrt(a) * x.float() - x0) / math.sqrt(1.0 - a)
            out = (v, *out[1:])
        return out

    def sample_pass(self, tag: str, cond: Conditioning, context: torch.Tensor, uncond_context: torch.Tensor | None,
                    inputs: WMAInputs, *, steps: int, guidance_scale: float, guidance_rescale: float, eta: float,
                    gen: torch.Generator, timer: DeviceTimer, decode: bool, progress: bool,
                    solver: str = "ddim", actions: torch.Tensor | None = None) -> PassOutput:
        """DDIM sampling of video, actions and states from noise, then the per-frame decode.

        solver: 'ddim' (the reference), or 'dpmsolver++' / 'unipc' for the video latents (wmbook.pipelines.solvers:
        diffusers' multistep schedulers configured like the reference; eta and the dynamic rescale do not apply);
        the heads keep their DDIM at the same timesteps. actions: the raw actions of the context's action tokens
        (presets with action_embedding; None: zeros, the decision pass).

        With `self.device_update` on and solver 'ddim', each step's update is `update_step`: the coefficients of the
        whole pass go to the device once ([steps, 5] tables), the noise is drawn eagerly (the same draw as
        `ddim_update`'s), and one call steps video and heads with tensor arguments only (one CUDA graph serves every
        step). Otherwise `ddim_update` and the heads' `DDIMScheduler.step`, with host float coefficients."""
        p, dev = self.preset, self.device
        b = context.shape[0]
        sched, asched, ssched = self.scheduler, self.action_scheduler, self.state_scheduler
        for s in (sched, asched, ssched):
            s.set_timesteps(steps)  # host-side tables: no device work, no sync
        table = ddim_table(p, sched, steps, eta)
        ts = table.timesteps
        msched = None
        if solver != "ddim":
            msched = video_solver(p, solver)
            with warnings.catch_warnings():  # diffusers' np.array(tensor) on numpy 2: a DeprecationWarning per call
                warnings.simplefilter("ignore", DeprecationWarning)
                msched.set_timesteps(steps)  # host-side tables, the same trailing timesteps as the DDIM table
            msched.set_begin_index(0)
            ts = tuple(int(t) for t in msched.timesteps.tolist())
        guided = guidance_scale != 1.0
        on_device = self.device_update and msched is None
        if on_device:  # the step's coefficients as device tensor rows, copied once per step count
            vtab, atab, stab, no_noise = self._device_tables(table, ts, b)
        obs_images = inputs.observation_images.to(self.dtype)
        obs_states = inputs.observation_states.to(self.dtype)
        fs = torch.full((b,), p.default_fs, dtype=torch.long, device=dev)
        if getattr(p, "action_embedding", False):  # once per pass, not per step: the zeros of a decision pass
            actions = (torch.zeros((b, p.horizon, p.agent_action_dim), device=dev) if actions is None
                       else actions).to(self.dtype)

        x = torch.randn((b, *p.latent_shape), generator=gen, device=dev)  # fp32 sampling state
        act = torch.randn((b, p.horizon, p.agent_action_dim), generator=gen, device=dev)
        st = torch.randn((b, p.horizon, p.agent_state_dim), generator=gen, device=dev)
        timer.mark(f"{tag}_sampling")
        with label(f"{tag}.1_DDIM_Sampling"):
            for j, t in enumerate(tqdm(ts, desc=f"{tag} DDIM steps", disable=not progress, leave=False)):
                with label(f"DDIM_Step_{j}_t{t}"):
                    v, ea, es = self.denoise(x, act, st, t, cond, context, obs_images, obs_states, fs, actions)
                    if guided:
                        vu, eau, esu = self.denoise(x, act, st, t, cond, uncond_context, obs_images, obs_states, fs,
                                                    actions)
                    timer.mark(f"{tag}_f{j}")
                    with label("DDIM_Update"):
                        if guided:  # video, action and state outputs alike, as upstream
                            v, ea, es = (self._guide(c.float(), u.float(), guidance_scale, guidance_rescale)
                                         for c, u in ((v, vu), (ea, eau), (es, esu)))
                        if on_device:  # the same draw, at the same point of gen's stream, as ddim_update's
                            noise = torch.randn(v.shape, generator=gen, device=v.device, dtype=torch.float32) \
                                if table.sigma[j] > 0.0 else no_noise
                            x, act, st = self.update_step(x, act, st, v, ea, es, noise, vtab[j], atab[j], stab[j])
                        elif msched is None:
                            x, _ = ddim_update(table, j, x, v.float(), gen)
                        else:
                            x = msched.step(v.float(), t, x).prev_sample
                        if not on_device:
                            act = asched.step(ea.float(), t, act).prev_sample
                            st = ssched.step(es.float(), t, st).prev_sample
                    timer.mark(f"{tag}_s{j}")
        frames = None
        if decode:
            with label(f"{tag}.2_Decode_First_Stage"):
                frames = self.decode(x)
        timer.mark(f"{tag}_decoded")
        return PassOutput(latents=x, frames=frames, actions=act, states=st, solver=solver, timesteps=list(ts))

    def _device_tables(self, table, ts, batch: int):
        """(video_coef_table, the action and state heads' head_coef_table, zeros of the latents' shape) on the
        device, made at a pass's first use of this step table and batch and kept: a blocking copy from host memory
        synchronizes the stream, so one per pass left the GPU idle while the host set the pass up (3.7-5.0 ms an
        iteration at wma, DDIM 2+2, on the H200: NOTES.md). Read-only: the update never writes them."""
        asched, ssched = self.action_scheduler, self.state_scheduler
        key = (table, batch, str(self.device), id(asched), id(ssched))  # ts is table.timesteps (DDIM only)
        cache = self.__dict__.setdefault("_device_table_cache", {})
        if key not in cache:
            dev = self.device
            cache[key] = (video_coef_table(table, dev), head_coef_table(asched, ts, dev),
                          head_coef_table(ssched, ts, dev),
                          torch.zeros((batch, *self.preset.latent_shape), device=dev))  # sigma 0: zeros added
        return cache[key]

    def update_step(self, x, act, st, v, ea, es, noise, vcoef, hcoef_a, hcoef_s):
        """One DDIM step of the video latents and both heads with every per-step value a tensor argument:
        (x, act, st) at the previous timestep. What the cuda-graphs variant captures once and replays every step.

        vcoef: the step's row of `video_coef_table` (the video's `DDIMTable` coefficients); noise: the step's draw
        (zeros when its sigma is 0); hcoef_a / hcoef_s: the step's rows of `head_coef_table` for the action and
        state schedulers. The operations are `ddim_update`'s and diffusers' `DDIMScheduler.step`'s, in their order,
        with the same float32 coefficients, so the outputs are theirs bit for bit (one exception: where sigma is 0,
        a -0.0 of x_prev becomes +0.0 by the zeros added)."""
        sa, s1a, x0c, epsc, sigma = vcoef.unbind(0)
        v = v.float()
        x0 = sa * x - s1a * v
        eps = sa * v + s1a * x
        x_prev = x0c * x0 + epsc * eps
        x_prev = x_prev + sigma * noise
        return (x_prev, self._head_step(self.action_scheduler, ea.float(), act, hcoef_a),
                self._head_step(self.state_scheduler, es.float(), st, hcoef_s))

    @staticmethod
    def _head_step(sched: DDIMScheduler, eps: torch.Tensor, sample: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """`sched.step(eps, t, sample).prev_sample` (epsilon, clipped, eta 0) from the step's `head_coef_table` row.

        diffusers divides by sqrt(alpha_bar_t), a CPU scalar: the CPU kernel divides, the CUDA kernel multiplies by
        the float32 reciprocal (div_true_kernel_cuda); the same here, by the sample's device."""
        sqrt_beta, sqrt_alpha, inv_sqrt_alpha, sqrt_alpha_prev, dir_coef = h.unbind(0)
        x0 = sample - sqrt_beta * eps
        x0 = x0 * inv_sqrt_alpha if sample.device.type == "cuda" else x0 / sqrt_alpha
        r = sched.config.clip_sample_range
        x0 = x0.clamp(-r, r)
        direction = dir_coef * eps
        return sqrt_alpha_prev * x0 + direction

    @staticmethod
    def _guide(cond: torch.Tensor, uncond: torch.Tensor, scale: float, rescale: float) -> torch.Tensor:
        """Classifier-free guidance with upstream's guidance rescale (diffusers' rescale_noise_cfg)."""
        out = uncond + scale * (cond - uncond)
        if rescale > 0:
            out = rescale_noise_cfg(out, cond, guidance_rescale=rescale)
        return out

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """[B, 4, T, h, w] -> [B, 3, T, H, W], one VAE decode per frame (upstream perframe_ae)."""
        frames = []
        for k in range(latents.shape[2]):
            with label(f"VAE_Decode_Frame_{k}"):
                frames.append(self.decode_step(latents[:, :, k].contiguous()))  # one layout for every frame
        return torch.stack(frames, dim=2)

    def decode_step(self, latent: torch.Tensor) -> torch.Tensor:
        """One frame's latent [B, 4, h, w] -> [B, 3, H, W] (the step decoder variants compile or capture)."""
        return decode_frame(self.vae, latent, self.preset.scale_factor)

    # --- the iteration ------------------------------------------------------------------------------
    @torch.no_grad()
    def run_iteration(self, inputs: WMAInputs, *, ddim_steps: int | None = None, guidance_scale: float | None = None,
                      guidance_rescale: float | None = None, eta: float | None = None, decode_decision: bool = True,
                      save_dir=None, progress: bool = True, solver: str = "ddim", decision_steps: int | None = None,
                      world_steps: int | None = None, world_actions: torch.Tensor | None = None) -> WMAOutput:
        """One interaction iteration (decision pass, then world-model pass); parameters checked first.

        Sampling (notebook 03): `solver` 'ddim' (the reference), 'dpmsolver++' or 'unipc' for both passes;
        `decision_steps` / `world_steps` the steps of each pass (None: `ddim_steps`, itself None: the preset's)."""
        p = self.preset
        steps, gs, gr, eta = check_run_params(p, ddim_steps, guidance_scale, guidance_rescale, eta)
        check_solver(solver, WMA_SOLVERS)
        d_steps = steps if decision_steps is None else check_steps(decision_steps, p.num_train_timesteps,
                                                                   "decision_steps")
        w_steps = steps if world_steps is None else check_steps(world_steps, p.num_train_timesteps, "world_steps")
        if not isinstance(decode_decision, bool):
            raise ValueError(f"decode_decision={decode_decision!r} is not allowed; allowed values: [True, False]")
        check_world_actions(p, world_actions, inputs.observation_images.shape[0])
        dev = self.device
        guided = gs != 1.0
        timer = DeviceTimer(dev)
        if dev.type == "cuda":
            torch.cuda.reset_peak_memory_stats(dev)
        gen = torch.Generator(dev).manual_seed(inputs.seed + 1)
        kw = dict(guidance_scale=gs, guidance_rescale=gr, eta=eta, gen=gen, timer=timer, progress=progress,
                  solver=solver)
        timer.mark("start")
        with label(ITERATION_LABEL):
            with label("1_Conditioning_Prep"):
                cond = self.condition(inputs, gen, guided)
            timer.mark("conditioned")
            with label("2_Decision_Pass"):
                unc = None
                if guided:  # unconditional branch: empty prompt, image tokens of a blank frame
                    zero = cond.state.new_zeros(cond.state.shape[0], p.horizon, cond.state.shape[2])
                    unc = self.model.build_context(cond.state, zero, cond.empty_text, cond.uncond_image)
                decision = self.sample_pass("2", cond, cond.decision_context, unc, inputs, decode=decode_decision,
                                            steps=d_steps, **kw)
            timer.mark("decided")
            with label("3_World_Model_Pass"):
                with label("3.0_Action_Embedding"):
                    # the decision pass's action chunk becomes the action tokens; no text (empty prompt)
                    raw = decision.actions if world_actions is None else world_actions
                    actions = self.model.embed_action(raw)
                    ctx = self.model.build_context(cond.state, actions, cond.empty_text, cond.image)
                    unc = self.model.build_context(cond.state, actions, cond.empty_text, cond.uncond_image) \
                        if guided else None
                world = self.sample_pass("3", cond, ctx, unc, inputs, decode=True, steps=w_steps, actions=raw, **kw)
            timer.mark("simulated")
            paths = {}
            if save_dir is not None:
                with label("4_Save_Results"):
                    paths = self.save(decision, world, save_dir)
            timer.mark("end")
        timer.synchronize()
        out = WMAOutput(decision=decision, world=world, ddim_steps=steps, forwards_per_step=2 if guided else 1,
                        timesteps=self.scheduler.timesteps.tolist(), paths=paths, solver=solver,
                        decision_steps=d_steps, world_steps=w_steps)
        self._fill_pass_times(decision, timer, "2", d_steps, "conditioned", "decided")
        self._fill_pass_times(world, timer, "3", w_steps, "decided", "simulated")
        out.conditioning_ms = timer.elapsed_ms("start", "conditioned")
        out.save_ms = timer.elapsed_ms("simulated", "end")
        out.iteration_ms = timer.elapsed_ms("start", "end")
        if dev.type == "cuda":
            out.peak_memory_bytes = int(torch.cuda.max_memory_allocated(dev))
        return out

    @staticmethod
    def _fill_pass_times(res: PassOutput, timer: DeviceTimer, tag: str, n: int, start: str, end: str) -> None:
        prev = f"{tag}_sampling"
        for j in range(n):
            res.forward_ms.append(timer.elapsed_ms(prev, f"{tag}_f{j}"))
            res.update_ms.append(timer.elapsed_ms(f"{tag}_f{j}", f"{tag}_s{j}"))
            res.step_ms.append(timer.elapsed_ms(prev, f"{tag}_s{j}"))
            prev = f"{tag}_s{j}"
        res.sampling_ms = timer.elapsed_ms(f"{tag}_sampling", prev)
        res.decode_ms = timer.elapsed_ms(prev, f"{tag}_decoded")
        res.pass_ms = timer.elapsed_ms(start, end)

    # --- 4. save ----------------------------------------------------------------------------------
    def save(self, decision: PassOutput, world: PassOutput, save_dir, fps: int = 8, max_side: int = 256) -> dict:
        """Small GIFs of the decoded videos and the action/state chunks (.npz), each written atomically."""
        d = Path(save_dir)
        d.mkdir(parents=True, exist_ok=True)
        paths = {}
        for name, res in (("decision", decision), ("world_model", world)):
            if res.frames is not None:
                paths[name] = export_gif(to_uint8_video(res.frames), d / f"{name}.gif", fps=fps, max_side=max_side)
        arrays = {"actions": decision.actions.float().cpu().numpy(), "states": world.states.float().cpu().numpy()}
        with atomic_open(d / "actions_states.npz", "wb") as f:
            np.savez(f, **arrays)
        paths["actions_states"] = d / "actions_states.npz"
        return paths

    # --- conveniences -----------------------------------------------------------------------------
    def run(self, *, seed: int = 0, save_dir=None, progress: bool = True, **kw) -> tuple[WMAInputs, WMAOutput]:
        """prepare + one labelled iteration (kw: ddim_steps, guidance_scale, guidance_rescale, eta, decode_decision,
        solver, decision_steps, world_steps)."""
        inputs = self.prepare(seed=seed)
        return inputs, self.run_iteration(inputs, save_dir=save_dir, progress=progress, **kw)



def to_uint8_video(frames: torch.Tensor) -> np.ndarray:
    """[B, 3, T, H, W] in [-1, 1] -> uint8 [T, H, W, 3] of the first sample (upstream clamps, then scales)."""
    video = ((frames[0].float().clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)
    return video.permute(1, 2, 3, 0).cpu().numpy()
