"""Analytic FLOPs of one UnifoLM-WMA UNet forward (video UNet + action and state heads), for the FLOP floor.

Counts what runs on matrix units: convolutions, linear layers and attention (QK^T and PV over all keys,
masked ones included, as the kernels compute them); a multiply-add is 2 FLOPs, biases are not counted.
Norms, activations, softmax and layout copies are memory-bound and left out on purpose.
`tests/test_wma_models.py` checks the total against torch's FlopCounterMode plus a count of every
attention call on the tiny preset.
"""

from __future__ import annotations

from ...presets import WMAPreset
from .action_head import resnet18_out_hw


def _linear(rows: int, cin: int, cout: int) -> float:
    return 2.0 * rows * cin * cout


def _conv(n: int, cin: int, cout: int, k: int, out_positions: int) -> float:
    return 2.0 * n * cin * cout * k * out_positions


def _sdpa(batch_heads_times_dim: int, lq: int, lk: int) -> float:
    return 4.0 * batch_heads_times_dim * lq * lk  # QK^T and PV: 2 * 2 * B*H*D * Lq * Lk


def _transformer_block(rows: int, lq: int, inner: int, ctx_tokens: int = 0, ctx_dim: int = 0) -> dict[str, float]:
    """One BasicTransformerBlock on `rows` sequences of `lq` tokens; ctx_tokens > 0: attn2 is cross-attention."""
    tok = rows * lq
    self_attn = 4 * _linear(tok, inner, inner) + _sdpa(rows * inner, lq, lq)
    if ctx_tokens:
        # q and out on the queries; the four K/V stream pairs together project every context token once
        second = 2 * _linear(tok, inner, inner) + 2 * _linear(rows * ctx_tokens, ctx_dim, inner) \
            + _sdpa(rows * inner, lq, ctx_tokens)
    else:
        second = 4 * _linear(tok, inner, inner) + _sdpa(rows * inner, lq, lq)
    ffn = _linear(tok, inner, 8 * inner) + _linear(tok, 4 * inner, inner)  # GEGLU in (x2 for the gate), out
    return {"self": self_attn, "second": second, "ffn": ffn}


def resnet18_flops(images: int, height: int, width: int, widths) -> float:
    """Conv FLOPs of the ResNet-18 trunk (GroupNorm variant) on `images` frames."""
    h, w = (height + 6 - 7) // 2 + 1, (width + 6 - 7) // 2 + 1
    total = _conv(images, 3, widths[0], 49, h * w)
    h, w = (h - 1) // 2 + 1, (w - 1) // 2 + 1  # max-pool
    cin = widths[0]
    for i, c in enumerate(widths):
        if i:
            h, w = (h - 1) // 2 + 1, (w - 1) // 2 + 1
        total += _conv(images, cin, c, 9, h * w) + _conv(images, c, c, 9, h * w)  # block 1
        if i or cin != c:
            total += _conv(images, cin, c, 1, h * w)  # its 1x1 projection shortcut
        total += 2 * _conv(images, c, c, 9, h * w)  # block 2
        cin = c
    return total


