"""KV slots on MLX: several independent sequences in one backend, each its own KVCache, and
the voice prefixes they share.

A voice prefix is held once (kv_cache.SharedPrefix) and attached to every slot that starts
with it: that slot's attention reads the prefix's rows, then its own. Handles are numbers
never given twice, so removing one voice changes no other.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from .kv_cache import KVCache, SharedPrefix


class Slots:
    def __init__(self, n_slots: int, n_layer: int, n_head_kv: int, max_seq_len: int,
                 head_dim: int, dtype: mx.Dtype):
        self.caches = [KVCache(n_layer, n_head_kv, max_seq_len, head_dim, dtype)
                       for _ in range(n_slots)]
        self.dtype = dtype
        self.prefixes: dict[int, SharedPrefix] = {}
        self._next_handle = 0

    def __getitem__(self, slot: int) -> KVCache:
        return self.caches[slot]

    def add_prefix(self, k: np.ndarray, v: np.ndarray) -> int:
        prefix = SharedPrefix(k, v, self.dtype)  # built first: a failure holds nothing new
        handle, self._next_handle = self._next_handle, self._next_handle + 1
        self.prefixes[handle] = prefix
        return handle

    def prefix(self, handle: int) -> SharedPrefix:
        if handle not in self.prefixes:
            raise ValueError(f"no shared prefix {handle!r} (holding {sorted(self.prefixes)})")
        return self.prefixes[handle]

    def attach(self, slot: int, handle: int | None) -> None:
        self.caches[slot].prefix = None if handle is None else self.prefix(handle)

    def remove_prefix(self, handle: int) -> None:
        """Drop one voice no slot is attached to; its arrays go with this last reference."""
        prefix = self.prefix(handle)
        users = [s for s, c in enumerate(self.caches) if c.prefix is prefix]
        if users:
            raise ValueError(f"shared prefix {handle} is still attached to slot(s) {users}")
        del self.prefixes[handle]
