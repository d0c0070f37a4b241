"""Bottleneck breakdown of a torch.profiler Chrome trace: where the device time of a labelled region goes.

`analyze(trace)` returns a `Breakdown` with, for one region (a label such as `2_Pipeline_Inference`):

- GPU time by operator category (GEMM, attention, convolution, normalization, elementwise, copy/cast,
  reduction, memcpy/memset, other), classified from the kernel name and the aten op that launched it;
- GPU time by label as a tree (self and total) following the label hierarchy;
- the split of one denoiser forward by its fine labels (attention, FFN, norms, ...);
- GPU idle time, kernel-launch statistics, host-device syncs and CPU hotspots;
- a roofline table (achieved TFLOP/s and GB/s against the measured ceilings of the device);
- ranked suggestions, each naming the notebook that addresses it.

Accounting rule: a kernel (or memcpy/memset) belongs to the label that was innermost on the launching
host thread when its launch call ran (runtime event matched by correlation id). It is in the region when
that label or one of its ancestors is the region label. GPU busy time = summed kernel durations (each
kernel once); the union of kernel intervals (overlap across streams counted once) is reported beside it,
and idle = GPU span of the region minus that union. Every kernel lands in exactly one category, so the
category table adds up to the busy time.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from .jsonable import finite_or_none, jsonable
from .profiler import load_trace

# ---------------------------------------------------------------------------------------------------------
# constants

CATEGORIES = (
    "GEMM/linear", "attention", "convolution", "normalization", "elementwise/activation",
    "copy/cast", "reduction", "memcpy/memset", "other",
)  # fmt: skip
DIT_FINE_LABELS = (
    "DiT_Embeddings", "DiT_Norm_Modulation", "DiT_SelfAttn_QKV_RoPE", "DiT_KV_Cache_Update", "DiT_Attention",
    "DiT_CrossAttn", "DiT_Action", "DiT_FFN", "DiT_Head",
)  # fmt: skip
FORWARD_LABEL = "DiffusionModel_Forward"
SHORT_KERNEL_US = 10.0  # kernels shorter than this are launch-latency sized on current GPUs

LAUNCH_CALLS = frozenset({"cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx",
                          "cudaLaunchCooperativeKernel", "cudaGraphLaunch"})
SYNC_RUNTIME = frozenset({"cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize",
                          "cudaMemcpy", "cuStreamSynchronize", "cuCtxSynchronize"})
SYNC_OPS = frozenset({"aten::item", "aten::_local_scalar_dense"})
CAST_OPS = ("aten::copy_", "aten::to", "aten::_to_copy")

# suggestion thresholds
IDLE_SHARE_MIN = 0.10  # GPU idle share of the region worth attacking
HOST_BOUND_RATIO = 0.70  # busy / span below this: the GPU waits on the host
SHORT_SHARE_MIN = 0.40  # share of kernels under SHORT_KERNEL_US
COPY_SHARE_MIN = 0.05
FUSABLE_SHARE_MIN = 0.15  # normalization + elementwise
ATTN_SHARE_MIN = 0.15
GEMM_FRAC_MIN = 0.50  # achieved / ceiling
FORWARD_SHARE_MIN = 0.50  # denoiser forwards' share of the region -> fewer steps pays
VAE_SHARE_MIN = 0.15

NOTEBOOKS = {
    "03": "03_step_reduction", "04": "04_compile_autocast", "05": "05_fused_triton_kernels",
    "06": "06_cuda_graphs",
}  # fmt: skip

# ---------------------------------------------------------------------------------------------------------
# classification

_OP_CATEGORY = [
    ("attention", re.compile(r"^aten::(_scaled_dot_product|scaled_dot_product|_flash_attention|_efficient_attention"
                             r"|_cudnn_attention|flash_attn|_fused_sdp)|flex_attention|flash_attn")),
    ("convolution", re.compile(r"^aten::(convolution|_convolution|cudnn_convolution|conv\d|conv_|"
                               r"miopen_convolution|mkldnn_convolution|_?slow_conv|thnn_conv|_nnpack)")),
    ("GEMM/linear", re.compile(r"^aten::(mm|addmm|bmm|baddbmm|matmul|linear|addbmm|_addmm_activation|"
                               r"_scaled_mm|addmv|mv|dot|einsum)$")),
    ("normalization", re.compile(r"^aten::(native_layer_norm|layer_norm|group_norm|native_group_norm|rms_norm|"
                                 r"_fused_rms_norm|batch_norm|native_batch_norm|_batch_norm|instance_norm|"
                                 r"cudnn_batch_norm)")),
    ("copy/cast", re.compile(r"^aten::(copy_|to|_to_copy|clone|contiguous|cat|stack|_unsafe_view|index_copy_?|"
                             r"slice_scatter|roll|repeat|repeat_interleave|index|index_select|gather|"
                             r"index_put_?|_index_put_impl_|narrow_copy|pad|constant_pad_nd|flip|"
                             r"masked_scatter|scatter_?|expand_copy|permute_copy|as_strided_copy)$")),
    ("reduction", re.compile(r"^aten::(sum|mean|amax|amin|max|min|var|std|var_mean|norm|linalg_vector_norm|"
                             r"softmax|_softmax|log_softmax|_log_softmax|cumsum|argmax|argmin|prod|any|all|"
                             r"topk|sort|logsumexp)$")),
    ("elementwise/activation", re.compile(r"^aten::(add|add_|sub|sub_|mul|mul_|div|div_|neg|pow|rsqrt|sqrt|"
                                          r"exp|log|sin|cos|tanh|sigmoid|silu|silu_|gelu|relu|relu_|"
                                          r"addcmul|addcdiv|lerp|where|clamp|clamp_|clip|fill_|zero_|zeros|"
                                          r"ones|full|arange|reciprocal|abs|sign|floor|ceil|round|"
                                          r"bitwise_\w+|eq|ne|lt|le|gt|ge|logical_\w+|masked_fill_?|"
                                          r"rand|randn|normal_|uniform_|randn_like|rand_like|empty|"
                                          r"maximum|minimum|square|exp2|erf|expm1|log1p|triu|tril|"
                                          r"polar|complex|view_as_real|view_as_complex|outer|"
                                          r"_foreach_\w+|upsample_\w+|_upsample_\w+|nonzero|clamp_min|"
                                          r"clamp_max|hardtanh|softplus|mish|gelu_|sigmoid_|tanh_|exp_)$")),
]

_KERNEL_CATEGORY = [
    ("attention", re.compile(r"flash|fmha|attention|sdpa|_attn|mha_|flash_fwd|flex", re.I)),
    ("convolution", re.compile(r"conv|implicit_gemm|fprop|dgrad|wgrad|winograd|nchwToNhwc|nhwcToNchw", re.I)),
    ("GEMM/linear", re.compile(r"gemm|nvjet|cutlass|cublas|sm\d+_xmma|ampere_|hopper_|volta_|turing_|"
                               r"splitKreduce|triton_tem_|_mm_|matmul", re.I)),
    ("normalization", re.compile(r"layer_norm|group_norm|rms_norm|batch_norm|RowwiseMoments|"
                                 r"ComputeFusedParams|GroupNorm|LayerNorm", re.I)),
    ("copy/cast", re.compile(r"copy|CatArray|gather|scatter|index|_to_copy|convert|transpose|permute|"
                             r"flip|roll", re.I)),
    ("reduction", re.compile(r"reduce|softmax|triton_red_|triton_per_|Reduce|cumsum|scan|sort", re.I)),
    ("elementwise/activation", re.compile(r"elementwise|Functor|triton_poi_|fill|arange|silu|gelu|"
                                          r"sigmoid|tanh|exp|_kernel_cuda|distribution|philox|where", re.I)),
]


def classify(kernel_name: str, op_name: str | None = None, cat: str = "kernel") -> str:
    """Category of one device activity from its trace category, launching aten op and kernel name."""
    if cat in ("gpu_memcpy", "gpu_memset"):
        return "memcpy/memset"
    if isinstance(op_name, str) and op_name:
        for name, rx in _OP_CATEGORY:
            if rx.search(op_name):
                return name
    for name, rx in _KERNEL_CATEGORY:
        if rx.search(kernel_name or ""):
            return name
    return "other"


def classify_cpu_op(op_name: str) -> str:
    for name, rx in _OP_CATEGORY:
        if rx.search(op_name):
            return name
    return "other"


_CONTEXT_CATEGORIES = ("attention", "convolution")  # an enclosing op of these kinds owns all its kernels


def _context_categories(names: list[str], parent: np.ndarray) -> np.ndarray:
    """Per cpu op: 'attention'/'convolution' when it or an enclosing op is SDPA/conv, else ''.

    The math SDPA backend launches bmm/softmax kernels and a conv may launch layout transforms:
    those kernels belong to the enclosing op's category, not to their innermost op's.
    """
    rx = [(c, dict(_OP_CATEGORY)[c]) for c in _CONTEXT_CATEGORIES]
    own = np.array([next((c for c, r in rx if r.search(n)), "") for n in names], dtype=object)
    out = own.copy()
    for i in _topo(parent):  # parents first
        if not out[i] and parent[i] >= 0:
            out[i] = out[parent[i]]
    return out


# ---------------------------------------------------------------------------------------------------------
# FLOPs and bytes from recorded shapes

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


# ---------------------------------------------------------------------------------------------------------
# trace parsing


def _innermost(starts: np.ndarray, ends: np.ndarray, parent: np.ndarray, queries: np.ndarray) -> np.ndarray:
    """For nested intervals (sorted by start, outer first, parent indices) the innermost one holding each
    query time, or -1. Sweep over queries sorted by time."""
    out = np.full(len(queries), -1, dtype=np.int64)
    if len(starts) == 0 or len(queries) == 0:
        return out
    order = np.argsort(queries, kind="stable")
    nxt = 0
    cur = -1
    n = len(starts)
    for qi in order:
        q = queries[qi]
        while nxt < n and starts[nxt] <= q:
            cur = nxt
            nxt += 1
        # climb to the innermost interval that still holds q
        c = cur
        while c != -1 and ends[c] < q:
            c = parent[c]
        out[qi] = c
    return out


def _nest_intervals(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Order (by start, outer first) and parent index (in that order) of intervals on one thread."""
    order = np.lexsort((-(ends - starts), starts))
    e = ends[order]
    parent = np.full(len(order), -1, dtype=np.int64)
    stack: list[int] = []
    for i in range(len(order)):
        while stack and not (e[i] <= e[stack[-1]] + 0.002):
            stack.pop()
        parent[i] = stack[-1] if stack else -1
        stack.append(i)
    return order, parent


