"""Memory a model will take on a backend, known before loading it.

A backend keeps some GGUF types as stored and widens the rest (Capabilities), so a 10 GB f16
file can need 20 GB on a backend that computes from float32 copies. These estimates let
`s2core info` say so before the user tries.
"""

from __future__ import annotations

from .backend import Capabilities
from .gguf_file import ModelFile
from .hparams import Hparams

DTYPE_BYTES = {"f32": 4, "f16": 2, "bf16": 2}


def kv_cache_bytes(hp: Hparams, n_positions: int, dtype: str = "f16") -> int:
    """K and V for every layer: 2 x n_layer x n_positions x n_head_kv x head_dim elements."""
    return 2 * hp.n_layer * n_positions * hp.n_head_kv * hp.head_dim * DTYPE_BYTES[dtype]


def backend_kv_cache_bytes(hp: Hparams, n_positions: int, caps: Capabilities) -> int:
    """The cache as a backend holds it (its storage type may be wider than its values)."""
    return kv_cache_bytes(hp, n_positions, caps.kv_cache_held_dtype)


def resident_weight_bytes(model_file: ModelFile, caps: Capabilities) -> int:
    """Weight bytes held after load: file bytes for native types, widened bytes for others."""
    total = 0
    for t in model_file.model_tensors():
        if caps.keeps_native(t.type_name):
            total += int(t.n_bytes * caps.held_bytes_per_file_byte(t.type_name))
        else:
            total += t.n_elements * DTYPE_BYTES[caps.widened_weight_dtype]
    return total


def copied_weight_bytes(model_file: ModelFile, caps: Capabilities) -> int:
    """Of those, the bytes the backend copies at load (all but the tensors it maps in place)."""
    return resident_weight_bytes(model_file, caps) - sum(
        t.n_bytes for t in model_file.model_tensors() if t.type_name in caps.mapped_weight_types)
