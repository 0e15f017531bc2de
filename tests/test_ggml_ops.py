"""NumPy's arithmetic="ggml" float32 operations (backends/s2core_numpy/ggml_ops.py) against
plain transcriptions of ggml's rules, and the properties the backend relies on (a row's
numbers do not depend on its batch or on which blocks hold its positions).

tests/test_s2cpp_fidelity.py holds them to s2.cpp's own outputs, bit for bit."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("numba")
from s2core.benchmarking.machine import HASWELL  # noqa: E402
from s2core_numpy import ggml_ops  # noqa: E402
from s2core_numpy.ops import Keys  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

F32 = np.float32


def half_values(rng, *shape) -> np.ndarray:
    """float32 values that are float16 numbers: their products are exact in float32, so a
    fused multiply-add and a product then a sum agree, and only the order of sums counts."""
    return rng.standard_normal(shape).astype(np.float16).astype(F32)


def ggml_dot(x: np.ndarray, y: np.ndarray) -> F32:
    """ggml_vec_dot_f32 of two float32 rows, transcribed: 4 x 8 lanes, its tree, leftovers."""
    n = x.shape[0]
    whole = n & ~31
    lanes = np.zeros(32, F32)
    for b in range(0, whole, 32):
        lanes = lanes + x[b:b + 32] * y[b:b + 32]  # exact products of float16 values
    s = (lanes[0:8] + lanes[16:24]) + (lanes[8:16] + lanes[24:32])
    t = s[0:4] + s[4:8]
    total = (t[0] + t[1]) + (t[2] + t[3])
    for i in range(whole, n):
        total = F32(total + x[i] * y[i])
    return total


@pytest.mark.parametrize("weights", ["f16", "f32"])
@pytest.mark.parametrize("n", [20, 32, 40, 45, 77, 128, 131, 4173])
def test_products_sum_in_ggmls_order(n, weights):
    """Each output is ggml's sum of its row (F16: leftovers in double, as ggml_vec_dot_f16;
    F32: in float, as ggml_vec_dot_f32), and a row's outputs are the same bits alone or
    beside others (7 rows: blocks of 4, 2 and 1 rows; 37 outputs: an odd last pair). 4173
    inputs take several passes for every block of rows (ggml_ops.X_PASS_BYTES): the lanes
    carried from pass to pass give one pass's numbers."""
    if n > 1000:
        assert all(ggml_ops._pass_length(rows, n & ~31) < (n & ~31) for rows in (1, 2, 4))
    rng = np.random.default_rng(n)
    w = half_values(rng, 37, n)
    x = half_values(rng, 7, n)
    matrix = w.astype(np.float16).view(np.int16) if weights == "f16" else w
    out = np.empty((7, 37), F32)
    ggml_ops.products(matrix, x, out)
    whole = n & ~31
    for r in range(7):
        for o in range(37):
            if weights == "f32":
                want = ggml_dot(w[o], x[r])
            else:
                head = ggml_dot(w[o, :whole], x[r, :whole]) if whole else F32(0)
                want = F32(float(head) + sum(float(w[o, i]) * float(x[r, i])
                                             for i in range(whole, n)))
            assert out[r, o] == want, (r, o)
    alone = np.empty((1, 37), F32)
    ggml_ops.products(matrix, x[3:4], alone)
    assert np.array_equal(alone[0], out[3])


def test_rms_norm_sums_squares_in_double():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 257)).astype(F32) * F32(7)
    w = rng.standard_normal(257).astype(F32)
    eps = F32(1e-6)
    for r in range(3):
        total = 0.0
        for v in x[r]:
            total += float(F32(v * v))
        scale = F32(1) / np.sqrt(F32(total / 257) + eps, dtype=F32)
        assert np.array_equal(ggml_ops.rms_norm(x[r:r + 1], w, eps)[0], x[r] * scale * w)


def test_exp_is_ggmls_polynomial_within_two_ulps_with_its_limits():
    """ggml_v_expf: within ~1.5 ulp of exp (its stated bound), 0 for -inf (masked scores),
    overflow to inf, NaN kept."""
    from numba import njit

    @njit
    def exps(x, out):
        for i in range(x.shape[0]):
            out[i] = ggml_ops.v_expf(x[i])

    x = np.linspace(-87, 88, 200_001).astype(F32)
    got = np.empty_like(x)
    exps(x, got)
    want = np.exp(x.astype(np.float64))
    ulp = np.spacing(want.astype(F32)).astype(np.float64)
    assert np.abs(got - want).max() <= 2 * ulp.max()
    assert (np.abs(got - want) / ulp).max() <= 2.0
    special = np.array([-np.inf, 0.0, -200.0, 100.0, np.nan], F32)
    out = np.empty_like(special)
    exps(special, out)
    assert out[0] == 0 and out[1] == 1 and out[2] == 0 and out[3] == np.inf and np.isnan(out[4])


