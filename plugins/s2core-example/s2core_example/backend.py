"""The whole backend: load weights, keep a KV cache, evaluate. The core has already validated
every input and prepared the per-position values (EvalBatch), so only the math is here."""

import numpy as np

from s2core.plugin import Backend, check_option


def rms_norm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def rope(x, positions, base):
    """Rotate adjacent pairs (x[2i], x[2i+1]); x: (tokens, heads, head_dim)."""
    d = x.shape[-1]
    angle = positions[:, None] * base ** (-np.arange(0, d, 2) / d)  # (tokens, d/2), float64
    cos, sin = np.cos(angle)[:, None, :], np.sin(angle)[:, None, :]
    even, odd = x[..., 0::2], x[..., 1::2]
    return np.stack([even * cos - odd * sin, even * sin + odd * cos], axis=-1).reshape(x.shape)


class Stack:
    """The transformer blocks of one stack ("layers" or "fast_layers")."""

    def __init__(self, mf, prefix, n_layer, n_head, n_head_kv, head_dim, eps, base, qk_norm):
        self.n_head, self.n_head_kv, self.head_dim = n_head, n_head_kv, head_dim
        self.eps, self.base, self.qk_norm = eps, base, qk_norm
        self.layers = [{name.split(".")[-1]: mf.dequantize(f"{prefix}.{i}.{name}.weight")
                        for name in ("attention_norm", "ffn_norm", "attention.wqkv", "attention.wo",
                                     "feed_forward.w1", "feed_forward.w2", "feed_forward.w3")
                        + (("attention.q_norm", "attention.k_norm") if qk_norm else ())}
                       for i in range(n_layer)]

    def qkv(self, layer, x, positions):
        n, hd = x.shape[0], self.head_dim
        qkv = rms_norm(x, layer["attention_norm"], self.eps) @ layer["wqkv"].T
        q_end, k_end = self.n_head * hd, (self.n_head + self.n_head_kv) * hd
        q = qkv[:, :q_end].reshape(n, self.n_head, hd)
        k = qkv[:, q_end:k_end].reshape(n, self.n_head_kv, hd)
        v = qkv[:, k_end:].reshape(n, self.n_head_kv, hd)
        if self.qk_norm:
            q, k = rms_norm(q, layer["q_norm"], self.eps), rms_norm(k, layer["k_norm"], self.eps)
        return rope(q, positions, self.base), rope(k, positions, self.base), v

    def attend_and_ffn(self, layer, x, q, keys, values, first_position):
        """keys/values: (T, n_head_kv, d) for positions 0..T-1; q: (n, n_head, d)."""
        group = self.n_head // self.n_head_kv
        keys, values = np.repeat(keys, group, axis=1), np.repeat(values, group, axis=1)
        scores = np.einsum("nhd,thd->hnt", q, keys) / np.sqrt(self.head_dim)
        query_pos = first_position + np.arange(q.shape[0])
        scores[:, np.arange(keys.shape[0])[None, :] > query_pos[:, None]] = -np.inf
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        attn = np.einsum("hnt,thd->nhd", probs, values).reshape(q.shape[0], -1)
        h = x + attn @ layer["wo"].T
        f = rms_norm(h, layer["ffn_norm"], self.eps)
        gate = f @ layer["w1"].T
        return h + (gate / (1 + np.exp(-gate)) * (f @ layer["w3"].T)) @ layer["w2"].T


class ExampleBackend(Backend):
    name = "example"

    def __init__(self, model_file, kv_cache_dtype="f32"):
        super().__init__(model_file)
        check_option("kv_cache_dtype", kv_cache_dtype, ("f32",))
        hp, f = self.hparams, self.hparams.fast
        self.embeddings = model_file.dequantize("embeddings.weight")
        self.codebooks = model_file.dequantize("codebook_embeddings.weight")
        self.norm = model_file.dequantize("norm.weight")
        self.slow = Stack(model_file, "layers", hp.n_layer, hp.n_head, hp.n_head_kv, hp.head_dim,
                          hp.rms_norm_eps, hp.rope_freq_base, hp.attention_qk_norm)
        self.fast = Stack(model_file, "fast_layers", f.n_layer, f.n_head, f.n_head_kv, f.head_dim,
                          f.rms_norm_eps, f.rope_freq_base, f.attention_qk_norm)
        self.fast_tensors = {n: model_file.dequantize(f"fast_{n}.weight")
                             for n in ("embeddings", "norm", "output")
                             + (("project_in",) if f.project_in else ())}
        self.cache = None

    @property
    def capabilities(self):
        from .plugin import CAPABILITIES
        return CAPABILITIES

    def allocate_kv_cache(self, max_seq_len):
        hp = self.hparams
        self.cache = np.zeros((2, hp.n_layer, max_seq_len, hp.n_head_kv, hp.head_dim), np.float32)

    def free_kv_cache(self):
        self.cache = None

    def read_kv_cache(self, n_positions):
        return self.cache[0, :, :n_positions].copy(), self.cache[1, :, :n_positions].copy()

    def write_kv_cache(self, k, v):  # optional: restores a saved voice prefix without recomputing
        n = k.shape[1]
        self.cache[0, :, :n], self.cache[1, :, :n] = k, v

    def eval_cached(self, batch):
        start, end = batch.n_past, batch.n_past + batch.n_tokens
        x = self.embeddings[batch.token_ids]
        x = x + batch.semantic_mask[:, None] * self.codebooks[batch.codebook_ids].sum(axis=1)
        x = x * batch.scale[:, None]
        for i, layer in enumerate(self.slow.layers):
            q, k, v = self.slow.qkv(layer, x, batch.positions)
            self.cache[0, i, start:end], self.cache[1, i, start:end] = k, v
            x = self.slow.attend_and_ffn(layer, x, q, self.cache[0, i, :end],
                                         self.cache[1, i, :end], start)
        hidden = rms_norm(x[-1], self.norm, self.hparams.rms_norm_eps)
        return hidden, self.embeddings @ hidden

    def fast_decode(self, hidden, prefix_codes):
        t = self.fast_tensors
        first = t["project_in"] @ hidden if "project_in" in t else hidden
        x = np.vstack([first[None], t["embeddings"][prefix_codes]])
        positions = np.arange(x.shape[0])
        for layer in self.fast.layers:
            q, k, v = self.fast.qkv(layer, x, positions)
            x = self.fast.attend_and_ffn(layer, x, q, k, v, 0)
        return t["output"] @ rms_norm(x[-1], t["norm"], self.hparams.fast.rms_norm_eps)
