"""The KV cache of one synthesis, on the device, written in place.

Layout [n_layer, n_head_kv, max_seq_len, head_dim] (heads outermost): a layer's keys for
positions 0..T-1 are then one strided view per head, which attention reads without a copy.

s2.cpp attends over history read back from the rounded cache (f16 by default) and over this
call's K/V at compute precision. Three ways to hold that, by the cache's value type and the
attention's type:
- the same type: the cache is read in place;
- values narrower than float32 attention (the CPU's f16/bf16 cache; `hold_wide`): the cache is
  held in float32 with values rounded to their type. A call writes its rows unrounded, attends
  over the cache in place, then rounds its rows (`settle`). No per-step conversion of the
  history (which cost ~10 bytes of traffic per cached value and layer, against 4 now) for
  twice the memory (Capabilities.kv_cache_storage_dtype = "f32");
- otherwise (CUDA, where memory is dearer): stored in the value type; each layer's history is
  converted into a reused staging buffer of the attention type per call.

A KV slot may start with a shared voice prefix (`SharedPrefix`, held once for every slot in
that voice, in the same held type): the slot's own rows then hold positions n and later from
index 0, and attention reads the prefix's rows, then the slot's own (`prefix_layer`).
"""

from __future__ import annotations

import numpy as np
import torch


def storage_dtype(dtype: torch.dtype, attention_dtype: torch.dtype, hold_wide: bool) -> torch.dtype:
    """The type a cache of `dtype` values is held in."""
    if hold_wide and dtype != attention_dtype and attention_dtype == torch.float32:
        return torch.float32  # holds every f16 and bf16 value exactly
    return dtype


class SharedPrefix:
    """One voice's K/V, read-only: [n_layer, n_head_kv, n, head_dim] in the held type, on the
    device. Every slot attached to it reads these tensors; none writes into them."""

    def __init__(self, k: np.ndarray, v: np.ndarray, held: torch.dtype, device: torch.device):
        # k, v: float32 host [n_layer, n, n_head_kv, head_dim] holding values of the cache
        # type, so storing them in the held type is exact
        self.k, self.v = (torch.from_numpy(np.ascontiguousarray(c)).transpose(1, 2)
                          .to(device, held).contiguous() for c in (k, v))

    @property
    def n(self) -> int:
        return self.k.shape[2]


class KVCache:
    def __init__(self, n_layer: int, n_head_kv: int, max_seq_len: int, head_dim: int,
                 dtype: torch.dtype, attention_dtype: torch.dtype, device: torch.device,
                 hold_wide: bool = False):
        shape = (n_layer, n_head_kv, max_seq_len, head_dim)
        self.dtype = dtype  # the values' type
        held = storage_dtype(dtype, attention_dtype, hold_wide)
        self.k = torch.zeros(shape, dtype=held, device=device)
        self.v = torch.zeros(shape, dtype=held, device=device)
        self._round_after = held != dtype  # rows are written unrounded, rounded by settle()
        self.held_dtype = held
        self.attention_dtype = attention_dtype
        #: positions [0, prefix.n) of this cache's sequence; its own rows start after them
        self.prefix: SharedPrefix | None = None
        self._staging = None
        if held != attention_dtype:
            one_layer = (n_head_kv, max_seq_len, head_dim)
            self._staging = (torch.empty(one_layer, dtype=attention_dtype, device=device),
                             torch.empty(one_layer, dtype=attention_dtype, device=device))

    @property
    def max_seq_len(self) -> int:
        return self.k.shape[2]

    @property
    def base(self) -> int:
        """Positions held by the attached shared prefix (0 without one)."""
        return 0 if self.prefix is None else self.prefix.n

    def prefix_layer(self, layer: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(K, V) (n_head_kv, n, head_dim) of the shared prefix in `layer`, in the attention
        type (read in place when it is the held type), or None without a prefix."""
        if self.prefix is None:
            return None
        return (self.prefix.k[layer].to(self.attention_dtype),
                self.prefix.v[layer].to(self.attention_dtype))

    def update(self, layer: int, n_past: int, k: torch.Tensor, v: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write k, v (n, n_head_kv, head_dim) at positions n_past.. of `layer`; return this
        layer's keys and values of its own rows up to position n_past+n-1 as (n_head_kv, T,
        head_dim) views (all positions without a shared prefix; those after it with one), the
        history rounded to the cache type and this call's rows at compute precision.
        Call `settle` once attention has read them."""
        n_past -= self.base  # own rows start after the shared prefix's positions
        end = n_past + k.shape[0]
        k_heads, v_heads = k.transpose(0, 1), v.transpose(0, 1)
        self.k[layer, :, n_past:end] = k_heads
        self.v[layer, :, n_past:end] = v_heads
        if self._staging is None:
            return self.k[layer, :, :end], self.v[layer, :, :end]
        out = []
        for staging, cache, current in zip(self._staging, (self.k, self.v), (k_heads, v_heads)):
            staging[:, :n_past] = cache[layer, :, :n_past]
            staging[:, n_past:end] = current
            out.append(staging[:, :end])
        return out[0], out[1]

    def settle(self, layer: int, n_past: int, end: int) -> None:
        """Round positions [n_past, end) of `layer` to the cache type (a no-op unless held
        wide)."""
        n_past, end = n_past - self.base, end - self.base
        if self._round_after:
            for cache in (self.k, self.v):
                rows = cache[layer, :, n_past:end]
                rows.copy_(rows.to(self.dtype))

    def write(self, k: np.ndarray, v: np.ndarray) -> None:
        """Rows [0, n) of every layer from float32 host arrays [n_layer, n, n_head_kv, d]
        holding values of the cache type (so storing them in it is exact); detaches a shared
        prefix (the rows written are then the sequence's first)."""
        self.prefix = None
        n = k.shape[1]
        for cache, host in ((self.k, k), (self.v, v)):
            rows = torch.from_numpy(np.ascontiguousarray(host)).transpose(1, 2)
            cache[:, :, :n].copy_(rows.to(cache.device, cache.dtype))

    def read(self, n_positions: int) -> tuple[np.ndarray, np.ndarray]:
        """Float32 host copies [n_layer, n_positions, n_head_kv, head_dim] of K and V: the
        shared prefix's rows, then this cache's own."""
        base = self.base
        n_own, n_shared = max(n_positions - base, 0), min(n_positions, base)
        out = []
        for i, cache in enumerate((self.k, self.v)):
            blocks = [cache[:, :, :n_own]]
            if base:
                blocks.insert(0, (self.prefix.k, self.prefix.v)[i][:, :, :n_shared])
            host = torch.empty((cache.shape[0], n_positions, cache.shape[1], cache.shape[3]),
                               dtype=torch.float32)
            lo = 0
            for block in blocks:
                host[:, lo:lo + block.shape[2]].copy_(block.transpose(1, 2))
                lo += block.shape[2]
            out.append(host.numpy())
        return out[0], out[1]