def test_swiglu_is_ggmls_split_gate_whatever_the_work_items():
    """silu(g) * u as ggml_swiglu_split: ggml's exp on the row's groups of 8, libm's expf for
    the last (width mod 8), every element the same bits whichever work item (rows x spans of
    SWIGLU_SPAN) computed it."""
    from numba import njit

    @njit
    def plain(gate, up, out):
        whole = gate.shape[1] & ~7
        for r in range(gate.shape[0]):
            for i in range(gate.shape[1]):
                g = gate[r, i]
                e = ggml_ops.v_expf(F32(0) - g) if i < whole else ggml_ops.libm_expf(-g)
                out[r, i] = g / (F32(1) + e) * up[r, i]

    rng = np.random.default_rng(4)
    width = 2 * ggml_ops.SWIGLU_SPAN + 13  # three spans, the last one ragged, 5 past the groups
    gate = (rng.standard_normal((3, width)) * 6).astype(F32)
    up = rng.standard_normal((3, width)).astype(F32)
    want = np.empty_like(gate)
    plain(gate, up, want)
    assert np.array_equal(ggml_ops.swiglu(gate, up), want)
    assert np.array_equal(ggml_ops.swiglu(gate[1:2], up[1:2])[0], want[1])


def keys_split(k, v, prefix: int, cached: int) -> Keys:
    """The same positions held as a shared prefix, a float16 cache and the call's own row."""
    n_kv, rows, d = k.shape
    cache_k = np.zeros((n_kv, 128, d), np.float16)
    cache_v = np.zeros((n_kv, 128, d), np.float16)
    cache_k[:, :cached] = k[:, prefix:prefix + cached]
    cache_v[:, :cached] = v[:, prefix:prefix + cached]
    pre = None if prefix == 0 else (np.ascontiguousarray(k[:, :prefix]),
                                    np.ascontiguousarray(v[:, :prefix]))
    new = (np.ascontiguousarray(k[:, prefix + cached:].astype(F32)),
           np.ascontiguousarray(v[:, prefix + cached:].astype(F32)))
    return Keys(pre, (cache_k, cache_v), cached, new)


@pytest.mark.parametrize("rows", [7, 32, 45, 77])
def test_attention_gives_the_same_bits_whichever_blocks_hold_the_positions(rows):
    """A voice's rows as a shared prefix (Server) or copied into the cache (speak()): the
    same numbers. rows: under one lane group, exactly one, with leftovers of 13."""
    rng = np.random.default_rng(rows)
    k = rng.standard_normal((2, rows, 128)).astype(np.float16)
    v = rng.standard_normal((2, rows, 128)).astype(np.float16)
    q = rng.standard_normal((1, 8, 128)).astype(F32)
    want = ggml_ops.attention(q, keys_split(k, v, 0, rows - 1), rows - 1, 0.0)
    for prefix in (1, 5, rows // 2):
        got = ggml_ops.attention(q, keys_split(k, v, prefix, rows - 1 - prefix), rows - 1, 0.0)
        assert np.array_equal(got, want), prefix


def test_attention_rows_of_a_prefill_equal_each_row_alone():
    """Row i of a several-row call sees positions up to its own: it equals that row computed
    alone over the same positions (the later ones masked), as ggml's masked softmax gives."""
    rng = np.random.default_rng(5)
    k = rng.standard_normal((1, 40, 32)).astype(F32)
    v = rng.standard_normal((1, 40, 32)).astype(F32)
    q = rng.standard_normal((40, 4, 32)).astype(F32)
    empty = np.zeros((1, 64, 32), np.float16)
    every = ggml_ops.attention(q, Keys(None, (empty, empty), 0, (k, v)), 0, 0.0)
    for i in (0, 31, 39):
        one = ggml_ops.attention(q[i:i + 1], Keys(None, (empty, empty), 0, (k, v)), i, 0.0)
        assert np.array_equal(one[0], every[i]), i


@pytest.mark.parametrize("model, arithmetic, exact", [
    ("tiny_f16.gguf", "ggml", True), ("tiny_q8_0.gguf", "ggml", False),
    ("tiny_f16.gguf", "f32", False)])
def test_ggml_order_between_the_products_only_where_the_products_have_it(model, arithmetic,
                                                                         exact):
    """F16 and F32 files with "ggml": every operation in s2.cpp's order (their products are
    too). Quantized files: NumPy's faster kernels between integer products that add blocks
    in their own order anyway. "f32": NumPy's kernels."""
    import s2core
    from conftest import S2CPP_FIDELITY
    m = s2core.load(S2CPP_FIDELITY / model, backend="numpy", arithmetic=arithmetic)
    try:
        assert (m.backend.row_ops is ggml_ops.GGML_OPS) == exact
    finally:
        m.close()


OTHER_TARGET = """
import sys
import numpy as np
from s2core_numpy import ggml_ops
case = np.load(sys.argv[1])
w16, w32, x, positions = (case[k] for k in ("w16", "w32", "x", "positions"))
cos, sin = ggml_ops.rope_tables(positions, 32, 10000.0)
out16 = np.empty((x.shape[0], w16.shape[0]), np.float32)
out32 = np.empty_like(out16)
ggml_ops.products(w16, x, out16)
ggml_ops.products(w32, x, out32)
np.savez(sys.argv[2], f16=out16, f32=out32, cos=cos, sin=sin,
         swiglu=ggml_ops.swiglu(x, x[::-1].copy()),
         rope=ggml_ops.rope(x[:, :64].reshape(-1, 2, 32).copy(), cos, sin),
         norm=ggml_ops.rms_norm(x, x[0], np.float32(1e-6)))
"""


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"),
                    reason="the targets named are x86 ones")
