"""Random sequences of public model calls (hypothesis's stateful testing) on the NumPy backend.

The machine keeps its own account of what the model should hold: the token rows behind cache
positions [0, n_past) and the capacity. After every call, n_past and max_seq_len must match
it, and the cached K/V must be those of the float64 reference evaluating the same rows from
position 0, however the calls cut them (prefills of any size and chunking, steps, prefixes
saved and restored). Bad inputs are mixed in: each must raise an S2CoreError and leave n_past,
the capacity and the cache's contents exactly as they were. A closed model refuses every call
(and the run goes on with a new one).

Bounded for CI: derandomized, a fixed number of runs and steps, a deadline per run.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (RuleBasedStateMachine, initialize, invariant, precondition,
                                 rule)

import s2core
from s2core import (CacheNotInitializedError, CacheOverflowError, InvalidInputError,
                    ModelClosedError, S2CoreError)
from s2core.generation.loop import GenerationConfig, generate
from s2core.kit.models import CONFIGS, kit_model, kit_reference
from s2core.kit.tolerances import fast_tolerance, kv_tolerance
from s2core.kit.prompts import mixed_prompt, semantic_frame

HP = CONFIGS["gqa4"]
RUNS = int(os.environ.get("S2CORE_STATEFUL_RUNS", "30"))


def rel_err(out, ref) -> float:
    out, ref = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    return float(np.linalg.norm(out - ref) / np.linalg.norm(ref))


def _bad_calls(m, rng):
    """(name, call) pairs that must each raise an S2CoreError and change nothing."""
    frame = semantic_frame(HP, rng)
    text = mixed_prompt(HP, 3, rng)
    bad_id = text.copy()
    bad_id[1, 0] = HP.vocab_size
    return [
        ("string tokens", lambda: m.prefill("tokens")),
        ("None tokens", lambda: m.prefill_fast(None)),
        ("float tokens", lambda: m.eval_cached(text.astype(np.float32))),
        ("id out of vocab", lambda: m.prefill(bad_id)),
        ("ragged tokens", lambda: m.prefill([list(text[0]), list(text[1][:-1])])),
        ("ragged frame", lambda: m.step([list(frame[:3]), list(frame[3:])])),
        ("two-row step", lambda: m.step(np.stack([frame, frame]))),
        ("chunk 0", lambda: m.prefill(text, chunk_size=0)),
        ("n_tokens mismatch", lambda: m.prefill(text.ravel(), n_tokens=2)),
        ("init 0", lambda: m.init_kv_cache(0)),
        ("init beyond context", lambda: m.init_kv_cache(HP.context_length + 1)),
        ("init string", lambda: m.init_kv_cache("64")),
        ("None hidden", lambda: m.fast_decode(None, [])),
        ("string hidden", lambda: m.fast_decode("h" * HP.dim, [])),
        ("short hidden", lambda: m.fast_decode(np.ones(HP.dim - 1, np.float32), [])),
        ("ragged prefix", lambda: m.fast_decode(np.ones(HP.dim, np.float32), [[1, 2], [3]])),
        ("full prefix", lambda: m.fast_decode(np.ones(HP.dim, np.float32),
                                              [0] * HP.num_codebooks)),
        ("prefix out of range", lambda: m.fast_decode(np.ones(HP.dim, np.float32),
                                                      [HP.codebook_size])),
        ("generate None", lambda: generate(m, None)),
        ("NaN temperature", lambda: GenerationConfig(temperature=float("nan"))),
        ("negative seed", lambda: GenerationConfig(seed=-1)),
        ("restore a non-prefix", lambda: m.restore_prefix("prefix")),
    ]


N_BAD = len(_bad_calls(None, np.random.default_rng(0)))
#: before a valid call, often a bad one: bad inputs then meet every state the machine reaches
BAD_FIRST = st.one_of(st.none(), st.integers(0, N_BAD - 1))


class ModelMachine(RuleBasedStateMachine):
    @initialize(n=st.integers(8, 48), k=st.integers(1, 8))
    def load(self, n, k):
        """A model with a cache and k positions in it: the state most calls meet."""
        self.model = s2core.load(kit_model("gqa4", "f32"), backend="numpy")
        self.ref = kit_reference("gqa4", "f32")
        self.rng = np.random.default_rng(0)
        self.model.init_kv_cache(n)
        tokens = mixed_prompt(HP, k, self.rng)
        self.model.prefill(tokens)
        self.rows = tokens  # what cache rows [0, n_past) hold
        self.capacity: int | None = n

    def teardown(self):
        if hasattr(self, "model"):
            self.model.close()

    # ------------------------------------------------------------------ helpers
    def _expect(self, error, call):
        with pytest.raises(error):
            call()

    def _state(self):
        m = self.model
        snap = m.kv_cache_snapshot() if m.max_seq_len is not None and m.n_past else None
        return m.n_past, m.max_seq_len, snap

    # ------------------------------------------------------------------ rules
    @rule(n=st.integers(1, 48))
    def init_kv_cache(self, n):
        self.model.init_kv_cache(n)
        self.rows, self.capacity = self.rows[:0], n

    @rule(k=st.integers(1, 9), how=st.sampled_from(["prefill", "prefill_fast", "eval_cached"]),
          chunk=st.one_of(st.none(), st.integers(1, 9)), flat=st.booleans(), bad=BAD_FIRST)
    def evaluate(self, k, how, chunk, flat, bad):
        self._bad(bad)
        tokens = mixed_prompt(HP, k, self.rng)
        arg = tokens.ravel() if flat else tokens
        call = getattr(self.model, how)
        run = (lambda: call(arg, chunk_size=chunk)) if how == "prefill" else (lambda: call(arg))
        if self.capacity is None:
            return self._expect(CacheNotInitializedError, run)
        if len(self.rows) + k > self.capacity:
            return self._expect(CacheOverflowError, run)
        r = run()
        self.rows = np.vstack([self.rows, tokens])
        assert r.n_tokens == k and r.hidden.shape == (HP.dim,)

    @rule(bad=BAD_FIRST)
    def step(self, bad):
        self._bad(bad)
        frame = semantic_frame(HP, self.rng)
        if self.capacity is None:
            return self._expect(CacheNotInitializedError, lambda: self.model.step(frame))
        if len(self.rows) == self.capacity:
            return self._expect(CacheOverflowError, lambda: self.model.step(frame))
        self.model.step(frame)
        self.rows = np.vstack([self.rows, frame])

    @rule(n=st.integers(0, HP.num_codebooks - 1), seed=st.integers(0, 3))
    def fast_decode(self, n, seed):
        """Against the reference; any earlier session (same hidden or not) must not matter."""
        hidden = np.random.default_rng(seed).standard_normal(HP.dim).astype(np.float32)
        codes = np.arange(1, n + 1) % HP.codebook_size
        out = self.model.fast_decode(hidden, codes)
        assert rel_err(out, self.ref.fast_decode(hidden, codes)) <= fast_tolerance(
            self.model.capabilities)

    @rule()
    def reset(self):
        if self.capacity is None:
            return self._expect(CacheNotInitializedError, self.model.reset)
        self.model.reset()
        self.rows = self.rows[:0]

    @precondition(lambda self: len(self.rows) > 0)
    @rule(data=st.data())
    def save_and_restore_prefix(self, data):
        """Save the first n positions, allocate anew (the same size), restore: the machine's
        rows are those n."""
        n = data.draw(st.integers(1, len(self.rows)))
        prefix = self.model.save_prefix(n)
        self.model.init_kv_cache(self.capacity)
        assert self.model.restore_prefix(prefix) == "written"
        self.rows = self.rows[:n]

    @rule(i=st.integers(0, N_BAD - 1))
    def bad_input(self, i):
        self._bad(i)

    def _bad(self, i):
        """Bad input number i (None: none) raises and changes nothing."""
        if i is None:
            return
        name, call = _bad_calls(self.model, self.rng)[i]
        before = self._state()
        with pytest.raises(S2CoreError) as info:
            call()
        assert isinstance(info.value, InvalidInputError) or self.capacity is None, name
        after = self._state()
        assert after[:2] == before[:2], name
        if before[2] is not None:
            for a, b in zip(after[2], before[2]):
                np.testing.assert_array_equal(a, b, err_msg=name)

    @rule(how=st.sampled_from(["clear", "generate", "close"]))
    def end_synthesis(self, how):
        """One rule for the three ways a cache goes (as three rules they would end most
        runs' history early): clear_kv_cache(); generate(), which frees the cache it used;
        close(), after which every call raises ModelClosedError and closing twice is fine,
        and a new model on the same file goes on."""
        if how == "clear":
            self.model.clear_kv_cache()
        elif how == "generate":
            generate(self.model, mixed_prompt(HP, 3, self.rng),
                     GenerationConfig(max_new_tokens=2, seed=0, im_end_id=HP.vocab_size - 1))
        else:
            self._close_and_load_again()
        self.rows, self.capacity = self.rows[:0], None

    def _close_and_load_again(self):
        m = self.model
        m.close()
        for call in (lambda: m.init_kv_cache(8), lambda: m.step(semantic_frame(HP, self.rng)),
                     m.kv_cache_snapshot, m.reset, m.save_prefix,
                     lambda: m.prefill(mixed_prompt(HP, 2, self.rng)),
                     lambda: m.fast_decode(np.ones(HP.dim, np.float32), [])):
            self._expect(ModelClosedError, call)
        m.close()
        assert m.closed and m.n_past == 0 and m.max_seq_len is None
        self.model = s2core.load(kit_model("gqa4", "f32"), backend="numpy")

    # ------------------------------------------------------------------ invariants
    @invariant()
    def positions_are_accounted_for(self):
        if not hasattr(self, "model"):
            return
        assert self.model.n_past == len(self.rows)
        assert self.model.max_seq_len == self.capacity

    @invariant()
    def cache_holds_the_references_kv(self):
        if not hasattr(self, "model") or not len(self.rows):
            return
        k, v = self.model.kv_cache_snapshot()
        expected = self.ref.forward(self.rows)
        tol = kv_tolerance(self.model.capabilities)
        assert rel_err(k, expected.k) <= tol and rel_err(v, expected.v) <= tol
        np.testing.assert_array_equal(self.model.token_rows()[:, 0], self.rows[:, 0])


ModelMachine.TestCase.settings = settings(
    max_examples=RUNS, stateful_step_count=40, deadline=20000, derandomize=True,
    suppress_health_check=[HealthCheck.too_slow])
test_model_state_machine = ModelMachine.TestCase
