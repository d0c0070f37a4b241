"""The Wan2.1 VAE (diffusers `AutoencoderKLWan`), driven block by block for streaming decode.

Shapes: 16 latent channels, 8x spatial and 4x temporal compression with a causal first frame:
a stream of F latent frames decodes to 1 + 4 * (F - 1) pixel frames (the first latent frame gives 1
pixel frame, every later one gives 4).

Streaming: `StreamingWanDecoder` owns its own list of causal-conv feature caches (the same
`feat_cache` / `feat_idx` convention diffusers' `AutoencoderKLWan._decode` uses internally), so the
DiT's blocks can be decoded as they arrive and the past is never re-decoded. Decoding a sequence as
blocks [3, 3, 3] gives the same frames as one `vae.decode` of all 9 latent frames.

Latent normalisation follows diffusers' WanPipeline: the DiT works on normalised latents
`(z - mean) / std`; before decoding we un-normalise with `latents / (1 / std) + mean` (the exact
expression WanPipeline uses, i.e. `z * std + mean`), with `latents_mean` / `latents_std` from the VAE
config.
"""

from __future__ import annotations

import inspect

import torch
from diffusers import AutoencoderKLWan
from diffusers.models.autoencoders import autoencoder_kl_wan as _wan

from wmbook.profiling.labels import label, labels_enabled
from wmbook.world.codec import build_video_codec, video_codec_config

__all__ = [
    "WAN21_LATENTS_MEAN",
    "WAN21_LATENTS_STD",
    "wan_vae_config",
    "build_wan_vae",
    "pixel_frames_for",
    "latent_frames_for",
    "normalize_latents",
    "unnormalize_latents",
    "StreamingWanDecoder",
    "encode_first_frame",
]

# diffusers' AutoencoderKLWan default config (the Wan2.1 VAE statistics).
WAN21_LATENTS_MEAN = [
    -0.7571, -0.7089, -0.9113, 0.1075, -0.1745, 0.9653, -0.1517, 1.5508,
    0.4134, -0.0715, 0.5517, -0.3632, -0.1922, -0.9497, 0.2503, -0.2921,
]  # fmt: skip
WAN21_LATENTS_STD = [
    2.8184, 1.4541, 2.3275, 2.6558, 1.2196, 1.7708, 2.6052, 2.0743,
    3.2687, 2.1526, 2.8652, 1.5579, 1.6382, 1.1253, 2.8251, 1.9160,
]  # fmt: skip

_CACHE_T = getattr(_wan, "CACHE_T", 2)


# ----------------------------------------------------------------------------------------------
# Config / construction
# ----------------------------------------------------------------------------------------------


def wan_vae_config(preset: str) -> dict:
    """`AutoencoderKLWan(**cfg)` kwargs.

    "real": the Wan2.1 VAE (= diffusers' default config): base_dim 96, z_dim 16, dim_mult [1,2,4,4],
        2 res blocks, temporal downsample [False, True, True]  (~127M params).
    "tiny": same structure and compression (z_dim 16, 4x temporal / 8x spatial, causal first frame)
        with base_dim 8 and 1 res block, for CPU tests.
    """
    common = dict(
        z_dim=16,
        dim_mult=[1, 2, 4, 4],
        attn_scales=[],
        temperal_downsample=[False, True, True],
        dropout=0.0,
        latents_mean=list(WAN21_LATENTS_MEAN),
        latents_std=list(WAN21_LATENTS_STD),
    )
    if preset == "real":
        return dict(base_dim=96, num_res_blocks=2, **common)
    if preset == "tiny":
        return dict(base_dim=8, num_res_blocks=1, **common)
    if str(preset).startswith("s2d"):  # the world presets' lossless space-to-depth codec (wmbook.world.codec)
        return video_codec_config(preset)
    raise ValueError(f"unknown VAE preset {preset!r} (expected 'real', 'tiny' or 's2d<N>')")