@pytest.mark.parametrize("cpu", ["haswell", "generic"])
def test_other_targets_compute_the_same_bits(tmp_path, cpu):
    """ggml's order is the arithmetic, whatever the CPU numba compiles for: the products
    (F16 and F32, blocks of rows as the target's registers allow), SwiGLU, RoPE and RMSNorm
    built for a Haswell (AVX2, 2-row blocks) and for a generic x86 (no F16C: halves widened
    by the bit trick, which once crashed the process; no FMA: libm's exact fmaf) give this
    machine's bits, in a subprocess."""
    rng = np.random.default_rng(9)
    w = half_values(rng, 37, 77)
    x = half_values(rng, 7, 77)
    positions = np.arange(7, dtype=np.int64) + 5
    cos, sin = ggml_ops.rope_tables(positions, 32, 10000.0)
    case = dict(w16=w.astype(np.float16).view(np.int16), w32=w, x=x, positions=positions)
    np.savez(tmp_path / "case.npz", **case)
    env = dict(os.environ, NUMBA_CPU_NAME=cpu,
               NUMBA_CACHE_DIR=str(tmp_path / "numba-cache"),  # not this CPU's cached code
               PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "backends"),
                                           os.environ.get("PYTHONPATH", "")]))
    if cpu == "haswell":
        env["NUMBA_CPU_FEATURES"] = HASWELL
    run = subprocess.run([sys.executable, "-c", OTHER_TARGET, str(tmp_path / "case.npz"),
                          str(tmp_path / "out.npz")], capture_output=True, text=True, env=env,
                         timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    got = np.load(tmp_path / "out.npz")
    out16 = np.empty((7, 37), F32)
    out32 = np.empty_like(out16)
    ggml_ops.products(case["w16"], x, out16)
    ggml_ops.products(w, x, out32)
    want = dict(f16=out16, f32=out32, cos=cos, sin=sin, swiglu=ggml_ops.swiglu(x, x[::-1].copy()),
                rope=ggml_ops.rope(x[:, :64].reshape(-1, 2, 32).copy(), cos, sin),
                norm=ggml_ops.rms_norm(x, x[0], F32(1e-6)))
    for name, value in want.items():
        assert np.array_equal(got[name], value), name


def test_activations_rounded_to_half_as_numpy_rounds_them():
    """f16.round_to_half (the CPU's conversion, GgmlRows' activation rounding) gives
    numpy's float16 cast on every kind of float32: ties to even at each exponent, float16's
    subnormals and their underflow to zero, overflow to infinity, infinities; a NaN stays a
    NaN (its payload bits are the conversion's own)."""
    from s2core_numpy.f16 import round_to_half
    rng = np.random.default_rng(5)
    bits = [rng.integers(0, 2 ** 32, 200_000, dtype=np.uint64).astype(np.uint32)]
    halves = np.arange(2 ** 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    exact = halves[np.isfinite(halves)].astype(F32)
    up = np.nextafter(exact[:-1], exact[1:])           # half way and around it, both signs
    bits += [v.view(np.uint32) for v in (exact, (exact[:-1] + exact[1:]) / 2, up,
                                         np.nextafter(exact, F32(np.inf)))]
    bits.append(np.array([0x7F800000, 0xFF800000, 0x477FF000, 0x477FEFFF, 0x477FF001,
                          0x33000000, 0x33000001, 0x32FFFFFF, 0x80000001], np.uint32))
    x = np.concatenate(bits).view(F32)
    x = x[: x.size // 7 * 7].reshape(7, -1)  # rows, as the products pass them
    with np.errstate(over="ignore", invalid="ignore"):
        want = x.astype(np.float16).astype(F32)
    got = round_to_half(x)
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan)
    assert np.array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32))


