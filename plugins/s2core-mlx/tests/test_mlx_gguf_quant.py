"""GGUF quants -> MLX's affine format: the conversion is exact, and MLX computes with it.

"Exact" means bit-for-bit: mx.dequantize of the converted weights equals gguf's own
dequantization (the one ModelFile.dequantize and the float64 reference use).
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

from s2core.plugin import ModelFile
from s2core.kit.models import kit_model

mx = pytest.importorskip("mlx.core", reason="mlx is not installed (pip install 'mlx[cpu]')")

from s2core_mlx import gguf_quant  # noqa: E402
from s2core_mlx.gguf_quant import (BIAS_FACTORS, F16_EXACT_TYPES, MLX_BITS,  # noqa: E402
                                   bias_factor, convert, narrowed, pack, unpack)

CONVERTED = sorted(MLX_BITS, key=lambda t: t.name)
NOT_CONVERTED = [QT.Q2_K, QT.Q3_K, QT.Q6_K]


def mlx_dequantize(a: gguf_quant.AffineWeights) -> np.ndarray:
    w = mx.dequantize(mx.array(a.packed), mx.array(a.scales), mx.array(a.biases),
                      group_size=a.group_size, bits=a.bits)
    assert w.dtype == mx.float32
    return np.array(w)


def random_blocks(qtype: QT, rows: int, blocks_per_row: int, seed: int) -> np.ndarray:
    """Random bytes are a valid block of every type once its float16 fields are finite:
    this reaches every bit pattern of the quants and of the K-quants' packed 6-bit scales."""
    _, size = gguf.GGML_QUANT_SIZES[qtype]
    rng = np.random.default_rng(seed)
    b = rng.integers(0, 256, (rows * blocks_per_row, size), dtype=np.uint8)
    n_f16 = 2 if qtype in (QT.Q4_1, QT.Q5_1, QT.Q4_K, QT.Q5_K) else 1  # d (and m / dmin)
    # Finite float16 of both signs, from subnormals to ~1e3, and some exact zeros.
    shape = (b.shape[0], n_f16)
    halves = rng.standard_normal(shape) * 10.0 ** rng.integers(-7, 4, shape)
    halves[rng.random(halves.shape) < 0.05] = 0.0
    b[:, :2 * n_f16] = halves.astype("<f2").view(np.uint8)
    return b.reshape(rows, blocks_per_row * size)


# ---------------------------------------------------------------------- MLX's bit layout
@pytest.mark.parametrize("bits", [2, 3, 4, 5, 6, 8])
def test_pack_matches_mlx_layout(bits):
    """Our packing is MLX's: mx.quantize's words unpack to values that rebuild
    mx.dequantize's output, and pack() rebuilds the very same words."""
    w = mx.random.normal((16, 256), key=mx.random.key(bits))
    packed, scales, biases = mx.quantize(w, group_size=32, bits=bits)
    packed, scales, biases = np.array(packed), np.array(scales), np.array(biases)
    q = unpack(packed, bits)
    assert q.max() < 2 ** bits
    np.testing.assert_array_equal(pack(q, bits), packed)
    mine = gguf_quant.AffineWeights(packed, scales, biases, bits).dequantize()
    theirs = np.array(mx.dequantize(mx.array(packed), mx.array(scales), mx.array(biases),
                                    group_size=32, bits=bits))
    np.testing.assert_array_equal(mine, theirs)


