"""The Fast-AR (SPEC 5) on NumPy: s2.cpp recomputes every position per call; here a frame's
calls append to K/V kept in a FastState, with the same numbers (float32 throughout).

One code path for one sequence and for several: a FastState holds B sequences (B = 1 for a
model's own frame, one per KV slot for the batched Fast-AR), all at the same position, and
`_run` sends their new rows through each weight together (run_block_segments: each row gets
the numbers it gets alone). A frame's first call (`start`) runs position 0 and the first code
in one pass, two rows per weight read.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from s2core.plugin import load_block, load_fast_ar

from .layers import run_block_rows, run_block_segments
from .ops import NUMPY_OPS, RowOps
from .weights import WeightLoader, gather, linear


@dataclass
class FastState:
    """B Fast-AR sequences at the same position: K/V (n_layer, B, n_head_kv, capacity, d),
    so that a layer's caches are one array (layers.run_block_rows)."""

    k: np.ndarray
    v: np.ndarray
    n: int = 0


class FastDecoder:
    """The Fast-AR's weights and its incremental runs (single: start/extend; B sequences:
    begin_batch/extend_batch)."""

    def __init__(self, wl: WeightLoader, row_ops: RowOps = NUMPY_OPS):
        f = wl.mf.hparams.fast
        self.row_ops = row_ops
        weights = load_fast_ar(f, wl.matrix, wl.vector,
                               lambda prefix, qk: load_block(prefix, qk, wl.matrix, wl.vector))
        self.project_in, self.embeddings, self.norm, self.output, self.layers = weights
        self.shape = f.stack
        self.capacity = f.context_length

    def _new_state(self, b: int) -> FastState:
        s = self.shape
        shape = (len(self.layers), b, s.n_head_kv, self.capacity, s.head_dim)
        return FastState(np.zeros(shape, np.float32), np.zeros(shape, np.float32))

    def _first_rows(self, hiddens: np.ndarray) -> np.ndarray:
        """Position 0: project_in(hidden) or hidden, one row per sequence."""
        x = np.ascontiguousarray(hiddens, dtype=np.float32)
        return x if self.project_in is None else linear(x, self.project_in)

    def _embed(self, codes: np.ndarray) -> np.ndarray:
        return gather(self.embeddings, np.asarray(codes, dtype=np.int64))

    # ------------------------------------------------------------------ one sequence
    def start(self, hidden: np.ndarray, codes: np.ndarray) -> tuple[FastState, np.ndarray]:
        """Position 0 and the codes after it in one run: a frame's first call (one code)
        multiplies two rows by each weight as it streams past (the few-row kernels) instead
        of reading every weight twice. Logits (codebook_size,)."""
        state = self._new_state(1)
        first = self._first_rows(hidden[None, :])
        if len(codes):
            first = np.concatenate([first, self._embed(codes)])
        return state, self._run(state, first)[0]

    def extend(self, state: FastState, codes: np.ndarray) -> np.ndarray:
        return self._run(state, self._embed(codes))[0]

    # ------------------------------------------------------------------ B sequences
    def begin_batch(self, hiddens: np.ndarray) -> tuple[FastState, np.ndarray]:
        """Position 0 of B sequences; logits (B, codebook_size)."""
        state = self._new_state(hiddens.shape[0])
        return state, self._run(state, self._first_rows(hiddens))

    def extend_batch(self, state: FastState, codes: np.ndarray) -> np.ndarray:
        """One more code for every sequence (codes (B,)); logits (B, codebook_size)."""
        return self._run(state, self._embed(codes))

    def _run(self, state: FastState, x: np.ndarray) -> np.ndarray:
        """x: the same number n of new rows for each of the state's B sequences, sequence by
        sequence; logits (B, codebook_size) after each sequence's last row."""
        s, start, b = self.shape, state.n, state.k.shape[1]
        n = x.shape[0] // b
        positions = np.tile(np.arange(start, start + n), b)
        cos, sin = self.row_ops.rope_tables(positions, s.head_dim, s.rope_base)
        if n == 1 and self.row_ops.attend_rows is not None:  # every call but a start's
            for i, blk in enumerate(self.layers):
                x = run_block_rows(x, blk, s, cos, sin, state.k[i], state.v[i], start,
                                   self.row_ops)
        else:
            segments = [(r * n, (r + 1) * n, start) for r in range(b)]
            last = len(self.layers) - 1
            for i, blk in enumerate(self.layers):
                x = run_block_segments(x, blk, s, cos, sin, segments,
                                       lambda r, i=i: state.k[i, r],
                                       lambda r, i=i: state.v[i, r],
                                       i == last, row_ops=self.row_ops)
        state.n = start + n
        return linear(self.row_ops.rms_norm(x, self.norm, s.eps), self.output)
