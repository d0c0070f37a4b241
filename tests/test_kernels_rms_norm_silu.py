"""Wan VAE RMS norm + SiLU kernel against diffusers' WanRMS_norm (on a GPU, or the Triton interpreter on a
CPU), and its custom op."""

from __future__ import annotations

import pytest

triton = pytest.importorskip("triton")  # on a CPU, TRITON_INTERPRET=1 (conftest): kernels run in the interpreter

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from wmbook.kernels import rms_norm_silu as rns  # noqa: E402

DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # a GPU where there is one, else the interpreter
TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.bfloat16: dict(rtol=2e-2, atol=2e-2)}
FORMAT = {4: torch.channels_last, 5: torch.channels_last_3d}


def _norm(c, images, bias, dtype, seed):
    """diffusers' WanRMS_norm with random gamma (and bias), in dtype."""
    wan = pytest.importorskip("diffusers.models.autoencoders.autoencoder_kl_wan")
    g = torch.Generator().manual_seed(seed)
    norm = wan.WanRMS_norm(c, images=images, bias=bias)
    with torch.no_grad():
        norm.gamma.copy_(torch.randn(norm.gamma.shape, generator=g))
        if bias:
            norm.bias.copy_(torch.randn(norm.bias.shape, generator=g))
    return norm.to(DEV, dtype)


def _x(shape, dtype, channels_last, seed):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(shape, generator=g) * 3 + 1).to(DEV, dtype)
    return x.contiguous(memory_format=FORMAT[x.dim()]) if channels_last else x




@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("shape,bias", [
    ((2, 96, 3, 5, 7), False),  # 105 positions: no power of two
    ((1, 40, 2, 3, 5), True),  # 40 channels: the block of 64 part-filled
    ((1, 24, 1, 1, 1), False),  # a single position
    ((1, 384, 2, 3, 11), False),  # the decoder's widest: several positions a program, channels-first 16
    ((2, 33, 5, 6), True),  # a 4-D image batch (images=True: gamma [C, 1, 1])
])
def test_rms_norm_silu_matches_diffusers(poisoned, dtype, channels_last, shape, bias):
    norm = _norm(shape[1], len(shape) == 4, bias, dtype, seed=shape[1])
    x = _x(shape, dtype, channels_last, seed=len(shape) + shape[-1])
    out = rns.rms_norm_silu(x, norm.gamma, norm.bias)
    assert out.stride() == x.stride()  # the input's memory format kept
    with torch.no_grad():
        want = F.silu(norm(x))
    torch.testing.assert_close(out, want, **TOL[dtype])
    torch.testing.assert_close(out, rns.rms_norm_silu_ref(x, norm.gamma, norm.bias), **TOL[dtype])


def test_rms_norm_silu_custom_op_and_bad_input():
    norm = _norm(20, False, True, torch.float32, seed=0)
    x = _x((1, 20, 2, 3, 5), torch.float32, False, seed=0)
    torch.library.opcheck(rns.rms_norm_silu_op, (x, norm.gamma.detach(), norm.bias.detach(), 1e-12))
    torch.library.opcheck(rns.rms_norm_silu_op, (x, norm.gamma.detach(), None, 1e-12))
    with torch.no_grad():
        torch.testing.assert_close(rns.rms_norm_silu_op(x, norm.gamma, norm.bias, 1e-12), F.silu(norm(x)),
                                   **TOL[torch.float32])
    with pytest.raises(ValueError, match="gamma must be"):
        rns.rms_norm_silu(x, torch.ones(10, 1, 1, 1, device=DEV))
    with pytest.raises(ValueError, match="bias must be"):
        rns.rms_norm_silu(x, norm.gamma, torch.zeros(21, device=DEV))
    with pytest.raises(ValueError, match="bias must be"):
        rns.rms_norm_silu(x, norm.gamma, 0.5)
    with pytest.raises(ValueError, match="x has dtype"):
        rns.rms_norm_silu(x.long(), norm.gamma)
    with pytest.raises(ValueError, match="gamma has dtype"):
        rns.rms_norm_silu(x, norm.gamma.double())
    with pytest.raises(ValueError, match="x must be"):
        rns.rms_norm_silu(x[:, :, 0, 0, 0], norm.gamma)
    # x in and out, gamma and bias
    assert rns.rms_norm_silu_bytes(x, norm.gamma, norm.bias) == 2 * 600 * 4 + 2 * 20 * 4
    assert rns.rms_norm_silu_bytes(x, norm.gamma, 0.0) == 2 * 600 * 4 + 20 * 4
