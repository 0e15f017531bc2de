"""What the MLX backend promises beyond the conformance kit: native results, a cache written in
place and never regrown, quantized weights kept quantized, and its options."""

from __future__ import annotations

import numpy as np
import pytest

import s2core
from s2core.errors import InvalidInputError
from s2core.kit.conformance import prompt_and_frames, rel_err
from s2core.kit.models import kit_model, kit_reference

mx = pytest.importorskip("mlx.core", reason="mlx is not installed (pip install 'mlx[cpu]')")

from s2core_mlx.kv_cache import buffer_address  # noqa: E402
from s2core_mlx.weights import DenseMatrix, QuantizedMatrix, storage_bytes  # noqa: E402


def load(config="gqa4", weight_type="f32", **options):
    return s2core.load(kit_model(config, weight_type), backend="mlx", **options)


# ---------------------------------------------------------------------- results
def test_results_are_native_mlx_arrays():
    prompt, frames = prompt_and_frames("gqa4")
    with load() as m:
        m.init_kv_cache(64)
        r = m.prefill(prompt)
        assert isinstance(r.hidden_native, mx.array) and isinstance(r.logits_native, mx.array)
        assert r.hidden_native.shape == (m.hparams.dim,)
        assert r.logits_native.shape == (m.hparams.vocab_size,)
        assert r.hidden_native.dtype == r.logits_native.dtype == mx.float32
        np.testing.assert_array_equal(r.logits, np.array(r.logits_native))
        assert r.logits.dtype == np.float32
        # A later call does not change an earlier result.
        before = r.logits.copy()
        m.step(frames[0])
        np.testing.assert_array_equal(r.logits, before)


def test_sampling_can_stay_on_the_device():
    """The generation loop's hand-over: Result.hidden_native goes straight to fast_decode."""
    prompt, _ = prompt_and_frames("gqa4")
    with load() as m:
        m.init_kv_cache(64)
        r = m.prefill(prompt)
        token = mx.argmax(r.logits_native)  # stays an mx.array
        assert int(token) == int(np.argmax(r.logits))
        native = m.fast_decode_native(r.hidden_native, [1, 2])
        assert isinstance(native, mx.array) and native.dtype == mx.float32
        np.testing.assert_array_equal(np.array(native), m.fast_decode(r.hidden, [1, 2]))


# ---------------------------------------------------------------------- KV cache
@pytest.mark.parametrize("dtype,mx_dtype", [("f16", mx.float16), ("bf16", mx.bfloat16),
                                            ("f32", mx.float32)])
def test_cache_is_preallocated_in_its_dtype(dtype, mx_dtype):
    with load(kv_cache_dtype=dtype) as m:
        m.init_kv_cache(40)
        cache = m.backend._cache
        hp = m.hparams
        assert len(cache.k) == len(cache.v) == hp.n_layer
        for a in cache.arrays():
            assert a.shape == (1, hp.n_head_kv, 40, hp.head_dim) and a.dtype == mx_dtype


def test_cache_is_written_in_place_and_never_regrown():
    prompt, frames = prompt_and_frames("gqa4", n_prompt=20, n_frames=6)
    with load(weight_type="q8_0") as m:
        m.init_kv_cache(64)
        cache = m.backend._cache
        addresses = [buffer_address(a) for a in cache.arrays()]
        m.prefill(prompt, chunk_size=7)
        for f in frames:
            m.step(f)
        assert m.backend._cache is cache
        assert [buffer_address(a) for a in cache.arrays()] == addresses
        assert all(a.shape[2] == 64 for a in cache.arrays())


def test_history_comes_from_the_rounded_cache():
    """s2.cpp's numerics: a step reads the history back from the F16 cache. Rounding it
    changes the step's output (slightly); the same model with an f32 cache differs."""
    prompt, frames = prompt_and_frames("gqa4")
    outs = {}
    for dtype in ("f16", "f32"):
        with load(kv_cache_dtype=dtype) as m:
            m.init_kv_cache(64)
            first = m.prefill_fast(prompt).logits
            outs[dtype] = (first, m.step(frames[0]).logits)
    # The prefill reads no history: identical. The step reads rounded history: not identical.
    np.testing.assert_array_equal(outs["f16"][0], outs["f32"][0])
    err = rel_err(outs["f16"][1], outs["f32"][1])
    assert 0 < err < 2e-3


def test_repeated_syntheses_do_not_grow_memory():
    prompt, _ = prompt_and_frames("gqa4")
    with load() as m:
        hp = m.hparams
        cache_bytes = 2 * hp.n_layer * 512 * hp.n_head_kv * hp.head_dim * 2  # K+V, f16
        m.init_kv_cache(512)
        m.clear_kv_cache()
        base = mx.get_active_memory()
        for _ in range(3):
            m.init_kv_cache(512)
            assert mx.get_active_memory() >= base + cache_bytes
            m.prefill(prompt)
            m.clear_kv_cache()
            assert m.backend._cache is None
            assert mx.get_active_memory() <= base


