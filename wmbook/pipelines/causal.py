"""Matrix-Game-2 / Self-Forcing block-autoregressive streaming loop, labelled (DESIGN.md hierarchy).

Per block: denoising steps on the shift-5 flow-matching schedule (x0 prediction, re-noise toward the
next timestep), the cache-refresh pass on the clean prediction at t=0, then streaming VAE decode.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from diffusers import FlowMatchEulerDiscreteScheduler
from PIL import Image
from tqdm.auto import tqdm

from ..atomic import atomic_open
from ..bench import DeviceTimer, stream_metrics
from ..models.causal_wan import DIT_FORWARD_LABEL, CausalWanModel, GenerationCache, load_checkpoint
from ..models.clip import ClipImageEncoder
from ..models.vae import StreamingWanDecoder, build_wan_vae, encode_first_frame, pixel_frames_for, wan_vae_config
from ..presets import CausalWanPreset, get_preset, resolve_device, resolve_dtype
from ..profiling.labels import label
from .solvers import FLOW_SOLVERS, FlowStepper, check_shift, check_solver, check_step_list


def warped_timesteps(steps, shift: float = 5.0, num_train_timesteps: int = 1000) -> list[float]:
    """Map nominal steps (e.g. [1000, 666, 333]) onto the shifted flow-matching schedule, as upstream:
    t = scheduler.timesteps[1000 - step] with diffusers' FlowMatchEulerDiscreteScheduler(shift)."""
    sched = FlowMatchEulerDiscreteScheduler(num_train_timesteps=num_train_timesteps, shift=shift)
    table = torch.cat([sched.timesteps.float().cpu(), torch.zeros(1)])
    for s in steps:
        if not 0 < int(s) <= num_train_timesteps:
            raise ValueError(f"denoising step {s} outside (0, {num_train_timesteps}]")
    return [float(table[num_train_timesteps - int(s)]) for s in steps]


@dataclass
class StreamInputs:
    """Everything data preparation produces for one generation."""

    num_blocks: int
    seed: int
    noise: torch.Tensor  # [B, 16, F, h, w]
    context: torch.Tensor  # CLIP tokens [B, 257, 1280] (i2v) or text tokens [B, 512, 4096] (t2v)
    cond_concat: torch.Tensor | None = None  # [B, 20, F, h, w]: 4 mask + 16 first-frame latent channels
    actions: dict | None = None  # {"mouse": [B, N_pix, 2], "keyboard": [B, N_pix, 4]}
    image: torch.Tensor | None = None  # [B, 3, H, W] in [-1, 1]


@dataclass
class StreamOutput:
    frames: torch.Tensor | None  # [B, 3, T, H, W] in [-1, 1] (None when decode=False)
    latents: torch.Tensor  # [B, 16, F, h, w] clean predictions
    block_ms: list[float] = field(default_factory=list)
    forward_ms: list[list[float]] = field(default_factory=list)  # per block: each DiT forward (steps + refresh)
    decode_ms: list[float] = field(default_factory=list)
    frames_per_block: list[int] = field(default_factory=list)
    first_frame_ms: float = float("nan")
    total_ms: float = float("nan")
    peak_memory_bytes: int | None = None

    def metrics(self, steady_from: int = 1) -> dict:
        return stream_metrics(self.block_ms, self.frames_per_block, self.first_frame_ms, steady_from=steady_from)


