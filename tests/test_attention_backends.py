"""Attention backend switch, FlexAttention masks, shape recording and the backend table (CPU, tiny shapes)."""

import importlib.util
import math

import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import create_mask

from wmbook.models import attention as attn
from wmbook.models.attention import (
    ATTENTION_BACKENDS,
    AttentionBackendError,
    attention,
    attention_backend,
    block_causal_block_mask,
    block_causal_frame_mask,
    block_mask_from_dense,
    get_attention_backend,
    set_attention_backend,
)
from wmbook.variants.attention import (
    attention_backend_table,
    auto_kernel,
    backend_scores,
    best_backend,
    classify_attention_kernel,
    flex_vs_dense_mask,
    record_attention_shapes,
)

pytestmark = pytest.mark.numerics  # rerun with oneDNN and ATen held to older ISAs: `make test-isa`

HAS_CUDA = torch.cuda.is_available()
HAS_FLASH_ATTN = importlib.util.find_spec("flash_attn") is not None


@pytest.fixture(autouse=True, scope="module")
def _one_thread(one_thread):
    """Every test of this module on one thread (tests/conftest.py)."""


@pytest.fixture(autouse=True)
def _reset_backend():
    set_attention_backend("auto")
    yield
    set_attention_backend("auto")


def _qkv(b=2, lq=40, lk=56, h=3, d=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(b, lq, h, d, generator=g), torch.randn(b, lk, h, d, generator=g),
            torch.randn(b, lk, h, d, generator=g))


def _key_mask(b, lk):
    """[B, 1, 1, Lk] like the WMA action mask: sample i sees the first 8 + 4 i keys (never none)."""
    return (torch.arange(lk)[None, :] < (8 + 4 * torch.arange(b))[:, None])[:, None, None, :]


def _frame_mask(frames, fpb, window, s):
    return block_causal_frame_mask(frames, fpb, window).repeat_interleave(s, 0).repeat_interleave(s, 1)


def _sdpa(q, k, v, mask=None):
    return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                          attn_mask=mask).transpose(1, 2)


# --- batches over the CUDA grid limit --------------------------------------------------------------------------


@pytest.mark.parametrize("mask_kind", ["none", "per_sample", "frames"])
@pytest.mark.parametrize("backend", ["auto", "math"])
def test_batch_over_the_grid_limit_is_split_and_equal(monkeypatch, mask_kind, backend):
    """A batch above MAX_SDPA_BATCH runs as several calls (a per-sample mask split with it, a shared mask not) and
    gives exactly the one-call result; the real limit is 65535 (see the CUDA test below)."""
    q, k, v = _qkv(b=7, lq=12, lk=12)
    mask = {"none": None, "per_sample": _key_mask(7, 12),
            "frames": _frame_mask(4, 2, -1, 3)}[mask_kind]
    want = _sdpa(q, k, v, mask)
    calls = []
    set_attention_backend(backend)
    if backend == "auto":
        real = F.scaled_dot_product_attention
        monkeypatch.setattr(attn.F, "scaled_dot_product_attention",
                            lambda *a, **kw: calls.append(a[0].shape[0]) or real(*a, **kw))
    monkeypatch.setattr(attn, "MAX_SDPA_BATCH", 3)
    got = attention(q, k, v, mask)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    if backend == "auto":
        assert calls == [3, 3, 1]


@pytest.mark.skipif(not HAS_CUDA, reason="the 65535-block grid limit is a CUDA one")
def test_batch_of_65536_sequences_runs_on_cuda():
    """world-wma's temporal attention at training batch 256 (256 x 16 x 16 sequences) failed with 'invalid argument'
    on the H100 before the split."""
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    q, k, v = (torch.randn(65536 + 5, 8, 2, 32, device=dev, dtype=torch.bfloat16, generator=g) for _ in range(3))
    out = attention(q, k, v)
    torch.testing.assert_close(out[-5:], _sdpa(q[-5:], k[-5:], v[-5:]), rtol=0, atol=0)
    torch.testing.assert_close(out[:4], _sdpa(q[:4], k[:4], v[:4]), rtol=2e-2, atol=2e-2)


