"""The built-in variants: precision, dtype/host-sync hygiene (one variant per change), attention, layout, compile.

Each function takes a freshly built reference pipeline and the VariantContext and changes the pipeline in place,
from outside: what it acts on comes from the workload object (`ctx.workload`), how it changes behaviour from
wmbook.variants.swaps. None of them branches on a workload's name.
"""

from __future__ import annotations

import logging

import torch

from . import swaps
from .registry import VariantContext, register, register_group

# --- precision -------------------------------------------------------------------------------------------


@register("tf32", family="precision", tolerance="tf32",
          description="TF32 tensor-core math for fp32 matmuls and convolutions (off by default in PyTorch)")
def _tf32(pipe, ctx: VariantContext):
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    torch.set_float32_matmul_precision("high")
    ctx.notes["tf32"] = "matmul.allow_tf32, cudnn.allow_tf32, float32_matmul_precision=high"


def _weights_to(pipe, ctx: VariantContext, dtype: torch.dtype) -> None:
    """Denoiser and conditioning encoders in `dtype` (the VAE keeps its own dtype: see the vae-* variants)."""
    ctx.workload.denoiser(pipe).to(dtype)
    for m in ctx.workload.conditioning_modules(pipe):
        m.to(dtype)
    pipe.dtype = dtype


@register("bf16", family="precision", tolerance="bf16",
          description="bf16 weights and activations for the denoiser and the conditioning encoders")
def _bf16(pipe, ctx: VariantContext):
    _weights_to(pipe, ctx, torch.bfloat16)


@register("fp16", family="precision", tolerance="fp16", gpu_only=True,
          description="fp16 weights and activations for the denoiser and the conditioning encoders")
def _fp16(pipe, ctx: VariantContext):
    _weights_to(pipe, ctx, torch.float16)


@register("autocast-bf16", family="precision", tolerance="bf16",
          description="fp32 weights, the denoiser forward under torch.autocast(bf16)")
def _autocast_bf16(pipe, ctx: VariantContext):
    model = ctx.workload.denoiser(pipe)
    inner = model.forward
    dev = ctx.device.type

    def forward(*args, **kwargs):
        with torch.autocast(dev, dtype=torch.bfloat16):
            return inner(*args, **kwargs)

    model.forward = forward


def _vae_to(dtype):
    def apply(pipe, ctx: VariantContext):
        ctx.workload.set_vae(pipe, pipe.vae.to(dtype))

    return apply


for _name, _dt in (("vae-fp32", torch.float32), ("vae-bf16", torch.bfloat16), ("vae-fp16", torch.float16)):
    register(_name, family="precision", gpu_only=_dt == torch.float16,
             description=f"VAE decoder in {_name[4:]} (quality measured as PSNR of the decoded frames)")(_vae_to(_dt))


# --- dtype and host-sync hygiene: one change per variant (the group `hygiene` stands for all that apply) ---------


@register("norm-input-dtype", family="hygiene",
          description="norms on the input dtype (fp32 statistics inside the kernel) instead of an fp32 copy of every "
                      "activation and back: RMS/LayerNorm of the DiT, GroupNorm of the UNet")
def _norm_input_dtype(pipe, ctx: VariantContext):
    n = swaps.norms_on_input_dtype(ctx.workload.denoiser(pipe))
    ctx.notes["norm-input-dtype"] = f"{n} norm modules without fp32 round trips"


@register("kv-slot-write", family="hygiene", requires=("kv_cache",),
          description="self-attention K/V written where the cache prepared the slot once per forward, eagerly: no "
                      "start position (a Python int a compiled block guards on) reaches the blocks")
def _kv_slot_write(pipe, ctx: VariantContext):
    swaps.swap_class(ctx.workload.denoiser(pipe), swaps.KVSlotWrites)


@register("action-hoist", family="hygiene", requires=("action_modules",),
          description="the raw actions windowed and the action RoPE tables built once per forward for all action "
                      "modules, with a host-side bounds check (no .item() device read)")
def _action_hoist(pipe, ctx: VariantContext):
    swaps.swap_class(ctx.workload.denoiser(pipe), swaps.HoistedActionInputs)


@register("cross-kv-prefill", family="hygiene", requires=("cross_attention_cache",),
          description="cross-attention K/V filled before the first block instead of lazily in the first forward (a "
                      "compiled block would otherwise have two variants: with and without)")
