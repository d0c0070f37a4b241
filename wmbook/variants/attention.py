"""Attention backends, measured on the shapes a forward really runs (notebook 04).

    with record_attention_shapes(pipe.model) as rec:   # every attention() call of one generation
        pipe.generate(inputs, progress=False)
    shapes = rec.table()                               # one row per call site and shape, FLOPs, calls/forward
    table = attention_backend_table(shapes, dtype="bf16")  # ms, TFLOP/s, error, kernel `auto` runs
    best_backend(table)                                # fastest within tolerance, FLOP-share weighted
    flex_vs_dense_mask()                               # block-causal full sequence: dense mask vs BlockMask
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import sys
import warnings
from dataclasses import dataclass

import pandas as pd
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.flex_attention import BlockMask

from ..bench import time_fn, time_once
from ..check import compare
from ..models import attention as attn
from ..presets import DTYPES, dtype_name, resolve_device

_THIS_FILES = {os.path.abspath(__file__), os.path.abspath(attn.__file__)}


# --- recording the calls of a forward ----------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class MaskRef:
    """The first mask a recorded call site passed (kept for timing; prints short in a DataFrame)."""

    tensor: torch.Tensor

    def __repr__(self) -> str:
        return f"{str(self.tensor.dtype).replace('torch.', '')}{list(self.tensor.shape)}"


def _dtype_name(dtype: torch.dtype) -> str:
    """'bf16' for torch.bfloat16 (the keys of check.TOLERANCES); other dtypes by their torch name."""
    return dtype_name(dtype) if dtype in DTYPES.values() else str(dtype).replace("torch.", "")


def _mask_kind(mask) -> str:
    if mask is None:
        return "none"
    if isinstance(mask, BlockMask):
        return "block_mask"
    if mask.dim() == 4 and mask.shape[-2] == 1:
        return "key"  # one row of keys per sample, broadcast over queries ([B, 1, 1, Lk])
    return "dense"


def _call_site() -> str:
    """`file.Class.method:line` of the first frame outside the attention modules (the model's call)."""
    f = sys._getframe(1)
    while f is not None and os.path.abspath(f.f_code.co_filename) in _THIS_FILES:
        f = f.f_back
    if f is None:
        return "?"
    name = getattr(f.f_code, "co_qualname", f.f_code.co_name)
    return f"{os.path.splitext(os.path.basename(f.f_code.co_filename))[0]}.{name}:{f.f_lineno}"


class AttentionRecorder:
    """Collects every attention() call while active; `table()` gives the deduplicated shapes."""

    def __init__(self, module: torch.nn.Module | None = None, forwards: int | None = None):
        self.module, self.forwards_given = module, forwards
        self.forwards_seen = 0
        self.calls: dict = {}  # key -> {"count", "mask"}

    def _observe(self, q, k, v, mask) -> None:
        kind = _mask_kind(mask)
        key = (_call_site(), tuple(q.shape), tuple(k.shape), tuple(v.shape), _dtype_name(q.dtype), str(q.device),
               kind, tuple(mask.shape) if mask is not None else ())
        rec = self.calls.get(key)
        if rec is None:
            self.calls[key] = {"count": 1, "mask": mask}
        else:
            rec["count"] += 1

    def _count_forward(self, *_):
        self.forwards_seen += 1

    @property
    def forwards(self) -> int:
        """Forwards the counts are divided by: as given, else counted on `module`, else 1."""
        if self.forwards_given is not None:
            return self.forwards_given
        return self.forwards_seen or 1

    def table(self) -> pd.DataFrame:
        """One row per (call site, shapes, dtype, mask), most FLOPs per forward first."""
        rows = []
        for (site, qs, ks, vs, dtype, device, kind, ms), rec in self.calls.items():
            b, lq, h, d = qs
            lk, dv = ks[1], vs[3]
            gflop = 2 * b * h * lq * lk * (d + dv) / 1e9  # QK^T + PV over all keys, multiply-add = 2
            mask = rec["mask"]
            density = math.nan
            if isinstance(mask, torch.Tensor) and mask.dtype == torch.bool:
                density = float(mask.float().mean())  # broadcasting repeats every element equally often
            rows.append({
                "site": site, "mask_kind": kind, "batch": b, "heads": h, "q_len": lq, "kv_len": lk, "head_dim": d,
                "dtype": dtype, "device": device, "q_shape": qs, "k_shape": ks, "v_shape": vs, "mask_shape": ms,
                "mask_density": density, "calls": rec["count"], "calls_per_forward": rec["count"] / self.forwards,
                "gflop_per_call": gflop, "gflop_per_forward": gflop * rec["count"] / self.forwards,
                "mask": MaskRef(mask) if isinstance(mask, torch.Tensor) else None,
            })
        df = pd.DataFrame(rows)
        if df.empty:
            return df
        df["flop_share"] = df["gflop_per_forward"] / df["gflop_per_forward"].sum()
        return df.sort_values("gflop_per_forward", ascending=False, ignore_index=True)


@contextlib.contextmanager
def record_attention_shapes(module: torch.nn.Module | None = None, forwards: int | None = None):
    """Record every attention() call (shapes, dtype, mask kind and shape, count) inside the block.

    module: count its forward calls, so `calls_per_forward` is per forward of it (the DiT or the UNet);
    forwards: the number of forwards the block runs, if known instead. Yields an AttentionRecorder:
    `rec.table()` is the DataFrame (gflop_per_call, calls_per_forward, flop_share, ...).
    """
    rec = AttentionRecorder(module, forwards)
    hook = module.register_forward_pre_hook(rec._count_forward) if module is not None else None
    try:
        with attn.observe_attention(rec._observe):
            yield rec
    finally:
        if hook is not None:
            hook.remove()


# --- timing every backend on the recorded shapes -----------------------------------------------------------

_KERNEL_CLASSES = (  # checked in order: cuDNN's SDPA kernels carry "flash" in their names too
    ("flex", ("flex",)),
    ("cudnn", ("cudnn",)),
    ("efficient", ("efficient", "fmha", "mem_eff", "cutlassf")),
    ("flash", ("flash",)),
    ("math", ("attention_math",)),
)


def classify_attention_kernel(name: str) -> str | None:
    """'flash' / 'efficient' / 'cudnn' / 'math' / 'flex' for an attention kernel or op name, None otherwise."""
    low = name.lower()
    for cls, needles in _KERNEL_CLASSES:
        if any(n in low for n in needles):
            return cls
    return None


def auto_kernel(q, k, v, mask=None) -> tuple[str, str]:
    """(class, name) of the kernel the `auto` backend runs for these inputs, from one profiled call.

    Device kernels are classified first (longest first), then the SDPA dispatch op (the math path runs
    GEMM + softmax kernels only); anything else is 'unknown: <name>'.
    """
    acts = [torch.profiler.ProfilerActivity.CPU]
    if q.device.type == "cuda":
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    with attn.attention_backend("auto"), torch.profiler.profile(activities=acts) as prof:
        attn.attention(q, k, v, mask)
        if q.device.type == "cuda":
            torch.cuda.synchronize(q.device)
    events = list(prof.events())
    kernels = sorted((e for e in events if e.device_type != torch.autograd.DeviceType.CPU),
                     key=lambda e: -float(getattr(e, "device_time_total", 0) or 0))
    ops = [e for e in events if e.device_type == torch.autograd.DeviceType.CPU and e.name.startswith("aten::_")]
    for e in kernels + ops:
        cls = classify_attention_kernel(e.name)
        if cls is not None:
            return cls, e.name
    top = kernels[0].name if kernels else (ops[0].name if ops else "no kernel recorded")
    return f"unknown: {top}", top


def _reference(q, k, v, mask):
    """fp32 SDPA math on the same inputs, over head chunks so the fp32 scores stay near 1 GiB."""
    qf, kf, vf = q.float(), k.float(), v.float()
    b, lq, h, _ = q.shape
    step = max(1, 2**28 // max(1, b * lq * k.shape[1]))
    per_head_mask = isinstance(mask, torch.Tensor) and mask.dim() == 4 and mask.shape[1] > 1
    with sdpa_kernel([SDPBackend.MATH]):
        if step >= h or per_head_mask:
            return attn._auto(qf, kf, vf, mask)
        return torch.cat([attn._auto(qf[:, :, i:i + step], kf[:, :, i:i + step], vf[:, :, i:i + step], mask)
                          for i in range(0, h, step)], dim=2)


def _resolve_dtype(dtype, default: str) -> torch.dtype:
    if dtype is None:
        dtype = default
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)} or a torch.dtype, got {dtype!r}")
    return DTYPES[dtype]


