"""Several sequences per call on the NumPy backend: KV slots, batched Slow-AR and Fast-AR.

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

from dataclasses import dataclass

import numpy as np

from s2core.plugin import StackShape
from s2core.plugin import EvalBatch

from . import ops
from .layers import embed, qkv_projection
from .weights import gather, linear


def run_block_segments(x: np.ndarray, blk, s: StackShape, cos: np.ndarray, sin: np.ndarray,
                       segments: list[tuple[int, int, int]], k_layer, v_layer,
                       last_only: bool, round_f16: bool, prefix_layer=None,
                       row_ops: ops.RowOps = ops.NUMPY_OPS) -> np.ndarray:
    """layers.run_block for several sequences: x holds every segment's rows. segments:
    (lo, hi, start) per sequence; k_layer(i) / v_layer(i): segment i's cache of this layer.
    prefix_layer(i): None, or the (K, V) of this layer of the shared prefix segment i starts
    with: its n rows are positions [0, n), and its own cache holds positions n and later.
    last_only: only each segment's last row is returned (in segment order).
    row_ops: the norms', rotation's and attention's code, as on the one-sequence path."""
    q, k, v = qkv_projection(x, blk, s, cos, sin, row_ops=row_ops)
    attn, kept = [], []
    for i, (lo, hi, start) in enumerate(segments):
        end = start + hi - lo
        shared = None if prefix_layer is None else prefix_layer(i)
        base = 0 if shared is None else shared[0].shape[1]
        k_cache, v_cache = k_layer(i), v_layer(i)
        k_new, v_new = k_cache[:, start - base:end - base], v_cache[:, start - base:end - base]
        k_new[...] = k[lo:hi].transpose(1, 0, 2)  # unrounded within this call, as run_block
        v_new[...] = v[lo:hi].transpose(1, 0, 2)
        q_lo, q_start = lo, start
        if last_only and hi - lo > 1:
            q_lo, q_start = hi - 1, end - 1
        if shared is None:
            attn.append(row_ops.attention(q[q_lo:hi], k_cache, v_cache, end, q_start,
                                          s.attn_scale))
        else:
            attn.append(prefixed_attention(q[q_lo:hi], *shared, k_cache[:, :end - base],
                                           v_cache[:, :end - base], q_start, s.attn_scale))
        kept.append((q_lo, hi))
        if round_f16:
            k_new[...] = k_new.astype(np.float16)
            v_new[...] = v_new.astype(np.float16)
    if sum(hi - lo for lo, hi in kept) != x.shape[0]:  # last_only dropped earlier rows
        x = np.concatenate([x[lo:hi] for lo, hi in kept])
    a = attn[0] if len(attn) == 1 else np.concatenate(attn)
    h = x + linear(a, blk.wo)
    f = row_ops.rms_norm(h, blk.ffn_norm, s.eps)
    return h + linear(ops.silu(linear(f, blk.w1)) * linear(f, blk.w3), blk.w2)


def prefixed_attention(q: np.ndarray, k_prefix: np.ndarray, v_prefix: np.ndarray,
                       k: np.ndarray, v: np.ndarray, q_start: int, scale: float) -> np.ndarray:
    """ops.causal_attention over keys held in two blocks, the shared prefix's (positions
    [0, n)) and then the sequence's own (positions n and later), without joining them: the
    scores of both blocks go into one softmax, and the weighted sum reads each block's V in
    place. Only the order of that last sum differs from one block (float32 rounding)."""
    n, n_head, d = q.shape
    n_kv, p = k_prefix.shape[0], k_prefix.shape[1]
    t = p + k.shape[1]
    group = n_head // n_kv
    qg = q.reshape(n, n_kv, group, d).transpose(1, 2, 0, 3).reshape(n_kv, group * n, d)
    scores = np.empty((n_kv, group * n, t), np.float32)
    scores[:, :, :p] = np.matmul(qg, k_prefix.transpose(0, 2, 1))
    scores[:, :, p:] = np.matmul(qg, k.transpose(0, 2, 1))
    scores *= np.float32(scale)
    w = ops.causal_softmax(scores.reshape(n_kv, group, n, t), q_start).reshape(n_kv, group * n, t)
    out = np.matmul(w[:, :, :p], v_prefix) + np.matmul(w[:, :, p:], v)  # (n_kv, group*n, d)
    return out.reshape(n_kv, group, n, d).transpose(2, 0, 1, 3).reshape(n, n_head * d)


