"""Q8_0 weights kept as int8, multiplied straight from the blocks by numba kernels.

Why: a decode step reads every weight once, so its time follows the bytes read. Widened to
float32, a Q8_0 file streams 4 bytes a weight; kept as int8 codes with one float32 scale per
32 weights, 1.125. The products are exact in the sense the rest of the backend is: float32
activations times the stored weights (code * scale), accumulated in float32; nothing is
quantized on the activation side.

Layout. A row-major int8 GEMV (one output per row, a reduction along the row) streams at only
~12 GB/s here: each row's dot product ends in a horizontal sum and the loads are narrow.
Tiling fixes both: TILE consecutive output rows are stored interleaved, codes as
(n_tiles, in_features, TILE) and scales as (n_tiles, in_features / 32, TILE), so a tile's data
is contiguous and the innermost loop runs over TILE independent outputs (pure vector FMAs, no
horizontal sums). TILE = 64 streams at 24-28 GB/s on Zen 4; 16 and 32 are 2-3x slower,
128 is no better. Output counts that are not a multiple of TILE are padded with zero rows.

Products of several rows (prefill) use one of two paths, switched at GEMM_ROWS:
- few rows: the tile is read once from memory and every row is computed from it while it
  sits in L2 (`_matmul_tiles`);
- many rows: a slab of tiles is decoded to float32 (`_decode_slab`, a slab small enough to stay
  in the last-level cache) and multiplied by BLAS sgemm, which is far faster per row.

This module imports numba; the backend imports it only when numba is installed.
"""

from __future__ import annotations

import os
import threading

# numba's threads are OpenMP's (GNU libgomp, read when numba starts them). Idle, they spin for
# GOMP's default 300,000 rounds (several ms) after every kernel, on the cores that the BLAS
# sgemm of the next product needs: a 256-row prefill product took 86 ms instead of 74. A
# short spin keeps kernels launched back to back (a decode step) just as fast. The user's own
# OpenMP settings win.
if "GOMP_SPINCOUNT" not in os.environ and "OMP_WAIT_POLICY" not in os.environ:
    os.environ["GOMP_SPINCOUNT"] = "10000"

import numpy as np  # noqa: E402
from numba import njit, prange  # noqa: E402

#: output rows per tile (see above)
TILE = 64
#: weights per Q8_0 block, and the block's bytes: float16 scale + 32 int8 codes
BLOCK = 32
BLOCK_BYTES = 34
#: at or above this many rows, decode slabs to float32 and use sgemm (measured: see README)
GEMM_ROWS = 32


# ---------------------------------------------------------------------------------- kernels
# Loops are written out so LLVM vectorizes the innermost one over the TILE outputs of a tile.
# parallel=True splits the tiles among numba's threads; cache=True keeps the compiled code on
# disk, so only the first load after an install pays for compilation.

@njit(parallel=True, cache=True)
def _pack(blocks, codes_in, f16_to_f32, codes, scales):
    """The file's blocks (O, I/32, 34) as uint8, the same bytes as int8 (codes at [..., 2:])
    -> the tiled layout. The float16 scale bits are widened by table lookup (exact; numba
    has no float16). Rows past O (padding of the last tile) stay zero."""
    n_rows, n_blocks, _ = blocks.shape
    n_tiles, _, tile = codes.shape
    for t in prange(n_tiles):
        for b in range(n_blocks):  # one block of the tile's rows at a time: a 2 KB transpose
            for j in range(min(tile, n_rows - t * tile)):
                row = t * tile + j
                bits = np.int64(blocks[row, b, 0]) | (np.int64(blocks[row, b, 1]) << 8)
                scales[t, b, j] = f16_to_f32[bits]
                for k in range(BLOCK):
                    codes[t, b * BLOCK + k, j] = codes_in[row, b, 2 + k]


