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
from numba import njit, prange, types
from numba.extending import overload

from .f16 import widen_half
from .ops import KV, Keys, RowOps, cached_attention
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


def _value(x):
    """A cached K or V value as float32 (compiled only: see the overload below)."""


@overload(_value)
def _value_of(x):
    """float32 as it is; float16, passed as its int16 bits (numba has no float16), widened
    exactly in registers (f16.widen_half): an f16 cache is read as it is held."""
    if isinstance(x, types.Integer):
        return lambda x: widen_half(x)
    return lambda x: x


@njit(inline="always")
def _scores(q, k, rows, hk, first, group, offset, scale, w):
    """w[g, offset + j] = q[first + g] . k[hk, j] * scale for the block's rows j < rows:
    each key's row is read once for four query heads."""
    d = q.shape[1]
    for g0 in range(0, group, _HEADS):
        h0, h1, h2, h3 = _four(first, group, g0)
        n = min(_HEADS, group - g0)
        for j in range(rows):
            s0 = s1 = s2 = s3 = np.float32(0.0)
            for i in range(d):
                key = _value(k[hk, j, i])
                s0 += q[h0, i] * key
                s1 += q[h1, i] * key
                s2 += q[h2, i] * key
                s3 += q[h3, i] * key
            w[g0, offset + j] = s0 * scale
            if n > 1:
                w[g0 + 1, offset + j] = s1 * scale
            if n > 2:
                w[g0 + 2, offset + j] = s2 * scale
            if n > 3:
                w[g0 + 3, offset + j] = s3 * scale


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
def _accumulate(acc, w, g0, n, v, rows, hk, offset, c):
    """acc[g, i] += w[g0 + g, offset + j] * v[hk, j, c * _COLUMNS + i] over the block's rows
    j < rows in order: each row of V is read once for four query heads."""
    for j in range(rows):
        p0 = w[g0, offset + j]
        p1 = w[g0 + 1, offset + j] if n > 1 else np.float32(0.0)
        p2 = w[g0 + 2, offset + j] if n > 2 else np.float32(0.0)
        p3 = w[g0 + 3, offset + j] if n > 3 else np.float32(0.0)
        for i in range(_COLUMNS):
            r = _value(v[hk, j, c * _COLUMNS + i])
            acc[0, i] += p0 * r
            acc[1, i] += p1 * r
            acc[2, i] += p2 * r
            acc[3, i] += p3 * r


@njit(inline="always")
def _column(w, g, v, rows, hk, offset, i, s):
    for j in range(rows):
        s += w[g, offset + j] * _value(v[hk, j, i])
    return s


@njit(inline="always")
def _weighted_rows(w, v0, n0, v1, n1, v2, n2, hk, first, group, out):
    """out[first + g] = sum_j w[g, j] * V[j], V's rows j held in the blocks v0, v1, v2 one
    after another (the first n0, n1, n2 rows of each [n_kv, capacity, d]): the sums run over
    j in order across the blocks, as over one block. In blocks of _COLUMNS columns whose sums
    stay in registers; the columns past the last block one at a time."""
    d = out.shape[1]
    o1 = n0
    o2 = n0 + n1
    acc = stack_array(_HEADS, _COLUMNS, np.float32)
    for g0 in range(0, group, _HEADS):
        n = min(_HEADS, group - g0)
        for c in range(d // _COLUMNS):
            acc[:] = 0.0
            _accumulate(acc, w, g0, n, v0, n0, hk, 0, c)
            _accumulate(acc, w, g0, n, v1, n1, hk, o1, c)
            _accumulate(acc, w, g0, n, v2, n2, hk, o2, c)
            for g in range(n):
                for i in range(_COLUMNS):
                    out[first + g0 + g, c * _COLUMNS + i] = acc[g, i]
    for g in range(group):
        for i in range(d - d % _COLUMNS, d):
            s = _column(w, g, v0, n0, hk, 0, i, np.float32(0.0))
            s = _column(w, g, v1, n1, hk, o1, i, s)
            out[first + g, i] = _column(w, g, v2, n2, hk, o2, i, s)


@njit(parallel=True, cache=True, fastmath={"reassoc", "contract"})
def _attend_last(q, n_kv, k0, v0, n0, k1, v1, n1, k2, v2, n2, scale, out):
    """out[h] = softmax(q[h] . K[hk] * scale) @ V[hk], hk = h // group: the newest
    position's query heads over every position, all visible to it, held in three blocks one
    after another: the first n0 rows of (k0, v0), n1 of (k1, v1), n2 of (k2, v2), each
    [n_kv, capacity, d] C-contiguous (float32, or float16 as int16 bits). q, out
    (n_head, d). One KV head (and its group of query heads) per item; its K and V rows are
    each read once for four query heads (at 1500 positions: 0.41 -> 0.21 ms a layer against
    one head at a time, the same numbers)."""
    n_head = q.shape[0]
    group = n_head // n_kv
    o1 = n0
    o2 = n0 + n1
    end = o2 + n2
    for hk in prange(n_kv):
        w = np.empty((group, end), np.float32)
        _scores(q, k0, n0, hk, hk * group, group, 0, scale, w)
        _scores(q, k1, n1, hk, hk * group, group, o1, scale, w)
        _scores(q, k2, n2, hk, hk * group, group, o2, scale, w)
        _softmax(w, group, end)
        _weighted_rows(w, v0, n0, v1, n1, v2, n2, hk, hk * group, group, out)


#: a block that holds no rows
_NO_ROWS = np.zeros((0, 0, 0), np.float32)


def _kernel_block(block: KV | None, rows: int | None = None) -> tuple:
    """(k, v, rows) as the kernel takes them: float16 as its int16 bits; rows: all of them
    unless given."""
    if block is None:
        return _NO_ROWS, _NO_ROWS, 0
    k, v = (a.view(np.int16) if a.dtype == np.float16 else a for a in block)
    return k, v, k.shape[1] if rows is None else rows


def attend_last(q: np.ndarray, keys: Keys, scale: float) -> np.ndarray:
    """ops.causal_attention for one query row at position keys.end - 1: q (1, n_head, d).
    Every block of keys is read where it is held. Returns (1, n_head * d)."""
    n, n_head, d = q.shape
    out = np.empty((n_head, d), np.float32)
    _attend_last(np.ascontiguousarray(q[0]), keys.cache[0].shape[0],
                 *_kernel_block(keys.prefix), *_kernel_block(keys.cache, keys.n_cached),
                 *_kernel_block(keys.new), np.float32(scale), out)
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


def attention(q: np.ndarray, keys: Keys, q_start: int, scale: float) -> np.ndarray:
    """ops.cached_attention: with this kernel for one query row at the newest position (a
    decode step, a Fast-AR call, the last row of a call that keeps only its last row)."""
    if q.shape[0] == 1 and q_start == keys.end - 1:
        return attend_last(q, keys, scale)
    return cached_attention(q, keys, q_start, scale)


#: the block's norms, rotation and attention with these kernels
KERNEL_OPS = RowOps(rms_norm, rope, attention)