def _short_error(e: Exception) -> str:
    s = str(e).strip()
    return f"{type(e).__name__}: {s.splitlines()[0] if s else ''}"


# PyTorch's SDPA dispatcher explains in UserWarnings why a backend forced with sdpa_kernel cannot run a call
# (sdp_utils.cpp: "Flash Attention does not support non-null attn_mask."), before it raises "No available kernel".
_SDPA_WARNING = re.compile(r"sdp_utils\.cpp")
# its headers and the other backends the forcing itself switched off say nothing about the shape
_SDPA_NOT_A_REASON = re.compile(r"not used because|has been runtime disabled")


def _sdpa_reasons(caught) -> list[str]:
    """The reasons in the SDPA dispatcher's warnings (deduplicated, without PyTorch's source location); every other
    warning is issued again as it came."""
    reasons = []
    for w in caught:
        msg = str(w.message)
        if not _SDPA_WARNING.search(msg):
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno, source=w.source)
            continue
        text = msg.split("(Triggered internally", 1)[0].strip()
        if text and not _SDPA_NOT_A_REASON.search(text) and text not in reasons:
            reasons.append(text)
    return reasons


def _measure(backend, q, k, v, mask, ref, dtype_key, gflop, warmup, repeats, device) -> dict:
    """One backend on one shape. The dispatcher's warnings for a backend that cannot run the shape go into the row's
    `reason` instead of the notebook's output (one red box per backend and shape, which said no more than the table)."""
    row = {"backend": backend}
    caught: list = []
    try:
        with attn.attention_backend(backend):
            # the dispatcher refuses (and warns why) at the first call; the timed calls run with the caller's filters
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                out = attn.attention(q, k, v, mask)
            chk = compare(out, ref, dtype=dtype_key)
            del out
            t = time_fn(lambda: attn.attention(q, k, v, mask), warmup=warmup, repeats=repeats, device=device)
    except (attn.AttentionBackendError, RuntimeError, ValueError, TypeError, NotImplementedError) as e:
        if isinstance(e, torch.cuda.OutOfMemoryError):
            torch.cuda.empty_cache()
        reasons = _sdpa_reasons(caught)  # outside the recording: the warnings issued again reach the caller
        return {**row, "status": "unsupported",
                "reason": _short_error(e) + (f" ({'; '.join(reasons)})" if reasons else "")}
    _sdpa_reasons(caught)
    return {**row, "status": "ok" if chk.passed else "out of tolerance", "reason": "",
            "ms_median": t.median, "ms_p20": t.p20, "ms_p80": t.p80, "tflop_s": gflop / t.median,
            "max_rel": chk.max_rel, "mean_rel": chk.mean_rel, "within_tol": chk.passed}


