"""A float64 reference of SPEC sections 2 and 5, written straight from the text.

Independent of every backend: no KV cache (each call evaluates the whole sequence from
position 0), explicit loops over heads, float64 throughout. Slow, so only for tiny models.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from s2core.modelfile.file import ModelFile
from s2core.modelfile.hparams import Hparams


@dataclass
class ReferenceOutput:
    hidden: np.ndarray  # (dim,) of the last position
    logits: np.ndarray  # (vocab,)
    k: np.ndarray       # [n_layer, n_positions, n_head_kv, head_dim], after QK-norm and RoPE
    v: np.ndarray


def _rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def _rope(x: np.ndarray, position: int, base: float) -> np.ndarray:
    """Rotate adjacent pairs (x[2i], x[2i+1]) by position * base^(-2i/d)."""
    d = x.shape[-1]
    out = x.copy()
    for i in range(d // 2):
        angle = position * base ** (-2.0 * i / d)
        c, s = np.cos(angle), np.sin(angle)
        a, b = x[..., 2 * i], x[..., 2 * i + 1]
        out[..., 2 * i] = a * c - b * s
        out[..., 2 * i + 1] = a * s + b * c
    return out


def _silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


class _Stack:
    """One stack of transformer blocks (the Slow-AR's or the Fast-AR's) in float64."""

    def __init__(self, mf: ModelFile, prefix: str, n_layer: int, n_head: int, n_head_kv: int,
                 head_dim: int, eps: float, rope_base: float, qk_norm: bool):
        self.n_head, self.n_head_kv, self.head_dim = n_head, n_head_kv, head_dim
        self.eps, self.rope_base, self.qk_norm = eps, rope_base, qk_norm

        def w(name: str) -> np.ndarray:
            return mf.dequantize(name, np.float64)
        self.layers = []
        for i in range(n_layer):
            p = f"{prefix}.{i}"
            layer = {k: w(f"{p}.{k}.weight") for k in (
                "attention_norm", "ffn_norm", "attention.wqkv", "attention.wo",
                "feed_forward.w1", "feed_forward.w3", "feed_forward.w2")}
            if qk_norm:
                layer["q_norm"] = w(f"{p}.attention.q_norm.weight")
                layer["k_norm"] = w(f"{p}.attention.k_norm.weight")
            self.layers.append(layer)

    def run(self, x: np.ndarray, positions: np.ndarray) -> tuple[np.ndarray, list, list]:
        """x: (T, dim) for positions `positions`; full causal attention over the T rows."""
        t_len = x.shape[0]
        hd, nh, nkv = self.head_dim, self.n_head, self.n_head_kv
        q_size, kv_size = nh * hd, nkv * hd
        ks, vs = [], []
        for layer in self.layers:
            a = _rms_norm(x, layer["attention_norm"], self.eps)
            qkv = a @ layer["attention.wqkv"].T
            q = qkv[:, :q_size].reshape(t_len, nh, hd)
            k = qkv[:, q_size:q_size + kv_size].reshape(t_len, nkv, hd)
            v = qkv[:, q_size + kv_size:].reshape(t_len, nkv, hd)
            if self.qk_norm:
                q = _rms_norm(q, layer["q_norm"], self.eps)
                k = _rms_norm(k, layer["k_norm"], self.eps)
            q = np.stack([_rope(q[t], int(positions[t]), self.rope_base) for t in range(t_len)])
            k = np.stack([_rope(k[t], int(positions[t]), self.rope_base) for t in range(t_len)])
            ks.append(k)
            vs.append(v)
            attn = np.zeros((t_len, nh, hd))
            group = nh // nkv
            for h in range(nh):
                kv_head = h // group
                scores = q[:, h, :] @ k[:, kv_head, :].T / np.sqrt(hd)
                scores = np.where(np.tril(np.ones((t_len, t_len), bool)), scores, -np.inf)
                p = np.exp(scores - scores.max(axis=1, keepdims=True))
                p /= p.sum(axis=1, keepdims=True)
                attn[:, h, :] = p @ v[:, kv_head, :]
            h_res = x + attn.reshape(t_len, q_size) @ layer["attention.wo"].T
            f = _rms_norm(h_res, layer["ffn_norm"], self.eps)
            x = h_res + (_silu(f @ layer["feed_forward.w1"].T) * (f @ layer["feed_forward.w3"].T)) \
                @ layer["feed_forward.w2"].T
        return x, ks, vs


class Reference:
    """Float64 evaluation of a model file, for comparing backends against."""

    def __init__(self, mf: ModelFile):
        hp: Hparams = mf.hparams
        self.hp = hp
        self.embeddings = mf.dequantize("embeddings.weight", np.float64)
        self.codebooks = mf.dequantize("codebook_embeddings.weight", np.float64)
        self.norm = mf.dequantize("norm.weight", np.float64)
        self.slow = _Stack(mf, "layers", hp.n_layer, hp.n_head, hp.n_head_kv, hp.head_dim,
                           hp.rms_norm_eps, hp.rope_freq_base, hp.attention_qk_norm)
        f = hp.fast
        if f is not None:
            self.fast_project_in = (mf.dequantize("fast_project_in.weight", np.float64)
                                    if f.project_in else None)
            self.fast_embeddings = mf.dequantize("fast_embeddings.weight", np.float64)
            self.fast_norm = mf.dequantize("fast_norm.weight", np.float64)
            self.fast_output = mf.dequantize("fast_output.weight", np.float64)
            self.fast = _Stack(mf, "fast_layers", f.n_layer, f.n_head, f.n_head_kv, f.head_dim,
                               f.rms_norm_eps, f.rope_freq_base, f.attention_qk_norm)

    def embed(self, tokens: np.ndarray) -> np.ndarray:
        """SPEC 2.3-2.4 for a (T, C+1) integer matrix."""
        hp = self.hp
        rows = []
        for row in np.asarray(tokens, dtype=np.int64):
            x = self.embeddings[row[0]].copy()
            semantic = hp.semantic_begin_id <= row[0] <= hp.semantic_end_id
            if semantic:
                for cb in range(hp.num_codebooks):
                    x += self.codebooks[row[1 + cb] + cb * hp.codebook_size]
                if hp.scale_codebook_embeddings:
                    x *= 1.0 / np.sqrt(hp.num_codebooks + 1)
            rows.append(x)
        return np.stack(rows)

    def forward(self, tokens: np.ndarray) -> ReferenceOutput:
        """The whole sequence `tokens` (T, C+1) from position 0; outputs of the last position."""
        x = self.embed(tokens)
        x, ks, vs = self.slow.run(x, np.arange(x.shape[0]))
        hidden = _rms_norm(x[-1], self.norm, self.hp.rms_norm_eps)
        return ReferenceOutput(hidden, self.embeddings @ hidden, np.stack(ks), np.stack(vs))

    def fast_decode(self, hidden: np.ndarray, prefix_codes) -> np.ndarray:
        f = self.hp.fast
        h = np.asarray(hidden, np.float64)
        first = h if self.fast_project_in is None else self.fast_project_in @ h
        codes = np.asarray(prefix_codes, dtype=np.int64).reshape(-1)
        x = np.concatenate([first[None], self.fast_embeddings[codes]], axis=0)
        x, _, _ = self.fast.run(x, np.arange(x.shape[0]))
        return self.fast_output @ _rms_norm(x[-1], self.fast_norm, f.rms_norm_eps)
