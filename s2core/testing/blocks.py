"""Random GGUF quantized blocks for kernel tests: every bit pattern of the codes and of the
packed sub-block scales, with finite float16 scale fields (or chosen non-finite ones)."""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as QT

from ..gguf_blocks import SCALE_FIELDS, block_shape


def random_blocks(qtype: QT, rows: int, blocks_per_row: int, seed: int) -> np.ndarray:
    """Raw rows (rows, blocks_per_row * block bytes) uint8, as ModelFile.raw() gives them.

    Random bytes are a valid block of every type once its float16 fields are finite; those are
    set to finite float16 of both signs from subnormals to ~1e3, 5 % exact zeros."""
    _, nbytes = block_shape(qtype)
    rng = np.random.default_rng(seed)
    b = rng.integers(0, 256, (rows * blocks_per_row, nbytes), dtype=np.uint8)
    for offset in SCALE_FIELDS[qtype]:
        halves = rng.standard_normal(b.shape[0]) * 10.0 ** rng.integers(-7, 4, b.shape[0])
        halves[rng.random(b.shape[0]) < 0.05] = 0.0
        b[:, offset:offset + 2] = halves.astype("<f2").view(np.uint8).reshape(-1, 2)
    return b.reshape(rows, blocks_per_row * nbytes)


def set_scale(blocks: np.ndarray, qtype: QT, block: int, value: float, field: int = 0) -> None:
    """Overwrite scale field `field` of flat block number `block` with float16 `value`."""
    _, nbytes = block_shape(qtype)
    flat = blocks.reshape(-1, nbytes)
    offset = SCALE_FIELDS[qtype][field]
    flat[block, offset:offset + 2] = np.array([value], "<f2").view(np.uint8)