class _Lane:
    """Nested host intervals of one (pid, tid) with innermost-lookup."""

    def __init__(self, idx: np.ndarray, starts: np.ndarray, ends: np.ndarray):
        order, parent = _nest_intervals(starts, ends)
        self.idx = idx[order]  # global indices into the owner's table
        self.starts = starts[order]
        self.ends = ends[order]
        self.parent = parent

    def lookup(self, times: np.ndarray) -> np.ndarray:
        loc = _innermost(self.starts, self.ends, self.parent, times)
        return np.where(loc >= 0, self.idx[np.maximum(loc, 0)], -1)

    def parents_global(self, n_total: int) -> np.ndarray:
        out = np.full(n_total, -1, dtype=np.int64)
        out[self.idx] = np.where(self.parent >= 0, self.idx[np.maximum(self.parent, 0)], -1)
        return out


def _lanes(df: pd.DataFrame) -> tuple[dict, np.ndarray]:
    """Lanes per thread and the global parent array of `df` (host intervals with ts/end/pid/tid)."""
    parent = np.full(len(df), -1, dtype=np.int64)
    lanes = {}
    for key, g in df.groupby(["pid", "tid"], sort=False):
        lane = _Lane(g.index.to_numpy(), g["ts"].to_numpy(float), g["end"].to_numpy(float))
        lanes[key] = lane
        p = lane.parents_global(len(df))
        m = p >= 0
        parent[m] = p[m]
    return lanes, parent


def _lookup(lanes: dict, pid, tid, times: np.ndarray) -> np.ndarray:
    lane = lanes.get((pid, tid))
    return lane.lookup(times) if lane is not None else np.full(len(times), -1, dtype=np.int64)


@dataclass
class _Parsed:
    labels: pd.DataFrame  # host label ranges: name, ts, end, dur, pid, tid, parent, path
    ops: pd.DataFrame  # cpu ops: name, ts, end, dur, pid, tid, ext, dims, types, concrete, parent, label
    runtime: pd.DataFrame  # runtime/driver calls: name, ts, dur, pid, tid, corr, label
    kernels: pd.DataFrame  # device activities: name, cat, ts, dur, end, stream, corr, ext, op, label, launch_ts


def _frame(rows: list[dict], columns: list[str]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=columns) if rows else pd.DataFrame({c: pd.Series(dtype=object) for c in columns})


def parse(trace) -> _Parsed:
    """Split a trace into label, cpu-op, runtime and device-activity tables, linked to each other."""
    events = trace.get("traceEvents", []) if isinstance(trace, dict) else []
    labels, ops, runtime, kernels = [], [], [], []
    for e in events:
        if e.get("ph") != "X" or "ts" in e and "name" not in e:
            continue
        cat = e.get("cat")
        ts = float(e.get("ts", 0.0))
        dur = float(e.get("dur", 0.0))
        args = e.get("args") or {}
        if cat == "user_annotation":
            if str(e["name"]).startswith("ProfilerStep#"):
                continue
            labels.append((e["name"], ts, ts + dur, dur, e.get("pid"), e.get("tid")))
        elif cat == "cpu_op":
            ops.append((e["name"], ts, ts + dur, dur, e.get("pid"), e.get("tid"), args.get("External id"),
                        args.get("Input Dims"), args.get("Input type"), args.get("Concrete Inputs")))
        elif cat in ("cuda_runtime", "cuda_driver"):
            runtime.append((e["name"], ts, dur, e.get("pid"), e.get("tid"), args.get("correlation")))
        elif cat in ("kernel", "gpu_memcpy", "gpu_memset"):
            kernels.append((e["name"], cat, ts, dur, ts + dur, args.get("stream", e.get("tid")),
                            args.get("correlation"), args.get("External id"), args.get("bytes")))
    L = pd.DataFrame(labels, columns=["name", "ts", "end", "dur", "pid", "tid"])
    O = pd.DataFrame(ops, columns=["name", "ts", "end", "dur", "pid", "tid", "ext", "dims", "types", "concrete"])
    R = pd.DataFrame(runtime, columns=["name", "ts", "dur", "pid", "tid", "corr"])
    K = pd.DataFrame(kernels, columns=["name", "cat", "ts", "dur", "end", "stream", "corr", "ext", "bytes"])

    label_lanes, L["parent"] = _lanes(L) if len(L) else ({}, np.zeros(0, dtype=np.int64))
    # label paths ("a/b/c"), parents first
    paths = [""] * len(L)
    par = L["parent"].to_numpy()
    names = L["name"].tolist()
    for i in np.argsort([0] * len(L)) if len(L) == 0 else _topo(par):
        paths[i] = names[i] if par[i] < 0 else paths[par[i]] + "/" + names[i]
    L["path"] = paths

    _, O["parent"] = _lanes(O) if len(O) else ({}, np.zeros(0, dtype=np.int64))
    O["label"] = _label_of(label_lanes, O, "ts")
    R["label"] = _label_of(label_lanes, R, "ts")

    # device activity -> launch call (correlation) -> launching op (External id) and label
    corr_ts = dict(zip(R["corr"], zip(R["ts"], R["pid"], R["tid"]))) if len(R) else {}
    ext_op = {}
    if len(O):
        for i, x in zip(O.index, O["ext"]):
            if x is not None and not (isinstance(x, float) and math.isnan(x)):
                ext_op.setdefault(x, i)  # first op with that id (the one the launch sits in)
    launch_ts, lpid, ltid, op_idx = [], [], [], []
    for corr, ext in zip(K["corr"], K["ext"]):
        oi = ext_op.get(ext, -1)
        op_idx.append(oi)
        hit = corr_ts.get(corr)
        if hit is not None:
            launch_ts.append(hit[0]); lpid.append(hit[1]); ltid.append(hit[2])  # fmt: skip
        elif oi >= 0:
            launch_ts.append(O.at[oi, "ts"]); lpid.append(O.at[oi, "pid"]); ltid.append(O.at[oi, "tid"])  # fmt: skip
        else:
            launch_ts.append(np.nan); lpid.append(None); ltid.append(None)  # fmt: skip
    K["launch_ts"] = np.asarray(launch_ts, dtype=float)
    K["lpid"], K["ltid"] = lpid, ltid
    K["op"] = np.asarray(op_idx, dtype=np.int64)
    K["label"] = _label_of(label_lanes, K.rename(columns={"lpid": "pid", "ltid": "tid"}), "launch_ts")
    return _Parsed(L, O, R, K)


