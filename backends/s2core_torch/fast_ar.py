"""The Fast-AR (SPEC 5) on torch: a frame's calls append positions to K/V kept in a
FastState, so each computes only its new code's position; fast_decode runs them all.

One code path for one sequence and for several: a FastState holds B sequences (B = 1 for a
model's own frame, one per KV slot for the batched Fast-AR), all at the same position; `_run`
sends their new rows through each weight product together and attends per sequence. Only the
last product differs: one sequence's logits come from the vector product (OutputProduct),
B sequences' from the rows product, as before the two paths were one.
"""

from __future__ import annotations

import torch

from s2core.plugin import load_block, load_fast_ar

from . import ops
from .layers import finish_block, project_qkv
from .weights import WeightLoader


class FastState:
    """B Fast-AR sequences: K/V of positions 0..length-1, every layer, on the device at the
    attention precision, (B, n_layer, n_head_kv, context_length, head_dim) each.

    The Fast-AR has no rounded cache in s2.cpp (it recomputes every position per call, at
    compute precision), so keeping its K/V unrounded gives the same numbers as recomputing.
    """

    __slots__ = ("k", "v", "length", "positions_computed")

    def __init__(self, b: int, n_layer: int, n_head_kv: int, capacity: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device):
        shape = (b, n_layer, n_head_kv, capacity, head_dim)
        self.k = torch.empty(shape, dtype=dtype, device=device)
        self.v = torch.empty(shape, dtype=dtype, device=device)
        self.length = 0
        #: positions run through the layers for each sequence (== length: none recomputed)
        self.positions_computed = 0

    @property
    def capacity(self) -> int:
        return self.k.shape[3]


class FastDecoder:
    """The Fast-AR's weights and its incremental runs (one sequence: `advance`; B sequences:
    `begin_batch` / `extend_batch`)."""

    def __init__(self, load: WeightLoader, f):
        weights = load_fast_ar(f, load.matrix, load.vector,
                               lambda prefix, qk: load_block(prefix, qk, load.matrix, load.vector))
        self.project_in, self.embeddings, self.norm, self.output, self.layers = weights
        self.shape = f.stack
        self.context_length = f.context_length
        self.device = load.device
        self.rope = ops.rope_table(f.context_length, f.head_dim, f.rope_freq_base, load.device)

    def matrices(self) -> list[torch.Tensor]:
        out = [self.embeddings, self.output] + [w for b in self.layers for w in b.matrices()]
        return out + ([self.project_in] if self.project_in is not None else [])

    def new_state(self, dtype: torch.dtype, b: int = 1) -> FastState:
        s = self.shape
        return FastState(b, len(self.layers), s.n_head_kv, self.context_length, s.head_dim,
                         dtype, self.device)

    # ------------------------------------------------------------------ one sequence
    def advance(self, state: FastState, hidden: torch.Tensor | None, codes: torch.Tensor | None,
                mm: ops.Matmul, output_product: ops.OutputProduct) -> torch.Tensor:
        """Append [project_in(hidden)] (position 0, when given) and the codes' embeddings to
        `state`; return the logits after the last appended position."""
        rows = []
        if hidden is not None:
            if state.length:
                raise ValueError("the hidden state goes at position 0 of a new FastState")
            rows.append(hidden[None] if self.project_in is None
                        else mm(hidden[None], self.project_in))
        if codes is not None and len(codes):
            if not rows and not state.length:
                raise ValueError("a FastState starts with its hidden state")
            rows.append(ops.gather(self.embeddings, codes))
        x = torch.cat([r.float() for r in rows]) if len(rows) > 1 else rows[0].float()
        return output_product(self.output, self._run(state, x, mm)[0])

    # ------------------------------------------------------------------ B sequences
    def begin_batch(self, hiddens: torch.Tensor, dtype: torch.dtype, mm: ops.Matmul,
                    output_product: ops.OutputProduct) -> tuple[FastState, torch.Tensor]:
        """Position 0 of B sequences; logits (B, codebook_size)."""
        state = self.new_state(dtype, hiddens.shape[0])
        x = hiddens if self.project_in is None else mm(hiddens, self.project_in)
        return state, output_product.rows(self.output, self._run(state, x.float(), mm))

    def extend_batch(self, state: FastState, codes: torch.Tensor, mm: ops.Matmul,
                     output_product: ops.OutputProduct) -> torch.Tensor:
        """One more code for every sequence (codes (B,)); logits (B, codebook_size)."""
        x = ops.gather(self.embeddings, codes).float()
        return output_product.rows(self.output, self._run(state, x, mm))

    def _run(self, state: FastState, x: torch.Tensor, mm: ops.Matmul) -> torch.Tensor:
        """x: the same number n of new rows for each of the state's B sequences, sequence by
        sequence; the normed output (B, width) after each sequence's last row."""
        s, b = self.shape, state.k.shape[0]
        n_past, n = state.length, x.shape[0] // b
        end = n_past + n
        if end > state.capacity:
            raise ValueError(f"{end} Fast-AR positions exceed its context of {state.capacity}")
        rotations = self.rope[n_past:end].repeat(b, 1)
        mask = ops.causal_mask(n, n_past, x.device)
        last = len(self.layers) - 1
        for i, blk in enumerate(self.layers):
            q, k, v = project_qkv(x, blk, s, rotations, mm)
            keys, values = state.k[:, i], state.v[:, i]  # (B, n_head_kv, capacity, d)
            # cast to the attention precision
            keys[:, :, n_past:end] = k.unflatten(0, (b, n)).transpose(1, 2)
            values[:, :, n_past:end] = v.unflatten(0, (b, n)).transpose(1, 2)
            rows = n
            if i == last and n > 1:
                # Only each sequence's last position reaches the output: skip the others'.
                x, q, mask, rows = x[n - 1::n], q[n - 1::n], None, 1
            attn = torch.cat([ops.attention(q[r * rows:(r + 1) * rows].to(keys.dtype),
                                            keys[r, :, :end], values[r, :, :end], mask,
                                            s.attn_scale) for r in range(b)])
            x = finish_block(x, attn, blk, s.eps, mm)
        state.length = end
        state.positions_computed += n
        return ops.rms_norm(x, self.norm, s.eps)
