"""F16 weights kept as float16 bits in the tiled layout (tiled.py), multiplied straight from
them: a decode step streams 2 bytes a weight instead of float32's 4.

numba has no float16 type, so the kernels widen the bits themselves, exactly
(`widen_finite`): by the CPU's conversion instruction where numba's target has one (F16C on
x86, every AArch64), else by this bit trick: for a finite
float16 h, the float32 whose bits are sign(h) << 16 | magnitude(h) << 13 is h * 2^-112
(the float16 exponent lands in the float32 exponent field, 112 lower than its bias asks;
float16 subnormals land on float32 subnormals with the same scaling), so h = that * 2^112,
one exact multiplication. Infinities and NaNs do not survive this (they come out finite), so
a tensor holding any is not packed: it is widened to float32 like other types (`from_raw`
returns None).

The bits become a float32 by an LLVM bitcast (`as_float32`, free: the value stays in its
register). Writing them into an integer buffer and reading it back as float32 (numba has no
scalar bit cast), as the kernels did before, cost a store and a load per weight: a 9728 x 2560
matrix-vector product streamed at ~28 GB/s that way and streams at memory speed (~35 GB/s
here) now; four rows at once went from 4.3 to 3.6 ms (medians, matrices in memory). The
conversion instruction then took four and eight rows to 0.76-0.78x the trick's time
(widen_finite).
"""

from __future__ import annotations

import functools

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic, overload

from . import kernel_cache  # noqa: F401  (first: numba's cache follows every source here)
from .fewrows import GROUP, few_rows
from .stack import stack_tile
from .tiled import TILE, TiledMatrix, n_tiles

#: float16 bits moved into a float32 are the value times 2^-112 (see above)
_UNSCALE = np.float32(2.0 ** 112)
_SIGN = np.uint32(0x8000)
_MAGNITUDE = np.uint32(0x7fff)
_EXPONENT = np.uint32(0x7c00)  # all ones: infinity or NaN


#: float32 bits to keep after a sign-extended float16 is shifted left by 13: the sign (bit 31,
#: set by the extension for a negative value) and the magnitude (bits 13-27); bits 28-30 hold
#: copies of the sign
_SIGN_AND_MAGNITUDE = np.int32(-0x70000001)  # 0x8FFFFFFF


@njit(inline="always")
def _bits(h):
    """float16 bits -> float32 bits of h * 2^-112."""
    h = np.uint32(h)
    return ((h & _SIGN) << np.uint32(16)) | ((h & _MAGNITUDE) << np.uint32(13))


