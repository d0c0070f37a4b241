"""Optimizations as transforms applied from outside the reference models (gpt-fast / segment-anything-fast style).

The reference modules carry no optimization flags. A variant changes behaviour by

- `replace_modules(model, match, make)`: every submodule `match` accepts is replaced by `make(module)`;
- `swap_class(obj, Mixin)`: one object's class becomes `Mixin + its class` (state and parameters untouched, so
  compiled regions, caches and references to the object stay valid); mixins compose in the order applied.

and the mixins below, each the optimized override of one reference method. Every one of them is checked
against the fp32 reference by the ladder's gate before its time counts.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..models.action import prepare_action_inputs
from ..models.attention import small_attention
from ..profiling.labels import label

_COMBINED: dict[tuple[type, type], type] = {}


def swap_class(obj, mixin: type):
    """Give `obj` the class `mixin + type(obj)` (created once per pair, so copies share it); returns obj.

    A mixin already in the object's class is not added twice."""
    cls = type(obj)
    if issubclass(cls, mixin):
        return obj
    key = (mixin, cls)
    if key not in _COMBINED:
        _COMBINED[key] = type(f"{mixin.__name__}[{cls.__name__}]", (mixin, cls), {"__module__": cls.__module__})
    obj.__class__ = _COMBINED[key]
    return obj


def replace_modules(model: nn.Module, match, make) -> int:
    """Replace every submodule m of `model` with match(m) true by make(m) (depth first, a replaced module's
    children are not visited); returns how many were replaced."""
    n = 0
    for name, child in list(model.named_children()):
        if match(child):
            setattr(model, name, make(child))
            n += 1
        else:
            n += replace_modules(child, match, make)
    return n


def with_mixin(mixin: type):
    """`make` for replace_modules: the same module with `mixin` swapped in."""
    return lambda m: swap_class(m, mixin)


def of_type(*types: type):
    """`match` for replace_modules: modules whose class is one of `types` or derived from it."""
    return lambda m: isinstance(m, types)


# --- norms on the input dtype (hygiene: no fp32 round trip per norm) ----------------------------------------------


class RMSNormInputDtype:
    """WanRMSNorm as one fused rms_norm on the input dtype (statistics still accumulate in fp32 in the kernel)."""

    def forward(self, x):
        return F.rms_norm(x, (self.dim,), self.weight, self.eps)


class LayerNormInputDtype:
    """WanLayerNorm as layer_norm on the input dtype (fp32 statistics inside the kernel), no fp32 copy of x."""

    def forward(self, x):
        return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)


class GroupNormInputDtype:
    """GroupNorm32 as group_norm on the input dtype (fp32 statistics inside the kernel), no fp32 copy of x."""

    def forward(self, x):
        return F.group_norm(x, self.num_groups, self.weight, self.bias, self.eps)


def norms_on_input_dtype(model: nn.Module) -> int:
    """Swap every fp32-round-trip norm of the reference models for its input-dtype form; returns the count."""
    from ..models.causal_wan import WanLayerNorm, WanRMSNorm  # noqa: PLC0415  heavy: models.causal_wan brings pandas
    from ..models.wma.layers import GroupNorm32  # noqa: PLC0415  heavy: models.wma (diffusers)

    n = replace_modules(model, of_type(WanRMSNorm), with_mixin(RMSNormInputDtype))
    n += replace_modules(model, of_type(WanLayerNorm), with_mixin(LayerNormInputDtype))
    return n + replace_modules(model, of_type(GroupNorm32), with_mixin(GroupNormInputDtype))


# --- the causal DiT: no Python ints inside a block ----------------------------------------------------------------


class KVSlotWrites:
    """CausalWanModel whose blocks write their self-attention K/V where GenerationCache.begin() put the slot, so
    no start position (a Python int a compiled block would guard on) reaches them."""

    @torch.compiler.disable  # eager, like the reference's: what depends on the int stays out of compiled graphs
    def _position_inputs(self, grid, start_frame, cache, actions, dtype, device):
        pos = super()._position_inputs(grid, start_frame, cache, actions, dtype, device)
        if cache is not None:
            pos.attn_start = None
        return pos


