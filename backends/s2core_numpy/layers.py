"""One transformer block on NumPy (SPEC 2.5), shared by the Slow-AR, the Fast-AR and the
several-sequence path (slots.py): the QKV projection, attention over a cache, the block over
one sequence's rows (run_block) and over several sequences' (run_block_segments, whose rows
get run_block's numbers); and the Slow-AR's input embedding of a batch of token rows."""

from __future__ import annotations

import numpy as np

from s2core.plugin import BlockWeights, EvalBatch, ModelFile, StackShape

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


def attention(q: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray, end: int, q_start: int,
              scale: float, on_workers: bool, row_ops: RowOps) -> np.ndarray:
    """row_ops.attention over cache positions 0..end-1; on_workers: one KV head (and its query
    heads) per item."""
    n, n_head, d = q.shape
    n_kv = k_cache.shape[0]
    if not on_workers or n == 1 or n_kv == 1:
        return row_ops.attention(q, k_cache, v_cache, end, q_start, scale)
    from .workers import share
    k, v = k_cache[:, :end], v_cache[:, :end]
    group = n_head // n_kv
    out = np.empty((n, n_head * d), np.float32)

    def kv_head(h: int) -> None:  # its columns: query heads h*group .. (h+1)*group - 1
        out[:, h * group * d:(h + 1) * group * d] = ops.causal_attention(
            q[:, h * group:(h + 1) * group], k[h:h + 1], v[h:h + 1], q_start, scale)

    share(kv_head, n_kv)
    return out


def run_block(x: np.ndarray, blk: BlockWeights, s: StackShape, cos: np.ndarray,
              sin: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray, start: int,
              last_only: bool, round_f16: bool, on_workers: bool = False,
              row_ops: RowOps = NUMPY_OPS) -> np.ndarray:
    """One block over the rows x at positions start.. with the layer's cache (n_head_kv,
    capacity, head_dim) float32. last_only: only the last row's output is needed.
    on_workers: every product and the attention run on the workers (workers.py).
    row_ops: the norms', the rotation's and the attention's code (ops.RowOps)."""
    n = x.shape[0]
    end = start + n
    q, k, v = qkv_projection(x, blk, s, cos, sin, on_workers, row_ops)
    k_new, v_new = k_cache[:, start:end], v_cache[:, start:end]
    k_new[...] = k.transpose(1, 0, 2)  # unrounded: this call attends to its own K/V in f32
    v_new[...] = v.transpose(1, 0, 2)
    q_start = start
    if last_only and n > 1:
        # Only the last position reaches the output: skip the others' attention and FFN.
        x, q, q_start = x[-1:], q[-1:], end - 1
    attn = attention(q, k_cache, v_cache, end, q_start, s.attn_scale, on_workers, row_ops)
    if round_f16:
        # What later calls read: the values an F16 cache holds (n rows, not the history).
        k_new[...] = k_new.astype(np.float16)
        v_new[...] = v_new.astype(np.float16)
    on_workers = on_workers and x.shape[0] > 1
    h = x + linear(attn, blk.wo, on_workers)
    f = row_ops.rms_norm(h, blk.ffn_norm, s.eps)
    gate_up = ops.silu(linear(f, blk.w1, on_workers)) * linear(f, blk.w3, on_workers)
    return h + linear(gate_up, blk.w2, on_workers)


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


def embed(embeddings: Weight, model_file: ModelFile, batch: EvalBatch) -> np.ndarray:
    """The Slow-AR's input rows: the token's embedding plus, on semantic rows, the sum of its
    codes' codebook embeddings, times the row's scale (SPEC 2.4)."""
    x = gather(embeddings, batch.token_ids)
    sem = np.flatnonzero(batch.semantic_mask)
    if sem.size:
        ids = batch.codebook_ids[sem]  # (n_sem, C): only semantic rows are decoded
        rows = model_file.dequantize_rows("codebook_embeddings.weight", ids.reshape(-1))
        x[sem] += rows.reshape(ids.shape[0], ids.shape[1], -1).sum(axis=1)
    return x * batch.scale[:, None]
