"""Weight matrices kept in their file type and multiplied by numba kernels: the shared part.

Why: a decode step reads every weight once, so its time follows the bytes read. Widened to
float32, an F16 file streams 4 bytes a weight instead of 2, a Q8_0 file 4 instead of 1.125.
The kernels widen each weight in registers as they go, and compute what the float32 path
computes: float32 activations times the stored weights, accumulated in float32.

Layout. A row-major GEMV (one output per row, a reduction along the row) of narrow types
streams at only ~12 GB/s here: each row's dot product ends in a horizontal sum and the loads
are narrow. Tiling fixes both: TILE consecutive output rows are stored interleaved, as
(n_tiles, in_features, TILE), so a tile's data is contiguous and the innermost loop runs over
TILE independent outputs (pure vector FMAs, no horizontal sums). TILE = 64 streams at
24-28 GB/s on Zen 4; 16 and 32 are 2-3x slower, 128 is no better. Output counts that are not a
multiple of TILE are padded with zero rows.

Products of several rows (prefill) take one of two paths, switched at `gemm_rows`:
- few rows: the tile is read once from memory and every row is computed from it while it
  sits in L2 (the type's `_matmul` kernel);
- many rows: each tile is decoded to float32 (in, TILE) in a small buffer that stays in the
  core's L2 and multiplied by BLAS sgemm straight from there, one worker per core
  (tile_gemm.py, workers.py).

Modules that import this one import numba; the backend imports them only when numba is there.
"""

from __future__ import annotations

import copy
import os

# numba's threads are OpenMP's (GNU libgomp, read when numba starts them). Idle, they spin for
# GOMP's default 300,000 rounds (several ms) after every kernel, on the cores that the BLAS
# sgemm of the next product needs: a 256-row prefill product took 86 ms instead of 74. A
# short spin keeps kernels launched back to back (a decode step) just as fast. The user's own
# OpenMP settings win.
if "GOMP_SPINCOUNT" not in os.environ and "OMP_WAIT_POLICY" not in os.environ:
    os.environ["GOMP_SPINCOUNT"] = "10000"

import numpy as np  # noqa: E402

from .tile_gemm import tile_gemm  # noqa: E402

#: output rows per tile (see above)
TILE = 64
#: at or above this many rows, decode tile by tile to float32 and use sgemm (tile_gemm.py);
#: a type whose few-row kernel is cheaper sets its own `gemm_rows`. Above the most sequences a
#: batched step evaluates (plugin.MAX_BATCH_SEQUENCES, 16), so that a batched step's rows stay
#: bit-identical to one-row products; from 16 rows up the two paths cost about the same.
GEMM_ROWS = 17

def n_tiles(n_out: int) -> int:
    return -(-n_out // TILE)


class TiledMatrix:
    """A [out, in] matrix in the tiled layout; `m(x)` is x @ W^T for x (n, in) float32.
    Subclasses hold the type's data and supply its four kernels."""

    #: rows from which a product goes through tile_gemm instead of `_matmul` (see GEMM_ROWS)
    gemm_rows = GEMM_ROWS
    #: the arrays holding the tiles, tiles outermost (row_window slices each)
    tile_arrays: tuple[str, ...] = ("codes",)

    def __init__(self, codes: np.ndarray, n_out: int, n_in: int | None = None):
        self.codes = codes      # (n_tiles, ...): the type's storage, tiles outermost
        self.n_out = n_out      # real rows; the last tile may be padded
        self.n_in = codes.shape[1] if n_in is None else n_in  # (n_tiles, in, TILE) by default

    # the type's kernels -------------------------------------------------------------
    def _matvec(self, x: np.ndarray, out: np.ndarray) -> None:
        raise NotImplementedError

    def _matmul(self, x: np.ndarray, out: np.ndarray) -> None:
        raise NotImplementedError

    def _decode_tile(self, t: int, w: np.ndarray) -> None:
        """Tile t as float32 (in, TILE): w[i, j] is the weight of output t*TILE + j for input
        i. Single-threaded and without the GIL: tile_gemm runs one per core."""
        raise NotImplementedError

    def _gather(self, ids: np.ndarray, out: np.ndarray) -> None:
        raise NotImplementedError

    # shared -------------------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, int]:
        return self.n_out, self.n_in

    @property
    def nbytes(self) -> int:
        return self.codes.nbytes

    def __call__(self, x: np.ndarray) -> np.ndarray:
        """x (n, in) float32 -> (n, out) float32."""
        x = np.ascontiguousarray(x, dtype=np.float32)
        n = x.shape[0]
        padded = self.codes.shape[0] * TILE
        out = np.empty((n, padded), np.float32)
        if n == 1:
            self._matvec(x[0], out[0])
        elif n < self.gemm_rows:
            self._matmul(x, out)
        else:
            tile_gemm(self, x, out)
        return out if padded == self.n_out else out[:, :self.n_out]

    def row_window(self, start: int, stop: int, n: int) -> tuple["TiledMatrix", int] | None:
        """weights.row_window: the whole tiles holding rows [start, stop), as views; None
        from gemm_rows rows, which tile_gemm multiplies through BLAS."""
        if n >= self.gemm_rows:
            return None
        t0, t1 = start // TILE, -(-stop // TILE)
        window = copy.copy(self)
        for name in self.tile_arrays:
            setattr(window, name, getattr(self, name)[t0:t1])
        window.n_out = min(self.n_out, t1 * TILE) - t0 * TILE
        return window, start - t0 * TILE

    def rows(self, ids: np.ndarray) -> np.ndarray:
        """Rows `ids` as float32 (n, in): a lookup table decodes only what it gathers."""
        ids = np.ascontiguousarray(ids, dtype=np.int64).reshape(-1)
        out = np.empty((ids.shape[0], self.n_in), np.float32)
        self._gather(ids, out)
        return out

    def dequantize(self) -> np.ndarray:
        """The whole matrix as float32 (O, I) (tests and debugging)."""
        return self.rows(np.arange(self.n_out))
