"""numba kernels for GGUF's block-quantized types, computed from the blocks as stored.

The data: the file's blocks, transposed into tiles (quants.py): codes[t, b, k, j] is byte k
of block b of output row t*TILE + j; the kernels see it as rows of TILE bytes,
c[r0 + k, j] with r0 = (t * n_blocks + b) * block bytes. So a kernel reads, for one block and
one byte offset, TILE consecutive bytes (one per output row) and its innermost loops run over
the TILE outputs of a tile, as the Q8_0 and F16 kernels' do (tiled.py): pure vector work, no
horizontal sums.

Decoding follows gguf.quants' dequantize_blocks step by step in float32: a sub-block's scale is
formed as gguf forms it (e.g. Q4_K's d * sc and dmin * m) and the weight as scale * q - min,
so `_decode_block` gives gguf's float32 weights bit for bit. Products either decode a block into
a small buffer and multiply from it (every type), or, for the K-quants most files are made of
(Q2_K..Q6_K), sum q * x per sub-block first and scale once (the same numbers up to float32
summation order, as ggml computes them, without quantizing the activations).

float16 fields (d, dmin, m) are widened exactly by moving their bits (f16.py's method: numba
has no float16); it is exact for finite values only, and tensors with an infinite or NaN scale
never reach these kernels (quants.py widens them).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from . import kernel_cache  # noqa: F401  (first: numba's cache follows every source here)
from .f16 import _UNSCALE, _bits
from .prefetch import AHEAD, prefetch_rows
from .stack import stack_array, stack_tile
from .tiled import TILE

# GGML's type numbers (gguf.GGMLQuantizationType), the kernels' `kind` argument
Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K = 2, 3, 6, 7, 10, 11, 12, 13, 14


@njit(inline="always")
def _fused(kind):
    """The K-quants: computed from int8 codes and per-sub-block scales (FUSED)."""
    return kind == Q2_K or kind == Q3_K or kind == Q4_K or kind == Q5_K or kind == Q6_K


@njit(inline="always")
def _sub_block(kind, v):
    """The sub-block of value v: 16 values each (Q2_K, Q3_K, Q6_K) or 32 (Q4_K, Q5_K)."""
    return v // 32 if kind == Q4_K or kind == Q5_K else v // 16


@njit(inline="always")
def _q3_k_scale(c, r0, s, j):
    """Q3_K: the signed 6-bit scale of sub-block s (0..15), packed in bytes 96..107."""
    low = (c[r0 + 96 + s % 8, j] >> (4 * (s // 8))) & 15
    high = (c[r0 + 104 + s % 4, j] >> (2 * (s // 4))) & 3
    return np.int32(low | (high << 4)) - 32


@njit(inline="always")
def _half(c, r0, k, bits, out):
    """The float16 field at bytes k, k+1 of the block at row r0, for every row of the tile,
    widened exactly as f16.py does (bit moves and one multiply: vectorizes, no table).
    bits: uint32 (TILE,) scratch."""
    for j in range(TILE):
        bits[j] = _bits(np.uint32(c[r0 + k, j]) | (np.uint32(c[r0 + k + 1, j]) << np.uint32(8)))
    widened = bits.view(np.float32)
    for j in range(TILE):
        out[j] = widened[j] * _UNSCALE


@njit(inline="always")
def _u(q):
    """A small non-negative integer as float32. Through uint8, so that LLVM keeps the bit
    arithmetic in narrow lanes (numba widens integer arithmetic to 64 bits) and vectorizes it."""
    return np.float32(np.uint8(q))


@njit(inline="always")
def _scales(kind, c, r0, bits, sc, mn):
    """The block's sub-block scales and mins as gguf forms them, sc[s, j] and mn[s, j], so
    that each weight is sc * float32(q) - mn (a min that gguf adds is stored negated: x + m and
    x - (-m) are the same float32 sum). Rows 16 and 17 of sc hold d and dmin. Loops run over
    j innermost: they vectorize."""
    d, dmin = sc[16], sc[17]
    if kind == Q4_0 or kind == Q5_0:
        _half(c, r0, 0, bits, sc[0])
        mn[0, :] = 0.0
    elif kind == Q4_1 or kind == Q5_1:
        _half(c, r0, 0, bits, sc[0])
        _half(c, r0, 2, bits, dmin)
        for j in range(TILE):
            mn[0, j] = -dmin[j]
    elif kind == Q2_K:
        _half(c, r0, 80, bits, d)
        _half(c, r0, 82, bits, dmin)
        for s in range(16):
            for j in range(TILE):
                sc[s, j] = d[j] * _u(c[r0 + s, j] & 15)
                mn[s, j] = dmin[j] * _u(c[r0 + s, j] >> 4)
    elif kind == Q3_K:
        _half(c, r0, 108, bits, d)
        for s in range(16):
            for j in range(TILE):
                sc[s, j] = d[j] * np.float32(_q3_k_scale(c, r0, s, j))
                mn[s, j] = 0.0
    elif kind == Q4_K or kind == Q5_K:
        _half(c, r0, 0, bits, d)
        _half(c, r0, 2, bits, dmin)
        for s in range(4):  # the 6-bit scales and mins packed in bytes 4..15 (gguf's layout)
            for j in range(TILE):
                a, m, low = c[r0 + 4 + s, j], c[r0 + 8 + s, j], c[r0 + 12 + s, j]
                sc[s, j] = d[j] * _u(a & 63)
                mn[s, j] = dmin[j] * _u(m & 63)
                sc[s + 4, j] = d[j] * _u((low & 15) | ((a >> 6) << 4))
                mn[s + 4, j] = dmin[j] * _u((low >> 4) | ((m >> 6) << 4))
    elif kind == Q6_K:
        _half(c, r0, 208, bits, d)
        for s in range(16):
            for j in range(TILE):
                sc[s, j] = d[j] * np.float32(np.int8(c[r0 + 192 + s, j]))
                mn[s, j] = 0.0


@njit(inline="always")
def _decode_block(kind, c, r0, w, bits, sc, mn):
    """Block b of tile t as float32 w[v, j] (v: the block's values, j: the tile's rows),
    exactly gguf's dequantization. sc (18, TILE), mn (16, TILE): float32 scratch. An offset
    that gguf subtracts from the integer (Q4_0's 8) is subtracted in float32: exact for these
    small integers."""
    _scales(kind, c, r0, bits, sc, mn)
    if kind == Q4_0 or kind == Q4_1:
        off = 2 if kind == Q4_0 else 4
        shift = np.float32(8 if kind == Q4_0 else 0)
        for l in range(16):
            for j in range(TILE):
                byte = c[r0 + off + l, j]
                w[l, j] = sc[0, j] * (_u(byte & 15) - shift) - mn[0, j]
                w[l + 16, j] = sc[0, j] * (_u(byte >> 4) - shift) - mn[0, j]
    elif kind == Q5_0 or kind == Q5_1:
        hi = 2 if kind == Q5_0 else 4
        shift = np.float32(16 if kind == Q5_0 else 0)
        for l in range(16):
            for j in range(TILE):
                byte = c[r0 + hi + 4 + l, j]
                h0 = c[r0 + hi + l // 8, j] >> (l % 8)
                h1 = c[r0 + hi + 2 + l // 8, j] >> (l % 8)
                w[l, j] = sc[0, j] * (_u((byte & 15) | ((h0 & 1) << 4)) - shift) - mn[0, j]
                w[l + 16, j] = sc[0, j] * (_u((byte >> 4) | ((h1 & 1) << 4)) - shift) - mn[0, j]
    elif kind == Q2_K or kind == Q3_K:
        qs = 16 if kind == Q2_K else 32
        for v in range(256):  # v = n*128 + k*32 + l: bits 2k of byte n*32 + l
            n, k, l, s = v // 128, (v // 32) % 4, v % 32, v // 16
            for j in range(TILE):
                q = _u((c[r0 + qs + n * 32 + l, j] >> (2 * k)) & 3)
                if kind == Q3_K:  # less 4 where hmask bit v // 32 of byte v % 32 is clear
                    q -= np.float32(4) * _u(((c[r0 + l, j] >> (v // 32)) & 1) ^ 1)
                w[v, j] = sc[s, j] * q - mn[s, j]
    elif kind == Q4_K or kind == Q5_K:
        qs = 16 if kind == Q4_K else 48
        for v in range(256):  # v = n*64 + k*32 + l: nibble k of byte n*32 + l
            n, k, l, s = v // 64, (v // 32) % 2, v % 32, v // 32
            five = 1 if kind == Q5_K else 0  # the fifth bit: bit s of byte 16 + l
            for j in range(TILE):
                q = ((c[r0 + qs + n * 32 + l, j] >> (4 * k)) & 15) | (
                    ((c[r0 + 16 + l, j] >> s) & five) << 4)
                w[v, j] = sc[s, j] * _u(q) - mn[s, j]
    elif kind == Q6_K:
        for v in range(256):  # v = n*128 + r: low 4 bits in ql, high 2 bits in qh
            n, r, s = v // 128, v % 128, v // 16
            for j in range(TILE):
                low = (c[r0 + n * 64 + r % 64, j] >> (4 * (r // 64))) & 15
                high = (c[r0 + 128 + n * 32 + r % 32, j] >> (2 * (r // 32))) & 3
                w[v, j] = sc[s, j] * (_u(low | (high << 4)) - np.float32(32))


# -------------------------------------------------------------------------- generic paths
# Every kernel sees the tiles as 2-D rows of TILE bytes, c[(t * n_blocks + b) * nbytes + k]:
# with one computed row index per access LLVM vectorizes the loops over j reliably.

@njit(inline="always")
def _scratch():
    """Per-thread buffers on the stack (stack.py): decoded weights of one block, sub-block
    scales/mins, f16 bits."""
    return (stack_array(256, TILE, np.float32), stack_array(18, TILE, np.float32),
            stack_array(16, TILE, np.float32), stack_tile(np.uint32))


@njit(parallel=True, cache=True)
def matvec_decoded(kind, codes, x, out):
    """out[t*TILE + j] = sum_v w[v] x[v], each block decoded into a small buffer first (the
    types without a fused kernel)."""
    n_tiles, n_blocks, nbytes, _ = codes.shape
    c = codes.reshape(n_tiles * n_blocks * nbytes, TILE)
    cf = codes.reshape(-1)
    values = x.shape[0] // n_blocks
    for t in prange(n_tiles):
        acc = stack_tile(np.float32)
        acc[:] = 0.0
        w, sc, mn, bits = _scratch()
        for b in range(n_blocks):
            r0 = (t * n_blocks + b) * nbytes
            # the block two ahead, asked for at once: decoding is slow enough to hide it
            prefetch_rows(cf, TILE, r0 + AHEAD * nbytes, r0 + (AHEAD + 1) * nbytes)
            _decode_block(kind, c, r0, w, bits, sc, mn)
            for v in range(values):
                xv = x[b * values + v]
                for j in range(TILE):
                    acc[j] += w[v, j] * xv
        for j in range(TILE):
            out[t * TILE + j] = acc[j]


@njit(parallel=True, cache=True, fastmath={"contract"})
def matmul_decoded(kind, codes, x, out):
    """The same for a multiple of four rows of x (fewrows.few_rows pads): each weight is
    formed once and feeds four rows' partial sums, which stay in registers (stack.py). For
    the K-quants the weight is formed in a register from the block's int8 codes
    (`_codes`, 16 KB: in L1) as sc * q - mn, gguf's formula in one fused multiply-add (one
    rounding: gguf's weights to within float32 rounding); the other types decode the block
    into float32 first. Before, each row went over a decoded block (64 KB, in L2) in
    turn with its sums on the heap: 4 rows of 9728 x 2560 cost Q4_K 2.84 -> 1.27 ms, Q6_K
    3.77 -> 1.51 ms (one row: 0.54 and 1.1 ms)."""
    n_tiles, n_blocks, nbytes, _ = codes.shape
    c = codes.reshape(n_tiles * n_blocks * nbytes, TILE)
    cf = codes.reshape(-1)
    values = x.shape[1] // n_blocks
    for t in prange(n_tiles):
        w, sc, mn, bits = _scratch()
        a0, a1, a2, a3 = (stack_tile(np.float32), stack_tile(np.float32),
                          stack_tile(np.float32), stack_tile(np.float32))
        q = stack_array(256, TILE, np.int8)
        for g in range(0, x.shape[0], 4):
            a0[:] = 0.0
            a1[:] = 0.0
            a2[:] = 0.0
            a3[:] = 0.0
            for b in range(n_blocks):
                r0 = (t * n_blocks + b) * nbytes
                ahead = r0 + AHEAD * nbytes
                if g == 0 and not _fused(kind):  # at once, as matvec_decoded
                    prefetch_rows(cf, TILE, ahead, ahead + nbytes)
                if _fused(kind):  # weights formed in registers from int8 codes
                    _scales(kind, c, r0, bits, sc, mn)
                    _codes(kind, c, r0, q)
                else:
                    _decode_block(kind, c, r0, w, bits, sc, mn)
                for v in range(values):
                    if g == 0 and _fused(kind):  # a share of the rows a value
                        prefetch_rows(cf, TILE, ahead + v * nbytes // values,
                                      ahead + (v + 1) * nbytes // values)
                    i = b * values + v
                    x0, x1, x2, x3 = x[g, i], x[g + 1, i], x[g + 2, i], x[g + 3, i]
                    s = _sub_block(kind, v)
                    for j in range(TILE):
                        if _fused(kind):
                            wj = sc[s, j] * np.float32(q[v, j]) - mn[s, j]
                        else:
                            wj = w[v, j]
                        a0[j] += wj * x0
                        a1[j] += wj * x1
                        a2[j] += wj * x2
                        a3[j] += wj * x3
            for j in range(TILE):
                out[g, t * TILE + j] = a0[j]
                out[g + 1, t * TILE + j] = a1[j]
                out[g + 2, t * TILE + j] = a2[j]
                out[g + 3, t * TILE + j] = a3[j]


@njit(parallel=True, cache=True)
def pack_tiles(rows, codes):
    """rows (O, row bytes) uint8 -> codes (n_tiles, row bytes, TILE): codes[t, k, j] = byte k
    of row t*TILE + j; rows past O (the last tile's padding) are zero. A tile's 64 source rows
    (92 KB for S2 Pro's Q4_K) stay in L2 while the inner loop gathers one byte from each, so
    the transposition itself runs at ~4 GB/s (2 cores, in memory); straight from a freshly
    mapped file, page faults on both sides bring that to ~0.5 GB/s. numpy's strided copy of
    the same managed 0.35 GB/s: 7.9 s of a 9.6 s real-size q4_k_m load, now 5.7 s in all."""
    n_rows, row_bytes = rows.shape
    n_tiles = codes.shape[0]
    for t in prange(n_tiles):
        first = t * TILE
        n = min(TILE, n_rows - first)
        for k in range(row_bytes):
            for j in range(n):
                codes[t, k, j] = rows[first + j, k]
            for j in range(n, TILE):
                codes[t, k, j] = 0


@njit(nogil=True, cache=True)
def decode_tile(kind, codes, t, w):
    """Tile t as float32 (in, TILE) into w, for sgemm (tile_gemm.py)."""
    n_tiles, n_blocks, nbytes, _ = codes.shape
    c = codes.reshape(n_tiles * n_blocks * nbytes, TILE)
    values = w.shape[0] // n_blocks
    block, sc, mn, bits = _scratch()
    for b in range(n_blocks):
        _decode_block(kind, c, (t * n_blocks + b) * nbytes, block, bits, sc, mn)
        for v in range(values):
            for j in range(TILE):
                w[b * values + v, j] = block[v, j]


@njit(cache=True)
def gather_rows(kind, codes, rows, out):
    """Rows `rows` as float32 (embedding lookups): only their tiles' blocks are decoded, and
    of those only the row asked for is kept."""
    n_tiles, n_blocks, nbytes, _ = codes.shape
    c = codes.reshape(n_tiles * n_blocks * nbytes, TILE)
    values = out.shape[1] // n_blocks
    w, sc, mn, bits = _scratch()
    for r in range(rows.shape[0]):
        t, j = rows[r] // TILE, rows[r] % TILE
        for b in range(n_blocks):
            _decode_block(kind, c, (t * n_blocks + b) * nbytes, w, bits, sc, mn)
            for v in range(values):
                out[r, b * values + v] = w[v, j]


# -------------------------------------------------------------------------- fused K-quants
# A block is first unpacked to its integer codes, one int8 a weight for the tile's 64 rows
# (`_codes`: byte-wide loops, 64 lanes per vector operation), then multiplied 16 values at a
# time: for each output row, the 16 codes times x are summed in two chains of eight
# multiply-adds that stay in registers, and the group's sum is scaled once (a min is applied
# to the group's sum of x, `xs`, formed once per product). Against unpacking inside the
# multiply loop with partial sums in L1 (the previous kernel), 2 threads on a quiet machine:
# Q6_K 1.4x faster (155776 x 2560: 27 against 36 ms), Q5_K 2-2.5x.
# They were then bound by waiting for memory, not by arithmetic: from cache two threads
# compute a Q6_K product at ~37 GB/s of blocks and stream the blocks alone at ~60 GB/s, but
# from memory they managed 18 GB/s, the two times added. Each step of the compute now asks
# for a few lines of the block two ahead (prefetch.py): on 9728 x 2560, alternated runs, Q6_K
# 1.06-1.71 -> 0.50-0.60 ms, Q4_K 0.56-0.61 -> 0.37-0.48 ms. (Asking for the next block's
# lines all at once, at the start of a block, had gained little: a core has few outstanding
# misses.) Tried without gain: unpacking half a block at a time, four chains of four, Q4_K's
# nibbles (and Q6_K's codes) unpacked straight in the register chains.

@njit(inline="always")
def _codes(kind, c, r0, q):
    """q[v, j]: the integer code of value v of the block at row r0 of c, for every row j of
    the tile, as int8: Q2_K 0..3, Q3_K -4..3 (gguf's q - 4 where the high bit is clear),
    Q4_K 0..15, Q5_K 0..31, Q6_K -32..31 (gguf's q - 32): only Q2_K, Q4_K and Q5_K have a
    min, applied per sub-block. q: int8 (256, TILE) scratch. Each loop runs over 32 rows of TILE bytes
    at once, through flat slices (index i = l * TILE + j): per row of 64 bytes, the loop's
    fixed costs (numba's index arithmetic, LLVM's alias checks) were as large as the work."""
    n = 32 * TILE
    cf, qf = c.reshape(-1), q.reshape(-1)
    if kind == Q6_K:
        for h in range(2):  # values h*128 + g*32 + l: ql byte h*64 + (g%2)*32 + l, qh bits 2g
            ql = cf[(r0 + h * 64) * TILE:(r0 + h * 64 + 64) * TILE]
            qh = cf[(r0 + 128 + h * 32) * TILE:(r0 + 160 + h * 32) * TILE]
            out = qf[h * 128 * TILE:(h + 1) * 128 * TILE]
            for i in range(n):
                a, a2, hb = ql[i], ql[n + i], qh[i]
                out[i] = np.int8(np.uint8((a & 15) | ((hb & 3) << 4)) - np.uint8(32))
                out[n + i] = np.int8(np.uint8((a2 & 15) | ((hb & 12) << 2)) - np.uint8(32))
                out[2 * n + i] = np.int8(np.uint8((a >> 4) | (hb & 48)) - np.uint8(32))
                out[3 * n + i] = np.int8(np.uint8((a2 >> 4) | ((hb >> 2) & 48)) - np.uint8(32))
    elif kind == Q2_K or kind == Q3_K:
        # values h*128 + k*32 + l: bits 2k of byte qs + h*32 + l; Q3_K less 4 where bit
        # 4h + k of hmask byte l (bytes 0..31) is clear
        qs = r0 + (16 if kind == Q2_K else 32)
        hmask = cf[r0 * TILE:(r0 + 32) * TILE]
        for h in range(2):
            src = cf[(qs + h * 32) * TILE:(qs + h * 32 + 32) * TILE]
            for k in range(4):
                out = qf[(h * 128 + k * 32) * TILE:(h * 128 + k * 32 + 32) * TILE]
                if kind == Q2_K:
                    for i in range(n):
                        out[i] = np.int8((src[i] >> (2 * k)) & 3)
                else:
                    for i in range(n):
                        low = np.uint8((src[i] >> (2 * k)) & 3)
                        clear = np.uint8(((hmask[i] >> (4 * h + k)) & 1) ^ 1)
                        out[i] = np.int8(low) - np.int8(clear << 2)
    else:  # Q4_K: values h*64 + k*32 + l are nibble k of byte 16 + h*32 + l; Q5_K: the same
        # from byte 48, plus a fifth bit: bit 2h + k of byte 16 + l
        five = kind == Q5_K
        qs = r0 + (48 if five else 16)
        high = cf[(r0 + 16) * TILE:(r0 + 48) * TILE]
        for h in range(4):
            src = cf[(qs + h * 32) * TILE:(qs + h * 32 + 32) * TILE]
            out = qf[h * 64 * TILE:(h + 1) * 64 * TILE]
            if five:
                for i in range(n):
                    byte, f = src[i], high[i] >> (2 * h)
                    out[i] = np.int8((byte & 15) | ((f & 1) << 4))
                    out[n + i] = np.int8((byte >> 4) | ((f & 2) << 3))
            else:
                for i in range(n):
                    byte = src[i]
                    out[i] = np.int8(byte & 15)
                    out[n + i] = np.int8(byte >> 4)


@njit(inline="always")
def _q4_k_block(c, r0, b, x, xs, acc, plo, phi, sc, mn, cf, ahead):
    """acc += this Q4_K block's share of the product, for one row x, the nibbles unpacked in
    the multiply loop (Q4_K's unpacking is cheap, and on matrices streamed from memory this
    was faster than `_codes`: 4.8 against 5.9 ms on 65536 x 2560). Four rows of bytes per
    pass over the tile (measured 1.3-2x faster than one row per pass when the partial sums
    lived in memory), added to the partial sums one after another: a chain of fused
    multiply-adds, 10-15 % faster than summing the four products in pairs first (alternated
    runs: 9728 x 2560 0.56-0.61 -> 0.50-0.51 ms). xs: sums of x over 16 values. Each of the
    32 passes asks for 4-5 of the 144 rows of the block at row `ahead` (prefetch.py)."""
    base = b * 256
    for n in range(4):  # 64 values: low nibbles sub-block 2n, high nibbles sub-block 2n+1
        plo[:] = 0.0
        phi[:] = 0.0
        for l in range(0, 32, 4):
            first = ahead + n * 36 + l + l // 8  # 144 rows over 32 passes
            prefetch_rows(cf, TILE, first, first + 5)
            xb, row = base + n * 64 + l, r0 + 16 + n * 32 + l
            a0, a1, a2, a3 = x[xb], x[xb + 1], x[xb + 2], x[xb + 3]
            h0, h1, h2, h3 = x[xb + 32], x[xb + 33], x[xb + 34], x[xb + 35]
            for j in range(TILE):
                q = (c[row, j], c[row + 1, j], c[row + 2, j], c[row + 3, j])
                _nibble_chains(plo, phi, j, q, (a0, a1, a2, a3), (h0, h1, h2, h3))
        _q4_k_scaled(b, 2 * n, xs, sc, mn, plo, phi, acc)


@njit(inline="always")
def _nibble_chains(plo, phi, j, q, low_x, high_x):
    """plo[j] += the low nibbles of the four bytes q times low_x, phi[j] += their high
    nibbles times high_x: two chains of fused multiply-adds, in input order."""
    lo = plo[j] + _u(q[0] & 15) * low_x[0]
    hi = phi[j] + _u(q[0] >> 4) * high_x[0]
    lo += _u(q[1] & 15) * low_x[1]
    hi += _u(q[1] >> 4) * high_x[1]
    lo += _u(q[2] & 15) * low_x[2]
    hi += _u(q[2] >> 4) * high_x[2]
    plo[j] = lo + _u(q[3] & 15) * low_x[3]
    phi[j] = hi + _u(q[3] >> 4) * high_x[3]


@njit(inline="always")
def _q4_k_scaled(b, s, xs, sc, mn, plo, phi, acc):
    """acc += sub-blocks s and s+1 of block b: their sums of q * x (plo, phi) scaled, less
    their mins times their sums of x."""
    xa = xs[b * 16 + 2 * s] + xs[b * 16 + 2 * s + 1]
    xz = xs[b * 16 + 2 * s + 2] + xs[b * 16 + 2 * s + 3]
    for j in range(TILE):
        acc[j] = _scaled(_scaled(acc[j], sc[s, j], plo[j], mn[s, j], xa),
                         sc[s + 1, j], phi[j], mn[s + 1, j], xz)


@njit(inline="always")
def _scaled(acc, scale, total, minimum, x_sum):
    """acc + scale * total - minimum * x_sum, one product per step: each step is one fused
    multiply-add whichever kernel it is in. (With two products in one sum LLVM picks which
    of them to fuse, and it did not pick alike in the one- and two-row kernels.)"""
    acc = acc + scale * total
    return acc - minimum * x_sum


@njit(inline="always")
def _groups(kind, q, b, x, xs, acc, sc, mn, cf, ahead, nbytes):
    """acc += the share of one block whose codes are in q (`_codes`), 16 values at a time;
    each group asks for a sixteenth of the rows of the block at row `ahead` (prefetch.py)."""
    f32 = np.float32
    per = (nbytes + 15) // 16
    for g in range(16):  # 16 values: sub-block g (Q6_K) or half of sub-block g // 2
        prefetch_rows(cf, TILE, ahead + g * per, ahead + min((g + 1) * per, nbytes))
        v, s, xb = g * 16, _sub_block(kind, g * 16), b * 256 + g * 16
        x0, x1, x2, x3 = x[xb], x[xb + 1], x[xb + 2], x[xb + 3]
        x4, x5, x6, x7 = x[xb + 4], x[xb + 5], x[xb + 6], x[xb + 7]
        y0, y1, y2, y3 = x[xb + 8], x[xb + 9], x[xb + 10], x[xb + 11]
        y4, y5, y6, y7 = x[xb + 12], x[xb + 13], x[xb + 14], x[xb + 15]
        xsg = xs[b * 16 + g]
        for j in range(TILE):
            lo = (((((((f32(q[v, j]) * x0 + f32(q[v + 1, j]) * x1)
                       + f32(q[v + 2, j]) * x2) + f32(q[v + 3, j]) * x3)
                     + f32(q[v + 4, j]) * x4) + f32(q[v + 5, j]) * x5)
                   + f32(q[v + 6, j]) * x6) + f32(q[v + 7, j]) * x7)
            hi = (((((((f32(q[v + 8, j]) * y0 + f32(q[v + 9, j]) * y1)
                       + f32(q[v + 10, j]) * y2) + f32(q[v + 11, j]) * y3)
                     + f32(q[v + 12, j]) * y4) + f32(q[v + 13, j]) * y5)
                   + f32(q[v + 14, j]) * y6) + f32(q[v + 15, j]) * y7)
            acc[j] = _scaled(acc[j], sc[s, j], lo + hi, mn[s, j], xsg)


@njit(parallel=True, cache=True, fastmath={"contract"})
def matvec_fused(kind, codes, x, xs, out):
    """out = W x for the K-quants (FUSED); xs: the sums of x over each 16 values.
    fastmath "contract" only lets LLVM fuse a multiply and an add (one rounding instead of
    two); it does not reorder sums."""
    n_tiles, n_blocks, nbytes, _ = codes.shape
    c = codes.reshape(n_tiles * n_blocks * nbytes, TILE)
    cf = codes.reshape(-1)
    for t in prange(n_tiles):
        # every buffer on the stack, where LLVM keeps the partial sums in registers
        # (stack.py): Q4_K 1.3x faster than with heap buffers
        acc = stack_tile(np.float32)
        acc[:] = 0.0
        q = stack_array(256, TILE, np.int8)
        p0, p1 = stack_tile(np.float32), stack_tile(np.float32)
        sc, mn = stack_array(18, TILE, np.float32), stack_array(16, TILE, np.float32)
        bits = stack_tile(np.uint32)
        for b in range(n_blocks):
            r0 = (t * n_blocks + b) * nbytes
            ahead = r0 + AHEAD * nbytes  # the rows of the block two ahead (prefetch.py)
            _scales(kind, c, r0, bits, sc, mn)
            if kind == Q4_K:
                _q4_k_block(c, r0, b, x, xs, acc, p0, p1, sc, mn, cf, ahead)
            else:
                _codes(kind, c, r0, q)
                _groups(kind, q, b, x, xs, acc, sc, mn, cf, ahead, nbytes)
        for j in range(TILE):
            out[t * TILE + j] = acc[j]


# -------------------------------------------------------------------------- two rows
# The same kernels for two rows of x at once (the Fast-AR's first call of a frame runs two
# positions; a batch of two sequences): each code is unpacked and converted once and feeds
# both rows' chains, and the block is read from memory once. Each row is summed exactly as
# the one-row kernel sums it (the same chains in the same order), so its numbers are the
# one-row product's.

@njit(inline="always")
def _q4_k_block2(c, r0, b, x, xs, acc, p, sc, mn, cf, ahead):
    """_q4_k_block for rows x[0] and x[1]: acc (2, TILE); p (4, TILE) scratch: the partial
    sums of the low and high nibbles of row 0, then of row 1."""
    base = b * 256
    for n in range(4):
        p[:] = 0.0
        for l in range(0, 32, 4):
            first = ahead + n * 36 + l + l // 8
            prefetch_rows(cf, TILE, first, first + 5)
            xb, row = base + n * 64 + l, r0 + 16 + n * 32 + l
            a0, a1, a2, a3 = x[0, xb], x[0, xb + 1], x[0, xb + 2], x[0, xb + 3]
            h0, h1, h2, h3 = x[0, xb + 32], x[0, xb + 33], x[0, xb + 34], x[0, xb + 35]
            b0, b1, b2, b3 = x[1, xb], x[1, xb + 1], x[1, xb + 2], x[1, xb + 3]
            g0, g1, g2, g3 = x[1, xb + 32], x[1, xb + 33], x[1, xb + 34], x[1, xb + 35]
            for j in range(TILE):  # the codes are converted once: LLVM merges the two
                q = (c[row, j], c[row + 1, j], c[row + 2, j], c[row + 3, j])
                _nibble_chains(p[0], p[1], j, q, (a0, a1, a2, a3), (h0, h1, h2, h3))
                _nibble_chains(p[2], p[3], j, q, (b0, b1, b2, b3), (g0, g1, g2, g3))
        s = 2 * n
        _q4_k_scaled(b, s, xs[0], sc, mn, p[0], p[1], acc[0])
        _q4_k_scaled(b, s, xs[1], sc, mn, p[2], p[3], acc[1])


@njit(inline="always")
def _chains(f0, f1, f2, f3, f4, f5, f6, f7, x0, x1, x2, x3, x4, x5, x6, x7):
    """One chain of eight multiply-adds, in the one-row kernel's order."""
    return (((((((f0 * x0 + f1 * x1) + f2 * x2) + f3 * x3) + f4 * x4) + f5 * x5) + f6 * x6)
            + f7 * x7)


@njit(inline="always")
def _groups2(kind, q, b, x, xs, acc, sc, mn, cf, ahead, nbytes):
    """_groups for rows x[0] and x[1]; acc (2, TILE). Each code is converted once."""
    f32 = np.float32
    per = (nbytes + 15) // 16
    for g in range(16):
        prefetch_rows(cf, TILE, ahead + g * per, ahead + min((g + 1) * per, nbytes))
        v, s, xb = g * 16, _sub_block(kind, g * 16), b * 256 + g * 16
        a0, a1, a2, a3 = x[0, xb], x[0, xb + 1], x[0, xb + 2], x[0, xb + 3]
        a4, a5, a6, a7 = x[0, xb + 4], x[0, xb + 5], x[0, xb + 6], x[0, xb + 7]
        a8, a9, a10, a11 = x[0, xb + 8], x[0, xb + 9], x[0, xb + 10], x[0, xb + 11]
        a12, a13, a14, a15 = x[0, xb + 12], x[0, xb + 13], x[0, xb + 14], x[0, xb + 15]
        b0, b1, b2, b3 = x[1, xb], x[1, xb + 1], x[1, xb + 2], x[1, xb + 3]
        b4, b5, b6, b7 = x[1, xb + 4], x[1, xb + 5], x[1, xb + 6], x[1, xb + 7]
        b8, b9, b10, b11 = x[1, xb + 8], x[1, xb + 9], x[1, xb + 10], x[1, xb + 11]
        b12, b13, b14, b15 = x[1, xb + 12], x[1, xb + 13], x[1, xb + 14], x[1, xb + 15]
        m0, m1 = xs[0, b * 16 + g], xs[1, b * 16 + g]
        for j in range(TILE):
            f0, f1, f2, f3 = f32(q[v, j]), f32(q[v + 1, j]), f32(q[v + 2, j]), f32(q[v + 3, j])
            f4, f5, f6, f7 = (f32(q[v + 4, j]), f32(q[v + 5, j]), f32(q[v + 6, j]),
                              f32(q[v + 7, j]))
            f8, f9, f10, f11 = (f32(q[v + 8, j]), f32(q[v + 9, j]), f32(q[v + 10, j]),
                                f32(q[v + 11, j]))
            f12, f13, f14, f15 = (f32(q[v + 12, j]), f32(q[v + 13, j]), f32(q[v + 14, j]),
                                  f32(q[v + 15, j]))
            row0 = (_chains(f0, f1, f2, f3, f4, f5, f6, f7, a0, a1, a2, a3, a4, a5, a6, a7)
                    + _chains(f8, f9, f10, f11, f12, f13, f14, f15,
                              a8, a9, a10, a11, a12, a13, a14, a15))
            row1 = (_chains(f0, f1, f2, f3, f4, f5, f6, f7, b0, b1, b2, b3, b4, b5, b6, b7)
                    + _chains(f8, f9, f10, f11, f12, f13, f14, f15,
                              b8, b9, b10, b11, b12, b13, b14, b15))
            acc[0, j] = _scaled(acc[0, j], sc[s, j], row0, mn[s, j], m0)
            acc[1, j] = _scaled(acc[1, j], sc[s, j], row1, mn[s, j], m1)


@njit(parallel=True, cache=True, fastmath={"contract"})
def matvec2_fused(kind, codes, x, xs, out):
    """out[r] = W x[r] for the two rows of x (2, in) (FUSED types); xs (2, in / 16)."""
    n_tiles, n_blocks, nbytes, _ = codes.shape
    c = codes.reshape(n_tiles * n_blocks * nbytes, TILE)
    cf = codes.reshape(-1)
    for t in prange(n_tiles):
        acc = stack_array(2, TILE, np.float32)
        acc[:] = 0.0
        q = stack_array(256, TILE, np.int8)
        p = stack_array(4, TILE, np.float32)
        sc, mn = stack_array(18, TILE, np.float32), stack_array(16, TILE, np.float32)
        bits = stack_tile(np.uint32)
        for b in range(n_blocks):
            r0 = (t * n_blocks + b) * nbytes
            ahead = r0 + AHEAD * nbytes
            _scales(kind, c, r0, bits, sc, mn)
            if kind == Q4_K:
                _q4_k_block2(c, r0, b, x, xs, acc, p, sc, mn, cf, ahead)
            else:
                _codes(kind, c, r0, q)
                _groups2(kind, q, b, x, xs, acc, sc, mn, cf, ahead, nbytes)
        for j in range(TILE):
            out[0, t * TILE + j] = acc[0, j]
            out[1, t * TILE + j] = acc[1, j]


FUSED = frozenset({Q2_K, Q3_K, Q4_K, Q5_K, Q6_K})


@njit(cache=True)
def _sums_of_16(x, out):
    """out[r, g] = x[r, 16g] + ... + x[r, 16g + 15], summed in order."""
    for r in range(x.shape[0]):
        for g in range(out.shape[1]):
            total = np.float32(0.0)
            for i in range(16 * g, 16 * g + 16):
                total += x[r, i]
            out[r, g] = total


def sub_block_sums(kind: int, x: np.ndarray) -> np.ndarray:
    """What the fused kernels need besides x (one row, or rows): its sums over each 16 values
    (the minimum terms of Q2_K/Q4_K/Q5_K; Q3_K's and Q6_K's are multiplied by zero). A
    kernel, not numpy's sum over a reshape: that took ~10 us a call, 4 ms of a real-size
    frame's ~300 products."""
    rows = x.reshape(-1, x.shape[-1])
    out = np.empty((rows.shape[0], rows.shape[1] // 16), np.float32)
    _sums_of_16(rows, out)
    return out.reshape(*x.shape[:-1], -1)