@pytest.mark.parametrize("bits", [4, 5, 8])
def test_pack_unpack_round_trip_every_value(bits):
    q = np.arange(64 * 2 ** bits).reshape(-1, 64) % 2 ** bits
    q = q.astype(np.uint8)
    packed = pack(q, bits)
    assert packed.dtype == np.uint32 and packed.shape == (q.shape[0], 64 * bits // 32)
    np.testing.assert_array_equal(unpack(packed, bits), q)


# ---------------------------------------------------------------------- exactness
@pytest.mark.parametrize("qtype", CONVERTED, ids=lambda t: t.name)
def test_random_blocks_dequantize_exactly(qtype):
    block_values = gguf.GGML_QUANT_SIZES[qtype][0]
    blocks = random_blocks(qtype, rows=24, blocks_per_row=512 // block_values, seed=qtype.value)
    expected = gguf.quants.dequantize(blocks, qtype)
    converted = convert(blocks, qtype)
    assert converted.bits == MLX_BITS[qtype] and converted.shape == expected.shape
    np.testing.assert_array_equal(mlx_dequantize(converted), expected)
    np.testing.assert_array_equal(converted.dequantize(), expected)


@pytest.mark.parametrize("qtype", CONVERTED, ids=lambda t: t.name)
def test_model_file_tensors_dequantize_exactly(qtype):
    """Every tensor the writer stored in a convertible type (mha-k: rows of 256, so K-quants
    apply), converted from ModelFile.raw(), equals ModelFile.dequantize()."""
    mf = ModelFile(kit_model("mha-k", qtype.name.lower()))
    names = [t.name for t in mf.model_tensors() if t.type == qtype]
    assert len(names) >= 7  # at least the layers' projections and the embedding tables
    for name in names:
        converted = convert(mf.raw(name), qtype)
        np.testing.assert_array_equal(mlx_dequantize(converted), mf.dequantize(name),
                                      err_msg=name)


def test_k_quant_scales_need_float32():
    """Why K-quant scales stay float32: d * sc of a real Q4_K tensor is not representable in
    float16, and narrowed() refuses it."""
    mf = ModelFile(kit_model("mha-k", "q4_k"))
    converted = convert(mf.raw("layers.0.attention.wqkv.weight"), QT.Q4_K)
    assert converted.scales.dtype == np.float32
    assert np.any(converted.scales.astype(np.float16).astype(np.float32) != converted.scales)
    assert narrowed(converted) is None
    assert not F16_EXACT_TYPES & {QT.Q4_K, QT.Q5_K}


# ---------------------------------------------------------------------- float16 scales
def mlx_dequantize_rebuilt(a: gguf_quant.AffineWeights, factor: float | None) -> np.ndarray:
    """What the backend computes with: float16 scales widened, biases rebuilt if derived."""
    scales = mx.array(a.scales).astype(mx.float32)
    biases = scales * factor if factor is not None else mx.array(a.biases).astype(mx.float32)
    return np.array(mx.dequantize(mx.array(a.packed), scales, biases,
                                  group_size=a.group_size, bits=a.bits))


@pytest.mark.parametrize("qtype", sorted(F16_EXACT_TYPES, key=lambda t: t.name),
                         ids=lambda t: t.name)
def test_float16_scales_of_file_tensors_are_exact(qtype):
    mf = ModelFile(kit_model("mha-k", qtype.name.lower()))
    for name in [t.name for t in mf.model_tensors() if t.type == qtype]:
        small = narrowed(convert(mf.raw(name), qtype))
        assert small is not None and small.scales.dtype == small.biases.dtype == np.float16
        factor = bias_factor(small, qtype)
        assert factor == BIAS_FACTORS.get(qtype)
        expected = mf.dequantize(name)
        np.testing.assert_array_equal(mlx_dequantize_rebuilt(small, factor), expected, name)
        np.testing.assert_array_equal(mlx_dequantize_rebuilt(small, None), expected, name)
        np.testing.assert_array_equal(small.dequantize(), expected, name)


@pytest.mark.parametrize("qtype", sorted(F16_EXACT_TYPES, key=lambda t: t.name),
                         ids=lambda t: t.name)
def test_float16_scales_of_random_blocks_are_exact_or_refused(qtype):
    """Random d from subnormals to ~1e3: every tensor narrowed is exact; a -128 d (-8 d,
    -16 d) beyond float16's range is refused, never rounded to inf. With |d| kept below 256
    (as in any real file) every tensor narrows."""
    block_values = gguf.GGML_QUANT_SIZES[qtype][0]
    for seed in range(6):
        blocks = random_blocks(qtype, rows=8, blocks_per_row=256 // block_values, seed=seed)
        d = blocks.reshape(-1, gguf.GGML_QUANT_SIZES[qtype][1])[:, :2].copy().view("<f2")
        tamed = blocks.copy()
        tamed.reshape(d.shape[0], -1)[:, :2] = np.where(np.abs(d) < 256, d, d / 1024
                                                        ).astype("<f2").view(np.uint8)
        for b, must_narrow in ((blocks, False), (tamed, True)):
            small = narrowed(convert(b, qtype))
            if small is None:
                assert not must_narrow and qtype in BIAS_FACTORS  # only k*d can overflow
                continue
            np.testing.assert_array_equal(
                mlx_dequantize_rebuilt(small, bias_factor(small, qtype)),
                gguf.quants.dequantize(b, qtype))


def test_overflowing_bias_keeps_float32():
    """Q8_0 with d = 512: -128 d = -65536 is past float16's largest value (65504)."""
    blocks = random_blocks(QT.Q8_0, rows=2, blocks_per_row=2, seed=0)
    for d, fits in ((511.75, True), (512.0, False)):
        blocks[0, :2] = np.array([d], "<f2").view(np.uint8)
        converted = convert(blocks, QT.Q8_0)
        assert (narrowed(converted) is not None) == fits
    # The backend's fallback: float32 scales, biases still rebuilt exactly from them.
    assert bias_factor(converted, QT.Q8_0) == -128.0
    np.testing.assert_array_equal(mlx_dequantize_rebuilt(converted, -128.0),
                                  gguf.quants.dequantize(blocks, QT.Q8_0))


def test_bias_factor_only_where_the_bias_is_a_multiple():
    for qtype in (QT.Q4_1, QT.Q5_1, QT.Q4_K):
        blocks = random_blocks(qtype, rows=2, blocks_per_row=256 // gguf.GGML_QUANT_SIZES[qtype][0],
                               seed=3)
        assert bias_factor(convert(blocks, qtype), qtype) is None


# ---------------------------------------------------------------------- computing with it
@pytest.mark.parametrize("qtype", CONVERTED, ids=lambda t: t.name)
def test_quantized_matmul_matches_float_matmul(qtype):
    mf = ModelFile(kit_model("mha-k", qtype.name.lower()))
    name = "layers.0.feed_forward.w2.weight"  # [256, 512]
    assert mf.info(name).type == qtype
    c = convert(mf.raw(name), qtype)
    x = np.random.default_rng(0).standard_normal((5, c.shape[1])).astype(np.float32)
    out = mx.quantized_matmul(mx.array(x), mx.array(c.packed), mx.array(c.scales),
                              mx.array(c.biases), transpose=True, group_size=c.group_size,
                              bits=c.bits)
    assert out.dtype == mx.float32  # float32 activations with float32 scales stay float32
    expected = x.astype(np.float64) @ mf.dequantize(name, np.float64).T
    err = np.linalg.norm(np.array(out) - expected) / np.linalg.norm(expected)
    assert err < 2e-6, f"{qtype.name}: relative error {err:.2e}"


# ---------------------------------------------------------------------- what does not map
@pytest.mark.parametrize("qtype", NOT_CONVERTED, ids=lambda t: t.name)
def test_sixteen_value_sub_blocks_are_not_converted(qtype):
    assert not gguf_quant.is_convertible(qtype)
    with pytest.raises(ValueError, match="does not map"):
        convert(np.zeros((1, gguf.GGML_QUANT_SIZES[qtype][1]), np.uint8), qtype)


def test_ragged_rows_are_rejected():
    with pytest.raises(ValueError, match="whole blocks"):
        convert(np.zeros((2, 35), np.uint8), QT.Q8_0)


def test_large_tables_convert_in_chunks(monkeypatch):
    """Chunking bounds the temporaries and changes nothing in the result."""
    blocks = random_blocks(QT.Q5_K, rows=40, blocks_per_row=2, seed=1)
    whole = convert(blocks, QT.Q5_K)
    monkeypatch.setattr(gguf_quant, "_CHUNK_VALUES", 3 * 512)  # 3 rows per chunk
    chunked = convert(blocks, QT.Q5_K)
    for a, b in ((whole.packed, chunked.packed), (whole.scales, chunked.scales),
                 (whole.biases, chunked.biases)):
        np.testing.assert_array_equal(a, b)
