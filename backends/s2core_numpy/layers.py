"""One transformer block on NumPy (SPEC 2.5), shared by the Slow-AR, the Fast-AR and the
several-sequence path (slots.py): the QKV projection, attention over a cache, the block over
one sequence's rows (run_block) and over several sequences' (run_block_segments, whose rows
get run_block's numbers); and the Slow-AR's input embedding of a batch of token rows."""

from __future__ import annotations

import numpy as np

from s2core.plugin import BlockWeights, EvalBatch, StackShape

from . import ops
from .ops import NUMPY_OPS, RowOps
from .weights import Weight, gather, linear


def qkv_projection(x: np.ndarray, blk: BlockWeights, s: StackShape, cos: np.ndarray,
                   sin: np.ndarray, on_workers: bool = False, row_ops: RowOps = NUMPY_OPS
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """q (n, n_head, d) and k, v (n, n_head_kv, d), QK-normed and rotated."""
    n = x.shape[0]
    qkv = linear(row_ops.rms_norm(x, blk.attn_norm, s.eps), blk.wqkv, on_workers)
    q_size, kv_size = s.q_size, s.kv_size
    q = qkv[:, :q_size].reshape(n, s.n_head, s.head_dim)
    k = qkv[:, q_size:q_size + kv_size].reshape(n, s.n_head_kv, s.head_dim)
    v = qkv[:, q_size + kv_size:].reshape(n, s.n_head_kv, s.head_dim)
    if blk.q_norm is not None:
        q = row_ops.rms_norm(q, blk.q_norm, s.eps)
        k = row_ops.rms_norm(k, blk.k_norm, s.eps)
    return row_ops.rope(q, cos, sin), row_ops.rope(k, cos, sin), v


def visible_keys(k_cache: np.ndarray, v_cache: np.ndarray, lo: int, k_rows: np.ndarray,
                 v_rows: np.ndarray, prefix: ops.KV | None = None) -> ops.Keys:
    """The keys a call's queries attend to: the prefix's rows (if any), the cache's rows
    [0, lo) and the call's own rows k_rows, v_rows (n_kv, n, d), which go to cache rows
    [lo, lo + n). A float32 cache takes them now and is read as one block; a float16 cache
    gets them from keep_rows after the attention, which reads them unrounded (as s2.cpp: they
    are computed in float32 in the same graph), and later calls read them rounded."""
    hi = lo + k_rows.shape[1]
    if k_cache.dtype == np.float32:
        k_cache[:, lo:hi] = k_rows
        v_cache[:, lo:hi] = v_rows
        return ops.Keys(prefix, (k_cache, v_cache), hi)
    return ops.Keys(prefix, (k_cache, v_cache), lo,
                    (np.ascontiguousarray(k_rows), np.ascontiguousarray(v_rows)))


def keep_rows(k_cache: np.ndarray, v_cache: np.ndarray, lo: int, keys: ops.Keys) -> None:
    """The call's own rows into a float16 cache (rounded to nearest) once attention has read
    them (a float32 cache holds them already: visible_keys)."""
    if keys.new is not None:
        hi = lo + keys.new[0].shape[1]
        k_cache[:, lo:hi] = keys.new[0]
        v_cache[:, lo:hi] = keys.new[1]


def attention(q: np.ndarray, keys: ops.Keys, q_start: int, scale: float, on_workers: bool,
              row_ops: RowOps) -> np.ndarray:
    """row_ops.attention over keys; on_workers: one KV head (and its query heads) per item,
    unless row_ops spreads the attention over the cores itself."""
    n, n_head, d = q.shape
    n_kv = keys.cache[0].shape[0]
    if not on_workers or n == 1 or n_kv == 1 or row_ops.parallel_attention:
        return row_ops.attention(q, keys, q_start, scale)
    from .workers import share
    k, v = keys.joined()
    group = n_head // n_kv
    out = np.empty((n, n_head * d), np.float32)

    def kv_head(h: int) -> None:  # its columns: query heads h*group .. (h+1)*group - 1
        out[:, h * group * d:(h + 1) * group * d] = ops.causal_attention(
            q[:, h * group:(h + 1) * group], k[h:h + 1], v[h:h + 1], q_start, scale)

    share(kv_head, n_kv)
    return out


def run_block(x: np.ndarray, blk: BlockWeights, s: StackShape, cos: np.ndarray,
              sin: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray, start: int,
              last_only: bool, on_workers: bool = False,
              row_ops: RowOps = NUMPY_OPS) -> np.ndarray:
    """One block over the rows x at positions start.. with the layer's cache (n_head_kv,
    capacity, head_dim), float32 or float16 (the cache type: visible_keys). last_only: only
    the last row's output is needed. on_workers: every product and the attention run on the
    workers (workers.py). row_ops: the norms', the rotation's and the attention's code
    (ops.RowOps)."""
    n = x.shape[0]
    end = start + n
    q, k, v = qkv_projection(x, blk, s, cos, sin, on_workers, row_ops)
    keys = visible_keys(k_cache, v_cache, start, k.transpose(1, 0, 2), v.transpose(1, 0, 2))
    q_start = start
    if last_only and n > 1:
        # Only the last position reaches the output: skip the others' attention and FFN.
        x, q, q_start = x[-1:], q[-1:], end - 1
    attn = attention(q, keys, q_start, s.attn_scale, on_workers, row_ops)
    keep_rows(k_cache, v_cache, start, keys)
    on_workers = on_workers and x.shape[0] > 1
    return block_tail(x, attn, blk, s, row_ops, on_workers)


def block_tail(x: np.ndarray, attn: np.ndarray, blk: BlockWeights, s: StackShape,
               row_ops: RowOps, on_workers: bool = False) -> np.ndarray:
    """What follows a block's attention: its output projection added to x, then the
    feed-forward (RMSNorm, SwiGLU of the gate and up products, down product) added on."""
    h = x + linear(attn, blk.wo, on_workers)
    f = row_ops.rms_norm(h, blk.ffn_norm, s.eps)
    gate_up = row_ops.swiglu(linear(f, blk.w1, on_workers), linear(f, blk.w3, on_workers))
    return h + linear(gate_up, blk.w2, on_workers)


def run_block_segments(x: np.ndarray, blk, s: StackShape, cos: np.ndarray, sin: np.ndarray,
                       segments: list[tuple[int, int, int]], k_layer, v_layer,
                       last_only: bool, prefix_layer=None,
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
        own = start - (0 if shared is None else shared[0].shape[1])  # index in its cache
        k_cache, v_cache = k_layer(i), v_layer(i)
        keys = visible_keys(k_cache, v_cache, own, k[lo:hi].transpose(1, 0, 2),
                            v[lo:hi].transpose(1, 0, 2), shared)
        q_lo, q_start = lo, start
        if last_only and hi - lo > 1:
            q_lo, q_start = hi - 1, end - 1
        attn.append(row_ops.attention(q[q_lo:hi], keys, q_start, s.attn_scale))
        keep_rows(k_cache, v_cache, own, keys)
        kept.append((q_lo, hi))
    if sum(hi - lo for lo, hi in kept) != x.shape[0]:  # last_only dropped earlier rows
        x = np.concatenate([x[lo:hi] for lo, hi in kept])
    a = attn[0] if len(attn) == 1 else np.concatenate(attn)
    return block_tail(x, a, blk, s, row_ops)


def run_block_rows(x: np.ndarray, blk: BlockWeights, s: StackShape, cos: np.ndarray,
                   sin: np.ndarray, k_layer: np.ndarray, v_layer: np.ndarray, start: int,
                   row_ops: RowOps) -> np.ndarray:
    """layers.run_block_segments for B sequences of one new row each (x (B, dim)), all at
    position `start`, whose caches of this layer are one float32 array each (B, n_head_kv,
    capacity, head_dim): the new rows go into the caches, then row_ops.attend_rows attends
    all B rows in one call (a call per sequence cost ~40 us of Python and thread start-up,
    some 8 % of a Fast-AR pass of 8 rows). Each row gets the numbers it gets alone."""
    q, k, v = qkv_projection(x, blk, s, cos, sin, row_ops=row_ops)
    k_layer[:, :, start] = k
    v_layer[:, :, start] = v
    a = row_ops.attend_rows(q, k_layer, v_layer, start + 1, s.attn_scale)
    return block_tail(x, a, blk, s, row_ops)


def embed(embeddings: Weight, codebooks: Weight, batch: EvalBatch) -> np.ndarray:
    """The Slow-AR's input rows: the token's embedding plus, on semantic rows, the sum of its
    codes' codebook embeddings (`codebooks`: WeightLoader.lookup), times the row's scale
    (SPEC 2.4)."""
    x = gather(embeddings, batch.token_ids)
    sem = np.flatnonzero(batch.semantic_mask)
    if sem.size:
        ids = batch.codebook_ids[sem]  # (n_sem, C): only semantic rows are decoded
        rows = gather(codebooks, ids.reshape(-1))
        x[sem] += rows.reshape(ids.shape[0], ids.shape[1], -1).sum(axis=1)
    return x * batch.scale[:, None]
