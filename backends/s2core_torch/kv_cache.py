"""The KV cache of one synthesis, on the device, written in place.

Layout [n_layer, n_head_kv, max_seq_len, head_dim] (heads outermost): a layer's keys for
positions 0..T-1 are then one strided view per head, which SDPA reads without a copy.
"""

from __future__ import annotations

import numpy as np
import torch


class KVCache:
    def __init__(self, n_layer: int, n_head_kv: int, max_seq_len: int, head_dim: int,
                 dtype: torch.dtype, attention_dtype: torch.dtype, device: torch.device):
        shape = (n_layer, n_head_kv, max_seq_len, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        # s2.cpp attends over history read back from the rounded cache and over this call's
        # K/V at compute precision. When the two types differ, both are assembled per layer in
        # one reused buffer of the attention type; when they match, the cache itself is read.
        self._staging = None
        if dtype != attention_dtype:
            one_layer = (n_head_kv, max_seq_len, head_dim)
            self._staging = (torch.empty(one_layer, dtype=attention_dtype, device=device),
                             torch.empty(one_layer, dtype=attention_dtype, device=device))

    @property
    def max_seq_len(self) -> int:
        return self.k.shape[2]

    def update(self, layer: int, n_past: int, k: torch.Tensor, v: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write k, v (n, n_head_kv, head_dim) at rows n_past.. of `layer`; return this layer's
        keys and values for positions 0..n_past+n-1 as (n_head_kv, T, head_dim) views."""
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

    def read(self, n_positions: int) -> tuple[np.ndarray, np.ndarray]:
        """Float32 host copies [n_layer, n_positions, n_head_kv, head_dim] of K and V."""
        out = []
        for cache in (self.k, self.v):
            rows = cache[:, :, :n_positions].transpose(1, 2)
            host = torch.empty(rows.shape, dtype=torch.float32)
            host.copy_(rows)
            out.append(host.numpy())
        return out[0], out[1]