# --- the switch ---------------------------------------------------------------------------------------------


def test_switch_and_context_restore():
    assert get_attention_backend() == "auto" and attn._RUN is None  # auto: the plain call, no dispatch
    set_attention_backend("math")
    assert get_attention_backend() == "math"
    with attention_backend("flex"):
        assert get_attention_backend() == "flex"
        with attention_backend("auto"):
            assert get_attention_backend() == "auto" and attn._RUN is None
        assert get_attention_backend() == "flex"
    assert get_attention_backend() == "math"
    with pytest.raises(KeyError), attention_backend("flex"):
        raise KeyError("inside")
    assert get_attention_backend() == "math"


def test_unknown_name_lists_allowed_and_changes_nothing():
    set_attention_backend("math")
    with pytest.raises(ValueError) as e:
        set_attention_backend("xformers")
    for name in ATTENTION_BACKENDS:
        assert name in str(e.value)
    with pytest.raises(ValueError), attention_backend("sdpa"):
        pass
    assert get_attention_backend() == "math"


@pytest.mark.parametrize("mask", ["none", "frame", "key"])
def test_auto_is_bit_identical_to_sdpa(mask):
    q, k, v = _qkv(lq=48, lk=48)
    m = {"none": None, "frame": _frame_mask(4, 2, -1, 12), "key": _key_mask(2, 48)}[mask]
    assert torch.equal(attention(q, k, v, m), _sdpa(q, k, v, m))


@pytest.mark.parametrize("mask", ["none", "frame", "key"])
@pytest.mark.parametrize("backend", ["math", "flash", "flex"])
def test_cpu_backends_match_auto(backend, mask):
    q, k, v = _qkv(lq=48, lk=48)
    m = {"none": None, "frame": _frame_mask(4, 2, 2, 12), "key": _key_mask(2, 48)}[mask]
    ref = attention(q, k, v, m)
    with attention_backend(backend):
        out = attention(q, k, v, m)
    assert out.shape == ref.shape
    torch.testing.assert_close(out, ref, atol=2e-6, rtol=1e-5)


# --- FlexAttention ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("window", [6, -1])
def test_frame_arithmetic_block_mask_equals_dense_mask(window):
    frames, fpb, s = 9, 3, 32  # 288 tokens: 3 x 3 tiles of 128, some skipped
    dense = _frame_mask(frames, fpb, window, s)
    bm = block_causal_block_mask(frames, fpb, window, s, device="cpu")
    assert torch.equal(create_mask(bm.mask_mod, 1, 1, frames * s, frames * s, device="cpu")[0, 0], dense)
    computed = int(bm.kv_num_blocks.sum()) + int(bm.full_kv_num_blocks.sum())
    assert computed < 9  # query tile 0 (frames 0-3) never needs key tile 2 (frames 8-9)
    assert block_causal_block_mask(frames, fpb, window, s, device="cpu") is bm  # cached by arguments


def test_frame_block_mask_with_more_key_frames():
    dense = block_causal_frame_mask(3, 3, 6, num_key_frames=6).repeat_interleave(5, 0).repeat_interleave(5, 1)
    bm = block_causal_block_mask(3, 3, 6, 5, device="cpu", num_key_frames=6)
    assert torch.equal(create_mask(bm.mask_mod, 1, 1, 15, 30, device="cpu")[0, 0], dense)


def test_flex_equals_sdpa_with_block_causal_mask():
    frames, fpb, window, s = 9, 3, 6, 32
    q, k, v = _qkv(b=1, lq=frames * s, lk=frames * s, h=2)
    dense = _frame_mask(frames, fpb, window, s)
    ref = _sdpa(q, k, v, dense)
    with attention_backend("flex"):
        from_dense = attention(q, k, v, dense)
        from_frames = attention(q, k, v, block_causal_block_mask(frames, fpb, window, s, device="cpu"))
    torch.testing.assert_close(from_dense, ref, atol=2e-6, rtol=1e-5)
    torch.testing.assert_close(from_frames, ref, atol=2e-6, rtol=1e-5)


