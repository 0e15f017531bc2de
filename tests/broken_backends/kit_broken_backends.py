"""Backends that each break one rule of the contract, for tests/test_kit_catches_broken.py.

Each is the example plugin's backend (or NumPy's) with one fault added, the way the issue's
hostile tester found them: everything else is correct, so the kit must name the one rule.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np
from s2core_example.backend import ExampleBackend, Stack
from s2core_example.plugin import CAPABILITIES
from s2core_numpy.backend import NumpyBackend


class AliasResults(ExampleBackend):
    """hidden and logits copied into buffers that every call reuses."""

    def eval_cached(self, batch):
        hidden, logits = super().eval_cached(batch)
        if not hasattr(self, "_out"):
            self._out = (np.empty_like(hidden), np.empty_like(logits))
        self._out[0][:], self._out[1][:] = hidden, logits
        return self._out


class AliasFastLogits(ExampleBackend):
    """Fast-AR logits in a buffer that every call reuses."""

    def fast_decode(self, hidden, prefix_codes):
        out = super().fast_decode(hidden, prefix_codes)
        if not hasattr(self, "_fast_out"):
            self._fast_out = np.empty_like(out)
        self._fast_out[:] = out
        return self._fast_out


class ViewSnapshots(ExampleBackend):
    """read_kv_cache hands out views of the live cache."""

    def read_kv_cache(self, n_positions):
        return self.cache[0, :, :n_positions], self.cache[1, :, :n_positions]


class NumpyOldSnapshots(NumpyBackend):
    """The NumPy backend's read_kv_cache before the fix: with one KV head and a full cache,
    ascontiguousarray of the transposed slice returned the live cache itself."""

    def read_kv_cache(self, n_positions):
        return tuple(np.ascontiguousarray(c[:, :, :n_positions].transpose(0, 2, 1, 3))
                     for c in (self._k, self._v))


def _fast_stack(backend, **wrong):
    f = backend.hparams.fast
    values = dict(n_head=f.n_head, n_head_kv=f.n_head_kv, head_dim=f.head_dim,
                  eps=f.rms_norm_eps, base=f.rope_freq_base)
    values.update(wrong)
    return Stack(backend.model_file, "fast_layers", f.n_layer, values["n_head"],
                 values["n_head_kv"], values["head_dim"], values["eps"], values["base"],
                 f.attention_qk_norm)


class FastSlowRope(ExampleBackend):
    """The Fast-AR rotates with the Slow-AR's RoPE base."""

    def __init__(self, model_file, kv_cache_dtype="f32"):
        super().__init__(model_file, kv_cache_dtype)
        self.fast = _fast_stack(self, base=self.hparams.rope_freq_base)


class FastSlowEps(ExampleBackend):
    """The Fast-AR normalizes with the Slow-AR's epsilon."""

    def __init__(self, model_file, kv_cache_dtype="f32"):
        super().__init__(model_file, kv_cache_dtype)
        self.fast = _fast_stack(self, eps=self.hparams.rms_norm_eps)


class FastSlowHeads(ExampleBackend):
    """The Fast-AR splits heads as the Slow-AR does."""

    def __init__(self, model_file, kv_cache_dtype="f32"):
        super().__init__(model_file, kv_cache_dtype)
        hp = self.hparams
        self.fast = _fast_stack(self, n_head=hp.n_head, n_head_kv=hp.n_head_kv,
                                head_dim=hp.head_dim)


class F16DeclaredF32Held(ExampleBackend):
    """Declares an f16 cache (as s2.cpp) but keeps the unrounded float32 values."""

    def __init__(self, model_file, kv_cache_dtype="f16"):
        super().__init__(model_file)

    @property
    def capabilities(self):
        return F16_DECLARED


class F32DeclaredF16Held(ExampleBackend):
    """Declares a float32 cache but stores float16 (rounds every value it writes)."""

    def allocate_kv_cache(self, max_seq_len):
        hp = self.hparams
        self.cache = np.zeros((2, hp.n_layer, max_seq_len, hp.n_head_kv, hp.head_dim), np.float16)

    def read_kv_cache(self, n_positions):
        return tuple(self.cache[i, :, :n_positions].astype(np.float32) for i in (0, 1))


class HalfDeclaredF32Computed(ExampleBackend):
    """Declares f16 compute (a bound 1000x looser) while computing in float32."""

    @property
    def capabilities(self):
        return HALF_DECLARED


class F32DeclaredHalfResults(ExampleBackend):
    """Declares float32 compute, but its results carry f16 rounding."""

    def eval_cached(self, batch):
        return tuple(x.astype(np.float16).astype(np.float32) for x in super().eval_cached(batch))

    def fast_decode(self, hidden, prefix_codes):
        return super().fast_decode(hidden, prefix_codes).astype(np.float16).astype(np.float32)


class IgnoresKvCacheDtype(ExampleBackend):
    """Declares kv_cache_dtype f32 or f16, takes it, and ignores it."""

    def __init__(self, model_file, kv_cache_dtype="f32"):
        super().__init__(model_file)


class TakesUndeclaredOption(ExampleBackend):
    """Takes a `threads` keyword that its spec never declares (so load() refuses it)."""

    def __init__(self, model_file, kv_cache_dtype="f32", threads=1):
        super().__init__(model_file, kv_cache_dtype)


F16_DECLARED = dataclasses.replace(CAPABILITIES, kv_cache_dtype="f16",
                                   supported_kv_cache_dtypes=("f16",))
HALF_DECLARED = dataclasses.replace(CAPABILITIES, compute_dtype="f16")


class SharedCallState(ExampleBackend):
    """Keeps the batch of the call in progress on the class (a module-level "current
    context"), so every instance shares it: two models in two threads evaluate each other's
    batches. The sleep stands for a device call that releases the GIL."""

    _batch = None

    def eval_cached(self, batch):
        type(self)._batch = batch
        time.sleep(0.002)
        return super().eval_cached(type(self)._batch)


class KeepsWeightsOnClose(ExampleBackend):
    """close() frees the cache only (what Backend.close once did): the weights, views of the
    file's memory map, keep it mapped after the model is closed."""

    def close(self):
        self.free_kv_cache()


class LosesCacheOnFailedInit(ExampleBackend):
    """States no memory limit and frees the old cache before allocating the new one: an
    allocation that fails leaves nothing."""

    def kv_cache_limit_bytes(self):
        return None

    def allocate_kv_cache(self, max_seq_len):
        self.cache = None
        super().allocate_kv_cache(max_seq_len)