# ---------------------------------------------------------------------- weights
@pytest.mark.parametrize("weight_type,bits", [("q8_0", 8), ("q4_0", 4), ("q4_1", 4),
                                              ("q5_0", 5), ("q5_1", 5)])
def test_legacy_quants_stay_quantized(weight_type, bits):
    with load("gqa2-noqk" if weight_type in ("q4_1", "q5_0", "q5_1") else "gqa4",
              weight_type) as m:
        _assert_quantized(m.backend, bits)


@pytest.mark.parametrize("weight_type,bits", [("q4_k", 4), ("q5_k", 5)])
def test_k_quants_with_32_value_sub_blocks_stay_quantized(weight_type, bits):
    with load("mha-k", weight_type) as m:
        _assert_quantized(m.backend, bits)


def _assert_quantized(backend, bits):
    slow = backend.slow
    blk = slow.layers[0]
    matrices = [blk.wqkv, blk.wo, blk.w1, blk.w3, blk.w2, slow.embeddings, slow.codebooks]
    for mat in matrices:
        assert isinstance(mat, QuantizedMatrix) and mat.bits == bits and mat.group_size == 32


@pytest.mark.parametrize("weight_type,bits", [("q6_k", 6), ("q3_k", 3), ("q2_k", 2)])
def test_sixteen_value_k_quants_are_kept_split(weight_type, bits):
    """Q6_K, Q3_K, Q2_K stay quantized (each 16-value sub-block its own group of 32), and hold
    exactly the bytes their declared overhead says."""
    with load("mha-k", weight_type) as m:
        caps, mf, slow = m.capabilities, m.model_file, m.backend.slow
        assert weight_type in caps.native_weight_types
        for mat in [slow.embeddings, slow.codebooks] + [w for blk in slow.layers for w in
                                                        (blk.wqkv, blk.wo, blk.w1, blk.w3, blk.w2)]:
            assert isinstance(mat, QuantizedMatrix) and mat.split and mat.bits == bits
        name = "layers.0.feed_forward.w1.weight"
        held = storage_bytes(slow.layers[0].w1)
        assert held == pytest.approx(mf.info(name).n_bytes * caps.held_bytes_per_file_byte(
            weight_type), rel=1e-9)
        assert held < mf.info(name).n_elements * 2  # below even an f16 copy


@pytest.mark.parametrize("weight_type", ["q6_k", "q3_k", "q2_k"])
def test_sixteen_value_k_quants_can_be_widened(weight_type):
    with load("mha-k", weight_type, sub_block_quants="widen") as m32, \
            load("mha-k", weight_type, sub_block_quants="widen",
                 widened_weight_dtype="f16") as m16:
        assert weight_type not in m32.capabilities.native_weight_types
        w32, w16 = m32.backend.slow.layers[0].w1, m16.backend.slow.layers[0].w1
        assert isinstance(w32, DenseMatrix) and w32.w.dtype == mx.float32
        assert isinstance(w16, DenseMatrix) and w16.w.dtype == mx.float16
        assert storage_bytes(w16) * 2 == storage_bytes(w32)
        assert m16.capabilities.widened_weight_dtype == "f16"
        # f16 rounds each weight once: well inside the F16-cache output bound.
        prompt, _ = prompt_and_frames("mha-k")
        m16.init_kv_cache(64)
        ref = kit_reference("mha-k", weight_type).forward(prompt)
        assert rel_err(m16.prefill(prompt).logits, ref.logits) < 2e-3


@pytest.mark.parametrize("weight_type,dtype", [("f16", mx.float16), ("bf16", mx.bfloat16),
                                               ("f32", mx.float32)])
def test_float_weights_are_kept_as_stored(weight_type, dtype):
    with load("gqa4", weight_type) as m:
        for mat in (m.backend.slow.layers[1].wqkv, m.backend.slow.embeddings):
            assert isinstance(mat, DenseMatrix) and mat.w.dtype == dtype


# ---------------------------------------------------------------------- options
@pytest.mark.parametrize("option,value", [("kv_cache_dtype", "f8"),
                                          ("sub_block_quants", "pad"),
                                          ("widened_weight_dtype", "bf16"),
                                          ("widened_weight_dtype", "q8_0")])
def test_bad_options_are_rejected(option, value):
    with pytest.raises(InvalidInputError) as info:
        load(**{option: value})
    assert info.value.check == option


def test_capabilities_follow_options():
    with load(kv_cache_dtype="bf16") as m:
        caps = m.capabilities
        assert caps.kv_cache_dtype == "bf16" and caps.compute_dtype == "f32"
        assert caps.requires_single_token_semantic_prefill is False