def test_flex_equals_sdpa_with_key_mask():
    q, k, v = _qkv(b=3, lq=20, lk=24)
    m = _key_mask(3, 24)
    with attention_backend("flex"):
        out = attention(q, k, v, m)
    torch.testing.assert_close(out, _sdpa(q, k, v, m), atol=2e-6, rtol=1e-5)
    # and the BlockMask really reads the per-sample rows
    bm = block_mask_from_dense(m, q_len=20)
    assert torch.equal(create_mask(bm.mask_mod, 3, 1, 20, 24, device="cpu"), m.expand(3, 1, 20, 24))


def test_block_masks_are_cached_by_mask_identity():
    m = _frame_mask(4, 2, -1, 8)
    a = attn._cached_block_mask(m, 32, 32)
    assert attn._cached_block_mask(m, 32, 32) is a
    assert attn._cached_block_mask(m.clone(), 32, 32) is not a
    m[0, -1] = True  # changed in place: rebuilt
    assert attn._cached_block_mask(m, 32, 32) is not a


def test_block_mask_from_dense_rejects_bad_masks():
    with pytest.raises(TypeError, match="bool"):
        block_mask_from_dense(torch.zeros(4, 4))
    with pytest.raises(ValueError, match="broadcast"):
        block_mask_from_dense(torch.ones(3, 4, dtype=torch.bool), q_len=5)


# --- backends that cannot run here --------------------------------------------------------------------------


@pytest.mark.skipif(HAS_FLASH_ATTN, reason="flash-attn is installed here")
def test_flash_attn_absent_is_a_clear_error():
    with pytest.raises(AttentionBackendError, match="flash-attn"):
        set_attention_backend("flash_attn")
    assert get_attention_backend() == "auto"


def test_flash_attn_takes_bld_layout_and_refuses_masks(monkeypatch):
    seen = []

    def fake_flash_attn_func(q, k, v):
        seen.append(q.shape)
        return _sdpa(q, k, v)

    monkeypatch.setattr(attn, "_flash_attn_func", lambda: fake_flash_attn_func)
    q, k, v = _qkv()
    with attention_backend("flash_attn"):
        torch.testing.assert_close(attention(q, k, v), _sdpa(q, k, v))
        with pytest.raises(AttentionBackendError, match="no attention mask.*q \\[2, 40, 3, 16\\]"):
            attention(q, k, v, _key_mask(2, 56))
    assert seen == [q.shape]  # [B, L, H, D] passed through untransposed


@pytest.mark.skipif(HAS_CUDA, reason="checks the CPU-only message")
def test_sage_without_cuda_is_a_clear_error():
    with pytest.raises(AttentionBackendError, match="'sage' needs a CUDA device"):
        set_attention_backend("sage")
    assert get_attention_backend() == "auto"


def test_sage_gets_nhd_and_a_smoothed_copy_of_k_and_leaves_masks_to_sdpa(monkeypatch):
    """SageAttention gets [B, L, H, D] ('NHD') and K minus its mean over the keys, computed out of place (sageattn's
    own smooth_k would subtract it inside the KV cache k is a view of); masked calls and other head dims run SDPA,
    counted."""
    seen = []

    def fake_sageattn(q, k, v, tensor_layout, is_causal, smooth_k):
        seen.append((tensor_layout, is_causal, smooth_k, k.mean(dim=1).abs().max().item()))
        return _sdpa(q, k, v)

    monkeypatch.setattr(attn, "_sage_func", lambda: fake_sageattn)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, n, 2, 64, generator=g) for n in (40, 128, 128))
    k = k + 3.0  # a large mean: what the smoothing removes
    k_before = k.clone()
    attn.reset_sage_call_counts()
    with attention_backend("sage"):
        torch.testing.assert_close(attention(q, k, v), _sdpa(q, k, v), rtol=1e-4, atol=1e-4)  # softmax invariant
        torch.testing.assert_close(attention(q, k, v, _key_mask(2, 128)), _sdpa(q, k, v, _key_mask(2, 128)))
        q16, k16, v16 = _qkv()
        attention(q16, k16, v16)
        # 56 keys: a partial 64-key block, which sageattention 1.0.6 scores wrongly (SAGE_KV_BLOCK)
        torch.testing.assert_close(attention(q, k[:, :56], v[:, :56]), _sdpa(q, k[:, :56], v[:, :56]))
    assert torch.equal(k, k_before)  # the caller's k (a cache) untouched
    assert [s[:3] for s in seen] == [("NHD", False, False)] and seen[0][3] < 1e-5
    assert attn.sage_call_counts() == {"sage": 1, "sdpa (mask)": 1, "sdpa (head_dim 16)": 1, "sdpa (kv_len 56 % 64)": 1}


