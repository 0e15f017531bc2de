"""numba kernel: attention of the newest query row over every visible position (a decode step,
a Fast-AR call), reading K and V where they are held: float32, or float16 as its int16 bits.

Why it is written this way: at 2048 cached positions a real-size layer reads 8.4 MB of f16
K/V, ~0.25 ms at what two cores read here, yet the kernel written as plain numba loops took
~1.1-1.2 ms, 4.1x that read (a step at 2048 positions cost 1.35-1.42x the step at 256; the
target is 1.15x). Measured on the kernel alone (benchmarks/attention_kernel.py), the causes
were:

* numba compiles for 256-bit vectors on AVX-512 CPUs (LLVM's "prefer-256-bit" tuning): at
  that width the 4 heads x 64 columns of V sums did not fit the registers, and every
  multiply-add loaded and stored its sum on the stack. The products are written here as
  LLVM IR on vectors of the register's width (`_Vectors`; 16 float32 on AVX-512, 8 on
  AVX2), with as many sums as fit half the registers (`SCORE_ROWS`, `COLUMNS`).
* A row's 4 dot products each ended in its own sum across lanes (~40 % of the
  instructions), and every vector of q was loaded again for each K row: now SCORE_ROWS rows
  share the loads of q and one tree of shuffles sums all their lanes
  (`_Vectors.lane_sums`).
* The softmax called libm's expf one value at a time and took its maximum in a chain LLVM
  does not vectorize (~0.2 of ~2 ms on one core): `_exp` is a polynomial LLVM vectorizes,
  `_vector_max` a vector maximum.
* V was read in passes of 64 columns over all its rows: now each pass runs over a few rows
  (`V_ROWS_BYTES`) before the next takes them from L1 (5-10 % of the kernel).
* On this machine a loop that computes as much as these per value read streams memory far
  slower than a plain read does (a layer's K read alone: 0.15 ms; with 8 multiply-adds per
  16 values: 0.37 ms; the same asking for each line 2 KB ahead: 0.18 ms). Every K and V
  line is asked for `AHEAD_BYTES` ahead, one prefetch as each line is read (a burst of all
  of a row's lines at once measured slower than none): the kernel went from 1.8x to ~1.4x
  the plain read of its bytes where it was first measured. On a Zen 4 the same took
  1.7-2.1x; asked into L2 only (`PREFETCH_LOCALITY`), 16 KB ahead, 1.2-1.3x there.

At 2048 positions (f16, two cores, 36 layers' caches in memory) the kernel now takes
1.2-1.3x the plain read of its bytes on a Zen 4 (0.30-0.35 ms a layer). From L2 a K row's
scores take ~9.6 ns and a V row's sums ~8 ns on one core, about what their 64 multiply-adds
and 16 float16 conversions take at two vector instructions a cycle.

Numbers: float32 throughout. A dot product is summed in vector lanes (multiply-adds fused
where the CPU has them), then across the lanes in a fixed tree; results agree with ops.py to
float32 rounding. Every sum over positions runs in position order across the blocks (a
shared prefix, the cache, the call's own rows): each lane of a V sum continues from one
block into the next, a row's score is computed alike wherever its block starts, and the
softmax runs over the scores of all the blocks in one array. So positions give the same
numbers, bit for bit, whichever blocks hold them: `Server` (a voice's rows shared) and
`speak()` (copied into the cache) agree bit for bit (tests/test_attention_kernel.py).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from . import kernel_cache  # noqa: F401  (first: numba's cache follows every source here)
from .f16 import as_float32, value_f32, widen_half_lanes
from .ops import KV, Keys
from .prefetch import emit_prefetch


@lru_cache(maxsize=None)
def _target() -> tuple[str, set]:
    """(triple, enabled features) of the CPU numba compiles for (NUMBA_CPU_NAME /
    NUMBA_CPU_FEATURES, or the host)."""
    from numba.core.registry import cpu_target
    triple, _, features = cpu_target.target_context.codegen().magic_tuple()
    return triple, {f[1:] for f in features.split(",") if f.startswith("+")}


def _aarch64() -> bool:
    return _target()[0].startswith(("aarch64", "arm64"))


def _fused() -> bool:
    """Whether the target has fused multiply-adds (x86's FMA3, every AArch64); elsewhere
    LLVM would call a runtime function for them, which numba does not link."""
    return _aarch64() or "fma" in _target()[1]


def vector_shape() -> tuple[int, int]:
    """(float32 lanes of a vector register, vector registers) of the target: AVX-512 16 and
    32, AVX and AVX2 8 and 16, AArch64 4 and 32, other x86 (SSE) 4 and 16."""
    features = _target()[1]
    if "avx512f" in features:
        return 16, 32
    if "avx" in features:
        return 8, 16
    return 4, 32 if _aarch64() else 16


#: float32 lanes of the vectors the IR below computes on
LANES, _REGISTERS = vector_shape()
#: query heads that share one pass over their KV head's K and V rows
HEADS = 4
#: K rows whose HEADS dot products are computed together: their sums take half the registers
SCORE_ROWS = _REGISTERS // (2 * HEADS)
#: columns of V summed in one pass: their HEADS x COLUMNS sums take half the registers
COLUMNS = LANES * (_REGISTERS // (2 * HEADS))
#: bytes of V rows each pass over COLUMNS columns runs over before the next pass takes them
#: from L1 (a third of a 48 KB L1)
V_ROWS_BYTES = 16384
#: how far ahead of the K or V line being read the kernels ask for one (~64 f16 rows of 128)
AHEAD_BYTES = 16384
#: where they ask for it (prefetch.emit_prefetch): into L2 only. On a Zen 4, at 2048
#: positions, the f16 kernel took 1.19-1.32x the plain read of its bytes on two cores this
#: way against 1.72-2.11x asking into L1 8 KB ahead (one core 1.39-1.51x against 2.39-2.40x;
#: the f32 cache 1.24-1.29x against 1.83-2.32x), the trees alternated three times
#: (benchmarks/attention_kernel.py, docs/arithmetic.md "Prefetching")
PREFETCH_LOCALITY = 2
#: bytes of a cache line: one prefetch each
_LINE = 64

_F32 = ir.FloatType()
_I32 = ir.IntType(32)
_I64 = ir.IntType(64)


# ------------------------------------------------------------------------------ IR
def _itemsize(array_type) -> int:
    return 4 if array_type.dtype == types.float32 else 2


class _Vectors:
    """Emits LLVM IR on vectors of LANES float32 inside a numba intrinsic: loads from a numba
    array (float32, or float16 as int16 bits, widened exactly), multiply-adds, sums across
    lanes, loops and prefetches."""

    def __init__(self, context, builder):
        self.context, self.b = context, builder
        self.type = ir.VectorType(_F32, LANES)

    # --- arguments
    def data(self, array_type, value):
        """The array's data pointer."""
        return self.context.make_array(array_type)(self.context, self.b, value).data

    def int64(self, value, value_type):
        return self.context.cast(self.b, value, value_type, types.int64)

    def int64s(self, value, value_type) -> list:
        """A UniTuple of integers as i64 values."""
        return [self.int64(self.b.extract_value(value, i), value_type.dtype)
                for i in range(value_type.count)]

    def const(self, n: int) -> ir.Constant:
        return ir.Constant(_I64, n)

    # --- values
    def zero(self) -> ir.Constant:
        return ir.Constant(self.type, [0.0] * LANES)

    def load(self, data, array_type, at) -> ir.Value:
        """LANES values from element `at` on, as float32."""
        ptr = self.b.gep(data, [at])
        if array_type.dtype == types.float32:
            return self.b.load(self.b.bitcast(ptr, self.type.as_pointer()), align=4)
        bits_type = ir.VectorType(ir.IntType(16), LANES)
        return widen_half_lanes(self.b, self.b.load(self.b.bitcast(ptr, bits_type.as_pointer()),
                                                    align=2))

    def load_sums(self, data, at) -> ir.Value:
        """LANES float32 from element `at` of a float32 array."""
        return self.b.load(self.b.bitcast(self.b.gep(data, [at]), self.type.as_pointer()),
                           align=4)

    def store_sums(self, value, data, at) -> None:
        self.b.store(value, self.b.bitcast(self.b.gep(data, [at]), self.type.as_pointer()),
                     align=4)

    def multiply_add(self, a, c, acc) -> ir.Value:
        """acc + a * c: one fused multiply-add where the target has them, else a product and
        a sum; the same instruction wherever it is called (a row's numbers must not depend
        on which loop computed them)."""
        if not _fused():
            return self.b.fadd(self.b.fmul(a, c), acc)
        fn = cgutils.get_or_insert_function(
            self.b.module, ir.FunctionType(self.type, [self.type] * 3), f"llvm.fma.v{LANES}f32")
        return self.b.call(fn, [a, c, acc])

    def splat(self, x: ir.Value) -> ir.Value:
        """A float32 in every lane."""
        one = self.b.insert_element(ir.Constant(self.type, None), x, ir.Constant(_I32, 0))
        return self._take(one, one, [0] * LANES)

    def _take(self, x, y, lanes: list) -> ir.Value:
        """The lanes of x (0 .. LANES - 1) and y (LANES ..) listed, as one vector."""
        return self.b.shuffle_vector(x, y, ir.Constant(ir.VectorType(_I32, LANES), lanes))

    def lane_sums(self, vectors: list) -> list:
        """The sums of each vector's lanes, many vectors at once: groups of LANES vectors (or
        all of them, if fewer) are paired into one vector, each pair adding the halves, then
        quarters, ... of its two vectors side by side; the lanes left to each vector are then
        added within the vector. Each vector's lanes are added in one order, lane i with
        i + LANES/2, then with i + LANES/4, ..., i + 1, however many vectors go with it:
        `lane_of` says where each sum lands."""
        n = LANES
        out = []
        for first in range(0, len(vectors), n):
            level, width = vectors[first:first + n], n  # width: lanes each vector still holds
            while len(level) > 1:
                half = width // 2
                low = [i for v in range(0, n, width) for i in range(v, v + half)]
                high = [i + half for i in low]
                level = [self.b.fadd(self._take(x, y, low + [n + i for i in low]),
                                     self._take(x, y, high + [n + i for i in high]))
                         for x, y in zip(level[::2], level[1::2])]
                width = half
            total, step = level[0], width // 2
            while step:
                total = self.b.fadd(total, self._take(total, total, [i ^ step for i in range(n)]))
                step //= 2
            out.append(total)
        return out

    @staticmethod
    def lane_of(index: int, count: int) -> tuple[int, int]:
        """(vector, lane) of lane_sums' result that holds the sum of vector `index` of the
        `count` summed."""
        return index // LANES, (index % LANES) * (LANES // min(count, LANES))

    def store_lanes(self, vectors: list, places: list, data, at) -> None:
        """data[at + r] = vectors[v][lane] for the (v, lane) places[r]: one store of them
        all where they are side by side in one vector (lane_sums gives a head's rows so)."""
        v, first = places[0]
        if len(places) > 1 and places == [(v, first + r) for r in range(len(places))]:
            lanes = ir.VectorType(_F32, len(places))
            part = self.b.shuffle_vector(vectors[v], vectors[v], ir.Constant(
                ir.VectorType(_I32, len(places)), list(range(first, first + len(places)))))
            self.b.store(part, self.b.bitcast(self.b.gep(data, [at]), lanes.as_pointer()),
                         align=4)
            return
        for r, (v, lane) in enumerate(places):
            self.b.store(self.b.extract_element(vectors[v], _I32(lane)),
                         self.b.gep(data, [self.b.add(at, self.const(r))]))

    # --- control
    def loop(self, count):
        """for index in range(count) (an i64), as cgutils.for_range."""
        return cgutils.for_range(self.b, count)

    def variables(self, n: int) -> list:
        """n vector variables (allocas of the function's entry: LLVM keeps them in
        registers)."""
        return [cgutils.alloca_once(self.b, self.type) for _ in range(n)]

    def prefetch(self, data, at) -> None:
        """Ask for the cache line holding element `at` into L2 (x86 and ARM prefetches
        never fault: past the end of the array too)."""
        emit_prefetch(self.b, self.b.gep(data, [at]), PREFETCH_LOCALITY)


@intrinsic
def _vector_scores(typingctx, q, q_at, k, k_at, rows, d, w, w_at, scale):
    """w[w_at[g] + j] = scale * sum_i q[q_at[g] + i] * k[k_at + j * d + i] for the block's
    rows j < rows and the HEADS query rows g, over the whole vectors of a row (i < d -
    d % LANES): q, w float32, k float32 or int16 (float16 bits); flat offsets.

    SCORE_ROWS rows at a time share each load of the queries, and their HEADS x SCORE_ROWS
    dot products are summed across lanes in one tree. The rows past the last group go one
    at a time, each product and lane added in the same order: a row's score does not
    depend on where its block starts. Each line read asks for the line AHEAD_BYTES
    further on."""
    sig = types.void(q, q_at, k, k_at, rows, d, w, w_at, scale)

    def codegen(context, builder, signature, args):
        e = _Vectors(context, builder)
        q_type, k_type = signature.args[0], signature.args[2]
        qd, kd, wd = (e.data(signature.args[i], args[i]) for i in (0, 2, 6))
        q_at, w_at = e.int64s(args[1], signature.args[1]), e.int64s(args[7], signature.args[7])
        k_at, rows, d = (e.int64(args[i], signature.args[i]) for i in (3, 4, 5))
        vectors = builder.sdiv(d, e.const(LANES))
        scale = e.splat(args[8])
        per_line = _LINE // _itemsize(k_type)
        ahead = e.const(AHEAD_BYTES // _itemsize(k_type))

        def score(first, n: int) -> None:
            """Rows first .. first + n - 1."""
            sums = e.variables(HEADS * n)  # [head][row]
            for s in sums:
                builder.store(e.zero(), s)
            starts = [builder.add(k_at, builder.mul(builder.add(first, e.const(r)), d))
                      for r in range(n)]
            with e.loop(vectors) as vector:
                i = builder.mul(vector.index, e.const(LANES))
                queries = [e.load(qd, q_type, builder.add(at, i)) for at in q_at]
                new_line = builder.icmp_signed("==", builder.srem(i, e.const(per_line)),
                                               e.const(0))
                for r, start in enumerate(starts):
                    with builder.if_then(new_line):  # one line at a time, as they are read
                        e.prefetch(kd, builder.add(builder.add(start, i), ahead))
                    key = e.load(kd, k_type, builder.add(start, i))
                    for g, query in enumerate(queries):
                        s = sums[g * n + r]
                        builder.store(e.multiply_add(query, key, builder.load(s)), s)
            totals = [builder.fmul(t, scale) for t in e.lane_sums([builder.load(s)
                                                                    for s in sums])]
            for g, at in enumerate(w_at):
                e.store_lanes(totals, [e.lane_of(g * n + r, HEADS * n) for r in range(n)],
                              wd, builder.add(at, first))

        groups = builder.sdiv(rows, e.const(SCORE_ROWS))
        with e.loop(groups) as group:
            score(builder.mul(group.index, e.const(SCORE_ROWS)), SCORE_ROWS)
        grouped = builder.mul(groups, e.const(SCORE_ROWS))
        with e.loop(builder.sub(rows, grouped)) as row:
            score(builder.add(grouped, row.index), 1)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def _vector_weighted_rows(typingctx, sums, w, w_at, v, v_at, rows, d):
    """sums[g, c] += sum_j w[w_at[g] + j] * v[v_at + j * d + c] over the block's rows
    j < rows in order, for the HEADS heads g and the columns c < d - d % COLUMNS: sums
    (HEADS, d) float32, v float32 or int16 (float16 bits); flat offsets (v_at: the block's
    first row).

    COLUMNS columns a pass, their HEADS x COLUMNS sums in registers, over V_ROWS_BYTES of
    rows at a time (the later passes find those rows in L1); each line read asks for the
    line AHEAD_BYTES further on."""
    sig = types.void(sums, w, w_at, v, v_at, rows, d)

    def codegen(context, builder, signature, args):
        e = _Vectors(context, builder)
        v_type = signature.args[3]
        sd, wd, vd = (e.data(signature.args[i], args[i]) for i in (0, 1, 3))
        w_at = e.int64s(args[2], signature.args[2])
        v_at, rows, d = (e.int64(args[i], signature.args[i]) for i in (4, 5, 6))
        ahead = e.const(AHEAD_BYTES // _itemsize(v_type))
        per_block = builder.sdiv(e.const(V_ROWS_BYTES), builder.mul(d, e.const(
            _itemsize(v_type))))
        per_block = builder.select(builder.icmp_signed(">", per_block, e.const(0)), per_block,
                                   e.const(1))
        n_vectors = COLUMNS // LANES
        acc = e.variables(HEADS * n_vectors)  # [head][vector]
        blocks = builder.sdiv(builder.add(rows, builder.sub(per_block, e.const(1))), per_block)
        with e.loop(blocks) as block:
            first = builder.mul(block.index, per_block)
            left = builder.sub(rows, first)
            count = builder.select(builder.icmp_signed("<", left, per_block), left, per_block)
            with e.loop(builder.sdiv(d, e.const(COLUMNS))) as pass_:
                column = builder.mul(pass_.index, e.const(COLUMNS))
                homes = [builder.add(builder.mul(e.const(g), d), builder.add(
                    column, e.const(c * LANES))) for g in range(HEADS) for c in range(n_vectors)]
                for a, home in zip(acc, homes):
                    builder.store(e.load_sums(sd, home), a)
                with e.loop(count) as r:
                    j = builder.add(first, r.index)
                    start = builder.add(v_at, builder.mul(j, d))
                    weights = [e.splat(builder.load(builder.gep(wd, [builder.add(at, j)])))
                               for at in w_at]
                    for c in range(n_vectors):
                        at = builder.add(start, builder.add(column, e.const(c * LANES)))
                        if c * LANES * _itemsize(v_type) % _LINE == 0:
                            e.prefetch(vd, builder.add(at, ahead))
                        value = e.load(vd, v_type, at)
                        for g, weight in enumerate(weights):
                            a = acc[g * n_vectors + c]
                            builder.store(e.multiply_add(weight, value, builder.load(a)), a)
                for a, home in zip(acc, homes):
                    e.store_sums(builder.load(a), sd, home)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def _vector_max(typingctx, x, at, n):
    """max(x[at + i]) over the whole vectors of i < n (-inf if none), NaNs passed over:
    x float32, a flat offset."""
    sig = types.float32(x, at, n)

    def codegen(context, builder, signature, args):
        e = _Vectors(context, builder)
        xd = e.data(signature.args[0], args[0])
        at, n = (e.int64(args[i], signature.args[i]) for i in (1, 2))
        top = e.variables(1)[0]
        builder.store(ir.Constant(e.type, [float("-inf")] * LANES), top)
        with e.loop(builder.sdiv(n, e.const(LANES))) as vector:
            value = e.load_sums(xd, builder.add(at, builder.mul(vector.index, e.const(LANES))))
            old = builder.load(top)
            builder.store(builder.select(builder.fcmp_ordered(">", value, old), value, old), top)
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_F32, [e.type]),
                                            f"llvm.vector.reduce.fmax.v{LANES}f32")
        return builder.call(fn, [builder.load(top)])

    return sig, codegen


# -------------------------------------------------------------------------- kernel
@njit(inline="always")
def _four(first, group, g0):
    """Rows first + g0 .. first + g0 + 3, the ones past the group repeating its last
    (computed and not stored)."""
    last = first + group - 1
    return (first + g0, min(first + g0 + 1, last), min(first + g0 + 2, last),
            min(first + g0 + 3, last))


@njit(inline="always")
def _scores(q, heads, n, k, rows, hk, w, w_rows, offset, scale):
    """w[w_rows[g], offset + j] = q[heads[g]] . k[hk, j] * scale for the block's rows
    j < rows, for the first n of the HEADS heads (each K row is read once for all of them);
    the columns past the last whole vector are added one at a time."""
    d = q.shape[1]
    end = w.shape[1]
    _vector_scores(q, (heads[0] * d, heads[1] * d, heads[2] * d, heads[3] * d),
                   k, hk * k.shape[1] * d, rows, d,
                   w, (w_rows[0] * end + offset, w_rows[1] * end + offset,
                       w_rows[2] * end + offset, w_rows[3] * end + offset), scale)
    if d % LANES:
        for g in range(n):
            for j in range(rows):
                w[w_rows[g], offset + j] += _tail_dot(q, heads[g], k, hk, j, d - d % LANES) \
                    * scale


@njit
def _tail_dot(q, h, k, hk, j, first):
    """sum_{i >= first} q[h, i] * k[hk, j, i], one term after another (no fastmath: the
    same order for a float16 and a float32 block, which LLVM might vectorize unalike)."""
    s = np.float32(0.0)
    for i in range(first, q.shape[1]):
        s += q[h, i] * value_f32(k[hk, j, i])
    return s


#: exp(x) = 2^n exp(r), x = n ln 2 + r, |r| <= ln(2) / 2: ln 2 in two parts (the first has
#: few bits, so n times it is exact) and Cephes' polynomial for exp(r), as its expf (~1 ulp)
_LN2_HIGH, _LN2_LOW = np.float32(0.693359375), np.float32(-2.12194440e-4)
_LOG2E = np.float32(1.44269504088896341)
_EXP_POLY = (np.float32(1.9875691500e-4), np.float32(1.3981999507e-3),
             np.float32(8.3334519073e-3), np.float32(4.1665795894e-2),
             np.float32(1.6666665459e-1), np.float32(5.0000001201e-1))
#: exp(-87) ~ 1.6e-38, near float32's smallest normal: lower arguments are taken as this,
#: which no softmax weight next to the top score's exp(0) = 1 can tell from 0
_EXP_LOWEST = np.float32(-87.0)


@njit(inline="always")
def _exp(x):
    """exp(x) for x <= 0 (a score less the top score), NaN staying NaN: a polynomial LLVM
    vectorizes (libm's expf is called one value at a time)."""
    if x != x:
        return x
    x = max(x, _EXP_LOWEST)
    n = np.floor(x * _LOG2E + np.float32(0.5))
    r = x - n * _LN2_HIGH - n * _LN2_LOW
    p = _EXP_POLY[0]
    p = p * r + _EXP_POLY[1]
    p = p * r + _EXP_POLY[2]
    p = p * r + _EXP_POLY[3]
    p = p * r + _EXP_POLY[4]
    p = p * r + _EXP_POLY[5]
    two_n = as_float32((np.int32(n) + np.int32(127)) << np.int32(23))
    return (p * r * r + r + np.float32(1.0)) * two_n


@njit(inline="always")
def _softmax(w, group, end):
    """Each row g < group of w[:, :end] through a softmax, in place."""
    for g in range(group):
        top = _vector_max(w, g * w.shape[1], end)  # NaNs reach the output through their exp
        for j in range(end - end % LANES, end):
            top = max(top, w[g, j])
        total = np.float32(0.0)
        for j in range(end):
            e = _exp(w[g, j] - top)
            w[g, j] = e
            total += e
        inverse = np.float32(1.0) / total  # one division: a vector division costs ~10 products
        for j in range(end):
            w[g, j] *= inverse


@njit
def _column(w, g, v, rows, hk, offset, i, s):
    """s + sum_j w[g, offset + j] * v[hk, j, i] over the block's rows, one after another
    (no fastmath: the order of the positions, whichever block holds them)."""
    for j in range(rows):
        s += w[g, offset + j] * value_f32(v[hk, j, i])
    return s


@njit(inline="always")
def _weighted_rows(w, w_rows, n, v0, n0, v1, n1, v2, n2, hk, first, out):
    """out[first + g] = sum_j w[w_rows[g], j] * V[j] for the first n of the HEADS heads, V's
    rows j held in the blocks v0, v1, v2 one after another (the first n0, n1, n2 rows of
    each [n_kv, capacity, d]): the sums run over j in order across the blocks, as over one
    block. Whole blocks of COLUMNS columns in vectors, the columns past them one at a
    time."""
    d = out.shape[1]
    end = w.shape[1]
    at = (w_rows[0] * end, w_rows[1] * end, w_rows[2] * end, w_rows[3] * end)
    sums = np.zeros((HEADS, d), np.float32)
    _vector_weighted_rows(sums, w, at, v0, hk * v0.shape[1] * d, n0, d)
    _vector_weighted_rows(sums, w, (at[0] + n0, at[1] + n0, at[2] + n0, at[3] + n0),
                          v1, hk * v1.shape[1] * d, n1, d)
    o2 = n0 + n1
    _vector_weighted_rows(sums, w, (at[0] + o2, at[1] + o2, at[2] + o2, at[3] + o2),
                          v2, hk * v2.shape[1] * d, n2, d)
    whole = d - d % COLUMNS
    for g in range(n):
        for i in range(whole):
            out[first + g, i] = sums[g, i]
        for i in range(whole, d):
            s = _column(w, w_rows[g], v0, n0, hk, 0, i, np.float32(0.0))
            s = _column(w, w_rows[g], v1, n1, hk, n0, i, s)
            out[first + g, i] = _column(w, w_rows[g], v2, n2, hk, o2, i, s)


@njit(parallel=True, cache=True, fastmath={"reassoc", "contract"})
def _attend_last(q, n_kv, k0, v0, n0, k1, v1, n1, k2, v2, n2, scale, out):
    """out[b, h] = softmax(q[b, h] . K[hk] * scale) @ V[hk], hk = h // group: the newest
    position's query heads of each of B sequences over every position, all visible to it,
    held in three blocks one after another: the first n0 rows of (k0, v0), n1 of (k1, v1),
    n2 of (k2, v2), each [B or 1, n_kv, capacity, d] C-contiguous (float32, or float16 as
    int16 bits; a block with a leading 1 is every sequence's). q, out (B, n_head, d). One
    sequence's KV head (and its group of query heads) per item; its K and V rows are each
    read once for HEADS query heads. A sequence's numbers do not depend on B."""
    n_seq, n_head = q.shape[0], q.shape[1]
    group = n_head // n_kv
    o1 = n0
    o2 = n0 + n1
    end = o2 + n2
    for item in prange(n_seq * n_kv):
        b, hk = item // n_kv, item % n_kv
        qb, ob = q[b], out[b]
        k0b, v0b = k0[min(b, k0.shape[0] - 1)], v0[min(b, v0.shape[0] - 1)]
        k1b, v1b = k1[min(b, k1.shape[0] - 1)], v1[min(b, v1.shape[0] - 1)]
        k2b, v2b = k2[min(b, k2.shape[0] - 1)], v2[min(b, v2.shape[0] - 1)]
        first = hk * group
        w = np.empty((group, end), np.float32)
        for g0 in range(0, group, HEADS):
            heads = _four(first, group, g0)
            w_rows = _four(0, group, g0)
            n = min(HEADS, group - g0)
            _scores(qb, heads, n, k0b, n0, hk, w, w_rows, 0, scale)
            _scores(qb, heads, n, k1b, n1, hk, w, w_rows, o1, scale)
            _scores(qb, heads, n, k2b, n2, hk, w, w_rows, o2, scale)
        _softmax(w, group, end)
        for g0 in range(0, group, HEADS):
            _weighted_rows(w, _four(0, group, g0), min(HEADS, group - g0),
                           v0b, n0, v1b, n1, v2b, n2, hk, first + g0, ob)


#: a block that holds no rows
_NO_ROWS = np.zeros((0, 0, 0), np.float32)


def kernel_block(block: KV | None, rows: int | None = None) -> tuple:
    """(k, v, rows) as the kernels take them (this one, ggml_ops.py's): C-contiguous (their
    offsets assume it; the backend's blocks are, so nothing is copied), float16 as its int16
    bits; rows: all of them unless given."""
    if block is None:
        return _NO_ROWS, _NO_ROWS, 0
    k, v = (np.ascontiguousarray(a) for a in block)
    k, v = (a.view(np.int16) if a.dtype == np.float16 else a for a in (k, v))
    return k, v, k.shape[1] if rows is None else rows


def sequence_blocks(keys: Keys) -> tuple:
    """keys' three blocks as the kernels take them (kernel_block), each with a leading
    sequence axis of 1: (k0, v0, n0, k1, v1, n1, k2, v2, n2), every sequence's."""
    blocks = (*kernel_block(keys.prefix), *kernel_block(keys.cache, keys.n_cached),
              *kernel_block(keys.new))
    return tuple(b[None] if isinstance(b, np.ndarray) else b for b in blocks)


def cache_blocks(k: np.ndarray, v: np.ndarray, end: int) -> tuple:
    """The three blocks of B sequences whose rows [0, end) are all in their own caches (k, v
    (B, n_kv, capacity, d)): no prefix, the caches, no new rows."""
    k, v, _ = kernel_block((k, v))
    empty = _NO_ROWS[None]
    return empty, empty, 0, k, v, end, empty, empty, 0


def attend_last(q: np.ndarray, keys: Keys, scale: float) -> np.ndarray:
    """ops.causal_attention for one query row at position keys.end - 1: q (1, n_head, d).
    Every block of keys is read where it is held. Returns (1, n_head * d)."""
    n, n_head, d = q.shape
    out = np.empty((1, n_head, d), np.float32)
    _attend_last(np.ascontiguousarray(q[:1]), keys.cache[0].shape[0], *sequence_blocks(keys),
                 np.float32(scale), out)
    return out.reshape(1, n_head * d)


def attend_rows(q: np.ndarray, k: np.ndarray, v: np.ndarray, end: int,
                scale: float) -> np.ndarray:
    """attend_last for B sequences in one call: q (B, n_head, d), the newest row of each,
    at position end - 1 of its cache (k, v (B, n_kv, capacity, d), C-contiguous), whose rows
    [0, end) it sees. Returns (B, n_head * d), each row the numbers attend_last gives it
    alone."""
    n_seq, n_head, d = q.shape
    out = np.empty((n_seq, n_head, d), np.float32)
    _attend_last(np.ascontiguousarray(q, dtype=np.float32), k.shape[1],
                 *cache_blocks(k, v, end), np.float32(scale), out)
    return out.reshape(n_seq, n_head * d)
