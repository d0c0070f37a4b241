"""TAEHV, the tiny video decoder for the Wan2.1 latent space (madebyollin/taehv, weights `taew2_1.pth`).

Architecture (upstream taehv.py, `TAEHV.decoder`): 2D convs only, one nn.Sequential of 23 layers run frame by
frame, with time handled by two kinds of layer:
  - MemBlock: conv3x3(2C->C), ReLU, conv3x3, ReLU, conv3x3 on [frame, previous frame of its input] (zeros for
    the stream's first frame), plus a skip (identity when C_in == C_out), then ReLU;
  - TGrow(C, s): a 1x1 conv C -> s*C (no bias), split into s consecutive frames (channel block j = sub-frame j).
Layout, n_f = (256, 128, 64, 64) upstream:
  0 Clamp (3 * tanh(x / 3)), 1 conv(16 -> n_f[0]), 2 ReLU,
  3-5 MemBlock, 6 Upsample x2, 7 TGrow(n_f[0], 1), 8 conv(n_f[0] -> n_f[1], no bias),
  9-11 MemBlock, 12 Upsample x2, 13 TGrow(n_f[1], 2), 14 conv(n_f[1] -> n_f[2], no bias),
  15-17 MemBlock, 18 Upsample x2, 19 TGrow(n_f[2], 2), 20 conv(n_f[2] -> n_f[3], no bias),
  21 ReLU, 22 conv(n_f[3] -> 3).
So every latent frame gives 4 raw frames (8x spatial). Upstream `decode_video` clamps to [0, 1] and drops the
first `frames_to_trim = t_upscale - 1 = 3` raw frames, so F latent frames give 4F - 3 = 1 + 4(F - 1) frames, the
Wan VAE's count; StreamingTAEHV skips the same 3 startup frames. We return [-1, 1] (2 * x - 1, as Self-Forcing's
TAEHV wrapper does) in [B, C, T, H, W] order (upstream uses NTCHW).

Input: TAEHV decodes exactly what the diffusion model produces, with no latent scale/shift (upstream README,
"TAEHV does not use any latent scales / shifts"; Self-Forcing's demo feeds the generator's latents straight in).
So the DiT's normalised Wan latents `(z - mean) / std` go in as they are: no un-normalisation, unlike
StreamingWanDecoder. Pass raw_latents=True to StreamingTAEHVDecoder for raw VAE latents (normalised first).

Streaming: the only state is each MemBlock's last input frame (the decoder has no TPool; TGrow is per frame),
so any split of the latent stream into blocks gives the one-shot result.
"""

from __future__ import annotations

import torch
from torch import nn

from wmbook.models.checkpoint import load_checked, read_state_dict
from wmbook.models.decoder_step import DecoderStep
from wmbook.models.vae import WAN21_LATENTS_MEAN, WAN21_LATENTS_STD, pixel_frames_for
from wmbook.profiling.labels import label
from wmbook.variants.swaps import inputs_in_memory_format, to_memory_format

__all__ = [
    "TAEHV_WIDTHS",
    "Clamp",
    "MemBlock",
    "TGrow",
    "TAEHVDecoder",
    "StreamingTAEHVDecoder",
    "load_taehv_decoder",
    "build_taehv",
]

TAEHV_WIDTHS = {"real": (256, 128, 64, 64), "tiny": (16, 8, 8, 8)}  # n_f per stage; "real" = upstream


def _conv3(n_in: int, n_out: int, bias: bool = True) -> nn.Conv2d:
    return nn.Conv2d(n_in, n_out, 3, padding=1, bias=bias)


class Clamp(nn.Module):
    """Soft clamp of the latents into (-3, 3): 3 * tanh(x / 3)."""

    def forward(self, x):
        return torch.tanh(x / 3) * 3


