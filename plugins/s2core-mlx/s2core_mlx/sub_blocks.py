"""Q2_K, Q3_K and Q6_K in MLX's affine format, exactly, by splitting their sub-blocks.

These K-quants give every 16 values their own scale (and Q2_K its own min); MLX's groups are
32, 64 or 128 values with one scale and bias each, so no group can hold two sub-blocks. The
"split" layout gives each 16-value sub-block a group of its own: the sub-block's codes, then
16 zero codes, so a row of `in` weights becomes a row of 2 x in codes with one (scale, bias) per
32. A product multiplies activations laid out the same way: each run of 16 values followed by
16 zeros (`interleave_zeros`), so the padding meets only zeros, whatever its scale and bias.
The values are gguf's, bit for bit (mx.dequantize of the layout, padding dropped, equals
gguf.quants.dequantize), and one mx.quantized_matmul computes the product:

| GGUF | value                  | code u (bits) | scale          | bias                     |
|------|------------------------|---------------|----------------|--------------------------|
| Q6_K | d*sc * (q - 32)        | q (6)         | d*sc (float32) | -32 scale (rebuilt)      |
| Q3_K | d*(sc-32) * (q3 - 4h') | q3 + 4h (3)   | d*(sc-32)      | -4 scale (rebuilt)       |
| Q2_K | d*sc * q - dmin*m      | q (2)         | d*sc           | -dmin*m (float32, held)  |

(Q3_K: q3 the low two bits, h the mask bit, h' = 1 - h.) Scales are float32: d*sc (a float16
times up to 8 bits) is exact in float32, not in float16. Biases that are a power-of-two multiple
of the scale are rebuilt per product (exact), as for Q8_0 (gguf_quant.BIAS_FACTORS).

Held bits per weight (codes twice, plus 32 bits of scale per 16 weights, Q2_K 32 more of bias):
Q6_K 14 (2.13x its 6.56), Q3_K 8 (2.33x its 3.44), Q2_K 8 (3.05x its 2.63); against 16 for an
f16 copy (which MLX widens to float32 per product) and 32 for float32 (4.9x / 9.3x / 12.2x).
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as QT

from .gguf_quant import GROUP_SIZE, QK_K, AffineWeights, pack

SUB_BLOCK = 16
#: code bits of each split type, and the fixed bias / scale ratio where there is one
SPLIT_BITS: dict[QT, int] = {QT.Q6_K: 6, QT.Q3_K: 3, QT.Q2_K: 2}
BIAS_FACTORS: dict[QT, float] = {QT.Q6_K: -32.0, QT.Q3_K: -4.0}
#: held bytes per file byte (see the module docstring)
OVERHEAD: dict[QT, float] = {QT.Q6_K: 14 / 6.5625, QT.Q3_K: 8 / 3.4375, QT.Q2_K: 8 / 2.625}

_BLOCK_BYTES = {QT.Q6_K: 210, QT.Q3_K: 110, QT.Q2_K: 84}
_CHUNK_BLOCKS = 1 << 16


def is_split_type(qtype: QT) -> bool:
    return qtype in SPLIT_BITS


def _f16(b: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(b).view("<f2").astype(np.float32)  # (n, 1)


def _shift(values, shape) -> np.ndarray:
    return np.array(values, dtype=np.uint8).reshape(shape)


def _q6_k(b: np.ndarray):
    n = b.shape[0]
    ql, qh, sc, d = b[:, 0:128], b[:, 128:192], b[:, 192:208], _f16(b[:, 208:210])
    low = (ql.reshape(n, 2, 1, 64) >> _shift([0, 4], (1, 1, 2, 1))) & 0x0F
    high = (qh.reshape(n, 2, 1, 32) >> _shift([0, 2, 4, 6], (1, 1, 4, 1))) & 3
    u = low.reshape(n, QK_K) | (high.reshape(n, QK_K) << 4)
    scale = d * np.ascontiguousarray(sc).view(np.int8).astype(np.float32)
    return u, scale, scale * np.float32(-32)


def _q3_k(b: np.ndarray):
    n = b.shape[0]
    hmask, qs, sc, d = b[:, 0:32], b[:, 32:96], b[:, 96:108], _f16(b[:, 108:110])
    low = (sc[:, 0:8].reshape(n, 1, 8) >> _shift([0, 4], (1, 2, 1))).reshape(n, 16)
    high = (sc[:, 8:12].reshape(n, 1, 4) >> _shift([0, 2, 4, 6], (1, 4, 1))).reshape(n, 16)
    signed = ((low & 0x0F) | ((high & 3) << 4)).astype(np.int8) - np.int8(32)
    scale = d * signed.astype(np.float32)
    ql = (qs.reshape(n, 2, 1, 32) >> _shift([0, 2, 4, 6], (1, 1, 4, 1))) & 3
    h = (hmask.reshape(n, 1, 1, 32) >> _shift(range(8), (1, 1, 8, 1))) & 1
    u = ql.reshape(n, QK_K) + (h.reshape(n, QK_K) << 2)  # q = u - 4
    return u, scale, scale * np.float32(-4)


def _q2_k(b: np.ndarray):
    n = b.shape[0]
    sc, qs = b[:, 0:16], b[:, 16:80]
    d, dmin = _f16(b[:, 80:82]), _f16(b[:, 82:84])
    u = ((qs.reshape(n, 2, 1, 32) >> _shift([0, 2, 4, 6], (1, 1, 4, 1))) & 3).reshape(n, QK_K)
    return u, d * (sc & 0x0F).astype(np.float32), -(dmin * (sc >> 4).astype(np.float32))


_DECODERS = {QT.Q6_K: _q6_k, QT.Q3_K: _q3_k, QT.Q2_K: _q2_k}


def convert_split(blocks: np.ndarray, qtype: QT) -> AffineWeights:
    """A 2-D tensor's raw rows (rows, bytes per row) -> the split layout: packed codes
    (rows, 2 x cols x bits / 32), float32 scales and biases (rows, cols / 16)."""
    if qtype not in SPLIT_BITS:
        raise ValueError(f"GGUF type {qtype.name} has no 16-value sub-blocks to split")
    blocks = np.asarray(blocks, dtype=np.uint8)
    rows, row_bytes = blocks.shape
    nbytes, bits = _BLOCK_BYTES[qtype], SPLIT_BITS[qtype]
    if row_bytes % nbytes:
        raise ValueError(f"{qtype.name}: a row of {row_bytes} bytes is not whole blocks")
    per_row = row_bytes // nbytes
    cols = per_row * QK_K
    out = AffineWeights(packed=np.empty((rows, 2 * cols * bits // 32), np.uint32),
                        scales=np.empty((rows, cols // SUB_BLOCK), np.float32),
                        biases=np.empty((rows, cols // SUB_BLOCK), np.float32), bits=bits)
    step = max(1, _CHUNK_BLOCKS // per_row)
    for start in range(0, rows, step):
        chunk = blocks[start:start + step]
        n = chunk.shape[0]
        u, scale, bias = _DECODERS[qtype](chunk.reshape(-1, nbytes))
        # A group's 16 codes fill 2 x bits bytes of its bit stream, the 16 zero codes the
        # other 2 x bits: pack the codes alone and place them in zeroed groups.
        # (Packed 32 at a time: 16 codes of 3 bits are not whole uint32 words; each run of 8
        # codes fills exactly `bits` bytes, so the stream splits at every 16th code.)
        codes = pack(u.reshape(-1, GROUP_SIZE), bits).view(np.uint8).reshape(-1, 2 * bits)
        groups = out.packed[start:start + n].view(np.uint8).reshape(-1, 4 * bits)
        groups[:, :2 * bits] = codes
        groups[:, 2 * bits:] = 0
        out.scales[start:start + n] = scale.reshape(n, -1)
        out.biases[start:start + n] = bias.reshape(n, -1)
    return out


def unsplit(values: np.ndarray) -> np.ndarray:
    """Split-layout values (..., 2 x cols) -> the weights (..., cols): padding dropped."""
    lead = values.shape[:-1]
    return values.reshape(*lead, -1, GROUP_SIZE)[..., :SUB_BLOCK].reshape(*lead, -1)
