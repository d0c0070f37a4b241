"""Reference causal DiT: shapes, upstream parameter names, KV-cache equivalence, checkpoint loading."""

import pytest
import torch

from wmbook.models.causal_wan import CausalWanModel, load_checkpoint
from wmbook.models.flops import dit_forward_flops
from wmbook.models.kv_cache import KVCache
from wmbook.presets import get_preset

pytestmark = pytest.mark.numerics  # rerun with oneDNN and ATen held to older ISAs: `make test-isa`


def _inputs(p, num_blocks, seed=0):
    g = torch.Generator().manual_seed(seed)
    h, w = p.latent_hw
    f = num_blocks * p.num_frame_per_block
    x = torch.randn(1, 16, f, h, w, generator=g)
    t = torch.rand(1, f, generator=g) * 1000
    if p.model_type == "i2v":
        ctx = torch.randn(1, p.clip_tokens, p.clip_dim, generator=g)
        cond = torch.randn(1, 20, f, h, w, generator=g)
    else:
        ctx, cond = torch.randn(1, p.text_len, p.text_dim, generator=g), None
    acts = None
    if p.action is not None:
        n = 1 + 4 * (f - 1)
        acts = {"mouse": torch.randn(1, n, 2, generator=g), "keyboard": torch.randn(1, n, 4, generator=g)}
    return x, t, ctx, cond, acts


@pytest.mark.parametrize("name,num_blocks", [("tiny", 4), ("tiny-sf", 3), ("tiny-sf", 4)])
def test_kv_cached_generation_equals_masked_full_sequence(name, num_blocks):
    """Block-by-block with KV caches == one full forward with the block-causal mask (fp32, 1e-5).

    `tiny` has a 6-frame window and 3-frame blocks, so blocks 2 and 3 run after eviction started;
    `tiny-sf` with 4 blocks rolls its full-window cache past its 9-frame capacity.
    Each block is written twice (a noisy pass, then the real one), like denoising steps + refresh.
    """
    p = get_preset(name)
    torch.manual_seed(0)
    m = CausalWanModel(p).eval()
    x, t, ctx, cond, acts = _inputs(p, num_blocks)
    k = p.num_frame_per_block
    with torch.no_grad():
        full = m(x, t, ctx, cond_concat=cond, actions=acts)
        cache = m.init_cache(1, x.device, x.dtype)
        outs = []
        for b in range(num_blocks):
            sl = slice(b * k, (b + 1) * k)
            c = cond[:, :, sl] if cond is not None else None
            m(torch.randn_like(x[:, :, sl]), t[:, sl] * 0.5, ctx, cond_concat=c, actions=acts, cache=cache,
              start_frame=b * k)
            outs.append(m(x[:, :, sl], t[:, sl], ctx, cond_concat=c, actions=acts, cache=cache, start_frame=b * k))
        cached = torch.cat(outs, dim=2)
    assert full.shape == (1, 16, num_blocks * k, *p.latent_hw)
    scale = full.abs().max().item()
    assert scale > 1e-3  # the outputs are not trivially zero
    assert (full - cached).abs().max().item() <= 1e-5 * max(1.0, scale)


def test_window_matters():
    """Sanity of the test above: without the window the late blocks differ, so eviction was exercised."""
    p = get_preset("tiny")
    torch.manual_seed(0)
    m = CausalWanModel(p).eval()
    x, t, ctx, cond, acts = _inputs(p, 4)
    with torch.no_grad():
        a = m(x, t, ctx, cond_concat=cond, actions=acts)
        m.preset = p.with_(local_attn_size=-1, max_latent_frames=12)
        for blk in m.blocks:
            if blk.action_model is not None:
                blk.action_model.local_attn_size = 12
        b = m(x, t, ctx, cond_concat=cond, actions=acts)
    assert torch.allclose(a[:, :, :6], b[:, :, :6], atol=1e-6)
    assert (a[:, :, 6:] - b[:, :, 6:]).abs().max() > 1e-4


def test_kv_cache_rolls_like_upstream():
    c = KVCache(1, capacity=6, heads=1, head_dim=1, dtype=torch.float32, device="cpu", window=6)
    for blk in range(4):
        vals = torch.arange(blk * 3, blk * 3 + 3, dtype=torch.float32).view(1, 3, 1, 1)
        k, _ = c.update(vals, vals, blk * 3)
        k, _ = c.update(vals, vals, blk * 3)  # rewriting the same block does not evict again
    assert k.flatten().tolist() == [6.0, 7.0, 8.0, 9.0, 10.0, 11.0]
    with pytest.raises(ValueError, match="capacity"):
        c.update(torch.zeros(1, 7, 1, 1), torch.zeros(1, 7, 1, 1), 12)