@pytest.fixture(scope="module")
def plain_attention():
    """ggml's attention (scores by ggml_vec_dot_f32, scale, mask, ggml's softmax, each output
    column as ggml_vec_dot_f32 of the weights with V's column) as plain loops over one head
    and position at a time: what ggml_ops' blocked kernels (score_block, lane_block) must give
    bit for bit."""
    from numba import njit

    fma32, first_fused, softmax_row = ggml_ops.fma32, ggml_ops.first_fused, ggml_ops.softmax_row

    @njit
    def dot(x, y, lanes):
        """ggml_vec_dot_f32 of two rows: their elements one by one into the 32 lanes, the
        lanes' tree, then the elements past the last 32."""
        whole = x.shape[0] & ~31
        lanes[:] = F32(0)
        for i in range(whole):
            lanes[i & 31] = fma32(x[i], y[i], lanes[i & 31])
        return _rest(x, y, whole, tree(lanes))

    @njit
    def tree(lanes):
        s = np.empty(8, np.float32)
        for e in range(8):
            s[e] = (lanes[e] + lanes[16 + e]) + (lanes[8 + e] + lanes[24 + e])
        t0, t1, t2, t3 = s[0] + s[4], s[1] + s[5], s[2] + s[6], s[3] + s[7]
        return (t0 + t1) + (t2 + t3)

    @njit
    def _rest(x, y, whole, total):
        fused = first_fused(x.shape[0])
        for i in range(whole, x.shape[0]):
            total = total + x[i] * y[i] if i < fused else fma32(x[i], y[i], total)
        return total

    @njit
    def attend(q, k, v, first, out):
        n, n_head, d = q.shape
        n_kv, end = k.shape[0], k.shape[1]
        group = n_head // n_kv
        scale = F32(1) / np.sqrt(F32(d))
        lanes = np.empty(32, np.float32)
        w = np.empty(end, np.float32)
        column = np.empty(end, np.float32)
        for i in range(n):
            for h in range(n_head):
                kh = h // group
                for t in range(end):
                    score = dot(k[kh, t], q[i, h], lanes)
                    w[t] = score * scale if t <= first + i else -np.inf
                softmax_row(w, end)
                for c in range(d):
                    for t in range(end):
                        column[t] = v[kh, t, c]
                    whole = end & ~31
                    lanes[:] = F32(0)
                    for t in range(whole):
                        if w[t] != F32(0):  # a masked position adds nothing
                            lanes[t & 31] = fma32(column[t], w[t], lanes[t & 31])
                    out[i, h, c] = _rest(column, w, whole, tree(lanes))

    return attend


@pytest.mark.parametrize("positions, d, n_head, rows", [
    (300, 128, 8, 1), (2048 + 13, 128, 8, 1), (290, 64, 6, 4), (90, 48, 2, 2)])
def test_attention_at_long_contexts_is_the_plain_transcription(plain_attention, positions, d,
                                                                n_head, rows):
    """The blocked kernels over many positions (several V_CHUNK passes, lanes past the last
    32, a prefill's masked rows, groups of 4, 3 and 1 heads, widths with and without columns
    past the last 32, an infinite V value at masked positions) give the plain loops' bits,
    from a float16 cache."""
    rng = np.random.default_rng(positions)
    n_kv = 2
    k = (rng.standard_normal((n_kv, positions, d)) * 2).astype(np.float16)
    v = rng.standard_normal((n_kv, positions, d)).astype(np.float16)
    q = rng.standard_normal((rows, n_head, d)).astype(F32)
    first = positions - rows
    if rows > 1:  # masked for the first row (in the lanes for 290 positions): adds nothing
        v[:, first + 1, 0] = np.inf
    want = np.empty((rows, n_head, d), F32)
    plain_attention(q, k.astype(F32), v.astype(F32), first, want)
    cache_k, cache_v = (np.zeros((n_kv, positions + 5, d), np.float16) for _ in range(2))
    cache_k[:, :first], cache_v[:, :first] = k[:, :first], v[:, :first]
    new = (np.ascontiguousarray(k[:, first:].astype(F32)),
           np.ascontiguousarray(v[:, first:].astype(F32)))  # the call's own rows
    got = ggml_ops.attention(q, Keys(None, (cache_k, cache_v), first, new), first, 0.0)
    assert np.array_equal(got.reshape(rows, n_head, d).view(np.uint32), want.view(np.uint32))
