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
"""

from __future__ import annotations

import numpy as np
import torch


def storage_dtype(dtype: torch.dtype, attention_dtype: torch.dtype, hold_wide: bool) -> torch.dtype:
    """The type a cache of `dtype` values is held in."""
    if hold_wide and dtype != attention_dtype and attention_dtype == torch.float32:
        return torch.float32  # holds every f16 and bf16 value exactly
    return dtype


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
        self._staging = None
        if held != attention_dtype:
            one_layer = (n_head_kv, max_seq_len, head_dim)
            self._staging = (torch.empty(one_layer, dtype=attention_dtype, device=device),
                             torch.empty(one_layer, dtype=attention_dtype, device=device))

    @property
    def max_seq_len(self) -> int:
        return self.k.shape[2]

    def update(self, layer: int, n_past: int, k: torch.Tensor, v: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write k, v (n, n_head_kv, head_dim) at rows n_past.. of `layer`; return this layer's
        keys and values for positions 0..n_past+n-1 as (n_head_kv, T, head_dim) views, the
        history rounded to the cache type and this call's rows at compute precision.
        Call `settle` once attention has read them."""
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
        """Round rows [n_past, end) of `layer` to the cache type (a no-op unless held wide)."""
        if self._round_after:
            for cache in (self.k, self.v):
                rows = cache[layer, :, n_past:end]
                rows.copy_(rows.to(self.dtype))

    def write(self, k: np.ndarray, v: np.ndarray) -> None:
        """Rows [0, n) of every layer from float32 host arrays [n_layer, n, n_head_kv, d]
        holding values of the cache type (so storing them in it is exact)."""
        n = k.shape[1]
        for cache, host in ((self.k, k), (self.v, v)):
            rows = torch.from_numpy(np.ascontiguousarray(host)).transpose(1, 2)
            cache[:, :, :n].copy_(rows.to(cache.device, cache.dtype))

    def read(self, n_positions: int) -> tuple[np.ndarray, np.ndarray]:
        """Float32 host copies [n_layer, n_positions, n_head_kv, head_dim] of K and V."""
        out = []
        for cache in (self.k, self.v):
            rows = cache[:, :, :n_positions].transpose(1, 2)
            host = torch.empty(rows.shape, dtype=torch.float32)
            host.copy_(rows)
            out.append(host.numpy())
        return out[0], out[1]
