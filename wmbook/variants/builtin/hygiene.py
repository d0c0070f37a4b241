"""Dtype and host-sync hygiene: one change per variant (the group `hygiene` stands for all that apply)."""

from __future__ import annotations

from .. import swaps
from ..registry import VariantContext, register, register_group


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