def attention_backend_table(shapes: pd.DataFrame, backends=None, device=None, dtype=None, warmup: int = 3,
                            repeats: int = 10, top: int = 8, seed: int = 0) -> pd.DataFrame:
    """Time every backend on the `top` recorded shapes by FLOPs per forward (random inputs, recorded masks).

    shapes: `record_attention_shapes(...).table()`; backends: names from ATTENTION_BACKENDS (default all);
    device/dtype: default the recorded ones. One row per (shape, backend): median ms with p20/p80, TFLOP/s,
    max_rel/mean_rel against fp32 SDPA math on the same inputs and whether that is within the dtype's
    tolerance, or the reason the backend cannot run the shape; plus the kernel `auto` runs for the shape.
    """
    backends = list(attn.ATTENTION_BACKENDS if backends is None else backends)
    for b in backends:
        if b not in attn.ATTENTION_BACKENDS:
            raise ValueError(f"unknown attention backend {b!r}; choose from {', '.join(attn.ATTENTION_BACKENDS)}")
    if shapes.empty:
        raise ValueError("shapes is empty: record a forward with record_attention_shapes first")
    rows = []
    for shape_id, s in shapes.head(top).iterrows():
        dev = resolve_device(device if device is not None else s["device"])
        dt = _resolve_dtype(dtype, s["dtype"])
        key = _dtype_name(dt)
        gen = torch.Generator(dev).manual_seed(seed + int(shape_id))
        q, k, v = (torch.randn(sh, generator=gen, device=dev, dtype=torch.float32).to(dt)
                   for sh in (s["q_shape"], s["k_shape"], s["v_shape"]))
        mask = s["mask"].tensor.to(dev) if s["mask"] is not None else None
        ref = _reference(q, k, v, mask)
        try:
            auto_cls, auto_name = auto_kernel(q, k, v, mask)
        except RuntimeError as e:
            auto_cls, auto_name = "unknown: profiler failed", _short_error(e)
        shape_cols = {"shape_id": int(shape_id), "site": s["site"], "mask_kind": s["mask_kind"],
                      "q_shape": s["q_shape"], "k_shape": s["k_shape"], "mask_shape": s["mask_shape"],
                      "calls_per_forward": s["calls_per_forward"], "gflop_per_call": s["gflop_per_call"],
                      "flop_share": s["flop_share"], "dtype": key, "device": str(dev)}
        for b in backends:
            r = _measure(b, q, k, v, mask, ref, key, s["gflop_per_call"], warmup, repeats, dev)
            rows.append({**shape_cols, **r, "auto_kernel": auto_cls, "auto_kernel_name": auto_name,
                         "torch": torch.__version__})
        del q, k, v, ref
    cols = ["shape_id", "site", "mask_kind", "q_shape", "k_shape", "mask_shape", "backend", "status", "ms_median",
            "ms_p20", "ms_p80", "tflop_s", "max_rel", "mean_rel", "within_tol", "reason", "auto_kernel",
            "auto_kernel_name", "calls_per_forward", "gflop_per_call", "flop_share", "dtype", "device", "torch"]
    return pd.DataFrame(rows).reindex(columns=cols)


