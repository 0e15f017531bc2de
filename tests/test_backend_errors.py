"""What a backend raises reaches the user as an s2core error, and the model stays as it was
(issue 22): load(), the model's calls, BatchedModel's and the codec's. The kit's rule
(s2core/kit/faults.py) checks the same on every backend; these are the core's own cases the
kit cannot reach (a constructor, refused capabilities, a codec's one-shot decode)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import s2core
from s2core.contract.registry import get_registry
from s2core.errors import (BackendError, BackendOutOfMemoryError, BackendUnavailableError,
                           CacheAllocationError, S2CoreError)
from s2core.kit.codec_models import example_codes_audio, example_path
from s2core.modelfile.file import ModelFile
from s2core.runtime.loading import open_backend
from s2core.serving.batching import BatchedModel

s2core_example = pytest.importorskip("s2core_example.backend")
ExampleBackend = s2core_example.ExampleBackend


class RejectsInInit(ExampleBackend):
    def __init__(self, model_file, kv_cache_dtype="f32"):
        raise ValueError("threads must be a power of two")


class F12Loaded(ExampleBackend):
    @property
    def capabilities(self):
        caps = dataclasses.replace(super().capabilities)
        object.__setattr__(caps, "kv_cache_dtype", "f12")
        return caps


def test_a_constructor_failure_is_a_backend_error_naming_the_class(tiny_model):
    f = ModelFile(tiny_model)
    try:
        with pytest.raises(BackendError, match="RejectsInInit.*ValueError: threads") as info:
            open_backend(get_registry(), "example", RejectsInInit, f, {})
        assert isinstance(info.value.__cause__, ValueError)
        assert info.value.backend == "example"
    finally:
        f.close()


def test_invalid_loaded_capabilities_are_refused(tiny_model):
    f = ModelFile(tiny_model)
    try:
        with pytest.raises(BackendUnavailableError, match="kv_cache_dtype='f12'"):
            open_backend(get_registry(), "example", F12Loaded, f, {})
    finally:
        f.close()


def test_model_calls_wrap_foreign_errors_and_keep_state(tiny_model):
    m = s2core.load(tiny_model, backend="example")
    hp = m.hparams
    prompt = np.zeros((4, hp.row_width), np.int64)
    m.init_kv_cache(8)
    m.prefill(prompt)
    k, v = m.kv_cache_snapshot()

    def boom(*args):
        raise KeyError("scratch")
    m.backend.eval_cached = boom  # dropped by close()
    with pytest.raises(BackendError, match=r"eval_cached\(n_past=4, n_tokens=4\): KeyError"):
        m.prefill(prompt)
    assert m.n_past == 4
    assert all(np.array_equal(a, b) for a, b in zip(m.kv_cache_snapshot(), (k, v)))

    def no_memory(*args):
        raise MemoryError
    m.backend.eval_cached = no_memory  # dropped by close()
    with pytest.raises(BackendOutOfMemoryError):
        m.prefill(prompt)
    m.backend.allocate_kv_cache = boom  # dropped by close()
    with pytest.raises(CacheAllocationError, match="KeyError"):
        m.init_kv_cache(8)
    assert (m.max_seq_len, m.n_past) == (8, 4)
    m.close()


def test_batched_calls_wrap_foreign_errors(tiny_model):
    m = s2core.load(tiny_model, backend="numpy")
    b = BatchedModel(m)
    b.init_slots(2, 8)
    rows = np.zeros((3, m.hparams.row_width), np.int64)
    b.eval([(0, rows)])

    def boom(*args):
        raise IndexError("slot table")
    m.backend.eval_slots = boom  # dropped by close()
    with pytest.raises(BackendError, match="eval_slots"):
        b.eval([(0, rows[:1]), (1, rows)])
    assert (b.n_past(0), b.n_past(1)) == (3, 0)
    m.backend.allocate_kv_slots = boom  # dropped by close()
    with pytest.raises(CacheAllocationError, match="IndexError"):
        b.init_slots(2, 16)
    b.close()
    m.close()


def test_codec_calls_wrap_foreign_errors():
    if "numpy" not in {r.name for r in s2core.list_backends() if r.available}:
        pytest.skip("the NumPy backend provides the codec used here")
    c = s2core.load_codec(example_path(), backend="numpy")
    codes, _ = example_codes_audio()

    def boom(*args):
        raise IndexError("codebook table")
    c.backend.decode = boom  # dropped by close()
    with pytest.raises(BackendError, match="decode"):
        c.decode(codes)
    assert isinstance(BackendError("x", "y", ValueError()), S2CoreError)
    c.close()
