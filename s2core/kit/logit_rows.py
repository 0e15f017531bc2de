"""The kit's rule for `logit_rows` (contract.md, "Logit rows"): a call that asks for some
token ids' logits gets the full logits at those ids, bit for bit, and nothing else changes.

The frame rule samples the main token from the semantic ids and <|im_end|> only, so every
generation step asks for those rows (s2core/generation/frame.py); a backend declaring
`Capabilities.logit_rows` computes only them, every other backend's full logits are cut by the
core. Both must give what the whole vocabulary's logits hold at those ids, or a synthesis
would depend on which backend computed it. Each row of the output matrix is a dot product of
its own, so no grouping excuse applies: the rule is exact.

`BackendConformance` inherits this; it needs its `open_model` fixture.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from s2core.contract.inputs import LogitRows
from s2core.errors import InvalidInputError
from s2core.kit.models import CONFIGS, MATRIX, MATRIX_IDS
from s2core.kit.prompts import mixed_prompt, semantic_frame
from s2core.kit.rules import LOGIT_ROWS, fail
from s2core.serving.batching import BatchedModel


def _asked_ids(hp: Any, rng: np.random.Generator) -> np.ndarray:
    """Ids as a caller may give them: unsorted, repeated, at both ends of the vocabulary and
    across the semantic range (runs of several lengths, tile edges included)."""
    ids = np.concatenate([[0, 1, 2, hp.vocab_size - 1, 7, 7],
                          np.arange(hp.semantic_begin_id, hp.semantic_end_id + 1)])
    return rng.permutation(ids)


def _equal(what: str, got: Any, want: np.ndarray) -> None:
    got = np.asarray(got)
    if got.shape != want.shape or not np.array_equal(got, want):
        detail = (f"shape {got.shape}, expected {want.shape}" if got.shape != want.shape else
                  f"max difference {np.abs(got.astype(np.float64) - want).max():.3g}")
        fail(LOGIT_ROWS, f"{what}: {detail}")


#: the rule test's model: a mixed file (Q4_K with Q6_K tensors), s2-pro-q4_k_m.gguf's recipe
RULE_MODEL = ("mha-k", "q4_k_m")


class LogitRowsRules:
    """logit_rows in eval_cached and eval_slots (see the module docstring): the whole rule on
    one model, and its numbers on every model of the matrix (a backend computes each weight
    type's rows with its own kernel)."""

    def test_rule_logit_rows_are_rows_of_the_full_logits(self, open_model):
        self._check(open_model, *RULE_MODEL)

    @pytest.mark.parametrize("config,weight_type", MATRIX, ids=MATRIX_IDS)
    def test_logit_rows_of_each_weight_type(self, open_model, config, weight_type):
        self._check(open_model, config, weight_type)

    def _check(self, open_model: Any, config: str, weight_type: str) -> None:
        m = open_model(config, weight_type)
        hp, caps = m.hparams, m.capabilities
        rng = np.random.default_rng(31)
        prompt = mixed_prompt(CONFIGS[config], 21, rng)
        frames = [semantic_frame(CONFIGS[config], rng) for _ in range(3)]
        asked = _asked_ids(hp, rng)
        rows = LogitRows.of(asked, hp.vocab_size)

        m.init_kv_cache(len(prompt) + len(frames))
        full = [m.prefill(prompt)] + [m.step(f) for f in frames]
        k_full, v_full = m.kv_cache_snapshot()
        m.reset()
        picked = [m.prefill(prompt, logit_rows=asked)] + [m.step(f, logit_rows=rows)
                                                          for f in frames]
        k, v = m.kv_cache_snapshot()
        for label, a, b in zip(["prefill"] + [f"step {i + 1}" for i in range(len(frames))],
                               full, picked):
            if b.logit_rows != rows:
                fail(LOGIT_ROWS, f"the {label} Result says it covers {b.logit_rows!r}, not the "
                     f"{rows!r} asked for")
            _equal(f"{label}: the logits of logit_rows ({weight_type}) against the full "
                   "logits at those ids", b.logits, rows.take(a.logits))
            _equal(f"{label}: hidden with logit_rows against without", b.hidden, a.hidden)
            if caps.logit_rows:
                native = np.asarray(m.backend.to_numpy(b.logits_native))
                if native.shape != (len(rows),):
                    fail(LOGIT_ROWS, f"{label}: the backend declares Capabilities.logit_rows "
                         f"but returned logits of shape {native.shape}, not ({len(rows)},)")
        _equal("K with logit_rows against without", k, k_full)
        _equal("V with logit_rows against without", v, v_full)

        m.reset()
        m.prefill(prompt, logit_rows=rows)
        for bad in ([hp.vocab_size], [-1], [], [[1, 2]], [1.5]):
            try:
                m.step(frames[0], logit_rows=bad)
            except InvalidInputError:
                pass
            else:
                fail(LOGIT_ROWS, f"logit_rows={bad!r} was accepted (vocabulary [0, "
                     f"{hp.vocab_size}))")
            if m.n_past != len(prompt):
                fail(LOGIT_ROWS, f"a refused logit_rows={bad!r} moved n_past to {m.n_past}")
        _equal("a step after refused logit_rows", m.step(frames[0], logit_rows=rows).logits,
               rows.take(full[1].logits))

        if caps.max_batch_sequences > 1:
            self._check_slots(open_model(config, weight_type), prompt, frames, rows)

    @staticmethod
    def _check_slots(m: Any, prompt: np.ndarray, frames: list[np.ndarray],
                     rows: LogitRows) -> None:
        """One eval_slots call whose slots ask for other rows (and one for all of them)
        against the same call without logit_rows."""
        other = LogitRows.of([3, m.hparams.semantic_begin_id], m.hparams.vocab_size)
        asks = [rows, None, other]
        lengths = [len(prompt), 9, 5]
        b = BatchedModel(m)
        b.init_slots(3, len(prompt) + len(frames))

        def run(with_rows: bool) -> list[list[Any]]:
            for slot in range(3):
                b.reset_slot(slot)
            calls = [[(s, prompt[:n], asks[s] if with_rows else None)
                      for s, n in enumerate(lengths)]]
            calls += [[(s, f, asks[s] if with_rows else None) for s in range(3)]
                      for f in frames]
            return [b.eval(call) for call in calls]

        plain, picked = run(False), run(True)
        for call, (p_results, r_results) in enumerate(zip(plain, picked)):
            for slot, (p, r) in enumerate(zip(p_results, r_results)):
                want = p.logits if asks[slot] is None else asks[slot].take(p.logits)
                _equal(f"eval_slots call {call}, slot {slot} (asking for "
                       f"{asks[slot]!r}): its logits against the same call's full logits at "
                       "those ids", r.logits, want)
                _equal(f"eval_slots call {call}, slot {slot}: hidden with logit_rows against "
                       "without", r.hidden, p.hidden)
        b.close()
