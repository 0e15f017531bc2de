"""The transformer's building blocks in float32 NumPy, vectorized over tokens and heads."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """x / sqrt(mean(x^2) + eps) * weight over the last axis."""
    ms = np.einsum("...i,...i->...", x, x, dtype=np.float32) / np.float32(x.shape[-1])
    inv = 1.0 / np.sqrt(ms + np.float32(eps), dtype=np.float32)
    return x * inv[..., None] * weight


def rope_tables(positions: np.ndarray, head_dim: int, base: float) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin, (n, head_dim/2): angle = position * base^(-2i/head_dim).

    Angles are formed in float64 so long contexts keep their precision; tables are float32."""
    inv_freq = base ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    angles = positions.astype(np.float64)[:, None] * inv_freq[None, :]
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def apply_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Rotate ADJACENT pairs (x[2i], x[2i+1]) (ggml mode 0). x: (n, heads, head_dim)."""
    x0, x1 = x[..., 0::2], x[..., 1::2]
    c, s = cos[:, None, :], sin[:, None, :]
    out = np.empty_like(x)
    out[..., 0::2] = x0 * c - x1 * s
    out[..., 1::2] = x0 * s + x1 * c
    return out


def causal_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, q_start: int,
                     scale: float) -> np.ndarray:
    """Grouped-query attention with a causal mask offset.

    q: (n, n_head, d); k, v: (n_head_kv, T, d), K/V of positions 0..T-1. Query i sits at
    position q_start + i and sees keys 0..q_start+i. Query heads are grouped onto their KV
    head by reshaping (head h uses kv head h // group), so K/V are never copied per head.
    Returns (n, n_head * d).
    """
    n, n_head, d = q.shape
    n_kv, t = k.shape[0], k.shape[1]
    group = n_head // n_kv
    # (n_kv, group * n, d): all queries of one KV head in one matrix product
    qg = q.reshape(n, n_kv, group, d).transpose(1, 2, 0, 3).reshape(n_kv, group * n, d)
    scores = np.matmul(qg, k.transpose(0, 2, 1)) * np.float32(scale)  # (n_kv, group*n, T)
    scores = causal_softmax(scores.reshape(n_kv, group, n, t), q_start)
    out = np.matmul(scores.reshape(n_kv, group * n, t), v)  # (n_kv, group*n, d)
    return out.reshape(n_kv, group, n, d).transpose(2, 0, 1, 3).reshape(n, n_head * d)


def causal_softmax(scores: np.ndarray, q_start: int) -> np.ndarray:
    """Softmax over keys of scores (n_kv, group, n, T) for queries at positions q_start ..
    q_start + n - 1, each seeing keys up to its own position (in place where it can)."""
    n, t = scores.shape[2], scores.shape[3]
    if n > 1 or q_start + n < t:
        visible = np.arange(t)[None, :] <= (q_start + np.arange(n))[:, None]  # (n, T)
        scores = np.where(visible, scores, np.float32(-np.inf))
    scores -= scores.max(axis=-1, keepdims=True)
    np.exp(scores, out=scores)
    scores /= scores.sum(axis=-1, keepdims=True)
    return scores


def silu(x: np.ndarray) -> np.ndarray:
    """x * sigmoid(x), written with tanh so large |x| cannot overflow: (0.5 + 0.5 *
    tanh(0.5 x)) * x, its operations done in place in one new array."""
    out = np.multiply(x, np.float32(0.5))
    np.tanh(out, out=out)
    out *= np.float32(0.5)
    out += np.float32(0.5)
    out *= x
    return out


def swiglu(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """The feed-forward's gate: silu(gate) * up, in place in silu's one array instead of five
    temporaries (8 rows of 9728: 69 against 102 us)."""
    out = silu(gate)
    out *= up
    return out


KV = tuple[np.ndarray, np.ndarray]


@dataclass(frozen=True)
class Keys:
    """The K and V (each (n_kv, rows, d)) one call's queries attend to, in position order:
    a shared prefix's rows (or None), the sequence's cache's rows [0, n_cached) and the
    call's own new rows (float32, unrounded; None when a float32 cache holds them already).
    Cached rows are float32 or float16 (an f16 cache): readers widen them. The cache is
    given whole, not sliced: the kernels (attention.py) vectorize over rows they know to be
    contiguous, which a slice's type does not say."""

    prefix: KV | None
    cache: KV
    n_cached: int
    new: KV | None = None

    @property
    def blocks(self) -> list[KV]:
        cached = (self.cache[0][:, :self.n_cached], self.cache[1][:, :self.n_cached])
        return [b for b in (self.prefix, cached, self.new) if b is not None]

    @property
    def end(self) -> int:
        """Positions visible: the last query sits at end - 1."""
        return sum(b[0].shape[1] for b in self.blocks)

    def joined(self) -> KV:
        """K and V of every position as float32 (n_kv, end, d): one float32 block is read in
        place; more, or float16 ones, are copied into one (NumPy's product needs one)."""
        blocks = self.blocks
        if len(blocks) == 1 and blocks[0][0].dtype == np.float32:
            return blocks[0]
        return tuple(np.concatenate([b[i] for b in blocks], axis=1, dtype=np.float32)
                     for i in (0, 1))


def cached_attention(q: np.ndarray, keys: Keys, q_start: int, scale: float) -> np.ndarray:
    """causal_attention over the positions of keys (q's rows sit at q_start ..)."""
    return causal_attention(q, *keys.joined(), q_start, scale)


@dataclass(frozen=True)
class RowOps:
    """The norms, the rotation, the attention and the feed-forward's gate that a block runs:
    NumPy's (NUMPY_OPS), numba's where the backend has numba (row_kernels.KERNEL_OPS), or
    s2.cpp's own float32 numbers bit for bit for arithmetic="ggml" (ggml_ops.GGML_OPS). All
    compute the same float32 numbers up to rounding."""

    rms_norm: Callable[[np.ndarray, np.ndarray, float], np.ndarray]    # (x, weight, eps)
    rope: Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]   # (x, cos, sin)
    attention: Callable[[np.ndarray, Keys, int, float], np.ndarray]  # as cached_attention
    swiglu: Callable[[np.ndarray, np.ndarray], np.ndarray] = swiglu   # (gate, up)
    rope_tables: Callable[[np.ndarray, int, float], tuple] = rope_tables  # (positions, d, base)
    #: the attention spreads a call's rows and heads over the cores itself: a caller does not
    #: split it per KV head onto the workers (whose split computes NumPy's numbers)
    parallel_attention: bool = False
    #: (q (B, n_head, d), k, v (B, n_kv, capacity, d), end, scale) -> (B, n_head * d): the
    #: newest row of each of B sequences, at position end - 1, over its own cache's rows
    #: [0, end) in one call, each row with the numbers `attention` gives it alone; None:
    #: callers attend sequence by sequence
    attend_rows: Callable[[np.ndarray, np.ndarray, np.ndarray, int, float], np.ndarray] | None \
        = None


NUMPY_OPS = RowOps(rms_norm, apply_rope, cached_attention)
