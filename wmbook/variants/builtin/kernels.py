"""Fused Triton kernels and fp8 GEMMs (notebook 05)."""

from __future__ import annotations

import torch

from ..registry import VariantContext, register


@register("triton-fused", family="kernels",
          description="notebook 05's fused Triton kernels swapped into the denoiser (torch.library ops: compile traces "
                      "them, graphs capture them): the DiT's adaLN modulate, gated residual + adaLN, q/k RMSNorm + "
                      "RoPE; the UNet's GroupNorm + SiLU (+ the time-embedding add) and its temporal self-attention "
                      "(short sequences, many per program)")
def _triton_fused(pipe, ctx: VariantContext):
    from .. import fused  # noqa: PLC0415  heavy: Triton kernel modules (they register torch.ops.wmbook)

    counts = {**fused.fuse_dit(ctx.workload.denoiser(pipe)), **fused.fuse_unet(ctx.workload.denoiser(pipe))}
    counts = {k: v for k, v in counts.items() if v}
    if not counts:
        raise ValueError(f"triton-fused found nothing to fuse in the {ctx.workload.name} denoiser")
    ctx.notes["triton-fused"] = ", ".join(f"{v} {k}" for k, v in counts.items())


def _swap_into_denoiser(pipe, ctx: VariantContext, name: str, module: str, swap: str, found: str, note: str) -> None:
    """A denoiser swap variant's body: wmbook.variants.<module>.<swap>(denoiser) -> how many it swapped; none is an
    error naming what the variant looks for; the count goes to the row's note."""
    import importlib  # noqa: PLC0415

    # late: the swap modules import the Triton kernel modules, which register torch.ops.wmbook
    n = getattr(importlib.import_module(f"wmbook.variants.{module}"), swap)(ctx.workload.denoiser(pipe))
    if not n:
        raise ValueError(f"{name} found no {found} in the {ctx.workload.name} denoiser")
    ctx.notes[name] = f"{n} {note}"


@register("action-norm-rope", family="kernels", requires=("action_modules",),
          description="the action modules' queries and keys normalized per head and rotated by frame in one Triton "
                      "pass (wmbook.kernels.head_norm_rope), written once: inductor otherwise recomputes the query's "
                      "norm and rotation inside the reduction that scores it against each key")
def _action_norm_rope(pipe, ctx: VariantContext):
    _swap_into_denoiser(pipe, ctx, "action-norm-rope", "fused", "fuse_action_norm_rope", "action module",
                        "action modules on head_norm_rope")


@register("fused-qkv", family="kernels", requires=("kv_cache",),
          description="the causal DiT self-attention's q, k and v projections as one GEMM over their concatenated "
                      "weights (one launch, one read of the input, a 3x wider GEMM); the projections stay as views "
                      "of it (wmbook.variants.qkv)")
def _fused_qkv(pipe, ctx: VariantContext):
    _swap_into_denoiser(pipe, ctx, "fused-qkv", "qkv", "fuse_qkv", "causal self-attention",
                        "self-attentions with one q/k/v GEMM")


@register("ffn-gelu-epilogue", family="kernels", requires=("kv_cache",),
          description="the causal DiT's feed-forward GELU (tanh) in its up-projection's epilogue: cuBLASLt's GELU + "
                      "bias epilogue through torch._addmm_activation on a GPU, so the widest activation of a block is "
                      "written once, already activated (wmbook.variants.epilogues); the reference's arithmetic on a "
                      "CPU")
def _ffn_gelu_epilogue(pipe, ctx: VariantContext):
    _swap_into_denoiser(pipe, ctx, "ffn-gelu-epilogue", "epilogues", "fuse_ffn_gelu",
                        "Linear -> GELU(tanh) -> Linear feed-forward",
                        "feed-forwards with the GELU in the GEMM epilogue")


@register("geglu-gemm", family="kernels", requires=("unet",),
          description="the video UNet's GEGLU feed-forward projection and gate as one Triton GEMM "
                      "(wmbook.kernels.geglu_linear): two fp32 accumulators per output tile, value x GELU(gate) in its "
                      "epilogue, so the projection's 2 x inner output is never written or read back")
def _geglu_gemm(pipe, ctx: VariantContext):
    _swap_into_denoiser(pipe, ctx, "geglu-gemm", "epilogues", "fuse_geglu", "GEGLU feed-forward",
                        "GEGLU feed-forwards as one GEMM each")


@register("frames-norm-triton", family="kernels", requires=("unet",),
          description="the video UNet's temporal transformers' GroupNorm (statistics over all frames of a sample) by "
                      "the GroupNorm kernels with the SiLU off (wmbook::group_norm), read in place from a "
                      "channels-last activation: inductor's norm there reduces each (sample, group) in one program")
def _frames_norm_triton(pipe, ctx: VariantContext):
    _swap_into_denoiser(pipe, ctx, "frames-norm-triton", "fused", "fuse_frames_norm",
                        "temporal transformer left to swap", "temporal transformers' norms on group_norm")


@register("vae-triton-fused", family="decoder",
          description="the decoder's norm + SiLU pairs as one Triton kernel each (Wan VAE: RMS norm + SiLU; SD VAE: "
                      "GroupNorm + SiLU)")
