"""GroupNorm (affine, fp32 statistics) then SiLU of the UNet's ResBlocks, optionally after adding the time embedding.

Unfused (the reference model, GroupNorm32 then nn.SiLU): the add of the time embedding `h + emb`, an fp32 copy of
h, group_norm, a cast back and the SiLU, each a pass over the [B, C, *S] activation. Fused: two kernels. The first
splits every (batch, group) into chunks and writes the (mean, M2) of each chunk; the second merges its group's
chunks (Chan's parallel variance, all in fp32) and normalizes, scales, shifts and applies SiLU to its chunk. x is
read twice (the second read mostly from L2 on a GPU), the result written once; the add, the fp32 copy and the
intermediate casts never reach memory. Any group size works (a chunk is looped over in blocks), and the groups are
split so that a batch of one with 32 groups still fills the GPU.

Both memory formats: channels-first (contiguous) and channels-last (torch.channels_last for 4-D,
torch.channels_last_3d for 5-D); the result keeps the input's. Channels-last gets its own three kernels, because a
group is not contiguous there: a position's Cg channels are (e.g. 10 bf16 values, 20 bytes), the next position's
C channels later. Walking a group element by element reads partial sectors and divides by Cg per element (the first
version ran at 0.4x of what inductor makes of the op sequence on the H100). Instead every program loops over dense
[positions, channels] tiles of one span of positions, rows being contiguous runs of whole 128-byte lines: (1)
per-channel (mean, M2) of the span (by default from sums of x - k and (x - k)^2, k the span's first value, reduced
across threads once; or each tile's exact, merged with Chan's formula); (2) one program per (batch,
group) merges its channels' spans into the group's mean and rstd and writes per-channel mean and scale = w * rstd;
(3) y = SiLU((x - mean) * scale + b) over the same tiles. Where the activation is small (the UNet's two lowest
levels with the frames in the batch: a few MB, where the three launches' fixed cost is much of the time), one kernel
does all three: a program per (batch element, block of whole groups) walks all positions for the channels' shifted
sums, merges them per group in registers and applies over the same tiles.

`silu=False` (the op `wmbook::group_norm`) leaves the SiLU out: the video UNet's transformers normalize their input
with a GroupNorm alone, the temporal one over all frames of a sample, where a batch of one gives inductor's fused
norm one program per group.
"""

from __future__ import annotations

import torch

from . import check_dtype, define_op, is_channels_last, launch, next_pow2, runs_triton

try:
    import triton
    import triton.language as tl
except ImportError:  # the custom op falls back to the reference
    triton = None

# the channels-last kernels' tile helpers and the one-launch kernel (taken by _group_norm_silu_cl's size rule)
from .group_norm_cl import _cl_one_plan, _group_norm_silu_cl_one  # noqa: E402

if triton is not None:
    from .group_norm_cl import _cl_add, _cl_load, _cl_program, _cl_tile


# the channels-first launcher's defaults, from tools/gn_sweep.py on the H100
# (data/reports/h100/gn_sweep-wma-68ba953.csv): 2048 / 4096 / 4 warps was best at the wma temporal conv block
# (1x320x16x40x64 bf16: 39.9 us against 50.7 us with 1024 / 1024; compile 43.1 us) and within 0.5 us of the best at
# the SD VAE decoder (1x128x320x512 fp32: 100.4 us against 121.6 us; compile 102.0 us)
_BLOCK = 2048  # elements of a group loaded at once
_TARGET_PROGRAMS = 4096  # programs per launch the launcher splits the groups into chunks to reach
_MAX_CHUNKS = 256  # chunks per group at most: the normalizing kernel merges them in one block


