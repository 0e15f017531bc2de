"""Block-quantized weights (Q2_K..Q6_K, Q4_0, Q4_1, Q5_0, Q5_1) kept as stored, in tiles.

Layout: the file's blocks, byte for byte, transposed so that TILE output rows sit side by side:
codes (n_tiles, blocks per row, bytes per block, TILE) uint8, codes[t, b, k, j] = byte k of
block b of row t*TILE + j. Resident memory is the file's (plus the padding of a last tile that
is not full); a decode step streams the file's bytes, in the access pattern that lets the
kernels (quant_kernels.py) vectorize over a tile's outputs.

A tensor with an infinite or NaN scale field is not packed (`from_raw` returns None): the
loader widens it exactly as gguf decodes it, and says so.
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as QT

from s2core.plugin import block_shape, non_finite_scale_blocks

from . import quant_kernels as k
from .tiled import TILE, TiledMatrix, n_tiles

#: the types these kernels compute from (the keys are the kernels' `kind` numbers)
TYPES: frozenset[QT] = frozenset({QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1, QT.Q2_K, QT.Q3_K,
                                  QT.Q4_K, QT.Q5_K, QT.Q6_K})


class QuantMatrix(TiledMatrix):
    """A [out, in] block-quantized matrix in the tiled layout. `m(x)` is x @ W^T."""

    def __init__(self, codes: np.ndarray, qtype: QT, n_out: int, n_in: int):
        super().__init__(codes, n_out, n_in)
        self.qtype = qtype
        self.kind = int(qtype)

    @classmethod
    def from_raw(cls, raw: np.ndarray, qtype: QT) -> "QuantMatrix | None":
        """From the file's bytes (uint8, (O, bytes per row)); copies them into the layout.
        None if a block's scale field is infinite or NaN."""
        raw = np.ascontiguousarray(raw, dtype=np.uint8)
        if non_finite_scale_blocks(raw, qtype):
            return None
        values, nbytes = block_shape(qtype)
        n_out = raw.shape[0]
        n_blocks = raw.shape[1] // nbytes
        codes = np.empty((n_tiles(n_out), n_blocks, nbytes, TILE), np.uint8)
        k.pack_tiles(raw, codes.reshape(codes.shape[0], n_blocks * nbytes, TILE))
        return cls(codes, qtype, n_out, n_blocks * values)

    def _matvec(self, x: np.ndarray, out: np.ndarray) -> None:
        if self.kind in k.FUSED:
            k.matvec_fused(self.kind, self.codes, x, k.sub_block_sums(self.kind, x), out)
        else:
            k.matvec_decoded(self.kind, self.codes, x, out)

    def _matmul(self, x: np.ndarray, out: np.ndarray) -> None:
        """Rows in fours (the four-row kernel), three padded to four; two rows left go to the
        two-row kernel of the FUSED types, one row to the one-row kernel (padding them to
        four costs more: one Q4_K row of 9728 x 2560 0.4-0.5 ms, four rows 1.0-1.2 ms)."""
        from .fewrows import padded  # zero rows up to a multiple of four (fewrows.py)
        n = x.shape[0]
        fours = n if n % 4 == 3 else n - n % 4
        if fours:
            padded(k.matmul_decoded, (self.kind, self.codes), x[:fours], out[:fours], 4)
        r = fours
        if n - r == 2 and self.kind in k.FUSED:
            pair = np.ascontiguousarray(x[r:])
            k.matvec2_fused(self.kind, self.codes, pair, k.sub_block_sums(self.kind, pair),
                            out[r:])
            r = n
        for r in range(r, n):
            self._matvec(np.ascontiguousarray(x[r]), out[r])

    def _decode_tile(self, t: int, w: np.ndarray) -> None:
        k.decode_tile(self.kind, self.codes, t, w)

    def _gather(self, ids: np.ndarray, out: np.ndarray) -> None:
        k.gather_rows(self.kind, self.codes, ids, out)
