"""Block-causal Wan DiT (Matrix-Game-2 CausalWanModel / Self-Forcing), plain eager PyTorch.

Parameter names follow the upstream Wan / CausalWanModel state dicts so a real checkpoint loads with
strict=True (see `load_checkpoint`). Shapes in comments: B batch, F latent frames in the call,
S tokens per latent frame, L = F*S tokens, C model width, H heads, D head dim.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..presets import CausalWanPreset
from ..profiling.labels import detail_label as dl
from .action import ActionCache, ActionModule
from .attention import attention, block_causal_frame_mask
from .checkpoint import load_checked, read_state_dict, select_generator
from .kv_cache import KVCache

DIT_FORWARD_LABEL = "DiffusionModel_Forward"  # one DiT forward (the pipeline labels it)
DIT_FINE_LABELS = (
    "DiT_Embeddings", "DiT_Norm_Modulation", "DiT_SelfAttn_QKV_RoPE", "DiT_KV_Cache_Update", "DiT_Attention",
    "DiT_CrossAttn", "DiT_Action", "DiT_FFN", "DiT_Head",
)  # fmt: skip  (the detail labels inside one forward, wmbook.profiling.detail_label)


def sinusoidal_embedding_1d(dim: int, position: torch.Tensor) -> torch.Tensor:
    """Wan's timestep embedding: [cos | sin] of position * 10000^(-i/half); float32 (upstream float64)."""
    half = dim // 2
    position = position.float()
    freqs = torch.pow(10000.0, -torch.arange(half, device=position.device, dtype=torch.float32).div(half))
    sinusoid = torch.outer(position, freqs)
    return torch.cat([torch.cos(sinusoid), torch.sin(sinusoid)], dim=1)


