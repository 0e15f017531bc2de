"""The conventions of MLX's fused kernels that the backend relies on, checked in float64.

If a future MLX changed any of them, these fail with a precise message before the
conformance matrix fails with a vague one.
"""

from __future__ import annotations

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core", reason="mlx is not installed (pip install 'mlx[cpu]')")


def rope_adjacent_pairs(x: np.ndarray, positions: np.ndarray, base: float) -> np.ndarray:
    """SPEC 2.5: rotate (x[2i], x[2i+1]) by position * base^(-2i/d). x: (..., T, d)."""
    d = x.shape[-1]
    angle = positions[:, None] * base ** (-np.arange(0, d, 2) / d)[None, :]
    c, s = np.cos(angle), np.sin(angle)
    out = np.empty(x.shape)
    out[..., 0::2] = x[..., 0::2] * c - x[..., 1::2] * s
    out[..., 1::2] = x[..., 0::2] * s + x[..., 1::2] * c
    return out


@pytest.mark.parametrize("offset", [0, 5, 300])
def test_traditional_rope_rotates_adjacent_pairs_from_the_offset(offset):
    x = np.random.default_rng(offset).standard_normal((1, 3, 4, 32)).astype(np.float32)
    out = mx.fast.rope(mx.array(x), 32, traditional=True, base=1e6, scale=1.0, offset=offset)
    expected = rope_adjacent_pairs(x.astype(np.float64), offset + np.arange(4), 1e6)
    # float32 angles: the error grows with the position (about 1e-7 * position radians)
    np.testing.assert_allclose(np.array(out), expected, rtol=0, atol=1e-6 + 2e-7 * offset)
    other = mx.fast.rope(mx.array(x), 32, traditional=False, base=1e6, scale=1.0, offset=offset)
    if offset:
        assert np.abs(np.array(other) - expected).max() > 1e-2  # the NeoX layout is not it


@pytest.mark.parametrize("n_past,n", [(0, 5), (7, 1), (7, 4)])
def test_causal_string_mask_is_the_offset_causal_mask_with_gqa(n_past, n):
    """Queries at positions n_past.. over keys 0..n_past+n-1; 4 query heads on 2 KV heads
    (query head h reads KV head h // 2, repeat-interleave)."""
    rng = np.random.default_rng(n_past * 10 + n)
    q = rng.standard_normal((1, 4, n, 8)).astype(np.float32)
    k = rng.standard_normal((1, 2, n_past + n, 8)).astype(np.float32)
    v = rng.standard_normal((1, 2, n_past + n, 8)).astype(np.float32)
    out = mx.fast.scaled_dot_product_attention(
        mx.array(q), mx.array(k), mx.array(v), scale=8 ** -0.5,
        mask="causal" if n > 1 else None)
    expected = np.empty((4, n, 8))
    for h in range(4):
        scores = q[0, h].astype(np.float64) @ k[0, h // 2].T.astype(np.float64) * 8 ** -0.5
        visible = np.arange(n_past + n)[None, :] <= (n_past + np.arange(n))[:, None]
        scores = np.where(visible, scores, -np.inf)
        p = np.exp(scores - scores.max(axis=1, keepdims=True))
        expected[h] = (p / p.sum(axis=1, keepdims=True)) @ v[0, h // 2]
    np.testing.assert_allclose(np.array(out)[0], expected, rtol=0, atol=1e-5)


def test_quantized_matmul_widens_float16_scales_for_float32_activations():
    """MLX's quantized kernels take one float type for x, scales and biases: float16 scales with
    float32 activations are widened to float32 first (an AsType in the graph, on every device),
    so the product is float32 and bit-identical to the float32-scale product. The backend does
    that widening itself (QuantizedMatrix.project), so its float32 compute does not depend on
    this rule; this test records it."""
    rng = np.random.default_rng(0)
    w = mx.array(rng.integers(0, 2 ** 32, (64, 64), dtype=np.uint32))  # 64 x 256 8-bit values
    d = (rng.standard_normal((64, 8)) * 1e-2).astype(np.float16)
    s16, b16 = mx.array(d), mx.array(d * np.float16(-128))
    s32, b32 = s16.astype(mx.float32), b16.astype(mx.float32)
    x = mx.array(rng.standard_normal((3, 256)).astype(np.float32))
    mixed = mx.quantized_matmul(x, w, s16, b16, transpose=True, group_size=32, bits=8)
    wide = mx.quantized_matmul(x, w, s32, b32, transpose=True, group_size=32, bits=8)
    assert mixed.dtype == wide.dtype == mx.float32
    np.testing.assert_array_equal(np.array(mixed), np.array(wide))
    # mx.dequantize instead follows the scales' type: the backend widens gathered rows first.
    assert mx.dequantize(w, s16, b16, group_size=32, bits=8).dtype == mx.float16
