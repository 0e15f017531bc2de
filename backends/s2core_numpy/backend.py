"""The NumPy CPU backend: float32 compute on BLAS, F16 KV cache values by default (as s2.cpp).

Weights (weights.py): F32 tensors are used straight from the memory map. With numba installed,
F16, Q8_0 and the block-quantized types (Q2_K..Q6_K, Q4_0, Q4_1, Q5_0, Q5_1) stay in their file
type and numba kernels multiply straight from them (tiled.py, f16.py, q8_0.py, quants.py): a
decode step then streams the file's bytes instead of 4 a weight. Without numba (and for a
tensor holding an infinite or NaN value or scale) they are widened to float32 on load, one
tensor at a time, and the widened tensor's file pages are released. The codebook table is
only looked up: with numba it is held in its file type like the matrices, without numba it stays
in the file; either way a call decodes only the rows it gathers.

KV cache: held in its type, float16 (kv_cache_dtype="f16", the default: the numbers s2.cpp's
F16 cache holds, in half float32's bytes) or float32. With numba, attention reads float16 rows
where they are held, widening them in registers (attention.py); without it, a call widens its
layer's history into one float32 block. A call's own K/V are used unrounded in that call (as
s2.cpp: they are computed in float32 in the same graph) and rounded once the call's attention
has read them (layers.visible_keys).

The Fast-AR keeps its K/V between the calls of one frame (fast_begin / fast_extend), so each
call runs only its new position: matrix-vector products, which stream at memory speed. A
frame's first call (fast_start) runs position 0 and the first code together, two rows per
weight read.

With numba, the small operations between the products (attention of one row, RMSNorm, RoPE)
are numba kernels too (row_kernels.py, attention.py); ops.py holds the NumPy forms.
"""

from __future__ import annotations


import numpy as np

from s2core.plugin import Backend, Capabilities, check_option
from s2core.errors import InvalidInputError
from s2core.plugin import ModelFile
from s2core.plugin import EvalBatch
from s2core.plugin import load_block

from .fast_ar import FastDecoder, FastState
from .layers import embed, run_block
from .ops import NUMPY_OPS, RowOps
from .plugin import CACHE_DTYPES, CACHE_NUMPY_DTYPES, numpy_capabilities
from .weights import (WeightLoader, arithmetic_for, ggml_order_products, output_logits,
                      numba_kernels_possible)