def _topo(parent: np.ndarray) -> list[int]:
    """Indices with every parent before its children."""
    depth = np.zeros(len(parent), dtype=np.int64)
    for i in range(len(parent)):  # parents precede children in each lane's order, not globally: iterate
        d, p = 0, parent[i]
        while p >= 0:
            d += 1
            p = parent[p]
        depth[i] = d
    return list(np.argsort(depth, kind="stable"))


def _label_of(label_lanes: dict, df: pd.DataFrame, time_col: str) -> np.ndarray:
    out = np.full(len(df), -1, dtype=np.int64)
    if not len(df) or not label_lanes:
        return out
    for (pid, tid), g in df.groupby(["pid", "tid"], sort=False, dropna=False):
        t = g[time_col].to_numpy(float)
        ok = ~np.isnan(t)
        res = np.full(len(g), -1, dtype=np.int64)
        res[ok] = _lookup(label_lanes, pid, tid, t[ok])
        out[df.index.get_indexer(g.index)] = res
    return out


def _ancestors_named(parent: np.ndarray, names: list[str], wanted: set) -> np.ndarray:
    """For each label, the index of its nearest ancestor-or-self whose name is in `wanted` (-1 if none)."""
    out = np.full(len(parent), -1, dtype=np.int64)
    for i in _topo(parent):
        if names[i] in wanted:
            out[i] = i
        elif parent[i] >= 0:
            out[i] = out[parent[i]]
    return out


def _union_ms(starts: np.ndarray, ends: np.ndarray) -> float:
    if len(starts) == 0:
        return 0.0
    order = np.argsort(starts)
    s, e = starts[order], ends[order]
    total, cs, ce = 0.0, s[0], e[0]
    for a, b in zip(s[1:], e[1:]):
        if a > ce:
            total += ce - cs
            cs, ce = a, b
        else:
            ce = max(ce, b)
    return (total + ce - cs) / 1e3


def trace_busy_ms(trace) -> float:
    """GPU busy time of a whole trace: the union of its kernels, copies and sets (overlaps counted once)."""
    K = parse(load_trace(trace) if not isinstance(trace, dict) else trace).kernels
    return _union_ms(K["ts"].to_numpy(float), K["end"].to_numpy(float))


def profile_calls(fn, device=None, calls: int = 1) -> dict | None:
    """The torch.profiler trace (a chrome-trace dict, CPU + CUDA activity) of `calls` calls of fn() (already
    warm), synchronized before and after. None off CUDA."""
    import os
    import tempfile

    import torch

    if isinstance(calls, bool) or not isinstance(calls, int) or calls < 1:
        raise ValueError(f"calls={calls!r} is not allowed; allowed values: an integer >= 1")
    dev = torch.device(device) if device is not None else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if dev.type != "cuda":
        return None
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize(dev)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize(dev)
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path) as f:
            return json.load(f)
    finally:
        os.unlink(path)


def device_busy_ms(fn, device=None, calls: int = 1) -> float:
    """Mean GPU busy time per call of fn() (already warm), from one torch.profiler trace of `calls` calls: the
    union of the device activities. Against the wall time of the same call it says how much of it is host or
    launch overhead (what CUDA graphs, notebook 06, remove). NaN off CUDA."""
    trace = profile_calls(fn, device, calls)
    return float("nan") if trace is None else trace_busy_ms(trace) / calls


def kernel_summary(trace, calls: int = 1, top: int = 20) -> dict[str, pd.DataFrame]:
    """Where the device time of a trace goes, per call: `kernels` (the `top` kernel names by total time, with
    count, mean us and category), `categories` (ms and share per category) and `labels` (ms per innermost
    wmbook label the kernels were launched under; compiled regions keep their record_function labels only
    where Dynamo traced them). Works on compiled code too, where the launching aten op is often missing:
    categories then come from the kernel name (inductor's triton_* kernels are `elementwise`/fused).
    `categories.attrs["busy_ms"]` is the GPU busy time per call (trace_busy_ms / calls, same parse)."""
    P = parse(load_trace(trace) if not isinstance(trace, dict) else trace)
    K = P.kernels.copy()
    if not len(K):
        empty = pd.DataFrame()
        cats = pd.DataFrame()
        cats.attrs["busy_ms"] = 0.0
        return {"kernels": empty, "categories": cats, "labels": empty}
    ops = P.ops["name"].tolist() if len(P.ops) else []
    K["op_name"] = [ops[i] if 0 <= i < len(ops) else None for i in K["op"]]
    K["category"] = [classify(n, o, c) for n, o, c in zip(K["name"], K["op_name"], K["cat"])]
    total = float(K["dur"].sum()) / 1e3 / calls
    g = K.groupby("name").agg(ms=("dur", "sum"), count=("dur", "size"), category=("category", "first"))
    g["ms"] = g["ms"] / 1e3 / calls
    g["count"] = g["count"] / calls
    g["mean_us"] = g["ms"] * 1e3 / g["count"]
    g["share"] = g["ms"] / total
    kernels = g.sort_values("ms", ascending=False).head(top).reset_index()
    kernels["name"] = kernels["name"].str.slice(0, 90)
    c = K.groupby("category")["dur"].agg(["sum", "size"]).rename(columns={"sum": "ms", "size": "kernels"})
    c["ms"] = c["ms"] / 1e3 / calls
    c["kernels"] = c["kernels"] / calls
    c["share"] = c["ms"] / total
    names = P.labels["name"].tolist() if len(P.labels) else []
    K["label_name"] = [names[i] if 0 <= i < len(names) else "(unlabelled)" for i in K["label"]]
    lab = K.groupby("label_name")["dur"].sum().rename("ms").to_frame()
    lab["ms"] = lab["ms"] / 1e3 / calls
    lab["share"] = lab["ms"] / total
    cats = c.sort_values("ms", ascending=False).reset_index()
    cats.attrs["busy_ms"] = _union_ms(K["ts"].to_numpy(float), K["end"].to_numpy(float)) / calls
    return {"kernels": kernels, "categories": cats, "labels": lab.sort_values("ms", ascending=False).reset_index()}


