"""The one attention entry point of the reference models, and the process-wide switch of its backend.

`auto` is the reference: one plain SDPA call, PyTorch picks the kernel. The other backends are named
transforms applied from outside (`set_attention_backend("flex")`, or `with attention_backend("math"):`):
  math / efficient / flash / cudnn  SDPA restricted to that kernel with `sdpa_kernel([SDPBackend.X])`
  flex                              FlexAttention (compiled once on CUDA); masks become cached BlockMasks
  flash_attn                        the flash-attn package's `flash_attn_func` (no masks)
  sage                              SageAttention 1 (the `sageattention` package: Triton kernels, Q and K in int8 per
                                    block, P.V in fp16; CUDA only). It takes no mask, head dims 64/96/128 only and
                                    (a bug of its 1.0.6) key lengths that are multiples of 64 only: the other calls
                                    keep SDPA, counted by `sage_call_counts()`
  triton                            wmbook's own Triton flash-attention kernel (`wmbook.kernels.block_attention`: a
                                    block of queries over a window of keys, online softmax) for unmasked calls; masked
                                    calls keep SDPA, counted by `triton_call_counts()`
"""

from __future__ import annotations

import collections
import contextlib
import functools
import re
import warnings

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.flex_attention import BlockMask, create_block_mask, flex_attention

