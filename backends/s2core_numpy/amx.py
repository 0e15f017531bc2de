"""arithmetic="ggml" for several activation rows at once on Intel's AMX tile units.

With one row a product streams its matrix and the VNNI kernels (simd.py) keep up with memory.
With several rows (a batched step: one row per sequence; a prefill) they run out of the
core's arithmetic: each row costs one `vpdpbusd` and one broadcast per 4 inputs of 16 outputs,
so eight rows of a 9728 x 2560 Q4_K matrix cost 2.7x one row. AMX (Sapphire Rapids and later
Xeons: `amx_int8`, `amx_tile` in /proc/cpuinfo) multiplies a 16-row by 64-byte tile of int8
activations by a 64-byte by 16-column tile of weights in one `tdpbsud`, 16,384 multiply-adds.

The tiles read the VNNI layout as it is (int_dots.py): a 64-byte group, 4 inputs of each of
16 output rows, is one row of an AMX "B" tile. Per sub-block (32 inputs for Q8_0's blocks and
Q4_K, 16 for Q6_K) one `tdpbsud` gives every activation row's exact int32 dot with every
output: Q8_0 reads its groups straight from the matrix, Q4_K and Q6_K unpack theirs (nibbles,
Q6_K's high bits) into a small buffer first, since a tile loads from memory only. The
sub-block dots are then combined with the scales exactly as the VNNI kernels combine them
(the same integers, the same float32 operations in the same order), so a row's numbers are
bit for bit the VNNI kernels' whatever path or batch computed them (tests/test_amx.py).

Linux hands AMX's 8 KB of tile state to a process only on request (arch_prctl
ARCH_REQ_XCOMP_PERM, kernel 5.16 and later): `available()` asks once, and without it (or the
CPU flags, or under NUMBA_CPU_NAME builds for other CPUs) the VNNI kernels serve every row.
"""

from __future__ import annotations

import ctypes
import os
import platform
from functools import lru_cache

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic
from numba.core import cgutils

from . import kernel_cache  # noqa: F401  (first: numba's cache follows every source here)
from .plugin import (AMX_FEATURES, ARCH_REQ_XCOMP_PERM, NO_AMX_VARIABLE, SYS_ARCH_PRCTL,
                     XFEATURE_XTILEDATA)
from .simd import (Q4_K_HEADER, Q4_K_KIND, Q6_K_HEADER, Q6_K_KIND, Q8_0_HEADER, Q8_0_KIND, ROWS,
                   Emitter, isa, q4_k_header, q4_k_scale_min, q6_k_group, scalar_pair16,
                   target_features)
from .stack import stack_array

#: per GGML type number, the rows of a product from which AMX computes it instead of the VNNI
#: kernels, where it measured faster. A 9728 x 2560 product (benchmarks/amx_rows.py, both
#: cores; AMX / VNNI time): Q8_0 0.75 at 6 rows, 0.70 at 16; Q4_K 0.81-1.01 at 8, 0.70 at 16;
#: Q6_K 0.91 at 10, 0.83 at 16. In the batch case on q4_k_m files (4 layers) AMX from 8 rows
#: made eight sequences slower (34.2 against 35.0-39.0 frames/s) and sixteen faster (46.5-48.8
#: against 39.5-44.0), so Q4_K and Q6_K start at 12. Below these, a `tdpbsud` and a stored
#: tile per sub-block and tile of 16 outputs cost more than the VNNI kernels' few rows.
MIN_ROWS = {Q8_0_KIND: 6, Q4_K_KIND: 12, Q6_K_KIND: 12}
#: activation rows per AMX call (a tile holds 16)
CHUNK = 16

_I8, _I64 = ir.IntType(8), ir.IntType(64)
_BYTES = _I8.as_pointer()