def backend_scores(table: pd.DataFrame) -> pd.DataFrame:
    """Per backend: shapes run, whether it ran every shape within tolerance (eligible), FLOP-share-weighted
    time relative to the fastest eligible backend of each shape (1.0 = fastest everywhere), ms per forward."""
    n_shapes = table["shape_id"].nunique()
    ran = table[table["status"] != "unsupported"]
    ran_all = ran.groupby("backend")["shape_id"].nunique() == n_shapes
    good = ran.groupby("backend")["within_tol"].all() & ran_all
    eligible = set(good[good].index)
    fastest = ran[ran["backend"].isin(eligible)].groupby("shape_id")["ms_median"].min()
    weight = table.groupby("shape_id")["flop_share"].first()
    weight = weight / weight.sum()
    rows = []
    for b, g in table.groupby("backend", sort=False):
        r = g[g["status"] != "unsupported"]
        rel = (r.set_index("shape_id")["ms_median"] / fastest).reindex(weight.index)
        why = "; ".join(f"shape {x.shape_id}: {x.reason or x.status}" for x in g.itertuples() if x.status != "ok")
        rows.append({"backend": b, "shapes_run": len(r), "shapes": n_shapes, "eligible": b in eligible,
                     "relative_time": float((rel * weight).sum()) if rel.notna().all() else math.nan,
                     "ms_per_forward": float((r["ms_median"] * r["calls_per_forward"]).sum()), "why_not": why})
    return pd.DataFrame(rows).sort_values(["eligible", "relative_time"], ascending=[False, True], ignore_index=True)


def best_backend(table: pd.DataFrame) -> str:
    """The backend to select: runs every shape within the dtype's tolerance, least FLOP-weighted relative time."""
    scores = backend_scores(table)
    good = scores[scores["eligible"]]
    if good.empty:
        raise ValueError("no backend ran every shape within tolerance:\n" + scores.to_string())
    return str(good.iloc[0]["backend"])


# --- FlexAttention vs a dense block-causal mask ------------------------------------------------------------

MG2_FULL_SEQUENCE = {"frames": 15, "frame_seqlen": 880, "heads": 12, "head_dim": 128}  # 13200 tokens
TINY_FULL_SEQUENCE = {"frames": 9, "frame_seqlen": 32, "heads": 2, "head_dim": 16}  # 288 tokens: 3 tiles of 128


def _block_density(bm: BlockMask) -> float:
    """Fraction of (query tile, key tile) pairs the BlockMask computes."""
    n = int(bm.kv_num_blocks.sum()) + (int(bm.full_kv_num_blocks.sum()) if bm.full_kv_num_blocks is not None else 0)
    bq, bk = bm.BLOCK_SIZE
    lq, lk = bm.seq_lengths
    return n / (math.ceil(lq / bq) * math.ceil(lk / bk) * bm.kv_num_blocks.shape[0] * bm.kv_num_blocks.shape[1])