def build_wan_vae(config: dict, dtype: torch.dtype = torch.float32, device="cpu", seed: int = 0) -> AutoencoderKLWan:
    """Build an `AutoencoderKLWan` from `config` with seeded random weights (no download).

    Weights are initialised on the CPU in fp32 under `seed` (the global RNG is left untouched), then
    moved to `device` / `dtype`, so the same seed gives the same weights on every device. Returned in
    eval mode with requires_grad False. To use real weights, load a state dict into it
    (`vae.load_state_dict(...)`) or use `AutoencoderKLWan.from_pretrained(...)` directly.
    """
    if config.get("codec") == "space_to_depth":  # no weights: wmbook.world.codec
        return build_video_codec(config, dtype=dtype, device=device)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        vae = AutoencoderKLWan(**config)
    # plain nn.Module.to: ModelMixin.to only adds a spurious "keep in float32" warning here
    torch.nn.Module.to(vae, device=device, dtype=dtype)
    vae.eval()
    vae.requires_grad_(False)
    return vae


# ----------------------------------------------------------------------------------------------
# Frame arithmetic, latent normalisation
# ----------------------------------------------------------------------------------------------


def pixel_frames_for(latent_frames: int, first: bool) -> int:
    """Pixel frames produced by decoding `latent_frames` latent frames.

    first=True (the stream's first block): 1 + 4 * (F - 1); later blocks: 4 * F.
    """
    if latent_frames <= 0:
        return 0
    return 1 + 4 * (latent_frames - 1) if first else 4 * latent_frames


def latent_frames_for(pixel_frames: int) -> int:
    """Latent frames for a causal clip of `pixel_frames` = 1 + 4k pixel frames."""
    if pixel_frames < 1 or (pixel_frames - 1) % 4:
        raise ValueError(f"pixel_frames must be 1 + 4k, got {pixel_frames}")
    return 1 + (pixel_frames - 1) // 4


