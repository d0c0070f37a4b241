"""The block attention kernel (the causal DiT's queries over its cached window of keys) against SDPA in fp32, on a GPU
or in the Triton interpreter on a CPU; its op, the `triton` attention backend and the `attn-triton` variant."""

from __future__ import annotations

import pytest

triton = pytest.importorskip("triton")  # on a CPU, TRITON_INTERPRET=1 (conftest): kernels run in the interpreter

import torch  # noqa: E402

from wmbook.kernels import block_attention as ba  # noqa: E402

DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # a GPU where there is one, else the interpreter
# the output rounded once to the dtype (bf16: 2^-8 relative), P.V with P in the dtype on a GPU, sums of a few dozen
# keys: a few units of the dtype's rounding, relative to outputs of order 1
TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.bfloat16: dict(rtol=2e-2, atol=2e-2),
       torch.float16: dict(rtol=5e-3, atol=5e-3)}


def _qkv(b, lq, lk, h, d, dtype, seed, strided=False):
    g = torch.Generator().manual_seed(seed)
    if strided:  # [B, H, L, D] tensors seen as [B, L, H, D]: L and H strides of their own, D contiguous
        return tuple((torch.randn(b, h, n, d, generator=g) * 2).to(DEV, dtype).transpose(1, 2) for n in (lq, lk, lk))
    return tuple((torch.randn(b, n, h, d, generator=g) * 2).to(DEV, dtype) for n in (lq, lk, lk))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("b,lq,lk,h,d,strided", [
    (1, 24, 48, 2, 16, False),  # a block of 3 frames of 8 tokens over a window of 6 frames: whole key tiles
    (2, 20, 37, 3, 32, False),  # a partial last key tile and a partial query tile
    (1, 8, 5, 1, 64, False),  # fewer keys than one tile
    (1, 17, 40, 2, 40, True),  # head dim 40 (padded to 64), strided views
    (1, 33, 33, 1, 16, False),  # the first block: as many keys as queries
])
def test_block_attention_matches_sdpa(poisoned, dtype, b, lq, lk, h, d, strided):
    q, k, v = _qkv(b, lq, lk, h, d, dtype, seed=lq + lk, strided=strided)
    out = ba.block_attention(q, k, v)
    assert out.shape == q.shape and out.dtype == dtype and out.is_contiguous()
    want = ba.block_attention_ref(q.float(), k.float(), v.float())
    torch.testing.assert_close(out.float(), want, **TOL[dtype])


def test_block_attention_tiles_are_a_choice_not_a_result():
    q, k, v = _qkv(1, 40, 70, 2, 32, torch.float32, seed=3)
    want = ba.block_attention_ref(q, k, v)
    for bm, bn in ((16, 16), (32, 64), (64, 32)):
        torch.testing.assert_close(ba.block_attention(q, k, v, block_m=bm, block_n=bn), want, **TOL[torch.float32])
    with pytest.raises(ValueError, match="block_n=48 is not allowed"):
        ba.block_attention(q, k, v, block_n=48)


def test_block_attention_op_falls_back_and_bad_input():
    q, k, v = _qkv(2, 16, 24, 2, 32, torch.float32, seed=0)
    torch.library.opcheck(ba.block_attention_op, (q, k, v))
    torch.testing.assert_close(ba.block_attention_op(q, k, v), ba.block_attention_ref(q, k, v), **TOL[torch.float32])
    assert not ba.supported(q, k, v, mask=torch.ones(16, 24, dtype=torch.bool, device=DEV))
    assert not ba.supported(q, k[..., :16], v[..., :16])
    big = _qkv(1, 4, 4, 1, 272, torch.float32, seed=1)  # a head dim past the kernel's: the op runs SDPA
    assert not ba.supported(*big)
    torch.testing.assert_close(ba.block_attention_op(*big), ba.block_attention_ref(*big), **TOL[torch.float32])
    with pytest.raises(ValueError, match="takes D <= 256"):
        ba.block_attention(*big)
    with pytest.raises(ValueError, match="k and v must be"):
        ba.block_attention(q, k[:, :, :1], v)
    with pytest.raises(ValueError, match="q has dtype"):
        ba.block_attention(q.double(), k, v)
    with pytest.raises(ValueError, match="must be"):
        ba.block_attention(q[0], k[0], v[0])
    assert ba.block_attention_flops(q, k) == 4 * 2 * 2 * 16 * 24 * 32
    assert ba.block_attention_bytes(q, k, v) == (2 * q.numel() + 2 * k.numel()) * 4