def _cross_kv_prefill(pipe, ctx: VariantContext):
    swaps.swap_class(pipe, swaps.CrossKVPrefill)


register_group("hygiene", ("norm-input-dtype", "kv-slot-write", "action-hoist", "cross-kv-prefill"))


# --- attention backends ----------------------------------------------------------------------------------


def _attention(backend: str):
    def apply(pipe, ctx: VariantContext):
        from ..models.attention import set_attention_backend

        set_attention_backend(backend)
        ctx.notes[f"attn-{backend}"] = f"attention backend {backend!r} for every attention() call"

    return apply


for _b, _gpu in (("math", False), ("efficient", True), ("flash", True), ("cudnn", True), ("flex", True),
                 ("flash_attn", True)):
    register(f"attn-{_b}", family="attention", gpu_only=_gpu,
             description=f"SDPA/attention backend forced to {_b!r}")(_attention(_b))


def sage_unavailable(device: torch.device) -> str | None:
    """Why the attn-sage variant cannot run on `device` (None when it can)."""
    from ..models.attention import AttentionBackendError, _sage_func

    if device.type != "cuda":
        return f"SageAttention's kernels need a CUDA GPU; this is {device.type}"
    try:
        _sage_func()
    except AttentionBackendError as e:
        return str(e)
    return None


@register("attn-sage", family="attention", tolerance="fp8", gpu_only=True,
          description="quantized attention: SageAttention 1 (Q and K in int8 per block, P.V in fp16) for every "
                      "unmasked attention() call of head dim 64/96/128; the others keep SDPA")
def _sage_attention(pipe, ctx: VariantContext):
    from ..models.attention import reset_sage_call_counts, set_attention_backend

    set_attention_backend("sage")  # an AttentionBackendError says why where it cannot run
    reset_sage_call_counts()
    ctx.notes["attn-sage"] = ("SageAttention for unmasked calls of head dim 64/96/128 and a key length that is a "
                              "multiple of 64, SDPA for the rest "
                              "(wmbook.models.attention.sage_call_counts() says how many of each)")


@register("action-attn-fused", family="attention", requires=("action_modules",),
          description="the action modules' tiny attentions (3 query x <=6 key frames per location and head) as a "
                      "fusable fp32 multiply-reduce, keyboard K/V broadcast instead of copied per location, in place "
                      "of an SDPA kernel that pads every (location, head) problem to a full tile")
def _action_attn_fused(pipe, ctx: VariantContext):
    from ..models.action import ActionModule

    n = swaps.replace_modules(ctx.workload.denoiser(pipe), swaps.of_type(ActionModule),
                              swaps.with_mixin(swaps.SmallActionAttention))
    ctx.notes["action-attn-fused"] = f"{n} action modules on small_attention"


# --- layout ----------------------------------------------------------------------------------------------


@register("cudnn-benchmark", family="layout",
          description="torch.backends.cudnn.benchmark: cuDNN times its algorithms once per shape and keeps the fastest")
def _cudnn_benchmark(pipe, ctx: VariantContext):
    torch.backends.cudnn.benchmark = True


@register("channels-last", family="layout",
          description="channels-last (NHWC / NDHWC) convolution weights, and activations where the workload says, "
                      "for its conv-heavy parts (the VAE decoder; the UNet)")
def _channels_last(pipe, ctx: VariantContext):
    n = 0
    for layout in ctx.workload.conv_layouts(pipe):
        n += swaps.to_memory_format(layout.module, layout.memory_format)
        if layout.inputs:
            swaps.inputs_in_memory_format(layout.module, layout.memory_format)
    ctx.notes["channels-last"] = f"{n} convolution weights in channels-last"


@register("temporal-channels-last", family="layout", requires=("unet",),
          description="the video UNet's temporal conv blocks in channels_last_3d (NDHWC): their Conv3d weights, and "
                      "each ResBlock's [B, C, T, h, w] view of its activation made contiguous in that layout (of a "
                      "channels-last activation it already is: no copy in or out, where NCDHW copies it both ways)")
def _temporal_channels_last(pipe, ctx: VariantContext):
    from ..models.wma.unet import ResBlock

    blocks = [m for m in ctx.workload.denoiser(pipe).modules()
              if isinstance(m, ResBlock) and m.temporal_conv is not None]
    n = 0
    for b in blocks:
        b.temporal_format = torch.channels_last_3d
        n += swaps.to_memory_format(b.temporal_conv, torch.channels_last_3d)
    ctx.notes["temporal-channels-last"] = f"{len(blocks)} temporal conv blocks, {n} Conv3d weights in channels_last_3d"


