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

from functools import lru_cache

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

ROWS = 16  # output rows per group: one VNNI register of int32 sums
GROUP_BYTES = 64  # ROWS x 4 inputs

_I8, _I16, _I32 = ir.IntType(8), ir.IntType(16), ir.IntType(32)


@lru_cache(maxsize=None)
def isa() -> str:
    """"vnni" (AVX-512 F, BW and VNNI), "avx2", or "" (no integer kernels), for the CPU numba
    compiles for."""
    from numba.core import config
    from numba.core.codegen import get_host_cpu_features
    features = config.CPU_FEATURES if config.CPU_FEATURES is not None \
        else get_host_cpu_features()
    on = {f[1:] for f in str(features).split(",") if f.startswith("+")}
    if {"avx512f", "avx512bw", "avx512vnni"} <= on:
        return "vnni"
    if "avx2" in on:
        return "avx2"
    return ""


# ------------------------------------------------------------------------ IR building
class _Emitter:
    """One ISA's forms of: load a 64-byte group, bit operations on it, and accumulate its dot
    with 4 activation bytes. A group value is a list of vectors (one <64 x i8> on VNNI, two
    <32 x i8> on AVX2); an accumulator likewise (<16 x i32>, or two <8 x i32>)."""

    def __init__(self, builder: ir.IRBuilder, kind: str):
        self.b = builder
        self.kind = kind
        self.parts = 1 if kind == "vnni" else 2
        width = GROUP_BYTES // self.parts
        self.bytes_t = ir.VectorType(_I8, width)
        self.sums_t = ir.VectorType(_I32, ROWS // self.parts)
        mod = builder.module
        if kind == "vnni":
            self._dpbusd = cgutils.get_or_insert_function(
                mod, ir.FunctionType(self.sums_t, [self.sums_t, self.bytes_t, self.bytes_t]),
                "llvm.x86.avx512.vpdpbusd.512")
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

    def splat(self, value: int) -> list:
        return [ir.Constant(self.bytes_t, [value] * self.bytes_t.count)] * self.parts

    def zero(self) -> list:
        return [ir.Constant(self.sums_t, [0] * self.sums_t.count)] * self.parts

    def load(self, base, offset) -> list:
        """The group at byte `offset` (an i64 value) of the uint8 pointer `base`."""
        out = []
        for p in range(self.parts):
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

    def dot(self, acc: list, pairs: list) -> list:
        """acc + sum over (weights, activations) in `pairs` of their 4-byte dots; weights
        unsigned, activations signed. On AVX2 the int16 pair sums of all `pairs` are added
        before widening: the caller keeps them within int16 (len(pairs) * 2 * 255 * 128 would
        not be: callers pass at most 2 pairs of weights below 64)."""
        if self.kind == "vnni":
            for w, x in pairs:
                acc = [self.b.call(self._dpbusd, [acc[0], w[0], x[0]])]
            return acc
        out = []
        ones = ir.Constant(self._i16s, [1] * self._i16s.count)
        for p in range(self.parts):
            s = None
            for w, x in pairs:
                m = self.b.call(self._maddubs, [w[p], x[p]])
                s = m if s is None else self.b.add(s, m)
            out.append(self.b.add(acc[p], self.b.call(self._maddwd, [s, ones])))
        return out

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

    def store(self, acc: list, base, offset) -> None:
        """The 16 int32 sums at int32 index `offset` of the int32 pointer `base`."""
        for p in range(self.parts):
            at = self.b.add(offset, ir.Constant(offset.type, p * self.sums_t.count))
            ptr = self.b.bitcast(self.b.gep(base, [at]), self.sums_t.as_pointer())
            self.b.store(acc[p], ptr, align=4)


def _const(value: int) -> ir.Constant:
    return ir.Constant(ir.IntType(64), value)


def _make(body):
    """An intrinsic (codes, at, x, x_at, sums) -> None: `body(emitter, codes_ptr, at, x_ptr,
    x_at, sums_ptr)` emits the IR; codes uint8, x int8 and sums int32 are 1-D contiguous
    arrays, at / x_at int64 offsets into codes and x."""

    @intrinsic
    def kernel(typingctx, codes, at, x, x_at, sums):
        sig = types.void(codes, at, x, x_at, sums)

        def codegen(context, builder, signature, args):
            def data(i):
                return context.make_array(signature.args[i])(context, builder, args[i]).data

            at, x_at = (context.cast(builder, args[i], signature.args[i], types.int64)
                        for i in (1, 3))
            body(_Emitter(builder, isa()), data(0), at, data(2), x_at, data(4))
            return context.get_dummy_value()

        return sig, codegen

    return kernel


# ------------------------------------------------------------------ the three types
def _q8_0(e: _Emitter, codes, at, x, x_at, sums) -> None:
    """8 Q8_0 blocks of 16 rows (8 groups each, signed codes) against 256 activation codes:
    sums[b * 16 + j] = block b's integer dot for row j."""
    for block in range(8):
        acc = e.zero()
        for g in range(8):
            w = e.load(codes, e.b.add(at, _const((block * 8 + g) * GROUP_BYTES)))
            acc = e.signed_dot(acc, w, e.broadcast(x, e.b.add(x_at, _const(block * 32 + 4 * g))))
        e.store(acc, sums, _const(block * ROWS))


def _q4_k(e: _Emitter, codes, at, x, x_at, sums) -> None:
    """One Q4_K block of 16 rows (4 chunks x 8 groups; a byte's low nibble is an input of
    sub-block 2c, its high nibble the same input of sub-block 2c + 1) against its 256
    activation codes: sums[s * 16 + j] = sub-block s's integer dot for row j."""
    low_mask = e.splat(15)
    for chunk in range(4):
        low, high = e.zero(), e.zero()
        for g in range(0, 8, 2):
            pairs_low, pairs_high = [], []
            for gg in (g, g + 1):
                w = e.load(codes, e.b.add(at, _const((chunk * 8 + gg) * GROUP_BYTES)))
                xl = e.broadcast(x, e.b.add(x_at, _const(64 * chunk + 4 * gg)))
                xh = e.broadcast(x, e.b.add(x_at, _const(64 * chunk + 32 + 4 * gg)))
                pairs_low.append((e.op("and_", w, low_mask), xl))
                pairs_high.append((e.op("lshr", w, e.splat(4)), xh))
            low, high = e.dot(low, pairs_low), e.dot(high, pairs_high)
        e.store(low, sums, _const(2 * chunk * ROWS))
        e.store(high, sums, _const((2 * chunk + 1) * ROWS))


def _q6_k(e: _Emitter, codes, at, x, x_at, sums) -> None:
    """One Q6_K block of 16 rows against its 256 activation codes: sums[s * 16 + j] =
    sub-block s's (16 inputs) integer dot of the unsigned 6-bit codes (0..63) for row j; the
    caller subtracts 32 * the sub-block's activation sum. Per half n of the block, per group g:
    three groups of bytes, ql0 = ql[64n + 4g..], ql1 = ql[64n + 32 + 4g..], qh = qh[32n + 4g..]
    (Q6_K's own byte order: int_dots.py), giving inputs 128n + 32k + 4g.. for k = 0..3."""
    low_mask, two = e.splat(15), e.splat(3)
    for half in range(2):
        base = half * 24 * GROUP_BYTES
        acc = [e.zero() for _ in range(8)]  # [k * 2 + (g >= 4)]: sub-block 8n + 2k + g // 4
        for g in range(8):
            ql0 = e.load(codes, e.b.add(at, _const(base + g * GROUP_BYTES)))
            ql1 = e.load(codes, e.b.add(at, _const(base + (8 + g) * GROUP_BYTES)))
            qh = e.load(codes, e.b.add(at, _const(base + (16 + g) * GROUP_BYTES)))
            values = [
                e.op("or_", e.op("and_", ql0, low_mask), e.op("shl", e.op("and_", qh, two),
                                                               e.splat(4))),
                e.op("or_", e.op("and_", ql1, low_mask),
                     e.op("shl", e.op("and_", e.op("lshr", qh, e.splat(2)), two), e.splat(4))),
                e.op("or_", e.op("lshr", ql0, e.splat(4)),
                     e.op("shl", e.op("and_", e.op("lshr", qh, e.splat(4)), two), e.splat(4))),
                e.op("or_", e.op("lshr", ql1, e.splat(4)),
                     e.op("shl", e.op("lshr", qh, e.splat(6)), e.splat(4))),
            ]
            for k, v in enumerate(values):
                xk = e.broadcast(x, e.b.add(x_at, _const(128 * half + 32 * k + 4 * g)))
                slot = 2 * k + g // 4
                acc[slot] = e.dot(acc[slot], [(v, xk)])
        for k in range(4):
            for upper in range(2):
                e.store(acc[2 * k + upper], sums, _const((8 * half + 2 * k + upper) * ROWS))


q8_0_sums = _make(_q8_0)
q4_k_sums = _make(_q4_k)
q6_k_sums = _make(_q6_k)

#: what signed weight codes are stored xor, by ISA (signed_dot)
SIGNED_FLIP = {"vnni": 128, "avx2": 0, "": 0}