@pytest.mark.skipif(not HAS_CUDA or importlib.util.find_spec("sageattention") is None,
                    reason="SageAttention needs a CUDA GPU and the sageattention package")
@pytest.mark.parametrize("lk", [128, 2640, 5280])  # 2640 / 5280: mg2-universal's 3 / 6 frames of 880 tokens
def test_real_sage_is_close_to_sdpa_at_every_key_length(lk):
    """The real kernel through the backend: whole 64-key blocks go to SageAttention (int8 Q/K: within a few percent),
    partial ones to SDPA (exact), so no key length gets sageattention 1.0.6's zero-padded-key error."""
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    q = torch.randn(1, 256, 4, 64, device=dev, generator=g, dtype=torch.bfloat16)
    k, v = (torch.randn(1, lk, 4, 64, device=dev, generator=g, dtype=torch.bfloat16) for _ in range(2))
    want = _sdpa(q.float(), k.float(), v.float())
    attn.reset_sage_call_counts()
    with attention_backend("sage"):
        got = attention(q, k, v).float()
    assert attn.sage_call_counts() == ({"sage": 1} if lk % 64 == 0 else {f"sdpa (kv_len {lk} % 64)": 1})
    assert ((got - want).norm() / want.norm()).item() < 0.05


@pytest.mark.skipif(HAS_CUDA, reason="checks the CPU-only message")
@pytest.mark.parametrize("name", ["efficient", "cudnn"])
def test_cuda_only_backends_refused_up_front_on_cpu(name):
    with pytest.raises(AttentionBackendError, match="needs CUDA"):
        set_attention_backend(name)


def test_call_time_error_names_backend_and_shape():
    q, k, _ = _qkv()
    v = torch.randn(2, 56, 3, 8)  # SDPA flash needs equal q/k/v head dims
    with attention_backend("flash"), pytest.warns(UserWarning):
        with pytest.raises(AttentionBackendError, match=r"'flash' cannot run q \[2, 40, 3, 16\].*v \[2, 56, 3, 8\]"):
            attention(q, k, v)


# --- recording and the backend table ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_pipe():
    from wmbook.pipelines.causal import CausalStreamingPipeline

    pipe = CausalStreamingPipeline("tiny", device="cpu", dtype="fp32")
    return pipe, pipe.prepare(2)


