"""The NumPy CPU backend: float32 compute on BLAS, F16 KV cache by default (as s2.cpp).

Weights are widened to float32 on load, one tensor at a time (F32 files are used straight from
the memory map). The codebook table stays in its file type: a call decodes only the rows it
gathers.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from s2core.backend import Backend, Capabilities, check_option
from s2core.gguf_file import ModelFile
from s2core.inputs import EvalBatch

from . import ops
from .plugin import CACHE_DTYPES, numpy_capabilities

_CACHE_DTYPES = {"f16": np.float16, "f32": np.float32}
assert tuple(_CACHE_DTYPES) == CACHE_DTYPES


@dataclass
class BlockWeights:
    """One transformer block's tensors, float32, PyTorch order [out, in]."""

    attn_norm: np.ndarray
    ffn_norm: np.ndarray
    wqkv: np.ndarray
    wo: np.ndarray
    w1: np.ndarray
    w3: np.ndarray
    w2: np.ndarray
    q_norm: np.ndarray | None
    k_norm: np.ndarray | None

    @classmethod
    def load(cls, mf: ModelFile, prefix: str, qk_norm: bool) -> "BlockWeights":
        def w(name: str) -> np.ndarray:
            return mf.dequantize(f"{prefix}.{name}.weight")
        return cls(w("attention_norm"), w("ffn_norm"), w("attention.wqkv"), w("attention.wo"),
                   w("feed_forward.w1"), w("feed_forward.w3"), w("feed_forward.w2"),
                   w("attention.q_norm") if qk_norm else None,
                   w("attention.k_norm") if qk_norm else None)


@dataclass(frozen=True)
class StackShape:
    """What a block needs to know about its stack (the Slow-AR's or the Fast-AR's)."""

    n_head: int
    n_head_kv: int
    head_dim: int
    eps: float
    rope_base: float

    @property
    def scale(self) -> float:
        return 1.0 / float(np.sqrt(self.head_dim))