def flex_vs_dense_mask(frames: int | None = None, frame_seqlen: int | None = None, heads: int | None = None,
                       head_dim: int | None = None, frames_per_block: int = 3, window: int = 6, device=None,
                       dtype=None, warmup: int = 3, repeats: int = 10, seed: int = 0) -> pd.DataFrame:
    """Block-causal windowed full-sequence self-attention: SDPA + dense bool mask vs flex + BlockMask.

    Defaults: the MG2 shape on CUDA (15 frames x 880 tokens, 12 heads x 128, bf16), a tiny one on CPU (fp32).
    Rows: SDPA with the dense [L, L] mask (`auto`, kernel named), flex with the frame-arithmetic BlockMask,
    flex with a BlockMask read from the dense mask, and unmasked SDPA over all tokens (what skipping nothing costs).
    """
    dev = resolve_device(device)
    base = MG2_FULL_SEQUENCE if dev.type == "cuda" else TINY_FULL_SEQUENCE
    f = frames or base["frames"]
    s = frame_seqlen or base["frame_seqlen"]
    h, d = heads or base["heads"], head_dim or base["head_dim"]
    dt = _resolve_dtype(dtype, "bf16" if dev.type == "cuda" else "fp32")
    key = _dtype_name(dt)
    n = f * s
    gen = torch.Generator(dev).manual_seed(seed)
    q, k, v = (torch.randn(1, n, h, d, generator=gen, device=dev, dtype=torch.float32).to(dt) for _ in range(3))

    def dense():
        fm = attn.block_causal_frame_mask(f, frames_per_block, window, dev)
        return fm.repeat_interleave(s, 0).repeat_interleave(s, 1)  # [L, L], as the DiT's full-sequence forward

    dense_ms = time_once(dense, dev)
    mask = dense()
    density = float(mask.float().mean())
    gflop = 4 * h * n * n * d / 1e9  # dense QK^T + PV
    ref = _reference(q, k, v, mask)
    common = {"frames": f, "tokens": n, "heads": h, "head_dim": d, "frames_per_block": frames_per_block,
              "window": window, "mask_density": density, "dtype": key, "device": str(dev)}

    def row(method, fn, build_ms, bm=None, kernel="", check=True):
        r = {"method": method, "mask_build_ms": build_ms, "kernel": kernel,
             "block_density": _block_density(bm) if bm is not None else math.nan}
        try:
            out = fn()
            chk = compare(out, ref, dtype=key) if check else None
            del out
            t = time_fn(fn, warmup=warmup, repeats=repeats, device=dev)
        except (attn.AttentionBackendError, RuntimeError) as e:
            return {**r, "status": "unsupported", "reason": _short_error(e), **common}
        return {**r, "status": "ok" if chk is None or chk.passed else "out of tolerance", "reason": "",
                "ms_median": t.median, "ms_p20": t.p20, "ms_p80": t.p80, "dense_tflop_s": gflop / t.median,
                "useful_tflop_s": gflop * density / t.median, "max_rel": chk.max_rel if chk else math.nan,
                "mean_rel": chk.mean_rel if chk else math.nan, **common}

    rows = [row("sdpa + dense mask", lambda: attn._auto(q, k, v, mask), dense_ms,
                kernel=auto_kernel(q, k, v, mask)[0])]
    frame_args = (f, frames_per_block, window, s, f, dev)
    bm_ms = time_once(lambda: attn._frame_block_mask.__wrapped__(*frame_args), dev)  # uncached build
    bm = attn.block_causal_block_mask(f, frames_per_block, window, s, dev)
    with attn.attention_backend("flex"):
        rows.append(row("flex + BlockMask (frame arithmetic)", lambda: attn.attention(q, k, v, bm), bm_ms, bm, "flex"))
        bm_dense_ms = time_once(lambda: attn.block_mask_from_dense(mask), dev)
        bm_dense = attn.block_mask_from_dense(mask)
        rows.append(row("flex + BlockMask (from dense mask)", lambda: attn.attention(q, k, v, bm_dense),
                        dense_ms + bm_dense_ms, bm_dense, "flex"))
    rows.append(row("sdpa, no mask (all tokens)", lambda: attn._auto(q, k, v, None), 0.0,
                    kernel=auto_kernel(q, k, v, None)[0], check=False))
    cols = ["method", "status", "ms_median", "ms_p20", "ms_p80", "dense_tflop_s", "useful_tflop_s", "mask_density",
            "block_density", "mask_build_ms", "max_rel", "mean_rel", "kernel", "reason", "frames", "tokens",
            "heads", "head_dim", "frames_per_block", "window", "dtype", "device"]
    return pd.DataFrame(rows).reindex(columns=cols)
