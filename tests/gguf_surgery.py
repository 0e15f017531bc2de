"""Take a valid GGUF file apart and put it back together with one thing broken.

Written independently of s2core's reader (it trusts the valid file it starts from), so the
hostile-file tests do not check the reader against itself. `parse` splits a file into its
metadata entries, tensor infos and data section; `Parts.build` writes them back (recomputing
the padding before the data section), optionally with forged counts, and records where each
section starts so the tests can cut the file at every boundary.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass, field, replace

from gguf import GGUFValueType as VT

_FORMATS = {VT.UINT8: "<B", VT.INT8: "<b", VT.UINT16: "<H", VT.INT16: "<h", VT.UINT32: "<I",
            VT.INT32: "<i", VT.UINT64: "<Q", VT.INT64: "<q", VT.FLOAT32: "<f",
            VT.FLOAT64: "<d", VT.BOOL: "<B"}


@dataclass
class TensorEntry:
    name: bytes
    dims: list[int]   # GGUF ne order
    type: int
    offset: int       # relative to the data section

    def encode(self) -> bytes:
        return (struct.pack("<Q", len(self.name)) + self.name + struct.pack("<I", len(self.dims))
                + b"".join(struct.pack("<Q", d) for d in self.dims)
                + struct.pack("<IQ", self.type, self.offset))


@dataclass
class Parts:
    version: int
    kvs: list[tuple[str, bytes]]      # key, the whole encoded entry (key, type, value)
    tensors: list[TensorEntry]
    data: bytes                       # the data section
    alignment: int = 32
    boundaries: dict[str, int] = field(default_factory=dict)

    def build(self, n_tensors: int | None = None, n_kv: int | None = None,
              magic: bytes = b"GGUF") -> bytes:
        """The file's bytes; `boundaries` is filled with each section's start offset."""
        b = {"magic": 0, "version": 4, "counts": 8}
        out = bytearray(magic + struct.pack("<I", self.version))
        out += struct.pack("<QQ", len(self.tensors) if n_tensors is None else n_tensors,
                           len(self.kvs) if n_kv is None else n_kv)
        for key, entry in self.kvs:
            b[f"kv {key}"] = len(out)
            b[f"kv {key} value"] = len(out) + 8 + len(key.encode()) + 4
            out += entry
        for t in self.tensors:
            b[f"tensor info {t.name.decode(errors='replace')}"] = len(out)
            out += t.encode()
        b["padding"] = len(out)
        out += bytes(-len(out) % self.alignment)
        b["data"] = len(out)
        for t in sorted(self.tensors, key=lambda t: t.offset):
            b[f"data of {t.name.decode(errors='replace')}"] = len(out) + t.offset
        out += self.data
        self.boundaries = b
        return bytes(out)

    def copy(self) -> "Parts":
        return replace(self, kvs=list(self.kvs), tensors=[replace(t, dims=list(t.dims))
                                                          for t in self.tensors])

    def set_kv(self, key: str, entry: bytes) -> "Parts":
        """A copy with `key`'s entry replaced (or appended)."""
        p = self.copy()
        p.kvs = [(k, entry if k == key else e) for k, e in p.kvs]
        if key not in dict(p.kvs):
            p.kvs.append((key, entry))
        return p

    def tensor(self, name: str) -> TensorEntry:
        return next(t for t in self.tensors if t.name == name.encode())

    def data_end(self) -> int:
        """Where the last tensor's bytes end, relative to the data section."""
        return max(t.offset + nbytes(t) for t in self.tensors)


def nbytes(t: TensorEntry) -> int:
    import gguf
    block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(t.type)]
    return math.prod(t.dims) // block * size


def encode_string(s: str | bytes) -> bytes:
    raw = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(raw)) + raw


def encode_kv(key: str | bytes, vtype: VT, value, element_type: VT | None = None) -> bytes:
    """One metadata entry. Arrays take a list of values of `element_type`."""
    out = encode_string(key) + struct.pack("<I", vtype)
    return out + _encode_value(vtype, value, element_type)


def _encode_value(vtype: VT, value, element_type: VT | None) -> bytes:
    if vtype == VT.STRING:
        return encode_string(value)
    if vtype == VT.ARRAY:
        return (struct.pack("<IQ", element_type, len(value))
                + b"".join(_encode_value(element_type, v, None) for v in value))
    return struct.pack(_FORMATS[vtype], value)


def parse(data: bytes) -> Parts:
    """Split a valid GGUF file into its parts."""
    pos = 0

    def take(fmt: str):
        nonlocal pos
        (v,) = struct.unpack_from(fmt, data, pos)
        pos += struct.calcsize(fmt)
        return v

    def skip_value(vtype: int) -> None:
        nonlocal pos
        if vtype == VT.STRING:
            length = take("<Q")  # not `pos += take(...)`: that would add to the old pos
            pos += length
        elif vtype == VT.ARRAY:
            elem, count = take("<I"), take("<Q")
            for _ in range(count):
                skip_value(elem)
        else:
            pos += struct.calcsize(_FORMATS[VT(vtype)])

    assert data[:4] == b"GGUF"
    pos = 4
    version = take("<I")
    n_tensors, n_kv = take("<Q"), take("<Q")
    kvs, alignment = [], 32
    for _ in range(n_kv):
        start = pos
        key = data[pos + 8:pos + 8 + take("<Q")].decode()
        pos += len(key.encode())
        vtype = take("<I")
        if key == "general.alignment":
            alignment = struct.unpack_from("<I", data, pos)[0]
        skip_value(vtype)
        kvs.append((key, data[start:pos]))
    tensors = []
    for _ in range(n_tensors):
        name = data[pos + 8:pos + 8 + take("<Q")]
        pos += len(name)
        dims = [take("<Q") for _ in range(take("<I"))]
        tensors.append(TensorEntry(name, dims, take("<I"), take("<Q")))
    pos += -pos % alignment
    return Parts(version, kvs, tensors, data[pos:], alignment)