def test_triton_backend_routes_masked_calls_to_sdpa():
    from wmbook.models import attention as attn

    q, k, v = _qkv(1, 12, 20, 2, 16, torch.float32, seed=4)
    mask = torch.rand(12, 20, generator=torch.Generator().manual_seed(0)).to(DEV) > 0.3
    mask[:, 0] = True
    with attn.attention_backend("triton"):
        attn.reset_triton_call_counts()
        got, got_masked = attn.attention(q, k, v), attn.attention(q, k, v, mask=mask)
        assert attn.triton_call_counts() == {"triton": 1, "sdpa (mask)": 1}
    with attn.attention_backend("math"):
        want, want_masked = attn.attention(q, k, v), attn.attention(q, k, v, mask=mask)
    torch.testing.assert_close(got, want, **TOL[torch.float32])
    torch.testing.assert_close(got_masked, want_masked, **TOL[torch.float32])
    assert attn.get_attention_backend() == "auto"


def test_attn_triton_variant_on_the_tiny_dit():
    """attn-triton on the tiny causal DiT in bf16: every self-attention call of a forward through the KV cache runs
    the kernel, and the forward stays within bf16's rounding of the SDPA model's."""
    from wmbook import workloads
    from wmbook.models import attention as attn
    from wmbook.variants import GlobalFlags
    from wmbook.variants.ladder import apply_stack

    wl = workloads.get("mg2")
    pipe = wl.reference_pipeline(wl.presets["tiny"], DEV)
    flags = GlobalFlags()  # the attention backend is process-wide: back to SDPA afterwards
    try:
        base, _ = apply_stack(pipe, wl, ["bf16"], DEV)
        a = wl.forward_probe(base).forward()
        tri, ctx = apply_stack(pipe, wl, ["bf16", "attn-triton"], DEV)
        assert attn.get_attention_backend() == "triton" and "attn-triton" in ctx.notes
        b = wl.forward_probe(tri).forward()
        counts = attn.triton_call_counts()
        assert counts.get("triton", 0) > 0, counts
    finally:
        flags.restore()
    a, b = (torch.cat([t.float().flatten() for t in (x if isinstance(x, (tuple, list)) else [x])]) for x in (a, b))
    assert ((a - b).norm() / a.norm()).item() < 2e-2  # bf16 roundings (2^-8) of a two-layer model's activations


def test_triton_backend_traces_into_one_graph():
    """Under torch.compile the backend's routing and the kernel's op stay in the graph (no break per attention
    call)."""
    from wmbook.models import attention as attn

    q, k, v = _qkv(1, 12, 20, 2, 16, torch.float32, seed=5)
    with attn.attention_backend("triton"):
        torch._dynamo.reset()
        got = torch.compile(lambda q, k, v: attn.attention(q, k, v), backend="eager", fullgraph=True)(q, k, v)
    torch.testing.assert_close(got, ba.block_attention_ref(q, k, v), **TOL[torch.float32])
    torch._dynamo.reset()


def test_block_attention_op_is_opaque_to_compile():
    """The op is a custom_op even where the other kernels are triton_ops: AOTAutograd's graph (what inductor lowers)
    keeps the op as one call, so inductor never copies the kernel into its own code (it did not compile there)."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._library.custom_ops import CustomOpDef
    from torch._subclasses.functional_tensor import FunctionalTensorMode

    assert isinstance(ba.block_attention_op, CustomOpDef)
    # a triton_op decomposes under functionalization (how inductor takes its kernel in), on any device: this one not
    assert FunctionalTensorMode not in ba.block_attention_op._torch_dispatch_fns
    targets = []

    def record(gm, _inputs):
        targets.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm.forward

    q, k, v = _qkv(1, 12, 20, 2, 16, torch.float32, seed=6)
    torch._dynamo.reset()
    try:
        got = torch.compile(ba.block_attention_op, backend=aot_autograd(fw_compiler=record), fullgraph=True)(q, k, v)
    finally:
        torch._dynamo.reset()
    assert "wmbook.block_attention.default" in targets, targets
    assert not any("triton_kernel_wrapper" in t for t in targets), targets
    torch.testing.assert_close(got, ba.block_attention_ref(q, k, v), **TOL[torch.float32])