def _stats(vae: AutoencoderKLWan, device, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    c = vae.config
    mean = torch.tensor(c.latents_mean).view(1, c.z_dim, 1, 1, 1).to(device, dtype)
    std = torch.tensor(c.latents_std).view(1, c.z_dim, 1, 1, 1).to(device, dtype)
    return mean, std


def normalize_latents(vae: AutoencoderKLWan, z: torch.Tensor) -> torch.Tensor:
    """(z - mean) / std: raw VAE latents -> the DiT's latent space."""
    mean, std = _stats(vae, z.device, z.dtype)
    return (z - mean) / std


def unnormalize_latents(vae: AutoencoderKLWan, latents: torch.Tensor) -> torch.Tensor:
    """DiT latents -> raw VAE latents, exactly as diffusers' WanPipeline: latents / (1 / std) + mean."""
    mean, std = _stats(vae, latents.device, latents.dtype)
    return latents / (1.0 / std) + mean


# ----------------------------------------------------------------------------------------------
# Streaming decode
# ----------------------------------------------------------------------------------------------


def _cached_causal_conv(conv, x, feat_cache, feat_idx):
    """One `WanCausalConv3d` with its feature cache, exactly as in `WanDecoder3d.forward`."""
    idx = feat_idx[0]
    cache_x = x[:, :, -_CACHE_T:, :, :].clone()
    if cache_x.shape[2] < 2 and feat_cache[idx] is not None:
        # cache the last frame of the last two chunks
        cache_x = torch.cat([feat_cache[idx][:, :, -1, :, :].unsqueeze(2).to(cache_x.device), cache_x], dim=2)
    x = conv(x, feat_cache[idx])
    feat_cache[idx] = cache_x
    feat_idx[0] += 1
    return x


def _accepts(fn, name: str) -> bool:
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


class StreamingWanDecoder:
    """Decode a stream of latent blocks with the Wan VAE, keeping the causal-conv caches between calls.

    `decode_block(latents[B,16,F,h,w])` -> pixels [B,3,T,H,W] in [-1, 1], T = pixel_frames_for(F, first)
    where `first` is True only for the first block after construction / `reset()`. Latents are the
    DiT's normalised latents (see module docstring); they are cast to the VAE's device and dtype.

    Labels: "VAE_Decode_Preprocessing" (un-normalise + post_quant_conv), "VAE_Decode_Frame_{k}" per
    latent frame (k = index of the latent frame in the stream) with, inside it, "VAE_Dec_Conv1",
    "VAE_Dec_Middle_Blocks", "VAE_Dec_Upsample_Blocks", "VAE_Dec_Head", and
    "VAE_Decode_Postprocessing" (concat, clamp).

    The stage labels need the decoder's forward split into its four stages; `_decoder_staged` calls
    the diffusers submodules (conv_in / mid_block / up_blocks / norm_out + nonlinearity + conv_out)
    exactly as `WanDecoder3d.forward` does, and is tested bit-equal to `vae.decoder(...)`. With
    `stage_labels=False`, when labels are switched off, or on a diffusers whose decoder lacks those
    submodules, the plain `vae.decoder(...)` call is used instead (same results).
    """

    def __init__(self, vae: AutoencoderKLWan, stage_labels: bool = True):
        self.vae = vae
        dec = vae.decoder
        self.num_convs = sum(isinstance(m, _wan.WanCausalConv3d) for m in dec.modules())
        self._dec_first_chunk = _accepts(dec.forward, "first_chunk")
        self._up_first_chunk = all(_accepts(ub.forward, "first_chunk") for ub in getattr(dec, "up_blocks", []))
        can_stage = all(hasattr(dec, n)
                        for n in ("conv_in", "mid_block", "up_blocks", "norm_out", "nonlinearity", "conv_out"))
        self.stage_labels = bool(stage_labels) and can_stage
        self.patch_size = getattr(vae.config, "patch_size", None)
        self.reset()

    # -- state -------------------------------------------------------------------------------

    def reset(self) -> None:
        """Forget the stream: clear the decoder's feature caches and the frame counters."""
        self.feat_cache: list = [None] * self.num_convs
        self.latent_frames_done = 0
        self.pixel_frames_done = 0
        self.step_frames = 0  # latent frames of the step's last call (0: none yet)

    pixel_frames_for = staticmethod(pixel_frames_for)

    # -- decoding ----------------------------------------------------------------------------

    def _decoder_plain(self, x, first: bool):
        feat_idx = [0]
        if self._dec_first_chunk:
            return self.vae.decoder(x, feat_cache=self.feat_cache, feat_idx=feat_idx, first_chunk=first)
        return self.vae.decoder(x, feat_cache=self.feat_cache, feat_idx=feat_idx)

    def _decoder_staged(self, x, first: bool):
        """`WanDecoder3d.forward(x, feat_cache, feat_idx, first_chunk)` split into labelled stages."""
        dec = self.vae.decoder
        feat_cache, feat_idx = self.feat_cache, [0]
        with label("VAE_Dec_Conv1"):
            x = _cached_causal_conv(dec.conv_in, x, feat_cache, feat_idx)
        with label("VAE_Dec_Middle_Blocks"):
            x = dec.mid_block(x, feat_cache=feat_cache, feat_idx=feat_idx)
        with label("VAE_Dec_Upsample_Blocks"):
            for up_block in dec.up_blocks:
                if self._up_first_chunk:
                    x = up_block(x, feat_cache=feat_cache, feat_idx=feat_idx, first_chunk=first)
                else:
                    x = up_block(x, feat_cache=feat_cache, feat_idx=feat_idx)
        with label("VAE_Dec_Head"):
            x = dec.norm_out(x)
            x = dec.nonlinearity(x)
            x = _cached_causal_conv(dec.conv_out, x, feat_cache, feat_idx)
        return x

    # the step's calls: one per latent frame; the vae-block-step variant (BlockStep) sets it to False: every later call
    # then takes all the latent frames of a decode_block call at once
    step_per_frame = True

    def decode_frame(self, x: torch.Tensor, phase: int, staged: bool = False) -> torch.Tensor:
        """Latent frames after post_quant_conv [B, z, F, h, w] through the decoder with the stream's feature caches
        -> [B, 3, T, H, W] (T = 1 for the stream's first frame, else 4 per latent frame): the step the variants
        replace. F is 1, or with vae-block-step a block's latent frames. phase: 0 for the stream's first latent frame
        (alone), 1 for the call after it, 2 for every later one (the calls whose shapes and caches are steady): a
        compiled or captured step specializes on it and on F."""
        first = phase == 0
        return self._decoder_staged(x, first) if staged else self._decoder_plain(x, first)

    def step_calls(self, n: int) -> list[tuple[int, int, int]]:
        """(start, stop, phase) of each call of the step that decodes the stream's next `n` latent frames: the stream's
        first latent frame alone (phase 0); then one call per frame, or with vae-block-step the rest of the `n` at
        once; phase 1 for the call right after the first frame, 2 after that. A causal decoder gives the same frames
        either way: each causal convolution sees the same past frames."""
        done, calls, i = self.latent_frames_done, [], 0
        while i < n:
            stop = i + 1 if self.step_per_frame or done + i == 0 else n
            calls.append((i, stop, min(done + i, 2)))
            i = stop
        return calls

    def prepare_step(self, frames: int, before: int) -> None:
        """Called before a steady call (phase 2) whose latent frame count differs from the last call's (`before`):
        the diffusers caches take any frame count; a decoder with fixed buffers (vae-stream-buffers) sets up the
        buffers of the new count here, outside any compiled or captured step."""

    def after_step(self, frames: int, phase: int) -> None:
        """Called after each call of the step, outside it (not compiled, not captured): what a decoder with fixed
        buffers does to them between calls (vae-stream-buffers: the steady windows' past frames moved)."""

    @torch.no_grad()
    def decode_block(self, latents: torch.Tensor, on_frames=None) -> torch.Tensor:
        """Decode the next `F` latent frames of the stream -> [B, 3, T, H, W] in [-1, 1]. `on_frames(frames)`: called
        with each step call's pixel frames (final: unpatchified, clamped; a latent frame's, or with vae-block-step the
        rest of the block's) as soon as they are queued, before the block's later calls decode: a stream can show its
        first frame after one latent frame's decode. The pieces are the block's frames (their concatenation is the
        return value, bit for bit)."""
        if latents.dim() != 5:
            raise ValueError(f"expected latents [B, C, F, h, w], got {tuple(latents.shape)}")
        vae = self.vae
        staged = self.stage_labels and labels_enabled()
        with label("VAE_Decode_Preprocessing"):
            z = latents.to(device=vae.device, dtype=vae.dtype)
            z = unnormalize_latents(vae, z)
            x = vae.post_quant_conv(z)  # 1x1x1 conv: no temporal state, safe per block
        outs = []
        for start, stop, phase in self.step_calls(x.shape[2]):
            k, frames = self.latent_frames_done, stop - start
            if phase == 2 and frames != self.step_frames:
                self.prepare_step(frames, self.step_frames)
            with label(f"VAE_Decode_Frame_{k}"):  # k: the call's first latent frame
                outs.append(self.decode_frame(x[:, :, start:stop, :, :], phase, staged))
                self.after_step(frames, phase)
            self.latent_frames_done += frames
            self.step_frames = frames
            if on_frames is not None:  # the piece finished now (the ops after the step are per frame)
                with label("VAE_Decode_Postprocessing"):
                    outs[-1] = self._finish(outs[-1])
                on_frames(outs[-1])
        with label("VAE_Decode_Postprocessing"):
            out = outs[0] if len(outs) == 1 else torch.cat(outs, 2)
            if on_frames is None:
                out = self._finish(out)
        self.pixel_frames_done += out.shape[2]
        return out

    def _finish(self, out: torch.Tensor) -> torch.Tensor:
        """The decoder's output -> final pixel frames: unpatchified (Wan 2.2's patched decoder), clamped to [-1, 1];
        spatial and per element, so a block's frames finished piece by piece equal those finished at once."""
        if self.patch_size is not None:
            out = _wan.unpatchify(out, patch_size=self.patch_size)
        return torch.clamp(out, min=-1.0, max=1.0)

    __call__ = decode_block


# ----------------------------------------------------------------------------------------------
# Encode (Matrix-Game-2 image conditioning)
# ----------------------------------------------------------------------------------------------


@torch.no_grad()
def encode_first_frame(vae: AutoencoderKLWan, image: torch.Tensor, num_latent_frames: int) -> torch.Tensor:
    """Matrix-Game-2's image conditioning latents.

    `image` [B, 3, H, W] in [-1, 1] is followed by 4 * (F - 1) zero frames (1 + 4(F-1) pixel frames
    in all), encoded with the VAE (posterior mode) and normalised ((z - mean) / std)
    -> [B, 16, F, H/8, W/8]. (The caller emits the "1.2_VAE_Encode_FirstFrame" label.)
    """
    if image.dim() != 4:
        raise ValueError(f"expected image [B, 3, H, W], got {tuple(image.shape)}")
    if num_latent_frames < 1:
        raise ValueError("num_latent_frames must be >= 1")
    img = image.to(device=vae.device, dtype=vae.dtype).unsqueeze(2)
    pad = 4 * (num_latent_frames - 1)
    if pad:
        img = torch.cat([img, img.new_zeros(img.shape[0], img.shape[1], pad, *img.shape[3:])], dim=2)
    z = vae.encode(img).latent_dist.mode()
    return normalize_latents(vae, z)