def test_real_shapes_and_upstream_names_on_meta():
    with torch.device("meta"):
        mg2 = CausalWanModel(get_preset("mg2-universal"))
        sf = CausalWanModel(get_preset("self-forcing"))
    sd = mg2.state_dict()
    expect = {
        "patch_embedding.weight": (1536, 36, 1, 2, 2),
        "time_embedding.0.weight": (1536, 256),
        "time_projection.1.weight": (9216, 1536),
        "blocks.0.modulation": (1, 6, 1536),
        "blocks.29.self_attn.q.weight": (1536, 1536),
        "blocks.0.self_attn.norm_q.weight": (1536,),
        "blocks.0.norm3.weight": (1536,),
        "blocks.0.cross_attn.k.weight": (1536, 1536),
        "blocks.0.ffn.0.weight": (8960, 1536),
        "blocks.0.action_model.mouse_mlp.0.weight": (1024, 2 * 12 + 1536),
        "blocks.0.action_model.t_qkv.weight": (3072, 1024),
        "blocks.0.action_model.keyboard_embed.0.weight": (128, 4),
        "blocks.0.action_model.keyboard_attn_kv.weight": (2048, 128 * 12),
        "blocks.14.action_model.proj_keyboard.weight": (1536, 1024),
        "head.head.weight": (64, 1536),
        "head.modulation": (1, 2, 1536),
        "img_emb.proj.1.weight": (1280, 1280),
        "img_emb.proj.3.weight": (1536, 1280),
    }
    for k, shape in expect.items():
        assert tuple(sd[k].shape) == shape, k
    assert not any(k.startswith("blocks.15.action_model") for k in sd)
    assert "text_embedding.0.weight" not in sd
    sf_sd = sf.state_dict()
    assert tuple(sf_sd["text_embedding.0.weight"].shape) == (1536, 4096)
    assert tuple(sf_sd["patch_embedding.weight"].shape) == (1536, 16, 1, 2, 2)
    n_sf = sum(v.numel() for v in sf_sd.values())
    assert 1.40e9 < n_sf < 1.44e9  # Wan2.1-T2V-1.3B


def test_flop_count_matches_anchor_stack():
    """ANCHORS section 7: 30 blocks, 2640 queries, 15840 visible keys, 257 context tokens = 14.4 TFLOP."""
    p = get_preset("mg2-universal").with_(action=None, local_attn_size=18, max_latent_frames=18)
    fl = dit_forward_flops(p, block_idx=5)
    stack = sum(v for k, v in fl.items() if k.startswith(("self_attn", "cross_attn", "ffn")))
    assert abs(stack / 14.4e12 - 1) < 0.01


def test_the_dit_flops_by_kernel_category_are_its_parts():
    """Notebook 06 rates each kernel category's work by the DiT's own count: every part but the action modules'
    few-key attentions (fused reductions) lands in the category whose kernels compute it."""
    from wmbook.models.flops import dit_flops_by_category

    p = get_preset("mg2-universal")
    parts, cats = dit_forward_flops(p, block_idx=1), dit_flops_by_category(p, block_idx=1)
    assert set(cats) == {"GEMM/linear", "attention", "convolution"}
    assert cats["attention"] == parts["self_attn_sdpa"] + parts["cross_attn_sdpa"]
    assert sum(cats.values()) + parts["action_attn"] == pytest.approx(parts["total"])
    assert 0 < parts["action_attn"] < 1e-3 * parts["total"]


def test_checkpoint_loader_strict_roundtrip(tmp_path):
    p = get_preset("tiny")
    torch.manual_seed(1)
    src = CausalWanModel(p)
    sd = {"generator." + k: v for k, v in src.state_dict().items()}
    path = tmp_path / "ckpt.pt"
    torch.save({"generator": sd}, path)
    torch.manual_seed(2)
    dst = CausalWanModel(p)
    load_checkpoint(dst, path)
    for k, v in src.state_dict().items():
        assert torch.equal(v, dst.state_dict()[k]), k
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in src.state_dict().items()}, tmp_path / "m.safetensors")
    load_checkpoint(dst, tmp_path / "m.safetensors")
    bad = dict(src.state_dict())
    bad.pop("head.head.weight")
    with pytest.raises(RuntimeError, match="head.head.weight"):
        load_checkpoint(dst, bad)


# --- checkpoint loading: EMA choice, all-or-nothing refusal -----------------------------------------------------


def _tiny(seed, name="tiny"):
    torch.manual_seed(seed)
    return CausalWanModel(get_preset(name))


def _snapshot(m):
    return {k: v.detach().clone() for k, v in m.state_dict().items()}


def _assert_same(m, snap):
    sd = m.state_dict()
    assert sd.keys() == snap.keys()
    for k, v in snap.items():
        assert sd[k].dtype == v.dtype and torch.equal(sd[k], v), k


