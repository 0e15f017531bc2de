"""arithmetic="ggml" in float32: the operations of s2.cpp's ggml as its x86 AVX2 build computes
them, bit for bit (RMSNorm, RoPE, attention, SwiGLU, and F16 and F32 products).

Why bit for bit: ggml rounds every activation to float16 before an F16 product and every K
and V row to float16 in its cache. A float32 value one ulp away from ggml's lands on the
other float16 now and then (about one time in 8,000), and one such flip moves an output by
1e-4 to 4e-4 of its largest value. Only the same float32 numbers everywhere give s2.cpp's
outputs on F16 files (docs/arithmetic.md, "Bit for bit with s2.cpp's AVX2 build").

The reference is ggml's x86 build with AVX2 and FMA (s2.cpp's goldens came from one: tests/
data/s2cpp_fidelity/README.md). What it computes, read from ggml's sources at s2.cpp's pinned
commit and from the machine code GCC made of them (where the compiler fused a multiply and
an add, so do we):

- Dot products of float32 and float16 rows (`ggml_vec_dot_f32`, `ggml_vec_dot_f16`): four
  accumulators of 8 lanes, lane l of accumulator j taking elements 32 b + 8 j + l with a
  fused multiply-add; then (acc0 + acc2) + (acc1 + acc3), the two halves of that added
  lane-wise, and the four sums as (s0 + s1) + (s2 + s3). Elements past the last multiple of
  32: float32 rows add them to that float one at a time, each product rounded first, except
  the last (n mod 4), which GCC fused into multiply-adds; float16 rows add them in double.
- RMSNorm: the squares (float32 products) summed in double in order, mean = float(sum / n),
  scale = 1 / sqrtf(mean + eps) in float32, y = x * scale * w.
- RoPE (mode 0, adjacent pairs): theta = position, then theta *= powf(base, -2 / d) in float32
  per pair, cos and sin from libm (cosf, sinf: ggml calls sincosf), and the rotation as GCC
  compiled ggml's loop: y0 = fma(c, x0, -(x1 * s)), y1 = fma(s, x0, x1 * c).
- Softmax over a row: the maximum; exp(x - max) by ggml's own polynomial (`ggml_v_expf`) on
  groups of 8 from the row's start, each group summed as ((v0 + v4) + (v2 + v6)) + ((v1 + v5)
  + (v3 + v7)) and added to a double; libm's expf for the last (n mod 8); then each value
  times float(1 / sum).
- Attention: scores = dot(K row, q) times float(1 / sqrtf(d)), masked, softmax over every
  position (masked ones give 0), then each output column as the dot of the weights with V's
  column over all positions (ggml's float32 dot above, positions as its elements).
- SwiGLU: silu(g) * u with silu(g) = g / (1 + ggml_v_expf(0 - g)) on groups of 8, libm's
  expf for the last (n mod 8).

libm: ggml calls the C library's expf, cosf, sinf and powf; so do these kernels (declared
as external C functions, resolved in the process). Other C libraries may round a few values
otherwise, as s2.cpp built against them would.

The backend takes these on files whose every product is computed in ggml's order (F16 and
F32 matrices: `GgmlRows`); NumpyBackend._row_ops says why not on quantized ones.

The 32 lanes are written as one LLVM vector (`fma_lanes`, `tree_lanes`); the products' inner
loop as one LLVM loop over a block of rows and outputs (`block_dots`), so the accumulators
stay in registers and each weight vector is widened once for several rows. The attention's
scores take four K rows and two heads a call (`score_block`: their eight lane trees share
their shuffles), its V sums one lane's positions for four heads a call (`lane_block`: the
lanes stay in registers over the positions); both give the plain loops' bits
(tests/test_ggml_ops.py). At 2048 positions (f16 cache, two cores, a Zen 4) that took the
attention from 4.9-6.1x the plain read of its bytes to 1.7-2.5x (0.42-0.77 ms a layer;
attention.py's own kernel, in its own order, 1.2-1.3x). The rest are plain numba loops.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic, overload

from . import kernel_cache  # noqa: F401  (first: numba's cache follows every source here)
from .attention import AHEAD_BYTES as ATTENTION_AHEAD_BYTES
from .attention import PREFETCH_LOCALITY as ATTENTION_PREFETCH_LOCALITY
from .attention import cache_blocks, sequence_blocks, vector_shape
from .f16 import as_float32, round_to_half, value_f32, widen_half, widen_half_lanes
from .ops import Keys, RowOps
from .prefetch import emit_prefetch
from .stack import stack_array

_F32 = np.float32


# ------------------------------------------------------------------------------ primitives
@intrinsic
def fma32(typingctx, a, b, c):
    """a * b + c rounded once (float32), as x86's vfmadd."""
    if not all(isinstance(t, types.Float) and t.bitwidth == 32 for t in (a, b, c)):
        return None

    def codegen(context, builder, signature, args):
        f = ir.FloatType()
        fn = builder.module.declare_intrinsic("llvm.fma", [f], ir.FunctionType(f, [f, f, f]))
        return builder.call(fn, args)

    return types.float32(a, b, c), codegen


@intrinsic
def float_bits(typingctx, x):
    """The bits of a float32 as an int32."""
    if not (isinstance(x, types.Float) and x.bitwidth == 32):
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(32))

    return types.int32(x), codegen


def _libm_codegen(name: str):
    """Code that calls the C library's float32 function `name` on the call's arguments."""

    def codegen(context, builder, signature, args):
        f = ir.FloatType()
        fn = builder.module.globals.get(name)
        if fn is None:
            fn = ir.Function(builder.module, ir.FunctionType(f, [f] * len(args)), name)
        return builder.call(fn, args)

    return codegen


def _is_f32(*values) -> bool:
    return all(isinstance(t, types.Float) and t.bitwidth == 32 for t in values)


@intrinsic
def libm_expf(typingctx, x):
    return (types.float32(x), _libm_codegen("expf")) if _is_f32(x) else None


@intrinsic
def libm_cosf(typingctx, x):
    return (types.float32(x), _libm_codegen("cosf")) if _is_f32(x) else None


@intrinsic
def libm_sinf(typingctx, x):
    return (types.float32(x), _libm_codegen("sinf")) if _is_f32(x) else None


@intrinsic
def libm_powf(typingctx, x, y):
    return (types.float32(x, y), _libm_codegen("powf")) if _is_f32(x, y) else None


# ---------------------------------------------------------------------- 32-lane vectors
# ggml's dot products keep 32 float32 lanes (four AVX2 registers). numba's LLVM unrolls a loop
# of a constant 32 before its loop vectorizer sees it and does not run the SLP vectorizer,
# so such a loop became 32 scalar multiply-adds. These intrinsics write the lanes as one LLVM
# vector of 32 instead (LLVM splits it into the CPU's registers).

LANES = 32


def _lanes_pointer(context, builder, array_type, array, at):
    """A pointer to the LANES elements of a 1-D array from flat index `at`, as a vector:
    float32, or float16 for int16 bits."""
    data = context.make_array(array_type)(context, builder, array).data
    element = ir.HalfType() if isinstance(array_type.dtype, types.Integer) else ir.FloatType()
    start = builder.gep(data, [context.cast(builder, at, types.intp, types.intp)])
    return builder.bitcast(start, ir.PointerType(ir.VectorType(element, LANES)))


