"""Several sequences per call on the NumPy backend: KV slots and the batched Slow-AR (the
batched Fast-AR is fast_ar.py's).

A decode step reads every weight once for one row; with B sequences in one call the linear
layers multiply B rows by each weight as it streams past (the numba kernels' few-row path,
tiled.py: each tile is read from memory once and used for every row; BLAS gemm for float32
weights), so B frames cost about one weight read. Attention stays per sequence: each slot's
rows see only that slot's cache.

The numbers of each row are those of the single-sequence path (layers.run_block): the same
projections, the same attention code on the same slices. With the numba F16 and Q8_0
kernels, whose few-row product accumulates each row exactly as their one-row product does,
a batched decode step gives bit-identical results; float32 weights go through BLAS, whose gemm
may sum in another order than its gemv (float32 rounding only).
"""

from __future__ import annotations

import numpy as np

from s2core.plugin import EvalBatch, pick_logit_rows, shared_logit_rows

from .layers import embed, run_block_segments
from .weights import output_logits


def segments_of(batches: list[EvalBatch]) -> list[tuple[int, int, int]]:
    out, lo = [], 0
    for b in batches:
        out.append((lo, lo + b.n_tokens, b.n_past))
        lo += b.n_tokens
    return out


class SlotCache:
    """n_slots caches [n_layer, n_head_kv, capacity, head_dim] of the cache's held type
    (float16 or float32: the backend's own single-sequence layout, one per slot), and shared
    prefixes in the same layout and type: a slot that starts with one (`attach`) holds only
    its own positions, from index 0 of its cache. A prefix's handle is a number never given
    twice, so removing one changes no other. read and write take float32, as the contract's
    read_kv_slot and write_kv_slot."""

    def __init__(self, n_slots: int, n_layer: int, n_head_kv: int, capacity: int,
                 head_dim: int, dtype: type = np.float32):
        shape = (n_slots, n_layer, n_head_kv, capacity, head_dim)
        self.dtype = dtype
        self.k = np.zeros(shape, dtype)
        self.v = np.zeros(shape, dtype)
        self.prefixes: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # read-only, held once
        self.attached: list[int | None] = [None] * n_slots            # a key of prefixes
        self._next_handle = 0

    def add_prefix(self, k: np.ndarray, v: np.ndarray) -> int:
        pair = tuple(np.ascontiguousarray(c.transpose(0, 2, 1, 3), self.dtype) for c in (k, v))
        for c in pair:
            c.flags.writeable = False
        handle, self._next_handle = self._next_handle, self._next_handle + 1
        self.prefixes[handle] = pair
        return handle

    def remove_prefix(self, handle: int) -> None:
        """Drop a prefix no slot references (its arrays are freed with the last reference)."""
        if handle not in self.prefixes:
            raise ValueError(f"no shared prefix {handle!r} (holding {sorted(self.prefixes)})")
        users = [s for s, h in enumerate(self.attached) if h == handle]
        if users:
            raise ValueError(f"shared prefix {handle} is still attached to slot(s) {users}")
        del self.prefixes[handle]

    def attach(self, slot: int, handle: int | None) -> None:
        if handle is not None and handle not in self.prefixes:
            raise ValueError(f"no shared prefix {handle!r} (holding {sorted(self.prefixes)})")
        self.attached[slot] = handle

    def prefix(self, slot: int, layer: int) -> tuple[np.ndarray, np.ndarray] | None:
        """(K, V) [n_head_kv, n, head_dim] of the slot's shared prefix in this layer."""
        h = self.attached[slot]
        return None if h is None else (self.prefixes[h][0][layer], self.prefixes[h][1][layer])

    def read(self, slot: int, n: int) -> tuple[np.ndarray, np.ndarray]:
        h = self.attached[slot]
        base = 0 if h is None else self.prefixes[h][0].shape[2]
        out = []
        for i, c in enumerate((self.k, self.v)):
            own = c[slot, :, :, :max(n - base, 0)]
            rows = own if h is None else np.concatenate(
                [self.prefixes[h][i][:, :, :min(n, base)], own], axis=2)
            out.append(rows.transpose(0, 2, 1, 3).astype(np.float32))  # a copy
        return tuple(out)

    def write(self, slot: int, k: np.ndarray, v: np.ndarray) -> None:
        n = k.shape[1]
        self.attached[slot] = None
        self.k[slot, :, :, :n] = k.transpose(0, 2, 1, 3)
        self.v[slot, :, :, :n] = v.transpose(0, 2, 1, 3)


def eval_slots(backend, cache: SlotCache, items: list[tuple[int, EvalBatch]]
               ) -> list[tuple[np.ndarray, np.ndarray]]:
    """(hidden, logits) of each item's last position; every weight read once for all rows."""
    s = backend.shape
    slots = [slot for slot, _ in items]
    batches = [b for _, b in items]
    segments = segments_of(batches)
    positions = np.concatenate([b.positions for b in batches])
    cos, sin = backend.row_ops.rope_tables(positions, s.head_dim, s.rope_base)
    x = np.concatenate([embed(backend.embeddings, backend.codebooks, b) for b in batches])
    last = len(backend.layers) - 1
    for i, blk in enumerate(backend.layers):
        x = run_block_segments(x, blk, s, cos, sin, segments,
                               lambda j, i=i: cache.k[slots[j], i],
                               lambda j, i=i: cache.v[slots[j], i],
                               i == last, lambda j, i=i: cache.prefix(slots[j], i),
                               backend.row_ops)
    hidden = backend.row_ops.rms_norm(x, backend.norm, s.eps)       # one row per item (last_only)
    rows = shared_logit_rows([b.logit_rows for b in batches])  # one read of the rows for all
    logits = output_logits(hidden, backend.embeddings, rows)
    return [(hidden[j].copy(), pick_logit_rows(logits[j], rows, b.logit_rows).copy())
            for j, b in enumerate(batches)]
