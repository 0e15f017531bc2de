"""A GGUF container, validated before anything in it is trusted. Architecture-agnostic.

`GGUFFile` walks the header itself, with a bounds check before every read, instead of handing
the file to `gguf.GGUFReader`: that reader decodes every field eagerly (a real S2 Pro file
carries ~155k tokenizer strings) and trusts the counts it reads, so a header that declares
5e7 array elements or 2**32 tensors runs for minutes and grows to gigabytes before failing.
Here every count is checked against the bytes left in the file (and a fixed ceiling) before
anything is allocated, so a hostile file fails in milliseconds with bounded memory:

- header: magic, version 2 or 3 (little-endian), key and tensor counts within `Limits` and
  within what the remaining bytes could hold;
- metadata: every key and string length inside the file, array elements of a fixed-size type
  counted against the bytes left (strings walked, never decoded), nested arrays refused (ggml
  refuses them too); values are kept raw and typed on access: `get(key, int)` refuses a float,
  `get(key, bool)` refuses the string 'false', `get(key, float)` refuses NaN and infinities;
- tensor infos: unique UTF-8 names, 1 to 4 dims, a known GGML type whose block divides the
  row, sizes consistent with type and shape, offsets aligned to `general.alignment`, inside
  the data section and not overlapping each other;
- only regular files are opened (a FIFO would block forever, a directory reads as garbage),
  and a file that ends early is reported as "truncated" with the offsets involved.

What it does not know: which keys and tensors a model needs. `ModelFile` (s2core/modelfile/file.py)
builds the Slow-AR's checks on top; the codec reader can build its own the same way. The
`gguf` package still supplies what it does well: type enums, block sizes, dequantization.
"""

from __future__ import annotations

import gc
import math
import mmap
import os
import stat
import struct
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import gguf
import numpy as np
from gguf import GGMLQuantizationType as QT
from gguf import GGUFValueType as VT

from s2core.errors import InvalidInputError, ModelFileError

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32  # GGUF's default when general.alignment is absent
MAX_DIMS = 4            # GGML_MAX_DIMS
#: a tensor larger than this cannot be a real file cut short: its size field is broken
_PLAUSIBLE_BYTES = 1 << 48

#: fixed-size scalar value types: struct format
_SCALAR_FORMATS = {
    VT.UINT8: "<B", VT.INT8: "<b", VT.UINT16: "<H", VT.INT16: "<h", VT.UINT32: "<I",
    VT.INT32: "<i", VT.UINT64: "<Q", VT.INT64: "<q", VT.FLOAT32: "<f", VT.FLOAT64: "<d",
    VT.BOOL: "<B",
}
_NUMPY_TYPES = {
    VT.UINT8: np.uint8, VT.INT8: np.int8, VT.UINT16: np.uint16, VT.INT16: np.int16,
    VT.UINT32: np.uint32, VT.INT32: np.int32, VT.UINT64: np.uint64, VT.INT64: np.int64,
    VT.FLOAT32: np.float32, VT.FLOAT64: np.float64, VT.BOOL: np.uint8,
}
INTEGER_TYPES = frozenset({VT.UINT8, VT.INT8, VT.UINT16, VT.INT16, VT.UINT32, VT.INT32,
                           VT.UINT64, VT.INT64})
FLOAT_TYPES = frozenset({VT.FLOAT32, VT.FLOAT64})

#: tensor types whose stored data is an array of that type (the rest are byte blocks)
_ELEMENT_TYPES = {QT.F32: np.float32, QT.F16: np.float16, QT.F64: np.float64, QT.I8: np.int8,
                  QT.I16: np.int16, QT.I32: np.int32, QT.I64: np.int64}


@dataclass(frozen=True)
class Limits:
    """Ceilings on what a header may declare, checked before anything is allocated.

    Generous for real files (S2 Pro: ~600 tensors, ~50 keys, a 155k-string vocabulary, short
    names) and small enough that walking a hostile header stays well under a second."""

    max_kv: int = 1 << 16
    max_tensors: int = 1 << 16
    max_array_length: int = 1 << 22
    max_key_length: int = 1 << 16      # the GGUF spec's bound on key length
    max_name_length: int = 1 << 10     # ggml's own is 64
    max_string_length: int = 1 << 26
    max_alignment: int = 1 << 16