def _load_lanes(context, builder, array_type, array, at):
    """LANES values of a float32 or float16-bits array as a float32 vector (exact)."""
    pointer = _lanes_pointer(context, builder, array_type, array, at)
    if isinstance(array_type.dtype, types.Integer):
        bits = ir.VectorType(ir.IntType(16), LANES)
        return widen_half_lanes(builder, builder.load(builder.bitcast(pointer, bits.as_pointer()),
                                                      align=2))
    return builder.load(pointer, align=2)


def _fma_lanes(builder, a, b, c):
    vector = ir.VectorType(ir.FloatType(), LANES)
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vector, [vector] * 3),
                                        f"llvm.fma.v{LANES}f32")
    return builder.call(fn, [a, b, c])


def _splat_lanes(builder, value):
    """A float32 scalar in every one of LANES lanes."""
    i32 = ir.IntType(32)
    one = builder.insert_element(ir.Constant(ir.VectorType(ir.FloatType(), LANES), None),
                                 value, ir.Constant(i32, 0))
    return builder.shuffle_vector(one, one, ir.Constant(ir.VectorType(i32, LANES), [0] * LANES))


def _open_loop(builder, intp, name: str):
    """The builder moved into a new loop of at least one iteration: (its index, counting from
    0, and the loop's first block). Phis the loop carries go next; _close_loop ends it."""
    before = builder.basic_block
    first = builder.append_basic_block(name)
    builder.branch(first)
    builder.position_at_end(first)
    index = builder.phi(intp)
    index.add_incoming(ir.Constant(intp, 0), before)
    return index, first


def _close_loop(builder, index, first, limit, carried) -> None:
    """The back edge of _open_loop's loop: again while index + 1 < limit, each (phi, value)
    of `carried` taking value from this iteration; the builder then after the loop."""
    after = builder.append_basic_block(first.name + ".done")
    step = builder.add(index, ir.Constant(index.type, 1))
    last = builder.basic_block
    index.add_incoming(step, last)
    for phi, value in carried:
        phi.add_incoming(value, last)
    builder.cbranch(builder.icmp_signed("<", step, limit), first, after)
    builder.position_at_end(after)


def _is_1d(t, *dtypes) -> bool:
    return isinstance(t, types.Array) and t.ndim == 1 and t.dtype in dtypes


@intrinsic
def fma_lanes(typingctx, acc, acc_at, x, x_at, y, y_at):
    """acc[acc_at + l] = fma(x[x_at + l], y[y_at + l], acc[acc_at + l]) for l < LANES, or
    with y a float32 scalar for every l (y_at ignored). acc float32; x float32 or float16
    bits (int16); 1-D arrays, flat indices."""
    scalar_y = isinstance(y, types.Float) and y.bitwidth == 32
    if not (_is_1d(acc, types.float32) and _is_1d(x, types.float32, types.int16)
            and (scalar_y or _is_1d(y, types.float32))):
        return None
    sig = types.void(acc, types.intp, x, types.intp, y, types.intp)

    def codegen(context, builder, signature, args):
        acc_v, acc_at_v, x_v, x_at_v, y_v, y_at_v = args
        xs = _load_lanes(context, builder, signature.args[2], x_v, x_at_v)
        if scalar_y:
            ys = _splat_lanes(builder, y_v)
        else:
            ys = _load_lanes(context, builder, signature.args[4], y_v, y_at_v)
        where = _lanes_pointer(context, builder, signature.args[0], acc_v, acc_at_v)
        builder.store(_fma_lanes(builder, xs, ys, builder.load(where, align=4)), where, align=4)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def widen_lanes(typingctx, out, out_at, x, x_at):
    """out[out_at + l] = x[x_at + l] as float32 for l < LANES (x float32 or float16 bits)."""
    if not (_is_1d(out, types.float32) and _is_1d(x, types.float32, types.int16)):
        return None
    sig = types.void(out, types.intp, x, types.intp)

    def codegen(context, builder, signature, args):
        values = _load_lanes(context, builder, signature.args[2], args[2], args[3])
        where = _lanes_pointer(context, builder, signature.args[0], args[0], args[1])
        builder.store(values, where, align=4)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def tree_lanes(typingctx, acc):
    """The LANES = 32 lanes of acc (ggml's four 8-lane accumulators) summed as ggml sums
    them: s = (acc0 + acc2) + (acc1 + acc3) lane-wise, t = s[0:4] + s[4:8],
    (t0 + t1) + (t2 + t3)."""
    if not _is_1d(acc, types.float32):
        return None

    def codegen(context, builder, signature, args):
        i32 = ir.IntType(32)
        zero = context.get_constant(types.intp, 0)
        lanes = builder.load(_lanes_pointer(context, builder, signature.args[0], args[0], zero),
                             align=4)

        def part(vector, start, n):
            indices = ir.Constant(ir.VectorType(i32, n), list(range(start, start + n)))
            return builder.shuffle_vector(vector, vector, indices)

        a0, a1, a2, a3 = (part(lanes, 8 * j, 8) for j in range(4))
        s = builder.fadd(builder.fadd(a0, a2), builder.fadd(a1, a3))
        t = builder.fadd(part(s, 0, 4), part(s, 4, 4))
        t0, t1, t2, t3 = (builder.extract_element(t, ir.Constant(i32, j)) for j in range(4))
        return builder.fadd(builder.fadd(t0, t1), builder.fadd(t2, t3))

    return types.float32(acc), codegen


# ggml_v_expf's constants (ggml-cpu/vec.h, the AVX2 form)
_SHIFT = _F32(float.fromhex("0x1.8p23"))
_LOG2E = _F32(float.fromhex("0x1.715476p+0"))
_LN2_HI = _F32(float.fromhex("0x1.62e4p-1"))
_LN2_LO = _F32(float.fromhex("0x1.7f7d1cp-20"))
_P0 = _F32(float.fromhex("0x1.0e4020p-7"))
_P1 = _F32(float.fromhex("0x1.573e2ep-5"))
_P2 = _F32(float.fromhex("0x1.555e66p-3"))
_P3 = _F32(float.fromhex("0x1.fffdb6p-2"))
_P4 = _F32(float.fromhex("0x1.ffffecp-1"))
_ONE_BITS = 0x3F800000


@njit(inline="always")
def v_expf(x):
    """ggml_v_expf for one lane (its lanes are independent): ggml's exp polynomial, max
    error ~1.5 ulp, the same bits as ggml. Written without branches (all three results,
    then a choice) so that LLVM vectorizes loops over it."""
    z = fma32(x, _LOG2E, _SHIFT)
    n = z - _SHIFT
    b = fma32(-n, _LN2_LO, fma32(-n, _LN2_HI, x))
    e = np.int64(float_bits(z)) << 23
    k = as_float32(e + _ONE_BITS)
    u = b * b
    j = fma32(fma32(fma32(_P0, b, _P1), u, fma32(_P2, b, _P3)), u, _P4 * b)
    g = np.int64(0x82000000) if n <= _F32(0) else np.int64(0)
    s1 = as_float32(g + 0x7F000000)
    s2 = as_float32(e - g)
    large = fma32(s2, j, s2) * s1 if abs(n) <= _F32(192) else s1 * s1
    return large if abs(n) > _F32(126) else fma32(j, k, k)