@lru_cache(maxsize=None)
def unavailable_reason() -> str:
    """"" where AMX runs here, else why not."""
    if os.environ.get(NO_AMX_VARIABLE):
        return f"{NO_AMX_VARIABLE} is set"
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        return "not x86-64 Linux"
    if isa() != "vnni":
        return "numba's target has no AVX-512 VNNI"
    if not AMX_FEATURES <= target_features():
        return "numba's target CPU has no amx-int8 and amx-tile"
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(SYS_ARCH_PRCTL, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) != 0:
        return f"the kernel refused AMX's tile state (arch_prctl errno {ctypes.get_errno()})"
    return ""


def available() -> bool:
    return not unavailable_reason()


# ------------------------------------------------------------------------ the tile ops
def _data(context, builder, signature, args, i):
    array = context.make_array(signature.args[i])(context, builder, args[i])
    return builder.bitcast(array.data, _BYTES)


def _int64(context, builder, signature, args, i):
    return context.cast(builder, args[i], signature.args[i], types.int64)


def _call(builder, name: str, argument_types: list, values: list) -> None:
    fn = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(ir.VoidType(), argument_types), name)
    builder.call(fn, values)


@intrinsic
def _load_config(typingctx, cfg):
    """ldtilecfg: the 64-byte tile configuration in `cfg` (uint8)."""
    def codegen(context, builder, signature, args):
        _call(builder, "llvm.x86.ldtilecfg", [_BYTES], [_data(context, builder, signature, args, 0)])
        return context.get_dummy_value()
    return types.void(cfg), codegen


@intrinsic
def _release(typingctx):
    """tilerelease: the tile state back to its initial, empty form."""
    def codegen(context, builder, signature, args):
        _call(builder, "llvm.x86.tilerelease", [], [])
        return context.get_dummy_value()
    return types.void(), codegen


def _make_dots(count: int, x_step: int, b_step: int, c_step: int):
    """An intrinsic (x, x_at, x_stride, b, b_at, c, c_at) that, for k < count, stores into c
    (int32 rows of 16, 64 bytes apart, from byte c_at + k * c_step) the dots of tile A (rows of
    x from byte x_at + k * x_step, x_stride apart: signed codes) with tile B (the groups of b
    from byte b_at + k * b_step: unsigned codes). Tiles 0/1 hold A, 2/3 B, 4/5 C, alternately,
    so one dot's loads overlap the other's product. Shapes come from the loaded config."""

    @intrinsic
    def dots(typingctx, x, x_at, x_stride, b, b_at, c, c_at):
        sig = types.void(x, x_at, x_stride, b, b_at, c, c_at)

        def codegen(context, builder, signature, args):
            xp, bp, cp = (_data(context, builder, signature, args, i) for i in (0, 3, 5))
            x0, stride, b0, c0 = (_int64(context, builder, signature, args, i)
                                  for i in (1, 2, 4, 6))
            row = ir.Constant(_I64, 64)

            def tile(t):
                return ir.Constant(_I8, t)

            for k in range(count):
                a_t, b_t, c_t = tile(k % 2), tile(2 + k % 2), tile(4 + k % 2)
                at = builder.add(x0, ir.Constant(_I64, k * x_step))
                _call(builder, "llvm.x86.tileloadd64", [_I8, _BYTES, _I64],
                      [a_t, builder.gep(xp, [at]), stride])
                at = builder.add(b0, ir.Constant(_I64, k * b_step))
                _call(builder, "llvm.x86.tileloadd64", [_I8, _BYTES, _I64],
                      [b_t, builder.gep(bp, [at]), row])
                _call(builder, "llvm.x86.tilezero", [_I8], [c_t])
                _call(builder, "llvm.x86.tdpbsud", [_I8, _I8, _I8], [c_t, a_t, b_t])
                at = builder.add(c0, ir.Constant(_I64, k * c_step))
                _call(builder, "llvm.x86.tilestored64", [_I8, _BYTES, _I64],
                      [c_t, builder.gep(cp, [at]), row])
            return context.get_dummy_value()

        return sig, codegen

    return dots


_V64 = ir.VectorType(_I8, 64)