class HoistedActionInputs:
    """CausalWanModel that windows the raw actions and builds the action RoPE tables once per forward for all
    action modules (upstream: each module again), with a host-side bounds check instead of a device read."""

    @torch.compiler.disable
    def _position_inputs(self, grid, start_frame, cache, actions, dtype, device):
        pos = super()._position_inputs(grid, start_frame, cache, actions, dtype, device)
        p = self.preset
        mods = [b.action_model for b in self.blocks if b.action_model is not None]
        if actions is not None and mods:
            pos.action_inputs = prepare_action_inputs(
                actions, start_frame, grid[0], p.action, dtype, frames_per_block=p.num_frame_per_block,
                local_attn_size=mods[0].local_attn_size, cached=cache is not None, sync_check=False)
            if cache is not None:
                pos.action_start = None
        return pos


class CrossKVPrefill:
    """CausalStreamingPipeline that fills every layer's cross-attention K/V right after the caches are made,
    instead of lazily in the first forward (which gives a compiled block two variants: with and without)."""

    def init_cache(self, inputs):
        cache = super().init_cache(inputs)
        with torch.no_grad():
            self.model.prefill_cross_cache(inputs.context, cache)
        return cache


class StaticGenerationCache:
    """CausalStreamingPipeline whose generations share one set of caches, allocated by the first and reset in
    place for every later one with the same batch, dtype and device, the cross-attention K/V refilled in place
    before the first block: the caches keep their addresses, which is what CUDA-graph replays need. Only a
    generation's caches (generation_cache) are shared; other callers of init_cache (the forward probe) get caches of
    their own."""

    def generation_cache(self, inputs):
        self._static_generation = True  # init_cache, through every class swapped in (ring caches), shares the set
        try:
            return super().generation_cache(inputs)
        finally:
            self._static_generation = False

    def init_cache(self, inputs):
        if not getattr(self, "_static_generation", False):
            return super().init_cache(inputs)
        key = (inputs.noise.shape[0], self.dtype, str(self.device))
        cache = getattr(self, "_static_cache", None)
        if cache is None or self._static_cache_key != key:
            cache = super().init_cache(inputs)
            self._static_cache, self._static_cache_key = cache, key
        else:
            cache.reset()
        with torch.no_grad():
            self.model.prefill_cross_cache(inputs.context, cache)
        return cache


class RingKVCache:
    """KVCache as a ring of `window` tokens: absolute token t lives in slot t % window, written with index_copy_
    through a device index tensor that begin() fills (eagerly, from the host's ints: no device read). Nothing is
    evicted or moved: the oldest tokens are overwritten in place. Once the ring is full every forward reads the whole
    ring, so every later block has the same shapes and the same addresses whatever its write position (one CUDA
    graph for all of them). Keys carry their RoPE rotation, so attending over the ring's slot order instead of time
    order changes only the order of the softmax sums (fp32 rounding)."""

    def ring_init(self) -> None:
        """Size the buffers to the window (the attention span: what the reference keeps after evicting)."""
        if getattr(self, "_ring", False):
            return
        if self.window < self.capacity:
            self.k = self.k.new_zeros(self.k.shape[0], self.window, *self.k.shape[2:])
            self.v = torch.zeros_like(self.k)
            self.capacity = self.window
        self._ring, self.write_idx = True, None
        self.reset()

    def begin(self, start: int, n: int) -> None:
        if n > self.capacity:
            raise ValueError(f"cannot write {n} tokens into a ring KV cache of {self.capacity} tokens")
        if start + n <= self.global_end - self.capacity:
            raise ValueError(f"tokens {start}..{start + n} left the ring (it holds {self.global_end - self.capacity}.."
                             f"{self.global_end})")
        # one index tensor per (device, block size, ring size), shared by every cache of that size (the 30 layers'):
        # allocated once (a graph reads it where it was captured) and refilled only when the position moves
        key = (self.k.device, n, self.capacity)
        shared = _RING_INDEX.get(key)
        if shared is None:
            ar = torch.arange(n, device=self.k.device)
            shared = _RING_INDEX[key] = [ar, torch.empty_like(ar), None]
        if shared[2] != start:
            torch.add(shared[0], start, out=shared[1]).remainder_(self.capacity)
            shared[2] = start
        self.write_idx = shared[1]
        self.global_end = max(self.global_end, start + n)
        self.slot = ("ring", min(self.global_end, self.capacity))  # what the attention reads: the filled prefix

    def _write(self, k: torch.Tensor, v: torch.Tensor):
        if k.shape[1] != self.write_idx.numel():
            raise ValueError(f"begin() prepared a write of {self.write_idx.numel()} tokens, got {k.shape[1]}")
        self.k.index_copy_(1, self.write_idx, k)
        self.v.index_copy_(1, self.write_idx, v)
        n = self.slot[1]
        return self.k[:, :n], self.v[:, :n]