ATTENTION_BACKENDS = ("auto", "math", "efficient", "flash", "cudnn", "flex", "flash_attn", "sage", "triton")
_SDPA_KERNELS = {"math": SDPBackend.MATH, "efficient": SDPBackend.EFFICIENT_ATTENTION,
                 "flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}

_BACKEND = "auto"
_RUN = None  # None: `auto`; else run(q, k, v, mask) of the selected backend (wrapped by any observers)
_OBSERVERS: list = []


class AttentionBackendError(RuntimeError):
    """The selected attention backend cannot run here, or not on this shape/dtype/mask."""


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Scaled dot-product attention on [B, L, H, D] tensors.

    mask: bool, True = attend, broadcastable to [B, H, Lq, Lk]: [Lq, Lk] (block-causal frames) or
    [B, 1, 1, Lk] (a per-sample key mask, as the WMA action cross-attention passes). Every backend
    accepts both (flash_attn: no mask); the flex backend also takes a BlockMask.
    """
    if q.shape[0] > MAX_SDPA_BATCH:
        return _batch_chunked(q, k, v, mask)
    run = _RUN  # the one global lookup `auto` pays
    if run is None:
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask)
        return out.transpose(1, 2)
    return run(q, k, v, mask)


# CUDA attention kernels put the batch on a grid dimension limited to 65535 blocks: a larger batch fails with
# "CUDA error: invalid argument" (seen on the H100 training world-wma at batch 256: its temporal attention runs over
# 256 samples x 16 x 16 latent positions = 65536 sequences). Larger batches are split into calls of at most this many.
MAX_SDPA_BATCH = 65535


def _batch_chunked(q, k, v, mask):
    n = q.shape[0]
    per_sample = mask is not None and not isinstance(mask, BlockMask) and mask.dim() == 4 and mask.shape[0] == n
    outs = []
    for i in range(0, n, MAX_SDPA_BATCH):
        j = min(i + MAX_SDPA_BATCH, n)
        outs.append(attention(q[i:j], k[i:j] if k.shape[0] == n else k, v[i:j] if v.shape[0] == n else v,
                              mask[i:j] if per_sample else mask))
    return torch.cat(outs)


def small_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    mask: torch.Tensor | None = None) -> torch.Tensor:
    """Attention for tiny sequences as broadcast multiply + reduce, in fp32: q [..., Lq, H, D], k/v [..., Lk, H, D]
    with leading dims that broadcast (k/v shared by many query rows need no expanded copy); mask bool [Lq, Lk],
    True = attend. Returns [..., Lq, H, D] in q's dtype.

    For the Matrix-Game-2 action modules (3 query frames, <= 6 key frames, per spatial location): an SDPA
    kernel pads each of the 880 x 16 (location, head) problems to a full 64 x 128 tile, so it computes ~400x
    the useful FLOPs; written out like this, torch.compile fuses it into a few memory-bound kernels. Eager it
    materializes [..., Lq, Lk, H, D] products: meant for compiled code and Lq * Lk in the tens.
    """
    scale = q.shape[-1] ** -0.5
    s = (q.float().unsqueeze(-3) * k.float().unsqueeze(-4)).sum(-1) * scale  # [..., Lq, Lk, H]
    if mask is not None:
        s = s.masked_fill(~mask[..., None], float("-inf"))
    p = s.softmax(dim=-2)
    return (p.unsqueeze(-1) * v.float().unsqueeze(-4)).sum(-3).to(q.dtype)  # [..., Lq, H, D]


def _auto(q, k, v, mask):
    return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                          attn_mask=mask).transpose(1, 2)


def describe_call(q, k, v, mask=None) -> str:
    """One line naming the shapes, dtype, device and mask of an attention call (for error messages)."""
    if mask is None:
        m = "no mask"
    elif isinstance(mask, BlockMask):
        m = f"BlockMask{list(mask.shape)}"
    else:
        m = f"mask {str(mask.dtype).replace('torch.', '')}{list(mask.shape)}"
    return (f"q {list(q.shape)}, k {list(k.shape)}, v {list(v.shape)} [B, L, H, D], "
            f"{str(q.dtype).replace('torch.', '')} on {q.device}, {m}")


# --- backend switch ----------------------------------------------------------------------------------------


def get_attention_backend() -> str:
    """Name of the backend every attention() call uses now."""
    return _BACKEND


def set_attention_backend(name: str) -> None:
    """Select the attention backend for the whole process (one of ATTENTION_BACKENDS).

    Raises ValueError for an unknown name, AttentionBackendError when this process can never run it
    (flash_attn not installed; efficient/cudnn without CUDA). Shape- or dtype-specific limits surface at
    the first call, naming the backend and the shape.
    """
    if name not in ATTENTION_BACKENDS:
        raise ValueError(f"unknown attention backend {name!r}; choose one of {', '.join(ATTENTION_BACKENDS)}")
    _check_available(name)
    _select(name)


@contextlib.contextmanager
def attention_backend(name: str):
    """Use backend `name` inside the block; the previous backend is restored on exit."""
    prev = _BACKEND
    set_attention_backend(name)
    try:
        yield name
    finally:
        _select(prev)


@contextlib.contextmanager
def observe_attention(callback):
    """Call callback(q, k, v, mask) before every attention() call inside the block (shape recording)."""
    _OBSERVERS.append(callback)
    _rebuild()
    try:
        yield
    finally:
        _OBSERVERS.remove(callback)
        _rebuild()


def _select(name: str) -> None:
    global _BACKEND
    _BACKEND = name
    _rebuild()


def _rebuild() -> None:
    global _RUN
    run = _runner(_BACKEND)
    if _OBSERVERS:
        inner, observers = run or _auto, tuple(_OBSERVERS)

        def observed(q, k, v, mask):
            for fn in observers:
                fn(q, k, v, mask)
            return inner(q, k, v, mask)

        run = observed
    _RUN = run


def _check_available(name: str) -> None:
    if name == "flash_attn":
        _flash_attn_func()
    elif name == "sage":
        _sage_func()
    elif name == "triton":
        from ..kernels import runs_triton  # noqa: PLC0415  the kernels import this module's callers

        if not (torch.cuda.is_available() or runs_triton("cpu")):
            raise AttentionBackendError("attention backend 'triton' needs a CUDA device, or Triton's CPU interpreter "
                                        "(TRITON_INTERPRET=1 before triton is imported) on a CPU")
    elif name in ("efficient", "cudnn") and not torch.cuda.is_available():
        raise AttentionBackendError(f"attention backend {name!r} needs CUDA and this process has no CUDA device "
                                    "(on CPU, SDPA runs 'math' and 'flash')")
    elif name == "cudnn" and not torch.backends.cudnn.is_available():
        raise AttentionBackendError("attention backend 'cudnn' needs cuDNN, which this PyTorch build does not have")


def _runner(name: str):
    if name == "auto":
        return None
    if name in _SDPA_KERNELS:
        return functools.partial(_sdpa_only, name)
    return {"flex": _flex, "flash_attn": _flash_attn, "sage": _sage, "triton": _triton}[name]


# --- SDPA restricted to one kernel -------------------------------------------------------------------------


_TRIGGERED = re.compile(r"\(Triggered internally at [^)]*\)")


def _sdpa_only(name, q, k, v, mask):
    try:
        with sdpa_kernel([_SDPA_KERNELS[name]]):
            return _auto(q, k, v, mask)
    except RuntimeError as e:
        reasons = []
        if "No available kernel" in str(e) or "No viable backend" in str(e):
            # SDPA says why it skipped each kernel in warnings: run once more to collect them
            with warnings.catch_warnings(record=True) as caught, sdpa_kernel([_SDPA_KERNELS[name]]):
                warnings.simplefilter("always")
                with contextlib.suppress(RuntimeError):
                    _auto(q, k, v, mask)
            reasons = list(dict.fromkeys(" ".join(_TRIGGERED.sub("", str(w.message)).split()) for w in caught))
        raise AttentionBackendError(f"attention backend {name!r} cannot run {describe_call(q, k, v, mask)}: "
                                    f"{' '.join(reasons) or _first_line(e)}") from e


# --- FlexAttention -----------------------------------------------------------------------------------------

_BLOCK_MASK_CACHE: collections.OrderedDict = collections.OrderedDict()
_BLOCK_MASK_CACHE_SIZE = 32


@functools.lru_cache(maxsize=1)
def _compiled_flex():
    return torch.compile(flex_attention)


def _flex(q, k, v, mask):
    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [B, H, L, D]
    if torch.compiler.is_compiling():  # inside a compiled model: let it trace flex (pass a BlockMask there)
        return flex_attention(qt, kt, vt, block_mask=mask).transpose(1, 2)
    try:
        if mask is not None and not isinstance(mask, BlockMask):
            mask = _cached_block_mask(mask, q.shape[1], k.shape[1])
        if q.device.type == "cuda":
            out = _compiled_flex()(qt, kt, vt, block_mask=mask)
        else:  # eager flex materializes the scores: a reference, fine at CPU test shapes
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message=".*flex_attention called without torch.compile")
                out = flex_attention(qt, kt, vt, block_mask=mask)
    except Exception as e:
        raise AttentionBackendError(f"attention backend 'flex' cannot run {describe_call(q, k, v, mask)}: "
                                    f"{type(e).__name__}: {_first_line(e)}") from e
    return out.transpose(1, 2)


def _first_line(e: Exception) -> str:
    s = str(e).strip()
    return s.splitlines()[0] if s else ""


def _cached_block_mask(mask: torch.Tensor, q_len: int, kv_len: int) -> BlockMask:
    # keyed by identity (+ in-place version): the entry holds the mask, so its id is not reused while cached
    try:
        version = mask._version
    except RuntimeError:  # inference tensors have no version counter (and cannot be changed in place)
        version = -1
    key = (id(mask), version, tuple(mask.shape), q_len, kv_len)
    hit = _BLOCK_MASK_CACHE.get(key)
    if hit is not None:
        _BLOCK_MASK_CACHE.move_to_end(key)
        return hit[1]
    bm = block_mask_from_dense(mask, q_len, kv_len)
    _BLOCK_MASK_CACHE[key] = (mask, bm)
    if len(_BLOCK_MASK_CACHE) > _BLOCK_MASK_CACHE_SIZE:
        _BLOCK_MASK_CACHE.popitem(last=False)
    return bm


def block_mask_from_dense(mask: torch.Tensor, q_len: int | None = None, kv_len: int | None = None) -> BlockMask:
    """BlockMask whose mask_mod reads a bool mask broadcastable to [B, H, Lq, Lk] (True = attend).

    [Lq, Lk] frame masks and [B, 1, 1, Lk] key masks both work; q_len/kv_len give the sizes of broadcast dims.
    """
    if mask.dtype != torch.bool:
        raise TypeError(f"block_mask_from_dense needs a bool mask (True = attend), got {mask.dtype}")
    if not 1 <= mask.dim() <= 4:
        raise ValueError(f"mask must have 1 to 4 dims broadcastable to [B, H, Lq, Lk], got shape {list(mask.shape)}")
    m = mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape)).contiguous()  # [Bm, Hm, Qm, Km]
    bm, hm, qm, km = m.shape
    q_len, kv_len = q_len or qm, kv_len or km
    if qm not in (1, q_len) or km not in (1, kv_len):
        raise ValueError(f"mask shape {list(mask.shape)} does not broadcast to Lq={q_len}, Lk={kv_len}")
    flat = m.reshape(-1)
    # element strides of the contiguous [Bm, Hm, Qm, Km] mask, 0 along broadcast dims
    sb, sh, sq, sk = (hm * qm * km if bm > 1 else 0), (qm * km if hm > 1 else 0), (km if qm > 1 else 0), int(km > 1)

    def mask_mod(b, h, q_idx, kv_idx):
        return flat[b * sb + h * sh + q_idx * sq + kv_idx * sk]

    return create_block_mask(mask_mod, bm if bm > 1 else None, hm if hm > 1 else None, q_len, kv_len,
                             device=mask.device)


@functools.lru_cache(maxsize=16)
def _frame_block_mask(num_frames, frames_per_block, window, frame_seqlen, num_key_frames, device):
    def mask_mod(b, h, q_idx, kv_idx):
        fq, fk = q_idx // frame_seqlen, kv_idx // frame_seqlen
        end = (fq // frames_per_block + 1) * frames_per_block  # exclusive end frame of the query's block
        ok = fk < end
        return ok & (fk >= end - window) if window != -1 else ok

    return create_block_mask(mask_mod, None, None, num_frames * frame_seqlen, num_key_frames * frame_seqlen,
                             device=device)


def block_causal_block_mask(num_frames: int, frames_per_block: int, window: int, frame_seqlen: int, device=None,
                            num_key_frames: int | None = None) -> BlockMask:
    """BlockMask of the token-level block-causal windowed mask, from frame arithmetic (no dense [L, L] mask).

    Equals `block_causal_frame_mask(...)` repeated `frame_seqlen` times along both axes. Cached by arguments.
    """
    device = torch.device(device) if device is not None else torch.get_default_device()
    nk = num_frames if num_key_frames is None else num_key_frames
    return _frame_block_mask(num_frames, frames_per_block, window, frame_seqlen, nk, device)


# --- flash-attn package ------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def _flash_attn_func():
    try:
        from flash_attn import flash_attn_func  # noqa: PLC0415  optional: flash-attn
    except Exception as e:  # not installed, or built against another torch/CUDA
        raise AttentionBackendError(f"attention backend 'flash_attn' needs the flash-attn package "
                                    f"(pip install flash-attn): {type(e).__name__}: {e}") from e
    return flash_attn_func


def _flash_attn(q, k, v, mask):
    if mask is not None:
        raise AttentionBackendError("attention backend 'flash_attn' takes no attention mask: "
                                    f"{describe_call(q, k, v, mask)}; "
                                    "use 'flex' or an SDPA backend for masked calls")
    fn = _flash_attn_func()
    try:
        return fn(q, k, v)  # [B, L, H, D] is flash-attn's own layout
    except Exception as e:
        raise AttentionBackendError(f"attention backend 'flash_attn' cannot run {describe_call(q, k, v, mask)}: "
                                    f"{type(e).__name__}: {e}") from e


# --- SageAttention ------------------------------------------------------------------------------------------

SAGE_HEAD_DIMS = (64, 96, 128)
# sageattention 1.0.6 loads the keys of its last, partial 64-key block as zeros without masking their scores: each
# padded key gets score 0 and inflates the softmax denominator (found on the H100: 0.70 relative error on a tiny DiT
# whose 48 keys are one partial block). Only key lengths that fill whole blocks go to it; the rest keep SDPA.
SAGE_KV_BLOCK = 64
_SAGE_CALLS: collections.Counter = collections.Counter()


@functools.lru_cache(maxsize=1)
def _sage_func():
    if not torch.cuda.is_available():
        raise AttentionBackendError("attention backend 'sage' needs a CUDA device (SageAttention's kernels are Triton "
                                    "kernels for NVIDIA GPUs) and this process has none")
    try:
        from sageattention import sageattn  # noqa: PLC0415  optional: sageattention
    except Exception as e:  # not installed, or a triton it does not work with
        raise AttentionBackendError(f"attention backend 'sage' needs the sageattention package (pip install "
                                    f"sageattention; the `quant-attn` extra): {type(e).__name__}: {e}") from e
    return sageattn


def _count_sage(route: str) -> None:
    # not inside a compiled region: reading the counter there made dynamo guard on its value, so every call recompiled
    # until the recompile limit (64) and the block then ran eager (at mg2-universal on an H100: 219 ms a forward
    # against 59 ms). Dynamo's reorderable logging functions would keep the count, but it drops
    # them when called from an inlined function (torch 2.11-2.13), as this one is
    if not torch.compiler.is_compiling():
        _SAGE_CALLS[route] += 1


def sage_call_counts() -> dict[str, int]:
    """How the attention() calls under the 'sage' backend ran since the last reset: 'sage', or 'sdpa (mask)' /
    'sdpa (head_dim D)' for the calls SageAttention cannot take. Calls inside compiled regions are not counted; they
    take the same routes, which depend on the shapes alone (`sage_route`)."""
    return dict(_SAGE_CALLS)


def reset_sage_call_counts() -> None:
    _SAGE_CALLS.clear()


def sage_route(head_dim: int, kv_len: int, masked: bool = False) -> str:
    """Where the 'sage' backend sends a call: 'sage', or 'sdpa (why)' when SageAttention cannot take it."""
    why = ("mask" if masked else f"head_dim {head_dim}" if head_dim not in SAGE_HEAD_DIMS
           else f"kv_len {kv_len} % {SAGE_KV_BLOCK}" if kv_len % SAGE_KV_BLOCK else None)
    return "sage" if why is None else f"sdpa ({why})"


def _sage(q, k, v, mask):
    route = sage_route(q.shape[-1], k.shape[1], mask is not None)
    _count_sage(route)
    if route != "sage":
        return _auto(q, k, v, mask)
    fn = _sage_func()
    # K smoothed here, out of place: sageattn's own smooth_k subtracts the mean from k in place, which would rewrite
    # the KV cache k is a view of (the softmax is unchanged: q . mean(k) is the same for every key of a query)
    k = k - k.mean(dim=1, keepdim=True)
    try:
        return fn(q.contiguous(), k.contiguous(), v.contiguous(), tensor_layout="NHD", is_causal=False,
                  smooth_k=False)
    except Exception as e:
        raise AttentionBackendError(f"attention backend 'sage' cannot run {describe_call(q, k, v, mask)}: "
                                    f"{type(e).__name__}: {_first_line(e)}") from e


# --- wmbook's Triton attention ------------------------------------------------------------------------------

_TRITON_CALLS: collections.Counter = collections.Counter()


def _block_attention():
    from ..kernels import block_attention  # noqa: PLC0415  heavy: triton (imported at the backend's first call)

    return block_attention


def triton_route(q, k, v, mask=None) -> str:
    """Where the 'triton' backend sends a call: 'triton', or 'sdpa (why)' when the kernel cannot take it."""
    if mask is not None:
        return "sdpa (mask)"
    return "triton" if _block_attention().supported(q, k, v) else "sdpa (shape, dtype or strides)"


def triton_call_counts() -> dict[str, int]:
    """How the attention() calls under the 'triton' backend ran since the last reset (outside compiled regions; the
    routes depend on the shapes alone, `triton_route`)."""
    return dict(_TRITON_CALLS)


def reset_triton_call_counts() -> None:
    _TRITON_CALLS.clear()


def _triton(q, k, v, mask):
    route = triton_route(q, k, v, mask)
    if not torch.compiler.is_compiling():  # a counter read in a compiled region makes dynamo guard on it (_count_sage)
        _TRITON_CALLS[route] += 1
    if route != "triton":
        return _auto(q, k, v, mask)
    return _block_attention().block_attention_op(q, k, v)


# --- masks -------------------------------------------------------------------------------------------------


def block_causal_frame_mask(num_frames: int, frames_per_block: int, window: int, device=None,
                            num_key_frames: int | None = None) -> torch.Tensor:
    """[F, F] bool: query frame i sees key frame j iff j is before the end of i's block and, with a
    window (in frames, -1 = none), no more than `window` frames before that end."""
    fq = torch.arange(num_frames, device=device)
    fk = torch.arange(num_frames if num_key_frames is None else num_key_frames, device=device)
    end = (fq // frames_per_block + 1) * frames_per_block  # exclusive end of the query's block
    allowed = fk[None, :] < end[:, None]
    if window != -1:
        allowed &= fk[None, :] >= (end[:, None] - window)
    return allowed