DEFAULT_LIMITS = Limits()


def _short(value: Any, width: int = 60) -> str:
    """repr(value), cut to `width` characters so no message grows with the file."""
    text = repr(value)
    return text if len(text) <= width else text[:width - 3] + "..."


@dataclass(frozen=True)
class MetadataValue:
    """One key's value as stored: its GGUF type and, for scalars, the value (strings as
    bytes, decoded on access); arrays keep their place in the file and are read on demand."""

    type: VT
    value: Any = None
    element_type: VT | None = None  # arrays only
    count: int = 0                  # arrays only
    offset: int = 0                 # arrays only: first element's byte offset in the file

    @property
    def type_name(self) -> str:
        if self.type == VT.ARRAY:
            return f"ARRAY[{self.element_type.name}] of {self.count}"
        return self.type.name


@dataclass(frozen=True)
class GGUFTensor:
    """A tensor's header entry, validated: its bytes lie inside the data section."""

    name: str
    type: QT
    shape: tuple[int, ...]   # PyTorch order [out, in]; GGUF's ne is this reversed
    n_bytes: int
    offset: int              # absolute byte offset of the data in the file

    @property
    def n_elements(self) -> int:
        return math.prod(self.shape)


class _Cursor:
    """Reads little-endian values from the mapped file, each after a bounds check."""

    def __init__(self, buf: Any, size: int, path: Path):
        self.buf, self.size, self.path, self.pos = buf, size, path, 0

    def need(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > self.size:
            raise ModelFileError(
                f"{self.path}: truncated: {what} needs bytes [{self.pos}, {self.pos + n}) but "
                f"the file ends at byte {self.size}", check="truncated")

    def scalar(self, fmt: str, what: str) -> Any:
        n = struct.calcsize(fmt)
        self.need(n, what)
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += n
        return value

    def string_bytes(self, limit: int, what: str) -> bytes:
        n = self.scalar("<Q", f"length of {what}")
        if n > limit:
            raise ModelFileError(f"{self.path}: {what} declares {n} bytes, more than the "
                                 f"limit of {limit}", check="bounds")
        self.need(n, what)
        out = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        return out

    def skip_strings(self, count: int, what: str) -> None:
        """Walk `count` strings without decoding them (a tokenizer's vocabulary)."""
        buf, pos, size = self.buf, self.pos, self.size
        unpack = struct.Struct("<Q").unpack_from
        for i in range(count):
            if pos + 8 > size:
                self.pos = pos
                self.need(8, f"{what}, element {i}")
            (n,) = unpack(buf, pos)
            pos += 8
            if n > size - pos:
                self.pos = pos
                self.need(n, f"{what}, element {i}")
            pos += n
        self.pos = pos


class GGUFFile:
    """A validated, memory-mapped GGUF file: typed metadata and checked tensor entries.

        f = GGUFFile("model.gguf")
        f.get("fish-speech.block_count", int, default=36)   # wrong type -> ModelFileError
        f.tensors["norm.weight"].shape, f.tensor_data("norm.weight")

    Every problem is a `ModelFileError` whose `check` names it ("truncated", "bounds",
    "metadata_type", "tensor_offset", ...). Nothing but the header is read at open; tensor
    data is a read-only view of the memory map, touched only when asked for.
    """

    def __init__(self, path: str | os.PathLike, limits: Limits = DEFAULT_LIMITS):
        self.path = _as_path(path)
        self.limits = limits
        self._mmap = _map_regular_file(self.path)
        self.file_size = len(self._mmap)
        try:
            self._parse()
        except BaseException:
            self._mmap.close()
            raise

    # ------------------------------------------------------------------ parsing
    def _parse(self) -> None:
        lim, path = self.limits, self.path
        cur = _Cursor(self._mmap, self.file_size, path)
        cur.need(4, "the GGUF magic")
        if bytes(self._mmap[:4]) != GGUF_MAGIC:
            raise ModelFileError(f"{path} is not a GGUF file (starts with "
                                 f"{bytes(self._mmap[:4])!r}, not {GGUF_MAGIC!r})", check="magic")
        cur.pos = 4
        version = cur.scalar("<I", "the version")
        if version not in SUPPORTED_VERSIONS:
            hint = " (a big-endian file?)" if version & 0xFFFF == 0 else ""
            raise ModelFileError(f"{path}: GGUF version {version}{hint} is not supported "
                                 f"(supported: {SUPPORTED_VERSIONS})", check="version")
        self.version = version
        n_tensors = cur.scalar("<Q", "the tensor count")
        n_kv = cur.scalar("<Q", "the metadata key count")
        left = self.file_size - cur.pos
        for what, n, ceiling in (("metadata keys", n_kv, lim.max_kv),
                                 ("tensors", n_tensors, lim.max_tensors)):
            if n > ceiling:
                raise ModelFileError(f"{path}: the header declares {n} {what}, more than the "
                                     f"limit of {ceiling}", check="bounds")
        # a key takes at least 8 (length) + 4 (type) + 1 (value) bytes; a tensor info 8 (name
        # length) + 4 (dims) + 8 (one dim) + 4 (type) + 8 (offset)
        if n_kv * 13 + n_tensors * 32 > left:
            raise ModelFileError(
                f"{path}: truncated: the header declares {n_kv} metadata keys and {n_tensors} "
                f"tensors, which need more than the {left} bytes left in the file",
                check="truncated")

        self._metadata: dict[str, MetadataValue] = {}
        for i in range(n_kv):
            key_bytes = cur.string_bytes(lim.max_key_length, f"metadata key #{i}")
            key = _decode(key_bytes, f"{path}: metadata key #{i}")
            if key in self._metadata:
                raise ModelFileError(f"{path}: metadata key {_short(key)} appears twice",
                                     check="duplicate_key")
            self._metadata[key] = self._read_value(cur, key)

        alignment = self.get("general.alignment", int, DEFAULT_ALIGNMENT, types=(VT.UINT32,))
        if alignment <= 0 or alignment & (alignment - 1) or alignment > lim.max_alignment:
            raise ModelFileError(f"{path}: general.alignment={alignment} is not a power of two "
                                 f"in [1, {lim.max_alignment}]", check="alignment")
        self.alignment = alignment

        infos = [self._read_tensor_info(cur, i) for i in range(n_tensors)]
        self.data_offset = -(-cur.pos // alignment) * alignment
        if infos and self.data_offset > self.file_size:
            raise ModelFileError(f"{path}: truncated: the data section starts at byte "
                                 f"{self.data_offset} but the file ends at byte {self.file_size}",
                                 check="truncated")
        self.tensors = self._place_tensors(infos)

    def _read_value(self, cur: _Cursor, key: str) -> MetadataValue:
        raw_type = cur.scalar("<I", f"the type of {_short(key)}")
        vtype = _value_type(raw_type, self.path, key)
        if vtype == VT.ARRAY:
            raw_elem = cur.scalar("<I", f"the element type of {_short(key)}")
            elem = _value_type(raw_elem, self.path, key)
            if elem == VT.ARRAY:
                raise ModelFileError(f"{self.path}: {_short(key)} is an array of arrays, which "
                                     "GGUF readers (ggml's too) refuse", check="metadata_type")
            count = cur.scalar("<Q", f"the length of {_short(key)}")
            if count > self.limits.max_array_length:
                raise ModelFileError(f"{self.path}: {_short(key)} declares {count} elements, "
                                     f"more than the limit of {self.limits.max_array_length}",
                                     check="bounds")
            start = cur.pos
            if elem == VT.STRING:
                cur.need(8 * count, f"the {count} strings of {_short(key)}")  # 8 bytes each at least
                cur.skip_strings(count, f"the strings of {_short(key)}")
            else:
                size = struct.calcsize(_SCALAR_FORMATS[elem]) * count
                cur.need(size, f"the {count} {elem.name} elements of {_short(key)}")
                cur.pos += size
            return MetadataValue(VT.ARRAY, element_type=elem, count=count, offset=start)
        if vtype == VT.STRING:
            return MetadataValue(VT.STRING, cur.string_bytes(self.limits.max_string_length,
                                                             f"the value of {_short(key)}"))
        value = cur.scalar(_SCALAR_FORMATS[vtype], f"the value of {_short(key)}")
        if vtype == VT.BOOL and value not in (0, 1):
            raise ModelFileError(f"{self.path}: {_short(key)} is a BOOL holding {value}, "
                                 "neither 0 nor 1", check="metadata_value")
        return MetadataValue(vtype, bool(value) if vtype == VT.BOOL else value)

    def _read_tensor_info(self, cur: _Cursor, i: int) -> tuple[str, QT, tuple[int, ...], int, int]:
        path = self.path
        name = _decode(cur.string_bytes(self.limits.max_name_length, f"the name of tensor #{i}"),
                       f"{path}: the name of tensor #{i}")
        n_dims = cur.scalar("<I", f"the dimension count of {_short(name)}")
        if not 1 <= n_dims <= MAX_DIMS:
            raise ModelFileError(f"{path}: tensor {_short(name)} has {n_dims} dimensions "
                                 f"(1 to {MAX_DIMS} allowed)", check="tensor_shape")
        ne = [cur.scalar("<Q", f"dimension {d} of {_short(name)}") for d in range(n_dims)]
        raw_type = cur.scalar("<I", f"the type of {_short(name)}")
        offset = cur.scalar("<Q", f"the data offset of {_short(name)}")
        try:
            qtype = QT(raw_type)
            block, type_size = gguf.GGML_QUANT_SIZES[qtype]
        except (ValueError, KeyError):
            raise ModelFileError(f"{path}: tensor {_short(name)} has unknown GGML type "
                                 f"{raw_type}", check="tensor_type") from None
        if ne[0] % block:
            raise ModelFileError(f"{path}: tensor {_short(name)} has rows of {ne[0]} elements, "
                                 f"not a whole number of {qtype.name} blocks of {block}",
                                 check="tensor_shape")
        # Python ints: no overflow; a size beyond the file is refused below.
        n_bytes = math.prod(ne) // block * type_size
        return name, qtype, tuple(reversed(ne)), n_bytes, offset

    def _place_tensors(self, infos: list) -> dict[str, GGUFTensor]:
        """Offsets aligned, all inside the data section, no two tensors sharing a byte."""
        path, data_size = self.path, self.file_size - self.data_offset
        tensors: dict[str, GGUFTensor] = {}
        for name, qtype, shape, n_bytes, offset in infos:
            if name in tensors:
                raise ModelFileError(f"{path}: tensor {_short(name)} appears twice",
                                     check="duplicate_tensor")
            if offset % self.alignment:
                raise ModelFileError(f"{path}: tensor {_short(name)} starts at data offset "
                                     f"{offset}, not a multiple of the alignment "
                                     f"{self.alignment}", check="tensor_offset")
            tensors[name] = GGUFTensor(name, qtype, shape, n_bytes, offset)
        ordered = sorted(tensors.values(), key=lambda t: (t.offset, t.n_bytes))
        for t in ordered:
            end = t.offset + t.n_bytes
            if end <= data_size:
                continue
            # In offset order, a file cut short leaves the first missing tensor starting where
            # the data ends (or within one alignment of it); one that starts further out has a
            # bad offset (or a size no file could hold).
            cut = t.offset <= data_size + self.alignment and t.n_bytes <= _PLAUSIBLE_BYTES
            raise ModelFileError(
                f"{path}: {'truncated: ' if cut else ''}tensor {_short(t.name)} ({t.type.name}, "
                f"shape {t.shape}) needs data bytes [{t.offset}, {end}) but the data section "
                f"holds {data_size} bytes (the file ends at byte {self.file_size})",
                check="truncated" if cut else "tensor_offset")
        nonempty = [t for t in ordered if t.n_bytes]
        for before, after in zip(nonempty, nonempty[1:]):
            if after.offset < before.offset + before.n_bytes:
                raise ModelFileError(
                    f"{path}: tensors {_short(before.name)} (data bytes [{before.offset}, "
                    f"{before.offset + before.n_bytes})) and {_short(after.name)} (from byte "
                    f"{after.offset}) overlap", check="tensor_overlap")
        return {name: GGUFTensor(t.name, t.type, t.shape, t.n_bytes, self.data_offset + t.offset)
                for name, t in tensors.items()}

    # ------------------------------------------------------------------ metadata
    def __contains__(self, key: str) -> bool:
        return key in self._metadata

    def keys(self) -> Iterator[str]:
        return iter(self._metadata)

    def value_type(self, key: str) -> MetadataValue:
        """The stored type of `key` (KeyError if absent)."""
        return self._metadata[key]

    _MISSING = object()

    def get(self, key: str, kind: type, default: Any = _MISSING,
            types: tuple[VT, ...] | None = None) -> Any:
        """The value of `key` as `kind` (int, float, bool or str), refusing any other stored
        type: int takes the GGUF integer types only (a float 64.9 is refused, not truncated),
        float the float types and integers (NaN and infinities refused), bool only BOOL
        (the string 'false' is refused, not read as True), str only STRING (UTF-8).
        `types` narrows the accepted GGUF types further. A missing key gives `default`, or a
        ModelFileError when there is none."""
        entry = self._metadata.get(key)
        if entry is None:
            if default is self._MISSING:
                raise ModelFileError(f"{self.path}: metadata key {_short(key)} is missing",
                                     check="missing_key")
            return default
        accepted = {int: INTEGER_TYPES, float: INTEGER_TYPES | FLOAT_TYPES, bool: {VT.BOOL},
                    str: {VT.STRING}}[kind]
        if types is not None:
            accepted = accepted & set(types)
        if entry.type not in accepted:
            shown = "" if entry.type == VT.ARRAY else f" ({_short(self._display(entry))})"
            raise ModelFileError(
                f"{self.path}: metadata {_short(key)} is stored as {entry.type_name}{shown}; "
                f"expected {_type_words(accepted)}", check="metadata_type")
        if kind is str:
            return _decode(entry.value, f"{self.path}: the value of {_short(key)}")
        if kind is float:
            value = float(entry.value)
            if not math.isfinite(value):
                raise ModelFileError(f"{self.path}: metadata {_short(key)} is {value}; expected "
                                     "a finite number", check="metadata_value")
            return value
        return kind(entry.value)

    def get_array(self, key: str, kind: type) -> Any:
        """An array's elements: a list of str (kind str) or a numpy array (int, float, bool)."""
        entry = self._metadata.get(key)
        want = {str: {VT.STRING}, int: INTEGER_TYPES, float: FLOAT_TYPES, bool: {VT.BOOL}}[kind]
        if entry is None or entry.type != VT.ARRAY or entry.element_type not in want:
            found = "missing" if entry is None else f"stored as {entry.type_name}"
            raise ModelFileError(f"{self.path}: metadata {_short(key)} is {found}; expected "
                                 f"an array of {kind.__name__}", check="metadata_type")
        if kind is str:
            cur = _Cursor(self._mmap, self.file_size, self.path)
            cur.pos = entry.offset
            return [_decode(cur.string_bytes(self.limits.max_string_length, key), key)
                    for _ in range(entry.count)]
        out = np.frombuffer(self._mmap, _NUMPY_TYPES[entry.element_type], entry.count,
                            entry.offset).copy()
        return out.astype(bool) if kind is bool else out

    def scalar_metadata(self) -> dict[str, Any]:
        """Key -> value of every scalar and string key (arrays left out), for display."""
        return {k: self._display(v) for k, v in self._metadata.items() if v.type != VT.ARRAY}

    @staticmethod
    def _display(entry: MetadataValue) -> Any:
        if entry.type == VT.STRING:
            return entry.value.decode("utf-8", errors="replace")
        return entry.value

    # ------------------------------------------------------------------ tensor data
    def tensor_data(self, name: str) -> np.ndarray:
        """The stored data as a read-only view of the memory map, laid out as
        gguf.GGUFReader lays it out: float and integer types shaped like the tensor, block
        types as uint8 (rows..., bytes per row)."""
        t = self.tensors[name]
        element = _ELEMENT_TYPES.get(t.type)
        if element is not None:
            return np.frombuffer(self._mmap, element, t.n_elements, t.offset).reshape(t.shape)
        block, type_size = gguf.GGML_QUANT_SIZES[t.type]
        shape = (*t.shape[:-1], t.shape[-1] // block * type_size)
        return np.frombuffer(self._mmap, np.uint8, t.n_bytes, t.offset).reshape(shape)

    def release(self, name: str) -> None:
        """Drop a tensor's pages from this process (they stay in the OS page cache)."""
        if self._mmap.closed or not hasattr(self._mmap, "madvise"):
            return
        t = self.tensors[name]
        page = mmap.PAGESIZE
        start = -(-t.offset // page) * page  # whole pages inside the tensor only
        end = (t.offset + t.n_bytes) // page * page
        if end > start:
            self._mmap.madvise(mmap.MADV_DONTNEED, start, end - start)

    def close(self) -> bool:
        """Unmap the file. Views of it that are still alive (arrays from tensor_data) keep the
        mapping until the last one goes: then False, and a ResourceWarning says so."""
        try:
            self._mmap.close()
        except BufferError:
            gc.collect()  # views kept only by reference cycles go now
            try:
                self._mmap.close()
            except BufferError:
                warnings.warn(f"{self.path} stays mapped: arrays viewing its tensor data are "
                              "still alive (it is unmapped when the last one goes)",
                              ResourceWarning, stacklevel=3)
                return False
        return True

    def __repr__(self) -> str:
        return (f"GGUFFile({str(self.path)!r}, version={self.version}, "
                f"{len(self._metadata)} keys, {len(self.tensors)} tensors)")


# ---------------------------------------------------------------------- helpers
def _as_path(path: Any) -> Path:
    if not isinstance(path, (str, os.PathLike)):
        raise InvalidInputError("path_type", f"a model path must be a str or os.PathLike, "
                                f"got {type(path).__name__} {_short(path)}")
    return Path(path)


def _map_regular_file(path: Path) -> mmap.mmap:
    """Open read-only without blocking (a FIFO's open would wait for a writer), refuse
    anything but a regular file, and map it."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    except FileNotFoundError:
        raise ModelFileError(f"model file not found: {path}", check="not_found") from None
    except OSError as exc:
        raise ModelFileError(f"{path} cannot be opened: {exc.strerror or exc}",
                             check="unreadable") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = ("a directory" if stat.S_ISDIR(st.st_mode) else
                    "a FIFO" if stat.S_ISFIFO(st.st_mode) else
                    "a device" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) else
                    "a socket" if stat.S_ISSOCK(st.st_mode) else "not a regular file")
            raise ModelFileError(f"{path} is {kind}; a model must be a regular file",
                                 check="not_regular_file")
        if st.st_size < 24:  # magic, version, two counts
            raise ModelFileError(f"{path}: truncated: {st.st_size} bytes is shorter than a "
                                 "GGUF header (24 bytes)", check="truncated")
        try:
            return mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
        except (OSError, ValueError) as exc:
            raise ModelFileError(f"{path} cannot be memory-mapped: {exc}",
                                 check="unreadable") from None
    finally:
        os.close(fd)


def _value_type(raw: int, path: Path, key: str) -> VT:
    try:
        return VT(raw)
    except ValueError:
        raise ModelFileError(f"{path}: metadata {_short(key)} has unknown value type {raw}",
                             check="metadata_type") from None


def _type_words(accepted: set[VT] | frozenset[VT]) -> str:
    if accepted == INTEGER_TYPES:
        return "an integer type (UINT8 .. INT64)"
    if accepted == INTEGER_TYPES | FLOAT_TYPES:
        return "a number (an integer or float type)"
    return " or ".join(sorted(t.name for t in accepted))


def _decode(data: bytes, what: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ModelFileError(f"{what} is not valid UTF-8 ({exc.reason} at byte {exc.start})",
                             check="utf8") from None
