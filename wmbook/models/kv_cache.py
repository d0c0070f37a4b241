"""Rolling KV cache with the upstream (Self-Forcing / Matrix-Game-2) eviction rule."""

from __future__ import annotations

import torch


class KVCache:
    """Preallocated [B, capacity, H, D] keys/values; indices kept as Python ints (no host syncs).

    Writing tokens [start, end): if `end` is past everything written and the buffer would overflow,
    the oldest tokens are evicted by rolling the rest to the front (upstream uses the same `.clone()`
    copy); re-writing the current block (denoising steps, cache refresh) overwrites in place.
    Returns the attention window: the last `window` tokens up to the new end.

    Two ways to write:
      update(k, v, start)   the upstream way: the block's position arrives with the write. All the integer
                            bookkeeping happens there, so under torch.compile it is a graph break (it is
                            compiler-disabled; traced, its ints would be guarded and recompile every block).
      begin(start, n) once per forward, eagerly (GenerationCache.begin), then update(k, v) inside the
                            model: the eviction copy and the slot arithmetic are done before the compiled
                            region, and the write itself is two slice copies with ints that only take two
                            values (first block, every later one), so a compiled block traces it without a
                            graph break and without recompiling in steady state.
    """

    def __init__(self, batch: int, capacity: int, heads: int, head_dim: int, dtype, device, window: int | None = None):
        self.k = torch.zeros(batch, capacity, heads, head_dim, dtype=dtype, device=device)
        self.v = torch.zeros_like(self.k)
        self.capacity = capacity
        self.window = capacity if window is None else window
        self.global_end = 0  # absolute token index one past the last written token
        self.local_end = 0  # buffer index one past the last written token
        self.slot: tuple[int, int, int] | None = None  # (write start, write end, window start), set by begin()

    def begin(self, start: int, n: int) -> None:
        """Prepare the write of n tokens at absolute position `start`: evict if needed (a device copy) and
        fix the buffer slot. Idempotent for the same (start, n): re-writing a block does not evict again."""
        if n > self.capacity:
            raise ValueError(f"cannot write {n} tokens into a KV cache of capacity {self.capacity}")
        end = start + n
        local_end = self.local_end + end - self.global_end
        if end > self.global_end and local_end > self.capacity:
            evict = local_end - self.capacity
            keep = self.local_end - evict
            self.k[:, :keep] = self.k[:, evict:evict + keep].clone()
            self.v[:, :keep] = self.v[:, evict:evict + keep].clone()
            local_end -= evict
        self.global_end, self.local_end = end, local_end
        self.slot = (local_end - n, local_end, max(0, local_end - self.window))

    def _write(self, k: torch.Tensor, v: torch.Tensor):
        a, b, lo = self.slot
        if k.shape[1] != b - a:
            raise ValueError(f"begin() prepared a write of {b - a} tokens, got {k.shape[1]}")
        self.k[:, a:b] = k
        self.v[:, a:b] = v
        return self.k[:, lo:b], self.v[:, lo:b]

    @torch.compiler.disable
    def _update_at(self, k: torch.Tensor, v: torch.Tensor, start: int):
        self.begin(start, k.shape[1])
        return self._write(k, v)

    def update(self, k: torch.Tensor, v: torch.Tensor, start: int | None = None):
        """Write this block's k/v [B, n, H, D]; returns the attention window (k, v) [B, <=window, H, D].
        start=None writes where begin() said (traceable); an int position does the bookkeeping here."""
        if start is not None:
            return self._update_at(k, v, start)
        if self.slot is None:
            raise RuntimeError("KVCache.update(k, v) without a position needs begin(start, n) first")
        return self._write(k, v)

    def reset(self):
        self.global_end = self.local_end = 0
        self.slot = None

    def nbytes(self) -> int:
        return 2 * self.k.numel() * self.k.element_size()
