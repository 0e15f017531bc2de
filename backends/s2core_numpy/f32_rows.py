"""Float32 matrices (F32 files, used in place from the memory map) times one to a few rows:
each weight read from memory once for all rows, each row summed in one fixed order.

Why not BLAS: OpenBLAS's sgemm packs the matrix into panels for every call, so a few rows of
a 9728 x 2560 product cost 2.9x (2 rows) and 3.7x (4 rows) one row's gemv (eight such
matrices in turn, 2 cores): a batched decode step of an F32 file gained almost nothing from
its sequences, and torch beat NumPy 1.46x with four (docs/backend-choice.md). Here a row of
W is read once and multiplied into up to four activation rows while it sits in L1, and the
rows to come are prefetched (prefetch.py): without that the kernels streamed at about half
BLAS's gemv rate whenever another process was reading memory (8 matrices of 9728 x 2560, one
row: 91-96 against 59-65 ms for gemv; with it 55-59).

Each row's sum runs the same way whatever the batch: LANES partial sums over the inputs in
order (a multiply-add each, fastmath "contract"), added in a fixed tree, then the inputs past
the last whole LANES in order. So a row of a batched product equals its one-row product bit
for bit (a sequence gets the numbers it gets alone), as the kept types' few-row kernels do
(fewrows.py). From GEMM_ROWS rows (a prefill) BLAS is the faster, on the workers
(tile_gemm.dense_gemm).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from . import kernel_cache  # noqa: F401  (first: numba's cache follows every source here)
from .prefetch import prefetch
from .stack import stack_array
from .tile_gemm import dense_gemm
from .tiled import GEMM_ROWS

#: partial sums per row and output: two 256-bit registers
LANES = 16
#: activation rows multiplied from each loaded weight
GROUP = 4
#: outputs per parallel item
BLOCK = 64


@njit(inline="always")
def _lanes():
    return stack_array(1, LANES, np.float32)[0]


@njit(inline="always")
def _finish(acc, w, x, whole):
    """The partial sums in a fixed tree, then the inputs past `whole` in order: w, x 1-D."""
    h = LANES // 2
    while h:
        for lane in range(h):
            acc[lane] += acc[lane + h]
        h //= 2
    s = acc[0]
    for i in range(whole, w.shape[0]):
        s += w[i] * x[i]
    return s


@njit(inline="always")
def _zero(a0, a1, a2, a3):
    a0[:] = 0.0
    a1[:] = 0.0
    a2[:] = 0.0
    a3[:] = 0.0


@njit(parallel=True, cache=True, fastmath={"contract"})
def _products(w, x, out):
    """out (n, O) = x (n, I) @ w (O, I)^T, n a multiple of GROUP; w, x C-contiguous. Two
    outputs at a time: each activation load feeds two multiply-adds, each weight load four."""
    n_out, n_in = w.shape
    n = x.shape[0]
    chunks = n_in // LANES
    whole = chunks * LANES
    xc = x[:, :whole].copy().reshape(n, chunks, LANES)
    flat = w.reshape(-1)
    for blk in prange((n_out + BLOCK - 1) // BLOCK):
        a0, a1, a2, a3 = _lanes(), _lanes(), _lanes(), _lanes()
        b0, b1, b2, b3 = _lanes(), _lanes(), _lanes(), _lanes()
        end = min(n_out, (blk + 1) * BLOCK)
        for o in range(blk * BLOCK, end, 2):
            p = min(o + 1, end - 1)  # an odd last output is computed twice
            wo, wp = w[o], w[p]
            wco, wcp = wo[:whole].reshape(chunks, LANES), wp[:whole].reshape(chunks, LANES)
            for g in range(0, n, GROUP):
                _zero(a0, a1, a2, a3)
                _zero(b0, b1, b2, b3)
                x0, x1, x2, x3 = xc[g], xc[g + 1], xc[g + 2], xc[g + 3]
                ahead = (o + 2) * n_in  # the next two rows, a line of each per chunk
                for k in range(chunks):
                    if g == 0:
                        prefetch(flat, ahead + k * LANES)
                        prefetch(flat, ahead + n_in + k * LANES)
                    for lane in range(LANES):
                        u, v = wco[k, lane], wcp[k, lane]
                        y0, y1, y2, y3 = x0[k, lane], x1[k, lane], x2[k, lane], x3[k, lane]
                        a0[lane] += u * y0
                        a1[lane] += u * y1
                        a2[lane] += u * y2
                        a3[lane] += u * y3
                        b0[lane] += v * y0
                        b1[lane] += v * y1
                        b2[lane] += v * y2
                        b3[lane] += v * y3
                out[g, o] = _finish(a0, wo, x[g], whole)
                out[g + 1, o] = _finish(a1, wo, x[g + 1], whole)
                out[g + 2, o] = _finish(a2, wo, x[g + 2], whole)
                out[g + 3, o] = _finish(a3, wo, x[g + 3], whole)
                out[g, p] = _finish(b0, wp, x[g], whole)
                out[g + 1, p] = _finish(b1, wp, x[g + 1], whole)
                out[g + 2, p] = _finish(b2, wp, x[g + 2], whole)
                out[g + 3, p] = _finish(b3, wp, x[g + 3], whole)


@njit(parallel=True, cache=True, fastmath={"contract"})
def _product_row(w, x, out):
    """_products for one row (x (1, I)), four outputs at a time, each output's sums as there."""
    n_out, n_in = w.shape
    chunks = n_in // LANES
    whole = chunks * LANES
    xc = x[0, :whole].copy().reshape(chunks, LANES)
    flat = w.reshape(-1)
    for blk in prange((n_out + BLOCK - 1) // BLOCK):
        a0, a1, a2, a3 = _lanes(), _lanes(), _lanes(), _lanes()
        end = min(n_out, (blk + 1) * BLOCK)
        for o in range(blk * BLOCK, end, 4):
            o1, o2, o3 = min(o + 1, end - 1), min(o + 2, end - 1), min(o + 3, end - 1)
            w0, w1, w2, w3 = w[o], w[o1], w[o2], w[o3]
            c0, c1 = w0[:whole].reshape(chunks, LANES), w1[:whole].reshape(chunks, LANES)
            c2, c3 = w2[:whole].reshape(chunks, LANES), w3[:whole].reshape(chunks, LANES)
            _zero(a0, a1, a2, a3)
            ahead = (o + 4) * n_in  # the next four rows, a line of each per chunk
            for k in range(chunks):
                for j in range(4):
                    prefetch(flat, ahead + j * n_in + k * LANES)
                for lane in range(LANES):
                    y = xc[k, lane]
                    a0[lane] += c0[k, lane] * y
                    a1[lane] += c1[k, lane] * y
                    a2[lane] += c2[k, lane] * y
                    a3[lane] += c3[k, lane] * y
            out[0, o] = _finish(a0, w0, x[0], whole)
            out[0, o1] = _finish(a1, w1, x[0], whole)
            out[0, o2] = _finish(a2, w2, x[0], whole)
            out[0, o3] = _finish(a3, w3, x[0], whole)


class F32Matrix:
    """A float32 [out, in] matrix, held as given (the file's memory map: no copy); `m(x)` is
    x @ W^T."""

    def __init__(self, w: np.ndarray):
        # the kernels read rows in order; a mapped F32 tensor already is (no copy)
        self.w = np.ascontiguousarray(w)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        x = np.ascontiguousarray(x, dtype=np.float32)
        if x.shape[0] >= GEMM_ROWS:
            return dense_gemm(x, self.w)
        # rows padded with zeros to whole groups: one row costs four rows' multiply-adds,
        # which still outrun memory (a one-row loop of its own did not vectorize: numba
        # turned it into gathers)
        n = x.shape[0]
        if n == 1:
            out = np.empty((1, self.w.shape[0]), np.float32)
            _product_row(self.w, x, out)
            return out
        padded = np.zeros((-(-n // GROUP) * GROUP, x.shape[1]), np.float32)
        padded[:n] = x
        out = np.empty((padded.shape[0], self.w.shape[0]), np.float32)
        _products(self.w, padded, out)
        return out[:n]

    def row_window(self, start: int, stop: int, n: int) -> tuple["F32Matrix", int] | None:
        """weights.row_window: rows [start, stop) in place; None from GEMM_ROWS rows (BLAS)."""
        if n >= GEMM_ROWS:
            return None
        return F32Matrix(self.w[start:stop]), 0

    def rows(self, ids: np.ndarray) -> np.ndarray:
        return self.w[ids].astype(np.float32)

    def dequantize(self) -> np.ndarray:
        return np.asarray(self.w, np.float32)

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.w.shape)

    @property
    def nbytes(self) -> int:
        return self.w.nbytes
