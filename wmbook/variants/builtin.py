"""The built-in variants: precision, dtype hygiene, attention backend, layout, torch.compile.

Each function takes a freshly built reference pipeline (`CausalStreamingPipeline` for mg2,
`WMAInteractionPipeline` for wma) and the VariantContext, and changes it in place.
"""

from __future__ import annotations

import torch

from . import VariantContext, register


def _denoiser(pipe):
    """The module that one forward runs (the DiT, or the UNet with its heads)."""
    return pipe.model


def _conditioning_modules(pipe) -> list[torch.nn.Module]:
    return [m for m in (getattr(pipe, "clip", None), getattr(pipe, "text", None)) if isinstance(m, torch.nn.Module)]


def _weights_to(pipe, dtype: torch.dtype) -> None:
    """Denoiser and conditioning encoders in `dtype` (the VAE keeps its own dtype: see the vae-* variants)."""
    _denoiser(pipe).to(dtype)
    for m in _conditioning_modules(pipe):
        m.to(dtype)
    pipe.dtype = dtype


# --- precision -------------------------------------------------------------------------------------------


@register("tf32", family="precision", tolerance="tf32",
          description="TF32 tensor-core math for fp32 matmuls and convolutions (off by default in PyTorch)")
def _tf32(pipe, ctx: VariantContext):
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    torch.set_float32_matmul_precision("high")
    ctx.notes["tf32"] = "matmul.allow_tf32, cudnn.allow_tf32, float32_matmul_precision=high"


@register("bf16", family="precision", tolerance="bf16",
          description="bf16 weights and activations for the denoiser and the conditioning encoders")
def _bf16(pipe, ctx: VariantContext):
    _weights_to(pipe, torch.bfloat16)


@register("fp16", family="precision", tolerance="fp16", gpu_only=True,
          description="fp16 weights and activations for the denoiser and the conditioning encoders")
def _fp16(pipe, ctx: VariantContext):
    _weights_to(pipe, torch.float16)


@register("autocast-bf16", family="precision", tolerance="bf16",
          description="fp32 weights, the denoiser forward under torch.autocast(bf16)")
def _autocast_bf16(pipe, ctx: VariantContext):
    model = _denoiser(pipe)
    inner = model.forward
    dev = ctx.device.type

    def forward(*args, **kwargs):
        with torch.autocast(dev, dtype=torch.bfloat16):
            return inner(*args, **kwargs)

    model.forward = forward


def _vae_to(dtype):
    def apply(pipe, ctx: VariantContext):
        pipe.vae.to(dtype)
        pipe.vae_dtype = dtype

    return apply


for _name, _dt in (("vae-fp32", torch.float32), ("vae-bf16", torch.bfloat16), ("vae-fp16", torch.float16)):
    register(_name, family="precision", gpu_only=_dt == torch.float16,
             description=f"VAE decoder in {_name[4:]} (quality measured as PSNR of the decoded frames)")(_vae_to(_dt))


# --- dtype hygiene ---------------------------------------------------------------------------------------


@register("hygiene", family="hygiene",
          description="no redundant dtype round trips or host syncs in the loop: norms on the input dtype; for "
                      "mg2 also the action inputs windowed once per forward with a host-side bounds check (no "
                      ".item()) and the cross-attention K/V filled before the first block")
def _hygiene(pipe, ctx: VariantContext):
    changed = 0
    if ctx.workload == "mg2":
        from ..models.causal_wan import WanLayerNorm, WanRMSNorm

        for m in pipe.model.modules():
            if isinstance(m, (WanLayerNorm, WanRMSNorm)):
                m.fused = True
                changed += 1
        pipe.model.hoist_action_inputs = True
        pipe.prefill_cross = True
    else:
        from ..models.wma.layers import GroupNorm32

        for m in pipe.model.modules():
            if isinstance(m, GroupNorm32):
                m.fused = True
                changed += 1
    ctx.notes["hygiene"] = f"{changed} norm modules without fp32 round trips"


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


@register("action-attn-fused", family="attention", workloads=("mg2",),
          description="the action modules' tiny attentions (3 query x <=6 key frames per location and head) as a "
                      "fusable fp32 multiply-reduce, keyboard K/V broadcast instead of copied per location, in place "
                      "of an SDPA kernel that pads every (location, head) problem to a full tile")
