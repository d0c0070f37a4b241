"""Attention: SDPA and library backends for every attention() call, quantized attention, the action modules'
fused attention."""

from __future__ import annotations

import torch

from ...models.action import ActionModule
from ...models.attention import (
    AttentionBackendError,
    _sage_func,
    reset_sage_call_counts,
    reset_triton_call_counts,
    set_attention_backend,
)
from .. import swaps
from ..registry import VariantContext, register


def _attention(backend: str):
    def apply(pipe, ctx: VariantContext):
        set_attention_backend(backend)
        ctx.notes[f"attn-{backend}"] = f"attention backend {backend!r} for every attention() call"

    return apply


for _b, _gpu in (("math", False), ("efficient", True), ("flash", True), ("cudnn", True), ("flex", True),
                 ("flash_attn", True)):
    register(f"attn-{_b}", family="attention", gpu_only=_gpu,
             description=f"SDPA/attention backend forced to {_b!r}")(_attention(_b))


def sage_unavailable(device: torch.device) -> str | None:
    """Why the attn-sage variant cannot run on `device` (None when it can)."""
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
    set_attention_backend("sage")  # an AttentionBackendError says why where it cannot run
    reset_sage_call_counts()
    ctx.notes["attn-sage"] = ("SageAttention for unmasked calls of head dim 64/96/128 and a key length that is a "
                              "multiple of 64, SDPA for the rest "
                              "(wmbook.models.attention.sage_call_counts() says how many of each)")


@register("attn-triton", family="attention",
          description="wmbook's own Triton flash-attention kernel (wmbook.kernels.block_attention: a block of queries "
                      "over the window of cached keys, online softmax in fp32, the partial last key tile masked) for "
                      "every unmasked attention() call; masked calls keep SDPA. An opaque op under torch.compile: "
                      "each call goes through the dispatcher and its Python launcher, so without CUDA graphs the "
                      "forward is launch-bound")
def _triton_attention(pipe, ctx: VariantContext):
    set_attention_backend("triton")  # an AttentionBackendError says why where it cannot run
    reset_triton_call_counts()
    ctx.notes["attn-triton"] = ("wmbook's Triton attention (block_attention) for unmasked calls, SDPA for masked ones "
                                "(wmbook.models.attention.triton_call_counts() says how many of each)")


@register("action-attn-fused", family="attention", requires=("action_modules",),
          description="the action modules' tiny attentions (3 query x <=6 key frames per location and head) as a "
                      "fusable fp32 multiply-reduce, keyboard K/V broadcast instead of copied per location, in place "
                      "of an SDPA kernel that pads every (location, head) problem to a full tile")
def _action_attn_fused(pipe, ctx: VariantContext):
    n = swaps.replace_modules(ctx.workload.denoiser(pipe), swaps.of_type(ActionModule),
                              swaps.with_mixin(swaps.SmallActionAttention))
    ctx.notes["action-attn-fused"] = f"{n} action modules on small_attention"
