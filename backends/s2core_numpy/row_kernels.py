"""numba kernels for the small operations between the products: RMSNorm, RoPE, and the
attention of one query row over the cache (its kernel in attention.py).

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
from numba import njit

from . import kernel_cache  # noqa: F401  (first: numba's cache follows every source here)
from .attention import attend_last, attend_rows
from .ops import Keys, RowOps, cached_attention


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
    """ops.cached_attention: with attention.py's kernel for one query row at the newest
    position (a decode step, a Fast-AR call, the last row of a call that keeps only its last
    row)."""
    if q.shape[0] == 1 and q_start == keys.end - 1:
        return attend_last(q, keys, scale)
    return cached_attention(q, keys, q_start, scale)


#: the block's norms, rotation and attention with these kernels
KERNEL_OPS = RowOps(rms_norm, rope, attention, attend_rows=attend_rows)
