"""q/k RMSNorm + RoPE kernel against its reference (on a GPU, or the Triton interpreter on a CPU), and its custom op."""

from __future__ import annotations

import pytest

triton = pytest.importorskip("triton")  # on a CPU, TRITON_INTERPRET=1 (conftest): kernels run in the interpreter

import torch  # noqa: E402

from wmbook.kernels import qk_norm_rope as qkr  # noqa: E402
from wmbook.models.causal_wan import WanRMSNorm, apply_rope, rope_cos_sin, rope_inv_freqs  # noqa: E402

DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # a GPU where there is one, else the interpreter
TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.bfloat16: dict(rtol=2e-2, atol=2e-2)}




def _inputs(b, grid, heads, d, dtype, start_frame=2):
    """x [B, L, C] (a projection), weight [C] and the model's rotary tables for a (frames, h, w) grid."""
    f, hh, ww = grid
    n, c = f * hh * ww, heads * d
    g = torch.Generator().manual_seed(n + c)
    x = (torch.randn(b, n, c, generator=g) * 2 + 0.5).to(DEV, dtype)
    weight = (1 + 0.3 * torch.randn(c, generator=g)).to(DEV, dtype)
    cos, sin = rope_cos_sin(rope_inv_freqs(d), f, hh, ww, start_frame, "cpu")  # [L, 1, D/2] fp32
    return x, weight, cos.to(DEV), sin.to(DEV)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("b,grid,heads,d", [
    (1, (1, 2, 3), 12, 8),  # C = 96, F = 1
    (2, (3, 1, 3), 10, 10),  # C = 100, D/2 = 5 odd, L = 9
    (1, (1, 1, 1), 6, 16),  # a single token
    (2, (1, 7, 1), 3, 16),  # C = 48, L = 7
    (1, (2, 1, 2), 12, 128),  # the real width: 12 heads x 128
])  # fmt: skip
def test_qk_norm_rope_matches_reference(poisoned, dtype, b, grid, heads, d):
    x, weight, cos, sin = _inputs(b, grid, heads, d, dtype)
    out = qkr.qk_norm_rope(x, weight, cos, sin, heads)
    n = x.shape[1]
    assert out.dtype == dtype and out.shape == (b, n, heads, d) and out.is_contiguous()
    ref = qkr.qk_norm_rope_ref(x, weight, cos, sin, heads)
    torch.testing.assert_close(out, ref, **TOL[dtype])
    # the reference equals the model's own modules: WanRMSNorm (eps 1e-6 like the presets), then apply_rope
    norm = WanRMSNorm(heads * d, eps=1e-6).to(DEV, dtype)
    with torch.no_grad():
        norm.weight.copy_(weight)
        model = apply_rope(norm(x).view(b, n, heads, d), cos, sin)
    torch.testing.assert_close(ref, model, **TOL[dtype])


def test_qk_norm_rope_custom_op_and_bad_input():
    x, weight, cos, sin = _inputs(1, (1, 2, 2), 4, 8, torch.float32)
    torch.library.opcheck(qkr.qk_norm_rope_op, (x, weight, cos, sin, 4, 1e-6))
    torch.testing.assert_close(qkr.qk_norm_rope_op(x, weight, cos, sin, 4, 1e-6),
                               qkr.qk_norm_rope_ref(x, weight, cos, sin, 4), **TOL[torch.float32])
    # [L, D/2] tables work too
    torch.testing.assert_close(qkr.qk_norm_rope(x, weight, cos[:, 0], sin[:, 0], 4),
                               qkr.qk_norm_rope_ref(x, weight, cos, sin, 4), **TOL[torch.float32])
    with pytest.raises(ValueError, match="x must be"):
        qkr.qk_norm_rope(x[0], weight, cos, sin, 4)
    with pytest.raises(ValueError, match="num_heads must divide"):
        qkr.qk_norm_rope(x, weight, cos, sin, 5)
    with pytest.raises(ValueError, match="num_heads must divide"):
        qkr.qk_norm_rope(x, weight, cos, sin, 32)  # head_dim 1: no channel pairs
    with pytest.raises(ValueError, match="weight must be"):
        qkr.qk_norm_rope(x, weight[:16], cos, sin, 4)
    with pytest.raises(ValueError, match="cos must be"):
        qkr.qk_norm_rope(x, weight, cos[:3], sin, 4)
    with pytest.raises(ValueError, match="sin must be"):
        qkr.qk_norm_rope(x, weight, cos, sin[..., :2], 4)
    with pytest.raises(ValueError, match="x has dtype"):
        qkr.qk_norm_rope(x.long(), weight, cos, sin, 4)
    # x in and out, the weight and both tables once
    assert qkr.qk_norm_rope_bytes(x, weight, cos, sin) == 2 * 128 * 4 + 32 * 4 + 2 * 16 * 4
