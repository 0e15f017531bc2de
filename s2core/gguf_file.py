"""Open an s2.cpp GGUF model file: parse hparams, check every tensor, hand out weights.

The file is memory-mapped by `gguf.GGUFReader`; nothing is copied until a backend asks for a
tensor, and dequantization happens one tensor at a time (never the whole model in float32).
"""

from __future__ import annotations

import mmap
import os
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Iterator

import gguf
import numpy as np
from gguf import GGMLQuantizationType as QT

from .errors import ModelFileError
from .hparams import Hparams
from .layout import expected_tensors, is_codec

#: GGUF tensor types s2core reads (SPEC section 1 and the types real S2 Pro files use).
SUPPORTED_TYPES: frozenset[QT] = frozenset({
    QT.F32, QT.F16, QT.BF16, QT.Q8_0, QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1,
    QT.Q2_K, QT.Q3_K, QT.Q4_K, QT.Q5_K, QT.Q6_K,
})


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


class ModelFile:
    """A validated, memory-mapped S2 Pro GGUF file."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        try:
            self._reader = gguf.GGUFReader(self.path, "r")
        except FileNotFoundError as exc:
            raise ModelFileError(f"model file not found: {self.path}") from exc
        except (ValueError, OSError, KeyError, IndexError) as exc:
            raise ModelFileError(f"{self.path} is not a readable GGUF file: {exc}") from exc
        self._tensors = {t.name: t for t in self._reader.tensors}
        self.metadata = _scalar_metadata(self._reader)
        self.hparams = Hparams.from_gguf(self.metadata, self._shape_or_none)
        self._check_tensors()

    # ------------------------------------------------------------------ checks
    def _shape_or_none(self, name: str) -> tuple[int, ...] | None:
        t = self._tensors.get(name)
        return None if t is None else tuple(int(d) for d in reversed(t.shape.tolist()))

    def _check_tensors(self) -> None:
        problems = []
        for name, shape in expected_tensors(self.hparams).items():
            t = self._tensors.get(name)
            if t is None:
                problems.append(f"missing tensor {name} (expected shape {shape})")
                continue
            got = self._shape_or_none(name)
            if got != shape:
                problems.append(
                    f"tensor {name} has shape {got} (GGUF ne {list(reversed(got))}), "
                    f"expected {shape} (ne {list(reversed(shape))})")
            if t.tensor_type not in SUPPORTED_TYPES:
                problems.append(
                    f"tensor {name} has type {t.tensor_type.name}, which s2core does not read "
                    f"(supported: {', '.join(sorted(x.name for x in SUPPORTED_TYPES))})")
        if problems:
            raise ModelFileError(f"{self.path}: " + "; ".join(problems))

    # ------------------------------------------------------------------ queries
    def __contains__(self, name: str) -> bool:
        return name in self._tensors

    def info(self, name: str) -> TensorInfo:
        t = self._tensors[name]
        return TensorInfo(name, t.tensor_type, self._shape_or_none(name), int(t.n_bytes))

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
        return self.path.stat().st_size

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
        t = self._tensors[name]
        if t.tensor_type == QT.BF16:
            return t.data.view(np.uint16)
        return t.data

    def dequantize(self, name: str, dtype: Any = np.float32, release: bool = False) -> np.ndarray:
        """The tensor as a new (or memory-mapped, for F32) array of `dtype`, PyTorch order.

        `release=True`: once copied, drop the tensor's file pages from this process (see
        `release`), for a backend that keeps only its own copy."""
        t = self._tensors[name]
        out = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=dtype)
        if release and not np.shares_memory(out, t.data):
            self.release(name)
        return out

    def release(self, name: str) -> None:
        """Unmap a tensor's pages from this process after a backend has copied it.

        The pages stay in the OS page cache, so nothing is re-read from disk, but the process
        no longer holds the file's copy beside its own (a widened f16 file would otherwise
        count twice in resident memory). Touching the tensor again maps the pages back."""
        mm = getattr(self._reader.data, "_mmap", None)
        if mm is None or not hasattr(mm, "madvise"):
            return  # not a memory map here, or no madvise on this platform
        t = self._tensors[name]
        page = mmap.PAGESIZE
        start = -(-t.data_offset // page) * page  # whole pages inside the tensor only
        end = (t.data_offset + t.n_bytes) // page * page
        if end > start:
            mm.madvise(mmap.MADV_DONTNEED, start, end - start)

    def dequantize_rows(self, name: str, rows: np.ndarray, dtype: Any = np.float32) -> np.ndarray:
        """Rows `rows` of a 2-D tensor, dequantized. Every GGUF row is whole blocks, so a
        lookup table can stay in its stored type and decode only the rows a call gathers."""
        t = self._tensors[name]
        return np.asarray(gguf.quants.dequantize(t.data[rows], t.tensor_type), dtype=dtype)

    def close(self) -> None:
        """Drop the memory map (the backend must already hold its own copies)."""
        self._tensors = {}
        mm = getattr(self._reader, "data", None)
        self._reader = None
        if mm is not None and hasattr(mm, "_mmap") and mm._mmap is not None:
            try:
                mm._mmap.close()
            except BufferError:
                pass  # a view is still alive; the OS unmaps it when that view goes

    def __repr__(self) -> str:
        return f"ModelFile({str(self.path)!r}, n_layer={self.hparams.n_layer})"


def _scalar_metadata(reader: gguf.GGUFReader) -> dict[str, Any]:
    """Key -> value for the scalar and string fields only.

    Real files carry a tokenizer with ~155k strings; decoding those arrays would cost seconds
    and s2core needs none of them.
    """
    out: dict[str, Any] = {}
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or not field.types:
            continue
        if field.types[0] == gguf.GGUFValueType.ARRAY:
            continue
        out[key] = field.contents()
    return out