# ---------------------------------------------------------------------------------------------------------
# the breakdown


@dataclass
class Breakdown:
    """All tables of one region. Times in ms unless a column says otherwise."""

    region: str | None
    source: str  # "gpu" (kernels) or "cpu" (CPU self time of aten ops: a trace without device activity)
    categories: pd.DataFrame
    unclassified: pd.DataFrame
    label_tree: pd.DataFrame
    forward_split: pd.DataFrame
    forward_categories: pd.DataFrame
    launch_stats: pd.DataFrame
    syncs: pd.DataFrame
    cpu_hotspots: pd.DataFrame
    casts: pd.DataFrame
    roofline: pd.DataFrame
    suggestions: pd.DataFrame
    stats: dict = field(default_factory=dict)
    ceilings: dict | None = None

    @property
    def basis(self) -> str:
        """What the `ms` columns measure: GPU kernel time, or CPU self time when the trace has no device work."""
        return "GPU" if self.source == "gpu" else "CPU self"

    def tables(self) -> dict[str, pd.DataFrame]:
        return {
            "categories": self.categories, "label_tree": self.label_tree, "forward_split": self.forward_split,
            "forward_categories": self.forward_categories, "launch_stats": self.launch_stats,
            "syncs": self.syncs, "cpu_hotspots": self.cpu_hotspots, "casts": self.casts,
            "roofline": self.roofline, "suggestions": self.suggestions, "unclassified": self.unclassified,
        }  # fmt: skip

    def summary(self) -> dict:
        s = dict(self.stats)
        top = self.categories.head(5)
        s["top_categories"] = [
            {"category": c, "ms": float(m), "share": float(sh)}
            for c, m, sh in zip(top["category"], top["ms"], top["share"])
        ]
        rf = self.roofline.set_index("category") if len(self.roofline) else None
        for cat, key in (("GEMM/linear", "gemm"), ("attention", "attention"), ("convolution", "conv")):
            if rf is not None and cat in rf.index:
                s[f"{key}_tflops"] = finite_or_none(rf.at[cat, "tflops"])
                s[f"{key}_frac_of_ceiling"] = finite_or_none(rf.at[cat, "frac_of_ceiling"])
        return s

    def to_dict(self) -> dict:
        """JSON-serialisable: summary plus every table as records."""
        return {
            "region": self.region, "source": self.source, "summary": jsonable(self.summary()),
            "tables": {k: jsonable(v.to_dict(orient="records")) for k, v in self.tables().items()},
            "ceilings": jsonable(self.ceilings),
        }  # fmt: skip

    def to_json(self, **kw) -> str:
        return json.dumps(self.to_dict(), **kw)

    # plots (matplotlib only when asked for)
    def plot_categories(self, ax=None):
        return plot_categories(self, ax)

    def plot_label_tree(self, ax=None, **kw):
        return plot_label_tree(self, ax, **kw)

    def plot_forward_split(self, ax=None):
        return plot_forward_split(self, ax)

    def plot_roofline(self, ax=None):
        return plot_roofline(self, ax)


def top_level_labels(trace_or_path) -> list[str]:
    p = parse(trace_or_path if isinstance(trace_or_path, dict) else load_trace(trace_or_path))
    return sorted(set(p.labels.loc[p.labels["parent"] < 0, "name"]))