def test_record_attention_shapes_of_the_tiny_dit(tiny_pipe):
    pipe, inputs = tiny_pipe
    p = pipe.preset
    with record_attention_shapes(pipe.model) as rec:
        pipe.generate(inputs, progress=False)
    assert attn._RUN is None  # recording removed its observer
    df = rec.table()
    assert rec.forwards == 2 * p.forwards_per_block
    s, f = p.frame_seqlen, p.num_frame_per_block
    a = p.action
    ha, da = a.heads_num, a.mouse_hidden_dim // a.heads_num

    self_rows = df[df["site"].str.contains("CausalWanSelfAttention")]
    cross_rows = df[df["site"].str.contains("WanCrossAttention")]
    action_rows = df[df["site"].str.contains("ActionModule")]
    # self-attention: one block of queries against the cached window (1 block, then 2 blocks)
    assert set(self_rows["q_shape"]) == {(1, f * s, p.num_heads, p.head_dim)}
    assert set(self_rows["kv_len"]) == {f * s, 2 * f * s}
    assert self_rows["calls_per_forward"].sum() == p.num_layers
    assert set(cross_rows["k_shape"]) == {(1, p.clip_tokens, p.num_heads, p.head_dim)}
    assert cross_rows["calls_per_forward"].sum() == p.num_layers
    # mouse (temporal self-attention per location) and keyboard (to per-frame tokens): two call sites
    assert action_rows["site"].nunique() == 2
    assert set(action_rows["q_shape"]) == {(s, f, ha, da)}
    assert set(action_rows["kv_len"]) == {f, 2 * f}
    for _, rows in action_rows.groupby("site"):
        assert rows["calls_per_forward"].sum() == len(a.blocks)
    assert (df["mask_kind"] == "none").all()  # the cached streaming path passes no masks
    r = df.iloc[0]
    assert r["gflop_per_call"] == pytest.approx(2 * r["batch"] * r["heads"] * r["q_len"] * r["kv_len"] * 2
                                                * r["head_dim"] / 1e9)
    assert df["flop_share"].sum() == pytest.approx(1.0)
    assert df["gflop_per_forward"].is_monotonic_decreasing


def _full_sequence_forward(pipe):
    """One full-sequence DiT forward (no caches: block-causal masks) over 2 blocks; returns (run, frames)."""
    p = pipe.preset
    f = 2 * p.num_frame_per_block
    h, w = p.latent_hw
    g = torch.Generator().manual_seed(0)
    x, cond = torch.randn(1, 16, f, h, w, generator=g), torch.randn(1, 20, f, h, w, generator=g)
    ctx = torch.randn(1, p.clip_tokens, p.clip_dim, generator=g)
    n = 1 + 4 * (f - 1)
    acts = {"mouse": torch.randn(1, n, 2, generator=g), "keyboard": torch.randn(1, n, 4, generator=g)}
    with torch.no_grad():
        return (lambda: pipe.model(x, torch.full((1, f), 500.0), ctx, cond_concat=cond, actions=acts)), f


def _full_sequence_shapes(pipe):
    run, f = _full_sequence_forward(pipe)
    with record_attention_shapes(forwards=1) as rec, torch.no_grad():
        run()
    return rec.table(), f


@pytest.mark.parametrize("backend", ["math", "flash", "flex"])
def test_full_sequence_dit_forward_under_each_cpu_backend(tiny_pipe, backend):
    """Dense [L, L] and [F, F] block-causal masks through the real model: every CPU backend matches auto."""
    run, _ = _full_sequence_forward(tiny_pipe[0])
    with torch.no_grad():
        ref = run()
        with attention_backend(backend):
            out = run()
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-4)


def test_record_full_sequence_forward_sees_block_causal_masks(tiny_pipe):
    pipe, _ = tiny_pipe
    p = pipe.preset
    df, f = _full_sequence_shapes(pipe)
    L = f * p.frame_seqlen
    self_rows = df[df["site"].str.contains("CausalWanSelfAttention")]
    assert list(self_rows["mask_kind"]) == ["dense"] and self_rows.iloc[0]["mask_shape"] == (L, L)
    fm = block_causal_frame_mask(f, p.num_frame_per_block, p.kv_capacity_frames())
    assert self_rows.iloc[0]["mask_density"] == pytest.approx(fm.float().mean().item())
    assert set(df[df["site"].str.contains("ActionModule")]["mask_shape"]) == {(f, f)}
    assert repr(self_rows.iloc[0]["mask"]) == f"bool[{L}, {L}]"


