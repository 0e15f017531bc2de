"""The MLX backend: the Apple GPU through Metal, or MLX's CPU build elsewhere.

Compute is float32. Weights stay in their GGUF type (F32/F16/BF16 arrays; Q8_0, Q4_0, Q4_1,
Q5_0, Q5_1, Q4_K, Q5_K in MLX's affine quantized format, converted exactly, the legacy quants
with float16 scales by default: `quant_scale_dtype`; Q2_K, Q3_K and Q6_K in the same format with
each 16-value sub-block padded to a group of 32, also exact: `sub_block_quants="split"`, the
default, or widened on load with "widen" to `widened_weight_dtype`, float32 by default). Every tensor is an MLX copy
and its file pages are released once copied. The KV cache is F16 by default (as s2.cpp), or
BF16/F32 (`kv_cache_dtype`).

Each eval_cached builds the whole call (embedding, every layer, cache writes, logits) as one
lazy graph and evaluates it once; results are mx.arrays, so a generation loop can sample on
the device. The Fast-AR is incremental within a frame (fast_begin / fast_extend keep its K/V).

Several sequences per call (KV slots, slots.py): eval_slots runs the same graph over the rows
of every slot in the call, one weight product for all of them and attention per slot over
its own cache (and its shared voice prefix's rows); the batched Fast-AR advances one codebook
of every slot per pass.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import numpy as np

from s2core.plugin import Backend, Capabilities, check_option
from s2core.plugin import ModelFile
from s2core.plugin import EvalBatch
from s2core.plugin import available_host_memory_bytes

from .fast_ar import FastDecoder, FastState
from .kv_cache import KVCache
from .plugin import (CACHE_DTYPES, SCALE_DTYPES, SUB_BLOCK_MODES, WIDENED_DTYPES,
                     mlx_capabilities)
from .slots import Slots
from .slow_ar import SlowAR
from .weights import MX_DTYPES, WeightLoader, return_freed_heap


def _as_mx(hidden: Any) -> mx.array:
    return hidden if isinstance(hidden, mx.array) else mx.array(hidden)


def metal_available() -> bool:
    return mx.metal.is_available()


class MlxBackend(Backend):
    name = "mlx"

    def __init__(self, model_file: ModelFile, kv_cache_dtype: str = "f16",
                 widened_weight_dtype: str = "f32", quant_scale_dtype: str = "f16",
                 sub_block_quants: str = "split"):
        super().__init__(model_file)
        check_option("kv_cache_dtype", kv_cache_dtype, CACHE_DTYPES)
        check_option("widened_weight_dtype", widened_weight_dtype, WIDENED_DTYPES)
        check_option("quant_scale_dtype", quant_scale_dtype, SCALE_DTYPES)
        check_option("sub_block_quants", sub_block_quants, SUB_BLOCK_MODES)
        metal = metal_available()
        self.device = mx.gpu if metal else mx.cpu
        # One stream for this model, usable from any thread: MLX's default streams belong to
        # the thread that made them, and threads that ran MLX on their own streams abort the
        # process at exit. The core's guard keeps this model's calls from overlapping.
        self.stream = mx.new_thread_unsafe_stream(self.device)
        self._caps = mlx_capabilities(metal, kv_cache_dtype, widened_weight_dtype,
                                      quant_scale_dtype, sub_block_quants
                                      ).resolved(self.hparams.n_layer)
        self._cache_dtype = MX_DTYPES[kv_cache_dtype]
        loader = WeightLoader(model_file, widened_weight_dtype, quant_scale_dtype,
                              split_sub_blocks=sub_block_quants == "split")
        with mx.stream(self.stream):
            self.slow = SlowAR(loader)
            self.fast = None if self.hparams.fast is None else FastDecoder(loader)
        return_freed_heap()
        self._cache: KVCache | None = None
        self._slots: Slots | None = None

    @property
    def capabilities(self) -> Capabilities:
        return self._caps

    # ---------------------------------------------------------------- KV cache
    def allocate_kv_cache(self, max_seq_len: int) -> None:
        hp = self.hparams
        with mx.stream(self.stream):
            self._cache = KVCache(hp.n_layer, hp.n_head_kv, max_seq_len, hp.head_dim,
                                  self._cache_dtype)

    def kv_cache_limit_bytes(self) -> int | None:
        """Memory MLX can fill now: MLX does not survive an allocation that fails (it crashes
        the process), so the core must refuse one before it is tried. Metal: the device's
        recommended working set (unified memory); the CPU build: available host memory.
        The cache, slots and voices held are not added back (torch on CUDA adds them): new
        slots are built beside the old, so what is free now is what they may take, and for
        a voice the core's sum of what is held is then on the safe side."""
        limit = available_host_memory_bytes()
        if self.device == mx.gpu:
            try:
                info = mx.metal.device_info()
            except (AttributeError, RuntimeError):
                info = {}
            working_set = info.get("max_recommended_working_set_size") or info.get("memory_size")
            if working_set:
                limit = int(working_set) if limit is None else min(limit, int(working_set))
        return limit

    def _return_buffers(self) -> None:
        """Hand freed buffers back instead of keeping them in MLX's pool, once this model's
        stream is idle: its thread may still be releasing a finished call's temporaries, and
        the pool is not to be cleared under it (a segmentation fault in a long test run)."""
        mx.synchronize(self.stream)
        mx.clear_cache()

    def free_kv_cache(self) -> None:
        self._cache = None
        self._return_buffers()

    def read_kv_cache(self, n_positions: int) -> tuple[np.ndarray, np.ndarray]:
        with mx.stream(self.stream):
            return self._cache.read(n_positions)

    def write_kv_cache(self, k: np.ndarray, v: np.ndarray) -> None:
        with mx.stream(self.stream):
            self._cache.write(k, v)

    # ---------------------------------------------------------------- several sequences
    def allocate_kv_slots(self, n_slots: int, max_seq_len: int) -> None:
        hp = self.hparams
        with mx.stream(self.stream):
            slots = Slots(n_slots, hp.n_layer, hp.n_head_kv, max_seq_len, hp.head_dim,
                          self._cache_dtype)
        self._slots = slots  # the old slots and voices go only once the new ones exist
        self._return_buffers()

    def free_kv_slots(self) -> None:
        self._slots = None
        self._return_buffers()

    def read_kv_slot(self, slot: int, n_positions: int) -> tuple[np.ndarray, np.ndarray]:
        with mx.stream(self.stream):
            return self._slots[slot].read(n_positions)

    def write_kv_slot(self, slot: int, k: np.ndarray, v: np.ndarray) -> None:
        with mx.stream(self.stream):
            self._slots[slot].write(k, v)

    # A voice prefix held once (kv_cache.SharedPrefix) and referenced by its slots: a slot's
    # own rows then hold the positions after it, so its positions reach n + max_seq_len.
    def add_kv_prefix(self, k: np.ndarray, v: np.ndarray) -> int:
        with mx.stream(self.stream):
            return self._slots.add_prefix(k, v)

    def attach_kv_prefix(self, slot: int, handle: Any) -> None:
        self._slots.attach(slot, handle)

    def remove_kv_prefix(self, handle: Any) -> None:
        self._slots.remove_prefix(handle)
        self._return_buffers()  # its bytes are free now, as the core counts them

    def eval_slots(self, batches: list[tuple[int, EvalBatch]]
                   ) -> list[tuple[mx.array, mx.array]]:
        caches = [self._slots[slot] for slot, _ in batches]
        with mx.stream(self.stream):
            hidden, logits = self.slow.run([(b, c) for (_, b), c in zip(batches, caches)])
            # each row sliced on this model's stream too: a lazy slice would run later on
            # the default stream of whichever thread reads it
            out = [(hidden[j], logits[j]) for j in range(len(batches))]
            mx.eval(out, [c.arrays() for c in caches])
        return out

    def fast_decode_batch(self, hiddens: np.ndarray, prefix_codes: np.ndarray) -> mx.array:
        state, logits = self.fast_begin_batch(hiddens)
        for c in range(prefix_codes.shape[1]):
            state, logits = self.fast_extend_batch(state, prefix_codes[:, c])
        return logits

    def fast_begin_batch(self, hiddens: Any) -> tuple[FastState, mx.array]:
        with mx.stream(self.stream):
            state, logits = self.fast.begin_batch(_as_mx(hiddens))
            mx.eval(logits, state.arrays())
        return state, logits

    def fast_extend_batch(self, state: FastState, codes: np.ndarray
                          ) -> tuple[FastState, mx.array]:
        """Returns a new state (the given one is not modified)."""
        with mx.stream(self.stream):
            state, logits = self.fast.extend_batch(state, codes)
            mx.eval(logits, state.arrays())
        return state, logits

    # ---------------------------------------------------------------- compute
    def eval_cached(self, batch: EvalBatch) -> tuple[mx.array, mx.array]:
        with mx.stream(self.stream):
            hidden, logits = self.slow(batch, self._cache)
            mx.eval(hidden, logits, self._cache.arrays())
        return hidden, logits

    def fast_decode(self, hidden: Any, prefix_codes: np.ndarray) -> mx.array:
        """Every position recomputed (s2.cpp's way); the core uses fast_begin/fast_extend."""
        with mx.stream(self.stream):
            logits = self.fast(_as_mx(hidden), prefix_codes)
            mx.eval(logits)
        return logits

    def fast_begin(self, hidden: Any) -> tuple[FastState, mx.array]:
        return self.fast_start(hidden, np.zeros(0, np.int64))

    def fast_start(self, hidden: Any, codes: np.ndarray) -> tuple[FastState, mx.array]:
        """Position 0 and the codes after it in one pass (a frame's first call: each weight
        read once for both rows)."""
        with mx.stream(self.stream):
            state, logits = self.fast.start(_as_mx(hidden), codes)
            mx.eval(logits, state.arrays())
        return state, logits

    def fast_extend(self, state: FastState, codes: np.ndarray) -> tuple[FastState, mx.array]:
        """Only the new codes' positions are computed; the state's K/V stand for the rest.
        Returns a new state (the given one is not modified)."""
        with mx.stream(self.stream):
            state, logits = self.fast.extend(state, codes)
            mx.eval(logits, state.arrays())
        return state, logits

    # ---------------------------------------------------------------- host hand-off
    def to_numpy(self, x: Any) -> np.ndarray:
        """float32 results come back without a copy (the buffer is shared with MLX)."""
        if isinstance(x, mx.array):
            if x.dtype != mx.float32:
                with mx.stream(self.stream):
                    x = x.astype(mx.float32)
            return np.asarray(x)
        return np.asarray(x, dtype=np.float32)
