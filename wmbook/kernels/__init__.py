"""Fused Triton kernels for the glue that compile leaves on the table (notebook 05). Inference only: no backward.

One idea per file, each file the same contract (the Triton tutorials' layout, STYLE.md):

    _name_kernel   the @triton.jit kernel (pointer arguments commented inline)
    name(...)      the launcher: checks shapes and dtypes, owns the grid and the block sizes, returns a new tensor
    name_ref(...)  the same function in plain torch, fp32 statistics: what the kernel is tested against
    name_bytes(...) the fewest bytes the op must move (each input read once, the output written once): GB/s
    OP             the torch.library op `wmbook::name` (define_op: a triton_op where kernels compile, so torch.compile
                   sees the kernel launches and calls them from its own code; a custom_op under the interpreter; a
                   fake implementation registered with it either way; checked with torch.library.opcheck)

Nothing runs at import. Where the kernels run: on a CUDA device; on a CPU only under the Triton interpreter
(TRITON_INTERPRET=1, set before triton is imported: tests and the tiny notebooks do that), otherwise the custom
op falls back to the reference (`runs_triton` says which). Triton is optional: without it every op is its reference.
"""

from __future__ import annotations

import os

import torch


def triton_available() -> bool:
    try:
        import triton  # noqa: F401, PLC0415  optional: triton
    except ImportError:
        return False
    return True


def interpreting() -> bool:
    """Whether Triton runs kernels in its CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def runs_triton(device: torch.device | str) -> bool:
    """Whether a kernel launch on `device` runs the Triton kernel (CUDA, or the CPU under the interpreter)."""
    dev = torch.device(device)
    return triton_available() and (dev.type == "cuda" or (dev.type == "cpu" and interpreting()))


def next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def is_channels_last(x: torch.Tensor) -> bool:
    """Whether x is channels-last (and not also channels-first: a tensor that is both is read as channels-first)."""
    if x.is_contiguous() or x.dim() not in (4, 5):
        return False
    return x.is_contiguous(memory_format=torch.channels_last if x.dim() == 4 else torch.channels_last_3d)


def modulation_frames(x: torch.Tensor, **modulation: torch.Tensor) -> int:
    """The number of frames F of a DiT's per-frame modulation, after checking x [B, L, C] and every modulation
    tensor [B, F, (1,) C] (one F for all of them, F dividing L) and their dtypes; ValueErrors name the tensor."""
    if x.dim() != 3:
        raise ValueError(f"x must be [B, L, C], got {tuple(x.shape)}")
    check_dtype("x", x)
    b, n, c = x.shape
    first = next(iter(modulation.values()))
    f = first.numel() // max(1, b * c)
    names = ", ".join(modulation)
    for name, t in modulation.items():
        check_dtype(name, t)
        if (t.dim() not in (3, 4) or t.shape[0] != b or t.shape[-1] != c or t.numel() != b * f * c or f < 1
                or n % f or (t.dim() == 4 and t.shape[2] != 1)):
            raise ValueError(f"{name} must be [B, F, (1,) C] with F dividing L (one F for {names}); got "
                             f"{tuple(t.shape)} for x {tuple(x.shape)}")
    return f


def modulation_strides(b: int, f: int, c: int, *mods: torch.Tensor) -> tuple[tuple[torch.Tensor, ...], int, int]:
    """The modulation tensors ([B, F, (1,) C], checked by modulation_frames) as the kernels read them, without a copy
    where they can: (tensors, batch stride, frame stride) in elements, channels at stride 1. The DiT's six modulation
    tensors are chunks of one [B, F, 6, C] sum (frame stride 6C): read in place, not copied to [B * F, C] first (a
    copy kernel per tensor per block); a modulation expanded over batch and frames has strides 0. Tensors whose
    channels are not contiguous, or whose strides differ from the others', are made contiguous (all of them)."""
    views = [t.reshape(b, f, c) if t.dim() == 4 else t for t in mods]  # [B, F, 1, C] -> [B, F, C]: a view
    s0 = views[0].stride()
    if all(v.stride() == s0 for v in views) and s0[2] == 1:
        return tuple(views), s0[0], s0[1]
    views = [v.contiguous() for v in views]
    return tuple(views), f * c, c


def check_rows(rows: int, block: int) -> None:
    """A row kernel's rows per program: a power of two of at most 64, and at most 32768 elements in one block."""
    if isinstance(rows, bool) or not isinstance(rows, int) or rows < 1 or rows > 64 or rows & (rows - 1):
        raise ValueError(f"rows={rows!r} is not allowed; allowed values: 1, 2, 4, 8, 16, 32, 64")
    if rows * block > 32768:
        raise ValueError(f"rows={rows} x a block of {block} channels = {rows * block} elements in one program; "
                         f"allowed: at most 32768 (rows <= {max(1, 32768 // block)} here)")


def row_warps(block: int, rows: int = 1) -> int:
    """Warps of a row kernel's program: 4 up to 2048 elements, 8 above (the one-row default since notebook 05)."""
    return 4 if block * rows <= 2048 else 8


def uses_triton_op() -> bool:
    """Whether the kernels' ops are torch.library.triton_op (Triton present, not the interpreter, and not turned off
    with WMBOOK_TRITON_OP=0) rather than custom_op. A custom_op is opaque to torch.compile: every call goes through
    the dispatcher, the Python launcher and Triton's binder (on the H100, notebook 05, mg2-universal, 665a961: 136
    more launches per forward made the compiled forward 71.8 ms instead of 39.6 with less GPU time, about 0.24 ms
    each). A triton_op is traced into: inductor launches the kernel from its generated code. The interpreter cannot
    run a kernel on fake tensors, so it keeps the custom_op."""
    return triton_available() and not interpreting() and os.environ.get("WMBOOK_TRITON_OP", "1") != "0"


_KIND: list[bool] = []  # the kind of op define_op made (decided once, at the first definition), which launch() follows


def _triton_ops() -> bool:
    if not _KIND:
        _KIND.append(uses_triton_op())
    return _KIND[0]


def define_op(name: str):
    """Decorator defining the kernel op `name` (no mutated arguments): triton_op or custom_op (uses_triton_op, decided
    once for every op)."""
    if _triton_ops():
        return torch.library.triton_op(name, mutates_args=())
    return torch.library.custom_op(name, mutates_args=())


def launch(kernel):
    """A @triton.jit kernel as an op's launcher calls it: torch.library.wrap_triton(kernel) when the ops are
    triton_ops, asked at every launch. Under tracing it gives a wrapper that records the launch; in an eager call of
    the op (where torch turns the wrapper off for speed) the kernel itself. Kept from one call for the next, the kernel
    of an eager call was then launched on fake tensors when torch.compile traced the op (the H100 at f07412f: "Cannot
    access data pointer of Tensor" in every model compiled after its fused ops had run eagerly)."""
    return torch.library.wrap_triton(kernel) if _triton_ops() else kernel


def check_dtype(name: str, t: torch.Tensor, allowed=(torch.float32, torch.bfloat16, torch.float16)) -> None:
    if t.dtype not in allowed:
        raise ValueError(f"{name} has dtype {t.dtype}; allowed: {[str(d) for d in allowed]}")


__all__ = ["check_dtype", "check_rows", "define_op", "interpreting", "is_channels_last", "launch", "modulation_frames",
           "modulation_strides", "next_pow2", "row_warps", "runs_triton", "triton_available", "uses_triton_op"]