def test_backend_table_on_cpu(tiny_pipe):
    pipe, _ = tiny_pipe
    shapes, _ = _full_sequence_shapes(pipe)
    backends = ["auto", "math", "flash", "flex", "efficient", "flash_attn"]
    t = attention_backend_table(shapes, backends=backends, warmup=0, repeats=2, top=3)
    assert len(t) == 3 * len(backends) and set(t["shape_id"]) == {0, 1, 2}
    assert t.iloc[0]["site"] == shapes.iloc[0]["site"]
    ran = t[t["backend"].isin(["auto", "math", "flash", "flex"])]
    assert (ran["status"] == "ok").all() and ran["within_tol"].all()
    assert (ran["max_rel"] < 1e-4).all()
    assert (ran["tflop_s"] - ran["gflop_per_call"] / ran["ms_median"]).abs().max() < 1e-12
    assert (ran["ms_p20"] <= ran["ms_median"]).all() and (ran["ms_median"] <= ran["ms_p80"]).all()
    refused = t[t["backend"].isin(["efficient", "flash_attn"])]
    if not HAS_CUDA:
        assert (refused["status"] == "unsupported").all() and refused["reason"].str.len().gt(0).all()
    assert set(t["auto_kernel"]) <= {"flash", "math", "efficient", "cudnn"}  # never "unknown: ..."
    assert get_attention_backend() == "auto"
    assert best_backend(t) in {"auto", "math", "flash", "flex"}


def test_best_backend_weights_by_flop_share_and_needs_tolerance():
    def rows(backend, ms, ok=(True, True), status=("ok", "ok")):
        return [{"shape_id": i, "backend": backend, "status": status[i], "ms_median": ms[i], "within_tol": ok[i],
                 "flop_share": (0.9, 0.1)[i], "calls_per_forward": 1.0, "reason": ""} for i in range(2)]

    t = pd.DataFrame(rows("a", (1.0, 4.0)) + rows("b", (2.0, 1.0))  # a: fast on the big shape
                     + rows("c", (0.5, 0.5), ok=(False, True), status=("out of tolerance", "ok"))
                     + rows("d", (0.1, math.nan), status=("ok", "unsupported")))
    scores = backend_scores(t).set_index("backend")
    # relative to the fastest eligible backend per shape (a on shape 0, b on shape 1): a 0.9 * 1 + 0.1 * 4,
    # b 0.9 * 2 + 0.1 * 1; c is faster everywhere but out of tolerance, d cannot run shape 1
    assert scores.loc["a", "relative_time"] == pytest.approx(1.3)
    assert scores.loc["b", "relative_time"] == pytest.approx(1.9)
    assert list(scores.index[:2]) == ["a", "b"] and math.isnan(scores.loc["d", "relative_time"])
    assert not scores.loc["c", "eligible"] and not scores.loc["d", "eligible"]
    assert best_backend(t) == "a"
    with pytest.raises(ValueError, match="no backend"):
        best_backend(t[t["backend"].isin(["c", "d"])])


@pytest.mark.parametrize("name,cls", [
    ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4>>", "flash"),
    ("fmha_cutlassF_bf16_aligned_64x128_rf_sm80(PyTorchMemEffAttention::AttentionKernel)", "efficient"),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x128_4x1x1", "cudnn"),
    ("aten::_scaled_dot_product_attention_math", "math"),
    ("aten::_scaled_dot_product_flash_attention_for_cpu", "flash"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", None),
])
def test_classify_attention_kernel(name, cls):
    assert classify_attention_kernel(name) == cls


def test_auto_kernel_on_cpu_is_named():
    cls, name = auto_kernel(*_qkv())
    assert cls in ("flash", "math") and name.startswith("aten::_scaled_dot_product")


def test_flex_vs_dense_mask_tiny():
    t = flex_vs_dense_mask(device="cpu", warmup=0, repeats=2).set_index("method")
    assert (t["status"] == "ok").all()
    assert t["mask_density"].iloc[0] == pytest.approx((3 + 6 + 6) * 3 / 81)  # 9 frames, blocks of 3, window 6
    flex = t.loc[["flex + BlockMask (frame arithmetic)", "flex + BlockMask (from dense mask)"]]
    assert (flex["max_rel"] < 1e-5).all() and (flex["block_density"] < 1).all()
    assert t.loc["sdpa + dense mask", "max_rel"] < 1e-5
    assert t.loc["sdpa + dense mask", "kernel"] in ("flash", "math")


def test_sage_table_counts_calls_by_kernel(monkeypatch):
    """Notebook 05's table under the ladder: how attn-sage's calls ran (SageAttention, or SDPA and why)."""
    from wmbook.studies.kernels import sage_table

    monkeypatch.setattr(attn, "_sage_func", lambda: lambda q, k, v, tensor_layout, is_causal, smooth_k: _sdpa(q, k, v))
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, n, 2, 64, generator=g) for n in (8, 128, 128))
    attn.reset_sage_call_counts()
    with attention_backend("sage"):
        attention(q, k, v)
        attention(q, k[:, :56], v[:, :56])
        attention(q, k[:, :56], v[:, :56])
    t = sage_table()
    assert t.to_dict("index") == {"sdpa (kv_len 56 % 64)": {"calls": 2, "share": 2 / 3},
                                  "sage": {"calls": 1, "share": 1 / 3}}