@register("head-conv-gemm", family="kernels", requires=("unet",),
          description="the action and state heads' 1-D convolutions (ConditionalUnet1D: a few rows of batch x length, "
                      "up to 2048 channels) as GEMMs over their unfolded windows, the transposed ones as a GEMM and an "
                      "overlap-add (F.fold): cuBLAS instead of cuDNN's convolution kernels; the same sums")
def _head_conv_gemm(pipe, ctx: VariantContext):
    from ..models.wma.action_head import ConditionalUnet1D

    heads = [m for m in ctx.workload.denoiser(pipe).modules() if isinstance(m, ConditionalUnet1D)]
    if not heads:
        raise ValueError(f"head-conv-gemm found no 1-D UNet head in the {ctx.workload.name} denoiser")
    counts: dict[str, int] = {}
    for h in heads:
        for k, v in swaps.conv1d_as_gemm(h).items():
            counts[k] = counts.get(k, 0) + v
    ctx.notes["head-conv-gemm"] = f"{len(heads)} heads: " + ", ".join(f"{v} {k}" for k, v in counts.items())


# --- fused Triton kernels and fp8 GEMMs (notebook 05) ----------------------------------------------------------


@register("triton-fused", family="kernels",
          description="notebook 05's fused Triton kernels swapped into the denoiser (torch.library ops: compile traces "
                      "them, graphs capture them): the DiT's adaLN modulate, gated residual + adaLN, q/k RMSNorm + "
                      "RoPE; the UNet's GroupNorm + SiLU (+ the time-embedding add) and its temporal self-attention "
                      "(short sequences, many per program)")
def _triton_fused(pipe, ctx: VariantContext):
    from . import fused

    counts = {**fused.fuse_dit(ctx.workload.denoiser(pipe)), **fused.fuse_unet(ctx.workload.denoiser(pipe))}
    counts = {k: v for k, v in counts.items() if v}
    if not counts:
        raise ValueError(f"triton-fused found nothing to fuse in the {ctx.workload.name} denoiser")
    ctx.notes["triton-fused"] = ", ".join(f"{v} {k}" for k, v in counts.items())


@register("vae-triton-fused", family="decoder",
          description="the decoder's norm + SiLU pairs as one Triton kernel each (Wan VAE: RMS norm + SiLU; SD VAE: "
                      "GroupNorm + SiLU)")
def _vae_triton_fused(pipe, ctx: VariantContext):
    from . import fused

    n = fused.fuse_decoder(pipe.vae.decoder)
    if not n:
        raise ValueError("vae-triton-fused found no norm + SiLU pair in the decoder")
    ctx.notes["vae-triton-fused"] = f"{n} decoder norms fused with their SiLU"


def fp8_unavailable(device: torch.device) -> str | None:
    """Why the fp8 variant cannot run on `device` (None when it can): FP8 tensor cores need a CUDA device of compute
    capability 8.9 or newer, and torchao."""
    if device.type != "cuda":
        return f"fp8 GEMMs need a CUDA GPU with FP8 tensor cores (compute capability >= 8.9); this is {device.type}"
    cap = torch.cuda.get_device_capability(device)
    if cap < (8, 9):
        return f"fp8 GEMMs need compute capability >= 8.9; {torch.cuda.get_device_name(device)} has {cap[0]}.{cap[1]}"
    try:
        # (torchao's SyntaxWarning on a fresh host is filtered where wmbook is imported: diffusers loads it first)
        from torchao.quantization import Float8DynamicActivationFloat8WeightConfig, PerRow, quantize_  # noqa: F401
    except Exception as e:  # noqa: BLE001 -- an import that fails in any way leaves the row out, with the reason
        return f"fp8 needs torchao's float8 inference path (pip install torchao; the `fp8` extra): {e!r}"
    return None


@register("fp8", family="precision", tolerance="fp8", gpu_only=True,
          description="the denoiser's large linears as fp8 GEMMs through torchao's float8 inference path (dynamic "
                      "row-wise scales for activations and weights, e4m3); needs bf16 weights and FP8 tensor cores")
