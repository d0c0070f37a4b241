"""Notebook 05's fused Triton kernels swapped into the reference models from outside (the `triton-fused`,
`vae-triton-fused` and `action-norm-rope` variants). Each swap calls the kernel's torch.library op
(`torch.ops.wmbook.*`; a triton_op on a GPU, wmbook.kernels.define_op), so torch.compile traces it without a graph
break and a CUDA graph captures its launch; where Triton does not run (a CPU without the interpreter) the op
computes its fp32 reference. Inference only.

- causal DiT block (FusedDiTBlock): norm1 / norm2 + per-frame modulate -> `adaln_modulate`; the self-attention's
  gated residual + norm3 (an affine LayerNorm is an adaLN with scale = weight - 1, shift = bias) ->
  `gated_residual_adaln`; the self-attention's q / k RMSNorm + RoPE -> `qk_norm_rope` (FusedQKNormRoPE).
- video UNet: every GroupNorm followed by SiLU -> `group_norm_silu` (FusedGroupNormSiLU, the SiLU becomes an
  Identity); the ResBlock's time-embedding add folded into the out_layers' norm (FusedResBlock); the temporal
  transformers' self-attentions over the T frames -> `short_attention` (ShortSelfAttention).
- Matrix-Game-2 action module (`action-norm-rope`, FusedActionNormRope): each attention's per-head RMSNorm + frame
  RoPE of its queries and keys -> `head_norm_rope`.
- decoders: each residual block's norm + SiLU pair (Wan: RMS norm -> `rms_norm_silu`; SD: GroupNorm ->
  `group_norm_silu`) and the decoder head's.
- `norm-conv-bias` / `vae-norm-conv-bias` (after the two above): a convolution read only by a fused GroupNorm + SiLU
  leaves its bias to the norm kernel's per-channel add (fold_conv_bias).
- `frames-norm-triton`: the video UNet's temporal transformers' GroupNorm over a sample's frames -> `group_norm`
  (TritonFramesNorm), read in place from the channels-last activation.
"""

from __future__ import annotations

import torch
import torch.nn as nn

# importing the kernel modules registers their ops (torch.ops.wmbook.*); this module is imported only when a
# fused variant is applied
from ..kernels import (  # noqa: E402,F401
    adaln,
    gated_residual_adaln,
    group_norm_silu,
    head_norm_rope,
    qk_norm_rope,
    rms_norm_silu,
    short_attention,
)
from ..models.causal_wan import CausalWanAttentionBlock, WanLayerNorm, WanRMSNorm
from ..profiling.labels import detail_label as dl
from .swaps import swap_class

ops = torch.ops.wmbook


# --- the causal DiT --------------------------------------------------------------------------------------------------


class FusedQKNormRoPE:
    """CausalWanSelfAttention whose q and k go through one RMSNorm + RoPE kernel each (their projections from one GEMM
    where `fused-qkv` gave the module one: wmbook.variants.qkv)."""

    def forward(self, x, cos, sin, kv_cache, start_token=None, mask=None):
        b, s = x.shape[:2]
        n, d = self.num_heads, self.head_dim
        with dl("DiT_SelfAttn_QKV_RoPE"):
            if getattr(self, "qkv", None) is not None:  # fused-qkv: one GEMM for the three projections
                xq, xk, xv = self.qkv(x).split(self.dim, dim=-1)
            else:
                xq, xk, xv = self.q(x), self.k(x), self.v(x)
            q = ops.qk_norm_rope(xq, self.norm_q.weight, cos, sin, n, self.norm_q.eps)
            k = ops.qk_norm_rope(xk, self.norm_k.weight, cos, sin, n, self.norm_k.eps)
            v = xv.reshape(b, s, n, d)
        return self.attend(q, k, v, kv_cache, start_token, mask)