def head_flops(p: WMAPreset, input_dim: int, batch: int = 1) -> float:
    """One ConditionalUnet1D call: observation encoder, FiLM residual blocks, keypoints of the 9 UNet features."""
    t, a = p.horizon, p.head_act_proj_dim
    rows = batch * t
    dsed, k = p.head_step_embed_dim, p.head_kernel_size
    down = list(p.head_down_dims)
    ctx = [m * p.model_channels for m in p.channel_mult]
    h, w = p.latent_hw
    n_img = batch * p.n_obs_steps
    oh, ow = resnet18_out_hw(p.height, p.width)
    obs = resnet18_flops(n_img, p.height, p.width, p.obs_widths) \
        + _conv(n_img, p.obs_widths[-1], p.obs_spatial_kp, 1, oh * ow)
    obs_dim = 2 * p.obs_spatial_kp + p.agent_state_dim
    cond_dim = dsed + obs_dim * p.n_obs_steps
    total = obs + _linear(batch, dsed, 4 * dsed) + _linear(batch, 4 * dsed, dsed)
    total += _linear(rows * input_dim, 1, a) + _linear(rows * input_dim, a, 1)  # proj_in_action / proj_out_action
    # keypoint 1x1 convs on the 9 features (C maps each)
    levels = len(ctx)
    feat_levels = list(range(levels)) + [levels - 1] + list(range(levels - 1, -1, -1))
    for lv in feat_levels:
        total += _conv(batch * p.frames, ctx[lv], ctx[lv], 1, (h // 2**lv) * (w // 2**lv))

    def res(cin: int, cout: int, length: int, cdim: int) -> float:
        f = _conv(rows, cin, cout, k, length) + _conv(rows, cout, cout, k, length) + _linear(rows, cdim, 2 * cout)
        return f + (_conv(rows, cin, cout, 1, length) if cin != cout else 0.0)

    length = a
    in_out = list(zip([input_dim] + down[:-1], down))
    for i, (din, dout) in enumerate(in_out):
        cdim = cond_dim + 2 * ctx[i]
        total += res(din, dout, length, cdim) + res(dout, dout, length, cdim)
        if i < len(in_out) - 1:
            length = (length - 1) // 2 + 1
            total += _conv(rows, dout, dout, 3, length)
    cdim = cond_dim + 2 * ctx[-1]
    total += 2 * res(down[-1], down[-1], length, cdim)
    rev = ctx[::-1]
    for i, (din, dout) in enumerate(reversed(in_out[1:] + [(down[-1], down[-1])])):
        cdim = cond_dim + 2 * rev[i]
        total += res(dout + din, din, length, cdim) + res(din, din, length, cdim)
        if i < len(in_out) - 1:
            total += _conv(rows, din, din, 4, length)  # ConvTranspose1d counts input positions
            length *= 2
    total += _conv(rows, down[0], down[0], k, length) + _conv(rows, down[0], input_dim, 1, length)
    return total


def unet_forward_flops(p: WMAPreset, batch: int = 1) -> dict[str, float]:
    """FLOPs of one `WMAModel` forward (one guidance branch) by part; `total` sums them."""
    mc, dh, T = p.model_channels, p.num_head_channels, p.frames
    ted = 4 * mc
    n = batch * T  # frames folded into the batch
    h0, w0 = p.latent_hw
    ctx_per_frame = p.n_obs_steps + p.horizon * p.num_stem_token + p.text_len + p.resampler_queries
    parts = {k: 0.0 for k in ("embeddings", "context", "resblocks", "resample", "transformer_proj",
                              "spatial_self_attn", "cross_attn", "temporal_attn", "ffn", "out", "action_head")}
    parts["embeddings"] = (2 * (_linear(batch, mc, ted) + _linear(batch, ted, ted))  # time + fps MLPs
                           + _conv(n, p.in_channels, mc, 9, h0 * w0))  # stem conv
    # action-token Perceiver: every action token becomes T*m tokens
    rows, lq, d = batch * p.horizon, T * p.num_stem_token, p.context_dim
    inner = p.stem_heads * p.stem_dim_head
    parts["context"] = (_linear(rows * lq, d, inner) + _linear(rows * (lq + 1), d, 2 * inner)
                        + _sdpa(rows * inner, lq, lq + 1) + _linear(rows * lq, inner, d)
                        + _linear(rows * lq, d, 4 * d) + _linear(rows * lq, 4 * d, d) + _linear(rows * lq, d, d))

    def resblock(cin: int, cout: int, hw: int) -> None:
        f = _conv(n, cin, cout, 9, hw) + _linear(n, ted, cout) + _conv(n, cout, cout, 9, hw)
        f += _conv(n, cin, cout, 1, hw) if cin != cout else 0.0
        f += 4 * _conv(n, cout, cout, 3, hw)  # temporal conv block, 4 x Conv3d(3x1x1) over T*h*w
        parts["resblocks"] += f

    def spatial(c: int, hw: int) -> None:
        parts["transformer_proj"] += 2 * _linear(n * hw, c, c)
        blk = _transformer_block(n, hw, c, ctx_per_frame, p.context_dim)
        parts["spatial_self_attn"] += blk["self"]
        parts["cross_attn"] += blk["second"]
        parts["ffn"] += blk["ffn"]

    def temporal(c: int, hw: int, inner: int) -> None:
        parts["transformer_proj"] += 2 * _linear(batch * hw * T, c, inner)
        blk = _transformer_block(batch * hw, T, inner)
        parts["temporal_attn"] += blk["self"] + blk["second"]
        parts["ffn"] += blk["ffn"]

    temporal(mc, h0 * w0, p.init_attn_heads * dh)  # init_attn
    chans, ch, ds, hw = [mc], mc, 1, h0 * w0
    for level, mult in enumerate(p.channel_mult):
        for _ in range(p.num_res_blocks):
            resblock(ch, mult * mc, hw)
            ch = mult * mc
            if ds in p.attention_resolutions:
                spatial(ch, hw)
                temporal(ch, hw, ch)
            chans.append(ch)
        if level != len(p.channel_mult) - 1:
            hw //= 4
            parts["resample"] += _conv(n, ch, ch, 9, hw)
            chans.append(ch)
            ds *= 2
    resblock(ch, ch, hw)
    spatial(ch, hw)
    temporal(ch, hw, ch)
    resblock(ch, ch, hw)
    for level, mult in list(enumerate(p.channel_mult))[::-1]:
        for i in range(p.num_res_blocks + 1):
            resblock(ch + chans.pop(), mc * mult, hw)
            ch = mc * mult
            if ds in p.attention_resolutions:
                spatial(ch, hw)
                temporal(ch, hw, ch)
            if level and i == p.num_res_blocks:
                hw *= 4
                parts["resample"] += _conv(n, ch, ch, 9, hw)
                ds //= 2
    parts["out"] = _conv(n, mc, p.out_channels, 9, h0 * w0)
    parts["action_head"] = head_flops(p, p.agent_action_dim, batch) + head_flops(p, p.agent_state_dim, batch)
    parts["total"] = float(sum(parts.values()))
    return parts


def step_flops(p: WMAPreset, guidance_scale: float = 1.0, batch: int = 1) -> float:
    """All UNet forwards of one DDIM step: one, or two with classifier-free guidance."""
    return unet_forward_flops(p, batch)["total"] * (2 if guidance_scale != 1.0 else 1)
