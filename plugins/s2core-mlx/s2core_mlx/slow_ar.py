"""The Slow-AR (SPEC 2.4-2.6) on MLX, as one lazy graph per call."""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from s2core.inputs import EvalBatch

from .kv_cache import KVCache
from .layers import BlockWeights, attend, attention_inputs, finish_block
from .weights import WeightLoader


class SlowAR:
    def __init__(self, loader: WeightLoader):
        hp = loader.model_file.hparams
        # The token table is also the tied output matrix: one copy serves both.
        self.embeddings = loader.matrix("embeddings.weight")
        self.codebooks = loader.matrix("codebook_embeddings.weight")
        self.norm = loader.vector("norm.weight")
        self.layers = [BlockWeights.load(loader, f"layers.{i}", hp.attention_qk_norm)
                       for i in range(hp.n_layer)]
        self.shape = hp.stack
        self.num_codebooks = hp.num_codebooks

    def embed(self, batch: EvalBatch) -> mx.array:
        """SPEC 2.4: token row + (semantic positions only) the sum of the codebook rows."""
        x = self.embeddings.rows(mx.array(batch.token_ids.astype(np.int32)))
        if batch.n_semantic:
            n = batch.n_tokens
            ids = mx.array(batch.codebook_ids.astype(np.int32).reshape(-1))
            codes = self.codebooks.rows(ids).reshape(n, self.num_codebooks, -1).sum(axis=1)
            x = x + mx.array(batch.semantic_mask)[:, None] * codes
        return x * mx.array(batch.scale)[:, None]

    def __call__(self, batch: EvalBatch, cache: KVCache) -> tuple[mx.array, mx.array]:
        """hidden (dim,) and logits (vocab,) of the last position, with the cache writes, as
        a graph that nothing has evaluated yet."""
        s, n_past, n = self.shape, batch.n_past, batch.n_tokens
        x = self.embed(batch)
        last = len(self.layers) - 1
        for i, blk in enumerate(self.layers):
            q, k, v = attention_inputs(x, blk, s, n_past)
            keys, values = cache.append(i, k, v, n_past)
            if i == last and n > 1:  # only the last position reaches the output
                x, q = x[-1:], q[:, :, -1:]
            x = finish_block(x, attend(q, keys, values, s), blk, s.eps)
        hidden = mx.fast.rms_norm(x[-1:], self.norm, s.eps)
        return hidden[0], self.embeddings.project(hidden)[0]
