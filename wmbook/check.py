"""Correctness gate: compare an output against the reference with per-dtype tolerances."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from .presets import DTYPES, dtype_name

# dtype -> (max_rel, mean_rel), both relative to ref_scale = max(|ref|)
TOLERANCES: dict[str, tuple[float, float]] = {
    "fp32": (1e-4, 1e-5),
    "tf32": (5e-3, 5e-4),
    "bf16": (1e-2, 1e-3),
    "fp16": (5e-3, 5e-4),
    "fp8": (6e-2, 1e-2),  # e4m3 keeps 3 mantissa bits: unit roundoff 2^-4 per scaled element
}


# Relative L2 error a whole denoiser forward may have against the fp32 reference once a precision is in effect.
# TOLERANCES (the seed's max/mean criterion) compare implementations at the same precision; a precision change
# itself moves a deep network's output further: bf16 rounds every activation (unit roundoff 2^-9), and the
# error grows with depth. Per-op reference points (METHOD.md): tf32 ~3e-4, bf16 1e-3..1e-2; budgets allow a
# few times that for 30 layers. Measured on the tiny presets: bf16 1.1e-2 (DiT) and 2.2e-2 (UNet).
PRECISION_BUDGET_REL_L2: dict[str, float] = {
    "fp32": 1e-5,
    "tf32": 5e-3,
    "bf16": 3e-2,
    "fp16": 1e-2,
    "fp8": 1e-1,  # fp8 GEMM inputs with row-wise scales (torchao): a few percent per GEMM, over 30 layers
}


class CorrectnessError(AssertionError):
    """An output did not match its reference within tolerance."""


class NonFiniteError(CorrectnessError):
    """A pipeline output holds NaN or inf."""


def require_finite(outputs: dict, what: str = "pipeline") -> None:
    """Raise NonFiniteError naming every output (dict of tensors, None skipped) that holds NaN or inf.

    One host sync per call: use it on finished outputs, never inside a timed loop.
    """
    bad = []
    for name, t in outputs.items():
        if t is None:
            continue
        n = int((~torch.isfinite(t.detach())).sum().item())
        if n:
            bad.append(f"{name} ({n} of {t.numel()} values, shape {tuple(t.shape)})")
    if bad:
        raise NonFiniteError(f"{what} produced non-finite outputs: {'; '.join(bad)}")


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
        if dtype in DTYPES.values():
            return dtype_name(dtype)
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



def to_uint8_frames(frames):
    """(T, H, W, 3) uint8 numpy frames from a tensor or array: (T, C, H, W) / (C, T, H, W) / (B, ...) float in
    [-1, 1] or [0, 1], or uint8."""
    a = frames.detach().float().cpu().numpy() if hasattr(frames, "detach") else np.asarray(frames)
    while a.ndim > 4 and a.shape[0] == 1:
        a = a[0]
    if a.ndim != 4:
        raise ValueError(f"frames must have 4 dimensions (T, C, H, W) or (T, H, W, C) (a leading batch of 1 allowed), "
                         f"got shape {tuple(a.shape)}")
    if a.shape[-1] not in (1, 3):
        if a.shape[1] in (1, 3):
            a = a.transpose(0, 2, 3, 1)  # T C H W
        elif a.shape[0] in (1, 3):
            a = a.transpose(1, 2, 3, 0)  # C T H W
    if a.dtype != np.uint8:
        lo = a.min() if a.size else 0
        a = (a + 1) / 2 if lo < -0.01 else a
        a = (np.clip(a, 0, 1) * 255 + 0.5).astype(np.uint8)
    if a.shape[-1] == 1:
        a = np.repeat(a, 3, axis=-1)
    return a


def frame_psnr(a, b, peak: float = 255.0):
    """PSNR (dB) of each frame of two equal-shape videos [T, ...] (numpy arrays, e.g. uint8 frames): a float64
    array, inf where a frame is identical."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        raise ValueError(f"shapes differ: {a.shape} vs {b.shape}")
    mse = ((a - b) ** 2).reshape(len(a), -1).mean(axis=1)
    with np.errstate(divide="ignore"):
        return 10 * np.log10(peak**2 / mse)