def analyze(
    trace_or_path,
    *,
    region: str | None = "2_Pipeline_Inference",
    ceilings: dict | None = None,
    forward_label: str = FORWARD_LABEL,
    fine_labels=DIT_FINE_LABELS,
    decode_label_re: str = r"VAE_Decode|Decode_First_Stage",
) -> Breakdown:
    """Break down the device time of `region` (a label name; None = the whole trace).

    ceilings: measured device ceilings (wmbook.device.measure_ceilings) for the roofline; None leaves the
    ceiling columns empty. fine_labels: the labels that split one `forward_label` range.
    """
    trace = trace_or_path if isinstance(trace_or_path, dict) else load_trace(trace_or_path)
    p = parse(trace)
    L, O, R, K = p.labels, p.ops, p.runtime, p.kernels
    names = L["name"].tolist()
    par = L["parent"].to_numpy(np.int64) if len(L) else np.zeros(0, dtype=np.int64)

    if region is not None:
        if region not in set(names):
            tops = sorted(set(L.loc[L["parent"] < 0, "name"])) if len(L) else []
            raise ValueError(f"region={region!r} is not a label in this trace; allowed values: None (whole trace) "
                             f"or a label, e.g. the top-level ones {tops}")
        reg_anc = _ancestors_named(par, names, {region})
        in_reg_label = reg_anc >= 0
    else:
        reg_anc = np.full(len(L), -1, dtype=np.int64)
        in_reg_label = np.ones(len(L), dtype=bool)

    def in_region(label_idx: np.ndarray) -> np.ndarray:
        if region is None:
            return np.ones(len(label_idx), dtype=bool)
        ok = label_idx >= 0
        out = np.zeros(len(label_idx), dtype=bool)
        out[ok] = in_reg_label[label_idx[ok]]
        return out

    Kr = K[in_region(K["label"].to_numpy(np.int64))].copy() if len(K) else K.copy()
    Or = O[in_region(O["label"].to_numpy(np.int64))].copy() if len(O) else O.copy()
    Rr = R[in_region(R["label"].to_numpy(np.int64))].copy() if len(R) else R.copy()
    source = "gpu" if len(K) else "cpu"

    # CPU self time of ops (needed for hotspots and for the CPU-only fallback)
    if len(O):
        child = O.loc[O["parent"] >= 0].groupby("parent")["dur"].sum()
        O["self_us"] = O["dur"] - child.reindex(O.index, fill_value=0.0).to_numpy()
        Or["self_us"] = O.loc[Or.index, "self_us"]
    else:
        O["self_us"] = pd.Series(dtype=float)
        Or["self_us"] = pd.Series(dtype=float)

    # --- categories --------------------------------------------------------------------------------------
    op_names = O["name"].tolist() if len(O) else []
    ctx = _context_categories(op_names, O["parent"].to_numpy(np.int64)) if len(O) else np.zeros(0, dtype=object)
    if source == "gpu":
        oidx = Kr["op"].to_numpy(np.int64)
        Kr["op_name"] = [op_names[i] if i >= 0 else None for i in oidx]
        Kr["category"] = [
            ctx[i] if i >= 0 and ctx[i] and c == "kernel" else classify(n, o, c)
            for n, o, c, i in zip(Kr["name"], Kr["op_name"], Kr["cat"], oidx)
        ]
        dur_col, frame = "dur", Kr
    else:
        Or = Or.copy()
        Or["category"] = [ctx[i] or classify_cpu_op(n) for i, n in zip(Or.index, Or["name"])]
        Or["self_us"] = Or["self_us"].clip(lower=0.0)
        dur_col, frame = "self_us", Or[Or["name"].str.startswith("aten::")]
    busy_ms = float(frame[dur_col].sum()) / 1e3
    g = frame.groupby("category")[dur_col].agg(["sum", "count", "mean"]) if len(frame) else None
    cat_rows = []
    for c in CATEGORIES:
        s = g.loc[c] if g is not None and c in g.index else None
        ms = float(s["sum"]) / 1e3 if s is not None else 0.0
        cat_rows.append({"category": c, "ms": ms, "share": ms / busy_ms if busy_ms > 0 else float("nan"),
                         "kernels": int(s["count"]) if s is not None else 0,
                         "mean_us": float(s["mean"]) if s is not None else float("nan")})
    categories = pd.DataFrame(cat_rows).sort_values("ms", ascending=False, kind="stable").reset_index(drop=True)
    categories.attrs["source"] = source
    other = frame[frame["category"] == "other"] if len(frame) else frame
    if len(other):
        key = "name"
        unclassified = (other.assign(op_name=other.get("op_name", other["name"]))
                        .groupby([key, "op_name"], dropna=False)[dur_col].agg(["sum", "count"])
                        .reset_index().rename(columns={"sum": "ms", "count": "count"}))
        unclassified["ms"] /= 1e3
        unclassified = unclassified.sort_values("ms", ascending=False).reset_index(drop=True)
    else:
        unclassified = pd.DataFrame(columns=["name", "op_name", "ms", "count"])

    # --- label tree --------------------------------------------------------------------------------------
    label_tree = _label_tree(L, frame, dur_col, region, reg_anc)

    # --- per-forward split -------------------------------------------------------------------------------
    fine = tuple(fine_labels or ())
    fwd_anc = _ancestors_named(par, names, {forward_label}) if len(L) else np.zeros(0, dtype=np.int64)
    fine_anc = _ancestors_named(par, names, set(fine)) if len(L) else np.zeros(0, dtype=np.int64)
    reg_fwd = [i for i in range(len(L)) if names[i] == forward_label and (region is None or reg_anc[i] >= 0)]
    n_fwd = len(reg_fwd)
    lab = frame["label"].to_numpy(np.int64) if len(frame) else np.zeros(0, dtype=np.int64)
    in_fwd = np.array([fwd_anc[i] >= 0 if i >= 0 else False for i in lab], dtype=bool)
    fine_of = np.array([names[fine_anc[i]] if i >= 0 and fine_anc[i] >= 0 else "untagged" for i in lab], dtype=object)
    fw = frame[in_fwd].assign(fine_label=fine_of[in_fwd]) if len(frame) else frame.assign(fine_label=[])
    fwd_ms_total = float(fw[dur_col].sum()) / 1e3 if len(fw) else 0.0
    split_rows = []
    fsum = fw.groupby("fine_label")[dur_col].agg(["sum", "count"]) if len(fw) else None
    if fsum is not None and source == "gpu":  # launches per forward count kernels, not memcpy/memset
        fsum["count"] = fw[fw["cat"] == "kernel"].groupby("fine_label").size().reindex(fsum.index, fill_value=0)
    for fl in list(fine) + ["untagged"]:
        if fsum is None or fl not in fsum.index:
            continue
        ms = float(fsum.at[fl, "sum"]) / 1e3
        split_rows.append({"fine_label": fl, "ms_per_forward": ms / max(n_fwd, 1),
                           "share": ms / fwd_ms_total if fwd_ms_total > 0 else float("nan"),
                           "kernels_per_forward": float(fsum.at[fl, "count"]) / max(n_fwd, 1)})
    forward_split = pd.DataFrame(split_rows, columns=["fine_label", "ms_per_forward", "share", "kernels_per_forward"])
    forward_split = forward_split.sort_values("ms_per_forward", ascending=False).reset_index(drop=True)
    forward_split.attrs.update(forwards=n_fwd, forward_ms=fwd_ms_total / max(n_fwd, 1) if n_fwd else float("nan"))
    if len(fw):
        forward_categories = (fw.pivot_table(index="fine_label", columns="category", values=dur_col, aggfunc="sum",
                                             fill_value=0.0) / 1e3 / max(n_fwd, 1))
    else:
        forward_categories = pd.DataFrame()

    # --- idle, launches, syncs --------------------------------------------------------------------------
    stats: dict = {"region": region, "source": source, "busy_ms": busy_ms, "forwards": n_fwd,
                   "forward_ms": fwd_ms_total / n_fwd if n_fwd else float("nan")}
    host_ms = float(L.loc[[i for i in range(len(L)) if names[i] == region], "dur"].sum()) / 1e3 if region else (
        (float(O["end"].max() - O["ts"].min()) / 1e3) if len(O) else float("nan"))
    stats["host_ms"] = host_ms
    if source == "gpu" and len(Kr):
        st, en = Kr["ts"].to_numpy(float), Kr["end"].to_numpy(float)
        union = _union_ms(st, en)
        # GPU span per occurrence of the region, so gaps between occurrences don't count as idle
        occ = Kr["label"].map(lambda i: reg_anc[i] if region is not None else 0)
        span = float(sum((g["end"].max() - g["ts"].min()) for _, g in Kr.groupby(occ))) / 1e3
        kern = Kr[Kr["cat"] == "kernel"]
        d = kern["dur"].to_numpy(float)
        short = d < SHORT_KERNEL_US
        launches = Rr[Rr["name"].isin(LAUNCH_CALLS)]
        stats.update(
            busy_union_ms=union, gpu_span_ms=span, idle_ms=max(0.0, span - union),
            idle_share=max(0.0, span - union) / span if span > 0 else float("nan"),
            kernels=int(len(kern)), memcpy_memset=int(len(Kr) - len(kern)),
            launch_calls=int(len(launches)), launch_host_ms=float(launches["dur"].sum()) / 1e3,
            kernels_per_forward=(float(in_fwd[(frame["cat"] == "kernel").to_numpy()].sum()) / n_fwd) if n_fwd else float("nan"),
            short_kernel_share=float(short.mean()) if len(d) else float("nan"),
            short_kernel_time_share=float(d[short].sum() / d.sum()) if d.sum() > 0 else float("nan"),
            kernel_mean_us=float(d.mean()) if len(d) else float("nan"),
            kernel_median_us=float(np.median(d)) if len(d) else float("nan"),
            busy_over_host=(union / host_ms) if host_ms and host_ms > 0 else float("nan"),
        )
    else:
        stats.update(busy_union_ms=busy_ms, gpu_span_ms=float("nan"), idle_ms=float("nan"), idle_share=float("nan"),
                     kernels=0, memcpy_memset=0, launch_calls=0, launch_host_ms=0.0,
                     kernels_per_forward=float("nan"), short_kernel_share=float("nan"),
                     short_kernel_time_share=float("nan"), kernel_mean_us=float("nan"),
                     kernel_median_us=float("nan"), busy_over_host=float("nan"))
    launch_stats = pd.DataFrame({"value": {k: stats[k] for k in (
        "busy_ms", "busy_union_ms", "gpu_span_ms", "idle_ms", "idle_share", "host_ms", "busy_over_host", "kernels",
        "memcpy_memset", "launch_calls", "launch_host_ms", "forwards", "kernels_per_forward", "short_kernel_share",
        "short_kernel_time_share", "kernel_mean_us", "kernel_median_us")}}).rename_axis("statistic")

    sync_rows = []
    for nm, g2 in Rr[Rr["name"].isin(SYNC_RUNTIME)].groupby("name"):
        sync_rows.append({"call": nm, "kind": "runtime", "count": int(len(g2)), "host_ms": float(g2["dur"].sum()) / 1e3})
    for nm, g2 in Or[Or["name"].isin(SYNC_OPS)].groupby("name"):
        sync_rows.append({"call": nm, "kind": "aten", "count": int(len(g2)), "host_ms": float(g2["dur"].sum()) / 1e3})
    if source == "gpu":
        d2h = Kr[(Kr["cat"] == "gpu_memcpy") & Kr["name"].str.contains("DtoH", na=False)]
        if len(d2h):
            sync_rows.append({"call": "Memcpy DtoH", "kind": "device", "count": int(len(d2h)),
                              "host_ms": float("nan")})
    syncs = pd.DataFrame(sync_rows, columns=["call", "kind", "count", "host_ms"])
    # host reads of device values: every .item()/int()/float() of a tensor runs aten::_local_scalar_dense once
    # (aten::item wraps it), so that op counts them; explicit synchronize calls are counted beside it
    n_reads = int((Or["name"] == "aten::_local_scalar_dense").sum()) if len(Or) else 0
    n_sync_calls = int(Rr["name"].isin(SYNC_RUNTIME - {"cudaMemcpy"}).sum()) if len(Rr) else 0
    stats["host_reads"] = n_reads
    # on a GPU each read waits in a synchronize call: count the waits (reads without a GPU)
    stats["syncs"] = n_sync_calls if source == "gpu" else n_reads
    in_fwd_ops = np.array([fwd_anc[i] >= 0 if i >= 0 else False for i in Or["label"].to_numpy(np.int64)], dtype=bool) if len(Or) else np.zeros(0, bool)
    stats["syncs_in_forward"] = int((Or[in_fwd_ops]["name"] == "aten::_local_scalar_dense").sum()) if len(Or) else 0
    stats["syncs_per_forward"] = stats["syncs_in_forward"] / n_fwd if n_fwd else float("nan")

    # --- CPU hotspots and casts --------------------------------------------------------------------------
    if len(Or):
        hs = Or[Or["name"].str.startswith("aten::")].groupby("name").agg(
            count=("dur", "size"), cpu_self_ms=("self_us", "sum"), cpu_total_ms=("dur", "sum"))
        hs[["cpu_self_ms", "cpu_total_ms"]] /= 1e3
        cpu_hotspots = hs.sort_values("cpu_self_ms", ascending=False).head(25).reset_index()
        cpu_hotspots["per_forward"] = cpu_hotspots["count"] / n_fwd if n_fwd else float("nan")
        cr = []
        for nm in CAST_OPS:
            sel = Or["name"] == nm
            selw = sel.to_numpy() & in_fwd_ops
            cr.append({"op": nm, "count": int(sel.sum()), "cpu_ms": float(Or.loc[sel, "dur"].sum()) / 1e3,
                       "per_forward": float(selw.sum()) / n_fwd if n_fwd else float("nan")})
        casts = pd.DataFrame(cr)
        stats["aten_ops_per_forward"] = float((Or["name"].str.startswith("aten::").to_numpy() & in_fwd_ops).sum()) / n_fwd if n_fwd else float("nan")
    else:
        cpu_hotspots = pd.DataFrame(columns=["name", "count", "cpu_self_ms", "cpu_total_ms", "per_forward"])
        casts = pd.DataFrame(columns=["op", "count", "cpu_ms", "per_forward"])
        stats["aten_ops_per_forward"] = float("nan")
    stats["casts_per_forward"] = float(casts["per_forward"].sum()) if len(casts) else float("nan")

    # --- roofline ----------------------------------------------------------------------------------------
    roofline = _roofline(O, frame, dur_col, source, ceilings, trace.get("record_shapes") if isinstance(trace, dict) else None)

    # --- shares used by suggestions ----------------------------------------------------------------------
    total_region = busy_ms
    dec_rx = re.compile(decode_label_re) if decode_label_re else None
    if dec_rx is not None and len(frame):
        dec_anc = np.array([_has_ancestor(par, names, i, dec_rx) for i in lab], dtype=bool)
        stats["decode_ms"] = float(frame.loc[dec_anc, dur_col].sum()) / 1e3
    else:
        stats["decode_ms"] = 0.0
    stats["decode_share"] = stats["decode_ms"] / total_region if total_region > 0 else float("nan")
    stats["forward_share"] = fwd_ms_total / total_region if total_region > 0 else float("nan")
    # forwards per generated unit: per block (causal DiT) or per sampling pass (DDIM two-pass loop)
    blocks = [i for i in range(len(L)) if re.search(r"Block_\d+$", names[i]) and (region is None or reg_anc[i] >= 0)]
    unit = "block"
    if not blocks:
        blocks = [i for i in range(len(L)) if names[i].endswith("Pass") and (region is None or reg_anc[i] >= 0)]
        unit = "pass"
    stats["forward_unit"] = unit
    stats["forwards_per_block"] = n_fwd / len(blocks) if blocks and n_fwd else float("nan")

    bd = Breakdown(region=region, source=source, categories=categories, unclassified=unclassified,
                   label_tree=label_tree, forward_split=forward_split, forward_categories=forward_categories,
                   launch_stats=launch_stats, syncs=syncs, cpu_hotspots=cpu_hotspots, casts=casts,
                   roofline=roofline, suggestions=pd.DataFrame(), stats=stats, ceilings=ceilings)
    bd.suggestions = suggest(bd)
    return bd


