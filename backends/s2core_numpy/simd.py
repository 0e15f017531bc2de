"""Integer dot products of 8-bit codes in the CPU's own instructions, for arithmetic="ggml".

ggml multiplies a quantized weight by an 8-bit activation in integers (act_quant.py): per
group of 4 inputs, 4 products of an unsigned weight byte and a signed activation byte summed
into an int32. x86 has that as one instruction: AVX-512 VNNI `vpdpbusd` (16 rows x 4 inputs
per instruction), and on AVX2 `vpmaddubsw` (pairs, into int16) then `vpmaddwd` by ones (into
int32), as ggml's own AVX2 code does. numba cannot produce either from Python loops (it widens
integer arithmetic to 64 bits), so the intrinsics below write the LLVM IR by hand: LLVM's own
x86 intrinsics, inlined into the numba kernels of int_dots.py.

The layout they read (int_dots.py packs it): a "group" is 64 bytes, the 4 code bytes of one
group of 4 consecutive inputs for each of 16 output rows, row-major ([row][4]). A group times
the 4 activation bytes of those inputs gives 16 int32 sums, one per row. On AVX2 the 64 bytes
are two halves of 8 rows; on VNNI one register.

Which instructions: those of the CPU numba compiles for (`isa()`): the host's, or the ones
NUMBA_CPU_NAME / NUMBA_CPU_FEATURES name (so an AVX-512 machine can build and measure the
AVX2 code: benchmarks/arithmetic.py --avx2). Other CPUs (ARM, x86 before AVX2) get no integer
kernels: arithmetic="ggml" there rounds the activation and multiplies in float32, the same
numbers up to float32 summation order (act_quant.ActivationRounded).
"""

from __future__ import annotations

import copy
from functools import lru_cache

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from . import kernel_cache  # noqa: F401  (first: numba's cache follows every source here)
from .plugin import AVX2_FEATURES, VNNI_FEATURES
from .prefetch import emit_prefetch
from .stack import stack_array

ROWS = 16  # output rows per group: one VNNI register of int32 sums
GROUP_BYTES = 64  # ROWS x 4 inputs

_I8, _I16, _I32 = ir.IntType(8), ir.IntType(16), ir.IntType(32)


@lru_cache(maxsize=None)
def target_features() -> frozenset[str]:
    """The features (LLVM's names) of the CPU numba compiles for: the host's, or
    NUMBA_CPU_FEATURES."""
    from numba.core import config
    from numba.core.codegen import get_host_cpu_features
    features = config.CPU_FEATURES if config.CPU_FEATURES is not None \
        else get_host_cpu_features()
    return frozenset(f[1:] for f in str(features).split(",") if f.startswith("+"))


@lru_cache(maxsize=None)
def isa() -> str:
    """"vnni" (AVX-512 F, BW and VNNI), "avx2" (with F16C, as every AVX2 CPU has: the
    activation's Q8_0 scale is rounded to float16 in one instruction, act_quant_kernels), or ""
    (no integer kernels), for the CPU numba compiles for."""
    on = target_features()
    if VNNI_FEATURES <= on:
        return "vnni"
    if AVX2_FEATURES <= on:
        return "avx2"
    return ""


