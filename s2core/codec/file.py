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

from ..errors import ModelFileError
from .hparams import KEY_PREFIX, CodecHparams
from .layout import CodecLayout, build_layout

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
    data: Any               # the memory-mapped array as gguf-py exposes it
    n_bytes: int


class _GGUFSource:
    """The only code here that touches `gguf.GGUFReader`, so the codec can move onto the
    project's hardened reader by changing this class alone."""

    def __init__(self, path: Path):
        try:
            self._reader: gguf.GGUFReader | None = gguf.GGUFReader(path, "r")
        except FileNotFoundError as exc:
            raise ModelFileError(f"codec file not found: {path}") from exc
        except (ValueError, OSError, KeyError, IndexError) as exc:
            raise ModelFileError(f"{path} is not a readable GGUF file: {exc}") from exc
        self.tensors = {t.name: StoredTensor(t.tensor_type, tuple(int(d) for d in reversed(t.shape.tolist())),
                                             t.data, int(t.n_bytes))
                        for t in self._reader.tensors}

    def value(self, key: str) -> Any:
        field = self._reader.fields.get(key)
        return None if field is None else field.contents()

    def values(self, prefix: str) -> dict[str, Any]:
        """Every field under `prefix` (scalars and arrays), keys without the prefix. Only these
        are decoded: a full model's tokenizer holds ~155k strings."""
        return {k[len(prefix):]: f.contents() for k, f in self._reader.fields.items()
                if k.startswith(prefix)}

    def close(self) -> None:
        reader, self._reader = self._reader, None
        self.tensors = {}
        mm = getattr(getattr(reader, "data", None), "_mmap", None)
        if mm is not None:
            try:
                mm.close()
            except BufferError:
                pass  # a view is still alive; the OS unmaps it when that view goes


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
            self.hparams = CodecHparams.from_metadata(self._source.values(KEY_PREFIX))
            self.layout: CodecLayout = build_layout(self.hparams, self._probe_transformer)
            self.encode_unavailable_reason = self._check()
        except BaseException:
            self._source.close()
            raise

    # ------------------------------------------------------------------ checks
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