def test_sage_inside_a_compiled_region_neither_recompiles_nor_breaks_the_graph(monkeypatch):
    """attn-sage's call counter inside torch.compile: one graph, no recompile and no graph break (dynamo once guarded
    on the counter's value and recompiled each call until its limit, then ran the block eager: 219 ms a forward
    against 59 ms at mg2-universal on the H100); compiled calls are not counted, eager ones are, by route."""
    from torch._dynamo.utils import counters

    monkeypatch.setattr(attn, "_sage_func", lambda: lambda q, k, v, tensor_layout, is_causal, smooth_k: _sdpa(q, k, v))
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, n, 2, 64, generator=g) for n in (8, 56, 56))  # 56 keys: the SDPA route

    def block(q, k, v):
        return attention(q, k, v) * 2

    torch._dynamo.reset()
    counters.clear()
    fn = torch.compile(block, backend="aot_eager", fullgraph=True)  # fullgraph: a graph break would raise
    attn.reset_sage_call_counts()
    with attention_backend("sage"):
        for _ in range(5):
            torch.testing.assert_close(fn(q, k, v), _sdpa(q, k, v) * 2)
        assert attn.sage_call_counts() == {}
        block(q, k, v)
    assert attn.sage_call_counts() == {"sdpa (kv_len 56 % 64)": 1}
    assert dict(counters["stats"]).get("unique_graphs") == 1 and not counters["recompiles"]
    assert attn.sage_route(64, 128) == "sage" and attn.sage_route(64, 128, masked=True) == "sdpa (mask)"
    assert attn.sage_route(16, 128) == "sdpa (head_dim 16)" and attn.sage_route(128, 2640) == "sdpa (kv_len 2640 % 64)"
    torch._dynamo.reset()


def test_dispatcher_warnings_of_a_backend_that_cannot_run_go_into_the_reason(monkeypatch):
    """A backend forced onto a shape it cannot run: PyTorch's SDPA dispatcher warns why, then raises. The why goes into
    the table's reason, not into the notebook's output; any other warning still reaches the caller."""
    import warnings

    from wmbook.variants import attention as va

    def refuse(q, k, v, mask=None):
        where = "(Triggered internally at /pytorch/aten/src/ATen/native/transformers/cuda/sdp_utils.cpp:{}.)"
        warnings.warn("Flash attention kernel not used because: " + where.format(988), UserWarning)
        warnings.warn("Flash Attention does not support non-null attn_mask. " + where.format(262), UserWarning)
        warnings.warn("cuDNN attention has been runtime disabled. " + where.format(706), UserWarning)
        warnings.warn("Flash Attention does not support non-null attn_mask. " + where.format(262), UserWarning)
        warnings.warn("a warning of our own", UserWarning)
        raise RuntimeError("No available kernel. Aborting execution.")

    monkeypatch.setattr(va.attn, "attention", refuse)
    q = torch.randn(1, 8, 2, 16)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        row = va._measure("math", q, q, q, None, q, "fp32", 1.0, 0, 1, torch.device("cpu"))
    assert row["status"] == "unsupported"
    assert row["reason"] == ("RuntimeError: No available kernel. Aborting execution. "
                             "(Flash Attention does not support non-null attn_mask.)")
    assert [str(w.message) for w in seen] == ["a warning of our own"]
