"""A saved voice prefix: the K/V of the prompt's first positions, reusable across syntheses.

Every sentence spoken in one voice starts with the same prompt positions (SPEC 7: everything
up to and including the reference codes). Their K/V depend on nothing else, so they are
computed once (`SlowARModel.save_prefix`), kept in memory or on disk (`KVPrefix.save`), and
written back into a new synthesis's cache (`SlowARModel.restore_prefix`) instead of being
prefilled again.

A KVPrefix carries what makes restoring it safe: its token rows (so a prompt can be checked to
start with them, and a backend that cannot write its cache can recompute them), the KV cache
type its values have, and the identity of the model file that made them.

File format: one safetensors file (the ecosystem's format: a JSON header, then raw
little-endian arrays), read back memory-mapped. Tensors `k`, `v` [n_layer, n, n_head_kv,
head_dim] in the cache type's own width (float16 for an f16 cache, bf16 bit patterns as uint16,
float32), `tokens` int64 (n, num_codebooks + 1); string metadata `format`, `kv_cache_dtype`,
`model` (the identity as JSON), `backend`, `s2core_version`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from s2core.version import __version__
from s2core.errors import PrefixFileError, PrefixMismatchError
from s2core.fileio import atomic_output, open_regular
from s2core.modelfile.file import ModelFile

FORMAT = "s2core-kvprefix/1"
#: bytes hashed at the start, middle and end of every tensor for the content digest
SAMPLE_BYTES = 4096
#: a prefix file's JSON header (the identity's hparams and the tensor table) is a few KiB
MAX_HEADER_BYTES = 1 << 20
#: the largest dimension a stored tensor may declare (positions, layers, heads, head_dim)
MAX_DIM = 1 << 24
#: values checked for finiteness at a time (bounded memory for any prefix)
FINITE_CHUNK = 1 << 20
_STORED = {"f16": np.dtype("<f2"), "bf16": np.dtype("<u2"), "f32": np.dtype("<f4")}
#: safetensors' names of the types a prefix file holds (the format is little-endian)
_ST_DTYPES = {"F16": np.dtype("<f2"), "U16": np.dtype("<u2"), "F32": np.dtype("<f4"),
              "I64": np.dtype("<i8")}


# ---------------------------------------------------------------------- model identity
@dataclass(frozen=True)
class ModelIdentity:
    """What a prefix's K/V depend on: the hparams, the tensor table (names, types, shapes,
    sizes of the tensors s2core uses) and a digest of their contents.

    The content digest hashes 3 x 4 KiB of every tensor (start, middle, end): ~4 MB for a
    10 GB S2 Pro file, milliseconds from the page cache, yet any re-quantization, fine-tune or
    other seed changes it."""

    hparams: dict[str, Any]
    tensors_sha256: str
    content_sha256: str

    @classmethod
    def of(cls, mf: ModelFile) -> "ModelIdentity":
        table = hashlib.sha256()
        content = hashlib.sha256()
        for t in mf.model_tensors():
            table.update(f"{t.name}|{t.type_name}|{t.shape}|{t.n_bytes}\n".encode())
            data = mf.raw(t.name).reshape(-1).view(np.uint8)
            n = data.size
            for start in sorted({0, max(0, n // 2 - SAMPLE_BYTES // 2), max(0, n - SAMPLE_BYTES)}):
                content.update(data[start:start + SAMPLE_BYTES].tobytes())
        hp = mf.hparams.as_dict()
        return cls(json.loads(json.dumps(hp)), table.hexdigest(), content.hexdigest())

    @property
    def digest(self) -> str:
        """One hex string for the whole identity (file names use its first characters)."""
        return hashlib.sha256(self.to_json().encode()).hexdigest()

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "ModelIdentity":
        d = json.loads(text)
        return cls(d["hparams"], d["tensors_sha256"], d["content_sha256"])

    def differences(self, other: "ModelIdentity") -> list[str]:
        """Human-readable reasons two identities differ (empty when equal)."""
        out = [f"{k}: {self.hparams.get(k)!r} vs {other.hparams.get(k)!r}"
               for k in sorted(set(self.hparams) | set(other.hparams))
               if self.hparams.get(k) != other.hparams.get(k)]
        if self.tensors_sha256 != other.tensors_sha256:
            out.append("tensor table (names, types or shapes) differs")
        if self.content_sha256 != other.content_sha256:
            out.append("tensor contents differ")
        return out


# ---------------------------------------------------------------------- the prefix
class KVPrefix:
    """K/V of positions [0, n) of one model, with the token rows that produced them."""

    def __init__(self, k: np.ndarray, v: np.ndarray, tokens: np.ndarray, kv_cache_dtype: str,
                 model: ModelIdentity, backend: str = "", *, _stored: bool = False):
        """k, v: float32 [n_layer, n, n_head_kv, head_dim] holding values of kv_cache_dtype
        (or, internally, already in the stored width); tokens: (n, num_codebooks + 1)."""
        if kv_cache_dtype not in _STORED:
            raise PrefixFileError(f"KV cache type {kv_cache_dtype!r} is not one of "
                                  f"{sorted(_STORED)}")
        self.kv_cache_dtype = kv_cache_dtype
        self.model = model
        self.backend = backend
        self.tokens = np.asarray(tokens, dtype=np.int64)
        if _stored:
            self._k, self._v = k, v
        else:
            self._k, self._v = (_to_stored(np.asarray(a, dtype=np.float32), kv_cache_dtype, name)
                                for a, name in ((k, "K"), (v, "V")))
        if self._k.shape != self._v.shape or self._k.ndim != 4:
            raise PrefixFileError(f"K {self._k.shape} and V {self._v.shape} must be equal 4-D "
                                  "shapes [n_layer, n, n_head_kv, head_dim]")
        if self.tokens.ndim != 2 or self.tokens.shape[0] != self._k.shape[1]:
            raise PrefixFileError(f"token rows {self.tokens.shape} do not match the "
                                  f"{self._k.shape[1]} positions of K/V")
        self._finite: bool | None = None  # K and V finite (counted on first check_finite)

    @property
    def n_positions(self) -> int:
        return int(self._k.shape[1])

    @property
    def shape(self) -> tuple[int, ...]:
        """[n_layer, n_positions, n_head_kv, head_dim] of K (and V)."""
        return tuple(self._k.shape)

    @property
    def k(self) -> np.ndarray:
        """K as float32 (a new array each time; the stored one may be a memory map)."""
        return _from_stored(self._k, self.kv_cache_dtype)

    @property
    def v(self) -> np.ndarray:
        return _from_stored(self._v, self.kv_cache_dtype)

    @property
    def nbytes(self) -> int:
        return int(self._k.nbytes + self._v.nbytes + self.tokens.nbytes)

    # ------------------------------------------------------------------ files
    def save(self, path: str | os.PathLike) -> Path:
        """Write one safetensors file atomically: written to a unique temporary name in the
        same directory and renamed into place, so a reader never sees half a file and two
        writers of the same path never collide."""
        from safetensors.numpy import save

        path = Path(path)
        metadata = {"format": FORMAT, "kv_cache_dtype": self.kv_cache_dtype,
                    "model": self.model.to_json(), "backend": self.backend,
                    "s2core_version": _version()}
        data = save({"k": np.ascontiguousarray(self._k), "v": np.ascontiguousarray(self._v),
                     "tokens": np.ascontiguousarray(self.tokens)}, metadata=metadata)
        with atomic_output(path, _error, "KV prefix file") as f:
            f.write(data)
        return path

    @classmethod
    def load(cls, path: str | os.PathLike) -> "KVPrefix":
        """Read a prefix file; K and V stay memory-mapped until a restore reads them.

        Everything is checked before any array is made: a regular file, the header's length,
        JSON, metadata types, the model identity, every tensor's dtype, shape and byte range,
        shapes that agree with each other and with the identity's hparams, and K and V finite.
        Any failure is a PrefixFileError whose `check` names the rule."""
        path = Path(path)
        with open_regular(path, _error, "KV prefix file") as f:
            size = os.fstat(f.fileno()).st_size
            header, data_start = _read_header(f, path, size)
        meta = _metadata(path, header)
        dtype = meta["kv_cache_dtype"]
        model = _identity(path, meta["model"])
        entries = {name: _tensor_entry(path, header, name, want, size - data_start)
                   for name, want in (("k", _STORED[dtype]), ("v", _STORED[dtype]),
                                      ("tokens", _ST_DTYPES["I64"]))}
        _check_shapes(path, model, {name: e[1] for name, e in entries.items()})
        arrays = {name: _map(path, want, shape, data_start + begin)
                  for name, (want, shape, begin) in entries.items()}
        for name in ("k", "v"):
            bad = _count_nonfinite(arrays[name], dtype)
            if bad:
                raise PrefixFileError(f"{path}: {name.upper()} holds {bad} NaN or infinite "
                                      "values", "finite")
        prefix = cls(arrays["k"], arrays["v"], np.array(arrays["tokens"]), dtype, model,
                     meta.get("backend", ""), _stored=True)
        prefix._finite = True
        return prefix

    def check_finite(self) -> None:
        """Refuse (PrefixMismatchError, `prefix_finite`) K or V holding NaN or infinity: such
        a prefix would poison every position after it. Counted once per prefix."""
        if self._finite is None:
            self._finite = not any(_count_nonfinite(a, self.kv_cache_dtype)
                                   for a in (self._k, self._v))
        if not self._finite:
            raise PrefixMismatchError("prefix_finite", "the prefix's K or V holds NaN or "
                                      "infinite values: it would poison every later position")

    def __repr__(self) -> str:
        return (f"KVPrefix(n_positions={self.n_positions}, shape={self.shape}, "
                f"kv_cache_dtype={self.kv_cache_dtype!r}, backend={self.backend!r})")


def _to_stored(a: np.ndarray, dtype: str, name: str) -> np.ndarray:
    """float32 values of the cache type -> its own width, refusing values it cannot hold
    (a snapshot of an f16 cache holds f16 numbers exactly; anything else is a bug)."""
    if dtype == "f32":
        return a
    if dtype == "f16":
        stored = a.astype(np.float16)
    else:
        bits = np.ascontiguousarray(a).view(np.uint32)
        stored = (bits >> 16).astype(np.uint16)
    back = _from_stored(stored, dtype)
    if not np.array_equal(back, a, equal_nan=True):
        bad = int(np.count_nonzero(back != a))
        raise PrefixFileError(f"{name} holds {bad} values that are not {dtype} numbers: a "
                              f"prefix of a {dtype} cache must hold its cache's values")
    return stored


def _from_stored(a: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "bf16":
        return (np.asarray(a, dtype=np.uint32) << 16).view(np.float32)
    return np.asarray(a, dtype=np.float32).copy() if dtype == "f32" else a.astype(np.float32)


def _error(message: str, check: str) -> PrefixFileError:
    return PrefixFileError(message, check)


def _read_header(f: Any, path: Path, size: int) -> tuple[dict[str, Any], int]:
    """safetensors' header: u64 little-endian length, then that much JSON (bounded)."""
    try:
        head = f.read(8)
        if len(head) < 8:
            raise PrefixFileError(f"{path}: too short for a safetensors file ({len(head)} "
                                  "bytes)", "truncated")
        (n,) = struct.unpack("<Q", head)
        if n > size - 8 or n > MAX_HEADER_BYTES:
            raise PrefixFileError(f"{path}: header length {n} does not fit the file ({size} "
                                  f"bytes) or exceeds {MAX_HEADER_BYTES}", "header_length")
        raw = f.read(n)
    except OSError as exc:
        raise PrefixFileError(f"{path}: cannot read: {exc}", "read") from exc
    try:
        header = json.loads(raw)
    except RecursionError:
        raise PrefixFileError(f"{path}: the safetensors header nests too deeply",
                              "header_json") from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise PrefixFileError(f"{path}: the safetensors header is not JSON: {exc}",
                              "header_json") from exc
    if not isinstance(header, dict):
        raise PrefixFileError(f"{path}: the safetensors header is not a JSON object",
                              "header_json")
    unknown = sorted(set(header) - {"__metadata__", "k", "v", "tokens"})
    if unknown:
        raise PrefixFileError(f"{path}: unexpected header entries {unknown[:5]!r}", "tensors")
    return header, 8 + n