def qkv_projection(x: np.ndarray, blk: BlockWeights, s: StackShape, cos: np.ndarray,
                   sin: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """q (n, n_head, d) and k, v (n, n_head_kv, d), QK-normed and rotated."""
    n = x.shape[0]
    qkv = ops.rms_norm(x, blk.attn_norm, s.eps) @ blk.wqkv.T
    q_size, kv_size = s.n_head * s.head_dim, s.n_head_kv * s.head_dim
    q = qkv[:, :q_size].reshape(n, s.n_head, s.head_dim)
    k = qkv[:, q_size:q_size + kv_size].reshape(n, s.n_head_kv, s.head_dim)
    v = qkv[:, q_size + kv_size:].reshape(n, s.n_head_kv, s.head_dim)
    if blk.q_norm is not None:
        q = ops.rms_norm(q, blk.q_norm, s.eps)
        k = ops.rms_norm(k, blk.k_norm, s.eps)
    return ops.apply_rope(q, cos, sin), ops.apply_rope(k, cos, sin), np.ascontiguousarray(v)


def finish_block(x: np.ndarray, attn: np.ndarray, blk: BlockWeights, eps: float) -> np.ndarray:
    """Output projection, residual, SwiGLU feed-forward, residual."""
    h = x + attn @ blk.wo.T
    f = ops.rms_norm(h, blk.ffn_norm, eps)
    return h + (ops.silu(f @ blk.w1.T) * (f @ blk.w3.T)) @ blk.w2.T


class NumpyBackend(Backend):
    name = "numpy"

    def __init__(self, model_file: ModelFile, kv_cache_dtype: str = "f16"):
        super().__init__(model_file)
        self._cache_dtype = _CACHE_DTYPES[check_option("kv_cache_dtype", kv_cache_dtype,
                                                       CACHE_DTYPES)]
        self._caps = numpy_capabilities(kv_cache_dtype)
        hp = self.hparams
        self.embeddings = model_file.dequantize("embeddings.weight")
        self.norm = model_file.dequantize("norm.weight")
        self.layers = [BlockWeights.load(model_file, f"layers.{i}", hp.attention_qk_norm)
                       for i in range(hp.n_layer)]
        self.shape = StackShape(hp.n_head, hp.n_head_kv, hp.head_dim, hp.rms_norm_eps,
                                hp.rope_freq_base)
        self.fast = None if hp.fast is None else FastDecoder(model_file)
        self._k: np.ndarray | None = None  # [n_layer, n_head_kv, max_seq_len, head_dim]
        self._v: np.ndarray | None = None

    @property
    def capabilities(self) -> Capabilities:
        return self._caps

    # ---------------------------------------------------------------- KV cache
    def allocate_kv_cache(self, max_seq_len: int) -> None:
        hp = self.hparams
        shape = (hp.n_layer, hp.n_head_kv, max_seq_len, hp.head_dim)  # heads outermost: each
        self._k = np.zeros(shape, self._cache_dtype)                 # head's rows contiguous
        self._v = np.zeros(shape, self._cache_dtype)

    def free_kv_cache(self) -> None:
        self._k = self._v = None

    def read_kv_cache(self, n_positions: int) -> tuple[np.ndarray, np.ndarray]:
        return tuple(c[:, :, :n_positions].transpose(0, 2, 1, 3).astype(np.float32)
                     for c in (self._k, self._v))

    # ---------------------------------------------------------------- compute
    def _embed(self, batch: EvalBatch) -> np.ndarray:
        x = self.embeddings[batch.token_ids].astype(np.float32)
        sem = np.flatnonzero(batch.semantic_mask)
        if sem.size:
            ids = batch.codebook_ids[sem]  # (n_sem, C): only semantic rows are decoded
            rows = self.model_file.dequantize_rows("codebook_embeddings.weight", ids.reshape(-1))
            x[sem] += rows.reshape(ids.shape[0], ids.shape[1], -1).sum(axis=1)
        return x * batch.scale[:, None]

    def eval_cached(self, batch: EvalBatch) -> tuple[np.ndarray, np.ndarray]:
        s, n_past, n = self.shape, batch.n_past, batch.n_tokens
        end = n_past + n
        cos, sin = ops.rope_tables(batch.positions, s.head_dim, s.rope_base)
        x = self._embed(batch)
        last = len(self.layers) - 1
        for i, blk in enumerate(self.layers):
            q, k, v = qkv_projection(x, blk, s, cos, sin)
            k_heads, v_heads = k.transpose(1, 0, 2), v.transpose(1, 0, 2)
            self._k[i, :, n_past:end] = k_heads
            self._v[i, :, n_past:end] = v_heads
            # History comes back from the cache; this call's K/V stay float32 (as s2.cpp).
            keys = _with_history(self._k[i, :, :n_past], k_heads)
            values = _with_history(self._v[i, :, :n_past], v_heads)
            q_start = n_past
            if i == last and n > 1:
                # Only the last position reaches the output: skip the others' final block.
                x, q, q_start = x[-1:], q[-1:], end - 1
            x = finish_block(x, ops.causal_attention(q, keys, values, q_start, s.scale), blk, s.eps)
        hidden = ops.rms_norm(x[-1], self.norm, s.eps)
        return hidden, self.embeddings @ hidden

    def fast_decode(self, hidden: np.ndarray, prefix_codes: np.ndarray) -> np.ndarray:
        return self.fast(np.asarray(hidden, dtype=np.float32), prefix_codes)


def _with_history(past: np.ndarray, current: np.ndarray) -> np.ndarray:
    if past.shape[1] == 0:
        return current
    return np.concatenate([past.astype(np.float32), current], axis=1)


class FastDecoder:
    """The Fast-AR (SPEC 5): recomputed from scratch per call, as s2.cpp does."""

    def __init__(self, mf: ModelFile):
        f = mf.hparams.fast
        self.project_in = mf.dequantize("fast_project_in.weight") if f.project_in else None
        self.embeddings = mf.dequantize("fast_embeddings.weight")
        self.norm = mf.dequantize("fast_norm.weight")
        self.output = mf.dequantize("fast_output.weight")
        self.layers = [BlockWeights.load(mf, f"fast_layers.{i}", f.attention_qk_norm)
                       for i in range(f.n_layer)]
        self.shape = StackShape(f.n_head, f.n_head_kv, f.head_dim, f.rms_norm_eps, f.rope_freq_base)

    def __call__(self, hidden: np.ndarray, prefix_codes: np.ndarray) -> np.ndarray:
        s = self.shape
        first = hidden if self.project_in is None else self.project_in @ hidden
        x = np.concatenate([first[None, :], self.embeddings[prefix_codes]], axis=0)
        cos, sin = ops.rope_tables(np.arange(x.shape[0]), s.head_dim, s.rope_base)
        for blk in self.layers:
            q, k, v = qkv_projection(x, blk, s, cos, sin)
            attn = ops.causal_attention(q, k.transpose(1, 0, 2), v.transpose(1, 0, 2), 0, s.scale)
            x = finish_block(x, attn, blk, s.eps)
        return self.output @ ops.rms_norm(x[-1], self.norm, s.eps)

