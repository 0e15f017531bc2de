"""Q2_K, Q3_K and Q6_K in the split layout (s2core_mlx.sub_blocks): exact, and multiplied by
one mx.quantized_matmul over activations with zeros interleaved."""

from __future__ import annotations

import shutil

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

import s2core
from s2core.plugin import NonFiniteScalesWarning
from s2core.kit.conformance import prompt_and_frames, rel_err
from s2core.kit.models import kit_model, kit_reference
from s2core.kit import random_blocks, set_scale

mx = pytest.importorskip("mlx.core", reason="mlx is not installed (pip install 'mlx[cpu]')")

from s2core_mlx import sub_blocks  # noqa: E402
from s2core_mlx.weights import DenseMatrix, QuantizedMatrix, interleave_zeros  # noqa: E402

SPLIT = [QT.Q2_K, QT.Q3_K, QT.Q6_K]
IDS = [t.name for t in SPLIT]


def as_matrix(qtype: QT, raw: np.ndarray) -> QuantizedMatrix:
    return QuantizedMatrix.from_affine(sub_blocks.convert_split(raw, qtype),
                                       sub_blocks.BIAS_FACTORS.get(qtype), split=True)


@pytest.mark.parametrize("qtype", SPLIT, ids=IDS)
def test_split_layout_is_gguf_bit_for_bit(qtype):
    raw = random_blocks(qtype, 11, 3, seed=int(qtype))
    a = sub_blocks.convert_split(raw, qtype)
    assert a.bits == sub_blocks.SPLIT_BITS[qtype] and a.group_size == 32
    assert a.scales.shape == (11, 3 * 256 // 16) and a.scales.dtype == np.float32
    expected = gguf.quants.dequantize(raw, qtype)
    padded = np.array(mx.dequantize(mx.array(a.packed), mx.array(a.scales), mx.array(a.biases),
                                    group_size=32, bits=a.bits))
    assert padded.shape == (11, 2 * 3 * 256)
    np.testing.assert_array_equal(sub_blocks.unsplit(padded), expected)
    np.testing.assert_array_equal(sub_blocks.unsplit(a.dequantize()), expected)  # NumPy's view
    if qtype in sub_blocks.BIAS_FACTORS:  # the bias is rebuilt from the scale, exactly
        np.testing.assert_array_equal(a.scales * np.float32(sub_blocks.BIAS_FACTORS[qtype]),
                                      a.biases)
    m = as_matrix(qtype, raw)
    ids = mx.array([3, 0, 10, 3])
    np.testing.assert_array_equal(np.array(m.rows(ids)), expected[[3, 0, 10, 3]])


@pytest.mark.parametrize("qtype", SPLIT, ids=IDS)
def test_split_product_matches_the_float64_product(qtype):
    raw = random_blocks(qtype, 37, 2, seed=40 + int(qtype))
    w = gguf.quants.dequantize(raw, qtype).astype(np.float64)
    x = np.random.default_rng(1).standard_normal((5, w.shape[1])).astype(np.float32)
    out = np.array(as_matrix(qtype, raw).project(mx.array(x)))
    assert out.shape == (5, 37)
    assert rel_err(out, x.astype(np.float64) @ w.T) < 1e-6


def test_interleave_zeros_lays_out_each_16_values_then_16_zeros():
    x = mx.arange(64, dtype=mx.float32).reshape(2, 32)
    y = np.array(interleave_zeros(x))
    assert y.shape == (2, 64)
    np.testing.assert_array_equal(y[0, :16], np.arange(16))
    np.testing.assert_array_equal(y[0, 16:32], 0)
    np.testing.assert_array_equal(y[1, 32:48], np.arange(48, 64))


def test_ragged_rows_and_other_types_are_refused():
    with pytest.raises(ValueError, match="whole blocks"):
        sub_blocks.convert_split(np.zeros((2, 211), np.uint8), QT.Q6_K)
    with pytest.raises(ValueError, match="no 16-value sub-blocks"):
        sub_blocks.convert_split(np.zeros((2, 144), np.uint8), QT.Q4_K)


@pytest.mark.parametrize("weight_type", ["q6_k", "q4_k_m"])
def test_split_model_matches_the_widened_one(weight_type):
    """The same file with the split layout and widened to float32: the same numbers (up to
    the products' float32 rounding), the split one in far fewer bytes."""
    prompt, frames = prompt_and_frames("mha-k")
    results = []
    for mode in ("split", "widen"):
        with s2core.load(kit_model("mha-k", weight_type), backend="mlx",
                         sub_block_quants=mode) as m:
            m.init_kv_cache(64)
            m.prefill(prompt)
            results.append(m.step(frames[0]).logits)
    assert rel_err(results[0], results[1]) < 1e-5
    ref = kit_reference("mha-k", weight_type).forward(np.vstack([prompt, frames[0]]))
    assert rel_err(results[0], ref.logits) < 3e-3


@pytest.mark.filterwarnings("ignore:invalid value encountered in multiply:RuntimeWarning")
def test_a_tensor_with_a_non_finite_scale_is_widened_and_says_so(tmp_path):
    path = tmp_path / "nan.gguf"
    shutil.copy(kit_model("mha-k", "q6_k"), path)
    reader = gguf.GGUFReader(path, "r+")
    tensor = next(t for t in reader.tensors if t.name == "layers.0.attention.wo.weight")
    set_scale(tensor.data, QT.Q6_K, 2, np.nan)
    reader.data.flush()
    del reader
    with pytest.warns(NonFiniteScalesWarning, match=r"layers.0.attention.wo.weight.*1 block"):
        m = s2core.load(path, backend="mlx")
    with m:
        wo = m.backend.slow.layers[0].wo
        assert isinstance(wo, DenseMatrix) and wo.w.dtype == mx.float32
        expected = m.model_file.dequantize("layers.0.attention.wo.weight")
        np.testing.assert_array_equal(np.array(wo.w), expected)  # NaNs where gguf has them
        assert np.isnan(expected).any()
        assert isinstance(m.backend.slow.layers[0].w1, QuantizedMatrix)
