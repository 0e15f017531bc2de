"""GGUF quantized blocks -> MLX's affine quantized format, by bit manipulation (NumPy only).

MLX's affine format stores, per group of `group_size` consecutive values of a row, one scale s
and one bias b, and each value as an unsigned b-bit integer q: w = s * q + b. The q of a row
are one little-endian bit stream packed into uint32 words (value i at bits [i*bits, (i+1)*bits)).

Every GGUF type below is "some scale times an integer plus an offset" over groups of 32, so it
maps onto that format exactly, with group_size 32:

| GGUF  | GGUF value         | MLX q     | scale    | bias       | bits |
|-------|--------------------|-----------|----------|------------|------|
| Q8_0  | d * q (q int8)     | q + 128   | d        | -128 d     | 8    |
| Q4_0  | d * (q - 8)        | q         | d        | -8 d       | 4    |
| Q4_1  | d * q + m          | q         | d        | m          | 4    |
| Q5_0  | d * (q - 16)       | q         | d        | -16 d      | 5    |
| Q5_1  | d * q + m          | q         | d        | m          | 5    |
| Q4_K  | d*sc * q - dmin*mn | q         | d*sc     | -dmin*mn   | 4    |
| Q5_K  | d*sc * q - dmin*mn | q         | d*sc     | -dmin*mn   | 5    |

`convert` gives float32 scales and biases: d and m are float16, so every product above (a
float16 times an integer of at most 8 bits) is exact in float32, and s * q + b rounds once,
exactly as gguf's own dequantization. For Q8_0, Q4_0, Q4_1, Q5_0 and Q5_1 the scale and bias are
the file's float16 d (and m) times a power of two, so they are also exact in float16 unless a
product overflows float16 (|d| > 511.75 for -128 d): `narrowed` returns a tensor's float16 form
when every value of it survives the round trip. For Q8_0, Q4_0 and Q5_0 the bias is a fixed
multiple of the scale (`bias_factor`), so a backend can hold the float16 scales alone and
rebuild the biases per product: exactly the file's 8.5 / 4.5 / 5.5 bits per weight, against
10 / 6 / 7 with float32 scales and biases. The K-quants' d*sc (a float16 times a 6-bit
integer, up to 17 significant bits) is not exact in float16: they stay float32.

Q2_K, Q3_K and Q6_K have 16-value sub-blocks with their own scales; MLX supports group sizes
32, 64 and 128 only, so those types do not map and are dequantized on load instead.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

import numpy as np
from gguf import GGMLQuantizationType as QT

GROUP_SIZE = 32
QK_K = 256  # values per K-quant super-block

#: GGUF types converted exactly, with the bit width each gets in MLX's affine format
MLX_BITS: dict[QT, int] = {
    QT.Q8_0: 8, QT.Q4_0: 4, QT.Q4_1: 4, QT.Q5_0: 5, QT.Q5_1: 5, QT.Q4_K: 4, QT.Q5_K: 5,
}

#: values decoded per conversion chunk: bounds the temporaries for huge tables (155776 x 2560)
_CHUNK_VALUES = 1 << 24


@dataclass(frozen=True)
class AffineWeights:
    """One matrix in MLX's affine quantized format, as host arrays ready for mx.array()."""

    packed: np.ndarray  # uint32 (rows, cols * bits / 32)
    scales: np.ndarray  # float32, or float16 where exact (rows, cols / group_size)
    biases: np.ndarray  # same type and shape as scales
    bits: int
    group_size: int = GROUP_SIZE

    @property
    def shape(self) -> tuple[int, int]:
        return self.packed.shape[0], self.packed.shape[1] * 32 // self.bits

    def dequantize(self) -> np.ndarray:
        """w = scale * q + bias in float32 (NumPy), for checks on machines without MLX."""
        q = unpack(self.packed, self.bits)
        rows, cols = q.shape
        groups = q.reshape(rows, cols // self.group_size, self.group_size).astype(np.float32)
        scales, biases = (a.astype(np.float32)[..., None] for a in (self.scales, self.biases))
        return (groups * scales + biases).reshape(rows, cols)


#: types whose scales and biases are exact in float16 (unless a product overflows it)
F16_EXACT_TYPES: frozenset[QT] = frozenset({QT.Q8_0, QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1})


#: types whose bias is a fixed multiple of the scale (bias = factor * d): it need not be stored
BIAS_FACTORS: dict[QT, float] = {QT.Q8_0: -128.0, QT.Q4_0: -8.0, QT.Q5_0: -16.0}


def is_convertible(qtype: QT) -> bool:
    return qtype in MLX_BITS


def narrowed(a: AffineWeights) -> AffineWeights | None:
    """`a` with float16 scales and biases if every one of them is exactly a float16 value
    (checked, not assumed: an overflowing -128 d or a non-finite d keeps float32), else None."""
    with np.errstate(over="ignore"):  # an overflow becomes inf, which the check refuses
        scales, biases = a.scales.astype(np.float16), a.biases.astype(np.float16)
    if not (np.array_equal(scales.astype(np.float32), a.scales)
            and np.array_equal(biases.astype(np.float32), a.biases)):
        return None
    return dataclasses.replace(a, scales=scales, biases=biases)


def bias_factor(a: AffineWeights, qtype: QT) -> float | None:
    """k when every bias of `a` is exactly k times its scale (Q8_0, Q4_0, Q5_0: -128, -8, -16),
    so the biases can be rebuilt from the scales instead of being held; else None."""
    k = BIAS_FACTORS.get(qtype)
    if k is None:
        return None
    rebuilt = a.scales.astype(np.float32) * np.float32(k)
    return k if np.array_equal(rebuilt, a.biases.astype(np.float32)) else None


def convert(blocks: np.ndarray, qtype: QT) -> AffineWeights:
    """A 2-D GGUF tensor's raw blocks (rows, bytes per row), as ModelFile.raw() gives them,
    in MLX's affine format."""
    if qtype not in MLX_BITS:
        raise ValueError(f"GGUF type {qtype.name} does not map onto MLX's affine format")
    decode, block_values, block_bytes = _DECODERS[qtype]
    blocks = np.asarray(blocks, dtype=np.uint8)
    rows, row_bytes = blocks.shape
    if row_bytes % block_bytes:
        raise ValueError(f"{qtype.name}: a row of {row_bytes} bytes is not whole blocks")
    cols = row_bytes // block_bytes * block_values
    bits = MLX_BITS[qtype]
    out = AffineWeights(
        packed=np.empty((rows, cols * bits // 32), np.uint32),
        scales=np.empty((rows, cols // GROUP_SIZE), np.float32),
        biases=np.empty((rows, cols // GROUP_SIZE), np.float32), bits=bits)
    step = max(1, _CHUNK_VALUES // cols)
    for start in range(0, rows, step):
        chunk = blocks[start:start + step]
        n = chunk.shape[0]
        q, scale, bias = decode(chunk.reshape(-1, block_bytes))
        out.packed[start:start + n] = pack(q.reshape(n, cols), bits)
        out.scales[start:start + n] = scale.reshape(n, -1)
        out.biases[start:start + n] = bias.reshape(n, -1)
    return out


# ---------------------------------------------------------------------- bit packing
def pack(q: np.ndarray, bits: int) -> np.ndarray:
    """Unsigned values (rows, cols) < 2**bits -> uint32 words (rows, cols * bits / 32), each row
    one little-endian bit stream. Eight values fill exactly `bits` bytes, so each run of eight
    is assembled in a uint64 and its low `bits` bytes are kept."""
    rows, cols = q.shape
    eights = q.reshape(rows, cols // 8, 8).astype("<u8")
    word = np.bitwise_or.reduce(eights << (np.arange(8, dtype="<u8") * bits), axis=-1)
    stream = word[..., None].view(np.uint8)[..., :bits]  # (rows, cols/8, bits) bytes
    return np.ascontiguousarray(stream).reshape(rows, -1).view("<u4")


def unpack(packed: np.ndarray, bits: int) -> np.ndarray:
    """The inverse of pack(): uint8 values (rows, cols)."""
    rows = packed.shape[0]
    stream = np.ascontiguousarray(packed).view(np.uint8).reshape(rows, -1, bits)
    word = np.zeros(stream.shape[:2] + (8,), np.uint8)
    word[..., :bits] = stream
    word = word.view("<u8")  # (rows, cols/8, 1)
    values = (word >> (np.arange(8, dtype="<u8") * bits)) & np.uint64((1 << bits) - 1)
    return values.astype(np.uint8).reshape(rows, -1)


# ---------------------------------------------------------------------- block decoders
# Each takes (n_blocks, block bytes) uint8 and returns q (n_blocks, values) uint8 and
# scale, bias (n_blocks, values / 32) float32.
Decoder = Callable[[np.ndarray], tuple[np.ndarray, np.ndarray, np.ndarray]]


def _f16(b: np.ndarray) -> np.ndarray:
    """Two bytes per block -> (n_blocks, 1) float32."""
    return np.ascontiguousarray(b).view("<f2").astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """16 bytes -> 32 values: the low nibbles are values 0..15, the high ones 16..31."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def _high_bits(qh: np.ndarray) -> np.ndarray:
    """4 bytes (a little-endian uint32) -> bit j of it for j in 0..31, as 0/1 uint8."""
    return np.unpackbits(qh, axis=-1, bitorder="little")


def _q8_0(b: np.ndarray):
    d = _f16(b[:, 0:2])
    q = b[:, 2:34] ^ np.uint8(0x80)  # int8 q as two's complement -> q + 128
    return q, d, d * np.float32(-128)


def _q4_0(b: np.ndarray):
    d = _f16(b[:, 0:2])
    return _nibbles(b[:, 2:18]), d, d * np.float32(-8)


def _q4_1(b: np.ndarray):
    return _nibbles(b[:, 4:20]), _f16(b[:, 0:2]), _f16(b[:, 2:4])


def _q5_0(b: np.ndarray):
    d = _f16(b[:, 0:2])
    q = _nibbles(b[:, 6:22]) | (_high_bits(b[:, 2:6]) << 4)
    return q, d, d * np.float32(-16)


def _q5_1(b: np.ndarray):
    q = _nibbles(b[:, 8:24]) | (_high_bits(b[:, 4:8]) << 4)
    return q, _f16(b[:, 0:2]), _f16(b[:, 2:4])


def k_scale_min(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The eight 6-bit (scale, min) pairs of a Q4_K/Q5_K super-block from its 12 bytes
    (ggml's get_scale_min_k4): pairs 0..3 in the low 6 bits of bytes 0..3 / 4..7, pairs 4..7
    from the nibbles of bytes 8..11 with their top two bits in bytes 0..3 / 4..7."""
    lo, hi, mixed = scales[:, 0:4], scales[:, 4:8], scales[:, 8:12]
    sc = np.concatenate([lo & 0x3F, (mixed & 0x0F) | ((lo >> 6) << 4)], axis=-1)
    mn = np.concatenate([hi & 0x3F, (mixed >> 4) | ((hi >> 6) << 4)], axis=-1)
    return sc, mn


def _k_affine(b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """scale = d * sc and bias = -dmin * mn per 32-value sub-block (exact in float32)."""
    d, dmin = _f16(b[:, 0:2]), _f16(b[:, 2:4])
    sc, mn = k_scale_min(b[:, 4:16])
    return d * sc.astype(np.float32), -(dmin * mn.astype(np.float32))


def _k_low_nibbles(qs: np.ndarray) -> np.ndarray:
    """128 bytes -> 256 values: sub-blocks 2i and 2i+1 are the low and high nibbles of
    bytes 32i..32i+31."""
    pairs = qs.reshape(-1, 4, 1, 32)
    return np.concatenate([pairs & 0x0F, pairs >> 4], axis=2).reshape(-1, QK_K)


def _q4_k(b: np.ndarray):
    scale, bias = _k_affine(b)
    return _k_low_nibbles(b[:, 16:144]), scale, bias


def _q5_k(b: np.ndarray):
    scale, bias = _k_affine(b)
    qh = b[:, 16:48]  # bit s of byte l: high bit of value l of sub-block s
    high = (qh[:, None, :] >> np.arange(8, dtype=np.uint8)[None, :, None]) & 1
    q = _k_low_nibbles(b[:, 48:176]) | (high.reshape(-1, QK_K) << 4)
    return q, scale, bias


#: type -> (decoder, values per block, bytes per block)
_DECODERS: dict[QT, tuple[Decoder, int, int]] = {
    QT.Q8_0: (_q8_0, 32, 34), QT.Q4_0: (_q4_0, 32, 18), QT.Q4_1: (_q4_1, 32, 20),
    QT.Q5_0: (_q5_0, 32, 22), QT.Q5_1: (_q5_1, 32, 24),
    QT.Q4_K: (_q4_k, QK_K, 144), QT.Q5_K: (_q5_k, QK_K, 176),
}
assert set(_DECODERS) == set(MLX_BITS)
