"""Products of many rows on the workers (workers.py), one block of 64 outputs at a time.

Tiled matrices (kept in their file type): worker decodes tile t to float32 (in, TILE) in its
own buffer (640 KB for S2 Pro's 2560 inputs, within one core's 2 MB L2) and computes
out[:, t*TILE:(t+1)*TILE] = x @ tile with a single-threaded sgemm. The weights cross memory
once, in their file type, instead of being decoded into a whole float32 matrix that is
written out and read back (6 bytes a weight of traffic for F16: 7 ms of every 9728 x 2560
product, a third of it at 56 rows).

Float32 matrices (F32 files, widened tensors) go the same way, a block of 64 rows of W per
item, so that a call that holds BLAS to one thread (workers.py) still uses every core.

Measured on 9728 x 2560 F16, 2 cores, quiet (best of 15): 16 rows 20 -> 10 ms, 56 rows
26 -> 18, 343 rows 98 -> 92 (whole-matrix decode + BLAS's threads -> this).
"""

from __future__ import annotations

import threading

import numpy as np

from .workers import share

#: outputs per item of a float32 product
DENSE_BLOCK = 64

_local = threading.local()


def _tile_buffer(n_in: int, tile: int) -> np.ndarray:
    """This thread's float32 (n_in, tile) buffer, reused across products."""
    buf = getattr(_local, "buf", None)
    if buf is None or buf.shape != (n_in, tile):
        buf = _local.buf = np.empty((n_in, tile), np.float32)
    return buf


def tile_gemm(matrix, x: np.ndarray, out: np.ndarray) -> None:
    """out (n, padded out) = x (n, in) @ W^T for a tiled matrix (tiled.TiledMatrix)."""
    n_tiles = matrix.codes.shape[0]
    tile = out.shape[1] // n_tiles

    def product(t: int) -> None:
        w = _tile_buffer(x.shape[1], tile)
        matrix._decode_tile(t, w)
        np.matmul(x, w, out=out[:, t * tile:(t + 1) * tile])

    share(product, n_tiles)


def dense_gemm(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """x (n, in) @ w^T for a float32 w (out, in), DENSE_BLOCK outputs per item."""
    out = np.empty((x.shape[0], w.shape[0]), np.float32)

    def product(b: int) -> None:
        rows = slice(b * DENSE_BLOCK, (b + 1) * DENSE_BLOCK)
        np.matmul(x, w[rows].T, out=out[:, rows])

    share(product, -(-w.shape[0] // DENSE_BLOCK))
    return out