def _has_ancestor(par, names, i, rx) -> bool:
    while i >= 0:
        if rx.search(names[i]):
            return True
        i = par[i]
    return False


def _label_tree(L: pd.DataFrame, frame: pd.DataFrame, dur_col: str, region, reg_anc) -> pd.DataFrame:
    """Self/total device time per label path, rooted at the region (or the trace's top level)."""
    cols = ["path", "label", "parent_path", "depth", "count", "self_ms", "total_ms", "kernels"]
    if not len(L) or not len(frame):
        return pd.DataFrame(columns=cols)
    paths = L["path"].tolist()
    if region is not None:
        # strip the part above the region so every path starts at the region label
        def rel(i):
            r = reg_anc[i]
            if r < 0:
                return None
            base = paths[r]
            prefix = base[: len(base) - len(L.at[r, "name"])]
            return paths[i][len(prefix):]
        rpaths = [rel(i) for i in range(len(L))]
    else:
        rpaths = paths
    self_ms: dict = {}
    kcount: dict = {}
    lab = frame["label"].to_numpy(np.int64)
    durs = frame[dur_col].to_numpy(float) / 1e3
    unl = 0.0
    nunl = 0
    for i, d in zip(lab, durs):
        pth = rpaths[i] if i >= 0 else None
        if pth is None:
            unl += d
            nunl += 1
            continue
        self_ms[pth] = self_ms.get(pth, 0.0) + d
        kcount[pth] = kcount.get(pth, 0) + 1
    occ: dict = {}
    for pth in rpaths:
        if pth is not None:
            occ[pth] = occ.get(pth, 0) + 1
    allp = set(occ)
    total = dict.fromkeys(allp, 0.0)
    ktot = dict.fromkeys(allp, 0)
    for pth, v in self_ms.items():
        parts = pth.split("/")
        for j in range(1, len(parts) + 1):
            a = "/".join(parts[:j])
            if a in total:
                total[a] += v
                ktot[a] += kcount[pth]
    rows = []
    for pth in allp:
        parts = pth.split("/")
        rows.append({"path": pth, "label": parts[-1], "parent_path": "/".join(parts[:-1]), "depth": len(parts) - 1,
                     "count": occ[pth], "self_ms": self_ms.get(pth, 0.0), "total_ms": total[pth],
                     "kernels": ktot[pth]})
    if region is None and nunl:
        rows.append({"path": "(unlabelled)", "label": "(unlabelled)", "parent_path": "", "depth": 0, "count": 0,
                     "self_ms": unl, "total_ms": unl, "kernels": nunl})
    out = pd.DataFrame(rows, columns=cols)
    return out.sort_values(["depth", "total_ms"], ascending=[True, False]).reset_index(drop=True)


