"""What the model writer and the codec writer share: each tensor's RNG stream, the encoding
of float32 values into a GGUF type, and the streaming tensor-writing loop."""

from __future__ import annotations

import zlib
from typing import Callable

import gguf
import numpy as np
from gguf import GGMLQuantizationType as QT

from s2core.embedded.kquants import quantize_k

_K_QUANTS = {QT.Q2_K, QT.Q3_K, QT.Q4_K, QT.Q5_K, QT.Q6_K}

#: (full tensor name, shape, GGUF type) of each tensor a file holds, in the file's order
Plan = list[tuple[str, tuple[int, ...], QT]]


def tensor_rng(seed: int, name: str) -> np.random.Generator:
    """The tensor's own stream, seeded by (seed, name): files of one config in different
    weight types hold the same underlying weights."""
    return np.random.default_rng([seed, zlib.crc32(name.encode())])


def encode(data: np.ndarray, qt: QT) -> np.ndarray:
    """float32 values -> the bytes (or float array) GGUF stores for type qt."""
    if qt == QT.F32:
        return np.ascontiguousarray(data, dtype=np.float32)
    if qt == QT.F16:
        return data.astype(np.float16)
    if qt in _K_QUANTS:
        return quantize_k(data, qt)
    return gguf.quants.quantize(data, qt)


def write_tensors(writer: gguf.GGUFWriter, plan: Plan,
                  stored: Callable[[int, str, tuple[int, ...], QT], np.ndarray],
                  progress: Callable[[int, int], None] | None = None) -> None:
    """Header, keys, tensor infos, then each tensor made and written one at a time (an
    S2 Pro-sized file never sits in memory whole). `stored(index, name, shape, type)` gives
    what the file stores for the index-th tensor (1-based); `progress(done, total)` follows."""
    for name, shape, qt in plan:
        block, size = gguf.GGML_QUANT_SIZES[qt]
        writer.add_tensor_info(name, shape, np.dtype(np.float32),
                               int(np.prod(shape)) // block * size, raw_dtype=qt)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for done, (name, shape, qt) in enumerate(plan, 1):
        writer.write_tensor_data(stored(done, name, shape, qt))
        if progress:
            progress(done, len(plan))
