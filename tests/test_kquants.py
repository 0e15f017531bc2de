"""Tests for s2core.embedded.kquants: numpy quantizer for the GGML K-quants.

Everything is checked through gguf's own decoder (gguf.quants.dequantize),
so a wrong bit layout shows up as a large reconstruction error.
"""

from __future__ import annotations

import numpy as np
import pytest

import gguf
from gguf.quants import dequantize, quant_shape_to_byte_shape

from s2core.embedded.kquants import quantize_k

T = gguf.GGMLQuantizationType

# Upper bounds on ||dequantize(quantize(x)) - x|| / ||x||.  Measured on these
# data sets (seeded, so deterministic): normal data gives about
# Q6_K 0.018, Q5_K 0.036, Q4_K 0.072, Q3_K 0.144, Q2_K 0.275.
# "Tame" data (normal, uniform, one-signed) must meet BOUNDS; data with
# outliers (which widen the range of their sub-block) must meet 2 * BOUNDS.
BOUNDS = {
    T.Q6_K: 0.02,
    T.Q5_K: 0.04,
    T.Q4_K: 0.08,
    T.Q3_K: 0.17,
    T.Q2_K: 0.32,
}
TYPES = list(BOUNDS)
STDS = (1e-3, 0.02, 1.0, 50.0)


def _rel(approx: np.ndarray, ref: np.ndarray) -> float:
    return float(np.linalg.norm(approx - ref) / np.linalg.norm(ref))


def _roundtrip(x: np.ndarray, qtype: T) -> np.ndarray:
    return dequantize(quantize_k(x, qtype), qtype)


def _make(kind: str, std: float, shape=(24, 1024), seed=0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.normal(0.0, std, shape)
    if kind == "normal":
        pass
    elif kind == "uniform":
        x = rng.uniform(-std, std, shape)
    elif kind == "negative":  # every value < 0: exercises the (positive) min
        x = -np.abs(x) - std
    elif kind == "positive":
        x = np.abs(x) + std
    elif kind == "outliers":  # ~1% of values 10-100x larger
        x = x * np.where(rng.random(shape) < 0.01, rng.uniform(10, 100, shape), 1.0)
    elif kind == "heavy_tail":  # Student t, 3 degrees of freedom
        x = rng.standard_t(3, shape) * std
    else:
        raise AssertionError(kind)
    return x.astype(np.float32)


TAME = ("normal", "uniform", "negative", "positive")
WILD = ("outliers", "heavy_tail")


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("shape", [(256,), (3, 512), (2, 3, 768)])
def test_shape_and_dtype(qtype, shape):
    x = _make("normal", 0.02, shape)
    q = quantize_k(x, qtype)
    assert q.dtype == np.uint8
    assert q.shape == quant_shape_to_byte_shape(shape, qtype)
    assert q.flags.c_contiguous
    assert dequantize(q, qtype).shape == shape


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("std", STDS)
@pytest.mark.parametrize("kind", TAME + WILD)
def test_relative_error(qtype, std, kind):
    x = _make(kind, std)
    bound = BOUNDS[qtype] * (2 if kind in WILD else 1)
    assert _rel(_roundtrip(x, qtype), x) < bound


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("kind", TAME + WILD)
def test_requantize_is_nearly_idempotent(qtype, kind):
    # Re-quantizing already-quantized values must change them much less than
    # the first quantization did (exactly not at all for most blocks).
    x = _make(kind, 0.02, seed=1)
    y = _roundtrip(x, qtype)
    y2 = _roundtrip(y, qtype)
    first = _rel(y, x)
    assert _rel(y2, y) < 0.5 * first
    if kind == "normal":
        assert _rel(y2, y) < 0.1 * first


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_zeros_and_constant_rows(qtype):
    x = np.zeros((6, 512), dtype=np.float32)
    x[1] = 0.37
    x[2] = -0.37
    x[3] = 1e-3
    x[4, :256] = -2.5  # one constant block, one zero block
    x[5] = _make("normal", 0.02, (512,))
    y = _roundtrip(x, qtype)
    assert np.array_equal(y[0], np.zeros(512, dtype=np.float32))
    assert np.array_equal(y[4, 256:], np.zeros(256, dtype=np.float32))
    # constant blocks only suffer the fp16 rounding of the super-block scale
    np.testing.assert_allclose(y[[1, 2, 4]], x[[1, 2, 4]], rtol=2e-3, atol=0)
    # ... which is coarser when d is an fp16 subnormal (below 6.1e-5)
    np.testing.assert_allclose(y[3], x[3], rtol=1e-2, atol=0)
    assert _rel(y[5], x[5]) < 2 * BOUNDS[qtype]


@pytest.mark.parametrize("qtype", [T.Q3_K, T.Q6_K], ids=lambda t: t.name)
def test_symmetric_types_keep_exact_zeros(qtype):
    # Q3_K/Q6_K have no min: a zero value always decodes to exactly zero.
    x = _make("normal", 0.02, (4, 1024))
    x[np.random.default_rng(2).random(x.shape) < 0.5] = 0.0
    y = _roundtrip(x, qtype)
    assert np.all(y[x == 0] == 0)


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_tiny_values_do_not_underflow(qtype):
    # The super-block scale is fp16; it must not flush to zero for small data.
    x = _make("normal", 1e-5)
    assert _rel(_roundtrip(x, qtype), x) < 1.5 * BOUNDS[qtype]


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_bad_row_length_raises(qtype):
    for shape in [(255,), (4, 300), (2, 128)]:
        with pytest.raises(ValueError, match=rf"\({shape[-1]}\).*256"):
            quantize_k(np.zeros(shape, dtype=np.float32), qtype)


@pytest.mark.parametrize("qtype", [T.F32, T.F16, T.Q8_0, T.Q4_0, T.Q8_K, T.IQ2_XXS],
                         ids=lambda t: t.name)
def test_unsupported_type_raises(qtype):
    with pytest.raises(ValueError, match=qtype.name):
        quantize_k(np.zeros((1, 256), dtype=np.float32), qtype)


def test_non_finite_raises():
    x = np.zeros((1, 256), dtype=np.float32)
    x[0, 7] = np.nan
    with pytest.raises(ValueError):
        quantize_k(x, T.Q4_K)


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_deterministic_and_blockwise(qtype):
    # Blocks are independent: quantizing rows separately gives the same bytes.
    x = _make("normal", 0.02, (5, 768))
    q = quantize_k(x, qtype)
    assert np.array_equal(q, quantize_k(x, qtype))
    rows = np.stack([quantize_k(row, qtype) for row in x])
    assert np.array_equal(q, rows)


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_gguf_file_roundtrip(qtype, tmp_path):
    # The output is exactly what GGUFWriter.add_tensor(raw_dtype=...) expects.
    x = _make("normal", 0.02, (8, 512))
    q = quantize_k(x, qtype)
    path = tmp_path / "kq.gguf"
    writer = gguf.GGUFWriter(str(path), "test")
    writer.add_tensor("w", q, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()

    (tensor,) = gguf.GGUFReader(str(path)).tensors
    assert tensor.tensor_type == qtype
    assert list(tensor.shape) == [512, 8]  # GGUF stores dims innermost first
    data = np.asarray(tensor.data)
    assert np.array_equal(data.reshape(q.shape), q)
    np.testing.assert_array_equal(dequantize(data, qtype).reshape(x.shape), _roundtrip(x, qtype))
