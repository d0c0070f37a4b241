"""Roofline of a region: achieved TFLOP/s and GB/s per category against the measured device ceilings, with the
FLOPs and bytes estimated from the shapes the trace recorded (record_shapes=True)."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pandas as pd

from ..trace import Trace
from .region import Region, select, work

_DTYPE_BYTES = {
    "float": 4, "c10::BFloat16": 2, "c10::Half": 2, "double": 8, "long int": 8, "int": 4, "short int": 2,
    "bool": 1, "unsigned char": 1, "signed char": 1, "c10::Float8_e4m3fn": 1, "c10::Float8_e5m2": 1,
    "c10::complex<float>": 8, "c10::complex<double>": 16,
}  # fmt: skip
_GEMM_FLOP_OPS = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::_addmm_activation",
                  "aten::addbmm", "aten::_scaled_mm"}
_ATTN_FLOP_OPS = {"aten::scaled_dot_product_attention", "flex_attention"}
_CONV_FLOP_OPS = {"aten::convolution"}


def _prod(xs) -> int:
    out = 1
    for x in xs:
        out *= int(x)
    return out


def _parse_list(s):
    if isinstance(s, list):
        return s
    try:
        v = json.loads(s)
        return v if isinstance(v, list) else [v]
    except (TypeError, ValueError):
        return None


def op_flops(name: str, dims: list, concrete: list | None = None) -> float | None:
    """Dense FLOPs (multiply-add = 2) of one aten op from its recorded input dims; None if unknown."""
    try:
        if name in ("aten::mm", "aten::_scaled_mm"):
            (m, k), (_, n) = dims[0], dims[1]
            return 2.0 * m * k * n
        if name in ("aten::addmm", "aten::_addmm_activation"):
            (m, k), (_, n) = dims[1], dims[2]
            return 2.0 * m * k * n
        if name == "aten::bmm":
            (b, m, k), (_, _, n) = dims[0], dims[1]
            return 2.0 * b * m * k * n
        if name in ("aten::baddbmm", "aten::addbmm"):
            (b, m, k), (_, _, n) = dims[1], dims[2]
            return 2.0 * b * m * k * n
        if name == "aten::scaled_dot_product_attention":  # q [.., H, Lq, D], k [.., H, Lk, D], v [.., Lk, Dv]
            q, k, v = dims[0], dims[1], dims[2]
            batch = _prod(q[:-2])
            return 2.0 * batch * q[-2] * k[-2] * q[-1] + 2.0 * batch * q[-2] * k[-2] * v[-1]
        if name == "aten::convolution":
            x, w = dims[0], dims[1]
            c = concrete or []
            stride = _parse_list(c[3]) if len(c) > 3 else None
            padding = _parse_list(c[4]) if len(c) > 4 else None
            dilation = _parse_list(c[5]) if len(c) > 5 else None
            transposed = len(c) > 6 and str(c[6]).lower() == "true"
            groups = int(c[8]) if len(c) > 8 and str(c[8]).lstrip("-").isdigit() else 1
            nsp = len(w) - 2
            ks = w[2:]
            if transposed:  # weight [C_in, C_out/g, k...]: every input element meets C_out/g * prod(k) weights
                return 2.0 * x[0] * _prod(x[2:]) * x[1] * w[1] * _prod(ks)
            stride = stride or [1] * nsp
            padding = padding or [0] * nsp
            dilation = dilation or [1] * nsp
            out_sp = [
                (x[2 + i] + 2 * padding[i] - dilation[i] * (ks[i] - 1) - 1) // stride[i] + 1 for i in range(nsp)
            ]
            return 2.0 * x[0] * w[0] * _prod(out_sp) * (x[1] // max(groups, 1)) * _prod(ks)
    except (IndexError, TypeError, ValueError, ZeroDivisionError):
        return None
    return None


def op_bytes(dims: list, types: list, name: str = "") -> float | None:
    """Estimated bytes moved by a memory-bound op from its recorded inputs (an estimate, never a measurement).

    Copies and in-place ops (`copy_`, `mul_`, ...) read their inputs and write into one of them: the
    input bytes plus the first input once more (written) for in-place ops, the input bytes alone for
    copy_ (dst written, src read). Reductions read their inputs and write little: input bytes.
    Other ops: input bytes plus one output the size of the largest input (broadcasts move less).
    """
    sizes = []
    for d, t in zip(dims or [], types or []):
        if isinstance(d, list) and d and t in _DTYPE_BYTES:
            sizes.append(_prod(d) * _DTYPE_BYTES[t])
    if not sizes:
        return None
    if name == "aten::copy_" or _REDUCTION_OPS.match(name or ""):
        return float(sum(sizes))
    if name.endswith("_"):
        return float(sum(sizes) + sizes[0])
    return float(sum(sizes) + max(sizes))


_REDUCTION_OPS = re.compile(r"^aten::(sum|mean|amax|amin|max|min|var|std|var_mean|norm|linalg_vector_norm|"
                            r"cumsum|argmax|argmin|prod|any|all|logsumexp)$")


ROOFLINE_COLUMNS = ["category", "gflop", "ms", "covered_ms", "tflops", "ceiling_tflops", "frac_of_ceiling",
                    "gb", "gbps", "ceiling_gbps", "intensity_flop_per_byte"]


def roofline(trace, region: str | Region | None = None, ceilings: dict | None = None) -> pd.DataFrame:
    """Per category of the region: ms, the ms covered by ops of known FLOPs/bytes, gflop/gb, achieved tflops/gbps,
    the ceiling (ceilings: wmbook.device.measure_ceilings keys gemm_tflops, sdpa_tflops, copy_gbps; None leaves
    them empty), frac_of_ceiling and arithmetic intensity. attrs["note"] says when no shapes were recorded."""
    trace = Trace.load(trace)
    reg = region if isinstance(region, Region) else select(trace, region)
    frame = work(trace, reg)
    cols = ROOFLINE_COLUMNS
    if not len(frame):
        return pd.DataFrame(columns=cols)
    O = trace.ops
    names = O["name"].tolist()
    parent = O["parent"].to_numpy(np.int64)
    dims, types, conc = O["input_dims"].tolist(), O["input_types"].tolist(), O["concrete_inputs"].tolist()
    durs = frame["duration_us"].to_numpy(float)

    def flop_op(i, wanted):
        while i >= 0:
            if names[i] in wanted:
                return i
            i = parent[i]
        return -1

    gemm_ceil = (ceilings or {}).get("gemm_tflops")
    attn_ceil = (ceilings or {}).get("sdpa_tflops") or gemm_ceil
    copy_ceil = (ceilings or {}).get("copy_gbps")
    op_col = frame["op"].to_numpy(np.int64)
    cat_col = frame["category"].to_numpy(object)
    rows = []
    for cat, wanted, ceil in (("GEMM/linear", _GEMM_FLOP_OPS, gemm_ceil), ("attention", _ATTN_FLOP_OPS, attn_ceil),
                              ("convolution", _CONV_FLOP_OPS, gemm_ceil)):
        m = cat_col == cat
        if not m.any():
            continue
        ms = float(frame.loc[m, "duration_us"].sum()) / 1e3
        seen: dict = {}
        covered = 0.0
        for oi, d in zip(op_col[m], durs[m]):
            fo = flop_op(int(oi), wanted) if oi >= 0 else -1
            if fo < 0:
                continue
            if fo not in seen:
                seen[fo] = op_flops(names[fo], dims[fo], conc[fo]) if dims[fo] else None
            if seen[fo] is not None:
                covered += d / 1e3
        flops = sum(v for v in seen.values() if v)
        tf = flops / (covered * 1e-3) / 1e12 if covered > 0 and flops > 0 else float("nan")
        rows.append({"category": cat, "gflop": flops / 1e9 if flops else float("nan"), "ms": ms,
                     "covered_ms": covered, "tflops": tf, "ceiling_tflops": ceil if ceil else float("nan"),
                     "frac_of_ceiling": tf / ceil if ceil and not math.isnan(tf) else float("nan"),
                     "gb": float("nan"), "gbps": float("nan"), "ceiling_gbps": copy_ceil or float("nan"),
                     "intensity_flop_per_byte": float("nan")})
    for cat in ("normalization", "elementwise/activation", "copy/cast", "reduction"):
        m = cat_col == cat
        if not m.any():
            continue
        ms = float(frame.loc[m, "duration_us"].sum()) / 1e3
        seen = {}
        covered = 0.0
        for oi, d in zip(op_col[m], durs[m]):
            if oi < 0:
                continue
            if oi not in seen:
                seen[oi] = op_bytes(dims[oi], types[oi], names[oi])
            if seen[oi] is not None:
                covered += d / 1e3
        nbytes = sum(v for v in seen.values() if v)
        gbps = nbytes / (covered * 1e-3) / 1e9 if covered > 0 and nbytes > 0 else float("nan")
        rows.append({"category": cat, "gflop": float("nan"), "ms": ms, "covered_ms": covered, "tflops": float("nan"),
                     "ceiling_tflops": float("nan"),
                     "frac_of_ceiling": gbps / copy_ceil if copy_ceil and not math.isnan(gbps) else float("nan"),
                     "gb": nbytes / 1e9 if nbytes else float("nan"), "gbps": gbps,
                     "ceiling_gbps": copy_ceil or float("nan"), "intensity_flop_per_byte": float("nan")})
    out = pd.DataFrame(rows, columns=cols)
    out.attrs["note"] = ("" if trace.record_shapes or any(d for d in dims[:1000] if d) else
                         "trace recorded without record_shapes: FLOP and byte columns are empty")
    # GEMM/attention/conv intensity needs bytes too: inputs + output of the FLOP ops
    wanted_of = {"GEMM/linear": _GEMM_FLOP_OPS, "attention": _ATTN_FLOP_OPS, "convolution": _CONV_FLOP_OPS}
    for idx, r in out.iterrows():
        if r["category"] in wanted_of and not math.isnan(r["gflop"]):
            m = cat_col == r["category"]
            fops = {flop_op(int(oi), wanted_of[r["category"]]) for oi in op_col[m] if oi >= 0} - {-1}
            nbytes = sum(op_bytes(dims[o], types[o], names[o]) or 0 for o in fops)
            if nbytes:
                out.at[idx, "gb"] = nbytes / 1e9
                out.at[idx, "intensity_flop_per_byte"] = r["gflop"] * 1e9 / nbytes
                out.at[idx, "gbps"] = nbytes / (r["covered_ms"] * 1e-3) / 1e9 if r["covered_ms"] > 0 else float("nan")
    for idx, r in out.iterrows():
        if math.isnan(r["intensity_flop_per_byte"]) and not math.isnan(r["gb"]) and r["gb"] > 0:
            # memory-bound categories: about one FLOP per element, intensity well under 1
            out.at[idx, "intensity_flop_per_byte"] = 0.25
    return out


def category_account(category_ms: dict, flops: dict | None = None, ceilings: dict | None = None) -> pd.DataFrame:
    """Where one call's GPU time goes, with the rate of its matrix work: per kernel category (`category_ms`, e.g. a
    ladder row's categories), its ms and share, and where the call's FLOPs of that category are known (`flops`:
    {category: FLOPs}, Workload.flops_by_category) the TFLOP/s its kernels reach and that rate over the measured bf16
    GEMM ceiling (`ceilings["gemm_tflops"]`; attention and convolutions run on the same tensor cores). A profile of a
    replayed CUDA graph names its kernels but not their operators, so the FLOPs come from the model, not the trace.
    Longest first; empty without positive times."""
    ms = {c: float(v) for c, v in (category_ms or {}).items() if v == v and v > 0}
    total = sum(ms.values())
    gemm = (ceilings or {}).get("gemm_tflops")
    rows = []
    for c, t in sorted(ms.items(), key=lambda kv: -kv[1]):
        fl = (flops or {}).get(c)
        tf = fl / (t * 1e-3) / 1e12 if fl else math.nan
        rows.append({"category": c, "ms": t, "share": t / total, "tflops": tf,
                     "frac_of_gemm_ceiling": tf / gemm if gemm and tf == tf else math.nan})
    return pd.DataFrame(rows, columns=["category", "ms", "share", "tflops", "frac_of_gemm_ceiling"]).set_index(
        "category")


def account_sentence(what: str, acc: pd.DataFrame) -> str:
    """category_account in words: '`what` spends its 20.5 ms of GPU time: GEMM/linear 10.8 ms (53%) at 686 TFLOP/s,
    87% of the measured GEMM ceiling; ...'; '' for an empty account."""
    if acc is None or not len(acc):
        return ""
    parts = []
    for c, r in acc.iterrows():
        s = f"{c} {r['ms']:.3g} ms ({r['share']:.0%})"
        if r["tflops"] == r["tflops"]:
            s += f" at {r['tflops']:.0f} TFLOP/s" + (f", {r['frac_of_gemm_ceiling']:.0%} of the measured GEMM ceiling"
                                                     if r["frac_of_gemm_ceiling"] == r["frac_of_gemm_ceiling"] else "")
        parts.append(s)
    rated = acc["tflops"].notna()
    rest = float(acc.loc[~rated, "ms"].sum())
    tail = (f" The kernels without matrix work take {rest:.3g} ms of it." if rated.any() and rest > 0 else "")
    return f"{what} spends its {acc['ms'].sum():.3g} ms of GPU time: " + "; ".join(parts) + "." + tail
