"""The channels-last GroupNorm's tile helpers (shared with the three kernels of wmbook.kernels.group_norm_silu), and
the GroupNorm (+ SiLU) in one launch for small activations (group_norm_silu takes it by its size rule, _cl_one_launch,
where that is on; it is off by default: it lost inside the wma iteration, see group_norm_silu's comment): a program per
(batch element, block of whole groups) walks all positions of its channels for their shifted sums, merges them per
group in registers (Cg need not be a power of two: a membership matrix maps channels to groups) and applies over the
same tiles, mostly from L2. At the wma UNet's two lowest levels (a few MB an activation) the three kernels' fixed launch
cost is much of a call in a sweep of the call alone; with few programs (one sample's groups) or large shares one launch
is slower (tools/gn_sweep.py --levels)."""

from __future__ import annotations

from . import launch, next_pow2

try:
    import triton
    import triton.language as tl
except ImportError:  # the custom op falls back to the reference
    triton = None

if triton is not None:

    @triton.jit
    def _cl_program(C, spans, BLOCK_C: tl.constexpr):
        """This program's batch element, span and channel indices (grid: batch x spans, channel blocks)."""
        pid = tl.program_id(0)
        b = (pid // spans).to(tl.int64)
        c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
        return b, pid % spans, c

    @triton.jit
    def _cl_add(add_ptr, b, c, C, HAS_ADD: tl.constexpr, BLOCK_C: tl.constexpr):
        """The time-embedding add of the program's channels in fp32 (HAS_ADD; else unused zeros), loaded once for all
        its tiles."""
        if HAS_ADD:
            a = tl.load(add_ptr + b * C + c, mask=c < C, other=0.0).to(tl.float32)
        else:
            a = tl.zeros([BLOCK_C], dtype=tl.float32)
        return a

    @triton.jit
    def _cl_tile(b, span, c, k, C, S, BLOCK_S: tl.constexpr, ITERS: tl.constexpr):
        """Tile k (of ITERS) of the span: the mask and offsets of its [BLOCK_S, channels] channels-last block and its
        position count (0 past the end)."""
        s0 = (span * ITERS + k) * BLOCK_S
        s = s0 + tl.arange(0, BLOCK_S)
        m = (s[:, None] < S) & (c[None, :] < C)
        off = b * C * S + s[:, None].to(tl.int64) * C + c[None, :]
        return m, off, tl.maximum(tl.minimum(BLOCK_S, S - s0), 0)

    @triton.jit
    def _cl_load(x_ptr, a, off, m, HAS_ADD: tl.constexpr):
        """The tile of x (+ a, rounded to x's dtype like the model's h + emb) in fp32, 0 where masked."""
        x = tl.load(x_ptr + off, mask=m, other=0.0)
        if HAS_ADD:
            x = (x.to(tl.float32) + a[None, :]).to(x_ptr.dtype.element_ty)
        return tl.where(m, x.to(tl.float32), 0.0)

    @triton.jit
    def _gn_cl_one_kernel(
        x_ptr,  # [B, C, *S] channels-last
        add_ptr,  # [B, C] contiguous (HAS_ADD), else unused
        w_ptr,  # [C]
        bias_ptr,  # [C]
        out_ptr,  # like x
        C,
        S,
        Cg,
        eps,
        GPB: tl.constexpr,  # whole groups a program normalizes
        HAS_ADD: tl.constexpr,
        BLOCK_S: tl.constexpr,
        BLOCK_C: tl.constexpr,  # next_pow2(GPB * Cg)
        BLOCK_G: tl.constexpr,  # next_pow2(GPB)
        ITERS: tl.constexpr,  # cdiv(S, BLOCK_S): the program walks all of its batch element's positions
        SILU: tl.constexpr = True,
    ):
        """GroupNorm (+ SiLU) of GPB whole groups of one batch element in one program (grid: batch, group blocks):
        the channels' shifted sums over every position, merged per group in registers, then the apply over the same
        tiles (mostly from L2). One launch instead of three, for activations small enough that the three launches'
        fixed cost is most of their time."""
        b = tl.program_id(0).to(tl.int64)
        cc = tl.arange(0, BLOCK_C)
        c = tl.program_id(1) * (GPB * Cg) + cc
        cm = (cc < GPB * Cg) & (c < C)
        a = _cl_add(add_ptr, b, c, C, HAS_ADD, BLOCK_C)
        k0 = tl.load(x_ptr + b * C * S + c, mask=cm, other=0.0)  # position 0 of every channel: the shift
        if HAS_ADD:
            k0 = (k0.to(tl.float32) + a).to(x_ptr.dtype.element_ty)
        k0 = tl.where(cm, k0.to(tl.float32), 0.0)
        s1 = tl.zeros([BLOCK_S, BLOCK_C], dtype=tl.float32)
        s2 = tl.zeros([BLOCK_S, BLOCK_C], dtype=tl.float32)
        for k in range(ITERS):
            m, off, _ = _cl_tile(b, 0, c, k, C, S, BLOCK_S, ITERS)
            m = m & cm[None, :]
            d = tl.where(m, _cl_load(x_ptr, a, off, m, HAS_ADD) - k0[None, :], 0.0)
            s1 += d
            s2 += d * d
        n = S * 1.0
        t1 = tl.sum(s1, axis=0)
        mean_c = k0 + t1 / n  # per channel
        m2_c = tl.maximum(tl.sum(s2, axis=0) - t1 * (t1 / n), 0.0)
        # channels -> their group (Cg need not be a power of two): a [BLOCK_C, BLOCK_G] membership matrix
        gid = cc // Cg
        onehot = tl.where((gid[:, None] == tl.arange(0, BLOCK_G)[None, :]) & cm[:, None], 1.0, 0.0)
        mean_g = tl.sum(mean_c[:, None] * onehot, axis=0) / Cg  # equal counts: the mean of the channels' means
        mean = tl.sum(onehot * mean_g[None, :], axis=1)  # back to the channels
        d = tl.where(cm, mean_c - mean, 0.0)
        m2_g = tl.sum((m2_c + n * d * d)[:, None] * onehot, axis=0)  # Chan: M2 = sum(M2_c + n (mean_c - mean)^2)
        rstd_g = 1.0 / tl.sqrt(m2_g / (n * Cg) + eps)  # biased variance, like group_norm
        rstd = tl.sum(onehot * rstd_g[None, :], axis=1)
        sc = tl.load(w_ptr + c, mask=cm, other=0.0).to(tl.float32) * rstd
        bb = tl.load(bias_ptr + c, mask=cm, other=0.0).to(tl.float32)
        for k in range(ITERS):
            m, off, _ = _cl_tile(b, 0, c, k, C, S, BLOCK_S, ITERS)
            m = m & cm[None, :]
            x = _cl_load(x_ptr, a, off, m, HAS_ADD)
            y = (x - mean[None, :]) * sc[None, :] + bb[None, :]
            if SILU:
                y = y * tl.sigmoid(y)
            tl.store(out_ptr + off, y.to(out_ptr.dtype.element_ty), mask=m)


_CL_ONE_BLOCK_C = 64  # channels a one-launch program covers at most (whole groups; one group where a group is wider)
_CL_ONE_TILE = 2048  # elements of its tile
_CL_ONE_WARPS = 8


def _cl_one_plan(c: int, s: int, cg: int, max_block_c: int | None = None,
                 tile: int | None = None) -> tuple[int, int, int, int]:
    """(GPB, BLOCK_C, BLOCK_S, ITERS) of the one-launch kernel: as many whole groups a program as fit in max_block_c
    (_CL_ONE_BLOCK_C) channels (at least one), positions filling the rest of `tile` (_CL_ONE_TILE) elements, ITERS
    tiles covering all s positions."""
    gpb = max(1, min(c // cg, (max_block_c or _CL_ONE_BLOCK_C) // cg))
    block_c = next_pow2(gpb * cg)
    block_s = max(1, min((tile or _CL_ONE_TILE) // block_c, next_pow2(s)))
    return gpb, block_c, block_s, -(-s // block_s)


def _group_norm_silu_cl_one(x, weight, bias, num_groups, eps, add, out, max_block_c: int | None = None,
                            tile: int | None = None, num_warps: int | None = None, silu: bool = True):
    """The channels-last one-launch launcher: one program per (batch element, block of whole groups); max_block_c /
    tile / num_warps override _CL_ONE_BLOCK_C / _CL_ONE_TILE / _CL_ONE_WARPS (tools/gn_sweep.py sweeps them)."""
    b, c = x.shape[:2]
    s = x.numel() // (b * c)
    cg = c // num_groups
    gpb, block_c, block_s, iters = _cl_one_plan(c, s, cg, max_block_c, tile)
    a = add.reshape(b, c).contiguous() if add is not None else x  # x: a pointer never read
    launch(_gn_cl_one_kernel)[(b, -(-num_groups // gpb))](
        x, a, weight.contiguous(), bias.contiguous(), out, c, s, cg, eps, GPB=gpb, HAS_ADD=add is not None,
        BLOCK_S=block_s, BLOCK_C=block_c, BLOCK_G=next_pow2(gpb), ITERS=iters, SILU=silu,
        num_warps=num_warps or _CL_ONE_WARPS)
    return out
