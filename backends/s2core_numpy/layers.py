"""One transformer block on NumPy (SPEC 2.5), shared by the Slow-AR, the Fast-AR and the
several-sequence path (slots.py): its weights, the QKV projection, attention over a cache and
the block itself; and the Slow-AR's input embedding of a batch of token rows."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from s2core.plugin import EvalBatch, ModelFile, StackShape, load_block

from . import ops
from .ops import NUMPY_OPS, RowOps
from .weights import Weight, WeightLoader, gather, linear


@dataclass
class BlockWeights:
    """One transformer block's tensors, PyTorch order [out, in]; matrices float32 or kept
    as stored (tiled.TiledMatrix)."""

    attn_norm: np.ndarray
    ffn_norm: np.ndarray
    wqkv: Weight
    wo: Weight
    w1: Weight
    w3: Weight
    w2: Weight
    q_norm: np.ndarray | None
    k_norm: np.ndarray | None

    @classmethod
    def load(cls, wl: WeightLoader, prefix: str, qk_norm: bool) -> "BlockWeights":
        return cls(**load_block(prefix, qk_norm, wl.matrix, wl.vector))


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