class FusedDiTBlock:
    """CausalWanAttentionBlock with its norms + modulation and the self-attention residual fused (see the module
    docstring); the rest is the reference's forward, call for call."""

    def forward(self, x, e, grid, context, cos, sin, *, attn_start=None, action_start=None, kv_cache=None,
                cross_cache=None, actions=None, action_cache=None, mask=None, action_inputs=None):
        b, f = e.shape[:2]
        mod = (self.modulation.unsqueeze(1) + e).chunk(6, dim=2)
        shift_msa, scale_msa, gate_msa, shift_ffn, scale_ffn, gate_ffn = mod
        s = x.shape[1] // f
        with dl("DiT_Norm_Modulation"):
            h = ops.adaln_modulate(x, shift_msa, scale_msa, self.norm1.eps)
        y = self.self_attn(h, cos, sin, kv_cache, None if attn_start is None else attn_start * s, mask)
        with dl("DiT_Norm_Modulation"):
            if self.norm3_scale is not None:  # norm3 as an adaLN, made once by fuse_dit
                c = x.shape[-1]
                x, hn = ops.gated_residual_adaln(x, y, gate_msa, self.norm3_shift.expand(b, f, 1, c),
                                                 self.norm3_scale.expand(b, f, 1, c), self.norm3.eps)
            else:
                x = x + (y.unflatten(1, (f, -1)) * gate_msa).flatten(1, 2)
                hn = self.norm3(x)
        with dl("DiT_CrossAttn"):
            x = x + self.cross_attn(hn, context, cross_cache)
        if self.action_model is not None:
            with dl("DiT_Action"):
                x = self.action_model(x, grid, actions, start_frame=action_start, cache=action_cache,
                                      inputs=action_inputs)
        with dl("DiT_Norm_Modulation"):
            h = ops.adaln_modulate(x, shift_ffn, scale_ffn, self.norm2.eps)
        with dl("DiT_FFN"):
            y = self.ffn(h)
        with dl("DiT_Norm_Modulation"):
            return x + (y.unflatten(1, (f, -1)) * gate_ffn).flatten(1, 2)


def fuse_dit(model: nn.Module) -> dict[str, int]:
    """Swap the DiT blocks and their self-attentions (q/k norm only where it is an RMSNorm); returns the counts."""
    blocks = attn = 0
    for m in model.modules():
        if isinstance(m, CausalWanAttentionBlock):
            if not (isinstance(m.norm1, WanLayerNorm) and isinstance(m.norm2, WanLayerNorm)):
                continue
            swap_class(m, FusedDiTBlock)
            # an affine LayerNorm is an adaLN with shift = bias, scale = weight - 1: made once (fp32, [1, 1, 1, C]),
            # as non-persistent buffers (they follow the module's .to(); the state dict is unchanged)
            n3 = m.norm3
            affine = isinstance(n3, nn.LayerNorm) and n3.weight is not None and n3.bias is not None
            m.register_buffer("norm3_shift", n3.bias.detach().float().view(1, 1, 1, -1) if affine else None, False)
            m.register_buffer("norm3_scale", (n3.weight.detach().float() - 1).view(1, 1, 1, -1) if affine else None,
                              False)
            blocks += 1
            if isinstance(m.self_attn.norm_q, WanRMSNorm) and isinstance(m.self_attn.norm_k, WanRMSNorm):
                swap_class(m.self_attn, FusedQKNormRoPE)
                attn += 1
    return {"DiT blocks (adaLN, gated residual + adaLN)": blocks, "self-attentions (q/k norm + RoPE)": attn}


# --- GroupNorm + SiLU (video UNet, SD VAE) ------------------------------------------------------------------------


class FusedGroupNormSiLU(nn.Module):
    """SiLU(GroupNorm(x [+ add])) in one kernel pair (stats, normalize); shares the GroupNorm's parameters."""

    bias_conv = None  # the convolution whose bias it adds (fold_conv_bias)

    def __init__(self, gn: nn.GroupNorm):
        super().__init__()
        self.num_groups, self.eps = gn.num_groups, gn.eps
        self.weight, self.bias = gn.weight, gn.bias

    def forward(self, x, add=None):
        if self.bias_conv is not None:  # norm-conv-bias: the convolution before it left its bias to it
            b = self.bias_conv.bias.to(x.dtype)
            add = b.expand(x.shape[0], -1) if add is None else add + b
        return ops.group_norm_silu(x, self.weight, self.bias, self.num_groups, self.eps, add)

    def extra_repr(self) -> str:
        return f"{self.num_groups}, {self.weight.shape[0]}, eps={self.eps} (+ SiLU, Triton)"