_RING_INDEX: dict = {}  # (device, block tokens, ring tokens) -> [arange, write index, the start it holds]


def ring_caches(cache) -> int:
    """Turn every self-attention and action KV cache of a GenerationCache into a RingKVCache; returns the count."""
    caches = list(cache.kv) + [c for a in cache.action if a is not None for c in (a.mouse, a.keyboard) if c is not None]
    for c in caches:
        swap_class(c, RingKVCache).ring_init()
    return len(caches)


class RingCachePipeline:
    """CausalStreamingPipeline whose generations use ring KV caches (RingKVCache)."""

    def init_cache(self, inputs):
        cache = super().init_cache(inputs)
        ring_caches(cache)
        return cache


class DecodeOverlap:
    """CausalStreamingPipeline that decodes each block on a second CUDA stream, so that the DiT denoises block k+1
    while block k decodes: block k+1 needs block k's refreshed caches, not its pixels. Events order the streams: the
    decode of a block waits for everything queued before it on the main stream (its latents); the main stream
    waits for the last decode before the frames are used. The block's end mark is recorded on the decode stream."""

    def decode_block(self, x0, timer, done, on_frames=None):
        main = torch.cuda.current_stream(self.device)
        side = getattr(self, "_decode_stream", None)
        if side is None:
            side = self._decode_stream = torch.cuda.Stream(self.device)
        side.wait_stream(main)
        with torch.cuda.stream(side):
            frames = self.decoder.decode_block(x0.to(self.vae_dtype), on_frames=on_frames)
            timer.mark(done)
        return frames  # x0 and the frames stay referenced by the generation until it ends: no early reuse

    def decode_done(self):
        side = getattr(self, "_decode_stream", None)
        if side is not None:
            torch.cuda.current_stream(self.device).wait_stream(side)


class DecodeBeforeRefresh:
    """CausalStreamingPipeline that decodes each block before its cache-refresh forward: the refresh writes what the
    next block attends to and the decode reads only the block's clean latents, so the frames are the same and arrive
    one DiT forward sooner (the first frame of a stream most of all); the block's work is unchanged."""

    decode_before_refresh = True


class FramesPerLatentFrame:
    """CausalStreamingPipeline whose decoder hands out each latent frame's pixel frames as soon as they are decoded,
    not when the block's last latent frame is: a stream's first frame (the first latent frame decodes to one pixel
    frame) leaves after one latent frame's decode; the frames are the same."""

    stream_frames = True


class FramesInMemoryFormat:
    """StreamingWanDecoder whose per-frame step gets its input in the decoder's `memory_format` (channels_last_3d:
    the layout then carries through the convolutions that follow)."""

    def decode_frame(self, x, phase, staged=False):
        return super().decode_frame(x.contiguous(memory_format=self.memory_format), phase, staged)


class BlockStep:
    """StreamingWanDecoder whose step, after the stream's first latent frame and the call after it, takes all the
    latent frames of a decode_block call at once (a steady block's 3 at mg2-universal) instead of one per call: the
    same causal convolutions on the same past frames, over 3x the frames a call (bigger GEMMs for the convolutions of
    the small early stages, the past frames moved once a block instead of once a latent frame)."""

    step_per_frame = False


class SkipUnusedDecode:
    """WMAInteractionPipeline that does not decode the decision pass's video: upstream uses only its action chunk
    (the world-model pass's frames are the iteration's video), so its per-frame VAE decode is work nobody reads."""

    def run_iteration(self, inputs, **kw):
        kw.setdefault("decode_decision", False)
        return super().run_iteration(inputs, **kw)


class EncodeKeptFrame:
    """WMAInteractionPipeline that VAE-encodes only the observed frame it keeps (the last): upstream encodes every
    observed frame and drops all but the last one's latent. Each dropped frame's posterior draw is still taken from the
    generator, with the call diffusers' posterior sample makes (same shape, device and dtype), so the kept latent and
    everything sampled after it are what upstream's loop gives, bit for bit."""

    def encode_observation(self, images, gen):
        from diffusers.utils.torch_utils import randn_tensor  # noqa: PLC0415  heavy: diffusers

        last = images.shape[2] - 1
        with label(f"VAE_Encode_Frame_{last}"):
            posterior = self.vae.encode(images[:, :, last].to(self.vae.dtype)).latent_dist
            for _ in range(last):
                randn_tensor(posterior.mean.shape, generator=gen, device=posterior.parameters.device,
                             dtype=posterior.parameters.dtype)
            return posterior.sample(generator=gen) * self.preset.scale_factor