def _make_unpack(body):
    """An intrinsic (src, src_at, dst) writing a tile-block's codes as bytes into dst (uint8)
    from the codes at byte src_at of src, in whole 64-byte vectors: `body(b, load, store,
    splat)` emits them. (As a numba loop, LLVM did not vectorize it beside the tile ops, whose
    calls take the buffer's address: 12.6 against 1.8 ms a 9728 x 2560 Q4_K product.)"""

    @intrinsic
    def unpack(typingctx, src, src_at, dst):
        def codegen(context, builder, signature, args):
            sp, dp = (_data(context, builder, signature, args, i) for i in (0, 2))
            at = _int64(context, builder, signature, args, 1)

            def pointer(base, offset):
                return builder.bitcast(builder.gep(base, [offset]), _V64.as_pointer())

            def load(offset):
                return builder.load(pointer(sp, builder.add(at, ir.Constant(_I64, offset))),
                                    align=1)

            def store(offset, value):
                builder.store(value, pointer(dp, ir.Constant(_I64, offset)), align=1)

            def splat(n):
                return ir.Constant(_V64, [n] * 64)

            body(builder, load, store, splat)
            return context.get_dummy_value()

        return types.void(src, src_at, dst), codegen

    return unpack


def _q4_k_body(b, load, store, splat):
    """Q4_K: chunk c's 8 groups -> its low nibbles (sub-block 2c, at 1024 c) and its high
    nibbles (sub-block 2c + 1, at 1024 c + 512)."""
    for chunk in range(4):
        for g in range(8):
            v = load(Q4_K_HEADER + chunk * 512 + g * 64)
            store(1024 * chunk + g * 64, b.and_(v, splat(15)))
            store(1024 * chunk + 512 + g * 64, b.lshr(v, splat(4)))


