"""fp8 GEMMs without the dynamic-scale tax: static scales (variant `fp8-static`, notebook 05).

torchao's dynamic path (variant `fp8`) finds each activation's scale at run time, a reduction over the activation
before every GEMM; at mg2-universal those reductions cost about what the fp8 GEMMs save. Here the scales are fixed
before the run: each weight quantized once per output channel (its row's absolute maximum maps to e4m3's largest
value, 448), each linear's input with one scale per tensor, calibrated once: the largest absolute input the linear
saw over a calibration generation of the pipeline as it stands (the stack below this variant), divided by 448. At run
time the input is scaled, clamped and cast (a pointwise step a compiler fuses into the kernel that produced the
input) and multiplied by `torch._scaled_mm` with the scales in its epilogue, bias included.

An input beyond its calibrated range saturates at +-448 instead of overflowing: the gate against the reference says
whether the calibration run covered the inputs that matter.
"""

from __future__ import annotations

import torch
from torch import nn

FP8 = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8).max)  # 448


class StaticFP8Linear(nn.Module):
    """A linear layer whose GEMM runs in e4m3 with static scales: the weight per output channel (quantized here,
    once), the input per tensor (`input_amax`: the calibration run's largest absolute input)."""

    def __init__(self, linear: nn.Linear, input_amax: float):
        super().__init__()
        if input_amax <= 0 or input_amax != input_amax:
            raise ValueError(f"input_amax={input_amax!r} is not allowed; allowed values: a finite number > 0 (the "
                             "calibration run's largest absolute input of this linear)")
        w = linear.weight.detach().float()
        w_scale = w.abs().amax(dim=1, keepdim=True).clamp_min(1e-12) / FP8_MAX  # [out, 1]
        self.register_buffer("weight_fp8", (w / w_scale).clamp(-FP8_MAX, FP8_MAX).to(FP8))  # [out, in], row-major
        self.register_buffer("weight_scale", w_scale.t().contiguous())  # [1, out]: one scale per output channel
        self.out_dtype = linear.weight.dtype
        # the inverse in the input's dtype (the linear's): the scaling before the cast is one multiply, no cast of the
        # scale; the GEMM's scale is its exact inverse in fp32, so the rounding of the first does not bias the product
        inv = torch.tensor(FP8_MAX / input_amax, dtype=self.out_dtype,
                           device=w.device)
        self.register_buffer("input_inv_scale", inv)
        self.register_buffer("input_scale", 1.0 / inv.float())
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().clone(), requires_grad=False)
        self.in_features, self.out_features = linear.in_features, linear.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features)
        # cuBLASLt takes the input row-major only: a strided input (a view of a permuted tensor) keeps its layout
        # through the pointwise steps
        xq = (x2 * self.input_inv_scale).clamp(-FP8_MAX, FP8_MAX).to(FP8).contiguous()
        # row-wise scaling wants one input scale per row: the per-tensor scale repeated (M floats)
        sa = self.input_scale.reshape(1, 1).repeat(x2.shape[0], 1)
        y = torch._scaled_mm(xq, self.weight_fp8.t(), scale_a=sa, scale_b=self.weight_scale,
                             bias=self.bias, out_dtype=self.out_dtype)
        return y.reshape(*lead, self.out_features)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"input_scale={float(self.input_scale):.4g} (static), weight scales per output channel")


def eligible_linears(model: nn.Module, min_features: int) -> list[tuple[str, nn.Linear]]:
    """bf16 linears of at least `min_features` inputs and outputs, both multiples of 16 (what fp8 GEMMs take); not
    those a fused module multiplies by itself (`reads_linear_weights`: its kernel reads their bf16 weights)."""
    own = {id(c) for m in model.modules() if getattr(m, "reads_linear_weights", False) for c in m.children()}
    return [(n, m) for n, m in model.named_modules()
            if isinstance(m, nn.Linear) and id(m) not in own and m.weight.dtype == torch.bfloat16
            and m.in_features >= min_features
            and m.out_features >= min_features and m.in_features % 16 == 0 and m.out_features % 16 == 0]


@torch.no_grad()
def calibrate(linears: list[tuple[str, nn.Linear]], run) -> dict[str, float]:
    """The largest absolute input each linear sees while `run()` runs (forward hooks, removed after; the maxima stay
    on the device until the run has ended: one read then, not a host sync per call)."""
    amax: dict[str, torch.Tensor] = {}

    def hook(name):
        def record(_m, args):
            v = args[0].detach().abs().amax().float()
            amax[name] = v if name not in amax else torch.maximum(amax[name], v)
        return record

    handles = [m.register_forward_pre_hook(hook(n)) for n, m in linears]
    try:
        run()
    finally:
        for h in handles:
            h.remove()
    return {n: float(v) for n, v in amax.items()}


def quantize_static(model: nn.Module, amax: dict[str, float], linears: list[tuple[str, nn.Linear]]) -> int:
    """Each calibrated linear replaced by its StaticFP8Linear (a linear the calibration never reached stays bf16);
    returns how many were replaced."""
    n = 0
    for name, lin in linears:
        if amax.get(name, 0.0) <= 0:
            continue
        parent_name, _, attr = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, attr, StaticFP8Linear(lin, amax[name]))
        n += 1
    return n