def gate(out, ref, *, dtype="fp32", what: str = "output", **kwargs) -> CheckResult:
    """compare(), raising CorrectnessError naming `what` when the result does not pass."""
    res = compare(out, ref, dtype=dtype, **kwargs)
    if not res.passed:
        raise CorrectnessError(f"{what} does not match the reference: {res}")
    return res


SAME_PRECISION_MAX_RATIO = 1.10  # an optimization may be at most 10 % less accurate than eager at its precision


@dataclass
class GateResult:
    """The ladder's gate, always against the fp32 reference:

    1. the relative L2 error is within the budget of the loosest precision in effect
       (PRECISION_BUDGET_REL_L2), and
    2. for a row that does not change precision, it is no larger than SAME_PRECISION_MAX_RATIO times the error
       of the eager model at that precision (`anchor_rel_l2`), with PRECISION_BUDGET_REL_L2["fp32"] as the
       smallest allowance: the optimization may not make the result less accurate than eager.

    The seed's max/mean criterion against the eager output at the same precision (`vs_same_precision`) is
    reported beside it, not gated on: measured at mg2-universal on an H100, fusing the norms' casts moved the bf16
    output by max 0.023 / mean 0.0036 from eager bf16 while its error against fp32 stayed 0.0186 (eager: 0.0186);
    at 30 layers two bf16 roundings of one computation differ from each other about as much as each from fp32.
    """

    vs_fp32: CheckResult
    budget_rel_l2: float
    vs_same_precision: CheckResult | None = None
    anchor_rel_l2: float | None = None

    @property
    def allowed_rel_l2(self) -> float:
        if self.anchor_rel_l2 is None:
            return self.budget_rel_l2
        floor = PRECISION_BUDGET_REL_L2["fp32"]
        return min(self.budget_rel_l2, max(self.anchor_rel_l2 * SAME_PRECISION_MAX_RATIO, floor))

    @property
    def passed(self) -> bool:
        return self.vs_fp32.nan_count == 0 and self.vs_fp32.rel_l2 <= self.allowed_rel_l2

    def summary(self) -> dict:
        s = {"rel_l2_vs_fp32": self.vs_fp32.rel_l2, "budget_rel_l2": self.budget_rel_l2,
             "allowed_rel_l2": self.allowed_rel_l2, "max_rel_vs_fp32": self.vs_fp32.max_rel,
             "mean_rel_vs_fp32": self.vs_fp32.mean_rel}
        if self.vs_same_precision is not None:
            s.update(max_rel_same_precision=self.vs_same_precision.max_rel,
                     mean_rel_same_precision=self.vs_same_precision.mean_rel,
                     seed_criterion_same_precision=self.vs_same_precision.passed)
        return s

    def __str__(self) -> str:
        s = (f"{'PASS' if self.passed else 'FAIL'}: rel_l2 {self.vs_fp32.rel_l2:.3g} vs fp32 "
             f"(allowed {self.allowed_rel_l2:.3g}, budget {self.budget_rel_l2:g})")
        if self.vs_same_precision is not None:
            s += f"; against eager at the same precision (information): {self.vs_same_precision}"
        return s


def ladder_gate(out, fp32_ref, *, dtype="fp32", same_precision_ref=None, anchor_rel_l2: float | None = None
                ) -> GateResult:
    """Gate one optimized output against the fp32 reference (see GateResult); `anchor_rel_l2` is the eager
    model's error at the same precision (None for a row that changes precision), `same_precision_ref` its
    output (for the seed's max/mean numbers, reported only)."""
    key = _dtype_key(dtype)
    vs32 = compare(out, fp32_ref, dtype=key)
    same = compare(out, same_precision_ref, dtype=key) if same_precision_ref is not None else None
    if anchor_rel_l2 is not None and (not isinstance(anchor_rel_l2, (int, float)) or anchor_rel_l2 < 0):
        raise ValueError(f"anchor_rel_l2 must be a number >= 0 or None, got {anchor_rel_l2!r}")
    return GateResult(vs_fp32=vs32, budget_rel_l2=PRECISION_BUDGET_REL_L2[key], vs_same_precision=same,
                      anchor_rel_l2=anchor_rel_l2)
