"""arithmetic="ggml" in integers: Q8_0, Q4_K and Q6_K weights times 8-bit activations, as
s2.cpp's ggml computes them, with the CPU's integer dot instructions (simd.py).

Per product: the activation rows are quantized as ggml does (act_quant_kernels.py: Q8_0's
codes and float16 d per 32 inputs, Q8_K's codes, d and sums per 16 of 256); each block's
integer dot is one instruction per 4 inputs of 16 output rows (simd.py); then, per block and
output row, ggml's float step:
- Q8_0: sum += (d_w * d_x) * float(isum);
- Q4_K: sum += (d_w * d_x) * float(sum_s sc_s * isum_s) - (dmin_w * d_x) * float(sum_s m_s *
  sum_x(sub-block s));
- Q6_K: sum += (d_w * d_x) * float(sum_s sc_s * (isum_s - 32 * sum_x(sub-block s))).
The integer parts are exact, as in ggml, so the numbers are ggml's up to the order of the float
sums over blocks (ggml's order depends on its SIMD width; ~1e-7 relative).

Layout (`_pack`): tiles of 16 output rows; per tile and per 256 inputs a "tile-block" holding
the 16 rows' header (their float16 d's side by side, scale bytes transposed so that one byte
position of the 16 rows is contiguous: the unpacking vectorizes over the rows), then their
codes as simd.py's 64-byte groups, in the order simd.py's kernels read them (simd.py lists
each type's layout). The bytes are the file's, rearranged: the matrix holds what the file
holds. `decode` reads them back as gguf dequantizes them, for row lookups.

Every product, one row or a prefill's hundreds, takes these kernels (simd.products; on CPUs
with AMX, from amx.MIN_ROWS rows, amx.products, the same bits), a tile's rows in chunks while
the tile sits in L2: a row's numbers never depend on the rows beside it (a
batched step's sequences get their numbers alone, bit for bit), and they beat decoding to
float32 for sgemm (9728 x 2560 Q4_K, 256 rows: 73 against 183 ms, 2 loaded cores).
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as QT
from numba import njit, prange

from . import kernel_cache  # noqa: F401  (first: numba's cache follows every source here)
from . import act_quant, amx
from .act_quant_kernels import integer_codes
from .f16 import _widen
from .simd import (Q4_K_HEADER, Q4_K_KIND, Q6_K_HEADER, Q8_0_HEADER, Q8_0_KIND, ROWS,
                   LONE_BLOCK, SIGNED_FLIP, isa, products, q6_k_group)

#: per type: (file bytes per 256 inputs of a row, header bytes of a tile-block)
_GEOMETRY = {QT.Q8_0: (8 * 34, Q8_0_HEADER), QT.Q4_K: (144, Q4_K_HEADER),
             QT.Q6_K: (210, Q6_K_HEADER)}
TYPES = frozenset(_GEOMETRY)
_Q8_0, _Q4_K = Q8_0_KIND, Q4_K_KIND



def supported(qtype: QT, shape: tuple[int, int]) -> bool:
    """Whether this CPU and this matrix take the integer kernels."""
    return bool(isa()) and qtype in TYPES and shape[1] % 256 == 0


# ------------------------------------------------------------------------------- packing
@njit(inline="always")
def _put_group(dst, at, src, row, start, flip=0):
    """4 bytes of one row into a 64-byte group, xor `flip`."""
    for i in range(4):
        dst[at + 4 * row + i] = src[start + i] ^ flip


@njit(parallel=True, cache=True)
def _pack(kind, raw, packed, header_bytes, flip):
    """raw (O, bytes per row) the file's blocks -> packed (tiles, superblocks, tile-block
    bytes); rows past O (the last tile's padding) are zero. Q8_0's signed codes are stored
    xor `flip` (simd.SIGNED_FLIP)."""
    n_rows = raw.shape[0]
    n_tiles, n_super = packed.shape[:2]
    for t in prange(n_tiles):
        for sb in range(n_super):
            out = packed[t, sb]
            out[:] = 0
            for j in range(min(ROWS, n_rows - t * ROWS)):
                row = raw[t * ROWS + j]
                if kind == _Q8_0:
                    for blk in range(8):
                        src = (sb * 8 + blk) * 34
                        out[32 * blk + 2 * j] = row[src]
                        out[32 * blk + 2 * j + 1] = row[src + 1]
                        for g in range(8):
                            _put_group(out, header_bytes + (blk * 8 + g) * 64, row,
                                       j, src + 2 + 4 * g, flip)
                elif kind == _Q4_K:
                    src = sb * 144  # d(2) dmin(2) scales(12) qs(128)
                    for k in range(4):  # d, dmin
                        out[32 * (k // 2) + 2 * j + k % 2] = row[src + k]
                    for k in range(12):
                        out[64 + 16 * k + j] = row[src + 4 + k]
                    for c in range(4):
                        for g in range(8):
                            _put_group(out, header_bytes + (c * 8 + g) * 64, row, j,
                                       src + 16 + 32 * c + 4 * g)
                else:  # Q6_K: ql(128) qh(64) scales(16) d(2)
                    src = sb * 210
                    for k in range(16):
                        out[16 * k + j] = row[src + 192 + k]
                    out[256 + 2 * j] = row[src + 208]
                    out[256 + 2 * j + 1] = row[src + 209]
                    for n in range(2):
                        for g in range(8):
                            for run, start in enumerate((64 * n, 64 * n + 32, 128 + 32 * n)):
                                _put_group(out, header_bytes + q6_k_group(n, run, g) * 64,
                                           row, j, src + start + 4 * g)


# --------------------------------------------------------------------- header values
@njit(inline="always")
def _half_at(h, at, j):
    """The float16 of row j in the header's run of 16 float16 at byte `at`."""
    return _widen(np.uint16(h[at + 2 * j]) | (np.uint16(h[at + 2 * j + 1]) << np.uint16(8)))


@njit(inline="always")
def _q4_k_scale_min(h, s, j):
    """Q4_K's 6-bit scale and min of sub-block s, row j (get_scale_min_k4)."""
    q = 64 + j  # scale byte k of row j at 64 + 16k + j
    if s < 4:
        return h[q + 16 * s] & 63, h[q + 16 * (s + 4)] & 63
    sc = (h[q + 16 * (s + 4)] & 15) | ((h[q + 16 * (s - 4)] >> 6) << 4)
    mn = (h[q + 16 * (s + 4)] >> 4) | ((h[q + 16 * s] >> 6) << 4)
    return sc, mn


# ------------------------------------------------------------------------ decoding
@njit(nogil=True, cache=True)
def decode(kind, packed, header_bytes, flip, ids, w):
    """Rows `ids` as float32 (n, in) as gguf dequantizes them: w[r, i] = weight (ids[r], i).
    Only the asked row's bytes of its tile are read."""
    n_super = packed.shape[1]
    for r in range(ids.shape[0]):
        t, j = ids[r] // ROWS, ids[r] % ROWS
        for sb in range(n_super):
            h = packed[t, sb]
            c = header_bytes
            i0 = sb * 256
            if kind == _Q8_0:
                for blk in range(8):
                    d = _half_at(h, 32 * blk, j)
                    for g in range(8):
                        for i in range(4):
                            q = np.int8(h[c + (blk * 8 + g) * 64 + 4 * j + i] ^ flip)
                            w[r, i0 + blk * 32 + 4 * g + i] = d * np.float32(q)
            elif kind == _Q4_K:
                d, dmin = _half_at(h, 0, j), _half_at(h, 32, j)
                for s in range(8):
                    a, m = _q4_k_scale_min(h, s, j)
                    scale, low = d * np.float32(a), dmin * np.float32(m)
                    chunk, upper = s // 2, s % 2
                    for g in range(8):
                        for i in range(4):
                            byte = np.int32(h[c + (chunk * 8 + g) * 64 + 4 * j + i])
                            q = (byte >> 4) if upper else (byte & 15)
                            w[r, i0 + 32 * s + 4 * g + i] = scale * np.float32(q) - low
            else:
                d = _half_at(h, 256, j)
                for n in range(2):
                    for g in range(8):
                        for i in range(4):
                            at = c + 4 * j + i
                            ql0 = np.int32(h[at + q6_k_group(n, 0, g) * 64])
                            ql1 = np.int32(h[at + q6_k_group(n, 1, g) * 64])
                            qh = np.int32(h[at + q6_k_group(n, 2, g) * 64])
                            v = 128 * n + 4 * g + i
                            for k in range(4):
                                low = ql0 if k % 2 == 0 else ql1
                                nibble = (low & 15) if k < 2 else (low >> 4)
                                q = (nibble | (((qh >> (2 * k)) & 3) << 4)) - 32
                                sub = (v + 32 * k) // 16
                                scale = d * np.float32(np.int8(h[16 * sub + j]))
                                w[r, i0 + v + 32 * k] = scale * np.float32(q)


# ---------------------------------------------------------------------- the matrix
@njit(cache=True)
def _quantized_products(kind, packed, x, out, lone_block):
    """out = x's rows rounded to the weight's dot type (act_quant.quantize) times the packed
    matrix (products), in one call from Python: a step's Python calls between its products
    each find the caches full of the weights just streamed (act_quant_kernels.integer_codes),
    and this takes four of them away per product."""
    xq, xd, xs = integer_codes(x, kind == Q8_0_KIND)
    products(kind, packed, xq, xd, xs, out, lone_block)


class IntDotMatrix:
    """A Q8_0, Q4_K or Q6_K [out, in] matrix multiplied as s2.cpp multiplies it (arithmetic
    "ggml"): `m(x)` is x @ W^T with x's rows quantized to the weight's dot type."""

    def __init__(self, packed: np.ndarray, qtype: QT, n_out: int, n_in: int):
        self.codes = packed
        self.qtype = qtype
        self.kind = int(qtype)
        self.n_out, self.n_in = n_out, n_in
        self.header_bytes = _GEOMETRY[qtype][1]
        self.flip = SIGNED_FLIP[isa()] if qtype == QT.Q8_0 else 0
        self.dot_type = act_quant.DOT_TYPE[qtype]

    @classmethod
    def from_raw(cls, raw: np.ndarray, qtype: QT) -> "IntDotMatrix":
        raw = np.ascontiguousarray(raw, dtype=np.uint8)
        per_super, header = _GEOMETRY[qtype]
        n_out, n_super = raw.shape[0], raw.shape[1] // per_super
        packed = np.empty((-(-n_out // ROWS), n_super, per_super * ROWS), np.uint8)
        _pack(int(qtype), raw, packed, header, SIGNED_FLIP[isa()] if qtype == QT.Q8_0 else 0)
        return cls(packed, qtype, n_out, n_super * 256)

    @property
    def shape(self) -> tuple[int, int]:
        return self.n_out, self.n_in

    @property
    def nbytes(self) -> int:
        return self.codes.nbytes

    def __call__(self, x: np.ndarray) -> np.ndarray:
        x = np.ascontiguousarray(x, dtype=np.float32)
        out = np.empty((x.shape[0], self.codes.shape[0] * ROWS), np.float32)
        if x.shape[0] >= amx.MIN_ROWS.get(self.kind, 1 << 62) and amx.available():
            # the same bits, faster here
            amx.products(self.kind, self.codes, *act_quant.quantize(self.dot_type, x), out)
        else:
            _quantized_products(self.kind, self.codes, x, out, LONE_BLOCK[self.kind])
        return out[:, :self.n_out]

    def row_window(self, start: int, stop: int, n: int) -> tuple["IntDotMatrix", int]:
        """weights.row_window: the whole tiles of ROWS rows holding [start, stop), a view."""
        t0, t1 = start // ROWS, -(-stop // ROWS)
        n_out = min(self.n_out, t1 * ROWS) - t0 * ROWS
        return IntDotMatrix(self.codes[t0:t1], self.qtype, n_out, self.n_in), start - t0 * ROWS

    def rows(self, ids: np.ndarray) -> np.ndarray:
        """Rows `ids` as float32 (n, in), decoded as gguf dequantizes them."""
        ids = np.ascontiguousarray(ids, dtype=np.int64).reshape(-1)
        out = np.empty((ids.shape[0], self.n_in), np.float32)
        decode(self.kind, self.codes, self.header_bytes, self.flip, ids, out)
        return out

    def dequantize(self) -> np.ndarray:
        return self.rows(np.arange(self.n_out))