def _vae_triton_fused(pipe, ctx: VariantContext):
    from .. import fused  # noqa: PLC0415  heavy: Triton kernel modules (they register torch.ops.wmbook)

    n = fused.fuse_decoder(pipe.vae.decoder)
    if not n:
        raise ValueError("vae-triton-fused found no norm + SiLU pair in the decoder")
    ctx.notes["vae-triton-fused"] = f"{n} decoder norms fused with their SiLU"


_NORM_CONV_BIAS = ("a convolution whose output only a fused GroupNorm + SiLU reads runs without its bias, which the "
                   "norm kernel adds as it loads (its per-channel add): on a GPU inductor peels a convolution's bias "
                   "into a pointwise add that, before an opaque kernel, is a read and a write of the activation of its "
                   "own (wmbook.variants.fused.fold_conv_bias)")


def _fold_conv_bias(model, name: str, where: str, needs: str, ctx: VariantContext):
    from .. import fused  # noqa: PLC0415  heavy: Triton kernel modules (they register torch.ops.wmbook)

    n = fused.fold_conv_bias(model)
    if not n:
        raise ValueError(f"{name} found no convolution read only by a fused GroupNorm + SiLU in the "
                         f"{ctx.workload.name} {where}; it comes after "
                         f"{needs}")
    ctx.notes[name] = f"{n} convolution biases added by the GroupNorm + SiLU kernel after them"


@register("norm-conv-bias", family="kernels", requires=("unet",),
          description=f"the UNet (after triton-fused): {_NORM_CONV_BIAS}")
def _norm_conv_bias(pipe, ctx: VariantContext):
    _fold_conv_bias(ctx.workload.denoiser(pipe), "norm-conv-bias", "denoiser", "triton-fused", ctx)


@register("vae-norm-conv-bias", family="decoder", requires=("independent_frames",),
          description=f"the SD VAE decoder (after vae-triton-fused, before vae-compile): {_NORM_CONV_BIAS}")
def _vae_norm_conv_bias(pipe, ctx: VariantContext):
    from .decoder import refuse_after_compile  # noqa: PLC0415  (decoder's module is registered after this one)

    refuse_after_compile("vae-norm-conv-bias", pipe, "decode_step", "step keeps the modules it was made with")
    _fold_conv_bias(pipe.vae.decoder, "vae-norm-conv-bias", "decoder", "vae-triton-fused", ctx)


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
        from torchao.quantization import (  # noqa: F401, PLC0415  optional: torchao
            Float8DynamicActivationFloat8WeightConfig,
            PerRow,
            quantize_,
        )
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
    from torchao.quantization import (  # noqa: PLC0415  optional: torchao
        Float8DynamicActivationFloat8WeightConfig,
        PerRow,
        quantize_,
    )

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


# calibration: the generation the activation scales are read from (short: its first blocks or DDIM steps)
FP8_STATIC_CALIBRATION = {"blocks": 2, "ddim_steps": 2}


def fp8_static_unavailable(device: torch.device) -> str | None:
    """Why notebook 05's ladder leaves the fp8-static row out on `device` (None when it runs it): fp8 GEMMs gain only
    on FP8 tensor cores (compute capability 8.9 or newer). The variant itself also runs on a CPU (torch._scaled_mm),
    which tests use."""
    if device.type != "cuda":
        return f"fp8 GEMMs need a CUDA GPU with FP8 tensor cores (compute capability >= 8.9); this is {device.type}"
    cap = torch.cuda.get_device_capability(device)
    if cap < (8, 9):
        return f"fp8 GEMMs need compute capability >= 8.9; {torch.cuda.get_device_name(device)} has {cap[0]}.{cap[1]}"
    return None


@register("fp8-static", family="precision", tolerance="fp8",
          description="the denoiser's large linears as fp8 GEMMs (e4m3, torch._scaled_mm) with static scales: "
                      "weights per output channel, quantized once; each linear's input per tensor, calibrated once "
                      "on a short generation of the stack below (its largest absolute input): no scale reduction at "
                      "run time (wmbook.variants.fp8_static); needs bf16 weights (FP8 tensor cores on a GPU)")
def _fp8_static(pipe, ctx: VariantContext):
    from ...workloads.base import E2ESize  # noqa: PLC0415  the workloads import the variants
    from .. import fp8_static  # noqa: PLC0415  the module is only needed by this row

    if ctx.device.type == "cuda" and fp8_static_unavailable(ctx.device):
        raise ValueError(f"fp8-static: {fp8_static_unavailable(ctx.device)}")
    model = ctx.workload.denoiser(pipe)
    # on a GPU only GEMMs big enough to gain from fp8 (>= 256 features); a CPU (tests, tiny presets) takes any
    linears = fp8_static.eligible_linears(model, 256 if ctx.device.type == "cuda" else 16)
    if not linears:
        raise ValueError("fp8-static found no bf16 linear to quantize: apply bf16 first")
    size = E2ESize(**FP8_STATIC_CALIBRATION)
    # in eager even where the stack below compiled the denoiser: calibrating through it would compile the whole
    # model once with the hooks traced in and again without them (at wma over 3 minutes each on an H200), for
    # maxima that eager arithmetic gives as well
    with torch.compiler.set_stance("force_eager"):
        amax = fp8_static.calibrate(linears, lambda: ctx.workload.end_to_end(pipe, seed=0, size=size))
    n = fp8_static.quantize_static(model, amax, linears)
    ctx.notes["fp8-static"] = (f"{n} of {len(linears)} linears in fp8 with static scales (calibrated on "
                               f"{ctx.workload.e2e_description(size)})")
