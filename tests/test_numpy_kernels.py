"""The NumPy backend's numba kernels (F16 and Q8_0 computed as stored; the block-quantized
types are in test_numpy_quants.py), its fallback without
them, its float16-held F16 KV cache, its incremental Fast-AR and its memory after load."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

import s2core
from s2core.errors import InvalidInputError
from s2core.gguf.blocks import NonFiniteScalesWarning
from s2core.modelfile.hparams import FastHparams
from s2core.kit import BackendConformance
from s2core.kit.models import kit_model
from s2core.runtime.memory import backend_kv_cache_bytes
from s2core.kit.prompts import mixed_prompt, semantic_frame
from s2core.embedded.writer import tiny_hparams, write_model
from s2core_numpy import plugin, weights
from s2core_numpy.layers import BlockWeights

numba_only = pytest.mark.skipif(not plugin.numba_available(), reason="numba not installed")


def rel_err(out, ref) -> float:
    out, ref = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    return float(np.linalg.norm(out - ref) / np.linalg.norm(ref))


def q8_tensor(n_out: int, n_in: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """GGUF Q8_0 bytes (n_out, n_in/32*34) and gguf's float32 dequantization of them."""
    w = np.random.default_rng(seed).standard_normal((n_out, n_in), dtype=np.float32)
    raw = gguf.quants.quantize(w, QT.Q8_0)
    return raw, gguf.quants.dequantize(raw, QT.Q8_0).astype(np.float32)


def f16_tensor(n_out: int, n_in: int, seed: int = 0) -> np.ndarray:
    """float16 weights with zeros, float16 subnormals and negative zero among them."""
    w = (np.random.default_rng(seed).standard_normal((n_out, n_in)) * 0.05).astype(np.float16)
    w.flat[:4] = [0.0, -0.0, 6e-8, -3e-6]  # zeros and subnormals: the exact-widening edge
    return w


def block_matrices(blk: BlockWeights) -> list:
    return [blk.wqkv, blk.wo, blk.w1, blk.w3, blk.w2]


# ------------------------------------------------------------------------------ kernels
@numba_only
@pytest.mark.parametrize("n_rows", [1, 3, 7, 8, 16, 33, 48])
@pytest.mark.parametrize("n_out,n_in", [(100, 96), (64, 32), (200, 320)])
def test_kernels_equal_a_float64_product(n_out, n_in, n_rows):
    """Every path (one row, few rows from the tiles, many rows through tile-by-tile sgemm) is
    the float64 product of gguf's dequantized weights, up to float32 rounding; output counts
    that are not a multiple of the tile are padded and cut."""
    from s2core_numpy import q8_0
    raw, w = q8_tensor(n_out, n_in)
    m = q8_0.Q8Matrix.from_raw(raw)
    assert m.shape == (n_out, n_in) and m.codes.dtype == np.int8
    assert m.codes.shape[0] * q8_0.TILE >= n_out
    x = np.random.default_rng(1).standard_normal((n_rows, n_in), dtype=np.float32)
    out = m(x)
    assert out.shape == (n_rows, n_out) and out.dtype == np.float32
    ref = x.astype(np.float64) @ w.astype(np.float64).T
    assert rel_err(out, ref) < 2e-6
    for r in range(n_rows):  # each row on its own, too (no cross-talk between rows)
        assert rel_err(out[r], ref[r]) < 2e-6


@numba_only
@pytest.mark.parametrize("n_rows", [1, 3, 7, 8, 16, 33, 48])
@pytest.mark.parametrize("n_out,n_in", [(100, 96), (64, 32), (200, 320)])
def test_f16_kernels_equal_a_float64_product(n_out, n_in, n_rows):
    from s2core_numpy import f16
    w = f16_tensor(n_out, n_in)
    m = f16.F16Matrix.from_raw(w)
    assert m.shape == (n_out, n_in) and m.codes.dtype == np.uint16
    x = np.random.default_rng(1).standard_normal((n_rows, n_in), dtype=np.float32)
    out = m(x)
    assert out.shape == (n_rows, n_out) and out.dtype == np.float32
    ref = x.astype(np.float64) @ w.astype(np.float64).T
    assert rel_err(out, ref) < 2e-6
    for r in range(n_rows):
        assert rel_err(out[r], ref[r]) < 2e-6


