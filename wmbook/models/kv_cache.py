"""Rolling KV cache with the upstream (Self-Forcing / Matrix-Game-2) eviction rule."""

from __future__ import annotations

import torch


class KVCache:
    """Preallocated [B, capacity, H, D] keys/values; indices kept as Python ints (no host syncs).

    Writing tokens [start, end): if `end` is past everything written and the buffer would overflow,
    the oldest tokens are evicted by rolling the rest to the front (upstream uses the same `.clone()`
    copy); re-writing the current block (denoising steps, cache refresh) overwrites in place.
    Returns the attention window: the last `window` tokens up to the new end.
    """

    def __init__(self, batch: int, capacity: int, heads: int, head_dim: int, dtype, device, window: int | None = None):
        self.k = torch.zeros(batch, capacity, heads, head_dim, dtype=dtype, device=device)
        self.v = torch.zeros_like(self.k)
        self.capacity = capacity
        self.window = capacity if window is None else window
        self.global_end = 0  # absolute token index one past the last written token
        self.local_end = 0  # buffer index one past the last written token
        self.next_start = 0  # where update(start=None) writes: set once per forward by GenerationCache.begin

    # The bookkeeping is host-side integer logic: under torch.compile it stays out of the graphs (its ints
    # would otherwise be guarded and recompile every block). In eager mode the decorator changes nothing.
    @torch.compiler.disable
    def update(self, k: torch.Tensor, v: torch.Tensor, start: int | None = None):
        start = self.next_start if start is None else start
        n = k.shape[1]
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
        local_start = local_end - n
        self.k[:, local_start:local_end] = k
        self.v[:, local_start:local_end] = v
        self.global_end, self.local_end = end, local_end
        lo = max(0, local_end - self.window)
        return self.k[:, lo:local_end], self.v[:, lo:local_end]

    def reset(self):
        self.global_end = self.local_end = 0

    def nbytes(self) -> int:
        return 2 * self.k.numel() * self.k.element_size()