def segments_of(batches: list[EvalBatch]) -> list[tuple[int, int, int]]:
    out, lo = [], 0
    for b in batches:
        out.append((lo, lo + b.n_tokens, b.n_past))
        lo += b.n_tokens
    return out


class SlotCache:
    """n_slots caches [n_layer, n_head_kv, capacity, head_dim] float32 (the backend's own
    single-sequence layout, one per slot), and shared prefixes in the same layout: a slot
    that starts with one (`attach`) holds only its own positions, from index 0 of its cache.
    A prefix's handle is a number never given twice, so removing one changes no other."""

    def __init__(self, n_slots: int, n_layer: int, n_head_kv: int, capacity: int,
                 head_dim: int):
        shape = (n_slots, n_layer, n_head_kv, capacity, head_dim)
        self.k = np.zeros(shape, np.float32)
        self.v = np.zeros(shape, np.float32)
        self.prefixes: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # read-only, held once
        self.attached: list[int | None] = [None] * n_slots            # a key of prefixes
        self._next_handle = 0

    def add_prefix(self, k: np.ndarray, v: np.ndarray) -> int:
        pair = tuple(np.ascontiguousarray(c.transpose(0, 2, 1, 3), np.float32) for c in (k, v))
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
            out.append(rows.transpose(0, 2, 1, 3).copy())
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
    cos, sin = ops.rope_tables(positions, s.head_dim, s.rope_base)
    x = np.concatenate([embed(backend.embeddings, backend.model_file, b) for b in batches])
    last = len(backend.layers) - 1
    for i, blk in enumerate(backend.layers):
        x = run_block_segments(x, blk, s, cos, sin, segments,
                               lambda j, i=i: cache.k[slots[j], i],
                               lambda j, i=i: cache.v[slots[j], i],
                               i == last, backend.round_f16,
                               lambda j, i=i: cache.prefix(slots[j], i), backend.row_ops)
    hidden = backend.row_ops.rms_norm(x, backend.norm, s.eps)       # one row per item (last_only)
    logits = linear(hidden, backend.embeddings)
    return [(hidden[j].copy(), logits[j].copy()) for j in range(len(items))]


# ------------------------------------------------------------------------------ Fast-AR
@dataclass
class FastBatchState:
    """B Fast-AR sequences at the same position: K/V (B, n_layer, n_head_kv, capacity, d)."""

    k: np.ndarray
    v: np.ndarray
    n: int = 0


def fast_begin_batch(fast, hiddens: np.ndarray) -> tuple[FastBatchState, np.ndarray]:
    """Position 0 of B sequences: project_in(hidden) or hidden; logits (B, codebook_size)."""
    s = fast.shape
    b = hiddens.shape[0]
    shape = (b, len(fast.layers), s.n_head_kv, fast.capacity, s.head_dim)
    state = FastBatchState(np.zeros(shape, np.float32), np.zeros(shape, np.float32))
    x = np.ascontiguousarray(hiddens, dtype=np.float32)
    if fast.project_in is not None:
        x = linear(x, fast.project_in)
    return state, _fast_run(fast, state, x)


def fast_extend_batch(fast, state: FastBatchState, codes: np.ndarray) -> np.ndarray:
    """One more code for every sequence (codes (B,)); logits (B, codebook_size)."""
    return _fast_run(fast, state, gather(fast.embeddings, np.asarray(codes, dtype=np.int64)))


def _fast_run(fast, state: FastBatchState, x: np.ndarray) -> np.ndarray:
    s, start, b = fast.shape, state.n, x.shape[0]
    cos, sin = ops.rope_tables(np.full(b, start, dtype=np.int64), s.head_dim, s.rope_base)
    segments = [(r, r + 1, start) for r in range(b)]
    last = len(fast.layers) - 1
    for i, blk in enumerate(fast.layers):
        x = run_block_segments(x, blk, s, cos, sin, segments,
                               lambda r, i=i: state.k[r, i], lambda r, i=i: state.v[r, i],
                               i == last, False, row_ops=fast.row_ops)
    state.n = start + 1
    return linear(fast.row_ops.rms_norm(x, fast.norm, s.eps), fast.output)
