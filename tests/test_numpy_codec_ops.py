"""The NumPy codec's building blocks against the kit's float64 operations (CODEC.md 4)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from s2core.codec.layout import Conv, ConvTranspose
from s2core.kit.codec_reference import causal_conv, conv_transpose
from s2core_numpy.codec import ConvOp, DepthwiseOp, _Encoder, erf, gelu


class _Tensors:
    """The two methods of CodecFile the ops read, over in-memory arrays."""

    def __init__(self, tensors: dict[str, np.ndarray]):
        self.tensors = tensors

    def tensor(self, name: str, dtype=np.float32) -> np.ndarray:
        return self.tensors[name].astype(dtype)


def test_erf_and_gelu_bounds():
    x = np.linspace(-6, 6, 20001).astype(np.float32)
    exact = np.array([math.erf(v) for v in x.astype(np.float64)])
    assert np.max(np.abs(erf(x) - exact)) < 2e-7  # Abramowitz & Stegun 7.1.26: 1.5e-7
    exact_gelu = np.array([0.5 * v * (1 + math.erf(v / math.sqrt(2))) for v in x.astype(np.float64)])
    assert np.max(np.abs(gelu(x) - exact_gelu)) < 1e-6


@pytest.mark.parametrize("c_in,c_out,kernel,stride,dilation", [
    (3, 5, 7, 1, 1), (4, 4, 7, 1, 9), (6, 2, 3, 1, 1), (3, 8, 8, 4, 1), (5, 5, 2, 2, 1),
    (4, 1, 7, 1, 1), (2, 3, 1, 1, 1)])
def test_conv_matches_causal_conv(c_in, c_out, kernel, stride, dilation):
    rng = np.random.default_rng(c_in * 100 + kernel)
    length = 37
    w = rng.standard_normal((c_out, c_in, kernel))
    b = rng.standard_normal(c_out)
    x = rng.standard_normal((c_in, length))
    spec = Conv("c", c_out, c_in, kernel, stride, dilation)
    op = ConvOp.from_conv(_Tensors({"c.weight": w, "c.bias": b}), spec)
    out = _Encoder._strided(op, x.T.astype(np.float32)).T  # time-major in and out
    ref = causal_conv(x, w, b, stride, dilation)
    assert out.shape == ref.shape == (c_out, -(-length // stride))
    np.testing.assert_allclose(out, ref, rtol=0, atol=2e-5 * np.abs(ref).max())


@pytest.mark.parametrize("stride,overlap", [(2, True), (8, True), (3, False), (2, False)])
def test_conv_transpose_as_tap_conv(stride, overlap):
    rng = np.random.default_rng(stride)
    c_in, c_out, length = 6, 4, 9
    kernel = 2 * stride if overlap else stride
    w = rng.standard_normal((c_in, c_out, kernel))
    b = rng.standard_normal(c_out)
    x = rng.standard_normal((c_in, length))
    op = ConvOp.from_transpose(_Tensors({"t.weight": w, "t.bias": b}),
                               ConvTranspose("t", c_in, c_out, kernel, stride))
    xh = np.concatenate([np.zeros((op.history, c_in)), x.T]).astype(np.float32)
    out = op(xh).reshape(-1, c_out).T
    full = conv_transpose(x, w, b, stride)
    ref = full[:, :length * stride]  # kernel 2s: the last s dropped; kernel s: nothing to drop
    np.testing.assert_allclose(out, ref, rtol=0, atol=2e-5 * np.abs(ref).max())


def test_depthwise_conv():
    rng = np.random.default_rng(5)
    d, length = 6, 20
    w = rng.standard_normal((d, 1, 7))
    b = rng.standard_normal(d)
    x = rng.standard_normal((d, length))
    op = DepthwiseOp(_Tensors({"dw.weight": w, "dw.bias": b}), Conv("dw", d, d, 7, depthwise=True))
    out = op(np.concatenate([np.zeros((6, d)), x.T]).astype(np.float32)).T
    np.testing.assert_allclose(out, causal_conv(x, w, b, groups=d), rtol=0, atol=1e-5)
