"""Open the codec inside an s2.cpp GGUF: find its prefix, read its keys, check its tensors.

A full S2 Pro file (`general.architecture = "fish-speech"`) holds the codec under `c.`; a
codec-only file (`"fish-speech-codec"`) holds it without a prefix (CODEC.md 1). Every tensor
the decode path uses must be there with its shape and a float type; the encode path's tensors
are checked too when the file has them (a decode-only file is accepted, and `encode` then says
why it cannot run). Tensors are handed out one at a time, by name without the prefix.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
import numpy as np
from gguf import GGMLQuantizationType as QT
from gguf import GGUFValueType as VT

from s2core.errors import ModelFileError
from s2core.gguf.container import INTEGER_TYPES, GGUFFile
from s2core.codec.hparams import KEY_PREFIX, CodecHparams
from s2core.codec.layout import CodecLayout, build_layout

#: general.architecture -> the prefix of the codec's tensor names
ARCHITECTURES = {"fish-speech": "c.", "fish-speech-codec": ""}
#: stored types read (s2.cpp's exporter writes F16 or F32; BF16 costs nothing to accept)
CODEC_TYPES = {QT.F32: "f32", QT.F16: "f16", QT.BF16: "bf16"}
#: at most this many problems are listed in one error message
MAX_LISTED = 12


@dataclass(frozen=True)
class StoredTensor:
    type: QT
    shape: tuple[int, ...]  # PyTorch order; GGUF's ne is this reversed
    data: Any               # the memory-mapped array (a read-only view)
    n_bytes: int


class _GGUFSource:
    """The container, read through the project's validating reader (s2core.gguf.container:
    bounded counts, typed values, tensor offsets checked, regular files only, truncation
    said), so a hostile codec file fails as a hostile model file does."""

    def __init__(self, path: Path):
        self._file: GGUFFile | None = GGUFFile(path)
        f = self._file
        self.tensors = {name: StoredTensor(t.type, t.shape, f.tensor_data(name), t.n_bytes)
                        for name, t in f.tensors.items()}

    def value(self, key: str) -> Any:
        return self._file.get(key, str, None)

    def values(self, prefix: str) -> dict[str, Any]:
        """Every field under `prefix` (scalars and integer arrays), keys without the prefix,
        as Python values; the codec's key reader checks each one's type."""
        f, out = self._file, {}
        for key in f.keys():
            if not key.startswith(prefix):
                continue
            entry = f.value_type(key)
            if entry.type == VT.ARRAY:
                kind = int if entry.element_type in INTEGER_TYPES else float
                out[key[len(prefix):]] = (f.get_array(key, kind).tolist()
                                          if entry.element_type != VT.STRING else None)
            elif entry.type == VT.STRING:
                out[key[len(prefix):]] = f.get(key, str)
            else:
                out[key[len(prefix):]] = entry.value
        return out

    def close(self) -> None:
        file, self._file = self._file, None
        self.tensors = {}
        if file is not None:
            file.close()


class CodecFile:
    """A validated codec inside a GGUF file; `layout` says what to compute, `tensor` gives
    the weights."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self._source = _GGUFSource(self.path)
        try:
            self.architecture = self._source.value("general.architecture")
            if self.architecture not in ARCHITECTURES:
                raise ModelFileError(
                    f"{self.path}: general.architecture = {self.architecture!r}; a codec is read "
                    f"from {' or '.join(map(repr, ARCHITECTURES))} files (CODEC.md 1)")
            self.prefix = ARCHITECTURES[self.architecture]
            self._check_has_codec()
            self.hparams = CodecHparams.from_metadata(self._source.values(KEY_PREFIX))
            self.layout: CodecLayout = build_layout(self.hparams, self._probe_transformer)
            self.encode_unavailable_reason = self._check()
        except BaseException:
            self._source.close()
            raise

    # ------------------------------------------------------------------ checks
    def _check_has_codec(self) -> None:
        """A model file without any codec part (some exports leave it out) is told apart from
        a broken codec: the user then needs a separate codec file, not a repaired one."""
        has_keys = any(True for _ in self._source.values(KEY_PREFIX))
        has_tensors = any(n.startswith(self.prefix) for n in self._source.tensors) \
            if self.prefix else bool(self._source.tensors)
        if not has_keys and not has_tensors:
            raise ModelFileError(
                f"{self.path}: holds no audio codec (no {KEY_PREFIX}* keys, no "
                f"{self.prefix + '* ' if self.prefix else ''}tensors); use a GGUF that carries "
                "one, or a codec-only file")

    def _stored(self, name: str) -> StoredTensor | None:
        return self._source.tensors.get(self.prefix + name)

    def _probe_transformer(self, prefix: str, width: int) -> tuple[int, int]:
        """Layers k = 0, 1, ... while layers.k.attention.wqkv.weight exists (as s2.cpp);
        the FFN width from layer 0's w1."""
        n = 0
        while self._stored(f"{prefix}.layers.{n}.attention.wqkv.weight") is not None:
            n += 1
        w1 = self._stored(f"{prefix}.layers.0.feed_forward.w1.weight")
        return n, (w1.shape[0] if w1 is not None and len(w1.shape) == 2 else 0)

    def _problems(self, expected: dict[str, tuple[int, ...]]) -> tuple[list[str], list[str]]:
        """(missing names, other problems) of `expected` in this file."""
        missing, wrong = [], []
        for name, shape in expected.items():
            t = self._stored(name)
            if t is None:
                missing.append(f"{self.prefix}{name} {list(shape)}")
                continue
            if t.shape != shape:
                wrong.append(f"tensor {self.prefix}{name} has shape {list(t.shape)} (GGUF ne "
                             f"{list(reversed(t.shape))}), expected {list(shape)}")
            if t.type not in CODEC_TYPES:
                wrong.append(f"tensor {self.prefix}{name} has type {t.type.name}; the codec "
                             f"reads {', '.join(q.name for q in CODEC_TYPES)}")
        return missing, wrong

    def _check(self) -> str:
        """ModelFileError for any problem on the decode path or in encoder tensors present;
        returns why encode cannot run ("" when it can)."""
        missing, wrong = self._problems(self.layout.decode_tensors())
        encode_only = {k: v for k, v in self.layout.encode_tensors().items()
                       if k not in self.layout.decode_tensors()}
        enc_missing, enc_wrong = self._problems(encode_only)
        problems = ([f"missing tensor {m}" for m in missing] + wrong + enc_wrong)
        if enc_missing and len(enc_missing) < len(encode_only):
            problems += [f"missing encoder tensor {m}" for m in enc_missing]
        if problems:
            more = len(problems) - MAX_LISTED
            raise ModelFileError(
                f"{self.path}: not a complete s2.cpp codec: " + "; ".join(problems[:MAX_LISTED])
                + (f"; and {more} more" if more > 0 else ""))
        return "the file holds no encoder tensors (a decode-only codec)" if enc_missing else ""

    # ------------------------------------------------------------------ queries
    @property
    def can_encode(self) -> bool:
        return not self.encode_unavailable_reason

    def __contains__(self, name: str) -> bool:
        return self._stored(name) is not None

    def type_name(self, name: str) -> str:
        """The stored type: "f32", "f16" or "bf16"."""
        return CODEC_TYPES[self._require(name).type]

    def n_bytes(self, name: str) -> int:
        return self._require(name).n_bytes

    @property
    def weight_bytes(self) -> int:
        """Bytes of every codec tensor the file holds for the layout."""
        return sum(self.n_bytes(n) for n in self.layout.tensors() if n in self)

    def raw(self, name: str) -> np.ndarray:
        """The stored data, memory-mapped, shaped like the tensor: float32, float16, or the
        uint16 bit patterns of bfloat16."""
        t = self._require(name)
        return t.data.view(np.uint16) if t.type == QT.BF16 else t.data

    def tensor(self, name: str, dtype: Any = np.float32) -> np.ndarray:
        """A new array of `dtype` (float32 by default) with the tensor's values, PyTorch order."""
        t = self._require(name)
        values = gguf.quants.dequantize(t.data, t.type) if t.type == QT.BF16 else t.data
        return np.array(values, dtype=dtype).reshape(t.shape)

    def _require(self, name: str) -> StoredTensor:
        t = self._stored(name)
        if t is None:
            raise ModelFileError(f"{self.path}: no tensor {self.prefix}{name}")
        return t

    def close(self) -> None:
        """Drop the memory map; backends hold their own copies."""
        self._source.close()

    def __repr__(self) -> str:
        return f"CodecFile({str(self.path)!r}, prefix={self.prefix!r})"
