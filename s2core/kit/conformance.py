"""The conformance tests every backend passes, as base classes a third party can subclass.

Usage (pandas-style): subclass `BackendConformance` in a test module and provide a `backend`
fixture naming the backend (s2core's opt-in pytest plugin provides one parametrized over every
registered backend, restricted by `--s2core-backend NAME`):

    # conftest.py
    pytest_plugins = ["s2core.kit.pytest_plugin"]
    # test_my_backend.py
    from s2core.kit import BackendConformance
    class TestMyBackend(BackendConformance):
        pass

Numbers are compared with a float64 reference written from the SPEC, as relative errors
||out - ref|| / ||ref||, against bounds set by the backend's declared precision.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import pytest

import s2core
from s2core.errors import (CacheNotInitializedError, CacheOverflowError, InvalidInputError,
                           InvalidTokensError)
from s2core.kit.prompts import mixed_prompt, semantic_frame

from s2core.kit.arithmetic import ArithmeticConformance
from s2core.kit.batching import BatchingConformance
from s2core.kit.models import CONFIGS, MATRIX, MATRIX_IDS, kit_model, kit_reference
from s2core.kit.prefix_stream import PrefixAndStreamConformance
from s2core.kit.declared import DeclaredMemoryRules
from s2core.kit.faults import BackendErrorRules
from s2core.kit.logit_rows import LogitRowsRules
from s2core.kit.rules import ContractRules, ThreadAndLifeCycleRules
from s2core.kit.tolerances import fast_tolerance, kv_tolerance, output_tolerance


def rel_err(out: np.ndarray, ref: np.ndarray) -> float:
    """||out - ref|| / ||ref|| in float64."""
    out, ref = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    return float(np.linalg.norm(out - ref) / np.linalg.norm(ref))


def prompt_and_frames(config: str, n_prompt: int = 24, n_frames: int = 5, seed: int = 0
                      ) -> tuple[np.ndarray, list[np.ndarray]]:
    hp = CONFIGS[config]
    rng = np.random.default_rng(seed)
    return mixed_prompt(hp, n_prompt, rng), [semantic_frame(hp, rng) for _ in range(n_frames)]


def assert_close(out: np.ndarray, ref: np.ndarray, tol: float, what: str) -> None:
    assert np.all(np.isfinite(out)), f"{what}: non-finite values"
    err = rel_err(out, ref)
    assert err <= tol, f"{what}: ||out - ref|| / ||ref|| = {err:.3e} > {tol:.1e}"


def _bad_cases(hp, prompt: np.ndarray) -> list[tuple[str, Callable[[Any], Any], type, str]]:
    """(id, call on a model with n_past > 0, expected exception, expected check)."""
    w, sem = hp.row_width, hp.semantic_begin_id
    frame = semantic_frame(hp, np.random.default_rng(1))

    def with_row(row: np.ndarray) -> np.ndarray:
        p = prompt[:4].copy()
        p[2] = row
        return p

    bad_code = frame.copy()
    bad_code[3] = hp.codebook_size          # s2.cpp would silently read the next codebook
    neg_code = frame.copy()
    neg_code[1] = -1
    text_row = prompt[0].copy()
    return [
        ("empty", lambda m: m.prefill(prompt[:0]), InvalidTokensError, "n_tokens>0"),
        ("n_tokens_zero", lambda m: m.prefill_fast(prompt[:2].ravel(), n_tokens=0),
         InvalidTokensError, "n_tokens>0"),
        ("flat_short", lambda m: m.eval_cached(prompt[:3].ravel()[:-1], n_tokens=3),
         InvalidTokensError, "flat_length"),
        ("flat_long", lambda m: m.prefill(prompt[:3].ravel(), n_tokens=2),
         InvalidTokensError, "flat_length"),
        ("flat_ragged", lambda m: m.prefill(prompt[:3].ravel()[:-1]), InvalidTokensError,
         "flat_length"),
        ("row_width", lambda m: m.prefill(prompt[:3, :w - 1]), InvalidTokensError, "row_width"),
        ("three_dims", lambda m: m.prefill(prompt[None, :3]), InvalidTokensError, "shape"),
        ("float_dtype", lambda m: m.prefill(prompt[:3].astype(np.float32)), InvalidTokensError,
         "dtype"),
        ("n_tokens_bool", lambda m: m.prefill(prompt[:1].ravel(), n_tokens=True),
         InvalidTokensError, "n_tokens_type"),
        ("id_negative", lambda m: m.prefill(with_row(np.r_[-1, text_row[1:]])),
         InvalidTokensError, "token_id_range"),
        ("id_vocab", lambda m: m.prefill_fast(with_row(np.r_[hp.vocab_size, text_row[1:]])),
         InvalidTokensError, "token_id_range"),
        ("code_too_big", lambda m: m.prefill(with_row(bad_code)), InvalidTokensError,
         "code_range"),
        ("code_negative", lambda m: m.prefill_fast(with_row(neg_code)), InvalidTokensError,
         "code_range"),
        ("step_code", lambda m: m.step(bad_code), InvalidTokensError, "code_range"),
        ("ragged_tokens", lambda m: m.prefill([list(prompt[0]), list(prompt[1][:-1])]),
         InvalidTokensError, "shape"),
        ("ragged_frame", lambda m: m.step([list(frame[:2]), list(frame[2:])]),
         InvalidTokensError, "step_shape"),
        ("string_tokens", lambda m: m.prefill_fast("not tokens"), InvalidTokensError, "shape"),
        ("step_two_rows", lambda m: m.step(np.stack([frame, frame])), InvalidTokensError,
         "step_shape"),
        ("step_text_id_range", lambda m: m.step(np.r_[hp.vocab_size + 5, frame[1:]]),
         InvalidTokensError, "token_id_range"),
        ("overflow", lambda m: m.prefill(np.tile(prompt, (8, 1))), CacheOverflowError,
         "capacity"),
        ("overflow_fast", lambda m: m.prefill_fast(np.tile(prompt, (8, 1))), CacheOverflowError,
         "capacity"),
        ("chunk_size_zero", lambda m: m.prefill(prompt[:4], chunk_size=0), InvalidInputError,
         "chunk_size"),
        ("semantic_id_bad_code_sem_begin",
         lambda m: m.prefill(with_row(np.r_[sem, np.full(w - 1, hp.codebook_size + 7)])),
         InvalidTokensError, "code_range"),
    ]


_CASE_IDS = [c[0] for c in _bad_cases(CONFIGS["gqa4"], prompt_and_frames("gqa4")[0])]


class BackendConformance(ContractRules, ThreadAndLifeCycleRules, DeclaredMemoryRules,
                         BackendErrorRules, PrefixAndStreamConformance, BatchingConformance,
                         ArithmeticConformance, LogitRowsRules):
    """The whole matrix, the contract's rules (s2core/kit/rules.py, declared.py, faults.py),
    prefix save/restore and
    streaming (s2core/kit/prefix_stream.py), several sequences per call
    (s2core/kit/batching.py), each declared arithmetic (s2core/kit/arithmetic.py). Needs a `backend` fixture (a registered
    backend's name)."""

    capacity = 64

    @pytest.fixture
    def backend_options(self) -> dict[str, Any]:
        """Options passed to every load(); override to test a backend's non-default setup."""
        return {}

    @pytest.fixture
    def open_model(self, backend, backend_options):
        """open_model(config, weight_type, **options) -> a loaded model, closed afterwards."""
        opened = []

        def _open(config: str = "gqa4", weight_type: str = "f32", **options):
            m = s2core.load(kit_model(config, weight_type), backend=backend,
                            **{**backend_options, **options})
            opened.append(m)
            return m
        yield _open
        for m in opened:
            m.close()

    # ------------------------------------------------------------ numbers vs reference
    @pytest.mark.parametrize("config,weight_type", MATRIX, ids=MATRIX_IDS)
    def test_prefill_matches_reference(self, open_model, config, weight_type):
        m = open_model(config, weight_type)
        prompt, _ = prompt_and_frames(config)
        m.init_kv_cache(self.capacity)
        r = m.prefill_fast(prompt)
        # the reference in the arithmetic the model declares (kit/arithmetic.py)
        ref = kit_reference(config, weight_type, m.capabilities.arithmetic).forward(prompt)
        caps = m.capabilities
        assert r.hidden.shape == (m.hparams.dim,) and r.hidden.dtype == np.float32
        assert r.logits.shape == (m.hparams.vocab_size,) and r.logits.dtype == np.float32
        assert m.n_past == len(prompt)
        declared = f" (bound for the declared compute_dtype={caps.compute_dtype!r}, " \
                   f"kv_cache_dtype={caps.kv_cache_dtype!r})"
        assert_close(r.hidden, ref.hidden, output_tolerance(caps), "hidden" + declared)
        assert_close(r.logits, ref.logits, output_tolerance(caps), "logits" + declared)
        k, v = m.kv_cache_snapshot()
        assert k.shape == v.shape == (m.hparams.n_layer, len(prompt), m.hparams.n_head_kv,
                                      m.hparams.head_dim)
        assert_close(k, ref.k, kv_tolerance(caps), "K cache")
        assert_close(v, ref.v, kv_tolerance(caps), "V cache")

    @pytest.mark.parametrize("config,weight_type", MATRIX, ids=MATRIX_IDS)
    def test_steps_match_reference(self, open_model, config, weight_type):
        m = open_model(config, weight_type)
        prompt, frames = prompt_and_frames(config)
        ref = kit_reference(config, weight_type, m.capabilities.arithmetic)
        m.init_kv_cache(self.capacity)
        m.prefill(prompt)
        seq = prompt
        for frame in frames:
            r = m.step(frame)
            seq = np.vstack([seq, frame])
            expected = ref.forward(seq)
            assert_close(r.hidden, expected.hidden, output_tolerance(m.capabilities),
                         f"hidden after step at position {len(seq) - 1}")
            assert_close(r.logits, expected.logits, output_tolerance(m.capabilities),
                         f"logits after step at position {len(seq) - 1}")
        assert m.n_past == len(seq)

    @pytest.mark.parametrize("config,weight_type", MATRIX, ids=MATRIX_IDS)
    def test_fast_decode_matches_reference(self, open_model, config, weight_type):
        m = open_model(config, weight_type)
        ref = kit_reference(config, weight_type, m.capabilities.arithmetic)
        hp = m.hparams
        rng = np.random.default_rng(3)
        hidden = rng.standard_normal(hp.dim).astype(np.float32)
        codes = rng.integers(0, hp.codebook_size, hp.num_codebooks)
        for n in range(hp.num_codebooks):  # prefix lengths 0 .. num_codebooks - 1
            out = m.fast_decode(hidden, codes[:n])
            assert out.shape == (hp.codebook_size,) and out.dtype == np.float32
            assert_close(out, ref.fast_decode(hidden, codes[:n]), fast_tolerance(m.capabilities),
                         f"fast logits, prefix length {n}")

    def test_fast_decode_in_any_call_order(self, open_model):
        """Calls that extend, branch, repeat, shrink or switch hidden all give the reference's
        numbers (backends may keep the Fast-AR's K/V between calls of one frame)."""
        m = open_model("gqa2-noqk", "f32")
        ref = kit_reference("gqa2-noqk", "f32")
        rng = np.random.default_rng(4)
        h1, h2 = (rng.standard_normal(m.hparams.dim).astype(np.float32) for _ in range(2))
        calls = [(h1, []), (h1, [3]), (h1, [3, 5]), (h1, [3, 5, 7, 1]), (h1, [3, 6]),
                 (h1, [3, 6]), (h2, [3, 6, 2]), (h1, [3]), (h2, [3, 6, 2, 9]), (h2, [])]
        for i, (h, codes) in enumerate(calls):
            out = m.fast_decode(h, codes)
            assert_close(out, ref.fast_decode(h, codes), fast_tolerance(m.capabilities),
                         f"call {i}: prefix {codes}")
        h3 = h1.copy()
        m.fast_decode(h3, [1, 2])
        h3 += 1.0  # the caller reuses its array: the next call must see the new values
        assert_close(m.fast_decode(h3, [1, 2, 3]), ref.fast_decode(h3, [1, 2, 3]),
                     fast_tolerance(m.capabilities), "hidden changed in place")

    def test_kv_cache_dtypes(self, open_model, backend):
        """Every cache type the backend offers meets its own bound."""
        prompt, frames = prompt_and_frames("gqa4")
        ref = kit_reference("gqa4", "f32").forward(np.vstack([prompt, frames[0]]))
        probe_caps = s2core.get_registry().info(backend).capabilities
        for dtype in probe_caps.supported_kv_cache_dtypes:
            m = open_model("gqa4", "f32", kv_cache_dtype=dtype)
            assert m.capabilities.kv_cache_dtype == dtype
            m.init_kv_cache(self.capacity)
            m.prefill(prompt)
            r = m.step(frames[0])
            assert_close(r.logits, ref.logits, output_tolerance(m.capabilities), f"{dtype} cache")
            k, _ = m.kv_cache_snapshot()
            assert_close(k, ref.k, kv_tolerance(m.capabilities), f"{dtype} cache K")

    # ------------------------------------------------------------ consistency
    @pytest.mark.parametrize("chunk", [1, 3, 7, 64])
    def test_chunked_prefill_equals_unchunked(self, open_model, chunk):
        prompt, _ = prompt_and_frames("gqa4", n_prompt=30)
        whole = open_model("gqa4", "q8_0")
        whole.init_kv_cache(self.capacity)
        one = whole.prefill_fast(prompt)
        chunked = open_model("gqa4", "q8_0")
        chunked.init_kv_cache(self.capacity)
        r = chunked.prefill(prompt, chunk_size=chunk)
        assert chunked.n_past == whole.n_past == len(prompt)
        tol = output_tolerance(chunked.capabilities)
        assert_close(r.hidden, one.hidden, tol, f"hidden, chunks of {chunk}")
        assert_close(r.logits, one.logits, tol, f"logits, chunks of {chunk}")
        k1, v1 = whole.kv_cache_snapshot()
        k2, v2 = chunked.kv_cache_snapshot()
        assert_close(k2, k1, kv_tolerance(chunked.capabilities), "K cache")
        assert_close(v2, v1, kv_tolerance(chunked.capabilities), "V cache")

    @pytest.mark.parametrize("k", [1, 10, 23])
    def test_prefill_then_steps_equals_one_prefill(self, open_model, k):
        prompt, _ = prompt_and_frames("gqa2-noqk", n_prompt=24)
        one = open_model("gqa2-noqk", "f32")
        one.init_kv_cache(self.capacity)
        expected = one.prefill_fast(prompt)
        m = open_model("gqa2-noqk", "f32")
        m.init_kv_cache(self.capacity)
        r = m.prefill(prompt[:k])
        for row in prompt[k:]:
            r = m.step(row)
        assert m.n_past == len(prompt)
        tol = output_tolerance(m.capabilities)
        assert_close(r.hidden, expected.hidden, tol, "hidden")
        assert_close(r.logits, expected.logits, tol, "logits")

    def test_text_code_slots_have_no_effect(self, open_model):
        prompt, _ = prompt_and_frames("gqa4")
        hp = CONFIGS["gqa4"]
        text = ~((prompt[:, 0] >= hp.semantic_begin_id) & (prompt[:, 0] <= hp.semantic_end_id))
        assert text.sum() >= 3 and (~text).sum() >= 3
        other = prompt.copy()
        other[text, 1:] = np.random.default_rng(9).integers(-10**9, 10**9, (text.sum(), hp.num_codebooks))
        results = []
        for p in (prompt, other):
            m = open_model("gqa4", "f32")
            m.init_kv_cache(self.capacity)
            results.append(m.prefill(p))
        np.testing.assert_array_equal(results[0].hidden, results[1].hidden)
        np.testing.assert_array_equal(results[0].logits, results[1].logits)

    def test_semantic_codes_do_matter(self, open_model):
        """The converse: changing a semantic position's code changes the output."""
        prompt, _ = prompt_and_frames("gqa4")
        hp = CONFIGS["gqa4"]
        t = int(np.flatnonzero(prompt[:, 0] >= hp.semantic_begin_id)[0])
        other = prompt.copy()
        other[t, 5] = (other[t, 5] + 1) % hp.codebook_size
        logits = []
        for p in (prompt, other):
            m = open_model("gqa4", "f32")
            m.init_kv_cache(self.capacity)
            logits.append(m.prefill(p).logits)
        assert rel_err(logits[1], logits[0]) > 1e-4

    def test_reset_then_reuse(self, open_model):
        prompt, frames = prompt_and_frames("gqa4")
        m = open_model("gqa4", "f16")
        m.init_kv_cache(self.capacity)
        first = [m.prefill(prompt)] + [m.step(f) for f in frames]
        m.reset()
        assert m.n_past == 0 and m.max_seq_len == self.capacity
        again = [m.prefill(prompt[:5])]  # a different, shorter run in between
        m.reset()
        again = [m.prefill(prompt)] + [m.step(f) for f in frames]
        for a, b in zip(first, again):
            np.testing.assert_allclose(b.logits, a.logits, rtol=0, atol=1e-6 * np.abs(a.logits).max())
        assert m.n_past == len(prompt) + len(frames)

    def test_clear_then_init(self, open_model):
        prompt, frames = prompt_and_frames("gqa4")
        m = open_model("gqa4", "f32")
        m.init_kv_cache(self.capacity)
        before = m.prefill(prompt).logits
        m.clear_kv_cache()
        assert m.max_seq_len is None and m.n_past == 0
        with pytest.raises(CacheNotInitializedError):
            m.step(frames[0])
        with pytest.raises(CacheNotInitializedError):
            m.kv_cache_snapshot()
        m.init_kv_cache(self.capacity // 2)
        assert m.max_seq_len == self.capacity // 2
        after = m.prefill(prompt).logits
        np.testing.assert_allclose(after, before, rtol=0, atol=1e-6 * np.abs(before).max())

    def test_eval_before_init_raises(self, open_model):
        prompt, frames = prompt_and_frames("gqa4")
        m = open_model("gqa4", "f32")
        for call in (lambda: m.prefill(prompt), lambda: m.prefill_fast(prompt),
                     lambda: m.step(frames[0])):
            with pytest.raises(CacheNotInitializedError, match="init_kv_cache"):
                call()
        assert m.n_past == 0

    def test_fill_to_capacity_then_overflow(self, open_model):
        prompt, frames = prompt_and_frames("gqa4", n_prompt=10)
        m = open_model("gqa4", "f32")
        m.init_kv_cache(12)
        m.prefill(prompt)
        m.step(frames[0])
        m.step(frames[1])
        assert m.n_past == 12
        k, v = m.kv_cache_snapshot()
        with pytest.raises(CacheOverflowError, match=r"12.*1.*13.*max_seq_len=12"):
            m.step(frames[2])
        assert m.n_past == 12
        k2, v2 = m.kv_cache_snapshot()
        np.testing.assert_array_equal(k2, k)
        np.testing.assert_array_equal(v2, v)

    @pytest.mark.parametrize("case", _CASE_IDS)
    def test_bad_input_leaves_model_unchanged(self, open_model, case):
        hp = CONFIGS["gqa4"]
        prompt, frames = prompt_and_frames("gqa4")
        name, call, exc_type, check = next(c for c in _bad_cases(hp, prompt) if c[0] == case)
        m = open_model("gqa4", "f16")
        m.init_kv_cache(self.capacity)
        m.prefill(prompt)
        n_past = m.n_past
        k, v = m.kv_cache_snapshot()
        with pytest.raises(exc_type) as info:
            call(m)
        assert info.value.check == check, f"raised for check {info.value.check!r}: {info.value}"
        assert m.n_past == n_past
        k2, v2 = m.kv_cache_snapshot()
        np.testing.assert_array_equal(k2, k)
        np.testing.assert_array_equal(v2, v)
        # The next valid call gives what it would have given had the failure never happened.
        after = m.step(frames[0])
        clean = open_model("gqa4", "f16")
        clean.init_kv_cache(self.capacity)
        clean.prefill(prompt)
        expected = clean.step(frames[0])
        np.testing.assert_allclose(after.logits, expected.logits, rtol=0,
                                   atol=1e-6 * np.abs(expected.logits).max())

    def test_fast_decode_bad_input(self, open_model):
        m = open_model("gqa4", "f32")
        hp = m.hparams
        hidden = np.ones(hp.dim, np.float32)
        cases = [
            (lambda: m.fast_decode(np.ones(hp.dim + 1, np.float32), []), "hidden_shape"),
            (lambda: m.fast_decode(hidden, [hp.codebook_size]), "prefix_code_range"),
            (lambda: m.fast_decode(hidden, [-1]), "prefix_code_range"),
            (lambda: m.fast_decode(hidden, [0] * hp.fast.context_length), "prefix_length"),
            # s2.cpp: num_codebooks codes leave no next codebook to predict
            (lambda: m.fast_decode(hidden, [0] * hp.num_codebooks), "prefix_length"),
            (lambda: m.fast_decode(hidden, [[1, 2]]), "prefix_shape"),
            (lambda: m.fast_decode(hidden, [[1, 2], [3]]), "prefix_shape"),
            (lambda: m.fast_decode(hidden, [1.5]), "prefix_dtype"),
            (lambda: m.fast_decode(None, []), "hidden_type"),
            (lambda: m.fast_decode("hidden", []), "hidden_type"),
            (lambda: m.fast_decode(["x"] * hp.dim, []), "hidden_dtype"),
        ]
        for call, check in cases:
            with pytest.raises(InvalidInputError) as info:
                call()
            assert info.value.check == check
        # The longest prefix (the last code of a frame) is fine.
        longest = min(hp.num_codebooks, hp.fast.context_length) - 1
        out = m.fast_decode(hidden, list(range(longest)))
        assert out.shape == (hp.codebook_size,)