def _action_attn_fused(pipe, ctx: VariantContext):
    from ..models.action import ActionModule

    mods = [m for m in pipe.model.modules() if isinstance(m, ActionModule)]
    for m in mods:
        m.fused_small_attention = True
    ctx.notes["action-attn-fused"] = f"{len(mods)} action modules on small_attention"


# --- layout ----------------------------------------------------------------------------------------------


@register("cudnn-benchmark", family="layout",
          description="torch.backends.cudnn.benchmark: cuDNN times its algorithms once per shape and keeps the fastest")
def _cudnn_benchmark(pipe, ctx: VariantContext):
    torch.backends.cudnn.benchmark = True


def to_memory_format(module: torch.nn.Module, fmt: torch.memory_format) -> int:
    """Convolution weights of the format's rank (4-D for channels_last, 5-D for channels_last_3d) in that
    format; others are left as they are (Module.to(memory_format=...) refuses a module mixing both ranks)."""
    rank = 4 if fmt == torch.channels_last else 5
    n = 0
    for m in module.modules():
        if isinstance(m, (torch.nn.Conv2d, torch.nn.Conv3d, torch.nn.ConvTranspose2d, torch.nn.ConvTranspose3d)):
            if m.weight.dim() == rank:
                m.weight.data = m.weight.data.contiguous(memory_format=fmt)
                n += 1
    return n


@register("channels-last", family="layout",
          description="channels-last (NHWC / NDHWC) convolution weights and activations for the conv-heavy parts: "
                      "the VAE decoder, and the UNet for wma")
def _channels_last(pipe, ctx: VariantContext):
    if ctx.workload == "wma":
        unet = pipe.model.diffusion_model
        n = to_memory_format(unet, torch.channels_last)  # the 2-D convs; the temporal Conv3ds stay as they are
        unet.channels_last = True
        n += to_memory_format(pipe.vae, torch.channels_last)
    else:
        n = to_memory_format(pipe.vae, torch.channels_last_3d)  # the Wan VAE's causal 3-D convs
    ctx.notes["channels-last"] = f"{n} convolution weights in channels-last"


# --- torch.compile ---------------------------------------------------------------------------------------


def compile_regions(pipe, workload: str) -> list[torch.nn.Module]:
    """The repeated blocks a regional compile compiles: the 30 DiT blocks, or the UNet's blocks."""
    if workload == "mg2":
        return list(pipe.model.blocks)
    unet = pipe.model.diffusion_model
    return [m for blocks in (unet.input_blocks, [unet.middle_block], unet.output_blocks) for m in blocks]


REGIONAL_RECOMPILE_LIMIT = 64


def raise_recompile_limit_for_regions() -> int:
    """The regions share their class's code; every distinct block shape (the UNet's channel widths, the DiT's
    blocks with and without action modules) is one cache entry of it: past the default limit of 8 dynamo would
    silently run the remaining blocks eagerly. Raised process-wide (GlobalFlags restores it); returns the limit."""
    from .compile import get_recompile_limit, recompile_limit_name

    lim = max(get_recompile_limit(), REGIONAL_RECOMPILE_LIMIT)
    setattr(torch._dynamo.config, recompile_limit_name(), lim)
    return lim


def _compile(scope: str, mode: str, dynamic: bool):
    def apply(pipe, ctx: VariantContext):
        from .compile import CompileSpec, apply_compile

        if scope == "regional":
            ctx.notes["recompile_limit"] = f"recompile limit {raise_recompile_limit_for_regions()}"

        spec = CompileSpec(scope=scope, mode=mode, dynamic=dynamic, backend=ctx.notes.get("compile_backend",
                                                                                           "inductor"))
        target = pipe.model if ctx.workload == "mg2" else pipe.model.diffusion_model
        regions = compile_regions(pipe, ctx.workload) if scope == "regional" else None
        ctx.notes[f"compile:{spec.name}"] = apply_compile(target, spec, regions=regions)
        ctx.notes["compile_spec"] = spec

    return apply


for _scope, _mode, _dyn, _name in (
    ("regional", "default", False, "compile-regional"),
    ("regional", "default", True, "compile-regional-dynamic"),
    ("regional", "max-autotune-no-cudagraphs", False, "compile-regional-max-autotune"),
    ("whole", "default", False, "compile-whole"),
    ("whole", "max-autotune-no-cudagraphs", False, "compile-whole-max-autotune"),
):
    register(_name, family="compile", description=f"torch.compile, {_scope}, mode={_mode}, dynamic={_dyn}")(
        _compile(_scope, _mode, _dyn))
