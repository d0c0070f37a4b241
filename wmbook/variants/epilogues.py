"""Feed-forwards with their activation in the first GEMM's epilogue (notebook 05): the causal DiT's GELU
(`ffn-gelu-epilogue`) and the video UNet's GEGLU (`geglu-gemm`).

The reference's FFN is Linear -> GELU(tanh) -> Linear: the up-projection writes its [tokens, ffn_dim] output (bias added
in cuBLAS's epilogue), then a pointwise kernel reads it back and writes the GELU. At mg2-universal that GELU is 30 us a
layer on the H200 (0.96 ms of a 21.9 ms forward, `tools/compare_compile.py --kernels`), a pass over the widest
activation of the block. `torch._addmm_activation(..., use_gelu=True)` asks cuBLASLt for its GELU + bias epilogue
(the tanh approximation, which is what this model uses): the activation is applied in the GEMM before its output is
written. torch.compile keeps the op as the library call it is. On a CPU the op computes the exact (erf) GELU, so there
the module runs the reference's arithmetic instead: the variant changes nothing off a GPU.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..kernels.geglu_linear import geglu_linear_op
from ..models.causal_wan import CausalWanAttentionBlock


class GeluEpilogueFFN(nn.Module):
    """Linear -> GELU(tanh) -> Linear with the GELU in the first GEMM's epilogue on CUDA (the given linears)."""

    def __init__(self, up: nn.Linear, down: nn.Linear):
        super().__init__()
        if up.bias is None:
            raise ValueError("ffn-gelu-epilogue needs the up-projection's bias (cuBLASLt's epilogue is GELU + bias)")
        self.up, self.down = up, down

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        x2 = x.reshape(-1, x.shape[-1])
        if x2.is_cuda:
            h = torch._addmm_activation(self.up.bias, x2, self.up.weight.t(), use_gelu=True)
        else:
            h = F.gelu(F.linear(x2, self.up.weight, self.up.bias), approximate="tanh")
        return F.linear(h, self.down.weight, self.down.bias).reshape(*lead, -1)


def _is_tanh_ffn(ffn) -> bool:
    return (isinstance(ffn, nn.Sequential) and len(ffn) == 3 and isinstance(ffn[0], nn.Linear)
            and isinstance(ffn[1], nn.GELU) and ffn[1].approximate == "tanh" and isinstance(ffn[2], nn.Linear)
            and ffn[0].bias is not None)


def fuse_ffn_gelu(model: nn.Module) -> int:
    """Every causal DiT block's Linear -> GELU(tanh) -> Linear feed-forward as a GeluEpilogueFFN; returns how many."""
    n = 0
    for m in model.modules():
        if isinstance(m, CausalWanAttentionBlock) and _is_tanh_ffn(getattr(m, "ffn", None)):
            m.ffn = GeluEpilogueFFN(m.ffn[0], m.ffn[2])
            n += 1
    return n


class FusedGEGLU(nn.Module):
    """The UNet's GEGLU (value * GELU(gate), both halves of one projection) as `wmbook::geglu_linear`: one GEMM that
    writes only the product (wmbook.kernels.geglu_linear). Keeps the projection as `proj`: the state dict's keys are
    the GEGLU's."""

    reads_linear_weights = True  # its kernel reads the projection's weight: fp8-static leaves that linear alone

    def __init__(self, proj: nn.Linear):
        super().__init__()
        if proj.bias is None or proj.out_features % 2:
            raise ValueError("geglu-gemm needs a GEGLU projection with a bias and an even number of outputs")
        self.proj = proj

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return geglu_linear_op(x, self.proj.weight, self.proj.bias)


def fuse_geglu(model: nn.Module) -> int:
    """Every video UNet feed-forward's GEGLU as a FusedGEGLU; returns how many."""
    from ..models.wma.unet import GEGLU, FeedForward  # noqa: PLC0415  heavy: models.wma (diffusers)

    n = 0
    for m in model.modules():
        if isinstance(m, FeedForward) and isinstance(m.net[0], GEGLU):
            m.net[0] = FusedGEGLU(m.net[0].proj)
            n += 1
    return n


__all__ = ["FusedGEGLU", "GeluEpilogueFFN", "fuse_ffn_gelu", "fuse_geglu"]
