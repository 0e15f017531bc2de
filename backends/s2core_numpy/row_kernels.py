"""numba kernels for the small operations between the products: attention of one query row
over the cache, RMSNorm and RoPE.

Why: a decode step's products stream the weights at close to memory speed, and what runs
between them was a tenth of the step. In a real-size step (36 layers, 256 cached positions)
attention took ~200 us a layer as NumPy runs it (two batched BLAS products on 8 heads of
4 x 128 x 256, a softmax over temporaries), for 2 MB of K/V and 2 million multiply-adds;
RMSNorm ~30 us a call. BLAS's threads also spin after each product, on the cores the next
product's threads need.

Numbers: float32 throughout, as ops.py computes them; sums may be taken in another order
(fastmath "reassoc" lets LLVM vectorize a dot product's reduction), so results agree with
ops.py to float32 rounding. The one-row and the batched paths both call these, so a batched
row keeps the numbers of the row alone.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from .ops import RowOps, cached_attention
from .stack import stack_array


#: query heads that share one pass over their KV head's K and V rows
_HEADS = 4
#: columns of V summed at once in registers (stack.py): 4 vectors of 16 float32
_COLUMNS = 64


@njit(inline="always")
def _four(first, group, g0):
    """Query heads first + g0 .. first + g0 + 3, the ones past the group repeating its last
    (computed and not stored)."""
    last = first + group - 1
    return (first + g0, min(first + g0 + 1, last), min(first + g0 + 2, last),
            min(first + g0 + 3, last))


@njit(inline="always")
def _scores(q, k, hk, first, group, end, scale, w):
    """w[g, j] = q[first + g] . k[hk, j] * scale: each key's row is read once for four
    query heads."""
    d = q.shape[1]
    for g0 in range(0, group, _HEADS):
        h0, h1, h2, h3 = _four(first, group, g0)
        n = min(_HEADS, group - g0)
        for j in range(end):
            s0 = s1 = s2 = s3 = np.float32(0.0)
            for i in range(d):
                key = k[hk, j, i]
                s0 += q[h0, i] * key
                s1 += q[h1, i] * key
                s2 += q[h2, i] * key
                s3 += q[h3, i] * key
            w[g0, j] = s0 * scale
            if n > 1:
                w[g0 + 1, j] = s1 * scale
            if n > 2:
                w[g0 + 2, j] = s2 * scale
            if n > 3:
                w[g0 + 3, j] = s3 * scale


@njit(inline="always")
def _softmax(w, group, end):
    for g in range(group):
        top = np.float32(-np.inf)
        for j in range(end):
            top = max(top, w[g, j])
        total = np.float32(0.0)
        for j in range(end):
            e = np.exp(w[g, j] - top)
            w[g, j] = e
            total += e
        for j in range(end):
            w[g, j] /= total


@njit(inline="always")
def _weighted_rows(w, vh, first, group, end, out):
    """out[first + g] = sum_j w[g, j] * vh[j] over j < end; vh (capacity, d). Each row of V
    is read once for four query heads, in blocks of _COLUMNS columns whose sums stay in
    registers; the columns past the last block one at a time."""
    d = out.shape[1]
    acc = stack_array(_HEADS, _COLUMNS, np.float32)
    for g0 in range(0, group, _HEADS):
        n = min(_HEADS, group - g0)
        for c in range(d // _COLUMNS):
            acc[:] = 0.0
            for j in range(end):
                row = vh[j, c * _COLUMNS:(c + 1) * _COLUMNS]
                p0 = w[g0, j]
                p1 = w[g0 + 1, j] if n > 1 else np.float32(0.0)
                p2 = w[g0 + 2, j] if n > 2 else np.float32(0.0)
                p3 = w[g0 + 3, j] if n > 3 else np.float32(0.0)
                for i in range(_COLUMNS):
                    r = row[i]
                    acc[0, i] += p0 * r
                    acc[1, i] += p1 * r
                    acc[2, i] += p2 * r
                    acc[3, i] += p3 * r
            for g in range(n):
                for i in range(_COLUMNS):
                    out[first + g0 + g, c * _COLUMNS + i] = acc[g, i]
    for g in range(group):
        for i in range(d - d % _COLUMNS, d):
            s = np.float32(0.0)
            for j in range(end):
                s += w[g, j] * vh[j, i]
            out[first + g, i] = s


@njit(parallel=True, cache=True, fastmath={"reassoc", "contract"})
def _attend_last(q, k, v, end, scale, out):
    """out[h] = softmax(q[h] . k[hk, :end] * scale) @ v[hk, :end], hk = h // group: the
    newest position's query heads over every cached position (all visible to it).
    q, out (n_head, d); k, v (n_kv, capacity, d). One KV head (and its group of query heads)
    per item; its K and V rows are each read once for four query heads (at 1500 positions:
    0.41 -> 0.21 ms a layer against one head at a time, the same numbers)."""
    n_head = q.shape[0]
    n_kv = k.shape[0]
    group = n_head // n_kv
    for hk in prange(n_kv):
        w = np.empty((group, end), np.float32)
        _scores(q, k, hk, hk * group, group, end, scale, w)
        _softmax(w, group, end)
        _weighted_rows(w, v[hk], hk * group, group, end, out)


def attend_last(q: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray, end: int,
                scale: float) -> np.ndarray:
    """ops.causal_attention for one query row at position end - 1: q (1, n_head, d); k_cache,
    v_cache (n_kv, capacity, d) holding positions 0..end-1. Returns (1, n_head * d)."""
    n, n_head, d = q.shape
    out = np.empty((n_head, d), np.float32)
    _attend_last(np.ascontiguousarray(q[0]), k_cache, v_cache, end, np.float32(scale), out)
    return out.reshape(1, n_head * d)


@njit(cache=True, fastmath={"reassoc", "contract"})
def _rms_norm(x, weight, eps, out):
    n, dim = x.shape
    for r in range(n):
        ss = np.float32(0.0)
        for i in range(dim):
            ss += x[r, i] * x[r, i]
        inv = np.float32(1.0) / np.sqrt(ss / np.float32(dim) + eps)
        for i in range(dim):
            out[r, i] = x[r, i] * inv * weight[i]


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """ops.rms_norm: x / sqrt(mean(x^2) + eps) * weight over the last axis."""
    dim = x.shape[-1]
    rows = np.ascontiguousarray(x, dtype=np.float32).reshape(-1, dim)
    out = np.empty_like(rows)
    _rms_norm(rows, weight, np.float32(eps), out)
    return out.reshape(x.shape)


@njit(cache=True)
def _rope(x, cos, sin, out):
    n, heads, d = x.shape
    for r in range(n):
        for h in range(heads):
            for i in range(d // 2):
                x0, x1, c, s = x[r, h, 2 * i], x[r, h, 2 * i + 1], cos[r, i], sin[r, i]
                out[r, h, 2 * i] = x0 * c - x1 * s
                out[r, h, 2 * i + 1] = x0 * s + x1 * c


def rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """ops.apply_rope, the same float32 operations (no fused multiply-adds): NumPy's numbers
    bit for bit, without its six temporaries (~20 us a call in a step, 1 us here)."""
    out = np.empty(x.shape, np.float32)
    _rope(x, cos, sin, out)
    return out


def attention(q: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray, end: int, q_start: int,
              scale: float) -> np.ndarray:
    """ops.cached_attention: with this kernel for one query row at the newest position (a
    decode step, a Fast-AR call, the last row of a call that keeps only its last row)."""
    if q.shape[0] == 1 and q_start == end - 1:
        return attend_last(q, k_cache, v_cache, end, scale)
    return cached_attention(q, k_cache, v_cache, end, q_start, scale)


#: the block's norms, rotation and attention with these kernels
KERNEL_OPS = RowOps(rms_norm, rope, attention)
