"""Environment facts and measured device ceilings (GEMM TFLOP/s, copy GB/s), cached as JSON."""

from __future__ import annotations

import datetime as _dt
import json
import os
import re
from pathlib import Path

import torch
import torch.nn.functional as F

from . import bench, results
from .atomic import atomic_open
from .paths import CEILINGS_DIR
from .presets import DTYPES, dtype_name

GPU_CACHE_DIR = CEILINGS_DIR  # committed with the repo
CPU_CACHE_DIR = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "wmbook" / "ceilings"



def environment(device=None) -> dict:
    """results.environment_metadata() plus CPU count, host memory and GPU facts."""
    env = results.environment_metadata()
    env["cpu_count"] = os.cpu_count()
    try:
        import psutil  # noqa: PLC0415  optional: psutil

        env["memory_total_gb"] = psutil.virtual_memory().total / 1e9
    except Exception:  # psutil missing
        env["memory_total_gb"] = None
    dev = bench.resolve_device(device)
    if dev.type == "cuda":
        props = torch.cuda.get_device_properties(dev)
        env["device_name"] = props.name
        env["gpu_total_memory_gb"] = props.total_memory / 1e9
        env["sm_count"] = props.multi_processor_count
        env["compute_capability"] = f"{props.major}.{props.minor}"
    else:
        env["gpu_total_memory_gb"] = None
        env["sm_count"] = None
        env["compute_capability"] = None
    env["cudnn"] = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    return env


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-").lower()


def _gemm_tflops(n: int, dtype: torch.dtype, device: torch.device, warmup: int, repeats: int) -> float:
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    t = bench.time_fn(lambda: torch.matmul(a, b), warmup=warmup, repeats=repeats, device=device)
    return 2.0 * n**3 / (t.median * 1e-3) / 1e12


def _copy_gbps(nbytes: int, device: torch.device, warmup: int, repeats: int) -> float:
    src = torch.empty(nbytes // 4, device=device, dtype=torch.float32).uniform_()
    dst = torch.empty_like(src)
    t = bench.time_fn(lambda: dst.copy_(src), warmup=warmup, repeats=repeats, device=device)
    return 2.0 * src.numel() * 4 / (t.median * 1e-3) / 1e9  # read + write bytes


def _sdpa_tflops(b: int, h: int, s: int, d: int, dtype, device, warmup: int, repeats: int) -> float:
    q, k, v = (torch.randn(b, h, s, d, device=device, dtype=dtype) for _ in range(3))
    t = bench.time_fn(
        lambda: F.scaled_dot_product_attention(q, k, v), warmup=warmup, repeats=repeats, device=device
    )
    return 4.0 * b * h * s * s * d / (t.median * 1e-3) / 1e12  # QK^T and PV, non-causal


def _cache_file(cache_path, device_kind: str, slug: str) -> Path:
    if cache_path is not None:
        p = Path(cache_path)
        return p if p.suffix == ".json" else p / f"{slug}.json"
    return (GPU_CACHE_DIR if device_kind == "cuda" else CPU_CACHE_DIR) / f"{slug}.json"


def _write_json_atomic(path: Path, data: dict) -> None:
    with atomic_open(path, "w") as f:
        json.dump(data, f, indent=2, sort_keys=True)
        f.write("\n")


def measure_ceilings(
    device=None,
    *,
    dtype: torch.dtype = torch.bfloat16,
    refresh: bool = False,
    cache_path=None,
    quick: bool = False,
    extended: bool = False,
) -> dict:
    """Measured GEMM TFLOP/s and copy GB/s on `device`, cached per (device, torch, dtype).

    cuda: `dtype` n^3 matmul (n=8192, quick 4096), copy of a 1 GiB fp32 tensor (quick 256 MiB);
    extended=True adds fp32 / tf32 GEMM and bf16 SDPA. cpu: fp32 matmul n=1024 (quick 512),
    64 MiB copy (quick 16 MiB). Copy GB/s counts bytes read + written.
    Cache: cuda -> <repo>/data/ceilings/<slug>.json, cpu -> ~/.cache/wmbook/ceilings/;
    cache_path (a .json file or a directory) overrides. refresh=True re-measures.
    """
    if dtype not in DTYPES.values():
        raise ValueError(f"dtype must be one of {list(DTYPES.values())}, got {dtype!r}")
    dev = bench.resolve_device(device)
    if dev.type not in ("cuda", "cpu"):
        raise ValueError(f"device must be a cuda or cpu device, got {dev}")
    if dev.type == "cuda":
        name = torch.cuda.get_device_name(dev)
        gemm_dtype = dtype
    else:
        name = results.environment_metadata()["device_name"]
        gemm_dtype = torch.float32  # low-precision GEMM on CPU says nothing useful
    dname = dtype_name(gemm_dtype)
    slug = _slug(f"{name}-torch{torch.__version__}-{dname}" + ("-quick" if quick else ""))
    path = _cache_file(cache_path, dev.type, slug)
    if path.exists() and not refresh:
        with open(path) as f:
            cached = json.load(f)
        if not extended or "sdpa_tflops" in cached:
            return cached

    if dev.type == "cuda":
        n = 4096 if quick else 8192
        copy_bytes = (256 if quick else 1024) * 2**20
        warmup, repeats = (3, 10) if quick else (5, 20)
    else:
        n = 512 if quick else 1024
        copy_bytes = (16 if quick else 64) * 2**20
        warmup, repeats = (1, 3) if quick else (2, 5)

    out = {
        "device_name": name,
        "device_kind": dev.type,
        "torch": torch.__version__,
        "dtype": dname,
        "quick": quick,
        "gemm_tflops": _gemm_tflops(n, gemm_dtype, dev, warmup, repeats),
        "copy_gbps": _copy_gbps(copy_bytes, dev, warmup, repeats),
        "shapes": {"gemm": [n, n, n], "copy_bytes": copy_bytes},
        "warmup": warmup,
        "repeats": repeats,
    }
    if extended and dev.type == "cuda":
        old_tf32 = torch.backends.cuda.matmul.allow_tf32
        try:
            torch.backends.cuda.matmul.allow_tf32 = False
            out["gemm_tflops_fp32"] = _gemm_tflops(n, torch.float32, dev, warmup, repeats)
            torch.backends.cuda.matmul.allow_tf32 = True
            out["gemm_tflops_tf32"] = _gemm_tflops(n, torch.float32, dev, warmup, repeats)
        finally:
            torch.backends.cuda.matmul.allow_tf32 = old_tf32
        b, h, s, d = (1, 16, 4096, 128) if quick else (2, 16, 8192, 128)
        out["sdpa_tflops"] = _sdpa_tflops(b, h, s, d, torch.bfloat16, dev, warmup, repeats)
        out["shapes"]["sdpa_bhsd"] = [b, h, s, d]
    elif extended:
        out["sdpa_tflops"] = None  # not measured on CPU
    out["measured_at"] = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    _write_json_atomic(path, out)
    return out


def _positive(ceilings: dict, key: str) -> float:
    v = ceilings.get(key) if isinstance(ceilings, dict) else None
    if not isinstance(v, (int, float)) or v <= 0:
        raise ValueError(f"ceilings[{key!r}] must be a positive number (from measure_ceilings), got {v!r}")
    return float(v)


def floor_ms(flops: float, ceilings: dict) -> float:
    """Lower bound in ms for `flops` at the measured GEMM ceiling."""
    return flops / (_positive(ceilings, "gemm_tflops") * 1e12) * 1e3
