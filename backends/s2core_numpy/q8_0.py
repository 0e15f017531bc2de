"""Q8_0 weights kept as int8 in the tiled layout (tiled.py), multiplied straight from them.

A Q8_0 block is a float16 scale and 32 int8 codes (34 bytes). Here the codes of TILE output
rows are interleaved as (n_tiles, in_features, TILE) int8 and the scales as
(n_tiles, in_features / 32, TILE) float32 (numba has no float16; 36 bytes a block, 1.06x the
file): a decode step streams 1.125 bytes a weight instead of float32's 4. Each block's
integer-weighted sum is formed first and scaled once (as ggml does); nothing is quantized on
the activation side.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from . import kernel_cache  # noqa: F401  (first: numba's cache follows every source here)
from .fewrows import GROUP, few_rows
from .stack import stack_tile
from .tiled import TILE, TiledMatrix, n_tiles

#: weights per Q8_0 block, and the block's bytes: float16 scale + 32 int8 codes
BLOCK = 32
BLOCK_BYTES = 34


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


@njit(parallel=True, cache=True, fastmath={"contract"})
def _matvec_tiles(codes, scales, x, out):
    """out[t*TILE + j] = sum_i code[t, i, j] * scale[t, i/32, j] * x[i]  (one input row),
    multiply-adds fused as in the few-row kernels (fewrows.py), so rows agree bit for bit."""
    n_tiles, n_in, _ = codes.shape
    for t in prange(n_tiles):  # loops to the constant TILE vectorize fully (f16.py)
        acc = stack_tile(np.float32)  # in registers (stack.py)
        blk = stack_tile(np.float32)
        acc[:] = 0.0
        for b in range(n_in // BLOCK):
            # the block's integer-weighted sum first, scaled once per block (as ggml does)
            blk[:] = 0.0
            for i in range(b * BLOCK, (b + 1) * BLOCK):
                xi = x[i]
                for j in range(TILE):
                    blk[j] += np.float32(codes[t, i, j]) * xi
            for j in range(TILE):
                acc[j] += blk[j] * scales[t, b, j]
        for j in range(TILE):
            out[t * TILE + j] = acc[j]


@njit(nogil=True, cache=True)
def _decode_tile(codes, scales, t, w):
    """Tile t as float32 (in, TILE) into w: w[i, j] is the weight of output t*TILE + j for
    input i, so sgemm computes x @ tile with no transpose."""
    n_in, tile = codes.shape[1], codes.shape[2]
    for i in range(n_in):
        b = i // BLOCK
        for j in range(tile):
            w[i, j] = np.float32(codes[t, i, j]) * scales[t, b, j]


@njit(cache=True)
def _gather_rows(codes, scales, rows, out):
    """Rows `rows` of the matrix as float32 (embedding lookups)."""
    tile = codes.shape[2]
    for r in range(rows.shape[0]):
        t, j = rows[r] // tile, rows[r] % tile
        for i in range(codes.shape[1]):
            out[r, i] = np.float32(codes[t, i, j]) * scales[t, i // BLOCK, j]


# ---------------------------------------------------------------------------------- matrix
#: every float16 bit pattern as float32 (256 KB): the scales' conversion table
_F16_TO_F32 = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)


# few-row kernels: rows in groups of four, and the two-row form (fewrows.py)
@njit(parallel=True, cache=True, fastmath={"contract"})
def q8_0_rows(codes, scales, x, out):
    """out[r, t*TILE + j] = sum over blocks of scale * (sum_i code[t, i, j] * x[r, i])."""
    n_tiles, n_in, _ = codes.shape
    for t in prange(n_tiles):
        a0 = stack_tile(np.float32)
        a1 = stack_tile(np.float32)
        a2 = stack_tile(np.float32)
        a3 = stack_tile(np.float32)
        b0 = stack_tile(np.float32)
        b1 = stack_tile(np.float32)
        b2 = stack_tile(np.float32)
        b3 = stack_tile(np.float32)
        for g in range(0, x.shape[0], GROUP):
            a0[:] = 0.0
            a1[:] = 0.0
            a2[:] = 0.0
            a3[:] = 0.0
            for b in range(n_in // BLOCK):
                b0[:] = 0.0
                b1[:] = 0.0
                b2[:] = 0.0
                b3[:] = 0.0
                for i in range(b * BLOCK, (b + 1) * BLOCK):
                    x0, x1, x2, x3 = x[g, i], x[g + 1, i], x[g + 2, i], x[g + 3, i]
                    for j in range(TILE):
                        c = np.float32(codes[t, i, j])
                        b0[j] += c * x0
                        b1[j] += c * x1
                        b2[j] += c * x2
                        b3[j] += c * x3
                for j in range(TILE):
                    s = scales[t, b, j]
                    a0[j] += b0[j] * s
                    a1[j] += b1[j] * s
                    a2[j] += b2[j] * s
                    a3[j] += b3[j] * s
            for j in range(TILE):
                out[g, t * TILE + j] = a0[j]
                out[g + 1, t * TILE + j] = a1[j]
                out[g + 2, t * TILE + j] = a2[j]
                out[g + 3, t * TILE + j] = a3[j]


@njit(parallel=True, cache=True, fastmath={"contract"})
def q8_0_pair(codes, scales, x, out):
    """q8_0_rows for two rows (x (2, in)), each accumulated as there."""
    n_tiles, n_in, _ = codes.shape
    for t in prange(n_tiles):
        a0 = stack_tile(np.float32)
        a1 = stack_tile(np.float32)
        b0 = stack_tile(np.float32)
        b1 = stack_tile(np.float32)
        a0[:] = 0.0
        a1[:] = 0.0
        for b in range(n_in // BLOCK):
            b0[:] = 0.0
            b1[:] = 0.0
            for i in range(b * BLOCK, (b + 1) * BLOCK):
                x0, x1 = x[0, i], x[1, i]
                for j in range(TILE):
                    c = np.float32(codes[t, i, j])
                    b0[j] += c * x0
                    b1[j] += c * x1
            for j in range(TILE):
                s = scales[t, b, j]
                a0[j] += b0[j] * s
                a1[j] += b1[j] * s
        for j in range(TILE):
            out[0, t * TILE + j] = a0[j]
            out[1, t * TILE + j] = a1[j]


class Q8Matrix(TiledMatrix):
    """A [out, in] Q8_0 matrix in the tiled layout. `m(x)` is x @ W^T for x (n, in)."""

    #: Q8_0's four-row kernel widens a code with one conversion: it stays ahead of
    #: decode + sgemm up to about 40 rows of 9728 x 2560 (32 rows: 12 ms against 22)
    gemm_rows = 40
    tile_arrays = ("codes", "scales")

    def __init__(self, codes: np.ndarray, scales: np.ndarray, n_out: int):
        super().__init__(codes, n_out)   # (n_tiles, in, TILE) int8
        self.scales = scales             # (n_tiles, in / 32, TILE) float32

    @classmethod
    def from_raw(cls, raw: np.ndarray) -> "Q8Matrix":
        """From the file's bytes (uint8, (O, bytes per row)); copies them into the layout."""
        raw = np.ascontiguousarray(raw, dtype=np.uint8)
        n_out = raw.shape[0]
        blocks = raw.reshape(n_out, -1, BLOCK_BYTES)
        n_blocks = blocks.shape[1]
        codes = np.zeros((n_tiles(n_out), n_blocks * BLOCK, TILE), np.int8)
        scales = np.zeros(codes.shape[:1] + (n_blocks, TILE), np.float32)
        _pack(blocks, blocks.view(np.int8), _F16_TO_F32, codes, scales)
        return cls(codes, scales, n_out)

    @property
    def nbytes(self) -> int:
        return self.codes.nbytes + self.scales.nbytes

    def _matvec(self, x: np.ndarray, out: np.ndarray) -> None:
        _matvec_tiles(self.codes, self.scales, x, out)

    def _matmul(self, x: np.ndarray, out: np.ndarray) -> None:
        few_rows((q8_0_rows, q8_0_pair), (self.codes, self.scales), x, out)

    def _decode_tile(self, t: int, w: np.ndarray) -> None:
        _decode_tile(self.codes, self.scales, t, w)

    def _gather(self, ids: np.ndarray, out: np.ndarray) -> None:
        _gather_rows(self.codes, self.scales, ids, out)