class MemBlock(nn.Module):
    """Residual 3-conv block on the current frame and the previous frame of its input."""

    def __init__(self, n_in: int, n_out: int):
        super().__init__()
        self.conv = nn.Sequential(_conv3(n_in * 2, n_out), nn.ReLU(), _conv3(n_out, n_out), nn.ReLU(),
                                  _conv3(n_out, n_out))
        self.skip = nn.Conv2d(n_in, n_out, 1, bias=False) if n_in != n_out else nn.Identity()
        self.act = nn.ReLU()

    def forward(self, x, past):  # [N, C, H, W] each (N = B * T) -> [N, C_out, H, W]
        return self.act(self.conv(torch.cat([x, past], 1)) + self.skip(x))


class TGrow(nn.Module):
    """Temporal upsampling: a 1x1 conv to stride * C channels, read as `stride` consecutive frames."""

    def __init__(self, n_f: int, stride: int):
        super().__init__()
        self.stride = stride
        self.conv = nn.Conv2d(n_f, n_f * stride, 1, bias=False)

    def forward(self, x):  # [B, T, C, H, W] -> [B, T * stride, C, H, W]
        b, t, c, h, w = x.shape
        y = self.conv(x.reshape(b * t, c, h, w))  # [B*T, stride*C, H, W], channel block j = sub-frame j
        return y.reshape(b, t * self.stride, c, h, w)


def _to_pixels(y: torch.Tensor) -> torch.Tensor:
    """Raw decoder frames [B, T, 3, H, W] -> [B, 3, T, H, W] in [-1, 1] (upstream's clamp to [0, 1], then 2x - 1)."""
    return y.transpose(1, 2).contiguous().clamp_(0, 1).mul_(2).sub_(1)


class TAEHVDecoder(nn.Sequential):
    """TAEHV's decoder; its state dict keys are upstream's `decoder.*` keys without the prefix ("3.conv.0.weight")."""

    def __init__(self, latent_channels: int = 16, n_f: tuple[int, ...] = TAEHV_WIDTHS["real"], image_channels: int = 3):
        a, b, c, d = n_f
        layers = [Clamp(), _conv3(latent_channels, a), nn.ReLU()]
        for n, n_next, stride in ((a, b, 1), (b, c, 2), (c, d, 2)):
            layers += [MemBlock(n, n), MemBlock(n, n), MemBlock(n, n), nn.Upsample(scale_factor=2),
                       TGrow(n, stride), _conv3(n, n_next, bias=False)]
        layers += [nn.ReLU(), _conv3(d, image_channels)]
        super().__init__(*layers)
        self.latent_channels, self.n_f, self.image_channels = latent_channels, tuple(n_f), image_channels
        self.t_upscale = 1
        for m in self:
            if isinstance(m, TGrow):
                self.t_upscale *= m.stride
        self.frames_to_trim = self.t_upscale - 1  # raw startup frames dropped at the start of a stream

    def run(self, x: torch.Tensor, memory: list | None = None) -> torch.Tensor:
        """Layers on latents [B, F, C, h, w], parallel over time -> raw frames [B, 4F, 3, 8h, 8w] (untrimmed).

        `memory` (one entry per layer, updated in place) carries each MemBlock's last input frame to the next
        call; None (or a None entry) means the start of a stream (zeros)."""
        for i, layer in enumerate(self):
            b, t = x.shape[:2]
            if isinstance(layer, MemBlock):
                prev = memory[i] if memory is not None else None
                if prev is None:
                    prev = torch.zeros_like(x[:, :1])
                elif prev.shape[0] != b or prev.shape[2:] != x.shape[2:]:
                    raise ValueError(f"layer {i}: stream state {tuple(prev.shape)} does not fit input "
                                     f"{tuple(x.shape)}; reset() before a stream of another batch or size")
                past = torch.cat([prev, x[:, :-1]], 1)  # [B, T, C, H, W]: frame t sees frame t - 1
                if memory is not None:
                    memory[i] = x[:, -1:].clone()  # clone: a view would keep the whole block alive
                x = layer(x.flatten(0, 1), past.flatten(0, 1)).unflatten(0, (b, t))
            elif isinstance(layer, TGrow):
                x = layer(x)
            else:
                x = layer(x.flatten(0, 1)).unflatten(0, (b, t))
        return x

    def decode_video(self, latents: torch.Tensor) -> torch.Tensor:
        """DiT latents [B, C, F, h, w] -> frames [B, 3, 1 + 4(F - 1), 8h, 8w] in [-1, 1]."""
        if latents.dim() != 5 or latents.shape[1] != self.latent_channels:
            raise ValueError(f"expected latents [B, {self.latent_channels}, F, h, w], got {tuple(latents.shape)}")
        p = next(self.parameters())
        x = latents.to(device=p.device, dtype=p.dtype).transpose(1, 2)  # [B, F, C, h, w]
        return _to_pixels(self.run(x)[:, self.frames_to_trim:])

    forward = decode_video


