"""Several sequences per call on the torch backend: KV slots and the batched Slow-AR (the
batched Fast-AR is fast_ar.py's).

The same tensor code on every device (the CPU and CUDA differ only in what ops.Matmul,
ops.attention and KVCache already choose per device). A call concatenates every slot's rows,
so each linear layer multiplies all of them by its weight in one product (one read of each
weight); attention stays per slot, over that slot's own KVCache, with the single-sequence
code (KVCache.update / settle, ops.attention with its causal mask).

A voice prefix is held once (kv_cache.SharedPrefix) and attached to every slot that starts
with it: that slot's attention reads the prefix's rows, then its own (ops.prefixed_attention).
"""

from __future__ import annotations

import torch

from s2core.plugin import EvalBatch

from . import ops
from .kv_cache import KVCache, SharedPrefix
from .layers import embed, finish_block, project_qkv


class SharedPrefixes:
    """The voice prefixes held for the slots, by handle (a number never given twice, so
    removing one changes no other), and which slot is attached to which."""

    def __init__(self):
        self.held: dict[int, SharedPrefix] = {}
        self._next = 0

    def add(self, prefix: SharedPrefix) -> int:
        handle, self._next = self._next, self._next + 1
        self.held[handle] = prefix
        return handle

    def get(self, handle: int) -> SharedPrefix:
        if handle not in self.held:
            raise ValueError(f"no shared prefix {handle!r} (holding {sorted(self.held)})")
        return self.held[handle]

    def remove(self, handle: int, caches: list[KVCache]) -> None:
        """Drop one no slot is attached to (its tensors are freed with this last reference)."""
        prefix = self.get(handle)
        users = [s for s, c in enumerate(caches) if c.prefix is prefix]
        if users:
            raise ValueError(f"shared prefix {handle} is still attached to slot(s) {users}")
        del self.held[handle]

    def n_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for p in self.held.values() for t in (p.k, p.v))


def eval_slots(backend, caches: list[KVCache], rope: torch.Tensor,
               items: list[tuple[int, EvalBatch]]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(hidden, logits) of each item's last position (the rules of eval_cached, per slot)."""
    s, mm, dev = backend.shape, backend.matmul, backend.device
    batches = [b for _, b in items]
    bounds, lo = [], 0
    for b in batches:
        bounds.append((lo, lo + b.n_tokens))
        lo += b.n_tokens
    rotations = torch.cat([rope[b.n_past:b.n_past + b.n_tokens] for b in batches])
    masks = [ops.causal_mask(b.n_tokens, b.n_past, dev) for b in batches]
    x = torch.cat([embed(backend.embeddings, backend.codebooks, b, dev) for b in batches])
    last = len(backend.layers) - 1
    for i, blk in enumerate(backend.layers):
        q, k, v = project_qkv(x, blk, s, rotations, mm)
        rows, attn = [], []
        for (slot, b), (lo, hi), mask in zip(items, bounds, masks):
            cache = caches[slot]
            keys, values = cache.update(i, b.n_past, k[lo:hi], v[lo:hi])
            q_lo = lo
            if i == last and hi - lo > 1:  # only the last position reaches the output
                q_lo, mask = hi - 1, None
            attn.append(ops.prefixed_attention(q[q_lo:hi].to(backend.attention_dtype),
                                               cache.prefix_layer(i), keys, values, mask,
                                               s.attn_scale))
            cache.settle(i, b.n_past, b.n_past + b.n_tokens)
            rows.append((q_lo, hi))
        if i == last:
            x = torch.cat([x[a:b] for a, b in rows])
        x = finish_block(x, torch.cat(attn), blk, s.eps, mm)
    hidden = ops.rms_norm(x, backend.norm, s.eps)  # one row per item
    logits = backend.output_product.rows(backend.embeddings, hidden)
    return [(hidden[j].clone(), logits[j].clone()) for j in range(len(items))]