def test_checkpoint_loader_picks_generator_unless_use_ema(tmp_path):
    """Self-Forcing's {"generator", "generator_ema"}: "generator" by default (upstream inference.py without
    --use_ema), "generator_ema" only with use_ema=True."""
    gen, ema = _tiny(1), _tiny(2)
    ckpt = {"generator": {"model." + k: v for k, v in gen.state_dict().items()},
            "generator_ema": {"model." + k: v for k, v in ema.state_dict().items()}, "step": torch.tensor(7)}
    path = tmp_path / "sf.pt"
    torch.save(ckpt, path)
    dst = _tiny(3)
    load_checkpoint(dst, path)
    _assert_same(dst, _snapshot(gen))
    load_checkpoint(dst, path, use_ema=True)
    _assert_same(dst, _snapshot(ema))
    load_checkpoint(dst, ckpt, use_ema=False)
    _assert_same(dst, _snapshot(gen))
    # the same choice for a flat checkpoint with both copies under prefixes
    flat = {f"{w}.model.{k}": v for w, m in (("generator", gen), ("generator_ema", ema))
            for k, v in m.state_dict().items()}
    load_checkpoint(dst, flat, use_ema=True)
    _assert_same(dst, _snapshot(ema))
    load_checkpoint(dst, flat)
    _assert_same(dst, _snapshot(gen))


def test_checkpoint_loader_use_ema_without_ema_weights_is_an_error(tmp_path):
    src, dst = _tiny(1), _tiny(2)
    before = _snapshot(dst)
    for ckpt in ({"generator": src.state_dict()}, dict(src.state_dict())):
        with pytest.raises(ValueError, match=r"use_ema=True.*no EMA weights.*generator"):
            load_checkpoint(dst, ckpt, use_ema=True)
    try:
        load_checkpoint(dst, {"generator": src.state_dict(), "critic": {}}, use_ema=True)
    except ValueError as e:
        assert "'generator'" in str(e) and "'critic'" in str(e)  # the keys present are named
    else:
        raise AssertionError("use_ema=True without EMA weights loaded")
    # only EMA weights present: an explicit choice is needed the other way too
    with pytest.raises(ValueError, match="use_ema=True"):
        load_checkpoint(dst, {"generator_ema": src.state_dict()})
    _assert_same(dst, before)


@pytest.mark.parametrize("strict", [True, False])
def test_checkpoint_loader_refusal_leaves_the_model_untouched(strict):
    """One wrong shape among ~90 matching tensors: refused before any copy, in strict and non-strict mode."""
    src, dst = _tiny(1), _tiny(2)
    before = _snapshot(dst)
    bad = dict(src.state_dict())
    bad["blocks.1.ffn.0.weight"] = bad["blocks.1.ffn.0.weight"][:-1]
    with pytest.raises(ValueError, match=r"1 shape mismatches: blocks\.1\.ffn\.0\.weight: checkpoint") as err:
        load_checkpoint(dst, bad, strict=strict)
    assert "unchanged" in str(err.value)
    _assert_same(dst, before)


def test_checkpoint_loader_missing_and_unexpected_keys_leave_the_model_untouched():
    src, dst = _tiny(1), _tiny(2)
    before = _snapshot(dst)
    missing = dict(src.state_dict())
    missing.pop("head.head.weight")
    with pytest.raises(ValueError, match=r"1 missing keys: head\.head\.weight"):
        load_checkpoint(dst, missing)
    _assert_same(dst, before)
    extra = {**src.state_dict(), **{f"extra.{i}": torch.zeros(1) for i in range(7)}}
    extra.pop("patch_embedding.weight")
    extra["head.head.bias"] = torch.zeros(3)
    with pytest.raises(ValueError) as err:
        load_checkpoint(dst, extra)
    msg = str(err.value)
    assert "1 shape mismatches" in msg and "1 missing keys: patch_embedding.weight" in msg
    assert "7 unexpected keys" in msg and "(2 more)" in msg  # the first few and the count
    _assert_same(dst, before)
    with pytest.raises(RuntimeError):  # what load_state_dict raised before: callers catching it still do
        load_checkpoint(dst, missing)
    # strict=False: missing and unexpected keys are allowed, the rest loads
    result = load_checkpoint(dst, {k: v for k, v in extra.items() if k != "head.head.bias"}, strict=False)
    assert sorted(result.missing_keys) == ["head.head.bias", "patch_embedding.weight"]
    assert len(result.unexpected_keys) == 7
    assert torch.equal(dst.state_dict()["head.head.weight"], src.state_dict()["head.head.weight"])
    assert torch.equal(dst.state_dict()["head.head.bias"], before["head.head.bias"])


@pytest.mark.parametrize("name", ["tiny", "tiny-sf"])
def test_checkpoint_loader_round_trips_the_modules_own_state_dict(name, tmp_path):
    src, dst = _tiny(1, name), _tiny(2, name)
    torch.save(src.state_dict(), tmp_path / "own.pt")
    result = load_checkpoint(dst, tmp_path / "own.pt")
    assert not result.missing_keys and not result.unexpected_keys
    _assert_same(dst, _snapshot(src))
    load_checkpoint(dst, _tiny(3, name).state_dict())  # and from a dict, in memory
    _assert_same(dst, _snapshot(_tiny(3, name)))