class StreamingTAEHVDecoder:
    """Decode a stream of latent blocks with TAEHV, keeping each MemBlock's last input frame between calls.

    `decode_block(latents[B,16,F,h,w])` -> [B, 3, T, H, W] in [-1, 1], T = pixel_frames_for(F, first) (first:
    the first block after construction / reset()). Latents are the DiT's normalised latents, fed to TAEHV as
    they are (see module docstring); raw_latents=True takes raw VAE latents and normalises them with the Wan2.1
    statistics first. per_frame=False decodes a block in one pass under "VAE_Decode_Block_{n}"; per_frame=True
    one latent frame at a time under "VAE_Decode_Frame_{k}" (k global to the stream, as StreamingWanDecoder);
    both give the same frames. Also "VAE_Decode_Preprocessing" / "VAE_Decode_Postprocessing".
    """

    def __init__(self, decoder: TAEHVDecoder, per_frame: bool = False, raw_latents: bool = False):
        self.decoder = decoder
        self.per_frame = bool(per_frame)
        self.raw_latents = bool(raw_latents)
        self.reset()

    def reset(self) -> None:
        """Forget the stream: clear the MemBlock memories and the frame counters."""
        self.memory: list = [None] * len(self.decoder)
        self.blocks_done = 0
        self.latent_frames_done = 0
        self.raw_frames_done = 0  # decoder output frames, the trimmed startup frames included
        self.pixel_frames_done = 0

    pixel_frames_for = staticmethod(pixel_frames_for)

    @torch.no_grad()
    def decode_block(self, latents: torch.Tensor, on_frames=None) -> torch.Tensor:
        """Decode the next `F` latent frames of the stream -> [B, 3, T, H, W] in [-1, 1]. `on_frames(frames)`: called
        with the block's frames once they are queued (the startup frames are trimmed across the block's latent frames,
        so this decoder hands out whole blocks)."""
        dec = self.decoder
        if latents.dim() != 5 or latents.shape[1] != dec.latent_channels or latents.shape[2] < 1:
            raise ValueError(f"expected latents [B, {dec.latent_channels}, F>=1, h, w], got {tuple(latents.shape)}")
        p = next(dec.parameters())
        with label("VAE_Decode_Preprocessing"):
            z = latents.to(device=p.device, dtype=p.dtype)
            if self.raw_latents:
                mean = torch.tensor(WAN21_LATENTS_MEAN, device=p.device, dtype=p.dtype).view(1, -1, 1, 1, 1)
                std = torch.tensor(WAN21_LATENTS_STD, device=p.device, dtype=p.dtype).view(1, -1, 1, 1, 1)
                z = (z - mean) / std
            x = z.transpose(1, 2)  # [B, F, C, h, w]
        outs = []
        if self.per_frame:
            for i in range(x.shape[1]):
                with label(f"VAE_Decode_Frame_{self.latent_frames_done}"):
                    y, self.memory = self.step(x[:, i : i + 1], self.memory)
                    outs.append(y)  # [B, 4, 3, H, W]
                self.latent_frames_done += 1
        else:
            with label(f"VAE_Decode_Block_{self.blocks_done}"):
                y, self.memory = self.step(x, self.memory)
                outs.append(y)  # [B, 4F, 3, H, W]
            self.latent_frames_done += x.shape[1]
        with label("VAE_Decode_Postprocessing"):
            y = outs[0] if len(outs) == 1 else torch.cat(outs, 1)
            trim = max(0, dec.frames_to_trim - self.raw_frames_done)
            self.raw_frames_done += y.shape[1]
            out = _to_pixels(y[:, trim:])
        self.blocks_done += 1
        self.pixel_frames_done += out.shape[2]
        if on_frames is not None:
            on_frames(out)
        return out

    __call__ = decode_block

    def step(self, x: torch.Tensor, memory: list) -> tuple[torch.Tensor, list]:
        """The decoder on latent frames [B, F, C, h, w] with the stream's memory -> (raw frames [B, 4F, 3, H, W], the
        memory after them): a function of its arguments (no state of its own), so that the decoder variants can
        compile it and capture it in a CUDA graph (`decoder_step`)."""
        memory = list(memory)
        return self.decoder.run(x, memory), memory

    def decoder_step(self):
        """The step the decoder variants compile (vae-compile: only once every MemBlock has a memory, i.e. after a
        stream's first block, whose shapes differ) and capture (vae-cuda-graphs; no buffers needed: the memory
        goes in and out as arguments)."""
        return DecoderStep(self, "step", compiled=lambda args: all(m is not None for m in _memories(self, args[1])))

    def use_channels_last(self) -> int:
        """The decoder's 2-D convolutions in channels_last: their weights, and their inputs through a forward
        pre-hook (a no-op where the input already is; after TGrow's frame split and MemBlock's concatenation it is
        a copy). Returns the number of convolutions."""
        n = to_memory_format(self.decoder, torch.channels_last)
        for m in self.decoder.modules():
            if isinstance(m, nn.Conv2d):
                inputs_in_memory_format(m, torch.channels_last)
        return n


