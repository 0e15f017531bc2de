"""The Fast-AR (SPEC 5) on MLX: from scratch per call, or incrementally within a frame.

A frame asks for codes 1..C-1 with prefixes that grow by one code per call. `__call__`
recomputes every position, as s2.cpp does (the backend's fast_decode). `begin` and `extend`
keep each layer's K and V of the positions so far in a `FastState`, at float32 (the precision
the from-scratch path attends with), so a call processes only its new position(s): the same
numbers, at one row per matrix product instead of up to C.

`begin_batch` and `extend_batch` do the same for B sequences at once (one codebook of a frame
for every KV slot): their B rows go through each weight product together, and since every
sequence is at the same position, RoPE and attention run as one batched kernel each
(B sequences of one query), with no mask and no padding.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import numpy as np
from s2core.plugin import load_block, load_fast_ar

from .layers import (attend, attention_inputs, finish_block, project_qkv, rotate,
                     split_heads)
from .weights import WeightLoader


@dataclass
class FastState:
    """K and V of every Fast-AR layer for positions [0, n_positions): float32 arrays
    (B, n_head_kv, n_positions, head_dim), B = 1 for fast_begin's single sequence.
    Position 0 is the hidden state, position i > 0 the (i-1)-th code."""

    keys: list[mx.array]
    values: list[mx.array]
    n_positions: int

    def arrays(self) -> list[mx.array]:
        return self.keys + self.values


class FastDecoder:
    def __init__(self, loader: WeightLoader):
        f = loader.model_file.hparams.fast
        weights = load_fast_ar(f, loader.matrix, loader.vector,
                               lambda prefix, qk: load_block(prefix, qk, loader.matrix, loader.vector))
        self.project_in, self.embeddings, self.norm, self.output, self.layers = weights
        self.shape = f.stack

    # ------------------------------------------------------------------ inputs
    def _first_row(self, hidden: mx.array) -> mx.array:
        x = hidden.astype(mx.float32)[None]
        return x if self.project_in is None else self.project_in.project(x)

    def _code_rows(self, codes: np.ndarray) -> mx.array:
        return self.embeddings.rows(mx.array(np.asarray(codes).astype(np.int32)))

    # ------------------------------------------------------------------ compute
    def __call__(self, hidden: mx.array, prefix_codes: np.ndarray) -> mx.array:
        """Logits (codebook_size,) for the code after `prefix_codes`, every position
        recomputed, as a lazy graph."""
        x = self._first_row(hidden)
        if prefix_codes.size:
            x = mx.concatenate([x, self._code_rows(prefix_codes)], axis=0)
        return self._run(x, None)[1]

    def start(self, hidden: mx.array, codes: np.ndarray) -> tuple[FastState, mx.array]:
        """Position 0 and the codes after it (none: position 0 only) in one run: the state and
        the logits after the last (lazy)."""
        x = self._first_row(hidden)
        if len(codes):
            x = mx.concatenate([x, self._code_rows(codes)])
        return self._run(x, None)

    def extend(self, state: FastState, codes: np.ndarray) -> tuple[FastState, mx.array]:
        """The positions of `codes` after those in `state`: a new state (the old one is left
        as it was) and the logits after the last code (lazy)."""
        return self._run(self._code_rows(codes), state)

    def begin_batch(self, hiddens: mx.array) -> tuple[FastState, mx.array]:
        """Position 0 of B sequences (hiddens (B, dim)): their state and the logits
        (B, codebook_size) of each one's first code (lazy)."""
        x = hiddens.astype(mx.float32)
        if self.project_in is not None:
            x = self.project_in.project(x)
        return self._run_batch(x, None)

    def extend_batch(self, state: FastState, codes: np.ndarray) -> tuple[FastState, mx.array]:
        """One code (codes (B,)) after each of the B sequences in `state`: a new state (the
        old one is left as it was) and the logits (B, codebook_size) (lazy)."""
        return self._run_batch(self._code_rows(codes), state)

    def _run_batch(self, x: mx.array, past: FastState | None) -> tuple[FastState, mx.array]:
        """Row b of x is sequence b's next position, past.n_positions (0 without a past)."""
        s = self.shape
        position = 0 if past is None else past.n_positions
        keys, values = [], []
        for i, blk in enumerate(self.layers):
            # (B, heads, d) -> (B, heads, 1, d): B sequences of one position each
            q, k, v = (t[:, :, None, :] for t in split_heads(project_qkv(x, blk, s), blk, s))
            q, k = rotate(q, s, position), rotate(k, s, position)
            if past is not None:
                k = mx.concatenate([past.keys[i], k], axis=2)
                v = mx.concatenate([past.values[i], v], axis=2)
            keys.append(k)
            values.append(v)
            x = finish_block(x, attend(q, k, v, s), blk, s.eps)
        out = mx.fast.rms_norm(x, self.norm, s.eps)
        return FastState(keys, values, position + 1), self.output.project(out)

    def _run(self, x: mx.array, past: FastState | None) -> tuple[FastState, mx.array]:
        """Rows x at positions past.n_positions.. (0 without a past), attending to the past
        K/V and causally among themselves."""
        s = self.shape
        first = 0 if past is None else past.n_positions
        keys, values = [], []
        last = len(self.layers) - 1
        for i, blk in enumerate(self.layers):
            q, k, v = attention_inputs(x, blk, s, first)
            if past is not None:
                k = mx.concatenate([past.keys[i], k], axis=2)
                v = mx.concatenate([past.values[i], v], axis=2)
            keys.append(k)
            values.append(v)
            if i == last and x.shape[0] > 1:  # only the last position reaches the output
                x, q = x[-1:], q[:, :, -1:]
            x = finish_block(x, attend(q, k, v, s), blk, s.eps)
        out = mx.fast.rms_norm(x, self.norm, s.eps)
        return FastState(keys, values, keys[0].shape[2]), self.output.project(out)[0]
