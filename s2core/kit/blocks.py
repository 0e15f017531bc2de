"""Random GGUF quantized blocks for kernel tests (s2core.gguf.blocks.random_blocks), and a way
to plant a chosen scale (an infinity, a NaN) in one of them."""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as QT

from s2core.gguf.blocks import SCALE_FIELDS, block_shape, random_blocks

__all__ = ["random_blocks", "set_scale"]


def set_scale(blocks: np.ndarray, qtype: QT, block: int, value: float, field: int = 0) -> None:
    """Overwrite scale field `field` of flat block number `block` with float16 `value`."""
    _, nbytes = block_shape(qtype)
    flat = blocks.reshape(-1, nbytes)
    offset = SCALE_FIELDS[qtype][field]
    flat[block, offset:offset + 2] = np.array([value], "<f2").view(np.uint8)
