"""UnifoLM-WMA reference model: real-shape structure and counts on the meta device, tiny forward, FLOPs, mapping."""

import gzip
import json

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import wmbook.models.wma.layers as wma_layers
import wmbook.models.wma.unet as wma_unet
from wmbook.models.wma import WMA_FINE_LABELS, WMAWorldModel, parameter_counts
from wmbook.models.wma.flops import step_flops, unet_forward_flops
from wmbook.models.wma.mapping import (
    from_upstream_key,
    load_upstream_checkpoint,
    to_upstream_keys,
    upstream_ema_key,
    upstream_state_dict,
)
from wmbook.models.wma.unet import FrameContext, ResBlock, SpatialTransformer, TemporalTransformer
from wmbook.presets import get_preset
from wmbook.profiling import profile, set_labels
from wmbook.variants import swaps

pytestmark = pytest.mark.numerics  # rerun with oneDNN and ATen held to older ISAs: `make test-isa`


@pytest.fixture(autouse=True, scope="module")
def _one_thread(one_thread):
    """Every test of this module on one thread (tests/conftest.py)."""


def _inputs(p, m, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    b, t = 1, p.frames
    h, w = p.latent_hw
    args = (torch.randn(b, 4, t, h, w, generator=g), torch.randn(b, 4, t, h, w, generator=g),
            torch.randn(b, t, p.agent_action_dim, generator=g), torch.randn(b, t, p.agent_state_dim, generator=g),
            torch.tensor([979]), torch.randn(b, m.diffusion_model.context_len(), p.context_dim, generator=g),
            torch.rand(b, 3, p.n_obs_steps, p.height, p.width, generator=g) * 2 - 1,
            torch.rand(b, p.n_obs_steps, p.agent_state_dim, generator=g) * 2 - 1)
    return tuple(a.to(device) for a in args)


def _model(name, seed=0, device=None):
    torch.manual_seed(seed)
    if device is None:
        return WMAWorldModel(get_preset(name)).eval().requires_grad_(False)
    with torch.device(device):
        return WMAWorldModel(get_preset(name)).eval().requires_grad_(False)


@pytest.fixture(scope="module")
def real_meta():
    return _model("wma", device="meta")


@pytest.fixture(scope="module")
def tiny():
    return _model("tiny-wma")


# --- real shapes on the meta device (no memory) --------------------------------------------------------


def test_real_structure_matches_upstream(real_meta):
    dm = real_meta.diffusion_model
    mods = list(dm.modules())
    # 2 per level down (4 levels) + 2 middle + 3 per level up = 22; attention at ds 1, 2, 4 only
    assert sum(isinstance(m, ResBlock) for m in mods) == 22
    assert sum(isinstance(m, SpatialTransformer) for m in mods) == 16
    assert sum(isinstance(m, TemporalTransformer) for m in mods) == 17  # + the stem's init_attn
    heads = [m.transformer_blocks[0].attn1.heads for m in mods if isinstance(m, SpatialTransformer)]
    assert sorted(set(heads)) == [5, 10, 20]  # 320, 640, 1280 channels / 64
    assert dm.init_attn[0].transformer_blocks[0].attn1.heads == 8
    # action tokens per frame as the blocks slice them: 16 steps x 16 stem tokens in the encoder and middle,
    # upstream's default 16 in the decoder (its output blocks are built without agent_action_context_len)
    action_len = lambda blocks: {m.transformer_blocks[0].attn2.action_len  # noqa: E731
                                 for b in blocks for m in b.modules() if isinstance(m, SpatialTransformer)}
    assert action_len(dm.input_blocks) == action_len([dm.middle_block]) == {256}
    assert action_len(dm.output_blocks) == {16}
    # context per sample: 2 state + 16 action + 77 text + 16 frames x 16 image tokens
    assert dm.context_len() == 2 + 16 + 77 + 256


def test_real_forward_shapes_on_meta(real_meta):
    p = get_preset("wma")
    seen = {}

    def grab(module, args):
        seen["feats"] = [tuple(f.shape) for f in args[2]]

    hook = real_meta.diffusion_model.action_unet.register_forward_pre_hook(grab)
    try:
        with torch.no_grad():
            y, a, s = real_meta(*_inputs(p, real_meta, device="meta"))
    finally:
        hook.remove()
    assert tuple(y.shape) == (1, 4, 16, 40, 64)
    assert tuple(a.shape) == (1, 16, 16) and tuple(s.shape) == (1, 16, 16)
    chans = [320, 640, 1280, 1280, 1280, 1280, 1280, 640, 320]
    hw = [(40, 64), (20, 32), (10, 16), (5, 8), (5, 8), (5, 8), (10, 16), (20, 32), (40, 64)]
    assert seen["feats"] == [(1, 16, c, h, w) for c, (h, w) in zip(chans, hw)]


def _lin(i, o, bias=True):
    return i * o + (o if bias else 0)


def _unet_params_formula(mc=320, mult=(1, 2, 4, 4), ctx=1024, dh=64, t=16, stem=16, init_heads=8, cin=8, cout=4):
    """Independent count of the video UNet from upstream's architecture description (not from our modules)."""
    e = 4 * mc

    def res(i, o):
        n = 2 * i + 9 * i * o + o + _lin(e, o) + 2 * o + 9 * o * o + o
        n += _lin(i, o) if i != o else 0
        return n + 4 * (2 * o + 3 * o * o + o)  # temporal conv block

    def block(inner, cd=None):
        attn1 = 3 * inner * inner + _lin(inner, inner)
        kv = 2 * (cd or inner) * inner * (4 if cd else 1)  # text + image + state + action K/V streams
        attn2 = inner * inner + kv + _lin(inner, inner)
        return attn1 + attn2 + _lin(inner, 8 * inner) + _lin(4 * inner, inner) + 6 * inner

    def spatial(c):
        return 2 * c + 2 * _lin(c, c) + block(c, ctx)

    def temporal(c, inner):
        return 2 * c + _lin(c, inner) + _lin(inner, c) + block(inner)

    n = 2 * (_lin(mc, e) + _lin(e, e)) + 9 * cin * mc + mc + temporal(mc, init_heads * dh)
    chans, ch = [mc], mc
    for lv, m in enumerate(mult):
        for _ in range(2):
            n += res(ch, m * mc)
            ch = m * mc
            if lv < 3:
                n += spatial(ch) + temporal(ch, ch)
            chans.append(ch)
        if lv < 3:
            n += 9 * ch * ch + ch
            chans.append(ch)
    n += 2 * res(ch, ch) + spatial(ch) + temporal(ch, ch)
    for lv, m in list(enumerate(mult))[::-1]:
        for i in range(3):
            n += res(ch + chans.pop(), mc * m)
            ch = mc * m
            if lv < 3:
                n += spatial(ch) + temporal(ch, ch)
            if lv and i == 2:
                n += 9 * ch * ch + ch
    n += 2 * mc + 9 * mc * cout + cout
    d = ctx  # action-token Perceiver: latents, attention, FFN, proj_out, norm_out
    n += t * stem * d + 4 * d + 3 * d * d + d * d + 2 * d + 8 * d * d + _lin(d, d) + 2 * d
    return n


def _head_params_formula(d=16, dims=(256, 512, 1024, 2048), k=5, dsed=128, ctx=(320, 640, 1280, 1280), act=32,
                         horizon=16, n_obs=2, kp=128, widths=(64, 128, 256, 512), sdim=16):
    """Independent count of one ConditionalUnet1D head (diffusion-policy layout, upstream inference config)."""

    def cb(i, o, kk=k):  # Conv1d + GroupNorm
        return i * o * kk + o + 2 * o

    def crb(i, o, cd):  # two conv blocks, FiLM linear, 1x1 residual when widths differ
        return cb(i, o) + cb(o, o) + _lin(cd, 2 * o) + (_lin(i, o) if i != o else 0)

    obs = 3 * widths[0] * 49 + 2 * widths[0]  # ResNet-18 stem conv + GroupNorm
    cin = widths[0]
    for i, w in enumerate(widths):
        obs += 9 * cin * w + 2 * w + 9 * w * w + 2 * w + ((cin * w + 2 * w) if i else 0)  # block 1 (+ projection)
        obs += 2 * (9 * w * w + 2 * w)  # block 2
        cin = w
    obs += _lin(widths[-1], kp)  # spatial-softmax keypoint conv
    cond = dsed + (2 * kp + sdim) * n_obs
    n = obs + _lin(dsed, 4 * dsed) + _lin(4 * dsed, dsed)
    io = list(zip((d,) + dims[:-1], dims))
    for i, (a, b) in enumerate(io):
        n += crb(a, b, cond + 2 * ctx[i]) + crb(b, b, cond + 2 * ctx[i]) + (3 * b * b + b if i < 3 else 0)
    n += 2 * crb(dims[-1], dims[-1], cond + 2 * ctx[-1])
    for i, (a, b) in enumerate(reversed(io[1:] + [(dims[-1], dims[-1])])):
        c = cond + 2 * ctx[::-1][i]
        n += crb(b + a, a, c) + crb(a, a, c) + (4 * a * a + a if i < 3 else 0)
    n += cb(dims[0], dims[0]) + _lin(dims[0], d)
    n += sum(_lin(c, c) for c in ctx)  # the 4 unique UNet-feature keypoint convs
    n += _lin(1, act) + 2 * act + _lin(horizon, act) + 2 * act + 2 * act + _lin(act, 1) + 2 * act + _lin(act, horizon)
    return n


def test_real_parameter_counts_match_independent_formula(real_meta):
    dm = real_meta.diffusion_model
    n_heads = sum(t.numel() for t in dm.action_unet.parameters())
    n_unet = sum(t.numel() for t in dm.parameters()) - 2 * n_heads
    assert n_unet == _unet_params_formula()
    assert n_heads == _head_params_formula()


def test_parameter_counts_by_part():
    c = parameter_counts(get_preset("wma"))
    # published sizes: SD VAE decoder 49.49 M / encoder 34.16 M; OpenCLIP ViT-H/14 visual 632.08 M with its
    # 1280x1024 projection (not used here), text tower 354.03 M with its projection and last block
    assert c["vae_decoder"] == pytest.approx(49.49e6, rel=1e-3)
    assert c["vae_encoder"] == pytest.approx(34.16e6, rel=1e-3)
    assert c["clip_image_encoder"] + 1280 * 1024 == pytest.approx(632.08e6, rel=1e-4)
    text_block = 12 * 1024**2 + 13 * 1024  # the dropped 24th block
    assert c["text_encoder"] + text_block + 1024 * 1024 == pytest.approx(354.03e6, rel=1e-4)
    assert c["world_model"] == c["unet"] + c["action_head"] + c["state_head"] + c["image_resampler"] \
        + c["state_action_projectors"]
    assert c["action_head"] == c["state_head"] > 4e8  # two 1-D UNets with 2048-wide stages


# --- tiny forward ------------------------------------------------------------------------------------


def test_tiny_forward_shapes_finite_and_nontrivial(tiny):
    p = get_preset("tiny-wma")
    with torch.no_grad():
        y, a, s = tiny(*_inputs(p, tiny))
    assert y.shape == (1, 4, p.frames, *p.latent_hw)
    assert a.shape == (1, p.horizon, p.agent_action_dim) and s.shape == (1, p.horizon, p.agent_state_dim)
    for out in (y, a, s):
        assert torch.isfinite(out).all() and out.abs().max() > 1e-3


def test_tiny_forward_deterministic_and_input_sensitive(tiny):
    p = get_preset("tiny-wma")
    other = _model("tiny-wma", seed=0)
    with torch.no_grad():
        y1 = tiny(*_inputs(p, tiny))[0]
        y2 = other(*_inputs(p, tiny))[0]
        x = list(_inputs(p, tiny))
        x[5] = x[5].clone()
        x[5][:, 2] += torch.randn(p.context_dim)  # one action token (not a constant: LayerNorms remove those)
        y3 = tiny(*x)[0]
    assert torch.equal(y1, y2)
    assert (y1 - y3).abs().max() > 1e-5


def test_bf16_forward_runs(tiny):
    p = get_preset("tiny-wma")
    m = _model("tiny-wma").to(torch.bfloat16)
    with torch.no_grad():
        y, a, s = m(*(t.to(torch.bfloat16) if t.is_floating_point() else t for t in _inputs(p, tiny)))
    assert y.dtype == torch.bfloat16 and torch.isfinite(y.float()).all()


def test_context_length_checked(tiny):
    p = get_preset("tiny-wma")
    args = list(_inputs(p, tiny))
    args[5] = args[5][:, :-1]
    with pytest.raises(ValueError, match="context has"):
        tiny(*args)


def test_action_embedding_is_wmbooks_own_starts_silent_and_holds_the_steps_up_to_each_frame(tiny):
    """WMAPreset.action_embedding (the world presets): the reference presets have no such weights (upstream's state
    dicts stay as they are); a new model with it computes exactly what the model without it computes (its MLPs end
    in zeros); once trained, frame f's embedding holds the raw actions 0..f and none after, and the last observed
    state vector reaches every frame. The raw actions are required, with a clear error."""
    assert not [k for k in tiny.state_dict() if "action_embed" in k or "state_embed" in k]
    assert get_preset("world-wma").action_embedding and not get_preset("wma").action_embedding
    p = get_preset("tiny-wma").with_(action_embedding=True)
    m = WMAWorldModel(p).eval().requires_grad_(False)
    missing, unexpected = m.load_state_dict(tiny.state_dict(), strict=False)
    assert unexpected == [] and sorted({k.split(".")[1] for k in missing}) == ["action_embed", "state_embed"]
    dm, x = m.diffusion_model, list(_inputs(p, tiny))
    acts = torch.rand(1, p.horizon, p.agent_action_dim)
    with torch.no_grad():
        with pytest.raises(ValueError, match="pass actions"):
            m(*x)
        assert torch.equal(m(*x, actions=acts)[0], tiny(*x)[0])
        for mlp in (dm.action_embed, dm.state_embed):  # as if trained
            mlp[-1].weight.normal_(std=0.1)
            mlp[-1].bias.normal_(std=0.1)
        emb, states, f = torch.randn(1, 4 * p.model_channels), x[7], 2

        def moved(step=None, state=None):
            a, s = acts.clone(), states.clone()
            if step is not None:
                a[:, step] += 1.0
            if state is not None:
                s[:, state] += 1.0
            return (dm.frame_embedding(emb, p.frames, a, s)
                    - dm.frame_embedding(emb, p.frames, acts, states)).abs().amax(-1)

        step = moved(step=f)  # action f
        assert step.shape == (p.frames,) and step[:f].max() == 0 and (step[f:] > 0).all()
        assert (moved(state=p.n_obs_steps - 1) > 0).all()  # the last observed state
        assert moved(state=0).max() == 0  # the earlier one goes through the cross-attention only
        y0 = m(*x, actions=acts)[0]
        a2 = acts.clone()
        a2[:, f] += 1.0
        assert (m(*x, actions=a2)[0] - y0).abs().max() > 1e-4
        with pytest.raises(ValueError, match="actions has shape"):
            m(*x, actions=acts[..., :2])


def test_action_tokens_are_block_causal_over_frames():
    ctx = FrameContext(torch.zeros(2 * 4, 1, 1), frames=4, n_state=2, text_len=8)
    m = ctx.action_mask(8)[:, 0, 0]  # 2 tokens per frame
    assert m.shape == (8, 8)
    for row in range(8):
        f = row % 4
        assert m[row].tolist() == [j < 2 * (f + 1) for j in range(8)]


# --- FLOPs ----------------------------------------------------------------------------------------------


def test_analytic_flops_match_counted_flops(tiny, monkeypatch):
    """FlopCounterMode counts matmuls and convolutions (not CPU attention); attention calls are counted here."""
    p = get_preset("tiny-wma")
    attn = [0.0]
    orig = wma_unet.attention

    def counting(q, k, v, mask=None):
        attn[0] += 4.0 * q.shape[0] * q.shape[2] * q.shape[3] * q.shape[1] * k.shape[1]
        return orig(q, k, v, mask=mask)

    monkeypatch.setattr(wma_unet, "attention", counting)
    monkeypatch.setattr(wma_layers, "attention", counting)
    with torch.no_grad(), FlopCounterMode(display=False) as fc:
        tiny(*_inputs(p, tiny))
    counted = fc.get_total_flops() + attn[0]
    assert attn[0] > 0
    assert unet_forward_flops(p)["total"] == pytest.approx(counted, rel=1e-9)


def test_real_flops_parts():
    p = get_preset("wma")
    f = unet_forward_flops(p)
    assert f["total"] == pytest.approx(sum(v for k, v in f.items() if k != "total"))
    assert 10e12 < f["total"] < 20e12  # ~13 TFLOP per forward at 16 x 40 x 64
    assert f["resblocks"] > f["ffn"] > f["spatial_self_attn"] > f["action_head"]
    assert step_flops(p, guidance_scale=2.0) == 2 * step_flops(p, guidance_scale=1.0)


# --- checkpoint mapping ---------------------------------------------------------------------------------


def test_mapping_round_trip_and_upstream_names(tiny):
    up = upstream_state_dict(tiny)
    for key in ("model.diffusion_model.input_blocks.1.0.temopral_conv.conv1.2.weight",
                "model.diffusion_model.input_blocks.1.1.transformer_blocks.0.attn2.to_k_aa.weight",
                "model.diffusion_model.init_attn.0.proj_in.weight",
                "model.diffusion_model.output_blocks.2.1.conv.weight",
                "model.diffusion_model.action_unet.obs_encoder.key_model_map.image.4.0.conv1.weight",
                "model.diffusion_model.state_unet.spatial_softmax_blocks.8.nets.weight",
                "model.diffusion_model.action_token_projector.layers.0.0.to_kv.weight",
                "image_proj_model.layers.0.1.1.weight", "agent_state_pos_emb"):
        assert key in up, key
    assert not any(".temporal_conv." in k or ".backbone." in k for k in up)
    assert torch.equal(up["model.diffusion_model.action_unet.spatial_softmax_blocks.4.nets.weight"],
                       up["model.diffusion_model.action_unet.spatial_softmax_blocks.3.nets.weight"])
    ckpt = {"state_dict": {**up, "first_stage_model.decoder.conv_in.weight": torch.zeros(1),
                           "model.diffusion_model.action_unet.obs_encoder._dummy_variable": torch.zeros(0),
                           "scale_arr": torch.ones(3)}}
    fresh = _model("tiny-wma", seed=1)
    assert not torch.equal(fresh.agent_state_pos_emb, tiny.agent_state_pos_emb)
    report = load_upstream_checkpoint(fresh, ckpt)  # strict
    assert sorted(report.ignored) == sorted(["first_stage_model.decoder.conv_in.weight", "scale_arr",
                                             "model.diffusion_model.action_unet.obs_encoder._dummy_variable"])
    a, b = tiny.state_dict(), fresh.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_mapping_is_strict(tiny):
    up = upstream_state_dict(tiny)
    missing = dict(up)
    del missing["model.diffusion_model.out.2.weight"]
    with pytest.raises(RuntimeError, match="out.2.weight"):
        load_upstream_checkpoint(_model("tiny-wma", seed=1), missing)
    broken = dict(up)
    k = "model.diffusion_model.action_unet.spatial_softmax_blocks.5.nets.weight"
    broken[k] = broken[k] + 1
    with pytest.raises(ValueError, match="shared block"):
        load_upstream_checkpoint(_model("tiny-wma", seed=1), broken)
    assert from_upstream_key("cond_stage_model.model.token_embedding.weight") is None


def _snapshot(m):
    return {k: v.detach().clone() for k, v in m.state_dict().items()}


def _assert_same(m, snap):
    sd = m.state_dict()
    assert sd.keys() == snap.keys()
    for k, v in snap.items():
        assert sd[k].dtype == v.dtype and torch.equal(sd[k], v), k


def _with_ema(src, ema_src):
    """An upstream Lightning state dict of `src` with a LitEma copy of `ema_src`'s `model` (dotless names, one
    entry per shared parameter, decay / num_updates), and a dp_ema_model copy of the action head."""
    sd = dict(upstream_state_dict(src))
    for k, v in ema_src.named_parameters():
        if k.startswith("diffusion_model."):
            sd[upstream_ema_key(to_upstream_keys(k)[0])] = v.detach().clone()
    sd["model_ema.decay"], sd["model_ema.num_updates"] = torch.tensor(0.9999), torch.tensor(10, dtype=torch.int)
    for k, v in ema_src.diffusion_model.action_unet.state_dict().items():
        sd["dp_ema_model." + k] = v + 1
    return {"state_dict": sd}


def test_wma_loader_loads_non_ema_by_default_and_ema_on_request(tiny, tmp_path):
    ema_src = _model("tiny-wma", seed=5)
    ckpt = _with_ema(tiny, ema_src)
    assert upstream_ema_key("model.diffusion_model.out.2.weight") == "model_ema.diffusion_modelout2weight"
    path = tmp_path / "wma.ckpt"
    torch.save(ckpt, path)
    dst = _model("tiny-wma", seed=1)
    report = load_upstream_checkpoint(dst, path)  # upstream's default: the non-EMA model.* weights
    _assert_same(dst, _snapshot(tiny))
    assert report.ema == 0 and any(k.startswith("model_ema.") for k in report.ignored)
    assert any(k.startswith("dp_ema_model.") for k in report.ignored)
    report = load_upstream_checkpoint(dst, path, use_ema=True)
    params = {k for k, _ in dst.named_parameters()}
    a, e, d = tiny.state_dict(), ema_src.state_dict(), dst.state_dict()
    for k in d:
        from_ema = k in params and k.startswith("diffusion_model.")
        assert torch.equal(d[k], e[k] if from_ema else a[k]), k  # buffers, projectors, pos embs: non-EMA
    assert report.ema == sum(k.startswith("diffusion_model.") for k in params) and not report.not_ema
    assert not any(k.startswith("model_ema.") for k in report.ignored)  # used, not ignored
    assert any(k.startswith("dp_ema_model.") for k in report.ignored)  # upstream inference never reads it


def test_wma_loader_use_ema_without_ema_weights_is_an_error(tiny):
    dst = _model("tiny-wma", seed=1)
    before = _snapshot(dst)
    with pytest.raises(ValueError, match=r"use_ema=True.*no EMA weights.*'model\.': "):
        load_upstream_checkpoint(dst, {"state_dict": upstream_state_dict(tiny)}, use_ema=True)
    with pytest.raises(ValueError, match=r"use_ema=True"):
        load_upstream_checkpoint(dst, tiny.state_dict(), use_ema=True)
    _assert_same(dst, before)


@pytest.mark.parametrize("use_ema", [False, True])
def test_wma_loader_refusal_leaves_the_model_untouched(tiny, use_ema):
    """One wrong shape among ~2000 matching tensors, or one missing key: refused before any tensor is copied."""
    dst = _model("tiny-wma", seed=1)
    before = _snapshot(dst)
    ckpt = _with_ema(tiny, _model("tiny-wma", seed=5))["state_dict"]
    k = "model.diffusion_model.output_blocks.2.1.conv.weight"
    wrong = {**ckpt, k: ckpt[k][:, :-1]}
    if use_ema:
        wrong[upstream_ema_key(k)] = wrong[k]
    for strict in (True, False):
        with pytest.raises(ValueError, match=r"1 shape mismatches: diffusion_model\.output_blocks\.2\.1\.conv"):
            load_upstream_checkpoint(dst, wrong, strict=strict, use_ema=use_ema)
        _assert_same(dst, before)
    missing = dict(ckpt)
    del missing["model.diffusion_model.out.2.weight"]
    if use_ema:
        del missing["model.diffusion_model.out.2.bias"], missing[upstream_ema_key("model.diffusion_model.out.2.bias")]
    with pytest.raises(ValueError, match=r"missing keys: diffusion_model\.out\.2\."):
        load_upstream_checkpoint(dst, missing, use_ema=use_ema)
    _assert_same(dst, before)


def test_wma_loader_round_trips_the_modules_own_state_dict(tiny, tmp_path):
    dst = _model("tiny-wma", seed=1)
    torch.save(tiny.state_dict(), tmp_path / "own.pt")
    report = load_upstream_checkpoint(dst, tmp_path / "own.pt")
    assert not report.missing and not report.unexpected and report.loaded == len(tiny.state_dict())
    _assert_same(dst, _snapshot(tiny))
    fresh = _model("tiny-wma", seed=2)
    before = _snapshot(fresh)
    own = dict(tiny.state_dict())
    own["diffusion_model.out.2.weight"] = own["diffusion_model.out.2.weight"][:1]
    with pytest.raises(ValueError, match="shape mismatches"):
        load_upstream_checkpoint(fresh, own)
    _assert_same(fresh, before)


# --- fine labels -------------------------------------------------------------------------------------


def test_fine_labels_only_when_detail_is_on(tiny, tmp_path):
    p = get_preset("tiny-wma")
    args = _inputs(p, tiny)
    names = {}
    for detail in (False, True):
        set_labels(True, detail=detail)
        try:
            with torch.no_grad():
                res = profile(lambda: tiny(*args), wait=0, warmup=0, active=1, out_dir=tmp_path, name=f"d{int(detail)}",
                              activities=["cpu"])
        finally:
            set_labels(True, detail=False)
        with gzip.open(res.trace_path, "rt") as f:
            names[detail] = {e.get("name") for e in json.load(f)["traceEvents"]}
    assert set(WMA_FINE_LABELS) <= names[True]
    assert not set(WMA_FINE_LABELS) & names[False]


@pytest.mark.parametrize("spatial", [1, 3])
def test_temporal_channels_last_compiles_at_any_spatial_size(spatial):
    """A channels-last ResBlock whose temporal conv block reads channels_last_3d, compiled (aot_eager: the graph
    runs aten kernels, as the CPU rows of notebook 06 do), equals eager, also at a 1x1 spatial map (the tiny preset's
    deepest level), where the strides of the size-1 dims are ambiguous."""
    torch.manual_seed(0)
    blk = ResBlock(64, 32, groups=8).eval()
    swaps.to_memory_format(blk, torch.channels_last)  # what channels-last and temporal-channels-last do
    swaps.to_memory_format(blk.temporal_conv, torch.channels_last_3d)
    blk.temporal_format = torch.channels_last_3d
    x = torch.randn(4, 64, spatial, spatial).contiguous(memory_format=torch.channels_last)  # [(B T), C, h, w]
    emb = torch.randn(4, 32)
    torch._dynamo.reset()
    with torch.no_grad():
        want = blk(x, emb, 1)
        got = torch.compile(blk, backend="aot_eager", fullgraph=True)(x, emb, 1)
    torch.testing.assert_close(got, want)  # fp32, the same kernels: default fp32 tolerances
