"""The action modules' per-head RMSNorm + frame-index RoPE kernel against the model's own functions in fp32, on a GPU
or in the Triton interpreter on a CPU, its op, and the action-norm-rope variant end to end."""

from __future__ import annotations

import pytest

triton = pytest.importorskip("triton")  # on a CPU, TRITON_INTERPRET=1 (conftest): kernels run in the interpreter

import torch  # noqa: E402

from wmbook import workloads  # noqa: E402
from wmbook.kernels import head_norm_rope as hn  # noqa: E402
from wmbook.models.action import HeadRMSNorm, apply_time_rope, time_rope_tables  # noqa: E402
from wmbook.variants.ladder import apply_stack  # noqa: E402
from wmbook.workloads import E2ESize  # noqa: E402

DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # a GPU where there is one, else the interpreter
TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.bfloat16: dict(rtol=2e-2, atol=2e-2)}


def _q(n, f, h, d, dtype, seed):
    """q as the mouse branch has it: a strided view of a [N, F, 3, H, D] q/k/v projection."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, f, 3, h, d, generator=g) * 3).to(DEV, dtype)[:, :, 0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n,f,h,d,rope_dims,rows", [
    (5, 3, 4, 64, 16, 16),  # mg2's action heads (D 64, the first 16 channels rotated); rows past the last one
    (2, 6, 2, 8, 8, 4),  # every channel rotated
    (3, 1, 3, 32, 4, 1),  # one frame, one row a program
])
def test_head_norm_rope_matches_the_model(poisoned, dtype, n, f, h, d, rope_dims, rows):
    x = _q(n, f, h, d, dtype, seed=d)
    cos, sin = time_rope_tables(2, f, rope_dims, 256.0, DEV)  # [1, F, 1, R]
    out = hn.head_norm_rope(x, cos.reshape(f, -1), sin.reshape(f, -1), 1e-6, rows=rows)
    assert out.shape == x.shape and out.dtype == dtype and out.is_contiguous()
    want = hn.head_norm_rope_ref(x.float(), cos.reshape(f, -1), sin.reshape(f, -1), 1e-6)
    torch.testing.assert_close(out.float(), want, **TOL[dtype])
    # the reference is the model's norm then rotation, in fp32
    model = apply_time_rope(HeadRMSNorm(d).to(DEV)(x.float()), cos, sin)
    torch.testing.assert_close(want, model, **TOL[torch.float32])


def test_head_norm_rope_op_and_bad_input():
    x = _q(2, 3, 2, 16, torch.float32, seed=0)
    cos, sin = (t.reshape(3, -1) for t in time_rope_tables(0, 3, 8, 256.0, DEV))
    torch.library.opcheck(hn.head_norm_rope_op, (x, cos, sin, 1e-6))
    torch.testing.assert_close(hn.head_norm_rope_op(x, cos, sin, 1e-6), hn.head_norm_rope_ref(x, cos, sin),
                               **TOL[torch.float32])
    with pytest.raises(ValueError, match="must be \\[N, F, H, D\\]"):
        hn.head_norm_rope(x[0], cos, sin)
    with pytest.raises(ValueError, match="cos must be \\[F, R\\]"):
        hn.head_norm_rope(x, cos[:2], sin)
    with pytest.raises(ValueError, match="sin has dtype"):
        hn.head_norm_rope(x, cos, sin.double())
    with pytest.raises(ValueError, match="rows=3 is not allowed"):
        hn.head_norm_rope(x, cos, sin, rows=3)
    assert hn.head_norm_rope_bytes(x, cos, sin) == 2 * x.numel() * 4 + 2 * cos.numel() * 4


def test_action_norm_rope_variant_equals_the_model(monkeypatch):
    """The variant's stream equals the model's over blocks whose window fills and rolls (fp32: one function), and its
    kernel really runs (poisoned, the stream fails)."""
    wl = workloads.get("mg2")
    ref = wl.reference_pipeline(wl.presets[wl.tiny_preset], DEV)
    size = E2ESize(blocks=3, ddim_steps=3)
    base, _ = apply_stack(ref, wl, ["action-attn-fused"], DEV)
    fused, ctx = apply_stack(ref, wl, ["action-attn-fused", "action-norm-rope"], DEV)
    assert "1 action modules" in ctx.notes["action-norm-rope"]
    a, b = wl.end_to_end(base, 0, size).latents, wl.end_to_end(fused, 0, size).latents
    assert ((a - b).norm() / a.norm()).item() < 1e-5
    monkeypatch.setattr(hn, "head_norm_rope", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("kernel called")))
    with pytest.raises(RuntimeError, match="kernel called"):
        wl.end_to_end(fused, 0, size)
    with pytest.raises(Exception, match="action-norm-rope"):
        apply_stack(ref, workloads.get("wma"), ["action-norm-rope"], DEV)