def _roofline(O, frame, dur_col, source, ceilings, record_shapes) -> pd.DataFrame:
    cols = ["category", "gflop", "ms", "covered_ms", "tflops", "ceiling_tflops", "frac_of_ceiling",
            "gb", "gbps", "ceiling_gbps", "intensity_flop_per_byte"]
    if not len(frame):
        return pd.DataFrame(columns=cols)
    names = O["name"].tolist()
    parent = O["parent"].to_numpy(np.int64)
    dims, types, conc = O["dims"].tolist(), O["types"].tolist(), O["concrete"].tolist()

    def flop_op(i, wanted):
        while i >= 0:
            if names[i] in wanted:
                return i
            i = parent[i]
        return -1

    gemm_ceil = (ceilings or {}).get("gemm_tflops")
    attn_ceil = (ceilings or {}).get("sdpa_tflops") or gemm_ceil
    copy_ceil = (ceilings or {}).get("copy_gbps")
    op_col = frame["op"].to_numpy(np.int64) if source == "gpu" else frame.index.to_numpy(np.int64)
    rows = []
    for cat, wanted, ceil in (("GEMM/linear", _GEMM_FLOP_OPS, gemm_ceil), ("attention", _ATTN_FLOP_OPS, attn_ceil),
                              ("convolution", _CONV_FLOP_OPS, gemm_ceil)):
        m = (frame["category"] == cat).to_numpy()
        if not m.any():
            continue
        ms = float(frame.loc[m, dur_col].sum()) / 1e3
        seen: dict = {}
        covered = 0.0
        for oi, d in zip(op_col[m], frame.loc[m, dur_col].to_numpy(float)):
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
        m = (frame["category"] == cat).to_numpy()
        if not m.any():
            continue
        ms = float(frame.loc[m, dur_col].sum()) / 1e3
        seen: dict = {}
        covered = 0.0
        for oi, d in zip(op_col[m], frame.loc[m, dur_col].to_numpy(float)):
            if oi < 0:
                continue
            if oi not in seen:
                seen[oi] = op_bytes(dims[oi], types[oi], names[oi])
            if seen[oi] is not None:
                covered += d / 1e3
        nbytes = sum(v for v in seen.values() if v)
        gbps = nbytes / (covered * 1e-3) / 1e9 if covered > 0 and nbytes > 0 else float("nan")
        rows.append({"category": cat, "gflop": float("nan"), "ms": ms, "covered_ms": covered, "tflops": float("nan"),
                     "ceiling_tflops": float("nan"), "frac_of_ceiling": gbps / copy_ceil if copy_ceil and not math.isnan(gbps) else float("nan"),
                     "gb": nbytes / 1e9 if nbytes else float("nan"), "gbps": gbps,
                     "ceiling_gbps": copy_ceil or float("nan"), "intensity_flop_per_byte": float("nan")})
    out = pd.DataFrame(rows, columns=cols)
    # GEMM/attention/conv intensity needs bytes too: inputs + output of the FLOP ops
    out.attrs["note"] = ("" if record_shapes or any(d for d in dims[:1000] if d) else
                         "trace recorded without record_shapes: FLOP and byte columns are empty")
    for idx, r in out.iterrows():
        if r["category"] in ("GEMM/linear", "attention", "convolution") and not math.isnan(r["gflop"]):
            wanted = {"GEMM/linear": _GEMM_FLOP_OPS, "attention": _ATTN_FLOP_OPS, "convolution": _CONV_FLOP_OPS}[r["category"]]
            m = (frame["category"] == r["category"]).to_numpy()
            ops = {flop_op(int(oi), wanted) for oi in op_col[m] if oi >= 0} - {-1}
            nbytes = sum(op_bytes(dims[o], types[o], names[o]) or 0 for o in ops)
            if nbytes:
                out.at[idx, "gb"] = nbytes / 1e9
                out.at[idx, "intensity_flop_per_byte"] = r["gflop"] * 1e9 / nbytes
                out.at[idx, "gbps"] = nbytes / (r["covered_ms"] * 1e-3) / 1e9 if r["covered_ms"] > 0 else float("nan")
    for idx, r in out.iterrows():
        if math.isnan(r["intensity_flop_per_byte"]) and not math.isnan(r["gb"]) and r["gb"] > 0:
            # memory-bound categories: about one FLOP per element, intensity well under 1
            out.at[idx, "intensity_flop_per_byte"] = 0.25
    return out


# ---------------------------------------------------------------------------------------------------------
# suggestions


def suggest(bd: Breakdown) -> pd.DataFrame:
    """Findings ranked by estimated saving (ms of device or host time per analysed region)."""
    s = bd.stats
    cat = bd.categories.set_index("category")
    busy = s.get("busy_ms") or 0.0
    rows = []

    def add(finding, evidence, saving, nb, action):
        rows.append({"finding": finding, "evidence": evidence, "estimated_saving_ms": float(max(saving, 0.0)),
                     "notebook": NOTEBOOKS[nb], "action": action})

    def sh(c):
        return float(cat.at[c, "share"]) if c in cat.index and not math.isnan(cat.at[c, "share"]) else 0.0

    def ms(c):
        return float(cat.at[c, "ms"]) if c in cat.index else 0.0

    basis = bd.basis

    idle_share = s.get("idle_share")
    if idle_share is not None and not math.isnan(idle_share) and idle_share >= IDLE_SHARE_MIN:
        add("GPU idle inside the region", f"idle {s['idle_ms']:.1f} ms = {idle_share:.0%} of the GPU span",
            s["idle_ms"], "06", "capture the block loop in CUDA graphs; remove host work between launches")
    bh = s.get("busy_over_host")
    if bh is not None and not math.isnan(bh) and bh < HOST_BOUND_RATIO:
        add("launch-bound: host enqueue slower than the GPU",
            f"GPU busy {s['busy_union_ms']:.1f} ms over {s['host_ms']:.1f} ms of host time ({bh:.0%}); "
            f"{s['kernels_per_forward']:.0f} kernels per forward", s["host_ms"] - s["busy_union_ms"], "06",
            "CUDA graphs (06) or torch.compile fusion (04) to cut launches per forward")
    sks = s.get("short_kernel_share")
    if sks is not None and not math.isnan(sks) and sks >= SHORT_SHARE_MIN:
        add("many tiny kernels", f"{sks:.0%} of kernels run under {SHORT_KERNEL_US:.0f} us "
            f"({s['short_kernel_time_share']:.0%} of busy time)", busy * s["short_kernel_time_share"] * 0.5, "04",
            "torch.compile (regional) to fuse pointwise chains")
    if sh("copy/cast") >= COPY_SHARE_MIN or (s.get("casts_per_forward") or 0) > 50:
        cpf = s.get("casts_per_forward")
        add("copies and dtype casts", f"copy/cast {sh('copy/cast'):.0%} of {basis} time ({ms('copy/cast'):.1f} ms); "
            f"{cpf:.0f} aten::to/_to_copy/copy_ per forward" if cpf == cpf else f"copy/cast {sh('copy/cast'):.0%}",
            ms("copy/cast") * 0.7, "04", "dtype hygiene: keep tensors in the model dtype, drop round trips")
    fus = sh("normalization") + sh("elementwise/activation")
    if fus >= FUSABLE_SHARE_MIN:
        add("normalization + elementwise time", f"{fus:.0%} of {basis} time "
            f"({ms('normalization') + ms('elementwise/activation'):.1f} ms)",
            (ms("normalization") + ms("elementwise/activation")) * 0.5, "05",
            "fused Triton kernels (norm+modulation, RoPE, gated residual)")
    rf = bd.roofline.set_index("category") if len(bd.roofline) else pd.DataFrame()
    if sh("attention") >= ATTN_SHARE_MIN:
        frac = rf.at["attention", "frac_of_ceiling"] if "attention" in rf.index else float("nan")
        saving = ms("attention") * (1 - min(1.0, (frac / 0.6) if frac == frac else 0.5))
        add("attention time", f"attention {sh('attention'):.0%} of {basis} time"
            + (f", {frac:.0%} of the ceiling" if frac == frac else ""), saving, "04",
            "attention backends (flash/cuDNN/FlexAttention) in 04; fused kernels in 05")
    if "GEMM/linear" in rf.index:
        frac = rf.at["GEMM/linear", "frac_of_ceiling"]
        if frac == frac and frac < GEMM_FRAC_MIN and ms("GEMM/linear") > 0:
            add("GEMMs below the measured ceiling", f"{rf.at['GEMM/linear', 'tflops']:.3g} TFLOP/s = {frac:.0%} "
                f"of {rf.at['GEMM/linear', 'ceiling_tflops']:.0f}", ms("GEMM/linear") * (1 - frac / GEMM_FRAC_MIN), "04",
                "bf16 weights/autocast, max-autotune compile, larger fused GEMMs")
    fs = s.get("forward_share")
    if fs is not None and fs == fs and fs >= FORWARD_SHARE_MIN:
        fpb = s.get("forwards_per_block")
        saving = busy * fs / fpb if fpb and fpb == fpb and fpb > 1 else busy * fs * 0.25
        unit = s.get("forward_unit", "block")
        add("denoiser forwards dominate", f"forwards {fs:.0%} of {basis} time"
            + (f", {fpb:.1f} forwards per {unit}" if fpb == fpb else ""), saving, "03",
            f"fewer denoising steps (one fewer step saves about one forward per {unit})")
    ds = s.get("decode_share")
    if ds is not None and ds == ds and ds >= VAE_SHARE_MIN:
        add("VAE decode", f"decode {ds:.0%} of {basis} time ({s['decode_ms']:.1f} ms)", s["decode_ms"] * 0.4, "04",
            "VAE in bf16 with a PSNR check, channels_last, compile")
    if (s.get("syncs_in_forward") or 0) > 0:
        add("host-device syncs inside the forward", f"{s['syncs_in_forward']} host reads of device values "
            f"(aten::_local_scalar_dense), {s['syncs_per_forward']:.0f} per forward",
            0.05 * s["syncs_in_forward"], "04", "remove .item()/host reads from the loop")
    out = pd.DataFrame(rows, columns=["finding", "evidence", "estimated_saving_ms", "notebook", "action"])
    out = out.sort_values("estimated_saving_ms", ascending=False).reset_index(drop=True)
    out.insert(0, "rank", range(1, len(out) + 1))
    return out