def _metadata(path: Path, header: dict[str, Any]) -> dict[str, str]:
    meta = header.get("__metadata__")
    if not isinstance(meta, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                             for k, v in meta.items()):
        raise PrefixFileError(f"{path}: __metadata__ must map strings to strings, got "
                              f"{type(meta).__name__}", "metadata_type")
    if meta.get("format") != FORMAT:
        raise PrefixFileError(f"{path}: not an s2core KV prefix (format "
                              f"{meta.get('format')!r:.80}, expected {FORMAT!r})", "format")
    if meta.get("kv_cache_dtype") not in _STORED:
        raise PrefixFileError(f"{path}: unknown kv_cache_dtype "
                              f"{meta.get('kv_cache_dtype')!r:.80}", "kv_cache_dtype")
    if "model" not in meta:
        raise PrefixFileError(f"{path}: no model identity", "model_identity")
    return meta


def _identity(path: Path, text: str) -> ModelIdentity:
    """The stored model identity, every field of the type ModelIdentity.of writes."""
    try:
        d = json.loads(text)
    except RecursionError:
        d = None
    except ValueError as exc:
        raise PrefixFileError(f"{path}: the model identity is not JSON: {exc}",
                              "model_identity") from exc
    ok = (isinstance(d, dict) and set(d) == {"hparams", "tensors_sha256", "content_sha256"}
          and isinstance(d["hparams"], dict) and d["hparams"]
          and all(isinstance(k, str) for k in d["hparams"])
          and all(isinstance(d[k], str) and len(d[k]) == 64
                  and all(c in "0123456789abcdef" for c in d[k])
                  for k in ("tensors_sha256", "content_sha256")))
    if not ok:
        raise PrefixFileError(f"{path}: the model identity must be an object with hparams (a "
                              "non-empty object) and two sha256 hex digests", "model_identity")
    return ModelIdentity(d["hparams"], d["tensors_sha256"], d["content_sha256"])


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _tensor_entry(path: Path, header: dict[str, Any], name: str, want: np.dtype,
                  body: int) -> tuple[np.dtype, tuple[int, ...], int]:
    """(dtype, shape, begin) of a tensor whose entry has the right types and whose byte range
    lies in the file's body and matches its shape (all in Python ints: nothing wraps)."""
    info = header.get(name)
    if not isinstance(info, dict) or set(info) != {"dtype", "shape", "data_offsets"}:
        raise PrefixFileError(f"{path}: no well-formed tensor {name!r} (an object with dtype, "
                              "shape and data_offsets)", "tensor_entry")
    dtype, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
    if not isinstance(dtype, str) or _ST_DTYPES.get(dtype) != want:
        raise PrefixFileError(f"{path}: tensor {name!r} is {dtype!r:.40}, expected "
                              f"{np.dtype(want).name}", "tensor_dtype")
    if (not isinstance(shape, list) or len(shape) > 4
            or not all(_is_int(d) and 0 <= d <= MAX_DIM for d in shape)):
        raise PrefixFileError(f"{path}: tensor {name!r} has shape {shape!r:.80}: it must be at "
                              f"most 4 integers in [0, {MAX_DIM}]", "tensor_shape")
    if (not isinstance(offsets, list) or len(offsets) != 2
            or not all(_is_int(o) for o in offsets)):
        raise PrefixFileError(f"{path}: tensor {name!r} has data_offsets {offsets!r:.80}: it "
                              "must be two integers", "tensor_offsets")
    begin, end = offsets
    n_bytes = math.prod(shape) * want.itemsize
    if not 0 <= begin <= end <= body or end - begin != n_bytes:
        raise PrefixFileError(f"{path}: tensor {name!r} of shape {tuple(shape)} needs "
                              f"{n_bytes} bytes but its range is [{begin}, {end}) of a "
                              f"{body}-byte body (truncated?)", "tensor_offsets")
    return want, tuple(shape), begin


