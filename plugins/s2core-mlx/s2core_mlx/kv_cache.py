"""The Slow-AR's KV cache as MLX arrays, allocated once per synthesis and written in place.

One K and one V array per layer, (1, n_head_kv, max_seq_len, head_dim): heads outermost, so
the rows a call reads are contiguous per head and the arrays feed
mx.fast.scaled_dot_product_attention directly. A call writes its rows with slice assignment;
when the graph runs, MLX updates the buffer in place (the previous array has no other user,
so its buffer is donated), which is why nothing here keeps a second reference to a layer's
array across a call.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np


class KVCache:
    def __init__(self, n_layer: int, n_head_kv: int, max_seq_len: int, head_dim: int,
                 dtype: mx.Dtype):
        shape = (1, n_head_kv, max_seq_len, head_dim)
        self.dtype = dtype
        self.max_seq_len = max_seq_len
        self.k = [mx.zeros(shape, dtype) for _ in range(n_layer)]
        self.v = [mx.zeros(shape, dtype) for _ in range(n_layer)]
        mx.eval(self.k, self.v)  # allocate now: init_kv_cache is where memory is committed

    def append(self, layer: int, k: mx.array, v: mx.array, n_past: int
               ) -> tuple[mx.array, mx.array]:
        """Write this call's k, v (1, n_head_kv, n, d) at rows [n_past, n_past + n) and return
        the keys and values attention reads, as s2.cpp has them: history read back from the
        (rounded) cache, this call's rows at compute precision (float32)."""
        end = n_past + k.shape[2]
        self.k[layer][:, :, n_past:end, :] = k.astype(self.dtype)
        self.v[layer][:, :, n_past:end, :] = v.astype(self.dtype)
        if n_past == 0:
            return k, v
        # Rows below n_past are untouched by the write: reading them from the updated array
        # keeps the old one free for donation.
        history_k = self.k[layer][:, :, :n_past, :].astype(mx.float32)
        history_v = self.v[layer][:, :, :n_past, :].astype(mx.float32)
        return (mx.concatenate([history_k, k], axis=2),
                mx.concatenate([history_v, v], axis=2))

    def arrays(self) -> list[mx.array]:
        """Every buffer, for mx.eval at the end of a call."""
        return self.k + self.v

    def write(self, k: np.ndarray, v: np.ndarray) -> None:
        """Rows [0, n) of every layer from float32 host arrays [n_layer, n, n_head_kv, d]
        holding values of the cache type (the cast to it is exact)."""
        n = k.shape[1]
        for layers, host in ((self.k, k), (self.v, v)):
            for i in range(len(layers)):
                rows = mx.array(np.ascontiguousarray(host[i].transpose(1, 0, 2)))[None]
                layers[i][:, :, :n, :] = rows.astype(self.dtype)
        mx.eval(self.arrays())

    def read(self, n_positions: int) -> tuple[np.ndarray, np.ndarray]:
        """Copies of K and V for positions [0, n_positions) as float32
        [n_layer, n_positions, n_head_kv, head_dim]."""
        def stacked(per_layer: list[mx.array]) -> np.ndarray:
            rows = mx.stack([a[0, :, :n_positions, :] for a in per_layer])
            return np.array(rows.astype(mx.float32).transpose(0, 2, 1, 3))
        return stacked(self.k), stacked(self.v)
