"""The core's own duties: n_past, cache life cycle, atomic failure, result hand-off."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

import s2core
from s2core import CacheNotInitializedError, InvalidInputError, S2CoreError, SlowARModel
from s2core.modelfile.file import ModelFile
from s2core.kit.prompts import mixed_prompt, semantic_frame
from s2core.embedded.writer import tiny_hparams, write_model
from s2core_numpy.backend import NumpyBackend


class FailingBackend(NumpyBackend):
    """The NumPy backend with a fault injected into its k-th eval_cached call (a device
    running out of memory mid-prefill, say)."""

    name = "numpy-failing"

    def __init__(self, model_file, fail_on_call: int):
        super().__init__(model_file)
        self.calls = 0
        self.fail_on_call = fail_on_call

    def eval_cached(self, batch):
        self.calls += 1
        if self.calls == self.fail_on_call:
            raise MemoryError("injected: device out of memory")
        return super().eval_cached(batch)


def prompt(n=24, seed=0):
    return mixed_prompt(tiny_hparams(), n, np.random.default_rng(seed))


def test_failed_chunk_restores_n_past_and_keeps_history(tiny_model):
    mf = ModelFile(tiny_model)
    m = SlowARModel(mf, FailingBackend(mf, fail_on_call=3))  # call 1: first prefill
    m.init_kv_cache(64)
    m.prefill(prompt(10, seed=1))
    k, v = m.kv_cache_snapshot()
    with pytest.raises(MemoryError):
        m.prefill(prompt(), chunk_size=8)  # its 2nd chunk fails
    assert m.n_past == 10
    k2, v2 = m.kv_cache_snapshot()
    np.testing.assert_array_equal(k2, k)
    np.testing.assert_array_equal(v2, v)
    # and the model goes on as if the failed call never happened
    r = m.prefill(prompt(), chunk_size=8)
    clean = s2core.load(tiny_model, backend="numpy")
    clean.init_kv_cache(64)
    clean.prefill(prompt(10, seed=1))
    expected = clean.prefill(prompt(), chunk_size=8)
    np.testing.assert_array_equal(r.logits, expected.logits)


def test_init_kv_cache_validates_and_reallocates(tiny_model):
    m = s2core.load(tiny_model, backend="numpy")
    for bad, check in [(0, "max_seq_len_range"), (4097, "max_seq_len_range"),
                       (-1, "max_seq_len_range"), (12.0, "max_seq_len_type"), (None, "max_seq_len_type")]:
        with pytest.raises(InvalidInputError) as info:
            m.init_kv_cache(bad)
        assert info.value.check == check
    assert m.max_seq_len is None
    m.init_kv_cache(16)
    m.prefill(prompt(8))
    with pytest.raises(InvalidInputError):
        m.init_kv_cache(0)
    assert (m.n_past, m.max_seq_len) == (8, 16)  # a rejected re-init changes nothing
    m.init_kv_cache(32)
    assert (m.n_past, m.max_seq_len) == (0, 32)
    k, _ = m.backend.read_kv_cache(32)
    assert not k.any()  # a new cache is zeroed


def test_reset_requires_a_cache(tiny_model):
    m = s2core.load(tiny_model, backend="numpy")
    with pytest.raises(CacheNotInitializedError):
        m.reset()


def test_flat_input_with_and_without_n_tokens(tiny_model):
    p = prompt(6)
    a = s2core.load(tiny_model, backend="numpy")
    a.init_kv_cache(16)
    r1 = a.prefill_fast(p.ravel(), n_tokens=6)
    a.reset()
    r2 = a.prefill_fast(p.ravel())
    a.reset()
    r3 = a.prefill_fast(p.ravel().tolist())  # plain Python lists work too
    np.testing.assert_array_equal(r1.logits, r2.logits)
    np.testing.assert_array_equal(r1.logits, r3.logits)


def test_result_exposes_native_and_host_arrays_once(tiny_model):
    m = s2core.load(tiny_model, backend="numpy")
    m.init_kv_cache(16)
    r = m.step(semantic_frame(tiny_hparams(), np.random.default_rng(0)))
    assert r.n_tokens == 1
    assert r.hidden is r.hidden  # converted once
    assert r.hidden.dtype == np.float32 and r.logits.shape == (200,)
    assert isinstance(r.hidden_native, np.ndarray)
    assert "numpy" in repr(r) and "n_past=1" in repr(m)


def test_fast_decode_accepts_lists_and_a_model_without_fast_ar_says_so(tmp_path, tiny_model):
    m = s2core.load(tiny_model, backend="numpy")
    out = m.fast_decode([0.5] * 64, [1, 2])
    assert out.shape == (32,) and out.dtype == np.float32
    hp = replace(tiny_hparams(), architecture="qwen3", fast=None)
    no_fast = s2core.load(write_model(tmp_path / "nofast.gguf", hp).path, backend="numpy")
    assert no_fast.hparams.fast is None
    with pytest.raises(S2CoreError, match="has no Fast-AR"):
        no_fast.fast_decode(np.zeros(64, np.float32), [])


def test_context_manager_closes_the_model(tiny_model):
    with s2core.load(tiny_model, backend="numpy") as m:
        m.init_kv_cache(8)
        backend = m.backend
    assert not hasattr(backend, "_k") and m.max_seq_len is None and m.closed


def test_unknown_backend_option_is_rejected(tiny_model):
    with pytest.raises(InvalidInputError, match="kv_cache_dtype='f8'"):
        s2core.load(tiny_model, backend="numpy", kv_cache_dtype="f8")
    with pytest.raises(InvalidInputError) as info:  # was a TypeError from inside the backend
        s2core.load(tiny_model, backend="numpy", not_an_option=1)
    assert info.value.check == "unknown_option"