def rope_inv_freqs(head_dim: int, theta: float = 10000.0) -> list[torch.Tensor]:
    """Inverse frequencies of Wan's 3-D RoPE, split over (frame, height, width) like upstream."""
    c = head_dim // 2  # complex pairs
    split = [c - 2 * (c // 3), c // 3, c // 3]
    out = []
    for n in split:
        d = 2 * n
        out.append(1.0 / torch.pow(theta, torch.arange(0, d, 2, dtype=torch.float64).div(d)))
    return out


def rope_cos_sin(inv_freqs, f: int, h: int, w: int, start_frame: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables [F*h*w, 1, D/2] for frames start_frame.. and the h x w grid."""
    pos_f = torch.arange(start_frame, start_frame + f, device=device, dtype=torch.float64)
    pos_h = torch.arange(h, device=device, dtype=torch.float64)
    pos_w = torch.arange(w, device=device, dtype=torch.float64)
    af = torch.outer(pos_f, inv_freqs[0].to(device))  # [f, n0]
    ah = torch.outer(pos_h, inv_freqs[1].to(device))
    aw = torch.outer(pos_w, inv_freqs[2].to(device))
    ang = torch.cat([
        af[:, None, None, :].expand(f, h, w, -1),
        ah[None, :, None, :].expand(f, h, w, -1),
        aw[None, None, :, :].expand(f, h, w, -1),
    ], dim=-1).reshape(f * h * w, 1, -1)
    return torch.cos(ang).float(), torch.sin(ang).float()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate adjacent channel pairs of x [B, L, H, D] (upstream: view_as_complex on pairs)."""
    xf = x.float().unflatten(-1, (-1, 2))  # [B, L, H, D/2, 2]
    x0, x1 = xf[..., 0], xf[..., 1]
    out = torch.stack([x0 * cos - x1 * sin, x0 * sin + x1 * cos], dim=-1)
    return out.flatten(-2).type_as(x)


class WanRMSNorm(nn.Module):
    """RMS norm with statistics and scaling in fp32 whatever the model dtype, like upstream Wan."""

    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.dim = dim
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + self.eps)).type_as(x) * self.weight


class WanLayerNorm(nn.LayerNorm):
    """LayerNorm computed on an fp32 copy of the input whatever the model dtype, like upstream Wan."""

    def __init__(self, dim: int, eps: float = 1e-6, elementwise_affine: bool = False):
        super().__init__(dim, elementwise_affine=elementwise_affine, eps=eps)

    def forward(self, x):
        # statistics in fp32 whatever the model dtype (upstream Wan upcasts too)
        w = self.weight.float() if self.weight is not None else None
        b = self.bias.float() if self.bias is not None else None
        return F.layer_norm(x.float(), self.normalized_shape, w, b, self.eps).type_as(x)


class CausalWanSelfAttention(nn.Module):
    """Self-attention with q/k RMSNorm, 3-D RoPE and a rolling KV cache (roped keys are cached)."""

    def __init__(self, dim: int, num_heads: int, qk_norm: bool = True, eps: float = 1e-6):
        super().__init__()
        self.dim, self.num_heads, self.head_dim = dim, num_heads, dim // num_heads
        self.q = nn.Linear(dim, dim)
        self.k = nn.Linear(dim, dim)
        self.v = nn.Linear(dim, dim)
        self.o = nn.Linear(dim, dim)
        self.norm_q = WanRMSNorm(dim, eps=eps) if qk_norm else nn.Identity()
        self.norm_k = WanRMSNorm(dim, eps=eps) if qk_norm else nn.Identity()

    def forward(self, x, cos, sin, kv_cache: KVCache | None, start_token: int | None = None, mask=None):
        b, s = x.shape[:2]
        n, d = self.num_heads, self.head_dim
        with dl("DiT_SelfAttn_QKV_RoPE"):
            q = apply_rope(self.norm_q(self.q(x)).view(b, s, n, d), cos, sin)  # [B, L, H, D]
            k = apply_rope(self.norm_k(self.k(x)).view(b, s, n, d), cos, sin)
            v = self.v(x).view(b, s, n, d)
        return self.attend(q, k, v, kv_cache, start_token, mask)

    def attend(self, q, k, v, kv_cache: KVCache | None, start_token: int | None, mask):
        """This block's roped q, k and v [B, L, H, D] through the cache and the attention, then the output
        projection (the variants that change how q, k and v are made share it)."""
        if kv_cache is not None:
            with dl("DiT_KV_Cache_Update"):
                k, v = kv_cache.update(k, v, start_token)  # window of cached (roped) keys, this block included
        with dl("DiT_Attention"):  # self-attention SDPA + output projection
            return self.o(attention(q, k, v, mask=mask).flatten(2))


class WanCrossAttention(CausalWanSelfAttention):
    """Cross-attention to context tokens (CLIP image tokens for MG2 i2v, text for t2v); K/V cached.
    Same layers as self-attention (upstream subclasses it too), no RoPE."""

    def context_kv(self, context):
        """K/V of the context tokens [B, Lc, C] -> [B, Lc, H, D] each."""
        b, n, d = context.shape[0], self.num_heads, self.head_dim
        return self.norm_k(self.k(context)).view(b, -1, n, d), self.v(context).view(b, -1, n, d)

    def forward(self, x, context, cache: dict | None = None):
        b, n, d = x.shape[0], self.num_heads, self.head_dim
        q = self.norm_q(self.q(x)).view(b, -1, n, d)
        if cache is not None and "k" in cache:
            k, v = cache["k"], cache["v"]
        else:
            k, v = self.context_kv(context)
            if cache is not None:
                cache["k"], cache["v"] = k, v
        return self.o(attention(q, k, v).flatten(2))


class CausalWanAttentionBlock(nn.Module):
    def __init__(self, p: CausalWanPreset, block_idx: int):
        super().__init__()
        dim = p.dim
        self.norm1 = WanLayerNorm(dim, p.eps)
        self.self_attn = CausalWanSelfAttention(dim, p.num_heads, p.qk_norm, p.eps)
        self.norm3 = WanLayerNorm(dim, p.eps, elementwise_affine=True) if p.cross_attn_norm else nn.Identity()
        self.cross_attn = WanCrossAttention(dim, p.num_heads, p.qk_norm, p.eps)
        self.norm2 = WanLayerNorm(dim, p.eps)
        self.ffn = nn.Sequential(nn.Linear(dim, p.ffn_dim), nn.GELU(approximate="tanh"), nn.Linear(p.ffn_dim, dim))
        self.modulation = nn.Parameter(torch.randn(1, 6, dim) / dim**0.5)
        self.action_model = None
        if p.action is not None and block_idx in p.action.blocks:
            self.action_model = ActionModule(p.action, local_attn_size=p.kv_capacity_frames(),
                                             frames_per_block=p.num_frame_per_block)

    def forward(self, x, e, grid, context, cos, sin, *, attn_start=None, action_start=None, kv_cache=None,
                cross_cache=None, actions=None, action_cache=None, mask=None, action_inputs=None):
        # attn_start / action_start: the latent frame the block starts at, for the self-attention and action
        # caches' writes (upstream passes it down); None when the caches already know where to write
        # (GenerationCache.begin) or the action inputs were prepared once for all blocks: then no Python int
        # reaches a compiled block
        # x [B, L, C]; e [B, F, 6, C] per-frame modulation (time projection)
        f = e.shape[1]
        mod = (self.modulation.unsqueeze(1) + e).chunk(6, dim=2)
        shift_msa, scale_msa, gate_msa, shift_ffn, scale_ffn, gate_ffn = mod

        def modulate(h, shift, scale):  # per-frame AdaLN: [B, F, S, C] * [B, F, 1, C]
            return (h.unflatten(1, (f, -1)) * (1 + scale) + shift).flatten(1, 2)

        def gated(y, gate):
            return (y.unflatten(1, (f, -1)) * gate).flatten(1, 2)

        s = x.shape[1] // f
        with dl("DiT_Norm_Modulation"):
            h = modulate(self.norm1(x), shift_msa, scale_msa)
        y = self.self_attn(h, cos, sin, kv_cache, None if attn_start is None else attn_start * s, mask)
        with dl("DiT_Norm_Modulation"):
            x = x + gated(y, gate_msa)
        with dl("DiT_CrossAttn"):
            x = x + self.cross_attn(self.norm3(x), context, cross_cache)
        if self.action_model is not None:
            with dl("DiT_Action"):
                x = self.action_model(x, grid, actions, start_frame=action_start, cache=action_cache,
                                      inputs=action_inputs)
        with dl("DiT_Norm_Modulation"):
            h = modulate(self.norm2(x), shift_ffn, scale_ffn)
        with dl("DiT_FFN"):
            y = self.ffn(h)
        with dl("DiT_Norm_Modulation"):
            return x + gated(y, gate_ffn)


class CausalHead(nn.Module):
    def __init__(self, dim: int, out_dim: int, patch_size, eps: float = 1e-6):
        super().__init__()
        self.out_dim, self.patch_size = out_dim, tuple(patch_size)
        self.norm = WanLayerNorm(dim, eps)
        self.head = nn.Linear(dim, math.prod(patch_size) * out_dim)
        self.modulation = nn.Parameter(torch.randn(1, 2, dim) / dim**0.5)

    def forward(self, x, e):
        # e [B, F, 1, C] (time embedding, not projection)
        f = e.shape[1]
        shift, scale = (self.modulation.unsqueeze(1) + e).chunk(2, dim=2)
        return self.head((self.norm(x).unflatten(1, (f, -1)) * (1 + scale) + shift).flatten(1, 2))


class MLPProj(nn.Module):
    """CLIP tokens -> model width (upstream `img_emb.proj`)."""

    def __init__(self, in_dim: int, out_dim: int):
        super().__init__()
        self.proj = nn.Sequential(nn.LayerNorm(in_dim), nn.Linear(in_dim, in_dim), nn.GELU(),
                                  nn.Linear(in_dim, out_dim), nn.LayerNorm(out_dim))

    def forward(self, x):
        return self.proj(x)


@dataclass
class GenerationCache:
    """All caches of one streaming generation: self-attn KV per layer, cross-attn K/V, action KV."""

    kv: list[KVCache]
    cross: list[dict]
    action: list[ActionCache | None] = field(default_factory=list)

    def reset(self) -> None:
        """Forget every cache's positions (buffers kept: what was written is never read before it is rewritten)."""
        for c in self.kv:
            c.reset()
        for a in self.action:
            if a is not None:
                for c in (a.mouse, a.keyboard):
                    if c is not None:
                        c.reset()

    def nbytes(self) -> int:
        total = sum(c.nbytes() for c in self.kv) + sum(c.nbytes() for c in self.action if c is not None)
        return total + sum(t.numel() * t.element_size() for c in self.cross for t in c.values())

    def begin(self, start_frame: int, frame_seqlen: int, num_frames: int) -> None:
        """Prepare every cache for this forward's block (eagerly, before any compiled region): self-attention
        caches write num_frames * frame_seqlen tokens from start_frame * frame_seqlen, action caches
        num_frames tokens (one per latent frame) from start_frame. Evictions happen here."""
        for c in self.kv:
            c.begin(start_frame * frame_seqlen, num_frames * frame_seqlen)
        for a in self.action:
            if a is not None:
                for c in (a.mouse, a.keyboard):
                    if c is not None:
                        c.begin(start_frame, num_frames)


@dataclass
class LayerStage:
    """The blocks [start, end) of a forward that one process runs (a pipeline of the layers over processes,
    wmbook.distributed.pipeline): whether it embeds the input (first) and runs the head (last), and the buffer a
    later stage receives its hidden state into (read in place: a captured graph reads the same address every
    replay)."""

    start: int
    end: int
    first: bool
    last: bool
    hidden: torch.Tensor | None = None


@dataclass
class PositionInputs:
    """What one forward derives from its start frame (see CausalWanModel._position_inputs)."""

    cos: torch.Tensor  # [F*h*w, 1, D/2] RoPE tables
    sin: torch.Tensor
    attn_start: int | None  # latent frame for the self-attention caches' writes; None: the slot begin() prepared
    action_start: int | None  # latent frame the action modules window their inputs at; None: `action_inputs`
    action_inputs: object = None  # ActionInputs prepared once for all action modules, or None


class CausalWanModel(nn.Module):
    """Wan2.1-1.3B made block-causal; i2v with MG2 action modules, or t2v (Self-Forcing)."""

    def __init__(self, p: CausalWanPreset):
        super().__init__()
        self.preset = p
        dim = p.dim
        self.patch_embedding = nn.Conv3d(p.in_dim, dim, kernel_size=p.patch_size, stride=p.patch_size)
        if p.model_type == "t2v":
            self.text_embedding = nn.Sequential(nn.Linear(p.text_dim, dim), nn.GELU(approximate="tanh"),
                                                nn.Linear(dim, dim))
        self.time_embedding = nn.Sequential(nn.Linear(p.freq_dim, dim), nn.SiLU(), nn.Linear(dim, dim))
        self.time_projection = nn.Sequential(nn.SiLU(), nn.Linear(dim, dim * 6))
        self.blocks = nn.ModuleList([CausalWanAttentionBlock(p, i) for i in range(p.num_layers)])
        self.head = CausalHead(dim, p.out_dim, p.patch_size, p.eps)
        if p.model_type == "i2v":
            self.img_emb = MLPProj(p.clip_dim, dim)
        self.inv_freqs = rope_inv_freqs(p.head_dim)  # plain attribute: not in the state dict, never cast
        self.init_weights()

    def init_weights(self):
        """Upstream init: xavier-uniform linears, small normal embeddings, zeroed output head."""
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
        nn.init.xavier_uniform_(self.patch_embedding.weight.flatten(1))
        for seq in [self.time_embedding] + ([self.text_embedding] if hasattr(self, "text_embedding") else []):
            for m in seq.modules():
                if isinstance(m, nn.Linear):
                    nn.init.normal_(m.weight, std=0.02)
        # Upstream zeroes the head; with random weights that makes every output 0, so keep it small instead.
        nn.init.normal_(self.head.head.weight, std=0.02)

    # --- caches -----------------------------------------------------------------------------
    def init_cache(self, batch: int, device, dtype) -> GenerationCache:
        p = self.preset
        cap = p.kv_capacity_frames() * p.frame_seqlen
        win = p.local_attn_size * p.frame_seqlen if p.local_attn_size != -1 else cap
        kv = [KVCache(batch, cap, p.num_heads, p.head_dim, dtype, device, window=win) for _ in self.blocks]
        action = [
            blk.action_model.init_cache(batch, p.frame_seqlen, p.kv_capacity_frames(), device, dtype)
            if blk.action_model is not None else None
            for blk in self.blocks
        ]
        return GenerationCache(kv=kv, cross=[{} for _ in self.blocks], action=action)

    @torch.no_grad()
    def prefill_cross_cache(self, context: torch.Tensor, cache: GenerationCache) -> None:
        """Fill every layer's cross-attention K/V from the context before the first block (upstream fills
        them lazily in the first forward, which gives a compiled block two variants: with and without)."""
        ctx = self.embed_context(context.to(self.patch_embedding.weight.dtype))
        for blk, cc in zip(self.blocks, cache.cross):
            k, v = blk.cross_attn.context_kv(ctx)
            if "k" in cc and cc["k"].shape == k.shape and cc["k"].dtype == k.dtype:
                cc["k"].copy_(k)  # in place: a cache reused across generations keeps its addresses
                cc["v"].copy_(v)
            else:
                cc["k"], cc["v"] = k, v

    # --- forward ----------------------------------------------------------------------------
    def embed_context(self, context: torch.Tensor) -> torch.Tensor:
        if self.preset.model_type == "i2v":
            return self.img_emb(context)  # [B, 257, 1280] -> [B, 257, C]
        return self.text_embedding(context)  # [B, 512, 4096] -> [B, 512, C]

    @torch.compiler.disable(recursive=False)  # this frame only: _forward is what a whole-model compile traces
    def forward(self, x, t, context, *, cond_concat=None, actions=None, cache: GenerationCache | None = None,
                start_frame: int = 0):
        """Flow prediction for latent frames x [B, 16, F, h, w] at timesteps t [B, F] (or [B]).

        With `cache`, x is one block starting at latent frame `start_frame` and the caches are read and
        written; without it, x is the whole sequence and the block-causal (windowed) mask is applied.

        What depends on the Python int start_frame (RoPE tables, cache write positions, hoisted action
        inputs) is built here, eagerly; `_forward` gets tensors only, so a whole-model torch.compile
        (which traces `_forward`; this frame is skipped) has no int to guard on and does not recompile
        for every block.
        """
        p = self.preset
        pt, ph, pw = p.patch_size
        _, _, f, h, w = x.shape
        grid = (f // pt, h // ph, w // pw)
        with dl("DiT_Embeddings"):
            pos = self._position_inputs(grid, start_frame, cache, actions, x.dtype, x.device)
        return self._forward(x, t, context, pos.cos, pos.sin, grid, cond_concat=cond_concat, actions=actions,
                             cache=cache, action_inputs=pos.action_inputs, attn_start=pos.attn_start,
                             action_start=pos.action_start)

    def _forward(self, x, t, context, cos, sin, grid, *, cond_concat, actions, cache, action_inputs, attn_start,
                 action_start, stage: LayerStage | None = None, marks=None):
        """The forward after its eager preamble. `stage`: only a range of the blocks (wmbook.distributed's layer
        pipeline): the first stage embeds `x`, a later one takes its hidden state from `stage.hidden` (x then only
        gives the shapes and the dtype), and all but the last return the hidden state instead of the output; the
        operations are the whole forward's, in its order. `marks(i, h)`: called with block i's output (per-layer
        timing)."""
        p = self.preset
        b, f = x.shape[0], x.shape[2]
        if t.dim() == 1:
            t = t[:, None].expand(b, f)
        first = stage is None or stage.first
        with dl("DiT_Embeddings"):  # patch, time and context embeddings
            if first:
                if cond_concat is not None:
                    x = torch.cat([x, cond_concat.to(x.dtype)], dim=1)
                x = self.patch_embedding(x)  # [B, C, F, h/2, w/2]
                x = x.flatten(2).transpose(1, 2)  # [B, L, C]

            e = self.time_embedding(sinusoidal_embedding_1d(p.freq_dim, t.flatten()).to(x.dtype))  # [B*F, C]
            e0 = self.time_projection(e).unflatten(1, (6, p.dim)).unflatten(0, (b, f))  # [B, F, 6, C]
            e = e.unflatten(0, (b, f)).unsqueeze(2)  # [B, F, 1, C]

            if cache is not None and "k" in cache.cross[0]:
                ctx = None  # cross-attn K/V already cached
            else:
                ctx = self.embed_context(context.to(x.dtype))
            if not first:
                x = stage.hidden
        mask = None
        if cache is None:
            # a full window (-1) still rolls once the cache is full, so the mask uses the cache capacity
            fm = block_causal_frame_mask(f, p.num_frame_per_block, p.kv_capacity_frames(), x.device)
            s = grid[1] * grid[2]
            mask = fm.repeat_interleave(s, 0).repeat_interleave(s, 1)  # [L, L] bool, True = attend

        for i in range(len(self.blocks)) if stage is None else range(stage.start, stage.end):
            x = self.blocks[i](x, e0, grid, ctx, cos, sin, attn_start=attn_start, action_start=action_start,
                               kv_cache=cache.kv[i] if cache is not None else None,
                               cross_cache=cache.cross[i] if cache is not None else None,
                               actions=actions,
                               action_cache=cache.action[i] if cache is not None else None,
                               mask=mask, action_inputs=action_inputs)
            if marks is not None:
                marks(i, x)
        if stage is not None and not stage.last:
            return x
        with dl("DiT_Head"):
            return self.unpatchify(self.head(x, e), grid)

    @torch.compiler.disable
    def _position_inputs(self, grid, start_frame: int, cache, actions, dtype, device) -> PositionInputs:
        """What one forward derives from the Python int start_frame, run eagerly (no compiled graph guards on it,
        so a whole-model compile does not recompile per block): the RoPE tables and the caches' write positions
        (GenerationCache.begin). The reference hands start_frame on to every block as upstream does: each
        self-attention cache re-derives its slot from it, each action module windows the raw actions itself.
        Variants (wmbook.variants.swaps) override this to hand the blocks no int at all."""
        cos, sin = rope_cos_sin(self.inv_freqs, grid[0], grid[1], grid[2], start_frame, device)
        if cache is not None:
            cache.begin(start_frame, grid[1] * grid[2], grid[0])
        return PositionInputs(cos, sin, attn_start=start_frame, action_start=start_frame)

    def unpatchify(self, x, grid):
        # x [B, L, pt*ph*pw*out] -> [B, out, F*pt, h*ph, w*pw]
        pt, ph, pw = self.preset.patch_size
        f, h, w = grid
        b, c = x.shape[0], self.preset.out_dim
        x = x.view(b, f, h, w, pt, ph, pw, c)
        x = torch.einsum("bfhwopqc->bcfohpwq", x)
        return x.reshape(b, c, f * pt, h * ph, w * pw)


_PREFIXES = ("model.", "generator.", "diffusion_model.", "module.", "_orig_mod.", "_fsdp_wrapped_module.")


def load_checkpoint(model: CausalWanModel, state_dict_or_path, strict: bool = True, use_ema: bool = False):
    """Load an upstream CausalWanModel / Wan state dict (.safetensors, .pt/.pth or a dict), strict by default.

    EMA or not: a Self-Forcing checkpoint holds {"generator": ..., "generator_ema": ...}; like upstream's
    inference.py (whose --use_ema flag is off by default) this loads "generator" unless use_ema=True, which loads
    "generator_ema" and raises ValueError naming the keys present when the checkpoint has no EMA weights (a
    checkpoint with only "generator_ema" likewise needs use_ema=True). A plain state dict (Matrix-Game-2's
    .safetensors, which its inference.py loads into the generator wrapper as it is; or this module's own
    state_dict()) has no EMA copy and loads with use_ema=False. A nested {"state_dict": ...} or {"model": ...} is
    unwrapped, then common wrapper prefixes ("model.", "generator.", "_orig_mod.", ...) are stripped.

    All or nothing: keys and shapes are checked against model.state_dict() before any tensor is copied; a
    mismatch raises one ValueError (wmbook.models.checkpoint.CheckpointMismatchError, also a RuntimeError)
    listing the missing keys, unexpected keys and wrong shapes, and leaves the model unchanged. strict=False
    allows missing and unexpected keys, never a wrong shape. Dtypes convert on copy. Returns load_state_dict's
    (missing_keys, unexpected_keys).
    """
    sd = select_generator(read_state_dict(state_dict_or_path), use_ema=use_ema)
    clean, origin = {}, {}
    for key, v in sd.items():
        k, changed = key, True
        while changed:
            changed = False
            for pre in _PREFIXES:
                if k.startswith(pre):
                    k, changed = k[len(pre):], True
        if k in clean:
            raise ValueError(f"checkpoint keys {origin[k]!r} and {key!r} both name parameter {k!r} once wrapper "
                             f"prefixes are stripped; nothing was loaded")
        clean[k], origin[k] = v, key
    what = "checkpoint (generator_ema)" if use_ema else "checkpoint"
    return load_checked(model, clean, strict=strict, what=what)
