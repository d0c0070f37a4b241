"""The two training objectives, each on the pipeline's own modules and conventions.

mg2 (flow matching, teacher forcing through the block-causal mask): a batch of clips of `blocks` blocks; one block
index j per step (uniform). The model sees the clean latents of blocks 0 .. j-1 at t = 0 and block j noised,
x_t = (1 - sigma) x0 + sigma * eps, in one full-sequence forward with the block-causal (windowed) mask; the loss is
the MSE of the flow against eps - x0 on block j only. What the model outputs follows the preset's `prediction`:
"flow" (the reference presets' convention) or "x0" (the world presets: the flow is (x_t - x0_hat) / sigma, so the
loss is |x0_hat - x0|^2 / sigma^2 with sigma clamped at SIGMA_MIN; Li & He 2025). Why x0: a 2x2 patch of the
space-to-depth latents is 768 numbers out of a 256-wide token, and a flow target carries the noise, which a rank-256
read-out cannot reproduce (a flow-predicting world-mg2 plateaued at flow loss 0.85 on the H100, above the 2/3 of the
unit noise variance it cannot represent, and sampled noisy frames: 14.5 dB, SSIM 0.05); the clean latents can. This is
exactly what inference computes: there the
past blocks' keys and values come from the cache-refresh pass at t = 0 on the clean block, which attends to the
earlier blocks through the same window, so the masked forward on the clean prefix reproduces the cache contents
(teacher forcing: the clean prefix is ground truth, not the model's own earlier output). sigma is drawn like the
shifted inference schedule: u ~ U(0, 1), sigma = shift u / (1 + (shift - 1) u). Conditioning as the pipeline builds
it: first-frame latent + mask (cond_concat), the frozen CLIP tokens of the first frame, the true keyboard and mouse.

wma (v-prediction on the reference schedule): windows of n_obs observed frames + T future frames. The video target
is the codec latent of the T future frames (times scale_factor); t ~ U{0 .. 999}; as DynamiCrafter trains with
use_dynamic_rescale, x0 is first scaled by scale_arr[t] (1 -> base_scale, what the sampler's pred-x0 rescale undoes);
x_t and the v target use the alphas of `wmbook.pipelines.ddim.video_scheduler` (zero-terminal-SNR scaled-linear).
With the world preset's model_output "x0" the UNet's video output is x0_hat ("x0-residual": x0_hat minus the last
observed frame's latent, the cond_latent the UNet gets beside x_t) and the loss is the v error it implies,
|x0_hat - x0|^2 / (1 - alpha_bar_t), with sqrt(1 - alpha_bar_t) clamped at SIGMA_MIN (the pipeline converts x0_hat to
v for its samplers; wmbook.pipelines.ddim). The world preset turns use_dynamic_rescale off (wmbook.presets). The UNet's
dropout is set to 0 for training.
A share `decision_fraction` of the samples (default half) are decision passes (action tokens zeroed, the instruction)
and train the action head on the true action chunk; the others are world-model passes (the true actions as action
tokens, empty prompt) and train the state head on the future states; the heads are epsilon predictions on
`head_scheduler`'s alphas at the same t, weighted 0.1.
The video loss applies to both kinds.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..presets import WMAPreset
from ..world.env import agent_colour, strided_actions
from .data import EpisodeBank


def change_weights(x0: torch.Tensor, prev: torch.Tensor, strength: float) -> torch.Tensor | float:
    """Per-position loss weights [B, 1, F, h, w] for latents x0 [B, C, F, h, w] whose previous frames are prev (same
    shape): 1 + strength * d / mean(d), d the mean over channels of |x0 - prev|, the mean per sample. Positions that
    change (the agent, edges the view pans over) then count more than the static background that dominates an
    unweighted MSE; a sample with no change gets weight 1 everywhere. strength 0: the plain MSE (returns 1.0)."""
    if not strength:
        return 1.0
    d = (x0 - prev).abs().mean(dim=1, keepdim=True)
    return 1.0 + strength * d / d.mean(dim=(2, 3, 4), keepdim=True).clamp(min=1e-6)


def agent_cells(frames_u8: torch.Tensor, spatial: int) -> torch.Tensor:
    """float [B, T, H/spatial, W/spatial]: 1 at the latent cells that hold any of the agent's pixels in uint8 frames
    [B, T, H, W, 3] (wmbook.world.env.agent_colour), and at the cells around them (one cell of margin: the sprite's
    dark rim and a latent cell's receptive field), 0 elsewhere."""
    f = frames_u8.to(torch.int16)
    m = agent_colour(f[..., 0], f[..., 1], f[..., 2]).float()  # [B, T, H, W]
    b, t = m.shape[:2]
    m = F.max_pool2d(m.flatten(0, 1)[:, None], spatial)
    m = F.max_pool2d(m, 3, stride=1, padding=1)
    return m.view(b, t, *m.shape[-2:])


def agent_weights(now: torch.Tensor, before: torch.Tensor, strength: float) -> torch.Tensor | float:
    """Per-position loss weights [B, 1, F, h, w] from agent_cells of each target latent frame (`now`, [B, F, h, w])
    and of the frame before it (`before`): 1 + strength where the agent is or was (the change has to draw it at the
    new place and erase it at the old one), 1 elsewhere. Unlike change_weights it is not normalised per sample: the
    agent's cells (about 8% of a world frame's, margin and old place included) get a fixed emphasis whether or not
    the view pans, and every other cell keeps weight 1 (change_weights, normalised by the sample's mean change,
    spreads its weight over every textured cell a pan moves: data/weights/README.md, run n). strength 0: the plain
    MSE (returns 1.0)."""
    if not strength:
        return 1.0
    return 1.0 + strength * torch.maximum(now, before)[:, None]


def window_frames(p) -> int:
    """Rendered frames one training sample spans at preset p: 1 + 4(F - 1) (causal DiT, F latent frames of
    default_blocks blocks) or n_obs + frames frames `frame_stride` apart (WMA): (n_obs + frames - 1) stride + 1."""
    from ..models.vae import pixel_frames_for  # noqa: PLC0415  heavy: diffusers (data workers)

    if isinstance(p, WMAPreset):
        return (p.n_obs_steps + p.frames - 1) * p.frame_stride + 1
    return pixel_frames_for(p.default_blocks * p.num_frame_per_block, True)


def check_episode_frames(episode_frames: int, window: int) -> None:
    if episode_frames < window:
        raise ValueError(f"episode_frames={episode_frames} is not allowed; allowed values: an integer >= {window} "
                         f"(the frames one training sample spans)")


class Mg2Objective:
    """Flow-matching teacher forcing of the causal DiT (see the module docstring)."""

    SIGMA_MIN = 0.05  # x-prediction: the flow loss's 1 / sigma^2 weight is capped at 1 / SIGMA_MIN^2

    def __init__(self, pipe, bank: EpisodeBank, blocks: int | None = None, change_weight: float = 0.0,
                 sigma_min: float | None = None, agent_weight: float = 0.0):
        from ..models.vae import pixel_frames_for  # noqa: PLC0415  heavy: diffusers (data workers)

        p = pipe.preset
        self.change_weight, self.agent_weight = change_weight, agent_weight
        if sigma_min is not None:
            self.SIGMA_MIN = sigma_min
        self.pipe, self.bank, self.p = pipe, bank, p
        self.k = p.num_frame_per_block
        self.blocks = p.default_blocks if blocks is None else blocks
        if isinstance(self.blocks, bool) or not isinstance(self.blocks, int) or self.blocks < 1:
            raise ValueError(f"blocks={blocks!r} is not allowed; allowed values: a positive integer")
        if p.local_attn_size == -1 and self.blocks * self.k > p.max_latent_frames:
            raise ValueError(f"blocks={self.blocks} does not fit preset {p.name!r}'s KV cache")
        self.latent_frames = self.blocks * self.k
        self.pixel_frames = pixel_frames_for(self.latent_frames, True)
        check_episode_frames(bank.length, self.pixel_frames)
        self.model = pipe.model

    def parameters(self):
        return self.model.parameters()

    def sample_batch(self, gen: torch.Generator, batch: int) -> dict:
        e, idx = self.bank.windows(gen, batch, self.pixel_frames)
        return {"frames": self.bank.frames[e[:, None], idx], "keyboard": self.bank.keyboard[e[:, None], idx],
                "mouse": self.bank.mouse[e[:, None], idx]}

    @torch.no_grad()
    def encode(self, frames_u8: torch.Tensor):
        """(normalised latents [B, C, F, h, w], cond_concat [B, 4 + C, F, h, w], CLIP context) as the pipeline."""
        from ..models.vae import encode_first_frame, normalize_latents  # noqa: PLC0415  heavy: diffusers

        pipe = self.pipe
        video = EpisodeBank.to_video(frames_u8)  # [B, 3, T, H, W]
        z = normalize_latents(pipe.vae, pipe.vae.encode(video.to(pipe.vae.dtype)).latent_dist.mode()).float()
        img = video[:, :, 0]
        b, _, f, h, w = z.shape
        lat = encode_first_frame(pipe.vae, img.to(pipe.vae.dtype), f).float()
        mask = torch.zeros(b, 4, f, h, w, device=z.device)
        mask[:, :, 0] = 1
        ctx = pipe.clip(img) if pipe.clip is not None else None
        return z, torch.cat([mask, lat], dim=1), ctx

    def loss(self, batch: dict, gen: torch.Generator, j: int | None = None):
        p, k = self.p, self.k
        z, cond, ctx = self.encode(batch["frames"])
        b = z.shape[0]
        dev = z.device
        if j is None:
            j = int(torch.randint(0, self.blocks, (1,), generator=gen, device=dev))
        n = (j + 1) * k
        x0 = z[:, :, j * k:n]
        eps = torch.randn(x0.shape, generator=gen, device=dev)
        u = torch.rand(b, generator=gen, device=dev)
        sigma = p.shift * u / (1 + (p.shift - 1) * u)
        s = sigma.view(b, 1, 1, 1, 1)
        x = torch.cat([z[:, :, :j * k], (1 - s) * x0 + s * eps], dim=2)
        tt = torch.zeros(b, n, device=dev)
        tt[:, j * k:] = 1000.0 * sigma[:, None]
        actions = {"keyboard": batch["keyboard"], "mouse": batch["mouse"]}
        out = self.model(x, tt, ctx, cond_concat=cond[:, :, :n], actions=actions, cache=None, start_frame=0)
        out = out[:, :, j * k:].float()
        if getattr(p, "prediction", "flow") == "x0":
            # x-prediction, flow loss (Li & He 2025): flow_hat = (x_t - x0_hat) / sigma, so the flow error is the x0
            # error over sigma; sigma is clamped at SIGMA_MIN so the rare near-clean draws do not dominate
            w = 1.0 / s.clamp(min=self.SIGMA_MIN) ** 2
            if self.change_weight:  # each target frame's previous latent frame (block 0's first: itself)
                prev = z[:, :, j * k - 1:n - 1] if j else torch.cat([z[:, :, :1], z[:, :, :n - 1]], dim=2)
                w = w * change_weights(x0, prev, self.change_weight)
            if self.agent_weight:  # latent frame i >= 1 spans pixel frames 4i - 3 .. 4i (the causal VAE's grouping)
                cells = agent_cells(batch["frames"], p.codec_spatial)
                lat = torch.cat([cells[:, :1], cells[:, 1:].unflatten(1, (-1, 4)).amax(dim=2)], dim=1)
                before = lat[:, j * k - 1:n - 1] if j else torch.cat([lat[:, :1], lat[:, :n - 1]], dim=1)
                w = w * agent_weights(lat[:, j * k:n], before, self.agent_weight)
            x0_err = (out - x0) ** 2
            loss = (w * x0_err).mean()
            return loss, {"flow_mse": loss.detach(), "x0_mse": x0_err.mean().detach()}
        loss = F.mse_loss(out, eps - x0)
        return loss, {"flow_mse": loss.detach()}


class WMAObjective:
    """v-prediction of the video UNet (+ both heads) on the reference schedule (see the module docstring)."""

    HEAD_WEIGHT = 0.1
    SIGMA_MIN = 0.05  # x-prediction: the v loss's 1 / (1 - alpha_bar) weight is capped at 1 / SIGMA_MIN^2 (a larger
    # floor, `--sigma-min`, caps the weight of the nearly clean draws lower: min-SNR weighting, Hang et al. 2023)

    def __init__(self, pipe, bank: EpisodeBank, change_weight: float = 0.0, sigma_min: float | None = None,
                 decision_fraction: float = 0.5, agent_weight: float = 0.0):
        from ..pipelines.ddim import (  # noqa: PLC0415  heavy: diffusers
            DEFAULT_INSTRUCTION,
            dynamic_rescale,
            head_scheduler,
            video_scheduler,
        )

        p = pipe.preset
        self.pipe, self.bank, self.p = pipe, bank, p
        self.change_weight, self.agent_weight = change_weight, agent_weight
        if sigma_min is not None:
            self.SIGMA_MIN = sigma_min
        if not 0 <= decision_fraction <= 1:
            raise ValueError(f"decision_fraction={decision_fraction!r} is not allowed; allowed values: a number in [0, "
                             "1]")
        self.decision_fraction = float(decision_fraction)
        self.model = pipe.model
        dev = pipe.device
        self.ab = video_scheduler(p).alphas_cumprod.to(dev, torch.float32)
        self.ab_head = head_scheduler(p).alphas_cumprod.to(dev, torch.float32)
        self.rescale = torch.tensor([dynamic_rescale(p, t) if p.use_dynamic_rescale else 1.0
                                     for t in range(p.num_train_timesteps)], device=dev, dtype=torch.float32)
        with torch.no_grad():
            self.text_empty = pipe.text([""]).float()
            self.text_instr = pipe.text([DEFAULT_INSTRUCTION]).float()
        self.window, self.stride = p.n_obs_steps + p.frames, p.frame_stride
        check_episode_frames(bank.length, window_frames(p))
        # the UNet's 0.1 dropout (upstream's fine-tuning setting) only slows a minutes-long run on unlimited rendered
        # data; inference (eval mode) never drops, so this changes training only
        for mod in self.model.modules():
            if isinstance(mod, torch.nn.Dropout):
                mod.p = 0.0
        if getattr(p, "model_output", None) == "x0-residual":
            # the change from the last frame starts at zero: the untrained model predicts copy-last (upstream's UNets
            # zero-initialise this conv too; the benchmark presets keep random weights so that their outputs are not 0)
            conv = self.model.diffusion_model.out[-1]
            torch.nn.init.zeros_(conv.weight)
            torch.nn.init.zeros_(conv.bias)

    def parameters(self):
        return self.model.parameters()

    def sample_batch(self, gen: torch.Generator, batch: int) -> dict:
        bk = self.bank
        e, idx = bk.windows(gen, batch, self.window, stride=self.stride)
        # step j's action: the mean over the rendered frames it spans (the window's last frame takes none: zeros)
        acts = strided_actions(bk.action[e], idx[:, 0], self.window - 1, self.stride)
        acts = torch.cat([acts, acts.new_zeros(batch, 1, acts.shape[-1])], dim=1)
        return {"frames": bk.frames[e[:, None], idx], "state": bk.state[e[:, None], idx], "action": acts}

    def encode_frames(self, video: torch.Tensor) -> torch.Tensor:
        """[B, 3, T, H, W] -> scaled codec latents [B, C, T, h, w] (per frame, as the pipeline encodes)."""
        from ..models.wma.vae import encode_frame  # noqa: PLC0415  heavy: diffusers

        b, _, t = video.shape[:3]
        flat = video.transpose(1, 2).flatten(0, 1)
        z = encode_frame(self.pipe.vae, flat, self.p.scale_factor).float()
        return z.unflatten(0, (b, t)).transpose(1, 2)

    def loss(self, batch: dict, gen: torch.Generator, decision: torch.Tensor | None = None):
        p, m, pipe = self.p, self.model, self.pipe
        n_obs, T = p.n_obs_steps, p.frames
        video = EpisodeBank.to_video(batch["frames"])  # [B, 3, n_obs + T, H, W]
        b, dev = video.shape[0], video.device
        obs = video[:, :, :n_obs]
        last = obs[:, :, -1]
        with torch.no_grad():
            x0 = self.encode_frames(video[:, :, n_obs:])
            cond_latent = self.encode_frames(last[:, :, None]).expand(-1, -1, T, -1, -1)
            clip = pipe.clip(last)
        obs_states = batch["state"][:, :n_obs]
        fut_states = batch["state"][:, n_obs:]
        acts = batch["action"][:, n_obs - 1:n_obs - 1 + T]  # taken at the last observed frame and after it
        if decision is None:
            decision = torch.rand(b, generator=gen, device=dev) < self.decision_fraction
        dm = decision.view(b, 1, 1).float()
        state = m.embed_state(obs_states)
        act_tok = m.embed_action(acts) * (1 - dm)  # decision pass: action tokens zeroed
        text = self.text_instr.expand(b, -1, -1) * dm + self.text_empty.expand(b, -1, -1) * (1 - dm)
        ctx = m.build_context(state, act_tok, text, m.embed_image(clip))

        t = torch.randint(0, p.num_train_timesteps, (b,), generator=gen, device=dev)
        ab = self.ab[t].view(b, 1, 1, 1, 1)
        x0 = x0 * self.rescale[t].view(b, 1, 1, 1, 1)
        eps = torch.randn(x0.shape, generator=gen, device=dev)
        x_t = ab.sqrt() * x0 + (1 - ab).sqrt() * eps
        v = ab.sqrt() * eps - (1 - ab).sqrt() * x0
        abh = self.ab_head[t].view(b, 1, 1)
        ea = torch.randn(acts.shape, generator=gen, device=dev)
        es = torch.randn(fut_states.shape, generator=gen, device=dev)
        a_t = abh.sqrt() * acts + (1 - abh).sqrt() * ea
        s_t = abh.sqrt() * fut_states + (1 - abh).sqrt() * es
        fs = torch.full((b,), p.default_fs, dtype=torch.long, device=dev)
        raw = {"actions": acts * (1 - dm)} if p.action_embedding else {}  # the decision pass: zeros, as its tokens
        out, ea_hat, es_hat = m(x_t, cond_latent, a_t, s_t, t, ctx, obs, obs_states, fs, **raw)
        extra = {}
        kind = getattr(p, "model_output", "v")
        if kind in ("x0", "x0-residual"):
            # x-prediction, v loss: v_hat = (sqrt(ab) x_t - x0_hat) / sqrt(1 - ab), so the v error is the x0 error
            # over sqrt(1 - ab), clamped at SIGMA_MIN (Li & He 2025); x0-residual: x0_hat = output + last frame
            x0_hat = out.float() + (cond_latent.float() if kind == "x0-residual" else 0.0)
            x0_err = (x0_hat - x0) ** 2
            w = 1.0 / (1 - ab).sqrt().clamp(min=self.SIGMA_MIN) ** 2
            if self.change_weight:  # each future frame's previous frame: the last observed one, then the future ones
                prev = torch.cat([cond_latent[:, :, :1].float(), x0[:, :, :-1]], dim=2)
                w = w * change_weights(x0, prev, self.change_weight)
            if self.agent_weight:  # each future frame's cells, and its previous frame's (the last observed one first)
                cells = agent_cells(batch["frames"], p.codec_spatial)
                w = w * agent_weights(cells[:, n_obs:], cells[:, n_obs - 1:-1], self.agent_weight)
            v_loss = (w * x0_err).mean()
            extra["x0_mse"] = x0_err.mean().detach()
        else:
            v_loss = F.mse_loss(out.float(), v)
        d = decision.float()
        a_loss = ((ea_hat.float() - ea) ** 2).mean(dim=(1, 2))
        s_loss = ((es_hat.float() - es) ** 2).mean(dim=(1, 2))
        head = (d * a_loss + (1 - d) * s_loss).mean()
        loss = v_loss + self.HEAD_WEIGHT * head
        return loss, {"v_mse": v_loss.detach(), "head_mse": head.detach(), **extra}
