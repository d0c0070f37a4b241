"""The short-sequence self-attention kernel (the video UNet's temporal attention) against SDPA in fp32, on a GPU or
in the Triton interpreter on a CPU, and its custom op."""

from __future__ import annotations

import pytest

triton = pytest.importorskip("triton")  # on a CPU, TRITON_INTERPRET=1 (conftest): kernels run in the interpreter

import torch  # noqa: E402

from wmbook.kernels import short_attention as sa  # noqa: E402

DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # a GPU where there is one, else the interpreter
TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.bfloat16: dict(rtol=2e-2, atol=2e-2),
       torch.float16: dict(rtol=5e-3, atol=5e-3)}


def _qkv(shape, dtype, seed, strided=False):
    g = torch.Generator().manual_seed(seed)
    if strided:  # q, k, v as views of one [B, L, 3, H, D] projection: B, L and H strides of their own
        b, length, h, d = shape
        return (torch.randn(b, length, 3, h, d, generator=g) * 2).to(DEV, dtype).unbind(2)
    return tuple((torch.randn(shape, generator=g) * 2).to(DEV, dtype) for _ in range(3))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape,problems,strided", [
    ((9, 16, 5, 64), 4, False),  # the UNet's temporal attention (16 frames, 5 heads of 64), 9 positions: a partial
                                 # last program
    ((3, 13, 2, 40), 8, False),  # 13 frames, head dim 40: both blocks part-filled; fewer sequences than problems
    ((2, 1, 1, 16), 1, False),  # one frame: softmax over one key
    ((4, 33, 3, 24), 2, True),  # longer than a 32 block, strided views of one projection
    ((1, 128, 1, 32), 1, False),  # the longest it takes
])
def test_short_attention_matches_sdpa(poisoned, dtype, shape, problems, strided):
    q, k, v = _qkv(shape, dtype, seed=shape[1], strided=strided)
    out = sa.short_attention(q, k, v, problems=problems)
    assert out.shape == q.shape and out.dtype == dtype and out.is_contiguous()
    want = sa.short_attention_ref(q.float(), k.float(), v.float())
    torch.testing.assert_close(out.float(), want, **TOL[dtype])


def test_short_attention_op_falls_back_and_bad_input():
    q, k, v = _qkv((3, 16, 2, 32), torch.float32, seed=0)
    torch.library.opcheck(sa.short_attention_op, (q, k, v))
    torch.testing.assert_close(sa.short_attention_op(q, k, v), sa.short_attention_ref(q, k, v), **TOL[torch.float32])
    long = _qkv((1, 130, 1, 16), torch.float32, seed=1)  # too long for the kernel: the op runs SDPA
    assert not sa.supported(*long)
    torch.testing.assert_close(sa.short_attention_op(*long), sa.short_attention_ref(*long), **TOL[torch.float32])
    assert not sa.supported(q, k, v, mask=torch.ones(16, 16, dtype=torch.bool, device=DEV))
    assert not sa.supported(q, k[:, :8], v)
    with pytest.raises(ValueError, match="takes L <= 128"):
        sa.short_attention(*long)
    with pytest.raises(ValueError, match="one shape and dtype"):
        sa.short_attention(q, k[:, :8], v)
    with pytest.raises(ValueError, match="q has dtype"):
        sa.short_attention(q.double(), k, v)
    with pytest.raises(ValueError, match="must be"):
        sa.short_attention(q[0], k[0], v[0])
    with pytest.raises(ValueError, match="problems=0 is not allowed"):
        sa.short_attention(q, k, v, problems=0)
    assert sa.short_attention_bytes(q, k, v) == 4 * q.numel() * 4