@numba_only
def test_tile_gemm_from_two_threads_at_once_restores_blas_threads():
    """Many-row products run one worker per core with BLAS held to one thread: two models'
    products at the same time both come out right, and BLAS gets its threads back after."""
    import threading
    from threadpoolctl import threadpool_info
    from s2core_numpy import f16, q8_0

    def blas_threads():
        return [lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"]

    before = blas_threads()
    raw, wq = q8_tensor(300, 256, seed=3)
    wf = f16_tensor(300, 256, seed=4)
    mats = [(q8_0.Q8Matrix.from_raw(raw), wq), (f16.F16Matrix.from_raw(wf), wf)]
    x = np.random.default_rng(5).standard_normal((64, 256), dtype=np.float32)
    errors: list[float] = []

    def work(m, w):
        for _ in range(20):
            errors.append(rel_err(m(x), x.astype(np.float64) @ w.astype(np.float64).T))

    threads = [threading.Thread(target=work, args=mw) for mw in mats]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(errors) == 40 and max(errors) < 2e-6
    assert blas_threads() == before


@numba_only
def test_tile_gemm_raises_a_workers_error_after_every_worker_stopped():
    from s2core_numpy import f16
    from s2core_numpy.tile_gemm import tile_gemm

    class Failing(f16.F16Matrix):
        def _decode_tile(self, t, w):
            if t == 3:
                raise RuntimeError("tile 3 is unreadable")
            super()._decode_tile(t, w)

    m = Failing(f16.F16Matrix.from_raw(f16_tensor(640, 64)).codes, 640)
    x = np.ones((40, 64), np.float32)
    with pytest.raises(RuntimeError, match="tile 3"):
        tile_gemm(m, x, np.empty((40, 640), np.float32))


@numba_only
@pytest.mark.parametrize("n_rows", [17, 70])
def test_products_and_attention_on_the_workers_equal_a_float64_reference(n_rows):
    """A many-row call runs its float32 products (64 outputs an item) and its attention (one
    KV head an item) on the workers: the float64 results, up to float32 rounding."""
    from s2core_numpy import ops
    from s2core_numpy.layers import attention
    from s2core_numpy.tile_gemm import dense_gemm
    rng = np.random.default_rng(n_rows)
    w = rng.standard_normal((200, 96), dtype=np.float32)
    x = rng.standard_normal((n_rows, 96), dtype=np.float32)
    assert rel_err(dense_gemm(x, w), x.astype(np.float64) @ w.astype(np.float64).T) < 2e-6
    n_head, n_kv, d, past = 8, 4, 16, 9
    q = rng.standard_normal((n_rows, n_head, d), dtype=np.float32)
    k = rng.standard_normal((n_kv, past + n_rows, d), dtype=np.float32)
    v = rng.standard_normal((n_kv, past + n_rows, d), dtype=np.float32)
    end = past + n_rows
    keys = ops.Keys(None, (k, v), end)
    spread = attention(q, keys, past, 0.25, True, ops.NUMPY_OPS)
    ref = ops.causal_attention(*(a.astype(np.float64) for a in (q, k, v)), past, 0.25)
    assert spread.shape == ref.shape and rel_err(spread, ref) < 2e-6
    np.testing.assert_array_equal(spread, attention(q, keys, past, 0.25, True,
                                                    ops.NUMPY_OPS))
    # float16 history and the call's float32 rows, as an F16 cache hands them: the same
    # numbers as one float32 block of the same values
    k16, v16 = (a[:, :past].astype(np.float16) for a in (k, v))
    split = ops.Keys(None, (k16, v16), past, (k[:, past:], v[:, past:]))
    whole = ops.Keys(None, tuple(np.concatenate([a16, a[:, past:]], axis=1, dtype=np.float32)
                                 for a16, a in ((k16, k), (v16, v))), end)
    np.testing.assert_array_equal(attention(q, split, past, 0.25, True, ops.NUMPY_OPS),
                                  attention(q, whole, past, 0.25, True, ops.NUMPY_OPS))


@numba_only
@pytest.mark.parametrize("n_head,n_kv,d", [(32, 8, 128), (8, 4, 16), (4, 4, 72), (6, 2, 200)])
@pytest.mark.parametrize("end", [1, 2, 37, 256])
def test_row_kernels_attention_equals_a_float64_reference(n_head, n_kv, d, end):
    """The newest row's attention over a cache (row_kernels.attend_last) reads only the
    positions before `end` of a larger cache: the float64 result, up to float32 rounding, for
    head sizes in whole blocks of 64 columns, with a remainder, and below one block."""
    from s2core_numpy import ops
    from s2core_numpy.row_kernels import KERNEL_OPS
    rng = np.random.default_rng(end * d)
    q = rng.standard_normal((1, n_head, d), dtype=np.float32)
    k = rng.standard_normal((n_kv, end + 5, d), dtype=np.float32)
    v = rng.standard_normal((n_kv, end + 5, d), dtype=np.float32)
    k[:, end:] = v[:, end:] = np.nan  # past the end: must not be read
    scale = 1 / np.sqrt(d)
    got = KERNEL_OPS.attention(q, ops.Keys(None, (k, v), end), end - 1, scale)
    ref = ops.causal_attention(*(a.astype(np.float64) for a in (q, k[:, :end], v[:, :end])),
                               end - 1, scale)
    assert got.shape == ref.shape == (1, n_head * d)
    assert rel_err(got, ref) < 2e-6


@numba_only
@pytest.mark.parametrize("n_head,n_kv,d", [(32, 8, 128), (6, 2, 200)])
@pytest.mark.parametrize("prefix,past", [(0, 0), (0, 37), (20, 0), (20, 300)])
def test_row_kernels_attention_reads_float16_blocks_as_one_float32_block(n_head, n_kv, d,
                                                                         prefix, past):
    """An F16 cache's blocks (a shared prefix and the cache's first rows, float16) and the
    call's own float32 row, read where they are held: the numbers of
    the same values in one float32 block and the float64 result, up to float32 rounding (a
    dot product over a float16 row may be vectorized, so summed, in another order)."""
    from s2core_numpy import ops
    from s2core_numpy.row_kernels import KERNEL_OPS
    rng = np.random.default_rng(prefix + past + d)
    q = rng.standard_normal((1, n_head, d), dtype=np.float32)
    pre = [rng.standard_normal((n_kv, prefix, d)).astype(np.float16) for _ in "kv"]
    cache = [np.full((n_kv, past + 9, d), np.nan, np.float16) for _ in "kv"]  # 9 unread
    for c in cache:
        c[:, :past] = rng.standard_normal((n_kv, past, d))
    new = [rng.standard_normal((n_kv, 1, d), dtype=np.float32) for _ in "kv"]
    keys = ops.Keys((pre[0], pre[1]) if prefix else None, (cache[0], cache[1]), past,
                    (new[0], new[1]))
    whole = tuple(np.concatenate([pre[i], cache[i][:, :past], new[i]], axis=1,
                                 dtype=np.float32) for i in (0, 1))
    scale = 1 / np.sqrt(d)
    got = KERNEL_OPS.attention(q, keys, keys.end - 1, scale)
    one_block = KERNEL_OPS.attention(q, ops.Keys(None, whole, keys.end), keys.end - 1, scale)
    assert rel_err(got, one_block) < 1e-6
    ref = ops.causal_attention(q.astype(np.float64), *(a.astype(np.float64) for a in whole),
                               keys.end - 1, scale)
    assert rel_err(got, ref) < 2e-6


WIDEN_EVERY_FLOAT16 = """
import numpy as np
from numba import njit
from s2core_numpy import f16

@njit
def widen_all(bits, out_half, out_any, out_finite):
    for i in range(bits.shape[0]):
        out_half[i] = f16.widen_half(bits[i])
        out_any[i] = f16.widen_any(bits[i])
        out_finite[i] = f16.widen_finite(bits[i])

bits = np.arange(-2**15, 2**15, dtype=np.int32).astype(np.int16)
want = bits.view(np.float16).astype(np.float32)
nan = np.isnan(want)
assert nan.sum() == 2 * 1023
half, any_, finite = (np.empty(bits.shape, np.float32) for _ in range(3))
widen_all(bits, half, any_, finite)
for got in (half, any_):
    assert np.array_equal(np.isnan(got), nan)
    assert np.array_equal(np.signbit(got[nan]), np.signbit(want[nan]))
    assert np.array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32))
kept = np.isfinite(want)  # widen_finite: the values a packed weight holds
assert np.array_equal(finite[kept].view(np.uint32), want[kept].view(np.uint32))
print(f16.target_converts_half())
"""


@numba_only
@pytest.mark.parametrize("cpu", ["host", "generic"])
def test_widening_is_numpys_conversion_for_every_float16(cpu):
    """Every one of the 65536 float16 bit patterns, infinities, NaNs and subnormals
    included, widens to the float32 NumPy's conversion gives (NaNs: a NaN of the same sign),
    by f16.widen_half and by f16.widen_any (every finite one by f16.widen_finite, the tiled
    kernels' widening): on this CPU, and compiled for a generic x86 CPU without F16C, where
    widen_half and widen_finite must take the bit trick (LLVM's conversion would
    call a function numba does not link: a crash)."""
    import os
    import platform
    env = dict(os.environ)
    if cpu == "generic":
        if platform.machine() not in ("x86_64", "AMD64"):
            pytest.skip("the generic target without F16C is an x86 one")
        env["NUMBA_CPU_NAME"] = "generic"
    out = subprocess.run([sys.executable, "-c", WIDEN_EVERY_FLOAT16], capture_output=True,
                         text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    if cpu == "generic":
        assert out.stdout.strip() == "False"


@numba_only
@pytest.mark.parametrize("n,heads,d", [(1, 32, 128), (3, 2, 8)])
def test_row_kernels_rope_is_numpys_bit_for_bit(n, heads, d):
    """The rotation kernel does NumPy's float32 operations, one by one; also on the strided
    views a projection hands it (q and k are column slices of one product)."""
    from s2core_numpy import ops
    from s2core_numpy.row_kernels import KERNEL_OPS
    rng = np.random.default_rng(n)
    qkv = rng.standard_normal((n, 2 * heads * d), dtype=np.float32)
    x = qkv[:, heads * d:].reshape(n, heads, d)
    cos, sin = ops.rope_tables(np.arange(40, 40 + n), d, 1e6)
    np.testing.assert_array_equal(KERNEL_OPS.rope(x, cos, sin).view(np.uint32),
                                  ops.apply_rope(x, cos, sin).view(np.uint32))


def test_silu_in_place_is_the_written_out_formula_bit_for_bit():
    from s2core_numpy import ops
    x = np.random.default_rng(4).standard_normal((3, 9728), dtype=np.float32) * 6
    written_out = x * (np.float32(0.5) + np.float32(0.5) * np.tanh(np.float32(0.5) * x))
    np.testing.assert_array_equal(ops.silu(x).view(np.uint32), written_out.view(np.uint32))


def test_swiglu_in_place_is_silu_times_up_bit_for_bit():
    from s2core_numpy import ops
    rng = np.random.default_rng(3)
    gate, up = (rng.standard_normal((2, 9728), dtype=np.float32) * 6 for _ in range(2))
    np.testing.assert_array_equal(ops.swiglu(gate, up).view(np.uint32),
                                  (ops.silu(gate) * up).view(np.uint32))


@numba_only
@pytest.mark.parametrize("shape", [(1, 2560), (5, 7, 128), (3, 1)])
def test_row_kernels_rms_norm_equals_a_float64_reference(shape):
    from s2core_numpy.row_kernels import KERNEL_OPS
    rng = np.random.default_rng(len(shape))
    x = rng.standard_normal(shape, dtype=np.float32) * 3
    w = rng.standard_normal(shape[-1], dtype=np.float32)
    got = KERNEL_OPS.rms_norm(x, w, 1e-6)
    x64 = x.astype(np.float64)
    ref = x64 / np.sqrt((x64 * x64).mean(axis=-1, keepdims=True) + 1e-6) * w
    assert got.shape == shape and got.dtype == np.float32
    assert rel_err(got, ref) < 2e-6


@numba_only
def test_f16_widening_is_exact_for_every_finite_value():
    """All 63,488 finite float16 values (zeros, subnormals, normals, both signs) come out of
    the kernels' bit widening as numpy's float32 of them, bit for bit; a tensor holding an
    infinity or NaN is not packed (the widening would make it finite)."""
    from s2core_numpy import f16
    every = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    finite = every[np.isfinite(every)].reshape(-1, 64)  # 992 rows of 64
    m = f16.F16Matrix.from_raw(finite)
    np.testing.assert_array_equal(m.dequantize().view(np.uint32),
                                  finite.astype(np.float32).view(np.uint32))
    for bad in (np.inf, -np.inf, np.nan):
        w = f16_tensor(70, 32)
        w[69, 31] = bad
        assert f16.F16Matrix.from_raw(w) is None


@numba_only
def test_row_lookup_is_exactly_gguf_dequantization():
    from s2core_numpy import q8_0
    raw, w = q8_tensor(130, 64, seed=2)
    m = q8_0.Q8Matrix.from_raw(raw)
    ids = np.array([0, 63, 64, 129, 5, 5])
    np.testing.assert_array_equal(m.rows(ids), w[ids])
    np.testing.assert_array_equal(m.dequantize(), w)


# ------------------------------------------------------------------------------ backend
@numba_only
@pytest.mark.parametrize("weight_type,storage", [("q8_0", np.int8), ("f16", np.uint16)])
def test_backend_keeps_f16_and_q8_0_native(weight_type, storage):
    # arithmetic "f32": the float kernels' holdings (test_int_dots.py: the integer kernels')
    m = s2core.load(kit_model("gqa4", weight_type), backend="numpy", arithmetic="f32")
    b = m.backend
    assert weight_type in m.capabilities.native_weight_types
    from s2core_numpy.tiled import TiledMatrix
    mats = [b.embeddings, b.fast.embeddings, b.fast.output]
    for blk in b.layers + b.fast.layers:
        mats += block_matrices(blk)
    for w in mats:  # the file's type only: no float32 copy of such a matrix is held
        assert isinstance(w, TiledMatrix) and w.codes.dtype == storage
    m.close()


@numba_only
def test_f16_tensor_with_an_infinity_is_widened_and_still_computed(tmp_path):
    """An F16 file whose wo holds an infinity: that tensor falls back to float32 (where the
    infinity stays one), the others stay packed."""
    hp = tiny_hparams()
    path = write_model(tmp_path / "inf.gguf", hp, "f16").path
    r = gguf.GGUFReader(path, "r+")
    t = next(t for t in r.tensors if t.name == "layers.0.attention.wo.weight")
    t.data.reshape(-1)[7] = np.inf
    del r
    with pytest.warns(NonFiniteScalesWarning, match="layers.0.attention.wo.weight"):
        m = s2core.load(path, backend="numpy", arithmetic="f32")
    b = m.backend
    assert b.widened_non_finite == ("layers.0.attention.wo.weight",)
    from s2core_numpy.f32_rows import F32Matrix  # float32, multiplied by its own kernels
    wo = b.layers[0].wo
    assert isinstance(wo, F32Matrix) and wo.w.dtype == np.float32 and np.isinf(wo.w).sum() == 1
    from s2core_numpy.tiled import TiledMatrix
    assert isinstance(b.layers[0].wqkv, TiledMatrix)
    m.close()


@pytest.mark.parametrize("weight_type", ["q8_0", "f16"])
def test_fallback_widens_f16_and_q8_0(monkeypatch, weight_type):
    """Without the kernels (option, or the module switch standing in for a missing numba)
    F16 and Q8_0 are widened to float32 and give the same numbers. (A float32 cache: an F16
    cache would round a K/V value that sits on a rounding boundary one way or the other as
    the two paths' float32 sums differ in their last bit.)"""
    prompt = mixed_prompt(tiny_hparams(), 12, np.random.default_rng(0))
    frame = semantic_frame(tiny_hparams(), np.random.default_rng(1))
    path = kit_model("gqa4", weight_type)
    outs = []
    for options in ({"numba_kernels": False}, {}):
        if not options:
            monkeypatch.setattr(weights, "USE_NUMBA", False)
        m = s2core.load(path, backend="numpy", kv_cache_dtype="f32", arithmetic="f32",
                        **options)
        assert m.capabilities.native_weight_types == {"f32"}
        assert all(isinstance(w, np.ndarray) and w.dtype == np.float32
                   for w in block_matrices(m.backend.layers[0]) + [m.backend.embeddings])
        m.init_kv_cache(32)
        m.prefill(prompt)
        outs.append((m.step(frame).logits, m.fast_decode(np.ones(64, np.float32), [1, 2])))
        m.close()
    with pytest.raises(InvalidInputError, match="needs numba"):
        s2core.load(path, backend="numpy", numba_kernels=True)  # USE_NUMBA is still off
    monkeypatch.setattr(weights, "USE_NUMBA", True)
    if plugin.numba_available():
        m = s2core.load(path, backend="numpy", kv_cache_dtype="f32", arithmetic="f32")
        m.init_kv_cache(32)
        m.prefill(prompt)
        native = (m.step(frame).logits, m.fast_decode(np.ones(64, np.float32), [1, 2]))
        for a, b in zip(native, outs[0]):
            assert rel_err(a, b) < 1e-5


def test_probe_declares_kept_types_only_with_numba_and_never_imports_it(monkeypatch):
    monkeypatch.setattr(plugin, "numba_available", lambda: False)
    assert plugin.probe().capabilities.native_weight_types == {"f32"}
    monkeypatch.setattr(plugin, "numba_available", lambda: True)
    assert plugin.probe().capabilities.native_weight_types >= {"f32", "f16", "q8_0", "q4_k"}
    code = ("import sys, s2core; s2core.get_registry().list(); "
            "print('numba' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


class TestNumpyWithoutNumba(BackendConformance):
    """The whole conformance matrix on the fallback path (F16 and Q8_0 widened)."""

    @pytest.fixture
    def backend(self):
        return "numpy"

    @pytest.fixture
    def backend_options(self):
        return {"numba_kernels": False}


# ------------------------------------------------------------------------------ KV cache
def test_f16_cache_is_held_in_float16_and_f32_in_float32():
    hp = tiny_hparams()
    prompt = mixed_prompt(hp, 16, np.random.default_rng(0))
    frame = semantic_frame(hp, np.random.default_rng(1))
    path = kit_model("gqa4", "f32")
    m16 = s2core.load(path, backend="numpy", kv_cache_dtype="f16")
    m32 = s2core.load(path, backend="numpy", kv_cache_dtype="f32")
    assert m16.capabilities.kv_cache_dtype == m16.capabilities.kv_cache_held_dtype == "f16"
    assert m16.capabilities.kv_cache_storage_dtype is None
    assert m32.capabilities.kv_cache_held_dtype == "f32"
    r = []
    for m, held in ((m16, np.float16), (m32, np.float32)):
        m.init_kv_cache(40)
        b = m.backend
        assert b._k.dtype == b._v.dtype == held
        assert b._k.nbytes + b._v.nbytes == backend_kv_cache_bytes(hp, 40, m.capabilities)
        r.append(m.prefill(prompt))
    assert 2 * (m16.backend._k.nbytes + m16.backend._v.nbytes) \
        == m32.backend._k.nbytes + m32.backend._v.nbytes
    # Within one call the new K/V are used unrounded: the first call is the same either way.
    np.testing.assert_array_equal(r[0].logits, r[1].logits)
    k16, v16 = m16.kv_cache_snapshot()
    k32, _ = m32.kv_cache_snapshot()
    for c in (k16, v16):  # what later calls read: f16 values, handed out as float32
        assert c.dtype == np.float32
        np.testing.assert_array_equal(c, c.astype(np.float16).astype(np.float32))
    np.testing.assert_array_equal(k16, k32.astype(np.float16).astype(np.float32))
    # The history is read back rounded in the next call, so a step now differs (a little).
    s16, s32 = m16.step(frame).logits, m32.step(frame).logits
    assert 0 < rel_err(s16, s32) < 2e-3


# ------------------------------------------------------------------------------ Fast-AR
@pytest.mark.parametrize("weight_type", ["f32", "f16", "q8_0"])
def test_incremental_fast_ar_equals_recomputing(weight_type):
    m = s2core.load(kit_model("gqa4", weight_type), backend="numpy")
    b, hp = m.backend, m.hparams
    rng = np.random.default_rng(5)
    hidden = rng.standard_normal(hp.dim).astype(np.float32)
    codes = rng.integers(0, hp.codebook_size, hp.num_codebooks - 1)
    state, logits = b.fast_begin(hidden)
    assert rel_err(logits, b.fast_decode(hidden, codes[:0])) < 1e-6
    state, logits = b.fast_extend(state, codes[:3])  # several at once, then one by one
    assert state.n == 4
    for n in range(3, len(codes) + 1):
        if n > 3:
            state, logits = b.fast_extend(state, codes[n - 1:n])
        assert state.n == n + 1
        assert rel_err(logits, b.fast_decode(hidden, codes[:n])) < 1e-6


# ------------------------------------------------------------------------------ memory
def _rss() -> tuple[int, int]:
    """(anonymous, file-backed) resident bytes of this process (Linux)."""
    fields = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("RssAnon", "RssFile"):
                fields[key] = int(rest.split()[0]) * 1024
    return fields["RssAnon"], fields["RssFile"]


@pytest.fixture(scope="module")
def mid_models(tmp_path_factory):
    """A model big enough (~60 M weights) for RSS to tell copies from file pages."""
    hp = replace(tiny_hparams(), vocab_size=16384, semantic_begin_id=8192, semantic_end_id=9215,
                 codebook_size=1024, dim=1024, ffn=3072, n_layer=2, n_head=8, n_head_kv=2,
                 head_dim=128,
                 fast=FastHparams(context_length=11, dim=1024, ffn=3072, n_layer=1, n_head=8,
                                  n_head_kv=2, head_dim=128, attention_qk_norm=False,
                                  project_in=False))
    d = tmp_path_factory.mktemp("mid")
    return {t: write_model(d / f"mid-{t}.gguf", hp, t, random_blocks=True)
            for t in ("f16", "q8_0", "q4_k_m")}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RssAnon/RssFile are Linux's")
@pytest.mark.parametrize("weight_type", ["f16", "q8_0", "q4_k_m"])
def test_load_holds_about_the_expected_bytes(mid_models, weight_type):
    """Widened (or repacked) tensors' file pages are released: resident memory after load is
    about what the backend holds, not that plus the file."""
    psutil = pytest.importorskip("psutil")
    written = mid_models[weight_type]
    mf = s2core.modelfile.file.ModelFile(written.path)
    native = plugin.numba_available()
    held = 0
    for t in mf.model_tensors():
        if t.type == QT.F32 or (t.name == "codebook_embeddings.weight" and not native):
            continue  # used in the map / gathered from it (with numba: held, as a matrix)
        if native and t.type == QT.Q8_0:
            held += t.n_bytes * 36 // 34
        elif native and t.type_name in plugin.NUMBA_TYPES:
            held += t.n_bytes  # F16 and the block types: the file's bytes
        else:
            held += 4 * t.n_elements
    mf.close()
    if native:
        warm = ("mha-k", weight_type) if weight_type.startswith("q4_k") else ("gqa4", weight_type)
        s2core.load(kit_model(*warm), backend="numpy").close()  # numba warmed up
    anon0, file0 = _rss()
    rss0 = psutil.Process().memory_info().rss
    m = s2core.load(written.path, backend="numpy")
    anon1, file1 = _rss()
    grown = psutil.Process().memory_info().rss - rss0
    assert anon1 - anon0 < held * 1.15 + (32 << 20)  # (freed heap may be reused: no lower bound)
    assert file1 - file0 < 0.1 * written.path.stat().st_size + (16 << 20)
    assert grown < held * 1.15 + (48 << 20)
    m.close()