def _fp8(pipe, ctx: VariantContext):
    why = fp8_unavailable(ctx.device)
    if why:
        raise ValueError(why)
    from torchao.quantization import Float8DynamicActivationFloat8WeightConfig, PerRow, quantize_

    model = ctx.workload.denoiser(pipe)
    seen = []

    def big_linear(m, fqn):
        ok = (isinstance(m, torch.nn.Linear) and m.weight.dtype == torch.bfloat16 and m.in_features >= 256
              and m.out_features >= 256 and m.in_features % 16 == 0 and m.out_features % 16 == 0)
        if ok:
            seen.append(fqn)
        return ok

    # set_inductor_config=False: by default the config turns on inductor's coordinate-descent tuning process-wide
    # (torchao.quantization.utils.recommended_inductor_config_setter, never restored), which benchmarks every
    # generated kernel's launch configuration in all directions at compile time (a quarter of an hour for this row at
    # mg2-universal), a setting every later compile in the process would inherit
    quantize_(model, Float8DynamicActivationFloat8WeightConfig(granularity=PerRow(), set_inductor_config=False),
              filter_fn=big_linear)
    if not seen:
        raise ValueError("fp8 found no bf16 linear of >= 256 features: apply bf16 first")
    ctx.notes["fp8"] = f"{len(seen)} linears in fp8 (row-wise dynamic scales)"


# --- torch.compile ---------------------------------------------------------------------------------------

REGIONAL_RECOMPILE_LIMIT = 64


def raise_recompile_limit_for_regions() -> int:
    """The regions share their class's code; every distinct block shape (the UNet's channel widths, the DiT's
    blocks with and without action modules) is one cache entry of it: past the default limit of 8 dynamo would
    silently run the remaining blocks eagerly. Raised process-wide (GlobalFlags restores it); returns the limit."""
    from .compile import get_recompile_limit, recompile_limit_name

    lim = max(get_recompile_limit(), REGIONAL_RECOMPILE_LIMIT)
    setattr(torch._dynamo.config, recompile_limit_name(), lim)
    return lim


_MODE_SUFFIX = {"default": "", "max-autotune-no-cudagraphs": "-max-autotune", "reduce-overhead": "-reduce-overhead"}


def compile_variant(scope: str, mode: str = "default", dynamic: bool = False) -> str:
    """The registered name of a compile variant."""
    return f"compile-{scope}" + ("-dynamic" if dynamic else "") + _MODE_SUFFIX[mode]


def _compile(scope: str, mode: str, dynamic: bool):
    def apply(pipe, ctx: VariantContext):
        from .compile import CompileSpec, apply_compile

        if scope == "regional":
            ctx.notes["recompile_limit"] = f"recompile limit {raise_recompile_limit_for_regions()}"
        spec = CompileSpec(scope=scope, mode=mode, dynamic=dynamic, backend=ctx.compile_backend)
        regions = ctx.workload.compile_regions(pipe) if scope == "regional" else None
        ctx.notes[f"compile:{spec.name}"] = apply_compile(ctx.workload.compile_target(pipe), spec, regions=regions)
        ctx.compile_spec = spec
        if mode == "reduce-overhead":
            _new_cudagraph_step_per_forward(ctx.workload.denoiser(pipe))
            _note_cudagraph_skips(ctx.notes)

    return apply


_SKIP_NOTES: list = []  # the notes of the latest reduce-overhead row (inductor's skip messages go there)


