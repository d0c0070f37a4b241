"""The Wan VAE's streaming decode with its causal caches kept in place (the `vae-stream-buffers` variant).

diffusers' decoder (the reference, wmbook.models.vae.StreamingWanDecoder) carries each causal convolution's past
frames as a list of tensors: for every convolution and every latent frame it clones the input's last frames,
concatenates
the old cache in front of the input, zero-pads the result in space (F.pad) and convolves, about nine frame-sized copies
per convolution, with new tensors every frame. Here each causal convolution owns one preallocated input window

    [B, C, past + T, H + 2*ph, W + 2*pw]     past = temporal kernel - 1 (2), T = frames in this call, zero border

the step writes its input into the interior once, convolves the whole window without padding, and moves the last `past`
frames to the front for the next call (a steady call leaves the moves to after_step, outside what is compiled or
captured). Same arithmetic on the same values (equal to the reference up to the
convolution algorithm), a fraction of the copies, and once the stream is steady (from its third latent frame) every
buffer keeps its shape and address: the per-frame step can be captured in a CUDA graph (vae-cuda-graphs) and compiled
without recompiling. The buffers take the layout `memory_format` says (channels_last_3d: NDHWC convolutions).

It walks the diffusers modules (Wan2.1 layout: conv_in, mid_block, up_blocks of residual blocks and resamplers,
norm_out, conv_out) and uses their weights; nothing is copied from them.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from diffusers.models.autoencoders import autoencoder_kl_wan as _wan

from ..kernels import window_conv as wk
from ..profiling.labels import label


def _no_label(name: str):
    return contextlib.nullcontext()


def write_interior(conv, x: torch.Tensor, win: torch.Tensor) -> None:
    """x [B, C, T, H, W] written into the interior of `conv`'s input window (after its past frames, inside its zero
    border)."""
    past = win.shape[2] - x.shape[2]
    ph, pw = conv._padding[2], conv._padding[0]
    win[:, :, past:, ph:ph + x.shape[3], pw:pw + x.shape[4]].copy_(x)


def moves_in_step(phase: int) -> bool:
    """Whether a call of the step moves its windows' past frames itself: the stream's first two calls (phases 0 and
    1, eager) do; a steady call (phase 2) leaves them to BufferedStreamingDecoder.after_step (conv_in_window says
    why)."""
    return phase < 2


def conv_in_window(conv, x: torch.Tensor, win: torch.Tensor, shift: bool = True) -> torch.Tensor:
    """x [B, C, T, H, W] through the causal convolution `conv` whose input window `win` holds its past frames: x
    written into the window's interior, the whole window convolved without padding, the last frames moved to the
    front for the next call (the window is updated in place). shift=False leaves that move to the caller: a steady
    step (phase 2) moves its windows' frames after it returns (BufferedStreamingDecoder.after_step), outside what is
    compiled or captured. A move written inside a compiled step is a write into the window after the convolution
    has read it: inductor then convolves a clone of the whole window and copies it back (two passes over the
    largest windows; as a custom op the move is in place, but the clone and the copy stay: 5.2 ms of a 60 ms block
    on an H200). Without it inductor writes x into the window in place, fused with the op that produces x."""
    write_interior(conv, x, win)
    y = F.conv3d(win, conv.weight, conv.bias, conv.stride, 0, conv.dilation, conv.groups)
    if shift:
        wk.shift_window(win, x.shape[2])
    return y


def residual_in_windows(block, x: torch.Tensor, win1: torch.Tensor, win2: torch.Tensor,
                        shift: bool = True) -> torch.Tensor:
    """A WanResidualBlock on x with its two causal convolutions' input windows: norm, SiLU, conv1, norm, SiLU,
    conv2, plus the shortcut (a 1x1x1 convolution has no past). What vae-compile-regional compiles: a function of
    the block's weights and of tensors only, so blocks of the same shape share one compiled graph."""
    sc = block.conv_shortcut
    h = x if isinstance(sc, torch.nn.Identity) else F.conv3d(x, sc.weight, sc.bias)
    x = conv_in_window(block.conv1, block.nonlinearity(block.norm1(x)), win1, shift)
    x = conv_in_window(block.conv2, block.dropout(block.nonlinearity(block.norm2(x))), win2, shift)
    return x + h


