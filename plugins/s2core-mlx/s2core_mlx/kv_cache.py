"""The Slow-AR's KV cache as MLX arrays, allocated once per synthesis and written in place.

One K and one V array per layer, (1, n_head_kv, max_seq_len, head_dim): heads outermost, so
the rows a call reads are contiguous per head and the arrays feed
mx.fast.scaled_dot_product_attention directly. A call writes its rows with slice assignment;
when the graph runs, MLX updates the buffer in place (the previous array has no other user,
so its buffer is donated), which is why nothing here keeps a second reference to a layer's
array across a call.

The single-sequence cache and each KV slot are one KVCache. A slot may start with a shared
voice prefix (`SharedPrefix`, held once for every slot in that voice, in the cache type): the
slot's own rows then hold positions n and later from index 0, and attention reads the
prefix's rows, then the slot's own.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np


def _layer_rows(host: np.ndarray, dtype: mx.Dtype) -> mx.array:
    """One layer's float32 host rows (n, n_head_kv, d) as (1, n_head_kv, n, d) of `dtype`
    (exact: the values are already of that type)."""
    return mx.array(np.ascontiguousarray(host.transpose(1, 0, 2)))[None].astype(dtype)


class SharedPrefix:
    """One voice's K/V, read-only: per layer (1, n_head_kv, n, head_dim) in the cache type.
    Every slot attached to it reads these arrays; none writes into them."""

    def __init__(self, k: np.ndarray, v: np.ndarray, dtype: mx.Dtype):
        # k, v: float32 host [n_layer, n, n_head_kv, head_dim] holding values of the cache type
        self.k = [_layer_rows(layer, dtype) for layer in k]
        self.v = [_layer_rows(layer, dtype) for layer in v]
        mx.eval(self.k, self.v)  # hold them now: the core counted their bytes for this call

    @property
    def n(self) -> int:
        return self.k[0].shape[2]


class KVCache:
    def __init__(self, n_layer: int, n_head_kv: int, max_seq_len: int, head_dim: int,
                 dtype: mx.Dtype):
        shape = (1, n_head_kv, max_seq_len, head_dim)
        self.dtype = dtype
        self.max_seq_len = max_seq_len
        self.k = [mx.zeros(shape, dtype) for _ in range(n_layer)]
        self.v = [mx.zeros(shape, dtype) for _ in range(n_layer)]
        #: positions [0, prefix.n) of this cache's sequence; its own rows start after them
        self.prefix: SharedPrefix | None = None
        mx.eval(self.k, self.v)  # allocate now: init_kv_cache is where memory is committed

    @property
    def base(self) -> int:
        """Positions held by the attached shared prefix (0 without one)."""
        return 0 if self.prefix is None else self.prefix.n

    def append(self, layer: int, k: mx.array, v: mx.array, n_past: int
               ) -> tuple[mx.array, mx.array]:
        """Write this call's k, v (1, n_head_kv, n, d) at positions [n_past, n_past + n) and
        return the keys and values attention reads, as s2.cpp has them: history read back from
        the (rounded) cache, the shared prefix's rows first, this call's rows at compute
        precision (float32)."""
        own = n_past - self.base  # own rows start after the shared prefix's positions
        end = own + k.shape[2]
        self.k[layer][:, :, own:end, :] = k.astype(self.dtype)
        self.v[layer][:, :, own:end, :] = v.astype(self.dtype)
        keys, values = [k], [v]
        if own:
            # Rows below `own` are untouched by the write: reading them from the updated
            # array keeps the old one free for donation.
            keys.insert(0, self.k[layer][:, :, :own, :].astype(mx.float32))
            values.insert(0, self.v[layer][:, :, :own, :].astype(mx.float32))
        if self.prefix is not None:
            keys.insert(0, self.prefix.k[layer].astype(mx.float32))
            values.insert(0, self.prefix.v[layer].astype(mx.float32))
        if len(keys) == 1:
            return k, v
        return mx.concatenate(keys, axis=2), mx.concatenate(values, axis=2)

    def arrays(self) -> list[mx.array]:
        """Every buffer, for mx.eval at the end of a call."""
        return self.k + self.v

    def write(self, k: np.ndarray, v: np.ndarray) -> None:
        """Rows [0, n) of every layer from float32 host arrays [n_layer, n, n_head_kv, d]
        holding values of the cache type (the cast to it is exact); detaches a shared prefix
        (the rows written are then the sequence's first)."""
        self.prefix = None
        n = k.shape[1]
        for layers, host in ((self.k, k), (self.v, v)):
            for i in range(len(layers)):
                layers[i][:, :, :n, :] = _layer_rows(host[i], self.dtype)
        mx.eval(self.arrays())

    def read(self, n_positions: int) -> tuple[np.ndarray, np.ndarray]:
        """Copies of K and V for positions [0, n_positions) as float32
        [n_layer, n_positions, n_head_kv, head_dim]: the shared prefix's rows, then the
        cache's own."""
        n_shared = min(n_positions, self.base)
        n_own = n_positions - n_shared

        def stacked(own: list[mx.array], shared: list[mx.array] | None) -> np.ndarray:
            rows = [a[0, :, :n_own, :] for a in own]
            if shared is not None:
                rows = [mx.concatenate([p[0, :, :n_shared, :], r], axis=1)
                        for p, r in zip(shared, rows)]
            return np.array(mx.stack(rows).astype(mx.float32).transpose(0, 2, 1, 3))

        p = self.prefix
        return (stacked(self.k, None if p is None else p.k),
                stacked(self.v, None if p is None else p.v))


def buffer_address(a: mx.array) -> int:
    """Where an array's data lives (tests check that caches are written in place)."""
    view = np.asarray(a)
    address = view.__array_interface__["data"][0]
    del view  # a live view would keep MLX from updating the buffer in place
    return address