class _CudagraphSkips(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        msg = record.getMessage()
        if _SKIP_NOTES and "skipping cudagraphs" in msg:
            reason = msg.split("skipping cudagraphs", 1)[1].strip(" :")
            _SKIP_NOTES[0]["reduce-overhead"] = f"inductor skipped its CUDA graphs {reason}: this row runs without them"


def _note_cudagraph_skips(notes: dict) -> None:
    """inductor may decline to capture (mutated inputs, CPU tensors, dynamic shapes) and say so only in a log line:
    the reason goes into the row's notes, which the ladder reads after the row's first calls, so a reduce-overhead
    row that ran without graphs says so beside its time."""
    from torch._inductor.cudagraph_utils import cudagraphs_log

    _SKIP_NOTES[:] = [notes]
    if not any(isinstance(h, _CudagraphSkips) for h in cudagraphs_log.handlers):
        cudagraphs_log.addHandler(_CudagraphSkips())


for _scope, _mode, _dyn in (("regional", "default", False), ("regional", "default", True),
                            ("regional", "max-autotune-no-cudagraphs", False), ("whole", "default", False),
                            ("whole", "max-autotune-no-cudagraphs", False), ("regional", "reduce-overhead", False),
                            ("whole", "reduce-overhead", False)):
    register(compile_variant(_scope, _mode, _dyn), family="compile", gpu_only=_mode == "reduce-overhead",
             description=f"torch.compile, {_scope}, mode={_mode}, dynamic={_dyn}"
                         + (" (inductor's CUDA graphs: compare with cuda-graphs)"
                            if _mode == "reduce-overhead" else ""))(_compile(_scope, _mode, _dyn))


def _new_cudagraph_step_per_forward(model: torch.nn.Module) -> None:
    """reduce-overhead's pitfall: a graph's outputs are overwritten by its next replay. Every denoiser forward
    starts a new cudagraph-trees step (torch.compiler.cudagraph_mark_step_begin) and hands out copies of its
    outputs, so nothing the pipeline keeps (latents, the gate's reference outputs) is overwritten under it."""
    inner = model.forward

    def forward(*args, **kwargs):
        torch.compiler.cudagraph_mark_step_begin()
        out = inner(*args, **kwargs)
        return torch.utils._pytree.tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, out)

    model.forward = forward


# --- static state and CUDA graphs (notebook 06) --------------------------------------------------------------


@register("static-caches", family="graphs", requires=("kv_cache",),
          description="the caches of a generation allocated once and reset and refilled in place for the next "
                      "(same addresses every generation: what a CUDA-graph replay needs)")
def _static_caches(pipe, ctx: VariantContext):
    ctx.notes["static-caches"] = ctx.workload.static_caches(pipe)


@register("ring-kv-cache", family="graphs", requires=("kv_cache",),
          description="self-attention and action KV caches as rings of the window's size, written through a device "
                      "index tensor: no eviction copy, and every block once the ring is full has the same shapes and "
                      "addresses whatever its write position (one graph for all of them)")
def _ring_kv_cache(pipe, ctx: VariantContext):
    swaps.swap_class(pipe, swaps.RingCachePipeline)
    ctx.notes["ring-kv-cache"] = "KV caches as rings of the attention window"


@register("cuda-graphs", family="graphs", gpu_only=True,
          description="the workload's graph targets captured in CUDA graphs (static input/output buffers, one memory "
                      "pool, warm-up before capture) and replayed: the denoiser forward (and, for the UNet, the DDIM "
                      "update of video and heads), one launch instead of thousands per forward")
def _cuda_graphs(pipe, ctx: VariantContext):
    from ..graphs import GraphedCallable

    pool = torch.cuda.graph_pool_handle()
    wrapped = []
    for t in ctx.workload.graph_targets(pipe):
        g = GraphedCallable(getattr(t.owner, t.attr), name=t.name, key_fn=t.key_fn, pool=pool, device=ctx.device)
        setattr(t.owner, t.attr, g)
        wrapped.append(g)
    pipe.graphed = wrapped  # what graphed_callables(pipe) reports on
    ctx.notes["cuda-graphs"] = "graphs of " + ", ".join(g.name for g in wrapped)


def graphed_callables(pipe) -> list:
    """The GraphedCallables the cuda-graphs variant put into a pipeline (their table() says what was captured)."""
    return list(getattr(pipe, "graphed", []))


# --- the streaming decoder (the other half of every block) -----------------------------------------------------------


def buffered_decoder(decoder):
    """The streaming decoder with its causal caches kept in place (swapped in once)."""
    from .vae_stream import BufferedStreamingDecoder

    if not isinstance(decoder, BufferedStreamingDecoder):
        if getattr(decoder, "compiled_step", False):
            raise ValueError("vae-stream-buffers (or vae-cuda-graphs, which brings it) must come before vae-compile: "
                             "the compiled step was made from the decoder without buffers")
        swaps.swap_class(decoder, BufferedStreamingDecoder).use_buffers()
    return decoder


@register("vae-stream-buffers", family="decoder", requires=("streaming_decoder",),
          description="the streaming Wan decoder's causal caches kept in place: one preallocated, zero-bordered input "
                      "window per causal convolution (input written once, convolved without padding, past frames moved "
                      "to the front) instead of a clone, two concatenations and an F.pad copy per convolution and "
                      "frame")