# ------------------------------------------------------------------------ IR building
class Emitter:
    """One ISA's forms of: load a 64-byte group, bit operations on it, and accumulate its dot
    with 4 activation bytes. A group value is a list of vectors (one <64 x i8> on VNNI, two
    <32 x i8> on AVX2); an accumulator likewise (<16 x i32>, or two <8 x i32>).

    half (AVX2 only, 0 or 1): the emitter covers that half's 8 output rows alone (its lists
    hold one vector): a kernel body emitted once per half keeps half the registers live."""

    def __init__(self, builder: ir.IRBuilder, kind: str, ahead: int = 0,
                 half: int | None = None):
        self.b = builder
        self.kind = kind
        self.ahead = ahead  # bytes ahead of each group read whose line load() asks for
        whole = 1 if kind == "vnni" else 2
        assert half is None or (whole == 2 and half in (0, 1)), "halves are AVX2's"
        #: the register parts of a group this emitter covers (memory offsets follow them);
        #: its lists hold one vector per part, in this order
        self.part_indices = range(whole) if half is None else (half,)
        self.parts = len(self.part_indices)
        width = GROUP_BYTES // whole
        self.bytes_t = ir.VectorType(_I8, width)
        self.sums_t = ir.VectorType(_I32, ROWS // whole)
        mod = builder.module
        self.words_t = ir.VectorType(_I16, 2 * self.sums_t.count)
        if kind == "vnni":
            self._dpbusd = cgutils.get_or_insert_function(
                mod, ir.FunctionType(self.sums_t, [self.sums_t, self.bytes_t, self.bytes_t]),
                "llvm.x86.avx512.vpdpbusd.512")
            self._dpwssd = cgutils.get_or_insert_function(
                mod, ir.FunctionType(self.sums_t, [self.sums_t, self.words_t, self.words_t]),
                "llvm.x86.avx512.vpdpwssd.512")
        else:
            i16s = ir.VectorType(_I16, width // 2)
            self._i16s = i16s
            self._maddubs = cgutils.get_or_insert_function(
                mod, ir.FunctionType(i16s, [self.bytes_t, self.bytes_t]),
                "llvm.x86.avx2.pmadd.ub.sw")
            self._maddwd = cgutils.get_or_insert_function(
                mod, ir.FunctionType(self.sums_t, [i16s, i16s]), "llvm.x86.avx2.pmadd.wd")
            self._sign = cgutils.get_or_insert_function(
                mod, ir.FunctionType(self.bytes_t, [self.bytes_t, self.bytes_t]),
                "llvm.x86.avx2.psign.b")
            self._abs = cgutils.get_or_insert_function(
                mod, ir.FunctionType(self.bytes_t, [self.bytes_t, ir.IntType(1)]),
                "llvm.abs.v32i8")

    def bytes_splat(self, value: int) -> list:
        """A constant byte in every byte of a group."""
        return [ir.Constant(self.bytes_t, [value] * self.bytes_t.count)] * self.parts

    def zero(self) -> list:
        return [ir.Constant(self.sums_t, [0] * self.sums_t.count)] * self.parts

    def prefetch(self, base, offset) -> None:
        """Ask for the line at byte offset + ahead (prefetch.py: PREFETCH_BLOCKS tile-blocks
        ahead, a line per group read, overlaps the memory stream with this block's
        arithmetic; x86 prefetches never fault, past the end included), into L2
        (PREFETCH_LOCALITY)."""
        at = self.b.add(offset, ir.Constant(offset.type, self.ahead))
        emit_prefetch(self.b, self.b.gep(base, [at]), PREFETCH_LOCALITY)

    def load(self, base, offset) -> list:
        """The group at byte `offset` (an i64 value) of the uint8 pointer `base`."""
        if self.ahead:
            self.prefetch(base, offset)
        out = []
        for p in self.part_indices:
            at = self.b.add(offset, ir.Constant(offset.type, p * self.bytes_t.count))
            ptr = self.b.bitcast(self.b.gep(base, [at]), self.bytes_t.as_pointer())
            out.append(self.b.load(ptr, align=1))
        return out

    def op(self, name: str, a: list, c: list) -> list:
        return [getattr(self.b, name)(x, y) for x, y in zip(a, c)]

    def broadcast(self, base, offset) -> list:
        """The 4 activation bytes at `offset` of the int8 pointer `base`, repeated per row."""
        ptr = self.b.bitcast(self.b.gep(base, [offset]), _I32.as_pointer())
        word = self.b.load(ptr, align=1)
        words_t = ir.VectorType(_I32, self.bytes_t.count // 4)
        one = self.b.insert_element(ir.Constant(words_t, None), word, ir.Constant(_I32, 0))
        spread = self.b.shuffle_vector(one, ir.Constant(words_t, None),
                                       ir.Constant(ir.VectorType(_I32, words_t.count),
                                                   [0] * words_t.count))
        return [self.b.bitcast(spread, self.bytes_t)] * self.parts

    def dot(self, acc: list, pairs: list, scale: list | None = None) -> list:
        """acc + sum over (weights, activations) in `pairs` of their 4-byte dots; weights
        unsigned, activations signed. On AVX2 the int16 pair sums of all `pairs` are added
        before widening (part by part, as byte_products then widen_sums do): the caller
        keeps them within int16 (len(pairs) * 2 * 255 * 128 would not be: callers pass at
        most 2 pairs of weights below 64).
        scale (AVX2 only): per row an int32 below 2^15, which multiplies the dots in the
        widening step itself (vpmaddwd by it instead of by ones: ggml's way), so no 32-bit
        multiply follows."""
        if self.kind == "vnni":
            assert scale is None, "VNNI's dots are int32 at once: scale them afterwards"
            for w, x in pairs:
                acc = [self.b.call(self._dpbusd, [acc[0], w[0], x[0]])]
            return acc
        out = []
        for p in range(self.parts):  # part by part: the order LLVM was given and measured on
            sums = None
            for w, x in pairs:
                sums = self._part_products(sums, w[p], x[p])
            out.append(self._widen_part(acc[p], sums, p, scale))
        return out

    def byte_products(self, sums: list | None, w: list, x: list) -> list:
        """AVX2: sums (int16 per pair of bytes; None: none yet) + vpmaddubsw(w, x), the
        products of unsigned weights and signed activations added in pairs, in int16. The
        pair sums saturate at int16 and the additions wrap: the caller keeps every running
        sum within int16."""
        return [self._part_products(None if sums is None else sums[p], w[p], x[p])
                for p in range(self.parts)]

    def widen_sums(self, acc: list, sums: list, scale: list | None = None) -> list:
        """AVX2: acc + the int16 sums widened to int32 in pairs (vpmaddwd by ones, or by
        `scale`: see dot)."""
        return [self._widen_part(acc[p], sums[p], p, scale) for p in range(self.parts)]

    def _part_products(self, sums, w, x):
        """byte_products on one register part's vectors."""
        m = self.b.call(self._maddubs, [w, x])
        return m if sums is None else self.b.add(sums, m)

    def _widen_part(self, acc, sums, p: int, scale: list | None):
        """widen_sums on register part p."""
        by = (ir.Constant(self._i16s, [1] * self._i16s.count) if scale is None
              else self.b.bitcast(self.pair16(scale, scale)[p], self._i16s))
        return self.b.add(acc, self.b.call(self._maddwd, [sums, by]))

    def pair16(self, low: list, high: list) -> list:
        """Per row the int16 pair (low, high) in an int32 (values within int16)."""
        mask, shift = (ir.Constant(self.sums_t, [v] * self.sums_t.count) for v in (0xFFFF, 16))
        return [self.b.or_(self.b.and_(lo, mask), self.b.shl(hi, shift))
                for lo, hi in zip(low, high)]

    def pair_dot(self, acc: list, pairs: list, x_pair: ir.Value) -> list:
        """acc + per row a * u + b * v: `pairs` holds per row two int16 (a low, b high) in
        its int32, `x_pair` the int16 pair (u low, v high) shared by every row. One VNNI
        vpdpwssd, or AVX2 vpmaddwd then an add (exact: no saturation in either)."""
        x = self.splat(x_pair)
        if self.kind == "vnni":
            return [self.b.call(self._dpwssd, [acc[0], self.b.bitcast(pairs[0], self.words_t),
                                               self.b.bitcast(x[0], self.words_t)])]
        return [self.b.add(a, self.b.call(self._maddwd, [self.b.bitcast(p, self.words_t),
                                                         self.b.bitcast(v, self.words_t)]))
                for a, p, v in zip(acc, pairs, x)]

    def signed_dot(self, acc: list, w: list, x: list) -> list:
        """acc + the dots of signed weights w with signed activations x. VNNI: w is stored
        xor 128 (w + 128, unsigned: SIGNED_FLIP), and the caller subtracts 128 * sum(x).
        AVX2: |w| . (x * sign(w)), ggml's way: |w| <= 128 and |x| <= 127 keep the int16 pair
        sums in range."""
        if self.kind == "vnni":
            return self.dot(acc, [(w, x)])
        abs_w = [self.b.call(self._abs, [v, ir.Constant(ir.IntType(1), 0)]) for v in w]
        signed_x = [self.b.call(self._sign, [a, v]) for a, v in zip(x, w)]
        return self.dot(acc, list(zip([abs_w], [signed_x])))

    # --- per-row values: one per output row of the group, as int32 or float32 vectors
    def _part_ptr(self, base, offset, element, p: int):
        lanes = self.sums_t.count
        at = self.b.add(offset, ir.Constant(offset.type, p * lanes))
        return self.b.bitcast(self.b.gep(base, [at]), ir.VectorType(element, lanes).as_pointer())

    def row_bytes(self, base, offset, signed: bool) -> list:
        """The 16 bytes at byte `offset` (one per row) as int32, sign- or zero-extended."""
        ext = self.b.sext if signed else self.b.zext
        if self.ahead:
            self.prefetch(base, offset)
        return [ext(self.b.load(self._part_ptr(base, offset, _I8, p), align=1), self.sums_t)
                for p in self.part_indices]

    def row_byte_vectors(self, base, offset) -> list:
        """The 16 bytes at byte `offset` as byte vectors (bit operations before widening)."""
        if self.ahead:
            self.prefetch(base, offset)
        return [self.b.load(self._part_ptr(base, offset, _I8, p), align=1)
                for p in self.part_indices]

    def widen(self, values: list, signed: bool = False) -> list:
        ext = self.b.sext if signed else self.b.zext
        return [ext(v, self.sums_t) for v in values]

    def row_halves(self, base, offset) -> list:
        """The 16 float16 at byte `offset` (row j at offset + 2j) as float32 vectors."""
        lanes = self.sums_t.count
        if self.ahead:
            self.prefetch(base, offset)
        out = []
        for p in self.part_indices:
            at = self.b.add(offset, ir.Constant(offset.type, 2 * p * lanes))
            ptr = self.b.bitcast(self.b.gep(base, [at]),
                                 ir.VectorType(ir.HalfType(), lanes).as_pointer())
            out.append(self.b.fpext(self.b.load(ptr, align=1),
                                    ir.VectorType(ir.FloatType(), lanes)))
        return out

    def scalar(self, base, index) -> ir.Value:
        return self.b.load(self.b.gep(base, [index]))

    def splat(self, value: ir.Value) -> list:
        """A scalar in every lane of a per-row vector."""
        vec_t = ir.VectorType(value.type, self.sums_t.count)
        one = self.b.insert_element(ir.Constant(vec_t, None), value, ir.Constant(_I32, 0))
        return [self.b.shuffle_vector(one, ir.Constant(vec_t, None),
                                      ir.Constant(ir.VectorType(_I32, vec_t.count),
                                                  [0] * vec_t.count))] * self.parts

    def to_float(self, values: list) -> list:
        return [self.b.sitofp(v, ir.VectorType(ir.FloatType(), self.sums_t.count))
                for v in values]

    def add_to_rows(self, base, offset, values: list) -> None:
        """float32 rows at element `offset` of `base` += values."""
        for p, value in zip(self.part_indices, values):
            ptr = self._part_ptr(base, offset, ir.FloatType(), p)
            self.b.store(self.b.fadd(self.b.load(ptr, align=4), value), ptr, align=4)


def _const(value: int) -> ir.Constant:
    return ir.Constant(ir.IntType(64), value)


def scalar_pair16(b: ir.IRBuilder, low: ir.Value, high: ir.Value) -> ir.Value:
    """The int16 pair (low, high) in an int32 (values within int16)."""
    return b.or_(b.and_(low, ir.Constant(_I32, 0xFFFF)), b.shl(high, ir.Constant(_I32, 16)))


#: tile-blocks ahead of the one being computed whose lines the kernels ask for (prefetch.py):
#: a 9728 x 2560 matrix streamed ran up to 10 % faster at 8 than at 2 on a Zen 4, rows in
#: blocks the same or faster (docs/arithmetic.md, "Prefetching"); a product of one row may
#: ask for none (PREFETCH_ALONE)
PREFETCH_BLOCKS = 8

#: where the kernels ask for those lines (prefetch.emit_prefetch): into L2 only. Asked into
#: L1 as well, they pushed out the activation codes that several rows read again for every
#: tile (on Zen, four rows of Q8_0 or Q6_K are four one-row calls on a tile-block:
#: lone_block); the measurements are in docs/arithmetic.md, "Prefetching"
PREFETCH_LOCALITY = 2

#: activation rows one kernel call takes, sharing each weight load and the block's scales.
#: Four on AVX2 too, although its 16 registers spill some: 9728 x 2560, 8 rows, one core,
#: Haswell build, against two rows a call: Q4_K 90 -> 81 us, Q6_K 121 -> 97 us
BLOCK_ROWS = {"vnni": 4, "avx2": 4, "": 1}


def memory_barrier(builder: ir.IRBuilder, done: tuple = ()) -> None:
    """An empty asm statement that may touch memory: LLVM then cannot reuse a load from before
    it after it (each half of a halves kernel reads its activation bytes itself, instead of
    keeping the first half's in registers through the second). `done`: vectors it takes in
    registers, so they are computed before it: arithmetic is not held back by a barrier
    otherwise, and LLVM kept every sub-block's partial sums of a Q6_K block to multiply at
    the end, spilled to the stack."""
    constraints = ",".join(["v"] * len(done) + ["~{memory}"])
    asm = ir.InlineAsm(ir.FunctionType(ir.VoidType(), [v.type for v in done]), "", constraints,
                       side_effect=True)
    builder.call(asm, list(done))


def _make(body, n_rows: int, ahead: int, form: str | None = None, halves: bool = False):
    """An intrinsic (codes, at, x, x_at, x_step, xd, xd_at, xd_step, xs, xs_at, xs_step, out,
    out_at) -> None that adds `n_rows` activation rows' products with one tile-block
    (int_dots.py) to 16 float32 outputs each: codes uint8 (the tile-block at byte `at`), x int8
    codes (row r's 256 inputs from x_at + r * x_step), xd float32 d, xs int32 the activation
    terms kernel_sums makes of its sums of 16 codes
    (likewise), out float32 (row r's 16 outputs from out_at + 16 r); 1-D contiguous arrays,
    int64 offsets. `body(emitter, pointers, rows)` emits the IR; rows[r] holds row r's offsets
    (x_at, xd_at, xs_at, out_at) and `at` is pointers' companion. Each group read asks for
    the line `ahead` bytes on. form: the instructions ("vnni" or "avx2"; isa()'s by default:
    a VNNI CPU runs AVX2's too, over the same layout for the K-quants)."""

    @intrinsic
    def kernel(typingctx, codes, at, x, x_at, x_step, xd, xd_at, xd_step, xs, xs_at, xs_step,
               out, out_at):
        sig = types.void(codes, at, x, x_at, x_step, xd, xd_at, xd_step, xs, xs_at, xs_step,
                         out, out_at)

        def codegen(context, builder, signature, args):
            def array(i):
                return context.make_array(signature.args[i])(context, builder, args[i]).data

            def int64(i):
                return context.cast(builder, args[i], signature.args[i], types.int64)

            ptrs = [array(i) for i in (0, 2, 5, 8, 11)]
            rows = []
            for r in range(n_rows):
                step = [builder.mul(int64(i), _const(r)) for i in (4, 7, 10)]
                rows.append([builder.add(int64(3), step[0]), builder.add(int64(6), step[1]),
                             builder.add(int64(9), step[2]),
                             builder.add(int64(12), _const(r * ROWS))])
            if halves:  # each half's 8 rows in turn; the first half's reads ask ahead
                for half in (0, 1):
                    if half:
                        memory_barrier(builder)
                    body(Emitter(builder, form or isa(), ahead if half == 0 else 0, half),
                         ptrs, int64(1), rows)
            else:
                body(Emitter(builder, form or isa(), ahead), ptrs, int64(1), rows)
            return context.get_dummy_value()

        return sig, codegen

    return kernel


# ------------------------------------------------------------------ the three types
# Tile-block layouts (int_dots.py packs them; header first, then the code groups):
# Q8_0 (8 blocks): header 8 x 32 bytes, block b's float16 d of row j at 32b + 2j; groups
#     [block][8 groups], the signed codes (xor SIGNED_FLIP).
# Q4_K: header: d at 2j, dmin at 32 + 2j, scale byte k (0..11) of row j at 64 + 16k + j;
#     groups [chunk c][8 groups], byte = input 64c + 4g + i (low nibble, sub-block 2c) and
#     input 64c + 32 + 4g + i (high nibble, sub-block 2c + 1).
# Q6_K: header: int8 scale s of row j at 16s + j, d at 256 + 2j; groups per half n, three
#     runs of 8, Q6_K's own: ql[64n + 4g..], ql[64n + 32 + 4g..], qh[32n + 4g..], stored in
#     the order the kernels read them (q6_k_group).
Q8_0_HEADER, Q4_K_HEADER, Q6_K_HEADER = 256, 256, 288


@njit(inline="always")
def q6_k_group(half, run, g):
    """Where group g (0..7) of run `run` (0: ql's first 32 bytes of the half, 1: its next 32,
    2: qh) of half `half` sits among a Q6_K tile-block's 48 groups: each g's three groups side
    by side, the order every kernel reads them, so a tile-block is read front to back like the
    other types'. Stored run after run (three streams 512 bytes apart), decode steps took
    1.09-1.24x the time (docs/arithmetic.md, "Layout")."""
    return 24 * half + 3 * g + run


def _q8_0(e: Emitter, ptrs, at, rows) -> None:
    codes, x, xd, xs, out = ptrs
    b = e.b
    totals = [None] * len(rows)
    for block in range(8):
        accs = [e.zero() for _ in rows]
        for g in range(8):
            w = e.load(codes, b.add(at, _const(Q8_0_HEADER + (block * 8 + g) * GROUP_BYTES)))
            for r, (x_at, _, _, _) in enumerate(rows):
                xg = e.broadcast(x, b.add(x_at, _const(block * 32 + 4 * g)))
                accs[r] = e.signed_dot(accs[r], w, xg)
        d_w = e.row_halves(codes, b.add(at, _const(32 * block)))
        for r, (_, xd_at, xs_at, _) in enumerate(rows):
            acc = accs[r]
            if e.kind == "vnni":  # (w + 128) . x: less 128 * sum(x) of the block, made here
                x_sum = b.add(e.scalar(xs, b.add(xs_at, _const(2 * block))),
                              e.scalar(xs, b.add(xs_at, _const(2 * block + 1))))
                acc = e.op("sub", acc, e.splat(b.shl(x_sum, ir.Constant(_I32, 7))))
            d = e.op("fmul", d_w, e.splat(e.scalar(xd, b.add(xd_at, _const(block)))))
            term = e.op("fmul", d, e.to_float(acc))
            totals[r] = term if totals[r] is None else e.op("fadd", totals[r], term)
    for r, (_, _, _, out_at) in enumerate(rows):
        e.add_to_rows(out, out_at, totals[r])


def q4_k_header(e: Emitter, codes, at) -> list:
    """A Q4_K tile-block's 12 scale bytes, each as the 16 rows' byte vector."""
    return [e.row_byte_vectors(codes, e.b.add(at, _const(64 + 16 * k))) for k in range(12)]


def q4_k_scale_min(e: Emitter, header, s: int) -> tuple[list, list]:
    """get_scale_min_k4: sub-block s's 6-bit scale and min, per row, as int32 vectors;
    header[k]: scale byte k's vectors (a list of all twelve, or a dict of those s uses)."""
    def const(n):
        return [ir.Constant(v.type, [n] * v.type.count) for v in header[s]]

    if s < 4:
        return (e.widen(e.op("and_", header[s], const(63))),
                e.widen(e.op("and_", header[s + 4], const(63))))
    sc = e.op("or_", e.op("and_", header[s + 4], const(15)),
              e.op("shl", e.op("lshr", header[s - 4], const(6)), const(4)))
    mn = e.op("or_", e.op("lshr", header[s + 4], const(4)),
              e.op("shl", e.op("lshr", header[s], const(6)), const(4)))
    return e.widen(sc), e.widen(mn)


def _q4_k(e: Emitter, ptrs, at, rows) -> None:
    codes, x, xd, xs, out = ptrs
    b = e.b
    low_mask = e.bytes_splat(15)
    # A block of rows loads the scale bytes where they are used (from L1; a memory barrier
    # before each chunk keeps LLVM from holding them): the twelve held through the block
    # beside four rows' accumulators made LLVM spill 46 vector moves a tile-block to the
    # stack, loaded at use 9. A single row spills little and keeps them (loaded at use, its
    # steps took 1.04x). The barrier takes the running totals, so that each chunk's scale
    # multiplies come before the next chunk: without them LLVM sank all four chunks' to the
    # end, spilling 22 vectors of partial sums (none with them; four rows of 9728 x 2560 from
    # L3 took 0.96x the time on VNNI, 0.88x on AVX2, from memory 1.00x; served, within noise:
    # kernels-ab-20261207-2209-q4_k_m-... and -2213-...-avx2).
    lazy = len(rows) > 1
    header = None if lazy else q4_k_header(e, codes, at)
    reload = copy.copy(e)
    reload.ahead = 0

    def scale_min(s: int) -> tuple[list, list]:
        if not lazy:
            return q4_k_scale_min(e, header, s)
        used = (s, s + 4) if s < 4 else (s - 4, s, s + 4)
        loaded = {k: reload.row_byte_vectors(codes, b.add(at, _const(64 + 16 * k))) for k in used}
        return q4_k_scale_min(e, loaded, s)

    def barrier() -> None:
        if lazy:
            memory_barrier(b, tuple(v for total in sum_scaled for v in total))

    n = len(rows)
    sum_scaled = [e.zero() for _ in rows]
    # VNNI sums each sub-block's dots in int32, then multiplies by its scale; AVX2 folds
    # the scale into the widening of the int16 sums (Emitter.widen_sums), straight into the
    # total.
    folded = e.kind != "vnni"
    # VNNI takes the high nibbles in place (byte & 0xF0: 16 x the code, its int32 sums have
    # room) instead of shifting them down: byte shifts share the port with vpdpbusd. Its
    # total is then 16 x the true one (the low sub-blocks' scales times 16 too), shifted back
    # at the end: exact, and within int32 (16 x 8 x 63 x 32 x 15 x 128 < 2^31).
    high_nibble = e.bytes_splat(0xF0)
    four = [ir.Constant(e.sums_t, [4] * e.sums_t.count)] * e.parts

    def x_at(r: int, chunk: int, g: int, high: bool):
        return b.add(rows[r][0], _const(64 * chunk + 32 * high + 4 * g))

    for chunk in range(4):
        barrier()
        if folded and n > 1:
            # AVX2, a block of rows: a sub-block's eight groups summed in int16 (each pair sum
            # of a 4-bit weight's products is within 2 x 15 x 128, eight of them 30720 <
            # 2^15), then widened once, by the scale (vpmaddwd): 9 multiplies a row where two
            # groups a widening (below) take 12; four and eight q4_k_m sequences served 0.89x
            # and 0.92x the time (kernels-ab-20261207-1709-q4_k_m-...-avx2). A single row,
            # bound by the memory, took 1.09x so: it widens every two groups, as ggml does.
            s_low, s_high = [None] * n, [None] * n
            for g in range(8):
                w = e.load(codes, b.add(at, _const(Q4_K_HEADER + (chunk * 8 + g) * GROUP_BYTES)))
                w_low = e.op("and_", w, low_mask)
                w_high = e.op("lshr", w, e.bytes_splat(4))
                for r in range(n):
                    s_low[r] = e.byte_products(s_low[r], w_low,
                                               e.broadcast(x, x_at(r, chunk, g, False)))
                    s_high[r] = e.byte_products(s_high[r], w_high,
                                                e.broadcast(x, x_at(r, chunk, g, True)))
                # A barrier a group, taking its sums: LLVM otherwise hoisted the next groups'
                # broadcasts above them and spilled the int16 sums (a tile-block of four rows
                # had 220 vector instructions with a stack operand, 50 with it; llvm-mca's Zen
                # 3 model 662 -> 625 cycles: benchmarks/kernel_pipes.py). Four and eight rows
                # of the Haswell build, alternated (ad hoc): in cache 0.90-0.95x the time,
                # 9728 x 2560 from memory 0.87-0.98x (a first, shorter run: up to 1.02x).
                memory_barrier(b, tuple(v for sums in s_low + s_high for v in sums))
            sc_low, sc_high = scale_min(2 * chunk)[0], scale_min(2 * chunk + 1)[0]
            for r in range(n):
                sum_scaled[r] = e.widen_sums(sum_scaled[r], s_low[r], sc_low)
                sum_scaled[r] = e.widen_sums(sum_scaled[r], s_high[r], sc_high)
            continue
        if folded:
            low, high = sum_scaled, sum_scaled
            sc_low, sc_high = scale_min(2 * chunk)[0], scale_min(2 * chunk + 1)[0]
        else:
            low, high = [e.zero() for _ in rows], [e.zero() for _ in rows]
            sc_low = sc_high = None
        for g in range(0, 8, 2):
            pairs_low, pairs_high = [[] for _ in rows], [[] for _ in rows]
            for gg in (g, g + 1):
                w = e.load(codes, b.add(at, _const(Q4_K_HEADER + (chunk * 8 + gg) * GROUP_BYTES)))
                w_low = e.op("and_", w, low_mask)
                w_high = (e.op("lshr", w, e.bytes_splat(4)) if folded
                          else e.op("and_", w, high_nibble))
                for r in range(n):
                    pairs_low[r].append((w_low, e.broadcast(x, x_at(r, chunk, gg, False))))
                    pairs_high[r].append((w_high, e.broadcast(x, x_at(r, chunk, gg, True))))
            for r in range(n):
                low[r] = e.dot(low[r], pairs_low[r], sc_low)
                high[r] = e.dot(high[r], pairs_high[r], sc_high)
        if folded:
            continue
        sc_low16 = e.op("shl", scale_min(2 * chunk)[0], four)
        for sc, sums in ((sc_low16, low), (scale_min(2 * chunk + 1)[0], high)):
            for r in range(n):
                sum_scaled[r] = e.op("add", sum_scaled[r], e.op("mul", sc, sums[r]))
    if not folded:
        sum_scaled = [e.op("ashr", t, four) for t in sum_scaled]
    # The mins' term, sum_s m_s * sum_x(s), by pairs of sub-blocks in 16 bits (m_s < 64,
    # |sum_x(s)| <= 32 * 128): one pair dot per two sub-blocks instead of a 32-bit multiply
    # per sub-block; the same integers. The activation's pairs come made (kernel_sums).
    barrier()
    min_pairs = [e.pair16(scale_min(2 * k)[1], scale_min(2 * k + 1)[1]) for k in range(4)]
    sum_mins = []
    for r in range(n):
        xs_at = rows[r][2]
        acc = e.zero()
        for k in range(4):
            acc = e.pair_dot(acc, min_pairs[k], e.scalar(xs, b.add(xs_at, _const(4 * k))))
        sum_mins.append(acc)
    d_w = e.row_halves(codes, at)
    dmin_w = e.row_halves(codes, b.add(at, _const(32)))
    for r, (_, xd_at, _, out_at) in enumerate(rows):
        d_x = e.splat(e.scalar(xd, xd_at))
        d, dmin = e.op("fmul", d_w, d_x), e.op("fmul", dmin_w, d_x)
        e.add_to_rows(out, out_at, e.op("fsub", e.op("fmul", d, e.to_float(sum_scaled[r])),
                                        e.op("fmul", dmin, e.to_float(sum_mins[r]))))


def _q6_k_group(e: Emitter, codes, at, half: int, run: int, g: int) -> list:
    """Group g of run `run` (0, 1: ql; 2: qh) of half `half` of a Q6_K tile-block."""
    return e.load(codes, e.b.add(at, _const(
        Q6_K_HEADER + q6_k_group.py_func(half, run, g) * GROUP_BYTES)))


def _q6_k_codes(e: Emitter, ql: list, qh: list, k: int) -> list:
    """The unsigned 6-bit codes of a group's sub-block k (0..3 within its quarter): ql's low
    (k < 2) or high nibble, qh's bits 2k and 2k + 1 above them (ql is run k % 2's group)."""
    nibble = (e.op("and_", ql, e.bytes_splat(15)) if k < 2
              else e.op("lshr", ql, e.bytes_splat(4)))
    bits = e.op("lshr", qh, e.bytes_splat(2 * k)) if k else qh
    if k != 3:
        bits = e.op("and_", bits, e.bytes_splat(3))
    return e.op("or_", nibble, e.op("shl", bits, e.bytes_splat(4)))


def _q6_k_x(e: Emitter, x, row, half: int, k: int, g: int) -> list:
    """The activation word of a row that sub-block k's group g meets."""
    return e.broadcast(x, e.b.add(row[0], _const(128 * half + 32 * k + 4 * g)))


def _q6_k_scaled(e: Emitter, ptrs, at, rows, totals: list, sums: list, s: int) -> list:
    """totals + sub-block s's scale x (its dots less 32 x its activations' sum, which
    kernel_sums makes), per row."""
    codes, xs = ptrs[0], ptrs[3]
    b = e.b
    sc = e.row_bytes(codes, b.add(at, _const(16 * s)), signed=True)
    out = []
    for total, acc, (_, _, xs_at, _) in zip(totals, sums, rows):
        x_sum = e.scalar(xs, b.add(xs_at, _const(s)))
        out.append(e.op("add", total, e.op("mul", sc, e.op("sub", acc, e.splat(x_sum)))))
    return out


def _q6_k_finish(e: Emitter, ptrs, at, rows, totals: list) -> None:
    """The float step: out += (d_w * d_x) * float(total), per row."""
    codes, xd, out = ptrs[0], ptrs[2], ptrs[4]
    d_w = e.row_halves(codes, e.b.add(at, _const(256)))
    for total, (_, xd_at, _, out_at) in zip(totals, rows):
        d = e.op("fmul", d_w, e.splat(e.scalar(xd, xd_at)))
        e.add_to_rows(out, out_at, e.op("fmul", d, e.to_float(total)))


def _q6_k(e: Emitter, ptrs, at, rows) -> None:
    """Q6_K by quarters: each group's three runs loaded once give the codes of four
    sub-blocks, whose sums run side by side (four accumulators a row): the single row's
    form."""
    codes, x = ptrs[0], ptrs[1]
    n = len(rows)
    totals = [e.zero() for _ in rows]
    for half in range(2):
        for quarter in range(2):  # groups 4q..4q+3: the first or second 16 of each 32
            acc = [[e.zero() for _ in range(4)] for _ in rows]  # [r][k]: sub-block 8n+2k+q
            for g in range(4 * quarter, 4 * quarter + 4, 2):
                pairs = [[[] for _ in range(4)] for _ in rows]
                for gg in (g, g + 1):
                    ql0, ql1, qh = (_q6_k_group(e, codes, at, half, run, gg) for run in range(3))
                    for k in range(4):
                        value = _q6_k_codes(e, ql1 if k % 2 else ql0, qh, k)
                        for r in range(n):
                            pairs[r][k].append((value, _q6_k_x(e, x, rows[r], half, k, gg)))
                for r in range(n):
                    acc[r] = [e.dot(acc[r][k], pairs[r][k]) for k in range(4)]
            for k in range(4):
                totals = _q6_k_scaled(e, ptrs, at, rows, totals, [a[k] for a in acc],
                                      8 * half + 2 * k + quarter)
    _q6_k_finish(e, ptrs, at, rows, totals)


def _q6_k_by_sub_block(e: Emitter, ptrs, at, rows) -> None:
    """Q6_K one sub-block at a time, every row's dots of it, then its scale: one accumulator
    a row, where four a row (_q6_k) with several rows ran out of registers (a block of four
    VNNI rows spilled 155 vector moves a tile-block). Each sub-block loads its groups again
    (from L1), a memory barrier between so that LLVM does not keep them; the first two
    sub-blocks' reads cover all three runs and ask ahead. The form of a block of rows."""
    codes, x = ptrs[0], ptrs[1]
    reload = copy.copy(e)
    reload.ahead = 0
    totals = [e.zero() for _ in rows]
    for half in range(2):
        for quarter in range(2):
            for k in range(4):  # sub-block 8 half + 2k + quarter
                if half or quarter or k:
                    memory_barrier(e.b, tuple(v for total in totals for v in total))
                reader = e if k < 2 else reload
                acc = [e.zero() for _ in rows]
                for g in range(4 * quarter, 4 * quarter + 4, 2):
                    pairs = [[] for _ in rows]
                    for gg in (g, g + 1):
                        ql = _q6_k_group(reader, codes, at, half, k % 2, gg)
                        qh = _q6_k_group(reader, codes, at, half, 2, gg)
                        value = _q6_k_codes(e, ql, qh, k)
                        for r, row in enumerate(rows):
                            pairs[r].append((value, _q6_k_x(e, x, row, half, k, gg)))
                    acc = [e.dot(a, p) for a, p in zip(acc, pairs)]
                totals = _q6_k_scaled(e, ptrs, at, rows, totals, acc, 8 * half + 2 * k + quarter)
    _q6_k_finish(e, ptrs, at, rows, totals)


#: tile-block bytes per type (16 rows x the file's bytes per 256 inputs)
TILE_BLOCK_BYTES = {"q8_0": ROWS * 8 * 34, "q4_k": ROWS * 144, "q6_k": ROWS * 210}
#: bytes ahead of each read that the kernels of a type ask for
AHEAD = {name: TILE_BLOCK_BYTES[name] * PREFETCH_BLOCKS for name in TILE_BLOCK_BYTES}


def halves(n_rows: int) -> bool:
    """Whether the kernel for `n_rows` activation rows emits its body once per half of the 16
    output rows (Emitter's half; memory_barrier between): on AVX2, for a block of rows. With
    the halves side by side, a block of four Q4_K rows keeps eight accumulators and both
    halves' weights and scales live in AVX2's 16 registers, and LLVM spilled about 490 vector
    moves a tile-block to the stack; by halves, 76. Measured on a Zen 4 running the Haswell
    build, the two alternated in one process (benchmarks/avx2_halves.py), time by halves over
    time side by side, 9728 x 2560 from memory, 1 / 4 / 8 rows, two runs
    (`avx2-halves-20261207-0544-...`, `-0557-...`): Q4_K 0.99, 1.10 / 0.74, 0.94 / 0.73,
    0.90; Q6_K 1.03, 1.11 / 1.02, 0.92 / 0.86, 0.90; Q8_0 0.97, 1.18 / 1.04, 0.78 / 0.93,
    1.00 (in the first, four Q6_K or Q8_0 rows still went as four one-row calls:
    lone_block). A single row, which spills little, stays side by side."""
    return isa() == "avx2" and n_rows > 1


#: per type, the kernel for one row and for BLOCK_ROWS[isa()] rows
q8_0_block, q8_0_blocks = (_make(_q8_0, n, AHEAD["q8_0"], halves=halves(n))
                           for n in (1, BLOCK_ROWS[isa()]))
q4_k_block, q4_k_blocks = (_make(_q4_k, n, AHEAD["q4_k"], halves=halves(n))
                           for n in (1, BLOCK_ROWS[isa()]))
q6_k_block, q6_k_blocks = (_make(body, n, AHEAD["q6_k"], halves=halves(n))
                           for body, n in ((_q6_k, 1), (_q6_k_by_sub_block, BLOCK_ROWS[isa()])))

#: what signed weight codes are stored xor, by ISA (signed_dot)
SIGNED_FLIP = {"vnni": 128, "avx2": 0, "": 0}


# ------------------------------------------------------------------ the driver
# Here, beside the intrinsics it inlines: numba's on-disk cache of a function is invalidated
# by its own file only, so a driver in another module would keep running stale kernels after
# this file changed.
Q8_0_KIND, Q4_K_KIND, Q6_K_KIND = 8, 12, 14  # GGML's type numbers
#: activation rows per pass over a tile (its float32 outputs sit on the stack)
CHUNK = 16
#: rows per kernel call
BLOCK = BLOCK_ROWS[isa()]


@lru_cache(maxsize=None)
def host_cpu() -> str:
    """The CPU this runs on, in LLVM's name ("znver5", "sapphirerapids"), whatever numba
    compiles for (NUMBA_CPU_NAME=haswell on a Zen still runs on a Zen)."""
    from llvmlite import binding
    return str(binding.get_host_cpu_name())


def lone_block(kind: int) -> bool:
    """Whether a chunk of exactly BLOCK rows of weight type `kind` takes the BLOCK-row
    kernel: not for Q8_0 in VNNI's instructions on AMD's Zen. There each 256 inputs' call
    then follows the previous one on the same accumulators, and streaming products ran
    slower than one row a call (benchmarks/int_block_rows.py, alternated; Zen 5 prefetching
    into L1: VNNI Q8_0 1.89x, Q4_K 1.75x, Q6_K 2.96x, the AVX2 build then 1.46x, 1.03x,
    1.37x; Zen 4 into L2: Q8_0 1.10-1.45x, Q6_K 1.01-1.40x), while 6 and 8 rows, where
    another call comes between, gained 0.68-1.00x from the block. Q4_K into L2 gained there
    too (0.83-1.01x in six runs over two sessions), so it takes the block everywhere; so does
    Q6_K since its block goes by sub-block (_q6_k_by_sub_block: exactly four rows from memory
    on the Zen 4, 0.75x one row a call, benchmarks/q6_k_block.py), and every type in the
    AVX2 build since its blocks go by halves (`halves`): on the Zen 4 in three runs, Q8_0
    0.88, 0.84, 0.83, Q4_K 0.78, 0.92, Q6_K 0.95, 0.60, 1.04 (eight rows, the control,
    0.94-1.04; `int-block-rows-20261207-0554-avx2`, `-0556-avx2`)."""
    return kind != Q8_0_KIND or isa() == "avx2" or not host_cpu().startswith("znver")


#: per weight type (Q8_0_KIND ..), lone_block's answer on this CPU
LONE_BLOCK = {kind: lone_block(kind) for kind in (Q8_0_KIND, Q4_K_KIND, Q6_K_KIND)}


def prefetch_alone() -> bool:
    """Whether a product of a single activation row asks for lines ahead: not on AMD's Zen,
    whose own prefetcher streams the tile-blocks (read front to back, q6_k_group) faster
    alone. A 9728 x 2560 row streamed on a Zen 4 (benchmarks/prefetch_ahead.py), no hint
    against eight tile-blocks ahead in the same run: Q8_0 0.93-0.97x, Q4_K 0.85-0.94x, Q6_K
    0.93x (the AVX2 build alike, Q6_K 0.70x). Decode steps, the two alternated step by step
    (benchmarks/step_prefetch_alone.py, Q6_K's hint alone on or off): q6_k files 0.86-0.88x,
    q4_k_m 0.90-0.98x, the AVX2 build 0.74-0.84x; but in a slow spell of the machine's memory
    q4_k_m ran 1.07-1.22x without. Rows in blocks took 1.4-2x without the hint."""
    return not host_cpu().startswith("znver")


PREFETCH_ALONE = prefetch_alone()


def alone_form(name: str) -> str | None:
    """The instructions of the kernel of a product of one row of type `name` (_make's form;
    None: the target's): AVX2's for Q6_K on a Zen 4 compiled for VNNI (the same layout, the
    same bits). Decode steps alternated step by step in one process
    (benchmarks/step_prefetch_alone.py --forms, three runs each), Q6_K's one-row kernel in
    AVX2's form against VNNI's: q6_k files 0.95-0.97x, q4_k_m 0.98-0.99x; Q4_K's in AVX2's
    form 0.99-1.03x, so it keeps VNNI's. Alone, one row of a 9728 x 2560 matrix from memory:
    Q6_K 0.90-0.93x, Q4_K 1.12-1.22x. Measured on the Zen 4 only: elsewhere the target's."""
    return "avx2" if name == "q6_k" and isa() == "vnni" and host_cpu() == "znver4" else None


#: per type, the kernel of a product of one row. Compiled into `products`, whose on-disk cache
#: numba keys on its target CPU, not the host: a cache shared by another host under the same
#: NUMBA_CPU_NAME may bring the other choice (speed only: the same bits either way)
q8_0_alone, q4_k_alone, q6_k_alone = (
    block if PREFETCH_ALONE else _make(body, 1, 0, alone_form(name))
    for name, block, body in (("q8_0", q8_0_block, _q8_0), ("q4_k", q4_k_block, _q4_k),
                              ("q6_k", q6_k_block, _q6_k)))

_ACC = CHUNK * ROWS


@njit(cache=True)
def kernel_sums(kind, xs):
    """The activation's sums of 16 codes xs (R, in / 16) as the kernels of weight type `kind`
    use them, made once a product, flat in xs's layout (slot i: the sums from input 16 i on):
    each is then one broadcast from memory in the K-quants' kernels, where loads, adds and
    shifts ran per tile of 16 weight rows (608 times for a 9728-row matrix). The slots:

    * Q4_K, slot 16j + 4k: sub-block 2k's sum (32 codes) and 2k + 1's as an int16 pair (low,
      high) in 256-block j, the mins' pair dot (Emitter.pair_dot);
    * Q6_K, slot s: 32 x the sum, what each sub-block's dots of codes stored + 32 are less;
    * Q8_0: xs itself. The sum of a block premade (128 x, the term VNNI's kernel subtracts:
      SIGNED_FLIP) made a streamed single row 1.11-1.57x slower, and rows in cache no faster.

    Other slots are left unset. Measured on a Zen 4, against the sums made in the kernels,
    the two alternated in one process, time new / old in two runs: 9728 x 2560 from memory,
    1 / 4 / 8 rows, Q4_K 0.97-0.98 / 0.89-0.95 / 0.95-0.96, Q6_K 0.90-0.93 / 0.95-0.97 /
    0.95-0.97; 512 x 2560 in cache, 4 and 8 rows, Q4_K 0.96-0.99, Q6_K 0.91-0.92."""
    flat = xs.reshape(-1)
    if kind == Q8_0_KIND:
        return flat
    out = np.empty_like(flat)
    if kind == Q4_K_KIND:
        for i in range(0, flat.shape[0], 4):
            low, high = flat[i] + flat[i + 1], flat[i + 2] + flat[i + 3]
            out[i] = (low & 0xFFFF) | (high << 16)
    else:
        for i in range(flat.shape[0]):
            out[i] = flat[i] << 5
    return out


@njit(parallel=True, cache=True)
def products(kind, packed, xq, xd, xs, out, lone_block):
    """out (R, tiles * 16) = the activation rows (xq (R, in) int8 codes, xd (R, d per row)
    float32 d, xs (R, in / 16) int32 sums of 16 codes) times the packed matrix: per tile of 16
    rows, per 256 inputs, per activation row, one simd.py kernel: BLOCK rows a call sharing each
    weight load while as many remain, except a chunk of exactly BLOCK rows without lone_block
    (LONE_BLOCK[kind]), which takes one row a call; a product of one row takes the kernel
    PREFETCH_ALONE says. The same bits every way."""
    n_tiles, n_super, tb = packed.shape
    n_rows, n_in = xq.shape
    n_d = xd.shape[1] // n_super  # d per 256 inputs: Q8_0 8, Q8_K 1
    flat, codes, ds = packed.reshape(-1), xq.reshape(-1), xd.reshape(-1)
    sums = kernel_sums(kind, xs)
    for t in prange(n_tiles):
        acc = stack_array(1, _ACC, np.float32)[0]
        for first in range(0, n_rows, CHUNK):  # the tile stays in L2 across chunks
            rows = min(CHUNK, n_rows - first)
            for i in range(rows * ROWS):
                acc[i] = 0
            for sb in range(n_super):
                at = (t * n_super + sb) * tb
                c = 0
                while c < rows:  # BLOCK rows share each weight load, then one at a time
                    r = first + c
                    args = (flat, at, codes, r * n_in + sb * 256, n_in, ds,
                            (r * n_super + sb) * n_d, n_super * n_d, sums,
                            r * (n_in // 16) + sb * 16, n_in // 16, acc, c * ROWS)
                    if rows - c >= BLOCK and (lone_block or rows > BLOCK):
                        if kind == Q8_0_KIND:
                            q8_0_blocks(*args)
                        elif kind == Q4_K_KIND:
                            q4_k_blocks(*args)
                        else:
                            q6_k_blocks(*args)
                        c += BLOCK
                    elif n_rows == 1:  # a product of one row (PREFETCH_ALONE)
                        if kind == Q8_0_KIND:
                            q8_0_alone(*args)
                        elif kind == Q4_K_KIND:
                            q4_k_alone(*args)
                        else:
                            q6_k_alone(*args)
                        c += 1
                    else:
                        if kind == Q8_0_KIND:
                            q8_0_block(*args)
                        elif kind == Q4_K_KIND:
                            q4_k_block(*args)
                        else:
                            q6_k_block(*args)
                        c += 1
            for c in range(rows):
                for j in range(ROWS):
                    out[first + c, t * ROWS + j] = acc[c * ROWS + j]
