"""Open an s2.cpp GGUF model file: parse hparams, check every tensor, hand out weights.

The container is read by `GGUFFile` (s2core/gguf/container.py), which validates the header,
the metadata types and every tensor's place in the file before anything is trusted; this
module adds what an S2 Pro model needs on top: usable hparams (s2core/modelfile/hparams.py) and the
tensors of s2.cpp's layout with their shapes and types. Nothing is copied until a backend asks
for a tensor, and dequantization happens one tensor at a time (never the whole model in
float32).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Iterator

import gguf
import numpy as np
from gguf import GGMLQuantizationType as QT

from s2core.errors import ModelFileError
from s2core.gguf.container import GGUFFile, GGUFTensor, Limits
from s2core.modelfile.hparams import Hparams
from s2core.modelfile.layout import expected_tensors, is_codec

__all__ = ["ModelFile", "TensorInfo", "GGUFFile", "Limits", "SUPPORTED_TYPES", "type_name",
           "bytes_per_weight"]

#: GGUF tensor types s2core reads (SPEC section 1 and the types real S2 Pro files use).
SUPPORTED_TYPES: frozenset[QT] = frozenset({
    QT.F32, QT.F16, QT.BF16, QT.Q8_0, QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1,
    QT.Q2_K, QT.Q3_K, QT.Q4_K, QT.Q5_K, QT.Q6_K,
})
#: tensors per transformer block at the least (norms, wqkv, wo, w1, w3, w2)
_MIN_TENSORS_PER_LAYER = 7
#: problems listed in full in one message; the rest are counted
_MAX_LISTED = 8


def type_name(t: QT) -> str:
    """Lower-case GGUF type name as users see it in file names: f16, q8_0, q4_k."""
    return t.name.lower()


def bytes_per_weight(t: QT) -> float:
    block, size = gguf.GGML_QUANT_SIZES[t]
    return size / block


@dataclass(frozen=True)
class TensorInfo:
    name: str
    type: QT
    shape: tuple[int, ...]  # PyTorch order [out, in]; GGUF's ne is this reversed
    n_bytes: int

    @property
    def n_elements(self) -> int:
        return int(np.prod(self.shape))

    @property
    def type_name(self) -> str:
        return type_name(self.type)


def summarize(problems: list[str]) -> str:
    """Join problems into one message of bounded size: the first few, then a count."""
    shown = "; ".join(problems[:_MAX_LISTED])
    if len(problems) > _MAX_LISTED:
        shown += f"; and {len(problems) - _MAX_LISTED} more"
    return shown


class ModelFile:
    """A validated, memory-mapped S2 Pro GGUF file."""

    def __init__(self, path: str | os.PathLike):
        self.container = GGUFFile(path)
        try:
            self.path = self.container.path
            self._tensors: dict[str, GGUFTensor] = self.container.tensors
            self.metadata = self.container.scalar_metadata()
            self.hparams = self._read_hparams()
            self._check_layer_count()
            self._check_tensors()
        except BaseException:
            self.container.close()
            raise

    # ------------------------------------------------------------------ checks
    def _read_hparams(self) -> Hparams:
        try:
            return Hparams.from_gguf(self.container, self._shape_or_none)
        except ModelFileError as exc:
            if exc.message.startswith(str(self.path)):
                raise
            raise ModelFileError(f"{self.path}: {exc.message}", exc.check) from None

    def _shape_or_none(self, name: str) -> tuple[int, ...] | None:
        t = self._tensors.get(name)
        return None if t is None else t.shape

    def _check_layer_count(self) -> None:
        """Before the layout is listed: block counts the file's tensors could cover at all
        (a block_count of 2**32 - 1 would otherwise list billions of names)."""
        hp = self.hparams
        layers = hp.n_layer + (hp.fast.n_layer if hp.fast is not None else 0)
        if layers * _MIN_TENSORS_PER_LAYER > len(self._tensors):
            fast = f" + fast_block_count={hp.fast.n_layer}" if hp.fast is not None else ""
            raise ModelFileError(
                f"{self.path}: block_count={hp.n_layer}{fast} needs at least "
                f"{layers * _MIN_TENSORS_PER_LAYER} tensors ({_MIN_TENSORS_PER_LAYER} per "
                f"layer) but the file holds {len(self._tensors)}", check="tensor_count")

    def _check_tensors(self) -> None:
        problems = []
        for name, shape in expected_tensors(self.hparams).items():
            t = self._tensors.get(name)
            if t is None:
                problems.append(f"missing tensor {name} (expected shape {shape})")
                continue
            if t.shape != shape:
                problems.append(
                    f"tensor {name} has shape {t.shape} (GGUF ne {list(reversed(t.shape))}), "
                    f"expected {shape} (ne {list(reversed(shape))})")
            if t.type not in SUPPORTED_TYPES:
                problems.append(
                    f"tensor {name} has type {t.type.name}, which s2core does not read "
                    f"(supported: {', '.join(sorted(x.name for x in SUPPORTED_TYPES))})")
        if problems:
            raise ModelFileError(f"{self.path}: {len(problems)} tensor problem(s): "
                                 + summarize(problems), check="tensors")

    # ------------------------------------------------------------------ queries
    def __contains__(self, name: str) -> bool:
        return name in self._tensors

    def info(self, name: str) -> TensorInfo:
        t = self._tensors[name]
        return TensorInfo(name, t.type, t.shape, t.n_bytes)

    def model_tensors(self) -> Iterator[TensorInfo]:
        """The tensors s2core uses (expected by the layout), in layout order."""
        for name in expected_tensors(self.hparams):
            yield self.info(name)

    @cached_property
    def extra_tensor_names(self) -> list[str]:
        """Tensors the Slow/Fast-AR does not use (the codec's `c.*` and anything unknown)."""
        used = expected_tensors(self.hparams)
        return [n for n in self._tensors if n not in used]

    @property
    def file_size(self) -> int:
        return self.container.file_size

    @property
    def weight_bytes(self) -> int:
        """Bytes of the tensors s2core uses (the codec's are not loaded)."""
        return sum(t.n_bytes for t in self.model_tensors())

    @property
    def codec_tensor_names(self) -> list[str]:
        return [n for n in self._tensors if is_codec(n)]

    # ------------------------------------------------------------------ data
    def raw(self, name: str) -> np.ndarray:
        """The stored data as a read-only memory-mapped array, without conversion.

        F32/F16: shaped like the tensor. BF16: uint16 bit patterns shaped like the tensor.
        Quantized types: uint8 blocks, shape (rows..., bytes per row).
        """
        data = self.container.tensor_data(name)
        return data.view(np.uint16) if self._tensors[name].type == QT.BF16 else data

    def dequantize(self, name: str, dtype: Any = np.float32, release: bool = False) -> np.ndarray:
        """The tensor as a new (or memory-mapped, for F32) array of `dtype`, PyTorch order.

        `release=True`: once copied, drop the tensor's file pages from this process (see
        `release`), for a backend that keeps only its own copy."""
        data = self.container.tensor_data(name)
        out = np.asarray(gguf.quants.dequantize(data, self._tensors[name].type), dtype=dtype)
        if release and not np.shares_memory(out, data):
            self.release(name)
        return out

    def release(self, name: str) -> None:
        """Unmap a tensor's pages from this process after a backend has copied it.

        The pages stay in the OS page cache, so nothing is re-read from disk, but the process
        no longer holds the file's copy beside its own (a widened f16 file would otherwise
        count twice in resident memory). Touching the tensor again maps the pages back."""
        self.container.release(name)

    def dequantize_rows(self, name: str, rows: np.ndarray, dtype: Any = np.float32) -> np.ndarray:
        """Rows `rows` of a 2-D tensor, dequantized. Every GGUF row is whole blocks, so a
        lookup table can stay in its stored type and decode only the rows a call gathers."""
        data = self.container.tensor_data(name)
        return np.asarray(gguf.quants.dequantize(data[rows], self._tensors[name].type),
                          dtype=dtype)

    def close(self) -> bool:
        """Drop the memory map (the backend must already hold its own copies); False when
        views of it are still alive (see GGUFFile.close)."""
        self._tensors = {}
        return self.container.close()

    def __repr__(self) -> str:
        return f"ModelFile({str(self.path)!r}, n_layer={self.hparams.n_layer})"