# ---------------------------------------------------------------------------------------------------------
# plots


def _ax(ax, figsize=(7, 3.2)):
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=figsize)
    return ax


def plot_categories(bd: Breakdown, ax=None):
    ax = _ax(ax)
    df = bd.categories[bd.categories["ms"] > 0].iloc[::-1]
    ax.barh(df["category"], df["ms"], color="tab:blue")
    for y, (v, s) in enumerate(zip(df["ms"], df["share"])):
        ax.text(v, y, f" {s:.0%}", va="center", fontsize=8)
    ax.set_xlabel(f"{bd.basis} time, ms ({bd.region or 'whole trace'})")
    ax.set_title("Time by operator category")
    return ax


def plot_label_tree(bd: Breakdown, ax=None, max_depth: int = 3, min_share: float = 0.01):
    """Icicle chart: one row per depth, each label a bar as wide as its total device time."""
    ax = _ax(ax, figsize=(11, 1.0 + 0.9 * (max_depth + 1)))
    t = bd.label_tree
    if not len(t):
        ax.set_axis_off()
        return ax
    import matplotlib.pyplot as plt

    roots = t[t["depth"] == 0]
    total = float(roots["total_ms"].sum())
    cmap = plt.get_cmap("tab20")
    children = {k: g.sort_values("total_ms", ascending=False) for k, g in t.groupby("parent_path")}

    def draw(path, x0, depth, color_i):
        row = t[t["path"] == path].iloc[0]
        w = float(row["total_ms"])
        if depth > max_depth or w <= 0:
            return
        ax.barh(-depth, w, left=x0, height=0.9, color=cmap(color_i % 20), edgecolor="white", linewidth=0.5)
        fits = int(w / total * 150)  # characters of fontsize 7 that fit in the bar (11 in wide axes)
        if fits >= 4:
            text = str(row["label"])
            text = text if len(text) <= fits else text[: fits - 1] + "…"
            ax.text(x0 + w / 2, -depth, text, ha="center", va="center", fontsize=7)
        x = x0
        for i, (_, c) in enumerate(children.get(path, pd.DataFrame()).iterrows()):
            if c["total_ms"] / total < min_share:
                x += c["total_ms"]
                continue
            draw(c["path"], x, depth + 1, color_i * 3 + i + 1)
            x += c["total_ms"]

    x = 0.0
    for i, (_, r) in enumerate(roots.sort_values("total_ms", ascending=False).iterrows()):
        draw(r["path"], x, 0, i)
        x += r["total_ms"]
    ax.set_yticks([-d for d in range(max_depth + 1)], [f"depth {d}" for d in range(max_depth + 1)])
    ax.set_xlabel(f"{bd.basis} time, ms")
    ax.set_title("Label tree (width = total time; labels under 1% hidden)")
    return ax


def plot_forward_split(bd: Breakdown, ax=None):
    ax = _ax(ax)
    df = bd.forward_split.iloc[::-1]
    ax.barh(df["fine_label"], df["ms_per_forward"], color="tab:orange")
    ax.set_xlabel(f"{bd.basis} ms per forward")
    ax.set_title(f"Inside one forward ({bd.forward_split.attrs.get('forwards', 0)} forwards)")
    return ax


def plot_roofline(bd: Breakdown, ax=None):
    """Log-log achieved throughput vs arithmetic intensity, with the measured compute and copy roofs."""
    ax = _ax(ax, figsize=(6, 4))
    rf = bd.roofline.dropna(subset=["intensity_flop_per_byte"])
    ceil = (bd.ceilings or {}).get("gemm_tflops")
    bw = (bd.ceilings or {}).get("copy_gbps")
    xs = np.logspace(-2, 4, 200)
    if ceil and bw:
        roof = np.minimum(ceil * 1e12, xs * bw * 1e9) / 1e12
        ax.plot(xs, roof, "k-", lw=1, label=f"roof: {ceil:.0f} TFLOP/s, {bw:.0f} GB/s (measured)")
    for _, r in rf.iterrows():
        if r["tflops"] == r["tflops"]:
            y = r["tflops"]
        elif r["gbps"] == r["gbps"]:
            y = r["gbps"] * 1e9 * r["intensity_flop_per_byte"] / 1e12
        else:
            continue
        ax.scatter([r["intensity_flop_per_byte"]], [y], s=30 + 4 * r["ms"] ** 0.5, zorder=3)
        ax.annotate(r["category"], (r["intensity_flop_per_byte"], y), fontsize=8, xytext=(4, 4),
                    textcoords="offset points")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity, FLOP/byte (memory-bound categories placed at 0.25)")
    ax.set_ylabel("achieved TFLOP/s")
    ax.set_title("Roofline")
    ax.legend(fontsize=7, loc="lower right")
    return ax


__all__ = [
    "Breakdown", "CATEGORIES", "DIT_FINE_LABELS", "analyze", "classify", "op_bytes", "op_flops", "parse",
    "plot_categories", "plot_forward_split", "plot_label_tree", "plot_roofline", "suggest", "top_level_labels",
]  # fmt: skip