def _vae_stream_buffers(pipe, ctx: VariantContext):
    buffered_decoder(ctx.workload.streaming_decoder(pipe))
    ctx.notes["vae-stream-buffers"] = "decoder causal caches in preallocated input windows"


@register("vae-channels-last", family="decoder", requires=("streaming_decoder",),
          description="the streaming decoder in channels_last_3d (NDHWC): its 3-D convolution weights, its input and, "
                      "with vae-stream-buffers, every causal convolution's input window")
def _vae_channels_last(pipe, ctx: VariantContext):
    dec = ctx.workload.streaming_decoder(pipe)
    if hasattr(dec, "use_channels_last"):  # a stand-in decoder of 2-D convolutions (vae-tiny) sets its own layout
        ctx.notes["vae-channels-last"] = f"{dec.use_channels_last()} decoder convolution weights in channels-last"
        return
    n = swaps.to_memory_format(dec.vae.decoder, torch.channels_last_3d)
    n += swaps.to_memory_format(dec.vae.decoder, torch.channels_last)  # the resamplers' 2-D convolutions
    swaps.swap_class(dec, swaps.FramesInMemoryFormat)
    dec.memory_format = torch.channels_last_3d
    if hasattr(dec, "windows"):
        dec.use_buffers(torch.channels_last_3d)
    ctx.notes["vae-channels-last"] = f"{n} decoder convolution weights in channels-last"


def _vae_compile(mode: str):
    def apply(pipe, ctx: VariantContext):
        if "streaming_decoder" in ctx.workload.features and hasattr(ctx.workload.streaming_decoder(pipe), "regions"):
            raise ValueError("vae-compile and vae-compile-regional both compile the decoder: use one of them")
        step = ctx.workload.decoder_step(pipe)
        eager = getattr(step.owner, step.attr)
        compiled = torch.compile(eager, mode=None if mode == "default" else mode, backend=ctx.compile_backend,
                                 dynamic=False)
        if step.compiled is None:
            setattr(step.owner, step.attr, compiled)
        else:
            def decode_step(*args, **kwargs):  # the calls the workload says to compile; the others stay eager
                return (compiled if step.compiled(args) else eager)(*args, **kwargs)

            setattr(step.owner, step.attr, decode_step)
        step.owner.compiled_step = True
        ctx.notes[f"vae-compile:{mode}"] = f"decoder step compiled ({mode}, {ctx.compile_backend})"

    return apply


for _mode, _suffix in (("default", ""), ("max-autotune-no-cudagraphs", "-max-autotune")):
    register(f"vae-compile{_suffix}", family="decoder", requires=("frame_decoder",),
             description=f"torch.compile of the decoder's per-frame step (mode={_mode}; a streaming decoder's steady "
                         f"frames); the first decode pays the compilation")(_vae_compile(_mode))


@register("vae-compile-regional", family="decoder", requires=("streaming_decoder",),
          description="torch.compile of the streaming Wan decoder's regions for its steady frames: each residual "
                      "block, the head (norm + SiLU + conv_out) and the other causal convolutions, with their cache "
                      "windows as arguments (vae-stream-buffers comes with it), so blocks of one shape share a "
                      "compiled graph: a compile per distinct block shape instead of the whole step's; the attention "
                      "and the resamplers' 2-D convolutions stay eager")
def _vae_compile_regional(pipe, ctx: VariantContext):
    from .vae_stream import RegionalCompiledDecoder

    dec = ctx.workload.streaming_decoder(pipe)
    if hasattr(dec, "decoder_step"):
        raise ValueError("vae-compile-regional compiles the Wan decoder's blocks; the stand-in decoder (vae-tiny) has "
                         "none: use vae-compile")
    if getattr(dec, "compiled_step", False):
        raise ValueError("vae-compile-regional and vae-compile both compile the decoder: use one of them")
    buffered_decoder(dec)
    swaps.swap_class(dec, RegionalCompiledDecoder).compile_regions(backend=ctx.compile_backend)
    # one compiled graph per distinct block shape (and layout): more than dynamo's default of 8 for one function
    limit = raise_recompile_limit_for_regions()
    ctx.notes["vae-compile-regional"] = (f"decoder residual blocks, head and causal convolutions compiled as regions "
                                         f"({ctx.compile_backend}; recompile limit {limit})")