def _q6_k_body(b, load, store, splat):
    """Q6_K: per half, 8 groups of ql (two runs) and qh -> the four 6-bit values k = 0..3 of
    each group (sub-block 8 half + 2 k + g // 4, 4 groups of 64 bytes a sub-block)."""
    for half in range(2):
        for g in range(8):
            ql0, ql1, qh = (load(Q6_K_HEADER + q6_k_group.py_func(half, run, g) * 64)
                            for run in range(3))
            to = (8 * half + g // 4) * 256 + (g % 4) * 64

            def high(shift):
                bits = b.lshr(qh, splat(shift)) if shift else qh
                bits = b.and_(bits, splat(3)) if shift != 6 else bits
                return b.shl(bits, splat(4))

            store(to, b.or_(b.and_(ql0, splat(15)), high(0)))
            store(to + 512, b.or_(b.and_(ql1, splat(15)), high(2)))
            store(to + 1024, b.or_(b.lshr(ql0, splat(4)), high(4)))
            store(to + 1536, b.or_(b.lshr(ql1, splat(4)), high(6)))


_unpack_q4_k, _unpack_q6_k = _make_unpack(_q4_k_body), _make_unpack(_q6_k_body)


_DOTS_COLS = CHUNK * ROWS  # int32 dots of one sub-block: 16 rows x 16 outputs
_C_STEP = _DOTS_COLS * 4  # their bytes
#: Q8_0: 8 blocks of 32 inputs, their groups read from the matrix (8 x 64 bytes a block)
_q8_0_dots = _make_dots(8, 32, 8 * 64, _C_STEP)
#: Q4_K: 8 sub-blocks of 32 inputs, from the unpacked buffer
_q4_k_dots = _make_dots(8, 32, 8 * 64, _C_STEP)
#: Q6_K: 16 sub-blocks of 16 inputs, from the unpacked buffer
_q6_k_dots = _make_dots(16, 16, 4 * 64, _C_STEP)


_I32X16, _F32X16 = ir.VectorType(ir.IntType(32), ROWS), ir.VectorType(ir.FloatType(), ROWS)


def _make_combine(body):
    """An intrinsic (dots, c_at, scales, d_w, xs, xs_at, xd, xd_at, acc, acc_at) adding one
    activation row's share of a tile-block to its 16 outputs, in <16 x> vectors: the row's
    sub-block dots (int32, 16 a sub-block, sub-blocks _DOTS_COLS apart, from element c_at of
    dots), combined with the tile-block's scales (int32 rows of 16) and float d's (float32 rows
    of 16), the row's code sums (int32, from element xs_at of xs) and d's (from element xd_at
    of xd), added to 16 float32 at element acc_at of acc. `body(e, dots, scale, d, x_sum,
    x_d, splat)` returns the float32 vector to add (e: simd.py's emitter); dots, scale and d
    map an index to a vector, x_sum and x_d to a scalar. (As a numba loop over the 16
    outputs this ran scalar.)"""

    @intrinsic
    def combine(typingctx, dots, c_at, scales, d_w, xs, xs_at, xd, xd_at, acc, acc_at):
        sig = types.void(dots, c_at, scales, d_w, xs, xs_at, xd, xd_at, acc, acc_at)

        def codegen(context, builder, signature, args):
            def base(i, element):
                array = context.make_array(signature.args[i])(context, builder, args[i])
                return builder.bitcast(array.data, element.as_pointer())

            def index(i):
                return _int64(context, builder, signature, args, i)

            i32, f32 = ir.IntType(32), ir.FloatType()
            dp, sp, wp, xsp, xdp, ap = (base(0, i32), base(2, i32), base(3, f32),
                                        base(4, i32), base(6, f32), base(8, f32))
            c0, xs0, xd0, a0 = index(1), index(5), index(7), index(9)

            def vector(ptr, at, vec_t):
                p = builder.bitcast(builder.gep(ptr, [at]), vec_t.as_pointer())
                return builder.load(p, align=4), p

            def const(n):
                return ir.Constant(_I64, n)

            def dots_of(s):
                return vector(dp, builder.add(c0, const(s * _DOTS_COLS)), _I32X16)[0]

            def scale_of(s):
                return vector(sp, const(s * ROWS), _I32X16)[0]

            def d_of(s):
                return vector(wp, const(s * ROWS), _F32X16)[0]

            def x_sum(s):
                return builder.load(builder.gep(xsp, [builder.add(xs0, const(s))]))

            def x_d(s):
                return builder.load(builder.gep(xdp, [builder.add(xd0, const(s))]))

            def splat(value, vec_t):
                one = builder.insert_element(ir.Constant(vec_t, None), value,
                                             ir.Constant(ir.IntType(32), 0))
                return builder.shuffle_vector(one, ir.Constant(vec_t, None),
                                              ir.Constant(_I32X16, [0] * ROWS))

            value = body(Emitter(builder, "vnni"), dots_of, scale_of, d_of, x_sum, x_d, splat)
            old, ptr = vector(ap, a0, _F32X16)
            builder.store(builder.fadd(old, value), ptr, align=4)
            return context.get_dummy_value()

        return sig, codegen

    return combine


def _q8_0_combine(e, dots, scale, d, x_sum, x_d, splat):
    """sum over blocks of (d_w * d_x) * float(isum - 128 * sum(x)), block 0 first (the
    weights are stored + 128: simd.SIGNED_FLIP)."""
    b = e.b
    total = None
    for blk in range(8):
        xs = b.shl(b.add(x_sum(2 * blk), x_sum(2 * blk + 1)), ir.Constant(ir.IntType(32), 7))
        isum = b.sub(dots(blk), splat(xs, _I32X16))
        term = b.fmul(b.fmul(d(blk), splat(x_d(blk), _F32X16)), b.sitofp(isum, _F32X16))
        total = term if total is None else b.fadd(total, term)
    return total


def _q4_k_combine(e, dots, scale, d, x_sum, x_d, splat):
    """(d_w * d_x) * float(sum_s sc_s * isum_s) - (dmin_w * d_x) * float(sum_s m_s * sum_x(s));
    scale rows 0-7 the scales, 8-11 the mins of sub-blocks 2k and 2k + 1 as int16 pairs (one
    vpdpwssd per pair, as the VNNI kernel); d rows 0 d, 1 dmin."""
    b = e.b
    scaled = None
    for s in range(8):
        term = b.mul(scale(s), dots(s))
        scaled = term if scaled is None else b.add(scaled, term)
    mins = e.zero()
    for k in range(4):
        u, v = (b.add(x_sum(4 * k + 2 * h), x_sum(4 * k + 2 * h + 1)) for h in (0, 1))
        mins = e.pair_dot(mins, [scale(8 + k)], scalar_pair16(b, u, v))
    d_x = splat(x_d(0), _F32X16)
    return b.fsub(b.fmul(b.fmul(d(0), d_x), b.sitofp(scaled, _F32X16)),
                  b.fmul(b.fmul(d(1), d_x), b.sitofp(mins[0], _F32X16)))


def _q6_k_combine(e, dots, scale, d, x_sum, x_d, splat):
    """(d_w * d_x) * float(sum_s sc_s * (isum_s - 32 * sum_x(s)))."""
    b = e.b
    total = None
    for s in range(16):
        xs = splat(b.shl(x_sum(s), ir.Constant(ir.IntType(32), 5)), _I32X16)
        term = b.mul(scale(s), b.sub(dots(s), xs))
        total = term if total is None else b.add(total, term)
    return b.fmul(b.fmul(d(0), splat(x_d(0), _F32X16)), b.sitofp(total, _F32X16))


_combine_q8_0, _combine_q4_k, _combine_q6_k = (
    _make_combine(f) for f in (_q8_0_combine, _q4_k_combine, _q6_k_combine))


def _make_header(body):
    """An intrinsic (codes, at, scales, d_w) writing a tile-block's scales (int32 rows of 16)
    and float d's (float32 rows of 16) from its header at byte `at` of codes, with simd.py's
    vector forms of the VNNI kernels' own header decoding: `body(e, codes, at)` returns the
    ([scale vectors], [d vectors])."""

    @intrinsic
    def header(typingctx, codes, at, scales, d_w):
        def codegen(context, builder, signature, args):
            cp = context.make_array(signature.args[0])(context, builder, args[0]).data
            e = Emitter(builder, "vnni")
            scale_rows, d_rows = body(e, cp, _int64(context, builder, signature, args, 1))
            for i, (rows, element) in enumerate(((scale_rows, ir.IntType(32)),
                                                 (d_rows, ir.FloatType()))):
                array = context.make_array(signature.args[2 + i])(context, builder, args[2 + i])
                vec_t = ir.VectorType(element, ROWS)
                for k, vector in enumerate(rows):
                    ptr = builder.gep(builder.bitcast(array.data, element.as_pointer()),
                                      [ir.Constant(_I64, k * ROWS)])
                    builder.store(vector, builder.bitcast(ptr, vec_t.as_pointer()), align=4)
            return context.get_dummy_value()

        return types.void(codes, at, scales, d_w), codegen

    return header


def _at(e, at, offset):
    return e.b.add(at, ir.Constant(_I64, offset))


def _q8_0_header(e, codes, at):
    return [], [e.row_halves(codes, _at(e, at, 32 * blk))[0] for blk in range(8)]


def _q4_k_header(e, codes, at):
    header = q4_k_header(e, codes, at)
    pairs = [q4_k_scale_min(e, header, s) for s in range(8)]
    min_pairs = [e.pair16(pairs[2 * k][1], pairs[2 * k + 1][1])[0] for k in range(4)]
    return ([sc[0] for sc, _ in pairs] + min_pairs,
            [e.row_halves(codes, at)[0], e.row_halves(codes, _at(e, at, 32))[0]])


def _q6_k_header(e, codes, at):
    return ([e.row_bytes(codes, _at(e, at, 16 * s), signed=True)[0] for s in range(16)],
            [e.row_halves(codes, _at(e, at, 256))[0]])


_header_q8_0, _header_q4_k, _header_q6_k = (
    _make_header(f) for f in (_q8_0_header, _q4_k_header, _q6_k_header))


@njit(inline="always")
def _configure(cfg, rows, k_bytes):
    """The tile configuration for `rows` activation rows and sub-blocks of k_bytes inputs."""
    for i in range(64):
        cfg[i] = 0
    cfg[0] = 1  # palette 1
    for t in range(6):
        if t < 2:  # A: rows x k_bytes codes
            colsb, n = k_bytes, rows
        elif t < 4:  # B: k_bytes / 4 groups of 64 bytes
            colsb, n = 64, k_bytes // 4
        else:  # C: rows x 16 int32
            colsb, n = 64, rows
        cfg[16 + 2 * t] = colsb & 255
        cfg[17 + 2 * t] = colsb >> 8
        cfg[48 + t] = n
    _load_config(cfg)


# ------------------------------------------------------------------------ the driver
@njit(parallel=True, cache=True)
def products(kind, packed, xq, xd, xs, out):
    """simd.products' contract (out (R, tiles * 16) = the rows times the packed matrix), per
    tile of 16 outputs and chunk of up to 16 rows, on the tile units. Call only where
    available() is True: before it asks Linux for the tile state, a tile op is an illegal
    instruction. Per tile-block the header's scales are widened once for all its rows."""
    n_tiles, n_super, tb = packed.shape
    n_rows, n_in = xq.shape
    n_d = xd.shape[1] // n_super
    n_xs = xs.shape[1]
    flat, codes, flat_d, flat_s = packed.reshape(-1), xq.reshape(-1), xd.reshape(-1), \
        xs.reshape(-1)
    k_bytes = 16 if kind == Q6_K_KIND else 32
    for t in prange(n_tiles):
        cfg = stack_array(1, 64, np.uint8)[0]
        unpacked = stack_array(1, 4096, np.uint8)[0]
        dots = stack_array(16, _DOTS_COLS, np.int32)
        acc = stack_array(CHUNK, ROWS, np.float32)
        d_w = stack_array(8, ROWS, np.float32)  # Q8_0: d per block; K-quants: d (, dmin)
        scales = stack_array(16, ROWS, np.int32)  # Q4_K: 8 scales, 4 min pairs; Q6_K: 16
        for first in range(0, n_rows, CHUNK):
            rows = min(CHUNK, n_rows - first)
            _configure(cfg, rows, k_bytes)
            for c in range(rows):
                for j in range(ROWS):
                    acc[c, j] = 0
            for sb in range(n_super):
                at = (t * n_super + sb) * tb
                x_at = first * n_in + sb * 256
                if kind == Q8_0_KIND:
                    _header_q8_0(flat, at, scales, d_w)
                    _q8_0_dots(codes, x_at, n_in, flat, at + Q8_0_HEADER, dots, 0)
                elif kind == Q4_K_KIND:
                    _header_q4_k(flat, at, scales, d_w)
                    _unpack_q4_k(flat, at, unpacked)
                    _q4_k_dots(codes, x_at, n_in, unpacked, 0, dots, 0)
                else:
                    _header_q6_k(flat, at, scales, d_w)
                    _unpack_q6_k(flat, at, unpacked)
                    _q6_k_dots(codes, x_at, n_in, unpacked, 0, dots, 0)
                for c in range(rows):
                    r = first + c
                    args = (dots, c * ROWS, scales, d_w, flat_s, r * n_xs + sb * 16, flat_d,
                            (r * n_super + sb) * n_d, acc, c * ROWS)
                    if kind == Q8_0_KIND:
                        _combine_q8_0(*args)
                    elif kind == Q4_K_KIND:
                        _combine_q4_k(*args)
                    else:
                        _combine_q6_k(*args)
            for c in range(rows):
                for j in range(ROWS):
                    out[first + c, t * ROWS + j] = acc[c, j]
        _release()
