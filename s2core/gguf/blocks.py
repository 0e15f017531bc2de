"""Facts about GGUF's quantized block layouts that every backend keeping blocks as stored needs.

A quantized block is codes plus one or two float16 scale fields (d, and m or dmin). A backend
that computes from the blocks (a dequantizing kernel, an MLX affine layout) reproduces gguf's
dequantization for finite scales; an infinity or NaN in a scale can come out differently from
a fused kernel than from gguf's element-wise decoding (which value, inf or NaN, and where). So
a tensor with any non-finite scale is widened instead, exactly as gguf decodes it: the same rule
the NumPy backend applies to F16 tensors holding an infinity or NaN.
"""

from __future__ import annotations

import gguf
import numpy as np
from gguf import GGMLQuantizationType as QT

#: byte offsets of each block type's float16 scale fields (d, m/dmin), within one block
SCALE_FIELDS: dict[QT, tuple[int, ...]] = {
    QT.Q8_0: (0,), QT.Q4_0: (0,), QT.Q5_0: (0,), QT.Q4_1: (0, 2), QT.Q5_1: (0, 2),
    QT.Q2_K: (80, 82), QT.Q3_K: (108,), QT.Q4_K: (0, 2), QT.Q5_K: (0, 2), QT.Q6_K: (208,),
}

#: the block types listed above: GGUF's quantized types that s2core reads
QUANTIZED_TYPES: frozenset[QT] = frozenset(SCALE_FIELDS)

#: types whose blocks hold 256 values in 16-value sub-blocks with their own scales
SIXTEEN_VALUE_SUB_BLOCKS: frozenset[QT] = frozenset({QT.Q2_K, QT.Q3_K, QT.Q6_K})


def block_shape(qtype: QT) -> tuple[int, int]:
    """(values, bytes) of one block."""
    values, nbytes = gguf.GGML_QUANT_SIZES[qtype]
    return int(values), int(nbytes)


def random_blocks(qtype: QT, rows: int, blocks_per_row: int, seed: int,
                  scale: float | None = None) -> np.ndarray:
    """Random valid blocks: raw rows (rows, blocks_per_row * block bytes) uint8, as
    ModelFile.raw() gives them. Random bytes are a valid block of every type once its float16
    fields are finite: this reaches every bit pattern of the codes and packed sub-block scales.

    scale None: the scale fields are float16 of both signs from subnormals to ~1e3, 5 % exact
    zeros (kernel tests). Else they are positive, between 0.5 and 1.5 times `scale`
    (S2 Pro-sized files for timing, written in seconds where quantizing takes minutes)."""
    _, nbytes = block_shape(qtype)
    rng = np.random.default_rng(seed)
    b = rng.integers(0, 256, (rows * blocks_per_row, nbytes), dtype=np.uint8)
    for offset in SCALE_FIELDS[qtype]:
        if scale is None:
            halves = rng.standard_normal(b.shape[0]) * 10.0 ** rng.integers(-7, 4, b.shape[0])
            halves[rng.random(b.shape[0]) < 0.05] = 0.0
        else:
            halves = scale * (0.5 + rng.random(b.shape[0]))
        b[:, offset:offset + 2] = halves.astype("<f2").view(np.uint8).reshape(-1, 2)
    return b.reshape(rows, blocks_per_row * nbytes)


def non_finite_scale_blocks(blocks: np.ndarray, qtype: QT) -> int:
    """How many blocks of a quantized tensor have an infinite or NaN scale field.

    `blocks`: the raw tensor as ModelFile.raw() gives it (uint8, rows x bytes per row)."""
    _, nbytes = block_shape(qtype)
    flat = np.asarray(blocks, dtype=np.uint8).reshape(-1, nbytes)
    bad = np.zeros(flat.shape[0], dtype=bool)
    for offset in SCALE_FIELDS[qtype]:
        bits = flat[:, offset].astype(np.uint16) | (flat[:, offset + 1].astype(np.uint16) << 8)
        bad |= (bits & 0x7C00) == 0x7C00  # float16 exponent all ones: infinity or NaN
    return int(bad.sum())


class NonFiniteScalesWarning(UserWarning):
    """A quantized tensor holds an infinite or NaN scale, so a backend that keeps blocks as
    stored widens it instead (its numbers are then exactly gguf's dequantization)."""