def _check_shapes(path: Path, model: ModelIdentity, shapes: dict[str, tuple[int, ...]]) -> None:
    """K and V equal 4-D shapes [n_layer, n, n_head_kv, head_dim] as the identity's hparams say,
    token rows (n, num_codebooks + 1)."""
    k, v, tokens = shapes["k"], shapes["v"], shapes["tokens"]
    hp = model.hparams
    want = [hp.get(key) for key in ("n_layer", "n_head_kv", "head_dim", "num_codebooks")]
    if len(k) != 4 or k != v or len(tokens) != 2 or tokens[0] != k[1]:
        raise PrefixFileError(f"{path}: K {k}, V {v} and token rows {tokens} must be "
                              "[n_layer, n, n_head_kv, head_dim] twice and (n, width)",
                              "tensor_shape")
    if not all(_is_int(w) for w in want) or (k[0], k[2], k[3], tokens[1]) != (
            want[0], want[1], want[2], want[3] + 1):
        raise PrefixFileError(f"{path}: K {k} and token rows {tokens} do not match the model "
                              f"identity's n_layer, n_head_kv, head_dim, num_codebooks "
                              f"{want!r:.80}", "model_identity")


def _map(path: Path, dtype: np.dtype, shape: tuple[int, ...], offset: int) -> np.ndarray:
    if math.prod(shape) == 0:
        return np.zeros(shape, dtype)
    try:
        return np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=shape)
    except (OSError, ValueError) as exc:
        raise PrefixFileError(f"{path}: cannot map its tensors: {exc}", "read") from exc


def _count_nonfinite(a: np.ndarray, dtype: str) -> int:
    """NaN and infinite values of a stored K or V, read in bounded chunks (a memory map stays
    mostly on disk): an all-ones exponent in the stored width's bits."""
    flat = np.asarray(a).reshape(-1)
    exponent = {"f16": (np.uint16, 0x7C00), "bf16": (np.uint16, 0x7F80),
                "f32": (np.uint32, 0x7F800000)}[dtype]
    bits_type, mask = exponent
    bad = 0
    for start in range(0, flat.size, FINITE_CHUNK):
        bits = flat[start:start + FINITE_CHUNK].view(bits_type)
        bad += int(np.count_nonzero((bits & mask) == mask))
    return bad


def _version() -> str:
    return __version__
