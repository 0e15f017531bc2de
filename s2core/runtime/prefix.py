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
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from s2core.version import __version__
from s2core.errors import PrefixFileError
from s2core.modelfile.file import ModelFile

FORMAT = "s2core-kvprefix/1"
#: bytes hashed at the start, middle and end of every tensor for the content digest
SAMPLE_BYTES = 4096
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
        """Write one safetensors file (atomically: a crash never leaves half a file)."""
        from safetensors.numpy import save_file

        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + f".tmp{os.getpid()}")
        metadata = {"format": FORMAT, "kv_cache_dtype": self.kv_cache_dtype,
                    "model": self.model.to_json(), "backend": self.backend,
                    "s2core_version": _version()}
        try:
            save_file({"k": np.ascontiguousarray(self._k), "v": np.ascontiguousarray(self._v),
                       "tokens": np.ascontiguousarray(self.tokens)}, tmp, metadata=metadata)
            os.replace(tmp, path)
        finally:
            if tmp.exists():
                tmp.unlink()
        return path

    @classmethod
    def load(cls, path: str | os.PathLike) -> "KVPrefix":
        """Read a prefix file; K and V stay memory-mapped until a restore reads them."""
        path = Path(path)
        header, data_start = _read_header(path)
        meta = header.pop("__metadata__", None) or {}
        if meta.get("format") != FORMAT:
            raise PrefixFileError(f"{path}: not an s2core KV prefix (format "
                                  f"{meta.get('format')!r}, expected {FORMAT!r})")
        dtype = meta.get("kv_cache_dtype")
        if dtype not in _STORED:
            raise PrefixFileError(f"{path}: unknown kv_cache_dtype {dtype!r}")
        try:
            model = ModelIdentity.from_json(meta["model"])
        except (KeyError, TypeError, ValueError) as exc:
            raise PrefixFileError(f"{path}: unreadable model identity: {exc}") from exc
        size = path.stat().st_size
        arrays = {}
        for name, want in (("k", _STORED[dtype]), ("v", _STORED[dtype]),
                           ("tokens", _ST_DTYPES["I64"])):
            arrays[name] = _map_tensor(path, header, name, want, data_start, size)
        return cls(arrays["k"], arrays["v"], np.asarray(arrays["tokens"]), dtype, model,
                   meta.get("backend", ""), _stored=True)

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


def _read_header(path: Path) -> tuple[dict[str, Any], int]:
    """safetensors' header: u64 little-endian length, then that much JSON."""
    try:
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise PrefixFileError(f"{path}: too short for a safetensors file "
                                      f"({len(head)} bytes)")
            (n,) = struct.unpack("<Q", head)
            if n > path.stat().st_size - 8 or n > 100 << 20:
                raise PrefixFileError(f"{path}: header length {n} does not fit the file")
            raw = f.read(n)
    except FileNotFoundError as exc:
        raise PrefixFileError(f"KV prefix file not found: {path}") from exc
    except OSError as exc:
        raise PrefixFileError(f"{path}: cannot read: {exc}") from exc
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, ValueError) as exc:
        raise PrefixFileError(f"{path}: the safetensors header is not JSON: {exc}") from exc
    if not isinstance(header, dict):
        raise PrefixFileError(f"{path}: the safetensors header is not a JSON object")
    return header, 8 + n


def _map_tensor(path: Path, header: dict[str, Any], name: str, want: np.dtype, data_start: int,
                size: int) -> np.ndarray:
    info = header.get(name)
    if not isinstance(info, dict):
        raise PrefixFileError(f"{path}: no tensor {name!r}")
    try:
        dtype = _ST_DTYPES[info["dtype"]]
        shape = tuple(int(d) for d in info["shape"])
        begin, end = (int(x) for x in info["data_offsets"])
    except (KeyError, TypeError, ValueError) as exc:
        raise PrefixFileError(f"{path}: tensor {name!r} has a malformed entry {info!r}") from exc
    if dtype != want:
        raise PrefixFileError(f"{path}: tensor {name!r} is {info['dtype']}, expected "
                              f"{np.dtype(want).name}")
    n_bytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if min(shape, default=1) < 0 or end - begin != n_bytes or begin < 0 \
            or data_start + end > size:
        raise PrefixFileError(f"{path}: tensor {name!r} of shape {shape} does not match its "
                              f"byte range [{begin}, {end}) (file of {size} bytes: truncated?)")
    if n_bytes == 0:
        return np.zeros(shape, dtype)
    return np.memmap(path, dtype=dtype, mode="r", offset=data_start + begin, shape=shape)


def _version() -> str:
    return __version__
