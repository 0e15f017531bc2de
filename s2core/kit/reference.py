"""A float64 reference of SPEC sections 2 and 5, written straight from the text.

Independent of every backend: no KV cache (each call evaluates the whole sequence from
position 0), explicit loops over heads, float64 throughout. Slow, so only for tiny models.

arithmetic="ggml": every product with a non-F32 weight first rounds its activation as s2.cpp's
ggml does (s2core/kit/ggml_arithmetic.py); "f32" feeds the activation as it is.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from s2core.gguf.blocks import block_shape
from s2core.kit.ggml_arithmetic import block_mins_of, ggml_product
from s2core.modelfile.file import ModelFile
from s2core.modelfile.hparams import Hparams


@dataclass
class ReferenceOutput:
    hidden: np.ndarray  # (dim,) of the last position
    logits: np.ndarray  # (vocab,)
    k: np.ndarray       # [n_layer, n_positions, n_head_kv, head_dim], after QK-norm and RoPE
    v: np.ndarray


#: the tensors of a block that are matrices (the rest are norm vectors)
MATRICES = ("attention.wqkv.weight", "attention.wo.weight", "feed_forward.w1.weight",
            "feed_forward.w3.weight", "feed_forward.w2.weight")


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


class _Products:
    """x @ W^T for the file's matrices, in the reference's arithmetic."""

    def __init__(self, mf: ModelFile, arithmetic: str):
        self.mf, self.arithmetic = mf, arithmetic
        self.types, self.mins = {}, {}

    def weight(self, name: str) -> np.ndarray:
        qtype = self.mf.info(name).type
        self.types[name] = qtype
        if qtype.name in ("Q4_1", "Q5_1"):
            self.mins[name] = block_mins_of(self.mf.raw(name), block_shape(qtype)[1])
        return self.mf.dequantize(name, np.float64)

    def __call__(self, x: np.ndarray, w: np.ndarray, name: str) -> np.ndarray:
        if self.arithmetic == "f32":
            return x @ w.T
        return ggml_product(x, w, self.types[name], self.mins.get(name))


class _Stack:
    """One stack of transformer blocks (the Slow-AR's or the Fast-AR's) in float64."""

    def __init__(self, mf: ModelFile, prefix: str, n_layer: int, n_head: int, n_head_kv: int,
                 head_dim: int, eps: float, rope_base: float, qk_norm: bool,
                 products: _Products):
        self.n_head, self.n_head_kv, self.head_dim = n_head, n_head_kv, head_dim
        self.eps, self.rope_base, self.qk_norm = eps, rope_base, qk_norm
        self.products, self.prefix = products, prefix

        def w(name: str) -> np.ndarray:
            return products.weight(name) if name.endswith(MATRICES) \
                else mf.dequantize(name, np.float64)
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
        for i, layer in enumerate(self.layers):
            def mm(a: np.ndarray, key: str, layer: dict = layer, i: int = i) -> np.ndarray:
                return self.products(a, layer[key], f"{self.prefix}.{i}.{key}.weight")
            a = _rms_norm(x, layer["attention_norm"], self.eps)
            qkv = mm(a, "attention.wqkv")
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
            h_res = x + mm(attn.reshape(t_len, q_size), "attention.wo")
            f = _rms_norm(h_res, layer["ffn_norm"], self.eps)
            x = h_res + mm(_silu(mm(f, "feed_forward.w1")) * mm(f, "feed_forward.w3"),
                           "feed_forward.w2")
        return x, ks, vs


class Reference:
    """Float64 evaluation of a model file, for comparing backends against, in one arithmetic
    ("f32" or "ggml", see above)."""

    def __init__(self, mf: ModelFile, arithmetic: str = "f32"):
        hp: Hparams = mf.hparams
        self.hp = hp
        self.arithmetic = arithmetic
        self.products = products = _Products(mf, arithmetic)
        self.embeddings = products.weight("embeddings.weight")
        self.codebooks = mf.dequantize("codebook_embeddings.weight", np.float64)
        self.norm = mf.dequantize("norm.weight", np.float64)
        self.slow = _Stack(mf, "layers", hp.n_layer, hp.n_head, hp.n_head_kv, hp.head_dim,
                           hp.rms_norm_eps, hp.rope_freq_base, hp.attention_qk_norm, products)
        f = hp.fast
        if f is not None:
            self.fast_project_in = (products.weight("fast_project_in.weight")
                                    if f.project_in else None)
            self.fast_embeddings = mf.dequantize("fast_embeddings.weight", np.float64)
            self.fast_norm = mf.dequantize("fast_norm.weight", np.float64)
            self.fast_output = products.weight("fast_output.weight")
            self.fast = _Stack(mf, "fast_layers", f.n_layer, f.n_head, f.n_head_kv, f.head_dim,
                               f.rms_norm_eps, f.rope_freq_base, f.attention_qk_norm, products)

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
        logits = self.products(hidden, self.embeddings, "embeddings.weight")
        return ReferenceOutput(hidden, logits, np.stack(ks), np.stack(vs))

    def fast_decode(self, hidden: np.ndarray, prefix_codes) -> np.ndarray:
        f = self.hp.fast
        h = np.asarray(hidden, np.float64)
        first = h if self.fast_project_in is None else self.products(
            h, self.fast_project_in, "fast_project_in.weight")
        codes = np.asarray(prefix_codes, dtype=np.int64).reshape(-1)
        x = np.concatenate([first[None], self.fast_embeddings[codes]], axis=0)
        x, _, _ = self.fast.run(x, np.arange(x.shape[0]))
        return self.products(_rms_norm(x[-1], self.fast_norm, f.rms_norm_eps), self.fast_output,
                             "fast_output.weight")