class NumpyBackend(Backend):
    name = "numpy"

    def __init__(self, model_file: ModelFile, kv_cache_dtype: str = "f16",
                 numba_kernels: bool | None = None, arithmetic: str | None = None):
        """numba_kernels: keep F16, Q8_0 and block-quantized matrices in their file type and
        compute from them with numba; None = when numba is installed, False = widen them to
        float32."""
        super().__init__(model_file)
        check_option("kv_cache_dtype", kv_cache_dtype, CACHE_DTYPES)
        check_option("numba_kernels", numba_kernels, (None, True, False))
        if numba_kernels is None:
            numba_kernels = numba_kernels_possible()
        elif numba_kernels and not numba_kernels_possible():
            raise InvalidInputError("numba_kernels", "numba_kernels=True needs numba "
                                    "(pip install 's2core[fast]')")
        arithmetic = arithmetic_for(arithmetic, model_file)
        self._caps = numpy_capabilities(kv_cache_dtype, numba_kernels, arithmetic)
        self._numba = numba_kernels
        self.row_ops = self._row_ops(numba_kernels, arithmetic, model_file)
        #: the cache's held type: f16 values in float16, read in place by attention
        self.kv_dtype = CACHE_NUMPY_DTYPES[kv_cache_dtype]
        hp = self.hparams
        wl = WeightLoader(model_file, numba_kernels, arithmetic)
        self.embeddings = wl.matrix("embeddings.weight")  # lookups and the tied logits
        self.codebooks = wl.lookup("codebook_embeddings.weight")
        self.norm = wl.vector("norm.weight")
        self.layers = [load_block(f"layers.{i}", hp.attention_qk_norm, wl.matrix, wl.vector)
                       for i in range(hp.n_layer)]
        self.shape = hp.stack
        self.fast = None if hp.fast is None else FastDecoder(wl, self.row_ops)
        #: tensors of a kept type widened because they hold an infinite or NaN value or scale
        self.widened_non_finite = tuple(wl.widened_non_finite)
        self._k: np.ndarray | None = None  # [n_layer, n_head_kv, max_seq_len, head_dim]
        self._v: np.ndarray | None = None
        self._slots = None  # slots.SlotCache while several sequences are served

    @property
    def capabilities(self) -> Capabilities:
        return self._caps

    @staticmethod
    def _row_ops(numba_kernels: bool, arithmetic: str, model_file: ModelFile) -> RowOps:
        """The norms, the rotation, the attention and the gate. With numba: s2.cpp's own
        float32 order (ggml_ops.py) for arithmetic="ggml" on a file whose every product is
        computed in ggml's order too (F16 and F32 matrices: then every output is s2.cpp's,
        bit for bit); numba's kernels otherwise (row_kernels.py: the integer products of
        quantized files add their blocks in their own order, so the exact order between them
        would buy ~1e-7 and cost attention.py's speed at long contexts). NumPy's without
        numba."""
        if not numba_kernels:
            return NUMPY_OPS
        if arithmetic == "ggml" and ggml_order_products(model_file):
            from .ggml_ops import GGML_OPS
            return GGML_OPS
        from .row_kernels import KERNEL_OPS
        return KERNEL_OPS

    # ---------------------------------------------------------------- KV cache
    def allocate_kv_cache(self, max_seq_len: int) -> None:
        hp = self.hparams
        shape = (hp.n_layer, hp.n_head_kv, max_seq_len, hp.head_dim)  # heads outermost: each
        k = np.zeros(shape, self.kv_dtype)                           # head's rows contiguous
        v = np.zeros(shape, self.kv_dtype)
        self._k, self._v = k, v  # only now: a failed allocation keeps the previous cache

    def free_kv_cache(self) -> None:
        self._k = self._v = None

    def read_kv_cache(self, n_positions: int) -> tuple[np.ndarray, np.ndarray]:
        # astype copies (also when the type is float32 and a transposed slice is already
        # contiguous, where ascontiguousarray would hand out the live cache)
        return tuple(c[:, :, :n_positions].transpose(0, 2, 1, 3).astype(np.float32)
                     for c in (self._k, self._v))

    def write_kv_cache(self, k: np.ndarray, v: np.ndarray) -> None:
        # float32 holding the cache type's values (what read_kv_cache gave): exact in either
        n = k.shape[1]
        self._k[:, :, :n] = k.transpose(0, 2, 1, 3)
        self._v[:, :, :n] = v.transpose(0, 2, 1, 3)

    # ---------------------------------------------------------------- compute
    def _embed(self, batch: EvalBatch) -> np.ndarray:
        return embed(self.embeddings, self.codebooks, batch)

    def _on_workers(self, n_rows: int) -> bool:
        """Whether a call of n_rows runs on the workers with BLAS held to one thread
        (workers.py): with the numba kernels, from the rows where products leave the
        few-row kernels."""
        if not self._numba:
            return False
        from .tiled import GEMM_ROWS
        return n_rows >= GEMM_ROWS

    def eval_cached(self, batch: EvalBatch) -> tuple[np.ndarray, np.ndarray]:
        on_workers = self._on_workers(batch.n_tokens)
        if not on_workers:
            return self._forward(batch, False)
        from .workers import one_blas_thread
        with one_blas_thread:
            return self._forward(batch, True)

    def _forward(self, batch: EvalBatch, on_workers: bool) -> tuple[np.ndarray, np.ndarray]:
        s = self.shape
        cos, sin = self.row_ops.rope_tables(batch.positions, s.head_dim, s.rope_base)
        x = self._embed(batch)
        last = len(self.layers) - 1
        for i, blk in enumerate(self.layers):
            x = run_block(x, blk, s, cos, sin, self._k[i], self._v[i], batch.n_past,
                          i == last, on_workers, self.row_ops)
        hidden = self.row_ops.rms_norm(x[-1], self.norm, s.eps)
        return hidden, output_logits(hidden[None], self.embeddings, batch.logit_rows)[0]

    # ---------------------------------------------------------------- several sequences
    # (slots.py: one cache per slot; every weight read once for all the call's rows)
    def allocate_kv_slots(self, n_slots: int, max_seq_len: int) -> None:
        from .slots import SlotCache
        hp = self.hparams
        self._slots = SlotCache(n_slots, hp.n_layer, hp.n_head_kv, max_seq_len, hp.head_dim,
                                self.kv_dtype)

    def free_kv_slots(self) -> None:
        self._slots = None

    def read_kv_slot(self, slot: int, n_positions: int) -> tuple[np.ndarray, np.ndarray]:
        return self._slots.read(slot, n_positions)

    def write_kv_slot(self, slot: int, k: np.ndarray, v: np.ndarray) -> None:
        self._slots.write(slot, k, v)

    def add_kv_prefix(self, k: np.ndarray, v: np.ndarray) -> int:
        return self._slots.add_prefix(k, v)

    def attach_kv_prefix(self, slot: int, handle) -> None:
        self._slots.attach(slot, handle)

    def remove_kv_prefix(self, handle: int) -> None:
        self._slots.remove_prefix(handle)

    def eval_slots(self, batches: list[tuple[int, EvalBatch]]
                   ) -> list[tuple[np.ndarray, np.ndarray]]:
        from .slots import eval_slots
        return eval_slots(self, self._slots, batches)

    def fast_decode_batch(self, hiddens: np.ndarray, prefix_codes: np.ndarray) -> np.ndarray:
        state, logits = self.fast_begin_batch(hiddens)
        for c in range(prefix_codes.shape[1]):
            state, logits = self.fast_extend_batch(state, prefix_codes[:, c])
        return logits

    def fast_begin_batch(self, hiddens: np.ndarray):
        return self.fast.begin_batch(np.asarray(hiddens, dtype=np.float32))

    def fast_extend_batch(self, state, codes: np.ndarray):
        return state, self.fast.extend_batch(state, codes)

    # ---------------------------------------------------------------- Fast-AR
    def fast_decode(self, hidden: np.ndarray, prefix_codes: np.ndarray) -> np.ndarray:
        return self.fast_start(hidden, prefix_codes)[1]

    def fast_begin(self, hidden: np.ndarray) -> tuple["FastState", np.ndarray]:
        return self.fast.start(np.asarray(hidden, dtype=np.float32), np.zeros(0, np.int64))

    def fast_start(self, hidden: np.ndarray, codes: np.ndarray
                   ) -> tuple["FastState", np.ndarray]:
        return self.fast.start(np.asarray(hidden, dtype=np.float32), codes)

    def fast_extend(self, state: "FastState", codes: np.ndarray
                    ) -> tuple["FastState", np.ndarray]:
        return state, self.fast.extend(state, codes)