if triton is not None:

    # No helper that takes a pointer returns anything a store's address is computed from: inductor's analysis of
    # user-defined kernels (torch.compile tracing the triton_ops) counts a call's results as derived from all of its
    # arguments, so a store through such an offset marks that pointer written. The normalizing kernel's store through
    # the offset of a load helper made x and add "mutated"; compiling the wma UNet then failed in inductor's scheduler
    # (KeyError 'op282'). tests/test_kernels_inductor_analysis.py checks every kernel.

    @triton.jit
    def _group_offsets(
        b,  # batch element (int64)
        g,  # group
        i,  # [BLOCK] element indices within the group, 0 <= i < Cg * S where masked in
        C,  # channels
        S,  # spatial positions (the product of the dims after C)
        Cg,  # channels per group
        CHANNELS_LAST: tl.constexpr,
    ):
        """Each group element's channel and offset in x (and in the output, which has x's strides)."""
        if CHANNELS_LAST:  # a position's Cg channels are contiguous, positions C apart
            c = g * Cg + i % Cg
            off = b * C * S + (i // Cg) * C + c
        else:  # the group is one contiguous run of Cg * S elements
            c = g * Cg + i // S
            off = b * C * S + g * Cg * S + i
        return c, off

    @triton.jit
    def _group_load(x_ptr, add_ptr, b, c, off, m, C, HAS_ADD: tl.constexpr):
        """x (+ add, rounded to x's dtype like the model's `h + emb`) at the offsets, in fp32, 0 where masked."""
        x = tl.load(x_ptr + off, mask=m, other=0.0)
        if HAS_ADD:
            a = tl.load(add_ptr + b * C + c, mask=m, other=0.0)
            x = (x.to(tl.float32) + a.to(tl.float32)).to(x_ptr.dtype.element_ty)
        return tl.where(m, x.to(tl.float32), 0.0)

    @triton.jit
    def _group_norm_silu_stats_kernel(
        x_ptr,  # [B, C, *S], dense in its memory format
        add_ptr,  # [B, C] contiguous (HAS_ADD), else unused
        part_ptr,  # [B * G, chunks, 2] fp32: (mean, M2) of each chunk of each group
        C,  # channels
        S,  # spatial positions
        G,  # groups
        Cg,  # channels per group
        chunks,  # chunks per group
        HAS_ADD: tl.constexpr,
        CHANNELS_LAST: tl.constexpr,
        BLOCK: tl.constexpr,
        ITERS: tl.constexpr,  # blocks per chunk (a constant: loop bounds stay compile-time)
    ):
        bg = tl.program_id(0)
        chunk = tl.program_id(1)
        b = (bg // G).to(tl.int64)
        g = bg % G
        start = chunk * (ITERS * BLOCK)
        n = Cg * S
        count = 0.0
        mean = 0.0
        m2 = 0.0
        for k in range(ITERS):  # Chan's merge of each block's exact (mean, M2)
            i = start + k * BLOCK + tl.arange(0, BLOCK)
            m = i < n  # the last chunk's blocks past the group's end are empty and change nothing
            c, off = _group_offsets(b, g, i, C, S, Cg, CHANNELS_LAST)
            x = _group_load(x_ptr, add_ptr, b, c, off, m, C, HAS_ADD)
            n_blk = tl.sum(m.to(tl.float32), axis=0)
            mean_blk = tl.sum(x, axis=0) / tl.maximum(n_blk, 1.0)
            d = tl.where(m, x - mean_blk, 0.0)
            m2_blk = tl.sum(d * d, axis=0)
            total = count + n_blk
            delta = mean_blk - mean
            mean = mean + delta * (n_blk / total)
            m2 = m2 + m2_blk + delta * delta * (count * n_blk / total)
            count = total
        tl.store(part_ptr + (bg * chunks + chunk) * 2, mean)
        tl.store(part_ptr + (bg * chunks + chunk) * 2 + 1, m2)

    @triton.jit
    def _group_norm_silu_kernel(
        x_ptr,  # [B, C, *S], dense in its memory format
        add_ptr,  # [B, C] contiguous (HAS_ADD), else unused
        w_ptr,  # [C]: GroupNorm weight
        bias_ptr,  # [C]: GroupNorm bias
        part_ptr,  # [B * G, chunks, 2] fp32: the stats kernel's (mean, M2) of each chunk
        out_ptr,  # like x (same strides), x's dtype
        C,  # channels
        S,  # spatial positions
        G,  # groups
        Cg,  # channels per group
        chunks,  # chunks per group, <= BLOCK_P
        eps,
        HAS_ADD: tl.constexpr,
        CHANNELS_LAST: tl.constexpr,
        BLOCK: tl.constexpr,
        ITERS: tl.constexpr,  # blocks per chunk
        BLOCK_P: tl.constexpr,  # next_pow2(chunks)
        SILU: tl.constexpr = True,  # False: the GroupNorm alone
    ):
        bg = tl.program_id(0)
        chunk = tl.program_id(1)
        b = (bg // G).to(tl.int64)
        g = bg % G
        n = Cg * S
        p = tl.arange(0, BLOCK_P)
        pm = p < chunks
        p_mean = tl.load(part_ptr + (bg * chunks + p) * 2, mask=pm, other=0.0)
        p_m2 = tl.load(part_ptr + (bg * chunks + p) * 2 + 1, mask=pm, other=0.0)
        p_n = tl.where(pm, tl.minimum(ITERS * BLOCK, n - p * (ITERS * BLOCK)), 0).to(tl.float32)
        mean = tl.sum(p_n * p_mean, axis=0) / n
        dm = p_mean - mean
        var = tl.sum(p_m2 + p_n * dm * dm, axis=0) / n  # biased, like group_norm
        rstd = 1.0 / tl.sqrt(var + eps)
        start = chunk * (ITERS * BLOCK)
        for k in range(ITERS):
            i = start + k * BLOCK + tl.arange(0, BLOCK)
            m = i < n
            c, off = _group_offsets(b, g, i, C, S, Cg, CHANNELS_LAST)
            x = _group_load(x_ptr, add_ptr, b, c, off, m, C, HAS_ADD)
            w = tl.load(w_ptr + c, mask=m, other=0.0).to(tl.float32)
            bb = tl.load(bias_ptr + c, mask=m, other=0.0).to(tl.float32)
            y = (x - mean) * rstd * w + bb
            if SILU:
                y = y * tl.sigmoid(y)
            tl.store(out_ptr + off, y.to(out_ptr.dtype.element_ty), mask=m)

    @triton.jit
    def _gn_cl_stats_kernel(
        x_ptr,  # [B, C, *S] channels-last: position-major, C contiguous channels per position
        add_ptr,  # [B, C] contiguous (HAS_ADD), else unused
        part_ptr,  # [B, spans, 2, C] fp32: per-channel (mean, M2) over each span's positions
        C,
        S,
        spans,  # spans of ITERS * BLOCK_S positions per batch element
        HAS_ADD: tl.constexpr,
        BLOCK_S: tl.constexpr,
        BLOCK_C: tl.constexpr,
        ITERS: tl.constexpr,
    ):
        b, span, c = _cl_program(C, spans, BLOCK_C)
        a = _cl_add(add_ptr, b, c, C, HAS_ADD, BLOCK_C)
        count = tl.zeros([BLOCK_C], dtype=tl.float32)
        mean = tl.zeros([BLOCK_C], dtype=tl.float32)
        m2 = tl.zeros([BLOCK_C], dtype=tl.float32)
        for k in range(ITERS):  # each tile's exact (mean, M2) per channel, merged into the span's (Chan)
            m, off, n_pos = _cl_tile(b, span, c, k, C, S, BLOCK_S, ITERS)
            x = _cl_load(x_ptr, a, off, m, HAS_ADD)
            n_blk = n_pos.to(tl.float32)
            mean_blk = tl.sum(x, axis=0) / tl.maximum(n_blk, 1.0)
            d = tl.where(m, x - mean_blk[None, :], 0.0)
            m2_blk = tl.sum(d * d, axis=0)
            total = count + n_blk
            w = n_blk / tl.maximum(total, 1.0)
            delta = mean_blk - mean
            mean = mean + delta * w
            m2 = m2 + m2_blk + delta * delta * count * w
            count = total
        base = part_ptr + ((b * spans + span) * 2) * C
        tl.store(base + c, mean, mask=c < C)
        tl.store(base + C + c, m2, mask=c < C)

    @triton.jit
    def _gn_cl_stats_shifted_kernel(
        x_ptr,  # [B, C, *S] channels-last
        add_ptr,  # [B, C] contiguous (HAS_ADD), else unused
        part_ptr,  # [B, spans, 2, C] fp32: per-channel (mean, M2) over each span's positions, as _gn_cl_stats_kernel
        C,
        S,
        spans,
        HAS_ADD: tl.constexpr,
        BLOCK_S: tl.constexpr,
        BLOCK_C: tl.constexpr,
        ITERS: tl.constexpr,
    ):
        """The span's (mean, M2) from per-element sums of x - k and (x - k)^2, k the span's first position per
        channel: no reduction across threads until the loop ends, so a program's loads are not held up by one per
        tile (the Chan merge per tile of _gn_cl_stats_kernel reduces twice a tile). Shifting by a value of the
        channel keeps the sums' cancellation to the spread of the data around it, not its mean."""
        b, span, c = _cl_program(C, spans, BLOCK_C)
        a = _cl_add(add_ptr, b, c, C, HAS_ADD, BLOCK_C)
        s0 = span * (ITERS * BLOCK_S)  # < S: the launcher makes no empty span
        k0 = tl.load(x_ptr + b * C * S + s0.to(tl.int64) * C + c, mask=c < C, other=0.0)
        if HAS_ADD:
            k0 = (k0.to(tl.float32) + a).to(x_ptr.dtype.element_ty)
        k0 = k0.to(tl.float32)
        s1 = tl.zeros([BLOCK_S, BLOCK_C], dtype=tl.float32)
        s2 = tl.zeros([BLOCK_S, BLOCK_C], dtype=tl.float32)
        for k in range(ITERS):
            m, off, _ = _cl_tile(b, span, c, k, C, S, BLOCK_S, ITERS)
            d = tl.where(m, _cl_load(x_ptr, a, off, m, HAS_ADD) - k0[None, :], 0.0)
            s1 += d
            s2 += d * d
        n = tl.minimum(ITERS * BLOCK_S, S - s0).to(tl.float32)
        t1 = tl.sum(s1, axis=0)
        mean = k0 + t1 / n
        m2 = tl.maximum(tl.sum(s2, axis=0) - t1 * (t1 / n), 0.0)
        base = part_ptr + ((b * spans + span) * 2) * C
        tl.store(base + c, mean, mask=c < C)
        tl.store(base + C + c, m2, mask=c < C)

    @triton.jit
    def _gn_cl_finalize_kernel(
        part_ptr,  # [B, spans, 2, C] fp32 from the stats kernel
        w_ptr,  # [C]
        scale_ptr,  # [B, C] fp32 out: w * rstd of the channel's group
        mean_ptr,  # [B, C] fp32 out: the channel's group mean
        C,
        S,
        G,
        Cg,
        spans,
        eps,
        BLOCK_S: tl.constexpr,  # positions per span (the count of every span but the last)
        BLOCK_T: tl.constexpr,  # spans merged at once
        T_ITERS: tl.constexpr,  # cdiv(spans, BLOCK_T) (a constant: loop bounds stay compile-time)
        BLOCK_CG: tl.constexpr,  # next_pow2(Cg)
    ):
        bg = tl.program_id(0)
        b = (bg // G).to(tl.int64)
        g = bg % G
        cc = tl.arange(0, BLOCK_CG)
        c = g * Cg + cc
        cm = cc < Cg
        n_total = S * Cg * 1.0  # fp32 even as constants (inductor's analysis: test_kernels_inductor_analysis.py)
        acc = tl.zeros([BLOCK_T, BLOCK_CG], dtype=tl.float32)
        for k in range(T_ITERS):  # pass 1: the group's mean (tile counts as weights)
            t = k * BLOCK_T + tl.arange(0, BLOCK_T)
            tm = t < spans
            nt = tl.where(tm, tl.minimum(BLOCK_S, S - t * BLOCK_S), 0).to(tl.float32)
            mk = tm[:, None] & cm[None, :]
            mu = tl.load(part_ptr + ((b * spans + t[:, None]) * 2) * C + c[None, :], mask=mk, other=0.0)
            acc += nt[:, None] * mu
        mean = tl.sum(tl.sum(acc, axis=1), axis=0) / n_total
        acc = tl.zeros([BLOCK_T, BLOCK_CG], dtype=tl.float32)
        for k in range(T_ITERS):  # pass 2: M2 = sum(M2_i + n_i (mean_i - mean)^2) (Chan)
            t = k * BLOCK_T + tl.arange(0, BLOCK_T)
            tm = t < spans
            nt = tl.where(tm, tl.minimum(BLOCK_S, S - t * BLOCK_S), 0).to(tl.float32)
            mk = tm[:, None] & cm[None, :]
            base = part_ptr + ((b * spans + t[:, None]) * 2) * C + c[None, :]
            mu = tl.load(base, mask=mk, other=0.0)
            m2 = tl.load(base + C, mask=mk, other=0.0)
            d = tl.where(mk, mu - mean, 0.0)
            acc += m2 + nt[:, None] * d * d
        var = tl.sum(tl.sum(acc, axis=1), axis=0) / n_total  # biased, like group_norm
        rstd = 1.0 / tl.sqrt(var + eps)
        w = tl.load(w_ptr + c, mask=cm, other=0.0).to(tl.float32)
        tl.store(scale_ptr + b * C + c, w * rstd, mask=cm)
        tl.store(mean_ptr + b * C + c + cc * 0, mean + tl.zeros([BLOCK_CG], dtype=tl.float32), mask=cm)

    @triton.jit
    def _gn_cl_apply_kernel(
        x_ptr,  # [B, C, *S] channels-last
        add_ptr,  # [B, C] contiguous (HAS_ADD), else unused
        scale_ptr,  # [B, C] fp32
        mean_ptr,  # [B, C] fp32
        bias_ptr,  # [C]
        out_ptr,  # like x
        C,
        S,
        spans,
        HAS_ADD: tl.constexpr,
        BLOCK_S: tl.constexpr,
        BLOCK_C: tl.constexpr,
        ITERS: tl.constexpr,
        SILU: tl.constexpr = True,  # False: the GroupNorm alone
    ):
        b, span, c = _cl_program(C, spans, BLOCK_C)
        a = _cl_add(add_ptr, b, c, C, HAS_ADD, BLOCK_C)
        sc = tl.load(scale_ptr + b * C + c, mask=c < C, other=0.0)
        mu = tl.load(mean_ptr + b * C + c, mask=c < C, other=0.0)
        bb = tl.load(bias_ptr + c, mask=c < C, other=0.0).to(tl.float32)
        for k in range(ITERS):
            m, off, _ = _cl_tile(b, span, c, k, C, S, BLOCK_S, ITERS)
            x = _cl_load(x_ptr, a, off, m, HAS_ADD)
            y = (x - mu[None, :]) * sc[None, :] + bb[None, :]  # x - mean first: no cancellation when |mean| >> std
            if SILU:
                y = y * tl.sigmoid(y)
            tl.store(out_ptr + off, y.to(out_ptr.dtype.element_ty), mask=m)


def _check(x, weight, bias, num_groups, add):
    if x.dim() < 3:
        raise ValueError(f"x must be [B, C, *spatial] (4-D images, 5-D videos), got {tuple(x.shape)}")
    for name, t in (("x", x), ("weight", weight), ("bias", bias)) + ((("add", add),) if add is not None else ()):
        check_dtype(name, t)
    b, c = x.shape[:2]
    if not isinstance(num_groups, int) or num_groups < 1 or c % num_groups:
        raise ValueError(f"num_groups must be a positive int dividing the channels C={c}; got {num_groups!r}")
    for name, t in (("weight", weight), ("bias", bias)):
        if tuple(t.shape) != (c,):
            raise ValueError(f"{name} must be [C] = [{c}], got {tuple(t.shape)}")
    if add is not None:
        if (add.dim() < 2 or add.dim() > x.dim() or tuple(add.shape[:2]) != (b, c)
                or any(d != 1 for d in add.shape[2:])):
            raise ValueError(f"add must be [B, C] = [{b}, {c}] (or [B, C, 1, ...]), got {tuple(add.shape)}")
        if add.dtype != x.dtype:
            raise ValueError(f"add must have x's dtype {x.dtype} (the model adds in it), got {add.dtype}")


def group_norm_silu_ref(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, num_groups: int,
                        eps: float = 1e-5, add: torch.Tensor | None = None, silu: bool = True) -> torch.Tensor:
    """x [B, C, *S], weight/bias [C], add [B, C] or None -> SiLU(GroupNorm(x + add)) in fp32, cast to x's dtype
    (without the SiLU where silu is False)."""
    _check(x, weight, bias, num_groups, add)
    if add is not None:
        x = x + add.reshape(*x.shape[:2], *([1] * (x.dim() - 2)))
    h = torch.nn.functional.group_norm(x.float(), num_groups, weight.float(), bias.float(), eps)
    return (torch.nn.functional.silu(h) if silu else h).to(x.dtype)


def group_norm_silu_bytes(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                          add: torch.Tensor | None = None) -> int:
    """x read and the output written once, weight, bias and add read once."""
    params = sum(t.numel() * t.element_size() for t in (weight, bias) + ((add,) if add is not None else ()))
    return 2 * x.numel() * x.element_size() + params


def _split(groups: int, n: int, block: int | None = None, programs: int | None = None) -> tuple[int, int, int]:
    """(BLOCK, ITERS, chunks): each of `groups` groups of n elements split into chunks of ITERS blocks of BLOCK
    (both powers of two: few compiled variants), so that about `programs` (_TARGET_PROGRAMS) programs run, at most
    _MAX_CHUNKS per group; `block` overrides _BLOCK."""
    block = max(16, min(block or _BLOCK, next_pow2(n)))
    blocks = -(-n // block)
    want = max(1, min(blocks, _MAX_CHUNKS, -(-(programs or _TARGET_PROGRAMS) // groups)))
    iters = next_pow2(-(-blocks // want))
    return block, iters, -(-blocks // iters)


def group_norm_silu(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, num_groups: int,
                    eps: float = 1e-5, add: torch.Tensor | None = None, silu: bool = True) -> torch.Tensor:
    """The Triton launcher (a stats kernel and a normalizing kernel, each one program per chunk of a group; channels-
    last: a merge kernel between them). silu=False: the GroupNorm alone."""
    _check(x, weight, bias, num_groups, add)
    if not isinstance(silu, bool):
        raise ValueError(f"silu={silu!r} is not allowed; allowed values: True, False")
    cl = is_channels_last(x)
    if not cl:
        x = x.contiguous()
    b, c = x.shape[:2]
    out = torch.empty_like(x)  # x's strides: channels-last stays channels-last
    if x.numel() == 0:
        return out
    if cl:
        return _group_norm_silu_cl(x, weight, bias, num_groups, eps, add, out, silu=silu)
    return _group_norm_silu_cf(x, weight, bias, num_groups, eps, add, out, silu=silu)


def _group_norm_silu_cf(x, weight, bias, num_groups, eps, add, out, block: int | None = None,
                        programs: int | None = None, num_warps: int = 4, silu: bool = True):
    """The channels-first launcher (x contiguous): per-chunk statistics of each group, then the normalizing kernel
    merging them. block / programs / num_warps override _BLOCK / _TARGET_PROGRAMS / 4 (tools/gn_sweep.py sweeps them
    on a GPU)."""
    b, c = x.shape[:2]
    s = x.numel() // (b * c)
    cg = c // num_groups
    block, iters, chunks = _split(b * num_groups, cg * s, block, programs)
    part = torch.empty(b * num_groups, chunks, 2, device=x.device, dtype=torch.float32)
    a = add.reshape(b, c).contiguous() if add is not None else x  # x: a pointer never read
    grid = (b * num_groups, chunks)
    launch(_group_norm_silu_stats_kernel)[grid](x, a, part, c, s, num_groups, cg, chunks, HAS_ADD=add is not None,
                                                CHANNELS_LAST=False, BLOCK=block, ITERS=iters, num_warps=num_warps)
    launch(_group_norm_silu_kernel)[grid](
        x, a, weight.contiguous(), bias.contiguous(), part, out, c, s, num_groups, cg, chunks, eps,
        HAS_ADD=add is not None, CHANNELS_LAST=False, BLOCK=block, ITERS=iters, BLOCK_P=next_pow2(chunks),
        SILU=silu, num_warps=num_warps)
    return out


# elements of a channels-last tile (positions x channels) loaded at once: 8192 from tools/gn_sweep.py on the H100 at
# 9931fae (the UNet's two channels-last sites, 16x320x40x64 bf16: 47-48 us against 68-102 us with 2048; compile
# 52-57 us)
_CL_TILE = 8192
# programs per launch the channels-last launcher aims at (each loops over ITERS tiles): 8448 (64 per SM of an H200)
# from tools/gn_sweep.py on the H200 (data/reports/runs/2026-12-04-h200-gn/): at the SD VAE decoder's batched frames
# (16x128x320x512 bf16, 1.3 GB in and out) 618 us against 767 us for the former launch (1024 programs, timed as 1056:
# the same tiles a program) with the Chan statistics; at the UNet's 16x320x40x64 (1600 tiles) each program now takes
# one tile instead of two: 43.4 us against 42.1
_CL_PROGRAMS = 8448
_CL_MERGE = 4096  # (span, channel) partial statistics the finalize kernel merges at once


_CL_WARPS = 4  # warps per program of the stats and apply kernels
# the statistics kernel the launcher runs (see _group_norm_silu_cl): "shifted" from the same sweep (at the SD VAE
# decoder's site 618 us against 731 us with "chan" at 8448 programs; within 2 us of it at the UNet's)
_CL_STATS = "shifted"
_CL_STATS_TILE = 2048  # elements of the shifted statistics kernel's tile: two fp32 sums per element in registers
_CL_STATS_KERNELS = {"chan": _gn_cl_stats_kernel, "shifted": _gn_cl_stats_shifted_kernel} if triton is not None else {}


def _cl_blocks(c: int, s: int, b: int = 1, tile: int | None = None, programs: int | None = None,
               max_block_c: int = 64) -> tuple[int, int, int]:
    """(BLOCK_S, BLOCK_C, ITERS) of the channels-last kernels: channel blocks of up to max_block_c (64: 128 bytes of
    bf16, whole lines) that divide C where they can, positions filling the rest of `tile` (_CL_TILE) elements, and
    ITERS tiles per program (a power of two) so that about `programs` (_CL_PROGRAMS) programs run."""
    tile, programs = tile or _CL_TILE, programs or _CL_PROGRAMS
    if max_block_c >= c:  # whole rows of channels in one block (masked up to a power of two)
        block_c = next_pow2(c)
    else:
        block_c = next((bc for bc in (256, 128, 64, 32, 16) if bc <= max_block_c and c % bc == 0),
                       min(1 << (max_block_c.bit_length() - 1), next_pow2(c)))
    block_s = max(1, min(tile // block_c, next_pow2(s)))
    tiles = b * -(-s // block_s) * -(-c // block_c)
    iters = min(next_pow2(-(-tiles // programs)), next_pow2(-(-s // block_s)))
    return block_s, block_c, iters


# The one-launch path (_gn_cl_one_kernel) where a program's share, positions x its groups' channels, is at most
# _CL_ONE_MAX elements and the launch has at least _CL_ONE_PROGRAMS programs (0 turns it off). From tools/gn_sweep.py
# --levels on the H200 (data/reports/runs/2026-12-04-h200-gn-one/), against the three kernels at the wma UNet's levels
# (16 frames in the batch unless one sample), with the rule's settings (tile 2048, 8 warps): 16x1280x5x8 11.3 against
# 14.4 us, 16x1280x10x16 (6,400 elements a program) 18.0 against 22.1; with its best settings one launch was slower at
# 16x640x20x32 (12,800 a program: 29.5 against 27.8) and with one sample's 32 groups as the only programs
# (1x1280x16x5x8: 20.9 against 15.9). Inside the wma iteration the rule lost (tools/wma_iteration_account.py, the
# two stacks side by side, data/reports/runs/2026-12-04-h200-idle/): its 80 one-launch calls took 1.44 ms of GPU time
# where the three kernels took 0.86 ms at the same sites, normalization 33.52 against 32.89 ms. So the rule is off by
# default (_CL_ONE_MAX 0); _CL_ONE_RULE_MAX is the sweep's threshold, to set it on.
_CL_ONE_RULE_MAX = 8192
_CL_ONE_MAX = 0
_CL_ONE_PROGRAMS = 256


def _cl_one_launch(b: int, c: int, s: int, cg: int) -> bool:
    """Whether the launcher takes the one-launch path: a program's positions x channels at most _CL_ONE_MAX, and at
    least _CL_ONE_PROGRAMS programs (batch elements x group blocks)."""
    gpb, _, _, _ = _cl_one_plan(c, s, cg)
    return s * gpb * cg <= _CL_ONE_MAX and b * -(-(c // cg) // gpb) >= _CL_ONE_PROGRAMS


def _group_norm_silu_cl(x, weight, bias, num_groups, eps, add, out, tile: int | None = None,
                        programs: int | None = None, max_block_c: int = 64, num_warps: int | None = None,
                        silu: bool = True, stats: str | None = None, stats_tile: int | None = None,
                        one_launch: bool | None = None):
    """The channels-last launcher: per-channel span statistics, a per-group merge into mean and scale, the apply;
    or, where the activation is small (_cl_one_launch; one_launch=True / False forces it), all three in one launch
    (_group_norm_silu_cl_one). tile / programs / max_block_c / num_warps override the three kernels' module defaults;
    stats picks their statistics kernel ("chan": a Chan merge per tile, "shifted": shifted sums, its tiles of
    stats_tile elements, the span unchanged); tools/gn_sweep.py sweeps them on a GPU."""
    stats = stats or _CL_STATS
    if stats not in _CL_STATS_KERNELS:
        raise ValueError(f"stats={stats!r} is not allowed; allowed values: {sorted(_CL_STATS_KERNELS)}")
    if one_launch not in (None, True, False):
        raise ValueError(f"one_launch={one_launch!r} is not allowed; allowed values: None (the size rule), True, False")
    b, c = x.shape[:2]
    s = x.numel() // (b * c)
    cg = c // num_groups
    if one_launch or (one_launch is None and _CL_ONE_MAX and _cl_one_launch(b, c, s, cg)):
        return _group_norm_silu_cl_one(x, weight, bias, num_groups, eps, add, out, silu=silu)
    block_s, block_c, iters = _cl_blocks(c, s, b, tile, programs, max_block_c)
    spans = -(-s // (block_s * iters))
    # the statistics kernel's own tile over the same spans (powers of two: block_s * iters = stats_s * stats_iters)
    stats_s = block_s if stats == "chan" else max(1, min(block_s, (stats_tile or _CL_STATS_TILE) // block_c))
    stats_iters = block_s * iters // stats_s
    part = torch.empty(b, spans, 2, c, device=x.device, dtype=torch.float32)
    scale = torch.empty(b, c, device=x.device, dtype=torch.float32)
    mean = torch.empty_like(scale)
    a = add.reshape(b, c).contiguous() if add is not None else x  # x: a pointer never read
    block_t = max(1, min(next_pow2(spans), _CL_MERGE // next_pow2(cg)))
    grid = (b * spans, -(-c // block_c))
    kw = dict(HAS_ADD=add is not None, BLOCK_S=block_s, BLOCK_C=block_c, ITERS=iters,
              num_warps=num_warps or _CL_WARPS)
    launch(_CL_STATS_KERNELS[stats])[grid](x, a, part, c, s, spans, **(kw | dict(BLOCK_S=stats_s, ITERS=stats_iters)))
    launch(_gn_cl_finalize_kernel)[(b * num_groups,)](
        part, weight.contiguous(), scale, mean, c, s, num_groups, cg, spans, eps, BLOCK_S=block_s * iters,
        BLOCK_T=block_t, T_ITERS=-(-spans // block_t), BLOCK_CG=next_pow2(cg), num_warps=4)
    launch(_gn_cl_apply_kernel)[grid](x, a, scale, mean, bias.contiguous(), out, c, s, spans, SILU=silu, **kw)
    return out


@define_op("wmbook::group_norm_silu")
def group_norm_silu_op(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, num_groups: int, eps: float,
                       add: torch.Tensor | None) -> torch.Tensor:
    """The op torch.compile sees (define_op): the Triton kernel where it runs, else the reference (in x's layout)."""
    if runs_triton(x.device) and triton is not None:
        return group_norm_silu(x, weight, bias, num_groups, eps, add)
    fmt = (torch.channels_last if x.dim() == 4 else torch.channels_last_3d) if is_channels_last(x) else None
    out = group_norm_silu_ref(x, weight, bias, num_groups, eps, add)
    return out.contiguous(memory_format=fmt) if fmt is not None else out.contiguous()


@group_norm_silu_op.register_fake
def _(x, weight, bias, num_groups, eps, add):
    return _out_like(x)


def _out_like(x):
    if is_channels_last(x):
        return torch.empty_like(x)  # the launcher's and the fallback's layout
    return x.new_empty(x.shape)  # contiguous


@define_op("wmbook::group_norm")
def group_norm_op(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, num_groups: int,
                  eps: float) -> torch.Tensor:
    """GroupNorm alone (the video UNet's transformers' input norm) by the same kernels, SiLU off; as group_norm_silu_op
    where Triton does not run."""
    if runs_triton(x.device) and triton is not None:
        return group_norm_silu(x, weight, bias, num_groups, eps, None, silu=False)
    out = group_norm_silu_ref(x, weight, bias, num_groups, eps, None, silu=False)
    fmt = (torch.channels_last if x.dim() == 4 else torch.channels_last_3d) if is_channels_last(x) else None
    return out.contiguous(memory_format=fmt) if fmt is not None else out.contiguous()


@group_norm_op.register_fake
def _(x, weight, bias, num_groups, eps):
    return _out_like(x)


__all__ = ["group_norm_op", "group_norm_silu", "group_norm_silu_bytes", "group_norm_silu_op", "group_norm_silu_ref"]