def _memories(dec: StreamingTAEHVDecoder, memory) -> list:
    """The MemBlocks' entries of a memory list (the other layers' stay None)."""
    return [memory[i] for i, layer in enumerate(dec.decoder) if isinstance(layer, MemBlock)]


def load_taehv_decoder(decoder: TAEHVDecoder, state_dict_or_path, strict: bool = True):
    """Load TAEHV decoder weights (a dict or a .pth / .safetensors path), all or nothing.

    Takes upstream's full state dict (its `decoder.*` keys, prefix dropped; `encoder.*` keys ignored) or a
    decoder-only one. Keys and shapes are checked before anything is copied: a misfit raises one ValueError
    (checkpoint.CheckpointMismatchError) naming missing / unexpected keys and wrong shapes, model unchanged.
    Returns load_state_dict's (missing_keys, unexpected_keys)."""
    sd = read_state_dict(state_dict_or_path)
    pre = "decoder."
    if any(isinstance(k, str) and k.startswith(pre) for k in sd):
        sd = {(k[len(pre):] if k.startswith(pre) else k): v for k, v in sd.items() if not k.startswith("encoder.")}
    src = state_dict_or_path
    what = "TAEHV state dict" if isinstance(src, dict) else f"TAEHV checkpoint {str(src)!r}"
    return load_checked(decoder, sd, strict, what=what)


def build_taehv(preset: str = "real", dtype: torch.dtype = torch.float32, device="cpu", seed: int = 0,
                latent_channels: int = 16) -> TAEHVDecoder:
    """A TAEHVDecoder ("real": upstream widths, "tiny": for CPU tests) with seeded random weights, eval, no grad.

    Initialised on the CPU in fp32 under `seed` (global RNG untouched), then moved to `device` / `dtype`;
    load real weights with load_taehv_decoder."""
    if preset not in TAEHV_WIDTHS:
        raise ValueError(f"unknown TAEHV preset {preset!r} (expected one of {sorted(TAEHV_WIDTHS)})")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        dec = TAEHVDecoder(latent_channels, TAEHV_WIDTHS[preset])
    dec.to(device=device, dtype=dtype)
    dec.eval()
    dec.requires_grad_(False)
    return dec