class ConstantConditioning:
    """WMAInteractionPipeline that computes the conditioning that does not change between iterations once: the
    instruction's and the empty prompt's text tokens (per instruction and batch) and a zero image's tokens (per shape
    and dtype). The encoders are deterministic and their weights fixed, so the tokens are those computed anew."""

    def _once(self, store: str, key, make):
        cache = self.__dict__.setdefault(store, {})
        if key not in cache:
            cache[key] = make()
        return cache[key]

    def embed_text(self, instruction, batch):
        return self._once("_text_tokens", (instruction, batch), lambda: super(ConstantConditioning, self).embed_text(
            instruction, batch))

    def embed_zero_image(self, like):
        return self._once("_zero_image_tokens", (tuple(like.shape), like.dtype, like.device),
                          lambda: super(ConstantConditioning, self).embed_zero_image(like))


class BatchedFrames:
    """A pipeline whose decode hands its T latent frames to the per-frame decode step as one batch of B*T images:
    a decoder that decodes every frame alone (upstream's perframe_ae) computes the same per image, and one call of
    B*T images keeps the GPU fuller than T calls of B (the first decoder layers see 40 x 64 latents)."""

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        b, c, t, h, w = latents.shape
        with label("VAE_Decode_Frames"):
            images = self.decode_step(latents.transpose(1, 2).reshape(b * t, c, h, w).contiguous())
        return images.reshape(b, t, *images.shape[1:]).transpose(1, 2).contiguous()  # [B, 3, T, H, W], as decode's


class SkippableHead:
    """ConditionalUnet1D (an action or state head) that returns zeros of its sample's shape, without running, while
    `skip` is set (SkipUnusedHeads sets it for the pass that does not read the head).

    Under torch.compile of the whole UNet the flag must not reach a graph: dynamo would guard on it and compile the
    head twice more, once per pass. So dynamo skips this frame (`disable(recursive=False)`): the flag is read in
    Python and the head's own forward, which dynamo still processes, is compiled once as a graph of its own. The UNet's
    trunk ends before the heads either way (UNetModel.run_heads): its graph is the one the stack compiled without
    this variant, found in the compile cache."""

    skip = False

    @torch._dynamo.disable(recursive=False, reason="skip-unused-heads reads its flag outside the compiled graphs")
    def forward(self, sample, *args, **kwargs):
        if self.skip:
            return torch.zeros_like(sample)
        return super().forward(sample, *args, **kwargs)


class SkipUnusedHeads:
    """WMAInteractionPipeline whose passes run only the head whose output is read: the decision pass reads its action
    chunk (the world-model pass's action tokens and the iteration's actions) but not its states; the world-model
    pass reads its states (the iteration's states) but not its actions. The unread head is skipped for the whole
    pass (its DDIM update then steps zeros, drawing no noise) and the pass's unread output is None; what is read is
    the same as the reference's."""

    def sample_pass(self, tag, *args, **kwargs):
        unet = self.model.diffusion_model
        skip_action, skip_state = tag == "3", tag == "2"
        unet.action_unet.skip, unet.state_unet.skip = skip_action, skip_state
        try:
            out = super().sample_pass(tag, *args, **kwargs)
        finally:
            unet.action_unet.skip = unet.state_unet.skip = False
        if skip_action:
            out.actions = None
        if skip_state:
            out.states = None
        return out


# --- the action modules' tiny attentions --------------------------------------------------------------------------


class SmallActionAttention:
    """ActionModule whose tiny per-location attentions (3 query x <= 6 key frames per location and head) run as a
    fusable fp32 multiply-reduce (models.attention.small_attention), the keyboard K/V broadcast to every location
    instead of copied, in place of an SDPA kernel that pads every (location, head) problem to a full tile."""

    def mouse_attention(self, q, k, v, mask):
        return small_attention(q, k, v, mask=mask).flatten(2)

    def keyboard_attention(self, q, kk, kv, mask, b: int, s: int):
        f, nh = q.shape[1], q.shape[2]
        # [B, S, F, H, D] against [B, 1, nk, H, D]: no per-location copy
        return small_attention(q.view(b, s, f, nh, -1), kk[:, None], kv[:, None], mask=mask).reshape(b * s, f, -1)