def head_in_window(dec, x: torch.Tensor, win: torch.Tensor, shift: bool = True) -> torch.Tensor:
    """The decoder's head: its output norm, SiLU and the causal conv_out (with conv_out's window)."""
    return conv_in_window(dec.conv_out, dec.nonlinearity(dec.norm_out(x)), win, shift)


def conv3d_taps_gemm(win: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """F.conv3d(win, weight, bias) without padding, for a few output channels, as one GEMM and a sum of shifted
    slices: the weights of every tap and output channel times every window position's channels ([taps x O, C] x
    [C, positions]), then each output the sum over taps of its shifted position's products (in fp32). cuDNN's implicit
    GEMM reads the window once per tap for the decoder head's 3 output channels (about 24 TFLOP/s on an H200); this
    reads it once and writes the products once, each tap's output channel a contiguous row over the positions, so the
    sum reads whole rows. The same sums in another order: the products rounded to the window's dtype before the fp32
    sum."""
    b, c, tw, hw, ww = win.shape
    o, _, kt, kh, kw = weight.shape
    wt = weight.permute(2, 3, 4, 0, 1).reshape(kt * kh * kw * o, c)  # [(kt, kh, kw, O), C]
    # channels x positions: a view of a channels_last_3d window (a copy of a contiguous one)
    z = (wt @ win.permute(0, 2, 3, 4, 1).reshape(-1, c).t()).view(-1, b, tw, hw, ww)
    t, h, w = tw - kt + 1, hw - kh + 1, ww - kw + 1
    y = None
    for i in range(kt):
        for j in range(kh):
            for k in range(kw):
                tap = (i * kh + j) * kw + k
                part = z[tap * o:(tap + 1) * o, :, i:i + t, j:j + h, k:k + w].float()  # [O, B, t, h, w]
                y = part if y is None else y + part
    if bias is not None:
        y = y + bias.float().view(o, 1, 1, 1, 1)
    return y.to(win.dtype).transpose(0, 1)  # [B, O, T, H, W]


def head_gemm_in_window(dec, x: torch.Tensor, win: torch.Tensor, shift: bool = True) -> torch.Tensor:
    """head_in_window with conv_out as conv3d_taps_gemm (conv_in_window's steps otherwise)."""
    conv = dec.conv_out
    write_interior(conv, dec.nonlinearity(dec.norm_out(x)), win)
    y = conv3d_taps_gemm(win, conv.weight, conv.bias)
    if shift:
        wk.shift_window(win, x.shape[2])
    return y


def supports(vae) -> tuple[bool, str]:
    """Whether the buffered step can run this VAE's decoder (the Wan2.1 decoder layout), and why not."""
    dec = vae.decoder
    if getattr(vae.config, "patch_size", None) is not None or getattr(vae.config, "is_residual", False):
        return False, "the Wan2.2 decoder (patchified, residual up blocks) is not supported"
    for name in ("conv_in", "mid_block", "up_blocks", "norm_out", "conv_out"):
        if not hasattr(dec, name):
            return False, f"the decoder has no {name}"
    if not all(isinstance(b, _wan.WanUpBlock) for b in dec.up_blocks):
        return False, "up blocks other than WanUpBlock"
    return True, ""


class BufferedStreamingDecoder:
    """StreamingWanDecoder whose per-frame step keeps every causal convolution's past frames in a preallocated,
    spatially padded input window (see the module docstring). Swap it in with swap_class, then call
    `use_buffers(memory_format)`."""

    def use_buffers(self, memory_format: torch.memory_format | None = None) -> None:
        ok, why = supports(self.vae)
        if not ok:
            raise ValueError(f"vae-stream-buffers cannot run this VAE: {why}")
        if memory_format is not None or not hasattr(self, "memory_format"):
            self.memory_format = memory_format or torch.contiguous_format
        self.windows: dict[tuple[int, int], torch.Tensor] = {}  # (id(conv), frames per call) -> input window
        # id(conv) -> (conv, its frames per latent frame of the call): where each convolution's past frames are when
        # the step's frame count changes (prepare_step). Read off the first call after a stream's first frame (phase
        # 1), which runs eagerly before it is ever captured, and kept across streams: a replayed call runs no Python,
        # so nothing a call records may be needed later.
        self.frames_per_latent: dict[int, tuple] = {}
        self.reset()

    def reset(self) -> None:
        super().reset()
        for w in getattr(self, "windows", {}).values():
            w.zero_()  # the stream's first frames see zero past frames (causal padding); addresses kept

    # -- one causal convolution ---------------------------------------------------------------------------------
    def _window(self, conv, x: torch.Tensor, phase: int, shape=None) -> torch.Tensor:
        """conv's input window for x [B, C, T, H, W] (or for an input of `shape`, x giving dtype and device). One
        window per number of frames per call, each allocated once (after the first temporal upsampling the stream's
        first frame comes alone, the next ones two or four at a time): a steady window never moves, which is what a
        captured graph needs. The stream's second frame (phase 1) carries the past frames over from the first
        frame's window."""
        past = conv._padding[4]  # WanCausalConv3d: (w, w, h, h, 2 * temporal padding, 0), its own padding zeroed
        ph, pw = conv._padding[2], conv._padding[0]
        b, c, t, h, w = shape if shape is not None else x.shape
        win = self._allocated(conv, t, (b, c, past + t, h + 2 * ph, w + 2 * pw), x)
        first = self.windows.get((id(conv), 1))  # absent for a temporal upsampler: it skips the first frame
        if phase == 1 and t != 1 and past and first is not None:
            win[:, :, :past].copy_(first[:, :, :past])
        if phase == 1 and id(conv) not in self.frames_per_latent:
            self.frames_per_latent[id(conv)] = (conv, t // self.call_latents)
        return win

    def _allocated(self, conv, t: int, shape: tuple, like: torch.Tensor) -> torch.Tensor:
        """conv's window for calls of `t` frames: the one allocated before, or a new zeroed one of `shape`."""
        key = (id(conv), t)
        win = self.windows.get(key)
        if win is None or tuple(win.shape) != shape or win.dtype != like.dtype or win.device != like.device:
            win = torch.zeros(shape, dtype=like.dtype, device=like.device).contiguous(memory_format=self.memory_format)
            self.windows[key] = win
        return win

    def prepare_step(self, frames: int, before: int) -> None:
        """Before a steady call of `frames` latent frames where the last call had `before`: every causal convolution's
        window for that many frames (its frames a call are the call's latent frames times what the temporal
        upsampling before it multiplies them by), allocated once, with the past frames carried over from the window of
        the last call's count. Eager in every stream (the calls around it may be replays), so a compiled or captured
        steady step finds its windows in place."""
        for key, (conv, per_latent) in self.frames_per_latent.items():
            cur = self.windows[(key, per_latent * before)]
            t, t_new = per_latent * before, per_latent * frames
            past = cur.shape[2] - t
            win = self._allocated(conv, t_new, (*cur.shape[:2], past + t_new, *cur.shape[3:]), cur)
            if past:
                win[:, :, :past].copy_(cur[:, :, :past])

    def _causal_conv(self, conv, x: torch.Tensor, phase: int) -> torch.Tensor:
        """x [B, C, T, H, W] through the causal convolution `conv` with its past frames, which it then updates."""
        return conv_in_window(conv, x, self._window(conv, x, phase), moves_in_step(phase))

    def _residual(self, block, x: torch.Tensor, phase: int) -> torch.Tensor:
        return residual_in_windows(block, x, *self._residual_windows(block, x, phase), moves_in_step(phase))

    def _residual_windows(self, block, x: torch.Tensor, phase: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The input windows of a residual block's two causal convolutions for input x (conv2 sees conv1's
        channels at x's frames and size)."""
        b, _, t, h, w = x.shape
        return (self._window(block.conv1, x, phase),
                self._window(block.conv2, x, phase, shape=(b, block.conv1.out_channels, t, h, w)))

    def _resample(self, rs, x: torch.Tensor, phase: int) -> torch.Tensor:
        b, c, t, h, w = x.shape
        if rs.mode == "upsample3d" and phase > 0:  # the first chunk is not doubled in time ('Rep' in diffusers)
            x = self._causal_conv(rs.time_conv, x, phase)  # [B, 2C, T, H, W]
            x = x.reshape(b, 2, c, t, h, w)
            x = torch.stack((x[:, 0], x[:, 1]), 3).reshape(b, c, t * 2, h, w)
        t = x.shape[2]
        x = rs.resample(x.permute(0, 2, 1, 3, 4).reshape(b * t, c, h, w))
        return x.view(b, t, x.size(1), x.size(2), x.size(3)).permute(0, 2, 1, 3, 4)

    def decode_frame(self, x: torch.Tensor, phase: int, staged: bool = False) -> torch.Tensor:
        dec = self.vae.decoder
        stage = label if staged else _no_label  # stage labels only where the caller wants them (not when compiled)
        if phase == 1:  # eager: the latent frames of the call frames_per_latent is read from
            self.call_latents = x.shape[2]
        if x.dim() == 5:
            x = x.contiguous(memory_format=self.memory_format)
        with stage("VAE_Dec_Conv1"):
            x = self._causal_conv(dec.conv_in, x, phase)
        with stage("VAE_Dec_Middle_Blocks"):
            mid = dec.mid_block
            x = self._residual(mid.resnets[0], x, phase)
            for attn, res in zip(mid.attentions, mid.resnets[1:]):
                x = self._residual(res, attn(x) if attn is not None else x, phase)
        with stage("VAE_Dec_Upsample_Blocks"):
            for ub in dec.up_blocks:
                for res in ub.resnets:
                    x = self._residual(res, x, phase)
                if ub.upsamplers is not None:
                    x = self._resample(ub.upsamplers[0], x, phase)
        with stage("VAE_Dec_Head"):
            return self._head(dec, x, phase)

    def _head(self, dec, x: torch.Tensor, phase: int) -> torch.Tensor:
        return head_in_window(dec, x, self._window(dec.conv_out, x, phase), moves_in_step(phase))

    def after_step(self, frames: int, phase: int) -> None:
        """After a steady call (phase 2) of `frames` latent frames, run eagerly outside the compiled or captured step:
        every causal convolution's window moves its last frames to its front (the step's convolutions leave them,
        conv_in_window). In channels-last windows each move is one dense copy of the past frames."""
        if moves_in_step(phase):
            return
        for key, (_, per_latent) in self.frames_per_latent.items():
            wk.shift_window(self.windows[(key, per_latent * frames)], per_latent * frames)

    def window_bytes(self) -> int:
        return sum(w.numel() * w.element_size() for w in self.windows.values())


class HeadGemmDecoder:
    """BufferedStreamingDecoder whose head convolution runs as one GEMM and a sum of shifted slices
    (head_gemm_in_window), in every phase; what vae-compile compiles and vae-cuda-graphs captures."""

    head_gemm = True

    def _head(self, dec, x: torch.Tensor, phase: int) -> torch.Tensor:
        return head_gemm_in_window(dec, x, self._window(dec.conv_out, x, phase), moves_in_step(phase))


class RegionalCompiledDecoder:
    """BufferedStreamingDecoder whose steady frames (phase 2) run each residual block, the head and every other
    causal convolution as compiled regions (`vae-compile-regional`): torch.compile of `residual_in_windows`,
    `head_in_window` and `conv_in_window`, each called with the module and its windows as arguments, so blocks of
    one shape share a compiled graph (one compile per distinct block shape, not one per block) and the step between
    regions (the mid block's attention, the resamplers' 2-D convolutions and frame interleave) stays eager. The
    stream's first two frames run eagerly (their windows are being allocated). Swap it in over a buffered decoder
    with swap_class, then call `compile_regions`."""

    def compile_regions(self, mode: str | None = None, backend: str = "inductor") -> None:
        kw = dict(mode=mode, backend=backend, dynamic=False)
        self.regions = {"residual": torch.compile(residual_in_windows, **kw),
                        "head": torch.compile(head_in_window, **kw),
                        "conv": torch.compile(conv_in_window, **kw)}

    def _causal_conv(self, conv, x: torch.Tensor, phase: int) -> torch.Tensor:
        if phase != 2:
            return super()._causal_conv(conv, x, phase)
        return self.regions["conv"](conv, x, self._window(conv, x, phase), moves_in_step(phase))

    def _residual(self, block, x: torch.Tensor, phase: int) -> torch.Tensor:
        if phase != 2:
            return super()._residual(block, x, phase)
        return self.regions["residual"](block, x, *self._residual_windows(block, x, phase), moves_in_step(phase))

    def _head(self, dec, x: torch.Tensor, phase: int) -> torch.Tensor:
        if phase != 2:
            return super()._head(dec, x, phase)
        return self.regions["head"](dec, x, self._window(dec.conv_out, x, phase), moves_in_step(phase))


__all__ = ["BufferedStreamingDecoder", "HeadGemmDecoder", "RegionalCompiledDecoder", "conv3d_taps_gemm",
           "conv_in_window", "head_gemm_in_window", "head_in_window", "residual_in_windows", "supports"]


def _norm_params(norm) -> tuple[torch.Tensor, torch.Tensor | None]:
    """gamma and bias (None: none) of a WanRMS_norm, or of the fused norm + SiLU that vae-triton-fused puts there."""
    bias = getattr(norm, "bias", None)
    return norm.gamma, bias if isinstance(bias, torch.Tensor) else None


class WindowKernelDecoder:
    """BufferedStreamingDecoder whose steps run the window kernels (`vae-window-kernels`,
    wmbook.kernels.window_conv): every norm + SiLU writes its result straight into the next causal convolution's input
    window, the carried frames move in one copy per window, and the head's convolution (3 output channels, which
    cuDNN runs at a small fraction of its speed) is an implicit GEMM of our own; the other convolutions stay cuDNN's, on
    the same windows. Meant to run eagerly under vae-cuda-graphs (no compile: it replaces what inductor fuses). Needs
    channels-last windows (vae-channels-last).

    Not the default: on the H200 at mg2-universal a steady block took 77.8 ms against the compiled step's 64.3.
    Inductor's whole-window copies (7.4 ms; since then a compiled step leaves the windows' moves to after_step) go, but
    what inductor fuses around them comes back as separate kernels (nearest upsampling 3.3 ms, aten's generic
    elementwise kernel 8.7, device-to-device copies 2.8, residual adds 1.8), and the norm kernel writing into a padded
    window ran slower than inductor's fused norms (9.9 ms against 7.1); the head's convolution in Triton (0.61 ms) did
    not beat cuDNN's (0.59): at 3 output channels both re-read the window 27 times."""

    head_triton_below = 16  # output channels under which a causal convolution runs our kernel instead of cuDNN's

    def use_window_kernels(self) -> None:
        if getattr(self, "memory_format", None) != torch.channels_last_3d:
            raise ValueError("vae-window-kernels needs the windows in channels_last_3d: put vae-channels-last "
                             "before it")
        self.weights_kc: dict[int, torch.Tensor] = {}

    def _conv_window(self, conv, win: torch.Tensor, t: int, shift: bool) -> torch.Tensor:
        """conv over its filled window, then (shift: before a steady step's after_step) the window's last frames to
        its front."""
        if (conv.out_channels < self.head_triton_below and conv.in_channels % 16 == 0  # the kernel's K steps
                and wk.runs_triton(win.device)):
            w = self.weights_kc.get(id(conv))
            if w is None or w.dtype != conv.weight.dtype or w.device != conv.weight.device:
                w = self.weights_kc[id(conv)] = wk.weight_kc(conv.weight)
            y = wk.window_conv(win, w, conv.bias, tuple(conv.kernel_size))
        else:
            y = F.conv3d(win, conv.weight, conv.bias, conv.stride, 0, conv.dilation, conv.groups)
        if shift:
            wk.shift_window(win, t)
        return y

    def _norm_conv(self, norm, conv, x: torch.Tensor, win: torch.Tensor, shift: bool) -> torch.Tensor:
        x = x.contiguous(memory_format=torch.channels_last_3d)
        gamma, bias = _norm_params(norm)
        wk.norm_silu_into(x, gamma, bias, win)
        return self._conv_window(conv, win, x.shape[2], shift)

    def _causal_conv(self, conv, x: torch.Tensor, phase: int) -> torch.Tensor:
        win = self._window(conv, x, phase)
        write_interior(conv, x, win)
        return self._conv_window(conv, win, x.shape[2], moves_in_step(phase))

    def _residual(self, block, x: torch.Tensor, phase: int) -> torch.Tensor:
        win1, win2 = self._residual_windows(block, x, phase)
        sc = block.conv_shortcut
        h = x if isinstance(sc, torch.nn.Identity) else F.conv3d(x, sc.weight, sc.bias)
        y = self._norm_conv(block.norm1, block.conv1, x, win1, moves_in_step(phase))
        y = self._norm_conv(block.norm2, block.conv2, y, win2, moves_in_step(phase))
        return y + h

    def _head(self, dec, x: torch.Tensor, phase: int) -> torch.Tensor:
        win = self._window(dec.conv_out, x, phase)
        return self._norm_conv(dec.norm_out, dec.conv_out, x, win, moves_in_step(phase))