@register("vae-cuda-graphs", family="decoder", requires=("frame_decoder",), gpu_only=True,
          description="the decoder's per-frame step captured in CUDA graphs, in a memory pool of their own (decode may "
                      "overlap the denoiser); a streaming decoder first gets its caches in fixed buffers "
                      "(vae-stream-buffers) and one graph per phase (its first frame, its second, the steady ones)")
def _vae_cuda_graphs(pipe, ctx: VariantContext):
    from ..graphs import GraphedCallable

    step = ctx.workload.decoder_step(pipe)
    if step.make_static is not None:
        step.make_static(pipe)
    g = GraphedCallable(getattr(step.owner, step.attr), name="decoder step", device=ctx.device,
                        pool=torch.cuda.graph_pool_handle())
    setattr(step.owner, step.attr, g)
    pipe.graphed = [*getattr(pipe, "graphed", []), g]
    ctx.notes["vae-cuda-graphs"] = "decoder step graphed"


@register("vae-tiny", family="decoder", requires=("streaming_decoder",), frames_judged=False,
          description="a tiny streaming decoder (TAEHV, ~10 M parameters, no 3-D convolutions) in place of the Wan VAE "
                      "decoder; random weights unless WMBOOK_TAEHV_WEIGHTS names a taew2_1.pth-style file, so its "
                      "frames' quality needs real weights")
def _vae_tiny(pipe, ctx: VariantContext):
    import os

    from ..models.taehv import StreamingTAEHVDecoder, build_taehv, load_taehv_decoder

    path = os.environ.get("WMBOOK_TAEHV_WEIGHTS", "")
    tiny = build_taehv(ctx.workload.decoder_size(pipe), dtype=pipe.vae_dtype, device=ctx.device)
    if path:
        load_taehv_decoder(tiny, path)
    ctx.workload.set_streaming_decoder(pipe, StreamingTAEHVDecoder(tiny))
    ctx.notes["vae-tiny"] = f"TAEHV decoder, {'weights ' + path if path else 'random weights (quality not judged)'}"


@register("decode-overlap", family="graphs", requires=("streaming_decoder",), gpu_only=True,
          description="block k decoded on a second CUDA stream while the DiT denoises block k+1 (events order the "
                      "streams; the next block needs block k's caches, not its pixels)")
def _decode_overlap(pipe, ctx: VariantContext):
    if getattr(ctx.workload.streaming_decoder(pipe), "compiled_step", False):
        raise ValueError("decode-overlap cannot follow vae-compile: the inductor-compiled decoder step run on a second "
                         "CUDA stream gave different frames than on the main stream (H100, mg2-universal: max abs "
                         "difference up to 0.38 from the second block on; the eager step is bit-exact; "
                         "tools/overlap_check.py); leave out one of them")
    swaps.swap_class(pipe, swaps.DecodeOverlap)
    ctx.notes["decode-overlap"] = "decode on a second stream"


@register("skip-unused-heads", family="graphs", requires=("ddim", "unet"),
          description="each pass runs only the head it is read for: the decision pass its action head (its states "
                      "are not read), the world-model pass its state head (its actions are not read); half the heads' "
                      "forwards of an iteration, the same actions, states, latents and frames")
def _skip_unused_heads(pipe, ctx: VariantContext):
    from ..models.wma.action_head import ConditionalUnet1D

    unet = getattr(ctx.workload.denoiser(pipe), "diffusion_model", None)
    heads = [getattr(unet, "action_unet", None), getattr(unet, "state_unet", None)]
    if not all(isinstance(h, ConditionalUnet1D) for h in heads):
        raise ValueError(f"skip-unused-heads needs the action and state heads; the {ctx.workload.name} denoiser has "
                         "none")
    for h in heads:
        swaps.swap_class(h, swaps.SkippableHead)
    swaps.swap_class(pipe, swaps.SkipUnusedHeads)
    ctx.notes["skip-unused-heads"] = "decision pass: action head only; world-model pass: state head only"


@register("skip-unused-decode", family="graphs", requires=("ddim",),
          description="the decision pass's video is not decoded (only its action chunk is used; the world-model pass "
                      "decodes the iteration's frames)")
def _skip_unused_decode(pipe, ctx: VariantContext):
    swaps.swap_class(pipe, swaps.SkipUnusedDecode)
    ctx.notes["skip-unused-decode"] = "decision pass not decoded"