@njit(inline="always")
def first_fused(n):
    """The first element of a float32 dot of n that GCC fused into a multiply-add: the
    leftovers past the last multiple of 32 are added as rounded products, but for the last
    (n mod 4), which are fused (ggml_vec_dot_f32's machine code)."""
    return n - (n - (n & ~31)) % 4


@njit(inline="always")
def dot_f32(x, x_at, y, y_at, n):
    """ggml_vec_dot_f32(n, x[x_at:], y[y_at:]) (AVX2 build): 1-D float32 arrays."""
    acc = stack_array(1, LANES, np.float32)[0]
    acc[:] = _F32(0)
    whole = n & ~31
    for b in range(0, whole, LANES):
        fma_lanes(acc, 0, x, x_at + b, y, y_at + b)
    total = tree_lanes(acc)
    fused = first_fused(n)
    for i in range(whole, n):
        if i < fused:
            total = total + x[x_at + i] * y[y_at + i]
        else:
            total = fma32(x[x_at + i], y[y_at + i], total)
    return total


# ------------------------------------------------------------------------------ RMSNorm
@njit(cache=True)
def _rms_norm(x, weight, eps, out):
    n, dim = x.shape
    for r in range(n):
        total = 0.0
        for i in range(dim):
            total += np.float64(x[r, i] * x[r, i])
        mean = _F32(total / dim)
        scale = _F32(1) / np.sqrt(mean + eps)
        for i in range(dim):
            out[r, i] = x[r, i] * scale * weight[i]


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """ops.rms_norm as ggml_rms_norm then ggml_mul compute it."""
    dim = x.shape[-1]
    rows = np.ascontiguousarray(x, dtype=_F32).reshape(-1, dim)
    out = np.empty_like(rows)
    _rms_norm(rows, np.ascontiguousarray(weight, dtype=_F32), _F32(eps), out)
    return out.reshape(x.shape)