class CausalStreamingPipeline:
    """Reference streaming pipeline: model, VAE decoder, CLIP encoder at a preset's shapes (random weights).

    preset, device, dtype and vae_dtype take objects (a Preset, torch.device, torch.dtype) or their names.
    """

    decode_before_refresh = False  # the decode-first variant (wmbook.variants.swaps.DecodeBeforeRefresh) sets it
    stream_frames = False  # the stream-frames variant (swaps.FramesPerLatentFrame) sets it

    def __init__(self, preset: str | CausalWanPreset = "tiny", device="auto", dtype="auto", vae_dtype="auto",
                 seed: int = 0, checkpoint: str | None = None, use_ema: bool = False):
        self.preset = preset if isinstance(preset, CausalWanPreset) else get_preset(preset)
        self.device = resolve_device(device)
        self.dtype = resolve_dtype(dtype, self.device)
        self.vae_dtype = self.dtype if str(vae_dtype) == "auto" else resolve_dtype(vae_dtype, self.device)
        p = self.preset
        torch.manual_seed(seed)
        with torch.device(self.device):  # initialise on the target device: seconds, not minutes, at 1.6 B params
            self.model = CausalWanModel(p).eval().requires_grad_(False)
        if checkpoint:
            load_checkpoint(self.model, checkpoint, use_ema=use_ema)  # `generator` unless use_ema, as upstream
        self.model.to(self.dtype)
        self.vae = build_wan_vae(wan_vae_config(p.vae), dtype=self.vae_dtype, device=self.device, seed=seed)
        self.decoder = StreamingWanDecoder(self.vae)
        self.clip = None
        if p.model_type == "i2v":
            self.clip = ClipImageEncoder(p.clip, dtype=self.dtype, device=self.device, seed=seed)
        self.timesteps = warped_timesteps(p.denoising_steps, p.shift)

    # --- 1. data preparation -----------------------------------------------------------------
    def prepare(self, num_blocks: int | None = None, image=None, seed: int = 0, batch: int = 1) -> StreamInputs:
        """Image, first-frame VAE latent, conditions, CLIP or text context, noise, action sequences."""
        p = self.preset
        num_blocks = p.default_blocks if num_blocks is None else num_blocks
        if not isinstance(num_blocks, int) or num_blocks < 1:
            raise ValueError(f"num_blocks={num_blocks!r} must be a positive integer")
        dev, dt = self.device, self.dtype
        f = num_blocks * p.num_frame_per_block
        h, w = p.latent_hw
        gen = torch.Generator("cpu").manual_seed(seed)
        with label("1_Data_Preparation"):
            img = cond = None
            with label("1.1_Image_Loading_Resize"):
                img = load_image(image, p.height, p.width, gen).to(dev).expand(batch, -1, -1, -1)
            if p.model_type == "i2v":
                with label("1.2_VAE_Encode_FirstFrame"), torch.no_grad():
                    img_lat = encode_first_frame(self.vae, img.to(self.vae_dtype), f).to(dt)  # [B, 16, F, h, w]
                with label("1.3_Condition_Preparation"):
                    mask = torch.zeros(batch, 4, f, h, w, device=dev, dtype=dt)
                    mask[:, :, 0] = 1
                    cond = torch.cat([mask, img_lat], dim=1)
                with label("1.4_CLIP_Visual_Context"), torch.no_grad():
                    context = self.clip(img.to(dt))
            else:
                with label("1.4_Text_Context"):  # stand-in for the umT5 encoder output
                    context = torch.randn(batch, p.text_len, p.text_dim, generator=gen).to(dev, dt)
            with label("1.5_Noise_Sampling"):
                noise = torch.randn(batch, p.out_dim, f, h, w, generator=gen).to(dev, dt)  # 16 but for the world codec
            actions = None
            if p.action is not None:
                with label("1.6_Action_Conditions_Setup"):
                    actions = make_actions(batch, pixel_frames_for(f, True), p.action, gen)
                    actions = {k: v.to(dev, dt) for k, v in actions.items()}
        return StreamInputs(num_blocks=num_blocks, seed=seed, noise=noise, context=context, cond_concat=cond,
                            actions=actions, image=img)

    # --- 2. streaming inference ----------------------------------------------------------------
    def init_cache(self, inputs: StreamInputs) -> GenerationCache:
        """The caches of one generation: self-attention KV and action KV per layer; the cross-attention K/V are
        filled by the first forward, as upstream does."""
        return self.model.init_cache(inputs.noise.shape[0], self.device, self.dtype)

    def generation_cache(self, inputs: StreamInputs) -> GenerationCache:
        """The caches a generation runs on (`generate`, and wmbook.distributed's pipeline stages): fresh ones here;
        the static-caches variant hands out one set, reset in place, whose addresses captured graphs read."""
        return self.init_cache(inputs)

    def denoise(self, x, t: float, inputs: StreamInputs, cache: GenerationCache, start_frame: int):
        """One DiT forward on one block plus the flow -> x0 conversion."""
        sl = slice(start_frame, start_frame + x.shape[2])
        with label(DIT_FORWARD_LABEL):
            tt = torch.full((x.shape[0], x.shape[2]), t, device=x.device, dtype=torch.float32)
            cond = inputs.cond_concat[:, :, sl] if inputs.cond_concat is not None else None
            flow = self.model(x, tt, inputs.context, cond_concat=cond, actions=inputs.actions, cache=cache,
                              start_frame=start_frame)
        with label("Flow_to_X0_Conversion"):
            if getattr(self.preset, "prediction", "flow") == "x0":  # world presets: the model predicts x0 itself
                return flow.to(x.dtype)
            x0 = (x.float() - (t / 1000.0) * flow.float()).to(x.dtype)  # flow = noise - x0, x_t = x0 + sigma*flow
        return x0

    def sampling_timesteps(self, denoising_steps=None, shift=None) -> list[float]:
        """The warped timesteps of one block: the preset's (`self.timesteps`) unless a step list or shift is given
        (checked: ValueError naming the parameter)."""
        if denoising_steps is None and shift is None:
            return self.timesteps

        p = self.preset
        steps = check_step_list(p.denoising_steps if denoising_steps is None else denoising_steps)
        return warped_timesteps(steps, p.shift if shift is None else check_shift(shift))

    @torch.no_grad()
    def generate(self, inputs: StreamInputs, *, decode: bool = True, progress: bool = True, denoising_steps=None,
                 shift: float | None = None, solver: str = "renoise", on_block=None, on_frames=None) -> StreamOutput:
        """Run all blocks; timings come from device events (no host sync inside the loop).

        Sampling (notebook 03; defaults: the preset's): `denoising_steps` nominal steps per block (e.g. [1000, 500]),
        `shift` of the flow-matching warp, `solver` 'renoise' (the reference), 'euler' or 'unipc' (wmbook.pipelines.
        solvers explains what each does and what is comparable). `on_block(bi, x0)`: called with each block's clean
        latents as soon as they are queued (wmbook.distributed sends them to a decoder rank): with decode-first before
        the block's cache refresh, as its decode would be, else after it. `on_frames(frames)`:
        called with pixel frames as soon as they are queued: a block's, or with stream_frames (the stream-frames
        variant) each latent frame's, so the stream's first frame leaves after one latent frame's decode."""
        p = self.preset
        dev = self.device
        k = p.num_frame_per_block
        ts = self.sampling_timesteps(denoising_steps, shift)
        stepper = None if check_solver(solver, FLOW_SOLVERS) == "renoise" else FlowStepper(solver, ts)
        gen = torch.Generator(dev).manual_seed(inputs.seed + 1)
        timer = DeviceTimer(dev)
        if dev.type == "cuda":
            torch.cuda.reset_peak_memory_stats(dev)
        timer.mark("start")
        # decode_before_refresh (the decode-first variant): a block's frames are decoded before the cache-refresh
        # forward, which only the next block needs, so the frames arrive one forward sooner
        first = decode and self.decode_before_refresh
        latents, frames, fpb = [], [], []
        with label("2_Pipeline_Inference"):
            with label("2.1_KV_Cache_Initialization"):
                cache = self.generation_cache(inputs)
                self.decoder.reset()
            for bi in tqdm(range(inputs.num_blocks), desc="blocks", disable=not progress, leave=False):
                with label(f"2.3_Block_{bi}"):
                    timer.mark(f"b{bi}_start")
                    x0 = self.denoise_steps(bi, inputs, cache, ts, timer, stepper=stepper, generator=gen)
                    # with decode-first the clean latents leave before the refresh also when another rank decodes
                    # them (on_block: notebook 08's stage split sends them there), as they would be decoded here
                    if on_block is not None and self.decode_before_refresh:
                        on_block(bi, x0)
                    if not first:
                        self.refresh_cache(bi, x0, inputs, cache, timer, len(ts))
                    latents.append(x0)
                    if on_block is not None and not self.decode_before_refresh:
                        on_block(bi, x0)
                    if decode:
                        with label(f"2.3.{bi}_VAE_Decode"):
                            fr = self.decode_block(x0, timer, f"b{bi}_frames" if first else f"b{bi}_end",
                                                   self._frames_hook(timer, "b0_px" if bi == 0 else None, on_frames))
                        frames.append(fr)
                        fpb.append(fr.shape[2])
                        if on_frames is not None and not self.stream_frames:
                            on_frames(fr)
                        if first:
                            self.refresh_cache(bi, x0, inputs, cache, timer, len(ts))
                            timer.mark(f"b{bi}_end")
                    else:
                        fpb.append(pixel_frames_for(k, bi == 0))
                        timer.mark(f"b{bi}_end")
            self.decode_done()
            # the stream ends when its last frames are there: with the decode on a second stream (decode-overlap)
            # that is after the last block's end mark on the main stream (decode-first records it after the refresh)
            timer.mark("stop")
        timer.synchronize()
        out = StreamOutput(frames=torch.cat(frames, dim=2) if frames else None, latents=torch.cat(latents, dim=2),
                           frames_per_block=fpb)
        prev, n = "start", len(ts)
        for bi in range(inputs.num_blocks):
            steps = [f"b{bi}_start"] + [f"b{bi}_f{j}" for j in range(n)]
            fwd = [timer.elapsed_ms(a, c) for a, c in zip(steps[:-1], steps[1:])]
            if first:  # the last step, the decode, then the refresh
                fwd.append(timer.elapsed_ms(f"b{bi}_frames", f"b{bi}_f{n}"))
                out.decode_ms.append(timer.elapsed_ms(f"b{bi}_f{n - 1}", f"b{bi}_frames"))
            else:  # the last step, the refresh, then the decode
                fwd.append(timer.elapsed_ms(f"b{bi}_f{n - 1}", f"b{bi}_f{n}"))
                out.decode_ms.append(timer.elapsed_ms(f"b{bi}_f{n}", f"b{bi}_end"))
            out.forward_ms.append(fwd)
            out.block_ms.append(timer.elapsed_ms(prev, f"b{bi}_end"))
            prev = f"b{bi}_end"
        out.first_frame_ms = timer.elapsed_ms("start", "b0_px" if decode and self.stream_frames
                                              else "b0_frames" if first else "b0_end")
        out.total_ms = timer.elapsed_ms("start", "stop")
        if dev.type == "cuda":
            out.peak_memory_bytes = int(torch.cuda.max_memory_allocated(dev))
        return out

    def denoise_steps(self, bi: int, inputs: StreamInputs, cache: GenerationCache, ts: list[float],
                      timer: DeviceTimer, *, stepper=None, generator: torch.Generator | None = None) -> torch.Tensor:
        """Block bi's denoising steps (labels 2.3.{bi}_*): its clean latents [B, 16, k, h, w]; the cache refresh is
        `refresh_cache`. Marks b{bi}_f{j} after each forward. `stepper`: a FlowStepper (euler / unipc), else the
        reference re-noising with noise from `generator`."""
        k = self.preset.num_frame_per_block
        start = bi * k
        noisy = inputs.noise[:, :, start:start + k].contiguous()  # one stride for every forward input
        if stepper is not None:
            stepper.reset()
        for j, t in enumerate(ts):
            last = j == len(ts) - 1
            with label(f"2.3.{bi}_Denoising_Step_{j}_t{int(round(t))}"):
                with label("Generator_Forward_Final" if last else "Generator_Forward"):
                    x0 = self.denoise(noisy, t, inputs, cache, start)
                timer.mark(f"b{bi}_f{j}")
                if not last:
                    with label("Scheduler_AddNoise"):
                        if stepper is not None:  # euler / unipc (notebook 03)
                            noisy = stepper.next(j, noisy, x0)
                        else:  # re-noise to the next sigma (the reference)
                            sigma = ts[j + 1] / 1000.0
                            eps = torch.randn(x0.shape, generator=generator, device=self.device, dtype=torch.float32)
                            noisy = ((1 - sigma) * x0.float() + sigma * eps).to(x0.dtype)
        return x0

    def refresh_cache(self, bi: int, x0: torch.Tensor, inputs: StreamInputs, cache: GenerationCache,
                      timer: DeviceTimer, n_steps: int) -> None:
        """Block bi's cache-refresh forward on its clean prediction at t=0 (what the next block attends to); marks
        b{bi}_f{n_steps}."""
        with label(f"2.3.{bi}_Update_KV_Cache"):
            self.denoise(x0, 0.0, inputs, cache, bi * self.preset.num_frame_per_block)
        timer.mark(f"b{bi}_f{n_steps}")

    def decode_block(self, x0: torch.Tensor, timer: DeviceTimer, done: str, on_frames=None) -> torch.Tensor:
        """Decode one block's clean latents with the streaming decoder; marks `done` when its frames are there.
        `on_frames`: from _frames_hook (None: the block's frames come out whole)."""
        frames = self.decoder.decode_block(x0.to(self.vae_dtype), on_frames=on_frames)
        timer.mark(done)
        return frames

    def _frames_hook(self, timer: DeviceTimer, first: str | None, on_frames):
        """What the decoder calls with each latent frame's pixel frames (stream_frames): marks `first` at the first
        piece (the stream's first frame), then hands the piece to `on_frames`; without stream_frames, None (the
        block's frames go to `on_frames` whole, after the decode)."""
        if not self.stream_frames:
            return None
        pending = [first] if first else []

        def hook(frames):
            if pending:
                timer.mark(pending.pop())
            if on_frames is not None:
                on_frames(frames)

        return hook

    def decode_done(self) -> None:
        """After the last block: every decode has finished on the stream that consumes the frames (a no-op here)."""

    # --- 3./4. post-processing and export --------------------------------------------------------
    def postprocess(self, frames: torch.Tensor) -> np.ndarray:
        """[B, 3, T, H, W] in [-1, 1] -> uint8 [T, H, W, 3] of the first sample."""
        with label("3_Video_Postprocessing"):
            video = ((frames[0].float().clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)
            return video.permute(1, 2, 3, 0).cpu().numpy()

    def export(self, video: np.ndarray, path, fps: int = 16, max_side: int = 320) -> Path:
        """Write a small GIF atomically (temp file + rename)."""
        with label("4_Video_Export"):
            return export_gif(video, path, fps=fps, max_side=max_side)

    def run(self, num_blocks: int | None = None, *, seed: int = 0, export_path=None, progress: bool = True):
        """The whole labelled pipeline once: prepare -> generate -> postprocess -> export."""
        inputs = self.prepare(num_blocks, seed=seed)
        out = self.generate(inputs, progress=progress)
        video = self.postprocess(out.frames)
        path = self.export(video, export_path) if export_path else None
        return inputs, out, video, path


def load_image(image, height: int, width: int, gen: torch.Generator) -> torch.Tensor:
    """A path / PIL image / [3, H, W] tensor resized to (height, width) in [-1, 1]; None -> a seeded test card."""
    if image is None:
        yy, xx = torch.meshgrid(torch.linspace(0, 1, height), torch.linspace(0, 1, width), indexing="ij")
        phase = torch.rand(3, generator=gen) * 2 * math.pi
        img = torch.stack([torch.sin(6 * xx + 4 * yy + phase[c]) for c in range(3)])
        img = img * 0.8 + 0.1 * torch.randn(3, height, width, generator=gen)
        return img.clamp(-1, 1)[None]
    if isinstance(image, (str, os.PathLike)):
        image = Image.open(image).convert("RGB")
    if not isinstance(image, torch.Tensor):
        image = torch.from_numpy(np.asarray(image).copy()).permute(2, 0, 1).float() / 127.5 - 1
    img = image.float()[None] if image.dim() == 3 else image.float()
    return torch.nn.functional.interpolate(img, size=(height, width), mode="bilinear", antialias=True,
                                           align_corners=False).clamp(-1, 1)


def make_actions(batch: int, num_pixel_frames: int, cfg, gen: torch.Generator) -> dict:
    """Seeded keyboard (one key held per segment of 12 frames, one-hot) and smooth mouse sequences."""
    seg = 12
    n_seg = math.ceil(num_pixel_frames / seg)
    keys = torch.randint(0, cfg.keyboard_dim_in, (batch, n_seg), generator=gen)
    keyboard = torch.nn.functional.one_hot(keys, cfg.keyboard_dim_in).float().repeat_interleave(seg, 1)
    mouse = torch.cumsum(0.02 * torch.randn(batch, num_pixel_frames, cfg.mouse_dim_in, generator=gen), dim=1)
    return {"keyboard": keyboard[:, :num_pixel_frames], "mouse": mouse}


def export_gif(video: np.ndarray, path, fps: int = 16, max_side: int = 320) -> Path:
    """uint8 [T, H, W, 3] -> GIF (downscaled so the longer side is <= max_side), written atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    t, h, w, _ = video.shape
    scale = min(1.0, max_side / max(h, w))
    size = (max(1, int(w * scale)), max(1, int(h * scale)))
    imgs = [Image.fromarray(fr).resize(size) if scale < 1 else Image.fromarray(fr) for fr in video]
    with atomic_open(path, "wb") as f:
        imgs[0].save(f, format="GIF", save_all=True, append_images=imgs[1:], duration=int(1000 / fps), loop=0)
    return path