class TritonFramesNorm:
    """TemporalTransformer whose GroupNorm over a sample's frames is `wmbook::group_norm` (the norm kernels, SiLU
    off). A channels-last x [(B T), C, h, w] is a channels_last_3d [B, C, T, h, w] once its batch and frames are split
    and transposed: the kernels read it in place, many programs per group, where inductor's norm copies it to
    channels-first and reduces each (sample, group) in one program (32 programs for a batch of one)."""

    def frames_norm(self, x, batch):
        v = x.unflatten(0, (batch, x.shape[0] // batch)).transpose(1, 2)
        return ops.group_norm(v, self.norm.weight, self.norm.bias, self.norm.num_groups, self.norm.eps)


def fuse_frames_norm(model: nn.Module) -> int:
    """Each TemporalTransformer's input norm -> TritonFramesNorm (parameters and state dict unchanged); how many."""
    from ..models.wma.unet import TemporalTransformer  # noqa: PLC0415  heavy: models.wma (diffusers)

    n = 0
    for m in model.modules():
        if (isinstance(m, TemporalTransformer) and not isinstance(m, TritonFramesNorm)
                and type(m.norm) is nn.GroupNorm and m.norm.affine):
            swap_class(m, TritonFramesNorm)
            n += 1
    return n


class BiasFreeConv:
    """A convolution whose bias the fused GroupNorm + SiLU reading its output adds (fold_conv_bias)."""

    def forward(self, x):
        return self._conv_forward(x, self.weight, None)


def fold_conv_bias(model: nn.Module) -> int:
    """Each convolution whose output only a FusedGroupNormSiLU reads: the convolution runs without its bias and the
    norm kernel adds it with its per-channel `add` (the video UNet's ResBlock, in_layers' convolution -> out_layers'
    norm, where the time-embedding add already is; its temporal conv block, each Conv3d -> the next layer's norm;
    diffusers' ResnetBlock2D without a time embedding, conv1 -> norm2). Why: on a GPU inductor peels a convolution's
    bias into a pointwise add (cuDNN runs slower with it), which fuses into whatever inductor generates next; before
    an opaque op that add is a pass of its own over the activation, read and written. Returns how many."""
    from diffusers.models.resnet import ResnetBlock2D  # noqa: PLC0415  heavy: diffusers

    from ..models.wma.unet import ResBlock, TemporalConvBlock  # noqa: PLC0415  heavy: models.wma (diffusers)

    pairs = []
    for m in model.modules():
        if isinstance(m, ResBlock):
            pairs.append((m.in_layers[2], m.out_layers[0]))
        elif isinstance(m, TemporalConvBlock):
            layers = [m.conv1, m.conv2, m.conv3, m.conv4]
            pairs += [(a[-1], b[0]) for a, b in zip(layers, layers[1:])]
        elif isinstance(m, ResnetBlock2D) and m.time_emb_proj is None:
            pairs.append((m.conv1, m.norm2))
    n = 0
    for conv, norm in pairs:
        if (isinstance(norm, FusedGroupNormSiLU) and isinstance(conv, (nn.Conv1d, nn.Conv2d, nn.Conv3d))
                and not isinstance(conv, BiasFreeConv) and conv.bias is not None):
            swap_class(conv, BiasFreeConv)
            # a plain attribute, not a submodule: the state dict and the parameters stay as they were; a deep copy
            # of the model points the copy's norm at the copy's convolution
            object.__setattr__(norm, "bias_conv", conv)
            n += 1
    return n


class FusedRMSNormSiLU(nn.Module):
    """SiLU(WanRMS_norm(x)) in one kernel (channels-first RMS norm of diffusers' Wan VAE); shares its parameters."""

    def __init__(self, norm):
        super().__init__()
        self.gamma = norm.gamma
        self.bias = norm.bias if isinstance(norm.bias, torch.Tensor) else None
        self.eps = 1e-12  # F.normalize's, which WanRMS_norm uses

    def forward(self, x):
        return ops.rms_norm_silu(x, self.gamma, self.bias, self.eps)


def _is_silu(m) -> bool:
    return isinstance(m, nn.SiLU)


def fuse_sequential_gn_silu(model: nn.Module) -> int:
    """Every nn.Sequential holding a GroupNorm directly followed by a SiLU: the pair becomes (fused, Identity)."""
    n = 0
    for seq in [m for m in model.modules() if isinstance(m, nn.Sequential)]:
        for i in range(len(seq) - 1):
            if isinstance(seq[i], nn.GroupNorm) and _is_silu(seq[i + 1]):
                seq[i], seq[i + 1] = FusedGroupNormSiLU(seq[i]), nn.Identity()
                n += 1
    return n


class FusedResBlock:
    """The video UNet's ResBlock with the time-embedding add folded into the out_layers' GroupNorm + SiLU kernel."""

    def forward(self, x, emb, batch):
        with dl("UNet_ResBlock"):
            with dl("UNet_Norm"):
                h = self.in_layers[1](self.in_layers[0](x))
            h = self.in_layers[2](h)
            add = self.emb_layers(emb).type(h.dtype)
            with dl("UNet_Norm"):
                h = self.out_layers[0](h, add=add)  # FusedGroupNormSiLU; out_layers[1] is an Identity
            h = self.out_layers[3](self.out_layers[2](h))
            h = self.skip_connection(x) + h
            return self.temporal(h, batch)


class ShortSelfAttention:
    """CrossAttention of a temporal transformer (self-attention over the T frames of each position): q, k and v
    through `short_attention` (many short sequences per program) instead of SDPA; calls with a context (never in a
    temporal transformer) keep the module's own path."""

    def forward(self, x, ctx=None):
        if ctx is not None:
            return super().forward(x, ctx)
        q, k, v = (self._heads(f(x)) for f in (self.to_q, self.to_k, self.to_v))
        return self.to_out(ops.short_attention(q, k, v).flatten(2))


class FusedActionNormRope:
    """ActionModule whose queries and keys are normalized and rotated by `head_norm_rope` (one pass, written out),
    so that the attention reads them instead of inductor recomputing them inside its score reduction."""

    def norm_rope(self, x, norm, inputs, dtype):
        f = x.shape[1]
        cos, sin = inputs.cos.reshape(f, -1), inputs.sin.reshape(f, -1)
        return ops.head_norm_rope(x, cos, sin, norm.eps).to(dtype)


def fuse_action_norm_rope(model: nn.Module) -> int:
    """Every action module on head_norm_rope (FusedActionNormRope); returns how many."""
    from ..models.action import ActionModule  # noqa: PLC0415

    mods = [m for m in model.modules() if isinstance(m, ActionModule)]
    for m in mods:
        swap_class(m, FusedActionNormRope)
    return len(mods)


def fuse_unet(model: nn.Module) -> dict[str, int]:
    from ..models.wma.unet import (  # noqa: PLC0415  heavy: models.wma (diffusers)
        CrossAttention,
        ResBlock,
        TemporalTransformer,
    )

    pairs = fuse_sequential_gn_silu(model)
    res = 0
    for m in model.modules():
        if isinstance(m, ResBlock) and isinstance(m.out_layers[0], FusedGroupNormSiLU):
            swap_class(m, FusedResBlock)
            res += 1
    temporal = 0
    for t in [m for m in model.modules() if isinstance(m, TemporalTransformer)]:
        for a in [m for m in t.modules() if isinstance(m, CrossAttention) and not m.multi_context]:
            swap_class(a, ShortSelfAttention)
            temporal += 1
    return {"GroupNorm + SiLU pairs": pairs, "ResBlocks with the time-embedding add fused": res,
            "temporal self-attentions on short_attention": temporal}


# --- decoders ------------------------------------------------------------------------------------------------------


def fuse_decoder(decoder: nn.Module) -> int:
    """Each module with norm1/norm2 (or norm_out) followed by its `nonlinearity` SiLU (diffusers' Wan residual
    blocks and SD ResnetBlock2D, the Wan decoder's head), and the SD decoder's `conv_norm_out` followed by its
    `conv_act` SiLU (its head, at full resolution): norm -> fused norm + SiLU, the SiLU -> Identity. A module whose
    nonlinearity is used elsewhere too (an SD block with a time embedding) is left as it is."""
    from diffusers.models.autoencoders.autoencoder_kl_wan import WanRMS_norm  # noqa: PLC0415  heavy: diffusers

    def fused(norm):
        if isinstance(norm, WanRMS_norm) and norm.channel_first:
            return FusedRMSNormSiLU(norm)
        if isinstance(norm, nn.GroupNorm):
            return FusedGroupNormSiLU(norm)
        return None

    n = 0
    for m in decoder.modules():
        if not _is_silu(getattr(m, "nonlinearity", None)) or getattr(m, "time_emb_proj", None) is not None:
            continue
        names = [a for a in ("norm1", "norm2", "norm_out") if isinstance(getattr(m, a, None), nn.Module)]
        swaps = {a: fused(getattr(m, a)) for a in names}
        if names and all(v is not None for v in swaps.values()):
            for a, v in swaps.items():
                setattr(m, a, v)
            m.nonlinearity = nn.Identity()
            n += len(names)
    head = getattr(decoder, "conv_norm_out", None)
    if isinstance(head, nn.GroupNorm) and _is_silu(getattr(decoder, "conv_act", None)):
        decoder.conv_norm_out, decoder.conv_act = FusedGroupNormSiLU(head), nn.Identity()
        n += 1
    return n


__all__ = ["BiasFreeConv", "FusedDiTBlock", "FusedGroupNormSiLU", "FusedQKNormRoPE", "FusedRMSNormSiLU",
           "FusedResBlock", "fold_conv_bias", "fuse_decoder", "fuse_dit", "fuse_sequential_gn_silu", "fuse_unet"]