# ------------------------------------------------------------------------------ RoPE
@njit(cache=True)
def _rope_tables(positions, base, head_dim, cos, sin):
    theta_scale = libm_powf(base, _F32(-2.0) / _F32(head_dim))
    for r in range(positions.shape[0]):
        theta = _F32(positions[r])
        for i in range(head_dim // 2):
            cos[r, i] = libm_cosf(theta)
            sin[r, i] = libm_sinf(theta)
            theta = theta * theta_scale


def rope_tables(positions: np.ndarray, head_dim: int, base: float) -> tuple[np.ndarray, np.ndarray]:
    """ops.rope_tables as ggml's rope cache computes them (theta advanced in float32)."""
    n = positions.shape[0]
    cos = np.empty((n, head_dim // 2), _F32)
    sin = np.empty((n, head_dim // 2), _F32)
    _rope_tables(np.ascontiguousarray(positions, np.int64), _F32(base), head_dim, cos, sin)
    return cos, sin


@njit(cache=True)
def _rope(x, cos, sin, out):
    n, heads, d = x.shape
    for r in range(n):
        for h in range(heads):
            for i in range(d // 2):
                x0, x1, c, s = x[r, h, 2 * i], x[r, h, 2 * i + 1], cos[r, i], sin[r, i]
                out[r, h, 2 * i] = fma32(c, x0, -(x1 * s))
                out[r, h, 2 * i + 1] = fma32(s, x0, x1 * c)


def rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """ops.apply_rope with the multiply-adds GCC fused in ggml's rotation."""
    out = np.empty(x.shape, _F32)
    _rope(np.ascontiguousarray(x, dtype=_F32), cos, sin, out)
    return out


# ------------------------------------------------------------------------------ SwiGLU
#: elements of a row one SwiGLU work item takes (a multiple of 8: ggml's groups)
SWIGLU_SPAN = 2048


@njit(parallel=True, cache=True)
def _swiglu(gate, up, out):
    n, width = gate.shape
    whole = width & ~7
    spans = (width + SWIGLU_SPAN - 1) // SWIGLU_SPAN
    for item in prange(n * spans):
        r, first = item // spans, item % spans * SWIGLU_SPAN
        g_row, u_row, o_row = gate[r], up[r], out[r]
        for i in range(first, min(first + SWIGLU_SPAN, whole)):
            g = g_row[i]
            o_row[i] = g / (_F32(1) + v_expf(_F32(0) - g)) * u_row[i]
        for i in range(max(first, whole), min(first + SWIGLU_SPAN, width)):
            g = g_row[i]
            o_row[i] = g / (_F32(1) + libm_expf(-g)) * u_row[i]


def swiglu(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """silu(gate) * up as ggml_swiglu_split computes it."""
    gate = np.ascontiguousarray(gate, dtype=_F32)
    out = np.empty_like(gate)
    _swiglu(gate, np.ascontiguousarray(up, dtype=_F32), out)
    return out


# ------------------------------------------------------------------------------ softmax
@njit(inline="always")
def softmax_row(w, n):
    """ggml_soft_max over w[:n] in place (ggml_vec_max_f32, ggml_vec_soft_max_f32, scale)."""
    top = -np.inf
    for i in range(n):
        top = max(top, w[i])
    top = _F32(top)
    whole = n & ~7
    for i in range(whole):  # one loop over the row: LLVM vectorizes it
        w[i] = v_expf(w[i] - top)
    total = 0.0
    for i in range(0, whole, 8):
        a0, a1 = w[i] + w[i + 4], w[i + 1] + w[i + 5]
        a2, a3 = w[i + 2] + w[i + 6], w[i + 3] + w[i + 7]
        total += np.float64((a0 + a2) + (a1 + a3))
    for i in range(whole, n):
        w[i] = libm_expf(w[i] - top)
        total += np.float64(w[i])
    inverse = _F32(1.0 / total)
    for i in range(n):
        w[i] = w[i] * inverse


# ------------------------------------------------------------------------------ attention
# One work item is a query row and a KV head with the `group` query heads that share it:
# each K and V row is widened once for them all. The V sums are taken lane by lane (lane l
# holds the positions l, l + 32, ... in order, as ggml's accumulators do), so a lane's
# partial sums for the group's heads stay in L1; then the lanes are summed in ggml's tree
# and the positions past the last multiple of 32 added as its leftovers.

@njit(inline="always")
def _widen_row(block, kh, t, buffer):
    d = buffer.shape[0]
    whole = d & ~31
    flat = block.reshape(-1)
    at = (kh * block.shape[1] + t) * d
    for c in range(0, whole, LANES):
        widen_lanes(buffer, c, flat, at + c)
    for c in range(whole, d):
        buffer[c] = value_f32(flat[at + c])


@njit(inline="always")
def _row_of(t, k0, n0, k1, n1, k2, kh, buffer):
    """Position t's row of the three blocks (a prefix, the cache, the call's own rows),
    widened into buffer."""
    if t < n0:
        _widen_row(k0, kh, t, buffer)
    elif t < n0 + n1:
        _widen_row(k1, kh, t - n0, buffer)
    else:
        _widen_row(k2, kh, t - n0 - n1, buffer)


#: K rows and query heads one score_block call takes: their 4 x 2 accumulators of 32 lanes
#: (16 AVX-512 registers), a chunk of each row and each query (12 more) fit the 32 registers.
#: score_block's shuffles are written for these eight trees
SCORE_ROWS, SCORE_HEADS = 4, 2


def _split(builder, vector, start: int, n: int):
    """Lanes start .. start + n - 1 of a vector."""
    i32 = ir.IntType(32)
    return builder.shuffle_vector(vector, vector, ir.Constant(ir.VectorType(i32, n),
                                                              list(range(start, start + n))))


def _pick(builder, a, b, lanes: list):
    """A vector of a's lanes then b's, by index into their concatenation."""
    i32 = ir.IntType(32)
    return builder.shuffle_vector(a, b, ir.Constant(ir.VectorType(i32, len(lanes)), lanes))


@intrinsic
def score_block(typingctx, k, k_at, d, q, q_at0, q_at1, w, w_at0, w_at1):
    """w[w_at_h + p] = dot_f32 of K row p (flat, from k_at + p * d; float32 or float16 bits)
    with the query at q_at_h (float32), for the SCORE_ROWS rows p and the two heads h, d a
    multiple of 32: each lane's multiply-adds in element order (fma_lanes from zero), the
    lanes summed in tree_lanes' order, the same bits. The eight trees share their shuffles:
    each step pairs the same lanes as tree_lanes does, two or more trees a vector. Each K line
    read asks for the one attention.py's AHEAD_BYTES on, where that kernel does (it was
    measured there)."""
    if not (_is_1d(k, types.float32, types.int16) and _is_1d(q, types.float32)
            and _is_1d(w, types.float32)):
        return None
    sig = types.void(k, types.intp, types.intp, q, types.intp, types.intp, w, types.intp,
                     types.intp)

    def codegen(context, builder, signature, args):
        k_v, k_at, d, q_v, q_at0, q_at1, w_v, w_at0, w_at1 = args
        k_t, q_t, w_t = signature.args[0], signature.args[3], signature.args[6]
        intp = k_at.type
        floats = ir.VectorType(ir.FloatType(), LANES)
        zero = ir.Constant(floats, [0.0] * LANES)
        chunks = builder.udiv(d, ir.Constant(intp, LANES))
        item_size = 2 if isinstance(k_t.dtype, types.Integer) else 4
        entry = builder.basic_block
        c, loop = _open_loop(builder, intp, "score_block.loop")
        accs = [builder.phi(floats) for _ in range(SCORE_ROWS * SCORE_HEADS)]  # [h][p]
        for a in accs:
            a.add_incoming(zero, entry)
        offset = builder.mul(c, ir.Constant(intp, LANES))
        queries = [_load_lanes(context, builder, q_t, q_v, builder.add(at, offset))
                   for at in (q_at0, q_at1)]
        new = [None] * len(accs)
        for p in range(SCORE_ROWS):
            at = builder.add(builder.add(k_at, builder.mul(d, ir.Constant(intp, p))), offset)
            for line in range(0, LANES * item_size, 64):
                ahead = builder.add(at, ir.Constant(intp, (ATTENTION_AHEAD_BYTES + line)
                                                    // item_size))
                emit_prefetch(builder, _lanes_pointer(context, builder, k_t, k_v, ahead),
                              ATTENTION_PREFETCH_LOCALITY)
            row = _load_lanes(context, builder, k_t, k_v, at)
            for h, query in enumerate(queries):
                i = h * SCORE_ROWS + p
                new[i] = _fma_lanes(builder, row, query, accs[i])
        _close_loop(builder, c, loop, chunks, zip(accs, new))

        # lanes 0-15 + lanes 16-31: (a0 + a2 | a1 + a3), tree_lanes' first sums
        halves = [builder.fadd(_split(builder, v, 0, 16), _split(builder, v, 16, 16))
                  for v in new]
        # s = (a0 + a2) + (a1 + a3): two trees a vector, 8 lanes each
        s = [_pick(builder, halves[j], halves[j + 1], list(range(8)) + list(range(16, 24)))
             for j in range(0, len(halves), 2)]
        s = [builder.fadd(lo, _pick(builder, halves[2 * j], halves[2 * j + 1],
                                    list(range(8, 16)) + list(range(24, 32))))
             for j, lo in enumerate(s)]
        # t = s[0:4] + s[4:8]: four trees a vector, 4 lanes each
        t = []
        for j in range(0, len(s), 2):
            low = [8 * m + e for m in range(2) for e in range(4)]
            high = [8 * m + 4 + e for m in range(2) for e in range(4)]
            lo = _pick(builder, s[j], s[j + 1], low + [16 + x for x in low])
            hi = _pick(builder, s[j], s[j + 1], high + [16 + x for x in high])
            t.append(builder.fadd(lo, hi))
        # (t0 + t1), (t2 + t3): eight trees, 2 lanes each
        firsts = [4 * m + e for m in range(8) for e in (0, 2)]
        seconds = [4 * m + e for m in range(8) for e in (1, 3)]
        u = builder.fadd(_pick(builder, t[0], t[1], firsts), _pick(builder, t[0], t[1], seconds))
        # (t0 + t1) + (t2 + t3): the eight totals, [h][p]
        totals = builder.fadd(_pick(builder, u, u, list(range(0, 16, 2))),
                              _pick(builder, u, u, list(range(1, 16, 2))))
        for h, at in enumerate((w_at0, w_at1)):
            where = builder.bitcast(
                builder.gep(context.make_array(w_t)(context, builder, w_v).data, [at]),
                ir.PointerType(ir.VectorType(ir.FloatType(), SCORE_ROWS)))
            builder.store(_split(builder, totals, h * SCORE_ROWS, SCORE_ROWS), where, align=4)
        return context.get_dummy_value()

    return sig, codegen


@njit(inline="always")
def _block_scores(block, rows, kh, flat_q, q_row, group, d, row, w, offset):
    """w[g, offset + t] for the block's rows t < rows (block [n_kv, capacity, d]), d a
    multiple of 32: score_block for every whole SCORE_ROWS rows and pair of heads (an odd last
    head is taken twice, the same numbers), from the block's own bytes; the rows past them
    one at a time."""
    flat, flat_w = block.reshape(-1), w.reshape(-1)
    end = w.shape[1]
    base = kh * block.shape[1] * d
    whole = rows - rows % SCORE_ROWS
    for g in range(0, group, SCORE_HEADS):
        g1 = min(g + 1, group - 1)
        for t in range(0, whole, SCORE_ROWS):
            score_block(flat, base + t * d, d, flat_q, q_row + g * d, q_row + g1 * d,
                        flat_w, g * end + offset + t, g1 * end + offset + t)
    for t in range(whole, rows):
        _widen_row(block, kh, t, row)
        for g in range(group):
            w[g, offset + t] = dot_f32(row, 0, flat_q, q_row + g * d, d)


@njit(inline="always")
def _scores(q, i, kh, group, k0, n0, k1, n1, k2, end, row, w):
    """w[g, t] = ggml_vec_dot_f32 of K row t with q[i, kh * group + g]: by blocks of rows
    where d is a multiple of 32 (_block_scores), else one row at a time."""
    d = row.shape[0]
    flat_q = q.reshape(-1)
    q_row = (i * q.shape[1] + kh * group) * d
    if d % LANES == 0:
        _block_scores(k0, n0, kh, flat_q, q_row, group, d, row, w, 0)
        _block_scores(k1, n1, kh, flat_q, q_row, group, d, row, w, n0)
        _block_scores(k2, end - n0 - n1, kh, flat_q, q_row, group, d, row, w, n0 + n1)
        return
    for t in range(end):
        _row_of(t, k0, n0, k1, n1, k2, kh, row)
        for g in range(group):
            w[g, t] = dot_f32(row, 0, flat_q, q_row + g * d, d)


#: query heads one lane_block call takes (the group's four in S2 Pro): each V row is widened
#: once for them all
V_HEADS = 4


@intrinsic
def lane_block(typingctx, lanes, lanes_at, v, v_at, d, w, w_at, count, ahead):
    """For the V_HEADS heads h and every column c < d (d a multiple of 32):
    lanes[lanes_at_h + c] = fma(v[v_at + 32 k d + c], w[w_at_h + 32 k], ..) for k < count in
    order (count >= 1), a k whose weight is 0 adding nothing: one lane's positions t, t + 32,
    .. of V's rows, every multiply-add fma_lanes would make, in the same order. The lanes of
    a head are loaded once per 32 columns and stored after its last position, not at every
    position; each row's line `ahead` elements on is asked for, into L2."""
    if not (_is_1d(lanes, types.float32) and _is_1d(v, types.float32, types.int16)
            and _is_1d(w, types.float32)):
        return None
    sig = types.void(lanes, lanes_at, v, types.intp, types.intp, w, w_at, types.intp,
                     types.intp)

    def codegen(context, builder, signature, args):
        lanes_v, lanes_at, v_v, v_at, d, w_v, w_at, count, ahead = args
        lanes_t, v_t, w_t = signature.args[0], signature.args[2], signature.args[5]
        intp = v_at.type
        lanes_ats = [builder.extract_value(lanes_at, h) for h in range(V_HEADS)]
        w_ats = [builder.extract_value(w_at, h) for h in range(V_HEADS)]
        floats = ir.VectorType(ir.FloatType(), LANES)
        item_size = 2 if isinstance(v_t.dtype, types.Integer) else 4
        w_data = context.make_array(w_t)(context, builder, w_v).data
        stride = builder.mul(d, ir.Constant(intp, 32))
        chunks = builder.udiv(d, ir.Constant(intp, LANES))

        c, columns = _open_loop(builder, intp, "lane_block.columns")
        offset = builder.mul(c, ir.Constant(intp, LANES))
        slots = [_lanes_pointer(context, builder, lanes_t, lanes_v, builder.add(at, offset))
                 for at in lanes_ats]
        initial = [builder.load(slot, align=4) for slot in slots]
        entry = builder.basic_block
        k, rows = _open_loop(builder, intp, "lane_block.rows")
        accs = [builder.phi(floats) for _ in range(V_HEADS)]
        for a, value in zip(accs, initial):
            a.add_incoming(value, entry)
        at = builder.add(builder.add(v_at, builder.mul(k, stride)), offset)
        for line in range(0, LANES * item_size, 64):
            emit_prefetch(builder, _lanes_pointer(context, builder, v_t, v_v, builder.add(
                builder.add(at, ahead), ir.Constant(intp, line // item_size))),
                ATTENTION_PREFETCH_LOCALITY)
        row = _load_lanes(context, builder, v_t, v_v, at)
        new = []
        for acc, w_at_h in zip(accs, w_ats):
            p = builder.load(builder.gep(w_data, [builder.add(w_at_h, builder.mul(
                k, ir.Constant(intp, 32)))]))
            masked = builder.fcmp_ordered("==", p, ir.Constant(ir.FloatType(), 0.0))
            fused = _fma_lanes(builder, row, _splat_lanes(builder, p), acc)
            new.append(builder.select(masked, acc, fused))
        _close_loop(builder, k, rows, count, zip(accs, new))
        for slot, value in zip(slots, new):
            builder.store(value, slot, align=4)
        _close_loop(builder, c, columns, chunks, ())
        return context.get_dummy_value()

    return sig, codegen


#: positions of V a pass takes before the next: their rows (32 KB of float16 at d = 128)
#: stay in L2 while the group's heads run over them, and lane_block asks for the next pass's
V_CHUNK = 128


@njit(inline="always")
def _lane_fmas(w, g, block, offset, rows, kh, lo, hi, lanes, d):
    """lanes[(t % 32) * d + c] = fma(V[t, c], w[g, t], ..) for the block's rows (positions
    t = offset + j) with lo <= t < hi, in order, read from the block's own bytes (float32 or
    float16 bits)."""
    flat = block.reshape(-1)
    vectors = d & ~31
    for t in range(max(offset, lo), min(offset + rows, hi)):
        j = t - offset
        p = w[g, t]
        if p == _F32(0):  # a masked position: adds nothing
            continue
        at = (t & 31) * d
        row_at = (kh * block.shape[1] + j) * d
        for c in range(0, vectors, LANES):
            fma_lanes(lanes, at + c, flat, row_at + c, p, 0)
        for c in range(vectors, d):
            lanes[at + c] = fma32(value_f32(flat[row_at + c]), p, lanes[at + c])


@njit(inline="always")
def _lane_blocks(w, heads, block, offset, rows, kh, lo, hi, lanes, d):
    """_lane_fmas for the four `heads` at once (lane_block: a lane's positions of the block in
    [lo, hi) per call, every column); d a multiple of 32. A head listed twice gets the same
    numbers twice."""
    start, stop = max(offset, lo), min(offset + rows, hi)
    if start >= stop:
        return
    flat, flat_w = block.reshape(-1), w.reshape(-1)
    end = w.shape[1]
    ahead = V_CHUNK * d  # the next pass's rows, at the same lanes and columns
    for lane in range(32):
        t = start + (lane - start) % 32  # the lane's first position from start
        if t >= stop:
            continue
        lane_block(lanes, ((heads[0] * 32 + lane) * d, (heads[1] * 32 + lane) * d,
                           (heads[2] * 32 + lane) * d, (heads[3] * 32 + lane) * d),
                   flat, (kh * block.shape[1] + t - offset) * d, d,
                   flat_w, (heads[0] * end + t, heads[1] * end + t, heads[2] * end + t,
                            heads[3] * end + t),
                   (stop - t + 31) // 32, ahead)


@njit(inline="always")
def _weighted_values(w, v0, n0, v1, n1, v2, end, kh, row, lanes, out):
    """out[g] = ggml_vec_dot_f32 over positions of V's columns with w[g]; lanes (group, 32,
    d) is scratch: position t's products go to lane t % 32, rows read in order. V_CHUNK
    positions at a time: where d is a multiple of 32, each lane's positions of the chunk for
    four heads a call (lane_block, the lanes in registers over them); otherwise a head at a
    time over the chunk (_lane_fmas: its lanes, 16 KB at d = 128, stay in L1 and the chunk's
    rows in L2). With all the group's lanes at once (64 KB) every multiply-add went to L2 and
    back. Each lane takes the same multiply-adds in the same order every way."""
    group, d = out.shape
    whole = end & ~31
    fused = first_fused(end)
    lanes[:] = _F32(0)
    n2 = end - n0 - n1
    blocked = d % LANES == 0
    flat_lanes = lanes.reshape(-1)
    for lo in range(0, whole, V_CHUNK):
        hi = min(lo + V_CHUNK, whole)
        if blocked:
            for g in range(0, group, V_HEADS):
                heads = (g, min(g + 1, group - 1), min(g + 2, group - 1), min(g + 3, group - 1))
                _lane_blocks(w, heads, v0, 0, n0, kh, lo, hi, flat_lanes, d)
                _lane_blocks(w, heads, v1, n0, n1, kh, lo, hi, flat_lanes, d)
                _lane_blocks(w, heads, v2, n0 + n1, n2, kh, lo, hi, flat_lanes, d)
            continue
        for g in range(group):
            own = lanes[g].reshape(-1)
            _lane_fmas(w, g, v0, 0, n0, kh, lo, hi, own, d)
            _lane_fmas(w, g, v1, n0, n1, kh, lo, hi, own, d)
            _lane_fmas(w, g, v2, n0 + n1, n2, kh, lo, hi, own, d)
    for g in range(group):
        for c in range(d):  # tree_lanes' sums over the lanes, every column in one loop
            ln = lanes[g]
            s0 = (ln[0, c] + ln[16, c]) + (ln[8, c] + ln[24, c])
            s1 = (ln[1, c] + ln[17, c]) + (ln[9, c] + ln[25, c])
            s2 = (ln[2, c] + ln[18, c]) + (ln[10, c] + ln[26, c])
            s3 = (ln[3, c] + ln[19, c]) + (ln[11, c] + ln[27, c])
            s4 = (ln[4, c] + ln[20, c]) + (ln[12, c] + ln[28, c])
            s5 = (ln[5, c] + ln[21, c]) + (ln[13, c] + ln[29, c])
            s6 = (ln[6, c] + ln[22, c]) + (ln[14, c] + ln[30, c])
            s7 = (ln[7, c] + ln[23, c]) + (ln[15, c] + ln[31, c])
            out[g, c] = ((s0 + s4) + (s1 + s5)) + ((s2 + s6) + (s3 + s7))
    for t in range(whole, end):
        _row_of(t, v0, n0, v1, n1, v2, kh, row)
        for g in range(group):
            p = w[g, t]
            if t < fused:
                for c in range(d):
                    out[g, c] = out[g, c] + row[c] * p
            else:
                for c in range(d):
                    out[g, c] = fma32(row[c], p, out[g, c])


@njit(parallel=True, cache=True)
def _attend(q, q_start, n_kv, k0, v0, n0, k1, v1, n1, k2, v2, n2, out):
    """q, out (S, n, n_head, d): S sequences' n query rows each, at positions q_start ..,
    over the first n0, n1, n2 rows of the blocks (k0, v0), (k1, v1), (k2, v2), each [S or
    1, n_kv, capacity, d] (a leading 1: every sequence's). One work item a sequence's query
    row and KV head: a sequence's numbers do not depend on S."""
    n_seq, n, n_head, d = q.shape
    group = n_head // n_kv
    end = n0 + n1 + n2
    scale = _F32(1) / np.sqrt(_F32(d))
    for item in prange(n_seq * n * n_kv):
        s, i, kh = item // (n * n_kv), item // n_kv % n, item % n_kv
        qs = q[s]
        k0s, v0s = k0[min(s, k0.shape[0] - 1)], v0[min(s, v0.shape[0] - 1)]
        k1s, v1s = k1[min(s, k1.shape[0] - 1)], v1[min(s, v1.shape[0] - 1)]
        k2s, v2s = k2[min(s, k2.shape[0] - 1)], v2[min(s, v2.shape[0] - 1)]
        row = np.empty(d, np.float32)
        w = np.empty((group, end), np.float32)
        _scores(qs, i, kh, group, k0s, n0, k1s, n1, k2s, end, row, w)
        last = q_start + i  # the query's position: later ones are masked
        for g in range(group):
            for t in range(end):
                w[g, t] = w[g, t] * scale if t <= last else -np.inf
            softmax_row(w[g], end)
        lanes = np.empty((group, 32, d), np.float32)
        _weighted_values(w, v0s, n0, v1s, n1, v2s, end, kh, row, lanes,
                         out[s, i, kh * group:(kh + 1) * group])


def attention(q: np.ndarray, keys: Keys, q_start: int, scale: float) -> np.ndarray:
    """ops.cached_attention as s2.cpp's graph computes it (mul_mat, scale, diag_mask_inf,
    soft_max, mul_mat). `scale` is ggml's own, float(1 / sqrtf(d)), whatever is passed."""
    n, n_head, d = q.shape
    out = np.empty((1, n, n_head, d), _F32)
    _attend(np.ascontiguousarray(q, dtype=_F32)[None], q_start, keys.cache[0].shape[0],
            *sequence_blocks(keys), out)
    return out.reshape(n, n_head * d)


def attend_rows(q: np.ndarray, k: np.ndarray, v: np.ndarray, end: int,
                scale: float) -> np.ndarray:
    """ops.RowOps.attend_rows with `attention`'s numbers: q (B, n_head, d), each sequence's
    row at position end - 1 over its cache's rows [0, end) (k, v (B, n_kv, capacity, d))."""
    n_seq, n_head, d = q.shape
    out = np.empty((n_seq, 1, n_head, d), _F32)
    _attend(np.ascontiguousarray(q, dtype=_F32)[:, None], end - 1, k.shape[1],
            *cache_blocks(k, v, end), out)
    return out.reshape(n_seq, n_head * d)


# ------------------------------------------------------------------------------ F16 products
#: output rows a work item of `products` takes: their weights (16 x 5-10 KB at S2 Pro's
#: width) stay in L2 while every activation row passes them, so the activations are read once
#: per 16 outputs instead of once per output (a 4-layer f16 prefill of 100 rows took 1.5 s
#: that way, 1.1 s in blocks of 16 outputs)
OUTPUT_BLOCK = 16


def _block_dots(n_rows: int, n_outputs: int):
    """An intrinsic (acc, acc_at, w, w_at, w_step, x, x_at, x_step, start, stop, ahead) ->
    None: the LANES-lane products of `n_outputs` weight rows (from flat w_at, w_at + w_step,
    ...) with `n_rows` activation rows (from flat x_at, x_at + x_step, ...) over their elements
    [start, stop), added on to the lanes already in acc[acc_at + (r * n_outputs + k) * LANES
    + l] (each lane's multiply-adds in element order, as fma_lanes makes them, so a product
    taken in several calls over consecutive ranges is the product taken in one). One loop
    whose accumulators stay in registers, each weight vector widened once for all the rows:
    the rows are what a widening is shared by, so a block of R rows costs (4 + 2R) AVX-512
    operations per 32 R products a weight row (AVX2: half). Each weight line read asks for
    the one `ahead` elements on (prefetch.py; products passes the rows AHEAD_BYTES on: asking
    ahead at all took 4-layer f16 frames from 2.64 to 3.07 a second alone, 8.08 -> 9.21 with
    four sequences), into L2: a single row's call reads four rows of 5-19 KB, and L1 (32 KB
    on a Zen 4) does not keep the next call's lines until they are read. On a Zen 4, one row
    of a 9728 x 2560 F16 matrix streamed at 1.15-1.76x the tiled kernel's time (f16.py)
    asking into L1 and 1.09-1.14x into L2."""

    @intrinsic
    def block_dots(typingctx, acc, acc_at, w, w_at, w_step, x, x_at, x_step, start, stop,
                   ahead):
        if not (_is_1d(acc, types.float32) and _is_1d(w, types.float32, types.int16)
                and _is_1d(x, types.float32)):
            return None
        sig = types.void(acc, types.intp, w, types.intp, types.intp, x, types.intp,
                         types.intp, types.intp, types.intp, types.intp)

        def codegen(context, builder, signature, args):
            acc_v, acc_at, w_v, w_at, w_step, x_v, x_at, x_step, start, n, ahead = args
            acc_t, w_t, x_t = signature.args[0], signature.args[2], signature.args[5]
            intp = w_at.type
            slots = [_lanes_pointer(context, builder, acc_t, acc_v,
                                    builder.add(acc_at, ir.Constant(intp, i * LANES)))
                     for i in range(n_rows * n_outputs)]
            initial = [builder.load(slot, align=4) for slot in slots]
            entry = builder.basic_block
            loop = builder.append_basic_block("block_dots.loop")
            done = builder.append_basic_block("block_dots.done")
            builder.cbranch(builder.icmp_signed("<", start, n), loop, done)

            builder.position_at_end(loop)
            b = builder.phi(intp)
            b.add_incoming(start, entry)
            accs = [builder.phi(value.type) for value in initial]
            for a, value in zip(accs, initial):
                a.add_incoming(value, entry)
            w_ats = [builder.add(builder.add(w_at, builder.mul(w_step, ir.Constant(intp, k))), b)
                     for k in range(n_outputs)]
            for at in w_ats:
                emit_prefetch(builder, _lanes_pointer(context, builder, w_t, w_v,
                                                      builder.add(at, ahead)), locality=2)
            ws = [_load_lanes(context, builder, w_t, w_v, at) for at in w_ats]
            new = []
            for r in range(n_rows):
                xr = _load_lanes(context, builder, x_t, x_v, builder.add(
                    builder.add(x_at, builder.mul(x_step, ir.Constant(intp, r))), b))
                new += [_fma_lanes(builder, ws[k], xr, accs[r * n_outputs + k])
                        for k in range(n_outputs)]
            b_next = builder.add(b, ir.Constant(intp, LANES))
            body_end = builder.basic_block
            b.add_incoming(b_next, body_end)
            for a, v in zip(accs, new):
                a.add_incoming(v, body_end)
            builder.cbranch(builder.icmp_signed("<", b_next, n), loop, done)

            builder.position_at_end(done)
            finals = [builder.phi(v.type) for v in new]  # every phi heads its block
            for final, value, v in zip(finals, initial, new):
                final.add_incoming(value, entry)
                final.add_incoming(v, body_end)
            for final, slot in zip(finals, slots):
                builder.store(final, slot, align=4)
            return context.get_dummy_value()

        return sig, codegen

    return block_dots


def _total(acc, w, o, x, r, whole):
    """One product's lanes summed, then its elements past `whole` added, as ggml's dot of
    the weight's type does (compiled only: see the overload below)."""


@overload(_total)
def _total_of(acc, w, o, x, r, whole):
    if isinstance(w.dtype, types.Integer):  # F16 (int16 bits): ggml_vec_dot_f16
        def f16_total(acc, w, o, x, r, whole):
            total = np.float64(tree_lanes(acc))
            for i in range(whole, w.shape[1]):  # exact products, added in double
                total += np.float64(widen_half(w[o, i]) * x[r, i])
            return _F32(total)
        return f16_total

    def f32_total(acc, w, o, x, r, whole):  # F32: ggml_vec_dot_f32
        n = w.shape[1]
        total = tree_lanes(acc)
        fused = first_fused(n)
        for i in range(whole, n):
            if i < fused:
                total = total + w[o, i] * x[r, i]
            else:
                total = fma32(w[o, i], x[r, i], total)
        return total
    return f32_total


def _block_shapes() -> tuple[int, dict, bool]:
    """(ROW_BLOCK, {rows: outputs}, whether a single row takes four outputs a block) for the
    target's registers (attention.vector_shape):
    a block's accumulators, rows x outputs x (LANES / the register's lanes) registers, take at
    most half of them, the rest holding the loads. AVX-512: 4 rows x 2 outputs (16 of 32), and
    2 x 2, 1 x 2; AVX2: 2 x 1 and 1 x 2 (8 of 16). Measured on one 9728 x 2560 F16 matrix in
    cache (2 cores): AVX-512, 4 rows 1.52 -> 1.30 ms and 8 rows 3.05 -> 2.02 ms against 2 x 2
    blocks; 8 rows of one output each read x from L2 and took 4.5 ms. The AVX2 build, 4 rows
    2.21 -> 1.95 ms, 8 rows 4.09 -> 3.31 ms (its 2 x 2 spilled 16 accumulators). A single
    row takes 1 x 4 where that fits (AVX-512: 8 of 32), reading x once for four rows of w: the
    4-layer f16 step 55.4 -> 54.4 ms, alternated (step-ab-20261204-025102)."""
    lanes, registers = vector_shape()
    per_accumulator = max(1, LANES // lanes)
    budget = registers // 2
    row_block = max([r for r in (4, 2, 1) if r * per_accumulator <= budget] or [1])
    outputs = {r: 2 if 2 * r * per_accumulator <= budget else 1 for r in (4, 2, 1)}
    return row_block, outputs, 4 * per_accumulator <= budget


#: activation rows one block_dots call takes at most, per block size its outputs, and whether
#: a single row takes four
ROW_BLOCK, _OUTPUTS, _ONE_ROW_FOUR = _block_shapes()
_OUTPUTS_4, _OUTPUTS_2, _OUTPUTS_1 = _OUTPUTS[4], _OUTPUTS[2], _OUTPUTS[1]
_dots4, _dots2, _dots1 = (_block_dots(r, _OUTPUTS[r]) for r in (4, 2, 1))
_dots1x4 = _block_dots(1, 4)
#: the lanes of one work item's outputs for a block of rows (an odd last output of a pair
#: takes a second slot: see products)
_ITEM_LANES = (OUTPUT_BLOCK + 1) * ROW_BLOCK * LANES

#: bytes of activation rows that one pass over a work item's outputs reads: they stay in L1
#: (32 KB a core on AMD's Zen 4, 48 KB on Intel's recent Xeons) while the weights stream by.
#: Every block of outputs reads the block's activation rows in full, so four rows of S2 Pro's
#: 2560 inputs (40 KB) would come from L2 each time, and the four-row product of a
#: 9728 x 2560 F16 matrix took 2x the time of the tiled kernel (f16.py) on a Zen 4.
X_PASS_BYTES = 16384

#: how far ahead, in weight bytes in the order they are read, block_dots asks for lines: the
#: rows that many bytes of the current range on, at the same inputs. A single row's call of
#: four outputs spans 20 KB of S2 Pro's rows, so it asks for the next call's; a four-row call
#: of two outputs spans 4 KB of a range, and asking one call ahead (8 KB in reading order),
#: four rows streamed a 9728 x 2560 F16 matrix at 1.52-1.66x the tiled kernel's time on a
#: Zen 4, three calls ahead 1.35-1.44x, six 1.25-1.43x
AHEAD_BYTES = 20480


@njit(inline="always")
def _pass_length(rows, whole):
    """Inputs per pass for `rows` activation rows: a multiple of LANES, at most X_PASS_BYTES
    of the rows, the passes as even as that allows."""
    most = max(LANES, X_PASS_BYTES // (4 * rows) // LANES * LANES)
    if whole <= most:
        return max(whole, LANES)
    passes = (whole + most - 1) // most
    return ((whole + passes - 1) // passes + LANES - 1) // LANES * LANES


@njit(inline="always")
def _width(rows, o, last):
    """The outputs that the call at output o of [.., last) takes: four for a single row where
    four are left and fit the registers, else the block shape's."""
    if rows == 1 and _ONE_ROW_FOUR and last - o >= 4:
        return 4
    if rows == 4:
        return _OUTPUTS_4
    if rows == 2:
        return _OUTPUTS_2
    return _OUTPUTS_1


@njit(inline="always")
def _block(rows, width, acc, acc_at, w, w_at, w_step, x, x_at, x_step, start, stop, ahead):
    """block_dots for `rows` (4, 2 or 1) rows and `width` outputs (as _width chose)."""
    if width == 4:
        _dots1x4(acc, acc_at, w, w_at, w_step, x, x_at, x_step, start, stop, ahead)
    elif rows == 4:
        _dots4(acc, acc_at, w, w_at, w_step, x, x_at, x_step, start, stop, ahead)
    elif rows == 2:
        _dots2(acc, acc_at, w, w_at, w_step, x, x_at, x_step, start, stop, ahead)
    else:
        _dots1(acc, acc_at, w, w_at, w_step, x, x_at, x_step, start, stop, ahead)


@njit(parallel=True, cache=True)
def products(w, x, out):
    """out[r, o] = ggml's dot of row o of w with x[r]: F16 weights (as int16 bits) times
    activations already rounded to float16 (ggml_vec_dot_f16), or F32 weights times float32
    activations (ggml_vec_dot_f32). A work item is OUTPUT_BLOCK outputs; for each block of up
    to ROW_BLOCK activation rows it passes over the inputs in ranges of _pass_length, each
    range through every output of the item in calls of one to four outputs (block_dots: each
    weight vector widened once for the block's rows), the lanes kept between ranges. A lane
    takes its multiply-adds in element order across the ranges, so the numbers are those of
    one pass."""
    n_out, n_in = w.shape
    n_rows = x.shape[0]
    whole = n_in & ~31
    flat_w, flat_x = w.reshape(-1), x.reshape(-1)
    for item in prange((n_out + OUTPUT_BLOCK - 1) // OUTPUT_BLOCK):
        acc = stack_array(1, _ITEM_LANES, np.float32)[0]
        first = item * OUTPUT_BLOCK
        last = min(first + OUTPUT_BLOCK, n_out)
        r = 0
        rows = ROW_BLOCK
        while r < n_rows:
            while rows > n_rows - r:
                rows //= 2
            acc[:(last - first + 1) * rows * LANES] = 0
            length = _pass_length(rows, whole)
            for start in range(0, whole, length):
                stop = min(start + length, whole)
                # a call asks for the lines of the rows that far on, in this range
                rows_ahead = max(2, AHEAD_BYTES // ((stop - start) * w.itemsize))
                o = first
                while o < last:
                    width = _width(rows, o, last)
                    o1 = min(o + 1, last - 1)  # an odd last output of a pair is computed twice
                    w_step = n_in if width == 4 else (o1 - o) * n_in
                    _block(rows, width, acc, (o - first) * rows * LANES, flat_w, o * n_in,
                           w_step, flat_x, r * n_in, n_in, start, stop,
                           max(width, rows_ahead) * n_in)
                    o += width
            o = first
            while o < last:
                width = _width(rows, o, last)
                for i in range(rows):
                    for k in range(min(width, last - o)):
                        at = (o - first) * rows * LANES + (i * width + k) * LANES
                        out[r + i, o + k] = _total(acc[at:at + LANES], w, o + k, x, r + i,
                                                   whole)
                o += width
            r += rows


class GgmlRows:
    """An [out, in] F16 or F32 matrix multiplied as ggml multiplies it (`products`), read in
    place from the file's rows (row-major: each output's dot runs along its row as ggml's
    does). An F16 matrix rounds the activation rows to float16 first, as ggml_vec_dot_f16
    takes them (f16.round_to_half: act_quant.snap's numbers). `m(x)` is x @ W^T for x
    (n, in)."""

    def __init__(self, values: np.ndarray):
        """values: the file's F16 values (as float16 or their uint16 bits) or F32 values."""
        values = np.ascontiguousarray(values)
        self.w = values if values.dtype == np.float32 else values.view(np.int16)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        out = np.empty((x.shape[0], self.w.shape[0]), _F32)
        x = np.ascontiguousarray(x, dtype=_F32)
        products(self.w, x if self.w.dtype == np.float32 else round_to_half(x), out)
        return out

    def row_window(self, start: int, stop: int, n: int) -> tuple["GgmlRows", int]:
        """weights.row_window: rows [start, stop) in place (each output's dot is its own)."""
        window = GgmlRows.__new__(GgmlRows)
        window.w = self.w[start:stop]
        return window, 0

    def rows(self, ids: np.ndarray) -> np.ndarray:
        if self.w.dtype == np.float32:
            return self.w[ids]
        return self.w[ids].view(np.float16).astype(_F32)

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.w.shape)

    @property
    def nbytes(self) -> int:
        return self.w.nbytes


#: the block's norms, rotation, attention and gate as s2.cpp's AVX2 build computes them
GGML_OPS = RowOps(rms_norm, rope, attention, swiglu, rope_tables, parallel_attention=True,
                  attend_rows=attend_rows)
