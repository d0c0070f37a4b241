"""Analytic FLOP counts (multiply-add = 2 FLOPs) of one causal-DiT forward, for the FLOP floor."""

from __future__ import annotations

import torch
from diffusers import AutoencoderKL, AutoencoderKLWan
from torch.utils.flop_counter import FlopCounterMode

from ..presets import CausalWanPreset
from .vae import StreamingWanDecoder, wan_vae_config
from .wma.vae import decode_frame, sd_vae_config


def visible_frames(p: CausalWanPreset, block_idx: int) -> int:
    """Latent frames the block's queries attend to (its own included), after the rolling window."""
    end = (block_idx + 1) * p.num_frame_per_block
    return min(end, p.kv_capacity_frames())


def dit_forward_flops(p: CausalWanPreset, block_idx: int = 1, cross_kv_cached: bool = True) -> dict[str, float]:
    """FLOPs of one forward on one block, by part; `total` sums them.

    Counts matmuls and attention (QK^T and PV); norms, RoPE, modulation and elementwise work are
    memory-bound and left out of the floor on purpose.
    """
    f = p.num_frame_per_block
    s = p.frame_seqlen
    lq = f * s  # query tokens
    lk = visible_frames(p, block_idx) * s
    c, ffn = p.dim, p.ffn_dim
    ctx = p.clip_tokens if p.model_type == "i2v" else p.text_len
    pt, ph, pw = p.patch_size
    parts = {
        "patch_embed": 2 * lq * p.in_dim * pt * ph * pw * c,
        "self_attn_proj": p.num_layers * 4 * 2 * lq * c * c,
        "self_attn_sdpa": p.num_layers * 2 * 2 * lq * lk * c,
        "cross_attn_proj": p.num_layers * 2 * 2 * lq * c * c,
        "cross_attn_sdpa": p.num_layers * 2 * 2 * lq * ctx * c,
        "ffn": p.num_layers * 2 * 2 * lq * c * ffn,
        "head": 2 * lq * c * p.out_dim * pt * ph * pw,
    }
    if not cross_kv_cached:
        ctx_in = p.clip_dim if p.model_type == "i2v" else p.text_dim
        parts["context_embed"] = (2 * ctx * (ctx_in * ctx_in + ctx_in * c) if p.model_type == "i2v"
                                  else 2 * ctx * (ctx_in * c + c * c))
        parts["cross_attn_kv"] = p.num_layers * 2 * 2 * ctx * c * c
    a = p.action
    if a is not None:
        n = len(a.blocks)
        fk = min(visible_frames(p, block_idx), p.kv_capacity_frames())
        cm, ck = a.mouse_hidden_dim, a.keyboard_hidden_dim
        win = a.windows_size * a.vae_time_compression_ratio
        mouse = (2 * lq * (a.mouse_dim_in * win + c) * cm + 2 * lq * cm * cm  # mouse_mlp
                 + 2 * lq * cm * 3 * cm  # t_qkv
                 + 2 * lq * cm * c)  # proj_mouse
        keyboard = (2 * lq * c * ck  # mouse_attn_q
                    + 2 * f * (a.hidden_size * win) * 2 * ck  # keyboard_attn_kv
                    + 2 * lq * ck * c)  # proj_keyboard
        parts["action"] = n * (mouse + keyboard)
        # the modules' attentions (temporal per location; to the per-frame keyboard tokens): a few keys each, so
        # they run as fused reductions, not attention kernels
        parts["action_attn"] = n * (2 * 2 * s * f * fk * cm + 2 * 2 * lq * fk * ck)
    parts["total"] = float(sum(parts.values()))
    return {k: float(v) for k, v in parts.items()}


# which kernels run each part of dit_forward_flops (wmbook.profiling's categories); the action modules' attentions
# run in fused reductions and are left out
DIT_PART_CATEGORY = {"patch_embed": "convolution", "self_attn_sdpa": "attention", "cross_attn_sdpa": "attention",
                     "self_attn_proj": "GEMM/linear", "cross_attn_proj": "GEMM/linear", "ffn": "GEMM/linear",
                     "head": "GEMM/linear", "context_embed": "GEMM/linear", "cross_attn_kv": "GEMM/linear",
                     "action": "GEMM/linear"}


def dit_flops_by_category(p: CausalWanPreset, block_idx: int = 1) -> dict[str, float]:
    """dit_forward_flops by the kernel category that runs each part: {category: FLOPs} (DIT_PART_CATEGORY)."""
    out: dict[str, float] = {}
    for part, n in dit_forward_flops(p, block_idx).items():
        if part in DIT_PART_CATEGORY:
            out[DIT_PART_CATEGORY[part]] = out.get(DIT_PART_CATEGORY[part], 0.0) + n
    return out


def counted_flops(fn, *args) -> float:
    """FLOPs of fn(*args) as torch.utils.flop_counter counts them (convolutions, matmuls, attention): run it on meta
    tensors, so a real-shape decoder is counted in a fraction of a second without running anything."""
    return counted_flop_parts(fn, *args)["total"]


def counted_flop_parts(fn, *args) -> dict[str, float]:
    """{"total", "convolution"}: fn(*args)'s FLOPs as counted_flops counts them, and the convolutions' share alone (a
    decoder's convolution floor, set against its convolution kernels' time)."""
    with FlopCounterMode(display=False) as fc:
        fn(*args)
    ops = fc.get_flop_counts().get("Global", {})
    conv = sum(n for op, n in ops.items() if "convolution" in str(op))
    return {"total": float(fc.get_total_flops()), "convolution": float(conv)}


def wan_decoder_flops(p: CausalWanPreset) -> dict[str, float]:
    """FLOPs of the streaming Wan VAE decode of one block at a preset's shape: the first block (its first latent frame
    gives 1 pixel frame) and a steady one (4 pixel frames per latent frame), counted on meta tensors."""
    with torch.device("meta"):
        vae = AutoencoderKLWan(**wan_vae_config(p.vae))
        z = torch.empty(1, 16, p.num_frame_per_block, *p.latent_hw)
    dec = StreamingWanDecoder(vae, stage_labels=False)
    first = counted_flops(dec.decode_block, z)
    steady = counted_flop_parts(dec.decode_block, z)
    return {"first_block": first, "steady_block": steady["total"], "steady_block_conv": steady["convolution"]}


def sd_decoder_flop_parts(p) -> dict[str, float]:
    """{"total", "convolution"}: FLOPs of one frame's SD VAE decode (the WMA workload decodes frame by frame) at a
    preset's shape, counted on meta tensors, and the convolutions' share of them."""
    with torch.device("meta"):
        vae = AutoencoderKL(**sd_vae_config(p))
        z = torch.empty(1, p.latent_channels, p.height // 8, p.width // 8)
    return counted_flop_parts(decode_frame, vae, z, p.scale_factor)
