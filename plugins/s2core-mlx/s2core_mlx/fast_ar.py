"""The Fast-AR (SPEC 5) on MLX: recomputed from scratch per call, as s2.cpp does."""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from s2core.gguf_file import ModelFile

from .layers import BlockWeights, StackShape, attend, attention_inputs, finish_block
from .weights import load_matrix, load_vector


class FastDecoder:
    def __init__(self, mf: ModelFile, widened_dtype: str):
        f = mf.hparams.fast
        self.project_in = (load_matrix(mf, "fast_project_in.weight", widened_dtype)
                           if f.project_in else None)
        self.embeddings = load_matrix(mf, "fast_embeddings.weight", widened_dtype)
        self.norm = load_vector(mf, "fast_norm.weight")
        self.output = load_matrix(mf, "fast_output.weight", widened_dtype)
        self.layers = [BlockWeights.load(mf, f"fast_layers.{i}", f.attention_qk_norm,
                                         widened_dtype) for i in range(f.n_layer)]
        self.shape = StackShape(f.n_head, f.n_head_kv, f.head_dim, f.rms_norm_eps,
                                f.rope_freq_base)

    def __call__(self, hidden: mx.array, prefix_codes: np.ndarray) -> mx.array:
        """Logits (codebook_size,) for the code after `prefix_codes`, as a lazy graph."""
        s = self.shape
        x = hidden.astype(mx.float32)[None]
        if self.project_in is not None:
            x = self.project_in.project(x)
        if prefix_codes.size:
            codes = mx.array(prefix_codes.astype(np.int32))
            x = mx.concatenate([x, self.embeddings.rows(codes)], axis=0)
        last = len(self.layers) - 1
        for i, blk in enumerate(self.layers):
            q, k, v = attention_inputs(x, blk, s, 0)
            if i == last:  # only the last position reaches the output
                x, q = x[-1:], q[:, :, -1:]
            x = finish_block(x, attend(q, k, v, s), blk, s.eps)
        out = mx.fast.rms_norm(x, self.norm, s.eps)
        return self.output.project(out)[0]
