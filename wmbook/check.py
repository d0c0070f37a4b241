"""Correctness gate: compare an output against the reference with per-dtype tolerances."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

# dtype -> (max_rel, mean_rel), both relative to ref_scale = max(|ref|)
TOLERANCES: dict[str, tuple[float, float]] = {
    "fp32": (1e-4, 1e-5),
    "tf32": (5e-3, 5e-4),
    "bf16": (1e-2, 1e-3),
    "fp16": (5e-3, 5e-4),
}

_TORCH_DTYPES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


class CorrectnessError(AssertionError):
    """An output did not match its reference within tolerance."""


@dataclass
class CheckResult:
    """Differences of one output against its reference, and whether they pass."""

    max_abs: float
    mean_abs: float
    rel_l2: float
    ref_scale: float
    max_rel: float
    mean_rel: float
    psnr: float | None
    nan_count: int
    numel: int
    dtype: str
    tol_max_rel: float
    tol_mean_rel: float
    passed: bool

    def summary(self) -> dict:
        """Fields as a flat dict (for results rows and tables)."""
        return dict(self.__dict__)

    def __str__(self) -> str:
        verdict = "PASS" if self.passed else "FAIL"
        s = (
            f"{verdict} [{self.dtype}] max_rel {self.max_rel:.3g} (tol {self.tol_max_rel:g}), "
            f"mean_rel {self.mean_rel:.3g} (tol {self.tol_mean_rel:g}), "
            f"max_abs {self.max_abs:.3g}, mean_abs {self.mean_abs:.3g}, "
            f"rel_l2 {self.rel_l2:.3g}, ref_scale {self.ref_scale:.3g}"
        )
        if self.psnr is not None:
            s += f", psnr {self.psnr:.2f} dB"
        if self.nan_count:
            s += f", {self.nan_count} non-finite values"
        return s


def _dtype_key(dtype) -> str:
    if isinstance(dtype, torch.dtype):
        if dtype in _TORCH_DTYPES:
            return _TORCH_DTYPES[dtype]
    elif isinstance(dtype, str) and dtype in TOLERANCES:
        return dtype
    raise ValueError(f"dtype must be one of {sorted(TOLERANCES)} (or a matching torch.dtype), got {dtype!r}")


def _flat(x, name: str) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        return x.detach().reshape(-1)
    if isinstance(x, (list, tuple)) and x and all(isinstance(t, torch.Tensor) for t in x):
        dev = x[0].device
        return torch.cat([t.detach().reshape(-1).to(dev) for t in x])
    raise ValueError(f"{name} must be a tensor or a non-empty list/tuple of tensors, got {type(x).__name__}")


def _rel(num: float, scale: float) -> float:
    if scale > 0:
        return num / scale
    return 0.0 if num == 0 else math.inf


def compare(
    out,
    ref,
    *,
    dtype="fp32",
    frames: bool = False,
    data_range: float = 2.0,
    max_rel: float | None = None,
    mean_rel: float | None = None,
) -> CheckResult:
    """Compare out to ref; relative errors use ref_scale = max(|ref|) over all elements.

    max_rel = max|out-ref| / ref_scale, mean_rel = mean|out-ref| / ref_scale,
    rel_l2 = ||out-ref||_2 / ||ref||_2. Computed in float64 on out's device.
    frames=True adds PSNR with `data_range` (2.0 for frames in [-1, 1], 255 for uint8-range).
    max_rel/mean_rel override the per-dtype tolerances. Any NaN/inf in out or ref fails.
    """
    key = _dtype_key(dtype)
    tol_max, tol_mean = TOLERANCES[key]
    tol_max = tol_max if max_rel is None else float(max_rel)
    tol_mean = tol_mean if mean_rel is None else float(mean_rel)
    if data_range <= 0:
        raise ValueError(f"data_range must be > 0, got {data_range!r}")

    o = _flat(out, "out")
    r = _flat(ref, "ref")
    if o.numel() != r.numel():
        raise ValueError(
            f"out and ref must have the same number of elements, got {o.numel()} and {r.numel()}"
        )
    if o.numel() == 0:
        raise ValueError("out and ref must not be empty")
    dev = o.device if o.device.type in ("cpu", "cuda") else torch.device("cpu")  # float64 support
    o = o.to(dev).double()
    r = r.to(dev).double()

    nan_count = int((~torch.isfinite(o)).sum().item() + (~torch.isfinite(r)).sum().item())
    diff = (o - r).abs()
    max_abs = float(diff.max().item())
    mean_abs = float(diff.mean().item())
    ref_scale = float(r.abs().max().item())
    rel_l2 = _rel(float(torch.linalg.vector_norm(o - r).item()), float(torch.linalg.vector_norm(r).item()))
    psnr = None
    if frames:
        mse = float((diff * diff).mean().item())
        psnr = math.inf if mse == 0 else 10.0 * math.log10(data_range**2 / mse)

    m_rel = _rel(max_abs, ref_scale)
    a_rel = _rel(mean_abs, ref_scale)
    passed = nan_count == 0 and m_rel <= tol_max and a_rel <= tol_mean  # NaN compares False
    return CheckResult(
        max_abs=max_abs,
        mean_abs=mean_abs,
        rel_l2=rel_l2,
        ref_scale=ref_scale,
        max_rel=m_rel,
        mean_rel=a_rel,
        psnr=psnr,
        nan_count=nan_count,
        numel=int(o.numel()),
        dtype=key,
        tol_max_rel=tol_max,
        tol_mean_rel=tol_mean,
        passed=bool(passed),
    )


def gate(out, ref, *, dtype="fp32", what: str = "output", **kwargs) -> CheckResult:
    """compare(), raising CorrectnessError naming `what` when the result does not pass."""
    res = compare(out, ref, dtype=dtype, **kwargs)
    if not res.passed:
        raise CorrectnessError(f"{what} does not match the reference: {res}")
    return res
