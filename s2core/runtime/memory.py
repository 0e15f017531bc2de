"""Memory a model will take on a backend, known before loading it.

A backend keeps some GGUF types as stored and widens the rest (Capabilities), so a 10 GB f16
file can need 20 GB on a backend that computes from float32 copies. These estimates let
`s2core info` say so before the user tries.
"""

from __future__ import annotations

from dataclasses import dataclass

from s2core.modelfile.hparams import Hparams

from s2core.contract.backend import Capabilities
from s2core.modelfile.file import ModelFile, TensorInfo

DTYPE_BYTES = {"f32": 4, "f16": 2, "bf16": 2}


def kv_cache_bytes(hp: Hparams, n_positions: int, dtype: str = "f16") -> int:
    """K and V for every layer: 2 x n_layer x n_positions x n_head_kv x head_dim elements."""
    return 2 * hp.n_layer * n_positions * hp.n_head_kv * hp.head_dim * DTYPE_BYTES[dtype]


def backend_kv_cache_bytes(hp: Hparams, n_positions: int, caps: "Capabilities") -> int:
    """The cache as a backend holds it (its storage type may be wider than its values)."""
    return kv_cache_bytes(hp, n_positions, caps.kv_cache_held_dtype)


@dataclass(frozen=True)
class TypeHolding:
    """How a backend holds the tensors of one GGUF type."""

    type_name: str
    kept: bool          # as stored (else widened to the backend's widened_weight_dtype)
    n_tensors: int
    file_bytes: int
    held_bytes: int     # after load


def held_bytes(t: TensorInfo, caps: Capabilities) -> int:
    """One tensor's bytes after load: file bytes for native types, widened bytes for others."""
    if caps.keeps_native(t.type_name):
        return int(t.n_bytes * caps.held_bytes_per_file_byte(t.type_name))
    return t.n_elements * DTYPE_BYTES[caps.widened_weight_dtype]


def holdings(model_file: ModelFile, caps: Capabilities) -> list[TypeHolding]:
    """Per tensor type of the file, sorted by name: kept or widened, and the bytes held."""
    by_type: dict[str, list[TensorInfo]] = {}
    for t in model_file.model_tensors():
        by_type.setdefault(t.type_name, []).append(t)
    return [TypeHolding(name, caps.keeps_native(name), len(ts), sum(t.n_bytes for t in ts),
                        sum(held_bytes(t, caps) for t in ts))
            for name, ts in sorted(by_type.items())]


def resident_weight_bytes(model_file: ModelFile, caps: Capabilities) -> int:
    """Weight bytes held after load: file bytes for native types, widened bytes for others."""
    return sum(held_bytes(t, caps) for t in model_file.model_tensors())


def copied_weight_bytes(model_file: "ModelFile", caps: "Capabilities") -> int:
    """Of those, the bytes the backend copies at load (all but the tensors it maps in place)."""
    return resident_weight_bytes(model_file, caps) - sum(
        t.n_bytes for t in model_file.model_tensors() if t.type_name in caps.mapped_weight_types)


def describe_bytes(n: int) -> str:
    """Bytes for a message: '1.50 GiB (1610612736 bytes)'."""
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.2f} {unit} ({n} bytes)"
    return f"{n} bytes"