# --- layout ----------------------------------------------------------------------------------------------------


def to_memory_format(module: nn.Module, fmt: torch.memory_format) -> int:
    """Convolution weights of the format's rank (4-D for channels_last, 5-D for channels_last_3d) in that format;
    others are left as they are (Module.to(memory_format=...) refuses a module mixing both ranks)."""
    rank = 4 if fmt == torch.channels_last else 5
    n = 0
    for m in module.modules():
        if isinstance(m, (nn.Conv2d, nn.Conv3d, nn.ConvTranspose2d, nn.ConvTranspose3d)) and m.weight.dim() == rank:
            m.weight.data = m.weight.data.contiguous(memory_format=fmt)
            n += 1
    return n


def inputs_in_memory_format(module: nn.Module, fmt: torch.memory_format) -> None:
    """A forward pre-hook giving `module` its first (activation) argument in `fmt`: the layout then carries
    through the convolutions that follow."""

    def hook(mod, args):
        return (args[0].contiguous(memory_format=fmt), *args[1:])

    module.register_forward_pre_hook(hook)


# --- 1-D convolutions as GEMMs (the wma action and state heads) ---------------------------------------------------


def _plain_1d(m: nn.Module) -> bool:
    """A 1-D (transposed) convolution a GEMM can stand in for: one group, no dilation, zero padding by an int."""
    return (m.groups == 1 and m.dilation == (1,) and m.padding_mode == "zeros" and isinstance(m.padding, tuple))


class Conv1dAsGemm:
    """nn.Conv1d as one GEMM over its input's windows: [N, C, L] -> padded, unfolded to [N * L_out, C * k] (one
    small copy), times the weight viewed [C_out, C * k]. The same sums as the convolution; the GEMM library
    (cuBLAS) takes them instead of a cuDNN convolution kernel, which the heads' shapes (a few rows of N * L, up
    to 2048 channels and 42 MB of weight per layer) suit badly."""

    def forward(self, x):
        k, s, p = self.kernel_size[0], self.stride[0], self.padding[0]
        n, c, _ = x.shape
        if p:
            x = F.pad(x, (p, p))
        cols = x.unfold(2, k, s)  # [N, C, L_out, k] (a view)
        lout = cols.shape[2]
        cols = cols.permute(0, 2, 1, 3).reshape(n * lout, c * k)  # row (n, l), column (c, j): the weight's order
        w = self.weight.reshape(self.out_channels, c * k)
        y = cols @ w.t() if self.bias is None else torch.addmm(self.bias, cols, w.t())
        return y.view(n, lout, self.out_channels).transpose(1, 2).contiguous()


class ConvTranspose1dAsGemm:
    """nn.ConvTranspose1d as one GEMM and an overlap-add: every input position times the weight viewed
    [C_in, C_out * k] gives its k output taps ([N, C_out * k, L]); F.fold adds the overlapping taps at stride s and
    crops the padding, which is what a transposed convolution computes."""

    def forward(self, x, output_size=None):
        if output_size is not None:
            raise ValueError("ConvTranspose1dAsGemm: output_size is not supported; the heads never pass it")
        k, s, p, op = self.kernel_size[0], self.stride[0], self.padding[0], self.output_padding[0]
        n, c, length = x.shape
        w = self.weight.reshape(c, self.out_channels * k)  # weight [C_in, C_out, k]: column (o, j)
        taps = (x.transpose(1, 2).reshape(n * length, c) @ w).view(n, length, -1).transpose(1, 2)
        lout = (length - 1) * s - 2 * p + k + op
        y = F.fold(taps, output_size=(1, lout), kernel_size=(1, k), stride=(1, s), padding=(0, p)).squeeze(2)
        return y if self.bias is None else y + self.bias[:, None]


def conv1d_as_gemm(model: nn.Module) -> dict[str, int]:
    """Swap the plain Conv1d / ConvTranspose1d modules of `model` for their GEMM forms; returns the counts."""
    n = replace_modules(model, lambda m: type(m) is nn.Conv1d and _plain_1d(m), with_mixin(Conv1dAsGemm))
    t = replace_modules(model, lambda m: type(m) is nn.ConvTranspose1d and _plain_1d(m),
                        with_mixin(ConvTranspose1dAsGemm))
    return {"Conv1d": n, "ConvTranspose1d": t}