@njit(parallel=True, cache=True)
def _matvec_tiles(codes, scales, x, out):
    """out[t*TILE + j] = sum_i code[t, i, j] * scale[t, i/32, j] * x[i]  (one input row)."""
    n_tiles, n_in, tile = codes.shape
    for t in prange(n_tiles):
        acc = np.zeros(tile, np.float32)
        blk = np.empty(tile, np.float32)
        for b in range(n_in // BLOCK):
            # the block's integer-weighted sum first, scaled once per block (as ggml does)
            blk[:] = 0.0
            for i in range(b * BLOCK, (b + 1) * BLOCK):
                xi = x[i]
                for j in range(tile):
                    blk[j] += np.float32(codes[t, i, j]) * xi
            for j in range(tile):
                acc[j] += blk[j] * scales[t, b, j]
        for j in range(tile):
            out[t * tile + j] = acc[j]


@njit(parallel=True, cache=True)
def _matmul_tiles(codes, scales, x, out):
    """The same for n rows of x: each tile is streamed from memory once, then every row is
    computed from it while it is in L2 (160 KB for 2560 inputs)."""
    n_tiles, n_in, tile = codes.shape
    n = x.shape[0]
    for t in prange(n_tiles):
        acc = np.empty(tile, np.float32)
        blk = np.empty(tile, np.float32)
        for r in range(n):
            acc[:] = 0.0
            for b in range(n_in // BLOCK):
                blk[:] = 0.0
                for i in range(b * BLOCK, (b + 1) * BLOCK):
                    xi = x[r, i]
                    for j in range(tile):
                        blk[j] += np.float32(codes[t, i, j]) * xi
                for j in range(tile):
                    acc[j] += blk[j] * scales[t, b, j]
            for j in range(tile):
                out[r, t * tile + j] = acc[j]


@njit(parallel=True, cache=True)
def _decode_transposed(codes, scales, w_t):
    """The whole matrix as float32 W^T (in, padded out): w_t[i, t*TILE + j] is the weight of
    output t*TILE + j for input i. Transposed, so both sides move in TILE-float runs and
    sgemm computes x @ W^T with no transpose."""
    n_tiles, n_in, tile = codes.shape
    for i in prange(n_in):
        b = i // BLOCK
        for t in range(n_tiles):
            for j in range(tile):
                w_t[i, t * tile + j] = np.float32(codes[t, i, j]) * scales[t, b, j]


@njit(cache=True)
def _gather_rows(codes, scales, rows, out):
    """Rows `rows` of the matrix as float32 (embedding lookups)."""
    tile = codes.shape[2]
    for r in range(rows.shape[0]):
        t, j = rows[r] // tile, rows[r] % tile
        for i in range(codes.shape[1]):
            out[r, i] = np.float32(codes[t, i, j]) * scales[t, i // BLOCK, j]


# ---------------------------------------------------------------------------------- weights
_local = threading.local()


def _scratch(n_rows: int, n_cols: int) -> np.ndarray:
    """A float32 (n_rows, n_cols) buffer reused by this thread's multi-row products: the
    biggest decoded matrix (100 MB for S2 Pro's 9728 x 2560), allocated once, so a prefill
    does not page-fault in a fresh copy per product."""
    buf = getattr(_local, "buf", None)
    if buf is None or buf.size < n_rows * n_cols:
        buf = _local.buf = np.empty(n_rows * n_cols, np.float32)
    return buf[:n_rows * n_cols].reshape(n_rows, n_cols)


def free_scratch() -> None:
    """Drop this thread's buffer (its memory returns to the OS)."""
    _local.buf = None


#: every float16 bit pattern as float32 (256 KB): the scales' conversion table
_F16_TO_F32 = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)


class Q8Matrix:
    """A [out, in] Q8_0 matrix in the tiled layout. `m(x)` is x @ W^T for x (n, in)."""

    def __init__(self, codes: np.ndarray, scales: np.ndarray, n_out: int):
        self.codes = codes      # (n_tiles, in, TILE) int8
        self.scales = scales    # (n_tiles, in / 32, TILE) float32
        self.n_out = n_out      # real rows; the last tile may be padded

    @classmethod
    def from_raw(cls, raw: np.ndarray) -> "Q8Matrix":
        """From the file's bytes (uint8, (O, bytes per row)); copies them into the layout."""
        raw = np.ascontiguousarray(raw, dtype=np.uint8)
        n_out = raw.shape[0]
        blocks = raw.reshape(n_out, -1, BLOCK_BYTES)
        n_blocks = blocks.shape[1]
        codes = np.zeros((-(-n_out // TILE), n_blocks * BLOCK, TILE), np.int8)
        scales = np.zeros(codes.shape[:1] + (n_blocks, TILE), np.float32)
        _pack(blocks, blocks.view(np.int8), _F16_TO_F32, codes, scales)
        return cls(codes, scales, n_out)

    @property
    def shape(self) -> tuple[int, int]:
        return self.n_out, self.codes.shape[1]

    @property
    def nbytes(self) -> int:
        return self.codes.nbytes + self.scales.nbytes

    def __call__(self, x: np.ndarray) -> np.ndarray:
        """x (n, in) float32 -> (n, out) float32."""
        x = np.ascontiguousarray(x, dtype=np.float32)
        n = x.shape[0]
        padded = self.codes.shape[0] * TILE
        out = np.empty((n, padded), np.float32)
        if n == 1:
            _matvec_tiles(self.codes, self.scales, x[0], out[0])
        elif n < GEMM_ROWS:
            _matmul_tiles(self.codes, self.scales, x, out)
        else:
            self._matmul_blas(x, out)
        return out if padded == self.n_out else out[:, :self.n_out]

    def _matmul_blas(self, x: np.ndarray, out: np.ndarray) -> None:
        # The whole matrix at once: one numba region and one sgemm. Slabs that stay in cache
        # would save the float32 round trip through memory (~6 ms of ~70 for 9728 x 2560 x
        # 256 rows), but every switch between numba's threads and BLAS's costs more.
        n_tiles, n_in, _ = self.codes.shape
        w_t = _scratch(n_in, n_tiles * TILE)
        _decode_transposed(self.codes, self.scales, w_t)
        np.matmul(x, w_t, out=out)

    def rows(self, ids: np.ndarray) -> np.ndarray:
        """Rows `ids` as float32 (n, in): a lookup table decodes only what it gathers."""
        ids = np.ascontiguousarray(ids, dtype=np.int64).reshape(-1)
        out = np.empty((ids.shape[0], self.codes.shape[1]), np.float32)
        _gather_rows(self.codes, self.scales, ids, out)
        return out

    def dequantize(self) -> np.ndarray:
        """The whole matrix as float32 (O, I) (tests and debugging)."""
        return self.rows(np.arange(self.n_out))