@intrinsic
def as_float32(typingctx, bits):
    """The float32 whose bits are the low 32 bits of the integer `bits`."""
    if not isinstance(bits, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        value = args[0]
        if bits.bitwidth != 32:  # numba widens integer arithmetic: keep the low 32 bits
            value = builder.trunc(value, ir.IntType(32))
        return builder.bitcast(value, ir.FloatType())

    return types.float32(bits), codegen


@njit(inline="always")
def _widen(h):
    """A finite float16 given by its bits (uint16 or int16) as float32, exactly. Sign
    extension, one shift and one mask give _bits(h) in three vector instructions; the bitcast
    is free; the multiply by 2^112 is exact."""
    bits = (np.int32(np.int16(h)) << np.int32(13)) & _SIGN_AND_MAGNITUDE
    return as_float32(bits) * _UNSCALE


#: float32 exponent bits all ones: what an infinite or NaN float16 widens to
_FLOAT32_EXPONENT = np.int32(0x7f800000)


@njit(inline="always")
def widen_any(h):
    """_widen for every float16, infinities and NaNs too (a KV cache is not checked when it
    is written, as a weight is when packed): those keep their sign and fraction bits and get
    float32's all-ones exponent (infinity stays infinity, NaN stays NaN). The test and the
    select add two vector instructions to _widen's three."""
    bits = (np.int32(np.int16(h)) << np.int32(13)) & _SIGN_AND_MAGNITUDE
    if (np.int32(h) & np.int32(_EXPONENT)) == np.int32(_EXPONENT):
        return as_float32(bits | _FLOAT32_EXPONENT)
    return as_float32(bits) * _UNSCALE


@functools.cache
def target_converts_half() -> bool:
    """Whether the CPU numba compiles for converts float16 in hardware: x86's F16C (every
    AVX2 CPU has it) or any AArch64. There LLVM turns a half-to-float extension into one
    vector instruction (vcvtph2ps, fcvtl); elsewhere it would call a runtime function that
    numba does not link (the process crashes), so widen_half takes widen_any's bit trick."""
    from numba.core.registry import cpu_target
    triple, _, features = cpu_target.target_context.codegen().magic_tuple()
    return triple.startswith(("aarch64", "arm64")) or "+f16c" in features.split(",")


def widen_half_lanes(builder: ir.IRBuilder, bits: ir.Value) -> ir.Value:
    """IR: a vector of float16 bits (<n x i16>) as float32 (<n x float>), exactly: the
    hardware conversion where the target has one (target_converts_half), else widen_any's bit
    trick on every lane (infinities and NaNs kept). Every IR kernel widens halves here."""
    n = bits.type.count
    floats = ir.VectorType(ir.FloatType(), n)
    if target_converts_half():
        return builder.fpext(builder.bitcast(bits, ir.VectorType(ir.HalfType(), n)), floats)
    i32s = ir.VectorType(ir.IntType(32), n)

    def splat(value):
        return ir.Constant(i32s, [value] * n)

    wide = builder.sext(bits, i32s)
    moved = builder.and_(builder.shl(wide, splat(13)), splat(int(_SIGN_AND_MAGNITUDE)))
    finite = builder.fmul(builder.bitcast(moved, floats),
                          ir.Constant(floats, [float(_UNSCALE)] * n))
    special = builder.icmp_signed("==", builder.and_(wide, splat(int(_EXPONENT))),
                                  splat(int(_EXPONENT)))
    kept = builder.bitcast(builder.or_(moved, splat(int(_FLOAT32_EXPONENT))), floats)
    return builder.select(special, kept, finite)


def _widening(trick):
    """An intrinsic h -> float32 for a float16 given by its int16 bits, exactly: the hardware
    conversion where the target has one (target_converts_half, decided when the kernel is
    compiled), else the bit trick `trick` (h -> float32, compiled inline). One instruction
    widens 16 values where widen_any takes five and _widen four."""
    @intrinsic
    def widening(typingctx, h):
        if not (isinstance(h, types.Integer) and h.bitwidth == 16):
            return None

        def codegen(context, builder, signature, args):
            if target_converts_half():
                return builder.fpext(builder.bitcast(args[0], ir.HalfType()), ir.FloatType())
            return context.compile_internal(builder, trick, signature, args)

        return types.float32(h), codegen

    return widening


#: every float16, infinities and NaNs included (widen_any's trick elsewhere): attention over
#: an F16 cache (attention.py's numba loops for the columns past its vectors), which
#: multiplies each value only 4 times, feels the difference from the trick
widen_half = _widening(lambda h: widen_any(h))
#: the finite float16 a packed weight holds (`_pack` turns the others away; _widen's cheaper
#: trick elsewhere): in the tiled kernels, from memory, alternated, one row of S2 Pro's F16
#: matrices took 0.87-0.91x the time it took with the trick, four and eight rows 0.76-0.78x
#: (the products bit for bit the same)
widen_finite = _widening(lambda h: _widen(h))


@intrinsic
def _through_half(typingctx, value):
    """A float32 rounded to the nearest float16 (ties to even, too large to infinity) and
    widened back: one conversion each way, vectorized by LLVM (F16C's vcvtps2ph and vcvtph2ps,
    or AArch64's fcvtn and fcvtl). Only where target_converts_half(): elsewhere LLVM would
    call a runtime function that numba does not link."""
    if not (isinstance(value, types.Float) and value.bitwidth == 32):
        return None

    def codegen(context, builder, signature, args):
        return builder.fpext(builder.fptrunc(args[0], ir.HalfType()), ir.FloatType())

    return types.float32(value), codegen


@njit(cache=True)
def _round_to_half(flat, out):
    for i in range(flat.shape[0]):
        out[i] = _through_half(flat[i])


def round_to_half(x: np.ndarray) -> np.ndarray:
    """x as float32 rounded to float16's values: numpy's x.astype(float16).astype(float32),
    the same numbers, in the CPU's conversion instructions where numba's target has them.
    numpy converts one value at a time (4.2-7.3 ns a value on a Zen 4), which cost an 8-row
    F16 product of 9728 inputs 0.4 ms against its 3.6 ms; the instructions take 0.11-0.12 ns
    a value on 8 or 100 such rows (one row of 2560: 2.6 us, mostly the call)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    if not target_converts_half():
        return x.astype(np.float16).astype(np.float32)
    out = np.empty_like(x)
    _round_to_half(x.reshape(-1), out.reshape(-1))
    return out


def value_f32(x):
    """A float32 value as it is, or a float16 given as its int16 bits (numba has no float16)
    widened exactly (widen_half): for kernels that read float32 or float16 arrays alike
    (compiled only: see the overload below)."""


@overload(value_f32)
def _value_f32(x):
    if isinstance(x, types.Integer):
        return lambda x: widen_half(x)
    return lambda x: x


# ---------------------------------------------------------------------------------- kernels
# As in q8_0.py: the innermost loops run over the TILE outputs of a tile, so LLVM vectorizes
# them; parallel=True splits tiles among numba's threads; cache=True keeps compiled code.

@njit(parallel=True, cache=True)
def _pack(rows, codes):
    """rows (O, I) uint16 -> codes (n_tiles, I, TILE); returns how many are inf or NaN."""
    n_rows, n_in = rows.shape
    n_tiles, _, tile = codes.shape
    non_finite = 0
    for t in prange(n_tiles):
        for j in range(min(tile, n_rows - t * tile)):
            row = t * tile + j
            for i in range(n_in):
                h = rows[row, i]
                codes[t, i, j] = h
                if (np.uint32(h) & _EXPONENT) == _EXPONENT:
                    non_finite += 1
    return non_finite


@njit(parallel=True, cache=True, fastmath={"contract"})
def _matvec_tiles(codes, x, out):
    """out[t*TILE + j] = sum_i w[t, i, j] * x[i]  (one input row), multiply-adds fused as in
    the few-row kernels (fewrows.py), so rows agree bit for bit. The loops run to the
    constant TILE, not the array's last extent: LLVM then unrolls and vectorizes them fully
    (one 9728 x 2560 product 1.6 -> 1.3 ms)."""
    n_tiles, n_in, _ = codes.shape
    for t in prange(n_tiles):
        acc = stack_tile(np.float32)  # in registers (stack.py)
        acc[:] = 0.0
        for i in range(n_in):
            xi = x[i]
            for j in range(TILE):
                acc[j] += widen_finite(codes[t, i, j]) * xi
        for j in range(TILE):
            out[t * TILE + j] = acc[j]


@njit(nogil=True, cache=True)
def _decode_tile(codes, t, w):
    """Tile t as float32 (in, TILE) into w: the tile is already (in, TILE) in memory, so this
    is one elementwise pass."""
    src = codes[t].reshape(-1)
    dst = w.reshape(-1)
    for k in range(src.shape[0]):
        dst[k] = widen_finite(src[k])


@njit(cache=True)
def _gather_rows(codes, rows, out):
    """Rows `rows` of the matrix as float32 (embedding lookups)."""
    tile, n_in = codes.shape[2], codes.shape[1]
    for r in range(rows.shape[0]):
        t, j = rows[r] // tile, rows[r] % tile
        for i in range(n_in):
            out[r, i] = widen_finite(codes[t, i, j])


# ---------------------------------------------------------------------------------- matrix
# few-row kernels: rows in groups of four, and the two-row form (fewrows.py)
@njit(parallel=True, cache=True, fastmath={"contract"})
def f16_rows(codes, x, out):
    """out[r, t*TILE + j] = sum_i (w[t, i, j] * 2^112) * x[r, i]; x has a multiple of 4 rows.
    `codes` is the F16 layout viewed as int16 (widen_finite)."""
    n_tiles, n_in, _ = codes.shape
    for t in prange(n_tiles):
        a0 = stack_tile(np.float32)
        a1 = stack_tile(np.float32)
        a2 = stack_tile(np.float32)
        a3 = stack_tile(np.float32)
        for g in range(0, x.shape[0], GROUP):
            a0[:] = 0.0
            a1[:] = 0.0
            a2[:] = 0.0
            a3[:] = 0.0
            for i in range(n_in):
                x0, x1, x2, x3 = x[g, i], x[g + 1, i], x[g + 2, i], x[g + 3, i]
                for j in range(TILE):
                    wj = widen_finite(codes[t, i, j])
                    a0[j] += wj * x0
                    a1[j] += wj * x1
                    a2[j] += wj * x2
                    a3[j] += wj * x3
            for j in range(TILE):
                out[g, t * TILE + j] = a0[j]
                out[g + 1, t * TILE + j] = a1[j]
                out[g + 2, t * TILE + j] = a2[j]
                out[g + 3, t * TILE + j] = a3[j]


@njit(parallel=True, cache=True, fastmath={"contract"})
def f16_pair(codes, x, out):
    """f16_rows for two rows (x (2, in)), each accumulated as there."""
    n_tiles, n_in, _ = codes.shape
    for t in prange(n_tiles):
        a0 = stack_tile(np.float32)
        a1 = stack_tile(np.float32)
        a0[:] = 0.0
        a1[:] = 0.0
        for i in range(n_in):
            x0, x1 = x[0, i], x[1, i]
            for j in range(TILE):
                wj = widen_finite(codes[t, i, j])
                a0[j] += wj * x0
                a1[j] += wj * x1
        for j in range(TILE):
            out[0, t * TILE + j] = a0[j]
            out[1, t * TILE + j] = a1[j]


#: outputs of a tile one pass of f16_row_pairs accumulates: two rows of 32 float32 are eight
#: AVX2 registers, which leave room in AVX2's 16 for the widened weights and the two
#: activation values (f16_rows' four rows of 64 are 32 such registers: LLVM spills them)
PAIR_OUTPUTS = 32
#: inputs of a tile f16_row_pairs takes at a time, all its passes over them before the next
#: ones: 2048 inputs of a tile are 256 KB, so every pass after the first reads them from L2
PAIR_SPAN = 2048
#: rows from which targets without wide_registers take f16_row_pairs (its measurements)
PAIRS_FROM_ROWS = 8


@njit(parallel=True, cache=True, fastmath={"contract"})
def f16_row_pairs(codes, x, out):
    """f16_rows for targets with fewer vector registers (wide_registers): x has an even
    number of rows, taken a pair at a time, each pass a pair by PAIR_OUTPUTS outputs over
    PAIR_SPAN inputs, the running sums kept in `out` between spans (float32 stored and
    reloaded: exact). Each output still sums (w * 2^112) * x over its inputs in input order,
    fused: the same bits as f16_rows. Indices are unsigned, so that numba adds no test for
    negative ones to the inner loop (with them, this form ran slower than f16_rows)."""
    n_tiles, n_in, _ = codes.shape
    n_rows = x.shape[0]
    for t in prange(n_tiles):
        a0 = stack_tile(np.float32)
        a1 = stack_tile(np.float32)
        for r in range(n_rows):
            for j in range(TILE):
                out[r, t * TILE + j] = 0.0
        for start in range(0, n_in, PAIR_SPAN):
            span = min(PAIR_SPAN, n_in - start)
            for g in range(0, n_rows, 2):
                for part in range(0, TILE, PAIR_OUTPUTS):
                    o = t * TILE + part
                    for j in range(PAIR_OUTPUTS):
                        a0[j] = out[g, o + j]
                        a1[j] = out[g + 1, o + j]
                    for k in range(span):
                        i = np.uint64(start + k)
                        x0, x1 = x[g, i], x[g + 1, i]
                        for j in range(PAIR_OUTPUTS):
                            wj = widen_finite(codes[t, i, np.uint64(part + j)])
                            a0[j] += wj * x0
                            a1[j] += wj * x1
                    for j in range(PAIR_OUTPUTS):
                        out[g, o + j] = a0[j]
                        out[g + 1, o + j] = a1[j]


@functools.cache
def wide_registers() -> bool:
    """Whether numba's target has AVX-512's 32 vector registers of 16 float32: f16_rows'
    four rows of a whole tile (4 x 64 accumulators) fit there. AVX2's 16 registers of 8 do
    not: there eight rows or more take f16_row_pairs. Measured on a Zen 4, the two forms
    alternated over copies of S2 Pro's four matrix shapes streamed from memory
    (benchmarks/f16_row_forms.py, results f16-row-forms-20261207-2244-...): the Haswell
    build's pairs take 0.76-0.89x f16_rows' time at 8 rows (two more runs that day:
    0.75-0.93x), but 1.04-1.25x at 4 and 1.09-1.24x at 2 (where f16_rows' second pass over
    a tile's inputs costs nothing), hence only from eight rows; the VNNI build's pairs take
    1.23-1.95x, hence only without AVX-512. (ARM's NEON, 32 registers of 4, is not measured;
    it takes pairs too: four rows of a tile would need 64.)"""
    from .simd import target_features
    return "avx512f" in target_features()


class F16Matrix(TiledMatrix):
    """A [out, in] F16 matrix in the tiled layout. `m(x)` is x @ W^T for x (n, in)."""

    @classmethod
    def from_raw(cls, raw: np.ndarray) -> "F16Matrix | None":
        """From the file's float16 values (O, I); copies them into the layout. None if the
        tensor holds an infinity or NaN (the kernels' widening is exact for finite values)."""
        rows = np.ascontiguousarray(raw).view(np.uint16)
        n_out, n_in = rows.shape
        codes = np.zeros((n_tiles(n_out), n_in, TILE), np.uint16)
        if _pack(rows, codes):
            return None
        return cls(codes, n_out)

    def _matvec(self, x: np.ndarray, out: np.ndarray) -> None:
        _matvec_tiles(self.codes.view(np.int16), x, out)

    def _matmul(self, x: np.ndarray, out: np.ndarray) -> None:
        pairs = x.shape[0] >= PAIRS_FROM_ROWS and not wide_registers()
        kernels = (f16_row_pairs if pairs else f16_rows, f16_pair)
        few_rows(kernels, (self.codes.view(np.int16),), x, out)

    def _decode_tile(self, t: int, w: np.ndarray) -> None:
        _decode_tile(self.codes.view(np.int16), t, w)

    def _gather(self, ids: np.ndarray, out: np.ndarray) -> None:
        _gather_rows(self.codes.view(np.int16), ids, out)
