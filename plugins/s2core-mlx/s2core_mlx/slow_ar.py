"""The Slow-AR (SPEC 2.4-2.6) on MLX, as one lazy graph per call.

A call evaluates one or more sequences, each an EvalBatch over its own KVCache (one KV slot,
or the single-sequence cache): their rows are concatenated, so each weight product runs once
over all of them; QK-norm, RoPE, the cache writes and attention run per sequence, at its own
positions and over its own rows.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from s2core.plugin import EvalBatch, load_block

from .kv_cache import KVCache
from .layers import attend, finish_block, project_qkv, sequence_heads
from .weights import WeightLoader


class SlowAR:
    def __init__(self, loader: WeightLoader):
        hp = loader.model_file.hparams
        # The token table is also the tied output matrix: one copy serves both.
        self.embeddings = loader.matrix("embeddings.weight")
        self.codebooks = loader.matrix("codebook_embeddings.weight")
        self.norm = loader.vector("norm.weight")
        self.layers = [load_block(f"layers.{i}", hp.attention_qk_norm, loader.matrix, loader.vector)
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
        hidden, logits = self.run([(batch, cache)])
        return hidden[0], logits[0]

    def run(self, items: list[tuple[EvalBatch, KVCache]]) -> tuple[mx.array, mx.array]:
        """hidden (B, dim) and logits (B, vocab): row j is the last position of items[j]'s
        batch, written into its cache (a lazy graph, as __call__)."""
        s = self.shape
        bounds, lo = [], 0  # each item's rows in the concatenated x
        for batch, _ in items:
            bounds.append((lo, lo + batch.n_tokens))
            lo += batch.n_tokens
        embedded = [self.embed(batch) for batch, _ in items]
        x = embedded[0] if len(items) == 1 else mx.concatenate(embedded)
        last = len(self.layers) - 1
        for i, blk in enumerate(self.layers):
            qkv = project_qkv(x, blk, s)
            attn, kept = [], []
            for (batch, cache), (lo, hi) in zip(items, bounds):
                q, k, v = sequence_heads(qkv[lo:hi], blk, s, batch.n_past)
                keys, values = cache.append(i, k, v, batch.n_past)
                if i == last and hi - lo > 1:  # only the last position reaches the output
                    lo, q = hi - 1, q[:, :, -1:]
                attn.append(attend(q, keys, values, s))
                kept.append((lo, hi))
            if i == last:
                x = _rows(x, kept)
            x = finish_block(x, _joined(attn), blk, s.eps)
        hidden = mx.fast.rms_norm(x, self.norm, s.eps)  # one row per item
        return hidden, self.embeddings.project(hidden)


def _joined(parts: list[mx.array]) -> mx.array:
    return parts[0] if len(parts) == 1 else mx.concatenate(parts)


def _rows(x: mx.array, spans: list[tuple[int, int]]) -> mx.array:
    """x's rows of every (lo, hi) span, in order."""
    if len(spans) == 1:
        lo, hi = spans[0]
        return x if (lo, hi) == (0, x.shape[0]) else x[lo:hi]
    return mx.concatenate([x[lo:hi] for lo, hi in spans])
