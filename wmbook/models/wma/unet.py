"""UnifoLM-WMA-0's video UNet (`WMAModel`, DynamiCrafter / lvdm style), plain eager PyTorch.

Parameter names follow upstream `src/unifolm_wma/modules/networks/wma_model.py` and
`src/unifolm_wma/modules/attention.py` (see mapping.py for the few that differ).

Layout: frames fold into the batch for spatial work, x [(B T), C, h, w]; temporal attention folds the
spatial positions into the batch instead, [(B h w), T, C]. B batch, T frames, C channels, h x w latent grid,
N context tokens per frame, H heads, D head dim.

Fine labels (`detail_label`, free unless detail labels are on) split one forward for the trace breakdown;
when labels nest, the innermost one owns the kernels, so:
  UNet_Embeddings        timestep + fps embedding MLPs, the stem conv
  UNet_Context           per-frame context tokens: the action-token Perceiver + layout
  UNet_ResBlock          ResBlock convs, timestep injection, skip path, temporal conv block, skip concat
  UNet_Norm              every GroupNorm(+SiLU) and LayerNorm of the video UNet (nested in the others)
  UNet_Transformer_Proj  transformers' proj_in / proj_out and the layout changes around them
  UNet_SpatialSelfAttn   spatial self-attention (+ residual)
  UNet_CrossAttn         cross-attention to text, image, state and action tokens (+ residual)
  UNet_TemporalAttn      both temporal self-attentions of each temporal transformer (+ residual)
  UNet_FFN               GEGLU feed-forward (+ residual)
  UNet_Resample          down / up sampling convs
  UNet_Out               output GroupNorm + conv
  UNet_Action_Head       the action and state ConditionalUnet1D heads (their own norms included)
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from ...presets import WMAPreset
from ...profiling.labels import detail_label as dl
from ..attention import attention
from .action_head import ConditionalUnet1D
from .layers import GroupNorm32, PerceiverAttention, perceiver_feed_forward, timestep_embedding

WMA_FORWARD_LABEL = "UNet_Forward"
WMA_FINE_LABELS = (
    "UNet_Embeddings", "UNet_Context", "UNet_ResBlock", "UNet_Norm", "UNet_Transformer_Proj",
    "UNet_SpatialSelfAttn", "UNet_CrossAttn", "UNet_TemporalAttn", "UNet_FFN", "UNet_Resample", "UNet_Out",
    "UNet_Action_Head",
)  # fmt: skip


class FrameContext:
    """Per-frame context tokens [(B T), N, C] plus the block-causal action-token masks, built once per forward."""

    def __init__(self, tokens: torch.Tensor, frames: int, n_state: int, text_len: int):
        self.tokens, self.frames, self.n_state, self.text_len = tokens, frames, n_state, text_len
        self._masks: dict[int, torch.Tensor] = {}

    def action_mask(self, action_len: int) -> torch.Tensor:
        """[(B T), 1, 1, L] bool: frame f sees the first (f + 1) * L / T action tokens (upstream _get_attn_mask_aa)."""
        if action_len not in self._masks:
            rows = self.tokens.shape[0]
            per_frame = action_len // self.frames
            frame = torch.arange(rows, device=self.tokens.device) % self.frames
            keys = torch.arange(action_len, device=self.tokens.device)
            self._masks[action_len] = (keys[None, :] < ((frame + 1) * per_frame)[:, None])[:, None, None, :]
        return self._masks[action_len]


class GEGLU(nn.Module):
    def __init__(self, dim_in: int, dim_out: int):
        super().__init__()
        self.proj = nn.Linear(dim_in, dim_out * 2)

    def forward(self, x):
        x, gate = self.proj(x).chunk(2, dim=-1)
        return x * F.gelu(gate)


class FeedForward(nn.Module):
    """GEGLU feed-forward, mult 4 (upstream `FeedForward(glu=True)`)."""

    def __init__(self, dim: int, mult: int = 4):
        super().__init__()
        inner = dim * mult
        self.net = nn.Sequential(GEGLU(dim, inner), nn.Dropout(0.0), nn.Linear(inner, dim))

    def forward(self, x):
        return self.net(x)


class CrossAttention(nn.Module):
    """Self-attention (context None) or the four-way cross-attention of the spatial transformers.

    With `multi_context`, the per-frame context [state | action | text | image] gets its own K/V projections
    per stream (to_k/to_v for text, *_ip image, *_as state, *_aa action) and the four attention outputs are
    summed before to_out; action tokens are masked block-causally over frames (upstream's xformers path).
    """

    def __init__(self, query_dim: int, context_dim: int | None = None, heads: int = 8, dim_head: int = 64,
                 multi_context: bool = False, action_len: int = 16):
        super().__init__()
        inner = heads * dim_head
        context_dim = context_dim or query_dim
        self.heads, self.dim_head = heads, dim_head
        self.multi_context, self.action_len = multi_context, action_len
        self.to_q = nn.Linear(query_dim, inner, bias=False)
        self.to_k = nn.Linear(context_dim, inner, bias=False)
        self.to_v = nn.Linear(context_dim, inner, bias=False)
        self.to_out = nn.Sequential(nn.Linear(inner, query_dim), nn.Dropout(0.0))
        if multi_context:
            for s in ("ip", "as", "aa"):  # image, agent state, agent action
                setattr(self, f"to_k_{s}", nn.Linear(context_dim, inner, bias=False))
                setattr(self, f"to_v_{s}", nn.Linear(context_dim, inner, bias=False))

    def _heads(self, t: torch.Tensor) -> torch.Tensor:
        return t.unflatten(-1, (self.heads, self.dim_head))  # [B, N, H*D] -> [B, N, H, D]

    def forward(self, x: torch.Tensor, ctx: FrameContext | None = None) -> torch.Tensor:
        q = self._heads(self.to_q(x))  # [B, N_q, H, D]
        if ctx is None:
            out = attention(q, self._heads(self.to_k(x)), self._heads(self.to_v(x)))
            return self.to_out(out.flatten(2))
        c = ctx.tokens
        s, a, n_text = ctx.n_state, self.action_len, ctx.text_len
        state, action = c[:, :s], c[:, s:s + a]
        text, image = c[:, s + a:s + a + n_text], c[:, s + a + n_text:]
        out = attention(q, self._heads(self.to_k(text)), self._heads(self.to_v(text)))
        out = out + attention(q, self._heads(self.to_k_ip(image)), self._heads(self.to_v_ip(image)))
        out = out + attention(q, self._heads(self.to_k_as(state)), self._heads(self.to_v_as(state)))
        out = out + attention(q, self._heads(self.to_k_aa(action)), self._heads(self.to_v_aa(action)),
                              mask=ctx.action_mask(a))
        return self.to_out(out.flatten(2))


class BasicTransformerBlock(nn.Module):
    """attn1 -> attn2 -> GEGLU FFN, pre-LayerNorm residuals. Spatial: self + cross; temporal: self + self."""

    def __init__(self, dim: int, n_heads: int, d_head: int, context_dim: int | None = None,
                 multi_context: bool = False, action_len: int = 16, temporal: bool = False):
        super().__init__()
        self.attn1 = CrossAttention(dim, None, n_heads, d_head)
        self.ff = FeedForward(dim)
        self.attn2 = CrossAttention(dim, context_dim, n_heads, d_head, multi_context=multi_context,
                                    action_len=action_len)
        self.norm1 = nn.LayerNorm(dim)
        self.norm2 = nn.LayerNorm(dim)
        self.norm3 = nn.LayerNorm(dim)
        self.labels = ("UNet_TemporalAttn",) * 2 if temporal else ("UNet_SpatialSelfAttn", "UNet_CrossAttn")

    def forward(self, x: torch.Tensor, ctx: FrameContext | None = None) -> torch.Tensor:
        with dl("UNet_Norm"):
            h = self.norm1(x)
        with dl(self.labels[0]):
            x = self.attn1(h) + x
        with dl("UNet_Norm"):
            h = self.norm2(x)
        with dl(self.labels[1]):
            x = self.attn2(h, ctx) + x
        with dl("UNet_Norm"):
            h = self.norm3(x)
        with dl("UNet_FFN"):
            return self.ff(h) + x


class SpatialTransformer(nn.Module):
    """Attention over the h x w positions of each frame, with cross-attention to that frame's context."""

    def __init__(self, channels: int, n_heads: int, d_head: int, context_dim: int, action_len: int,
                 depth: int = 1, groups: int = 32):
        super().__init__()
        inner = n_heads * d_head
        self.norm = nn.GroupNorm(groups, channels, eps=1e-6)
        self.proj_in = nn.Linear(channels, inner)
        self.transformer_blocks = nn.ModuleList([
            BasicTransformerBlock(inner, n_heads, d_head, context_dim, multi_context=True, action_len=action_len)
            for _ in range(depth)
        ])
        self.proj_out = nn.Linear(inner, channels)

    def forward(self, x: torch.Tensor, ctx: FrameContext) -> torch.Tensor:
        bt, c, h, w = x.shape  # [(B T), C, h, w]
        with dl("UNet_Norm"):
            y = self.norm(x)
        with dl("UNet_Transformer_Proj"):
            y = self.proj_in(y.flatten(2).transpose(1, 2))  # [(B T), h*w, inner]
        for blk in self.transformer_blocks:
            y = blk(y, ctx)
        with dl("UNet_Transformer_Proj"):
            y = self.proj_out(y).transpose(1, 2).reshape(bt, c, h, w)
        return x + y


class TemporalTransformer(nn.Module):
    """Self-attention over the T frames at each spatial position (two attentions + FFN per block)."""

    def __init__(self, channels: int, n_heads: int, d_head: int, depth: int = 1, use_linear: bool = True,
                 groups: int = 32):
        super().__init__()
        inner = n_heads * d_head
        self.use_linear = use_linear
        self.norm = nn.GroupNorm(groups, channels, eps=1e-6)
        # the stem's extra temporal transformer (init_attn) uses 1x1 Conv1d projections, the others Linear
        self.proj_in = nn.Linear(channels, inner) if use_linear else nn.Conv1d(channels, inner, 1)
        self.transformer_blocks = nn.ModuleList([
            BasicTransformerBlock(inner, n_heads, d_head, temporal=True) for _ in range(depth)
        ])
        self.proj_out = nn.Linear(inner, channels) if use_linear else nn.Conv1d(inner, channels, 1)

    def _proj(self, layer: nn.Module, y: torch.Tensor) -> torch.Tensor:
        return layer(y) if self.use_linear else layer(y.transpose(1, 2)).transpose(1, 2)

    def frames_norm(self, x: torch.Tensor, batch: int) -> torch.Tensor:
        """x [(B T), C, h, w] -> the GroupNorm of [B, C, T, h, w]: statistics over all frames of a sample."""
        # .contiguous(): eager group_norm copies a transposed input anyway; traced graphs (AOTAutograd) call
        # native_group_norm directly, whose CPU kernel refuses a non-contiguous input
        return self.norm(x.unflatten(0, (batch, x.shape[0] // batch)).transpose(1, 2).contiguous())

    def forward(self, x: torch.Tensor, batch: int) -> torch.Tensor:
        bt, c, h, w = x.shape  # [(B T), C, h, w]
        t = bt // batch
        with dl("UNet_Norm"):
            y = self.frames_norm(x, batch)  # [B, C, T, h, w]
        with dl("UNet_Transformer_Proj"):
            y = y.permute(0, 3, 4, 2, 1).reshape(batch * h * w, t, c)  # [(B h w), T, C]
            y = self._proj(self.proj_in, y)
        for blk in self.transformer_blocks:
            y = blk(y)
        with dl("UNet_Transformer_Proj"):
            y = self._proj(self.proj_out, y)
            y = y.view(batch, h, w, t, c).permute(0, 3, 4, 1, 2).reshape(bt, c, h, w)
        return x + y


class TemporalConvBlock(nn.Module):
    """Four GroupNorm-SiLU-Conv3d(3x1x1) layers over time, residual (ModelScope style)."""

    def __init__(self, channels: int, groups: int = 32, dropout: float = 0.1):
        super().__init__()
        k, pad = (3, 1, 1), (1, 0, 0)
        self.conv1 = nn.Sequential(nn.GroupNorm(groups, channels), nn.SiLU(),
                                   nn.Conv3d(channels, channels, k, padding=pad))
        for i in (2, 3, 4):
            setattr(self, f"conv{i}", nn.Sequential(nn.GroupNorm(groups, channels), nn.SiLU(), nn.Dropout(dropout),
                                                    nn.Conv3d(channels, channels, k, padding=pad)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x  # [B, C, T, h, w]
        for conv in (self.conv1, self.conv2, self.conv3, self.conv4):
            with dl("UNet_Norm"):
                h = conv[1](conv[0](h))
            h = conv[-1](conv[2](h) if len(conv) == 4 else h)
        return x + h


class ResBlock(nn.Module):
    """GroupNorm-SiLU-Conv, + timestep embedding, GroupNorm-SiLU-Conv, skip; then the temporal conv block."""

    def __init__(self, channels: int, emb_channels: int, out_channels: int | None = None,
                 temporal_conv: bool = True, dropout: float = 0.1, groups: int = 32):
        super().__init__()
        out = out_channels or channels
        self.in_layers = nn.Sequential(GroupNorm32(groups, channels), nn.SiLU(), nn.Conv2d(channels, out, 3, padding=1))
        self.emb_layers = nn.Sequential(nn.SiLU(), nn.Linear(emb_channels, out))
        self.out_layers = nn.Sequential(GroupNorm32(groups, out), nn.SiLU(), nn.Dropout(dropout),
                                        nn.Conv2d(out, out, 3, padding=1))
        self.skip_connection = nn.Identity() if out == channels else nn.Conv2d(channels, out, 1)
        # upstream spells this `temopral_conv`; mapping.py renames it
        self.temporal_conv = TemporalConvBlock(out, groups) if temporal_conv else None
        self.temporal_format = torch.contiguous_format  # the layout of the temporal conv block's input (NCDHW)

    def forward(self, x: torch.Tensor, emb: torch.Tensor, batch: int) -> torch.Tensor:
        # x [(B T), C, h, w]; emb [(B T), E]
        with dl("UNet_ResBlock"):
            with dl("UNet_Norm"):
                h = self.in_layers[1](self.in_layers[0](x))
            h = self.in_layers[2](h)
            h = h + self.emb_layers(emb).type(h.dtype)[:, :, None, None]
            with dl("UNet_Norm"):
                h = self.out_layers[1](self.out_layers[0](h))
            h = self.out_layers[3](self.out_layers[2](h))
            h = self.skip_connection(x) + h
            return self.temporal(h, batch)

    def temporal(self, h: torch.Tensor, batch: int) -> torch.Tensor:
        """The temporal conv block over h's [B, C, T, h, w] view, made contiguous in `temporal_format` (see above;
        the variant temporal-channels-last sets channels_last_3d: a channels-last h is that layout already)."""
        if self.temporal_conv is None:
            return h
        h5 = h.unflatten(0, (batch, -1)).transpose(1, 2).contiguous(memory_format=self.temporal_format)
        if self.temporal_format == torch.channels_last_3d:
            # The strides of size-1 dims are arbitrary, and at a 1x1 spatial map eager kernels and torch.compile's
            # trace pick different ones: the trace then takes the tensor for channels-last and drops GroupNorm's
            # copy, which the CPU kernel, reading it as contiguous, refuses. The canonical channels-last strides
            # address the same elements (a free view) and read the same everywhere.
            n, c, t, hh, ww = h5.shape
            h5 = h5.as_strided(h5.shape, (c * t * hh * ww, 1, hh * ww * c, ww * c, c))
        return self.temporal_conv(h5).transpose(1, 2).flatten(0, 1)


class Downsample(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.op = nn.Conv2d(channels, channels, 3, stride=2, padding=1)

    def forward(self, x):
        with dl("UNet_Resample"):
            return self.op(x)


class Upsample(nn.Module):
    upsamples = True  # what forward's feature collection asks of an output block's last layer (and of its swaps)

    def __init__(self, channels: int):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x):
        with dl("UNet_Resample"):
            return self.conv(F.interpolate(x, scale_factor=2, mode="nearest"))


class TimestepEmbedSequential(nn.Sequential):
    """Calls each layer with what it needs: ResBlocks the embedding, transformers the context / batch."""

    def forward(self, x, emb, ctx: FrameContext, batch: int):
        for layer in self:
            if isinstance(layer, ResBlock):
                x = layer(x, emb, batch)
            elif isinstance(layer, SpatialTransformer):
                x = layer(x, ctx)
            elif isinstance(layer, TemporalTransformer):
                x = layer(x, batch)
            else:
                x = layer(x)
        return x


class SATokenProjector(nn.Module):
    """One action token -> num_stem_token x frames tokens (a Perceiver with learned queries), upstream names."""

    def __init__(self, dim: int, depth: int = 1, dim_head: int = 64, heads: int = 16, num_queries: int = 16,
                 output_dim: int = 1024, ff_mult: int = 4, chunk_size: int = 16):
        super().__init__()
        self.latents = nn.Parameter(torch.randn(1, num_queries * chunk_size, dim) / dim**0.5)
        self.proj_out = nn.Linear(dim, output_dim)
        self.norm_out = nn.LayerNorm(output_dim)
        self.layers = nn.ModuleList([
            nn.ModuleList([PerceiverAttention(dim, dim_head, heads), perceiver_feed_forward(dim, ff_mult, "tanh")])
            for _ in range(depth)
        ])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        latents = self.latents.expand(x.shape[0], -1, -1)  # [N, m*T, C]
        for attn, ff in self.layers:
            latents = attn(x, latents) + latents
            latents = ff(latents) + latents
        return self.norm_out(self.proj_out(latents))


class WMAModel(nn.Module):
    """The 3-D UNet with its action and state heads; one call = one denoising forward of video, actions, states."""

    def __init__(self, p: WMAPreset):
        super().__init__()
        self.preset = p
        mc, g = p.model_channels, p.norm_groups
        ted = mc * 4  # time embedding width
        dh = p.num_head_channels
        self.time_embed = nn.Sequential(nn.Linear(mc, ted), nn.SiLU(), nn.Linear(ted, ted))
        self.fps_embedding = nn.Sequential(nn.Linear(mc, ted), nn.SiLU(), nn.Linear(ted, ted))
        self.input_blocks = nn.ModuleList([TimestepEmbedSequential(nn.Conv2d(p.in_channels, mc, 3, padding=1))])
        self.init_attn = TimestepEmbedSequential(
            TemporalTransformer(mc, p.init_attn_heads, dh, p.transformer_depth, use_linear=False, groups=g))

        def attn_layers(ch: int, action_len: int) -> list[nn.Module]:
            heads = ch // dh
            return [SpatialTransformer(ch, heads, dh, p.context_dim, action_len, p.transformer_depth, g),
                    TemporalTransformer(ch, heads, dh, p.transformer_depth, groups=g)]

        action_len = p.frames * p.num_stem_token  # action tokens per frame (input and middle blocks)
        chans, ch, ds = [mc], mc, 1
        for level, mult in enumerate(p.channel_mult):
            for _ in range(p.num_res_blocks):
                layers: list[nn.Module] = [ResBlock(ch, ted, mult * mc, groups=g)]
                ch = mult * mc
                if ds in p.attention_resolutions:
                    layers += attn_layers(ch, action_len)
                self.input_blocks.append(TimestepEmbedSequential(*layers))
                chans.append(ch)
            if level != len(p.channel_mult) - 1:
                self.input_blocks.append(TimestepEmbedSequential(Downsample(ch)))
                chans.append(ch)
                ds *= 2
        self.middle_block = TimestepEmbedSequential(
            ResBlock(ch, ted, groups=g), *attn_layers(ch, action_len), ResBlock(ch, ted, groups=g))
        self.output_blocks = nn.ModuleList([])
        for level, mult in list(enumerate(p.channel_mult))[::-1]:
            for i in range(p.num_res_blocks + 1):
                layers = [ResBlock(ch + chans.pop(), ted, mc * mult, groups=g)]
                ch = mc * mult
                if ds in p.attention_resolutions:
                    # upstream passes no agent_action_context_len here, so these blocks use its default (16)
                    layers += attn_layers(ch, p.output_action_context_len)
                if level and i == p.num_res_blocks:
                    layers.append(Upsample(ch))
                    ds //= 2
                self.output_blocks.append(TimestepEmbedSequential(*layers))
        self.out = nn.Sequential(GroupNorm32(g, ch), nn.SiLU(), nn.Conv2d(mc, p.out_channels, 3, padding=1))
        self._action_lens = sorted({m.action_len for m in self.modules()
                                    if isinstance(m, CrossAttention) and m.multi_context})
        self.action_unet = ConditionalUnet1D(p, p.agent_action_dim)
        self.state_unet = ConditionalUnet1D(p, p.agent_state_dim)
        self.action_token_projector = SATokenProjector(
            p.context_dim, depth=1, dim_head=p.stem_dim_head, heads=p.stem_heads, num_queries=p.num_stem_token,
            output_dim=p.context_dim, chunk_size=p.frames)
        if p.action_embedding:  # wmbook's own (WMAPreset.action_embedding): not in upstream's state dicts
            # fed from the raw action / state vectors, not from the context's tokens (there a random position
            # embedding of RMS 0.99 swamps the action projector's RMS 0.13, and trained 725 steps on the H100 the
            # model moved 0.42% with swapped actions, run k of data/weights/README.md)
            self.action_embed = nn.Sequential(nn.Linear(p.agent_action_dim, ted), nn.SiLU(), nn.Linear(ted, ted))
            self.state_embed = nn.Sequential(nn.Linear(p.agent_state_dim, ted), nn.SiLU(), nn.Linear(ted, ted))
            for mlp in (self.action_embed, self.state_embed):  # a new model starts as if it had no such path
                nn.init.zeros_(mlp[-1].weight)
                nn.init.zeros_(mlp[-1].bias)

    def frame_embedding(self, emb: torch.Tensor, t: int, actions: torch.Tensor | None = None,
                        obs_states: torch.Tensor | None = None) -> torch.Tensor:
        """The time embedding per frame, [B, E] -> [(B T), E]: repeated for every frame, plus (preset
        action_embedding) an MLP of the last observed state vector and the running sum over the raw action vectors
        0..f of an MLP of each, for frame f (action f is the step that leads to frame f: a frame's embedding holds
        the steps up to it, none after). actions [B, horizon, A] (zeros for the decision pass), obs_states
        [B, n_obs, S]."""
        p = self.preset
        if not p.action_embedding:
            return emb.repeat_interleave(t, dim=0)
        if actions is None or obs_states is None:
            raise ValueError(f"preset {p.name!r} embeds the raw actions (action_embedding=True): pass actions "
                             f"[B, {p.horizon}, {p.agent_action_dim}] (zeros for the decision pass) and obs_states")
        b = emb.shape[0]
        if actions.shape[0] != b or actions.shape[-1] != p.agent_action_dim or actions.shape[1] < t:
            raise ValueError(f"actions has shape {tuple(actions.shape)}; expected [{b}, >= {t}, {p.agent_action_dim}]")
        steps = self.action_embed(actions[:, :t].to(emb.dtype)).cumsum(dim=1)  # [B, T, E]
        state = self.state_embed(obs_states[:, -1].to(emb.dtype))  # [B, E]
        return (emb + state).unsqueeze(1).add(steps).flatten(0, 1)

    def context_len(self) -> int:
        """Context tokens per sample: state | action | text | image (frames x resampler queries)."""
        p = self.preset
        return p.n_obs_steps + p.horizon + p.text_len + p.frames * p.resampler_queries

    def frame_context(self, context: torch.Tensor, t: int) -> FrameContext:
        """[B, N, C] sample context -> per-frame tokens [(B T), n_state + T*m + text_len + Q, C] (upstream layout)."""
        p = self.preset
        b, n, c = context.shape
        if n != self.context_len():
            raise ValueError(f"context has {n} tokens; expected {self.context_len()} = {p.n_obs_steps} state + "
                             f"{p.horizon} action + {p.text_len} text + {p.frames}x{p.resampler_queries} image")
        s, a, L = p.n_obs_steps, p.horizon, p.text_len
        state = context[:, :s].repeat_interleave(t, dim=0)  # [(B T), s, C]
        action = self.action_token_projector(context[:, s:s + a].reshape(b * a, 1, c))  # [(B A), T*m, C]
        action = action.view(b, a, t, -1, c).permute(0, 2, 1, 3, 4).reshape(b * t, -1, c)  # [(B T), A*m, C]
        text = context[:, s + a:s + a + L].repeat_interleave(t, dim=0)  # [(B T), L, C]
        image = context[:, s + a + L:].reshape(b * t, -1, c)  # [(B T), Q, C]
        ctx = FrameContext(torch.cat([state, action, text, image], dim=1), t, s, L)
        # build every action-token mask now, once per forward: filled lazily inside the blocks, the dict would
        # change under torch.compile's guards and recompile the blocks
        for length in self._action_lens:
            ctx.action_mask(length)
        return ctx

    def forward(self, x: torch.Tensor, x_action: torch.Tensor, x_state: torch.Tensor, timesteps: torch.Tensor,
                context: torch.Tensor, obs_images: torch.Tensor, obs_states: torch.Tensor,
                fs: torch.Tensor | None = None, actions: torch.Tensor | None = None,
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [B, 8, T, h, w] (noisy latent | observation latent), x_action / x_state [B, T, 16], timesteps [B],
        context [B, N, C], obs_images [B, 3, n_obs, H, W], obs_states [B, n_obs, 16], actions [B, T, 16] the raw
        actions (presets with action_embedding only; upstream's UNet sees actions through the context alone)
        -> (video v-prediction [B, 4, T, h, w], action eps [B, T, 16], state eps [B, T, 16])."""
        p = self.preset
        b, _, t, _, _ = x.shape
        dtype = x.dtype
        with dl("UNet_Embeddings"):
            emb = self.time_embed(timestep_embedding(timesteps, p.model_channels).to(dtype))
            if fs is None:
                fs = torch.full((b,), p.default_fs, dtype=torch.long, device=x.device)
            emb = emb + self.fps_embedding(timestep_embedding(fs, p.model_channels).to(dtype))
            emb = self.frame_embedding(emb, t, actions, obs_states)  # [(B T), E]
        with dl("UNet_Context"):
            ctx = self.frame_context(context.to(dtype), t)
        with dl("UNet_Embeddings"):
            h = x.transpose(1, 2).flatten(0, 1)  # [(B T), 8, h, w]
            h = self.input_blocks[0](h, emb, ctx, b)  # [(B T), mc, h, w]
        h = self.init_attn(h, emb, ctx, b)

        # features handed to the heads: each level's last output, the middle, and the decoder levels
        feats: list[torch.Tensor] = []
        skips = [h]
        for module in self.input_blocks[1:]:
            if isinstance(module[0], Downsample):
                feats.append(skips[-1].unflatten(0, (b, t)))  # [B, T, C, h, w]
            h = module(h, emb, ctx, b)
            skips.append(h)
        feats.append(h.unflatten(0, (b, t)))
        h = self.middle_block(h, emb, ctx, b)
        feats.append(h.unflatten(0, (b, t)))
        prev = None
        for module in self.output_blocks:
            with dl("UNet_ResBlock"):
                h = torch.cat([h, skips.pop()], dim=1)
            h = module(h, emb, ctx, b)
            if getattr(module[-1], "upsamples", False):
                feats.append(prev.unflatten(0, (b, t)))
            prev = h
        feats.append(h.unflatten(0, (b, t)))
        with dl("UNet_Out"):
            with dl("UNet_Norm"):
                y = self.out[1](self.out[0](h))
            y = self.out[2](y).unflatten(0, (b, t)).transpose(1, 2)  # [B, 4, T, h, w]
        with dl("UNet_Action_Head"):
            a, s = self.run_heads(x_action, x_state, timesteps, feats, obs_images, obs_states)
        return y, a, s

    @torch._dynamo.disable(recursive=False, reason="the heads compile as graphs of their own, apart from the trunk's")
    def run_heads(self, x_action, x_state, timesteps, feats, obs_images, obs_states):
        """The action and state heads on the trunk's features. Under torch.compile of the whole UNet dynamo skips this
        frame (not the heads' forwards, which it compiles as graphs of their own): the trunk's graph ends here and is
        the same whatever the heads are, so a stack that changes only the heads (head-conv-gemm, skip-unused-heads)
        compiles the heads again and finds the trunk in the compile cache, where one graph of both compiled the whole
        UNet again (about 4 minutes at wma on an H200)."""
        return (self.action_unet(x_action, timesteps, feats, obs_images, obs_states),
                self.state_unet(x_state, timesteps, feats, obs_images, obs_states))
