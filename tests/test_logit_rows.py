"""LogitRows (s2core/contract/inputs.py) and the core's handling of `logit_rows=`: runs built
from any ids, refusals that name the problem and change nothing, unions for one product over
several batches, and the frame rule's rows (what generation asks every step)."""

from __future__ import annotations

import numpy as np
import pytest

import s2core
from s2core import InvalidInputError, LogitRows
from s2core.contract.inputs import pick_logit_rows, shared_logit_rows
from s2core.embedded.writer import tiny_hparams
from s2core.generation.config import GenerationConfig, GenerationStats
from s2core.generation.frame import FrameRule
from s2core.kit.prompts import mixed_prompt, semantic_frame
from s2core.serving.batching import BatchedModel


def test_runs_from_unsorted_repeated_ids():
    rows = LogitRows.of([9, 3, 4, 5, 9, 0, 10], 12)
    assert rows.runs == ((0, 1), (3, 6), (9, 11))
    assert rows.ids.tolist() == [0, 3, 4, 5, 9, 10]
    assert len(rows) == 6
    assert rows == LogitRows.of(np.array([10, 9, 5, 4, 3, 0]), 12)
    assert hash(rows) == hash(LogitRows.of([0, 3, 4, 5, 9, 10], 12))
    with pytest.raises(ValueError):
        rows.ids[0] = 1     # shared by every Result that holds it: read-only


@pytest.mark.parametrize("bad, says", [
    ([12], "id 12 is outside the vocabulary [0, 12)"),
    ([-1], "id -1 is outside"),
    ([], "non-empty 1-D"),
    ([[1, 2]], "non-empty 1-D"),
    ([1.5], "integer token ids"),
    ([True], "integer token ids"),
])
def test_bad_ids_are_refused_naming_the_problem(bad, says):
    with pytest.raises(InvalidInputError, match="logit_rows") as err:
        LogitRows.of(bad, 12)
    assert says in str(err.value)


def test_take_pick_and_union():
    full = np.arange(20, dtype=np.float32) * 0.5
    a, b = LogitRows.of([1, 2, 7], 20), LogitRows.of([2, 15], 20)
    np.testing.assert_array_equal(a.take(full), full[[1, 2, 7]])
    union = shared_logit_rows([a, b])
    assert union.ids.tolist() == [1, 2, 7, 15]
    assert shared_logit_rows([a, a]) is a
    assert shared_logit_rows([a, None]) is None
    for wanted in (a, b, None):
        for computed in (union, None):
            if wanted is not None or computed is None:
                got = pick_logit_rows(union.take(full) if computed else full, computed, wanted)
                want = full if wanted is None else full[wanted.ids]
                np.testing.assert_array_equal(got, want)


def test_a_step_with_bad_rows_changes_nothing(tiny_model):
    hp = tiny_hparams()
    m = s2core.load(tiny_model, backend="numpy")
    m.init_kv_cache(32)
    rng = np.random.default_rng(4)
    m.prefill(mixed_prompt(hp, 10, rng))
    frame = semantic_frame(hp, rng)
    before = m.kv_cache_snapshot()
    with pytest.raises(InvalidInputError, match=f"outside the vocabulary \\[0, {hp.vocab_size}\\)"):
        m.step(frame, logit_rows=[0, hp.vocab_size])
    # a LogitRows built by hand is checked as any ids are
    with pytest.raises(InvalidInputError, match="outside the vocabulary"):
        m.step(frame, logit_rows=LogitRows(((0, hp.vocab_size + 3),)))
    assert m.n_past == 10
    for got, want in zip(m.kv_cache_snapshot(), before):
        np.testing.assert_array_equal(got, want)


def test_the_frame_rule_asks_for_the_semantic_ids_and_im_end():
    """Generation samples from these rows only, so they are what every step computes."""
    hp = tiny_hparams()
    end = 3     # the tiny vocabulary's <|im_end|> stand-in
    ids = FrameRule(hp, GenerationConfig(im_end_id=end), GenerationStats()).logit_rows.ids
    semantic = list(range(hp.semantic_begin_id, hp.semantic_end_id + 1))
    assert sorted(set(ids.tolist()) - set(semantic)) == [end]
    assert set(semantic) <= set(ids.tolist())
    with pytest.raises(InvalidInputError, match="im_end_id 151645 is outside the vocab"):
        FrameRule(hp, GenerationConfig(), GenerationStats())


def test_batched_eval_with_bad_rows_changes_no_slot(tiny_model):
    hp = tiny_hparams()
    m = s2core.load(tiny_model, backend="numpy")
    b = BatchedModel(m)
    b.init_slots(2, 32)
    rng = np.random.default_rng(5)
    b.eval([(0, mixed_prompt(hp, 6, rng)), (1, mixed_prompt(hp, 4, rng))])
    frame = semantic_frame(hp, rng)
    with pytest.raises(InvalidInputError, match="logit_rows id -4"):
        b.eval([(0, frame, [1, 2]), (1, frame, [-4])])
    with pytest.raises(InvalidInputError, match="triples"):
        b.eval([(0, frame, None, "extra")])
    assert [b.n_past(0), b.n_past(1)] == [6, 4]
    rows = LogitRows.of([1, 2, hp.semantic_begin_id], hp.vocab_size)
    got = b.eval([(0, frame, rows), (1, frame)])
    assert got[0].logits.shape == (3,) and got[0].logit_rows == rows
    assert got[1].logits.shape == (hp.vocab_size,) and got[1].logit_rows is None
    b.close()


def test_a_well_formed_logit_rows_is_taken_as_it_is(tiny_model):
    """Each generation step hands the same LogitRows: it is checked by its runs, not sorted
    again; a hand-built one out of order is sorted and merged."""
    m = s2core.load(tiny_model, backend="numpy")
    m.init_kv_cache(16)
    hp = m.hparams
    rows = LogitRows.of([1, 2, hp.semantic_begin_id], hp.vocab_size)
    assert m.prefill(mixed_prompt(hp, 4, np.random.default_rng(1)), logit_rows=rows
                     ).logit_rows is rows
    disordered = LogitRows(((5, 7), (1, 3), (3, 4)))
    got = m.step(semantic_frame(hp, np.random.default_rng(2)), logit_rows=disordered)
    assert got.logit_rows.runs == ((1, 4), (5, 7))
    assert got.logits.shape == (5,)
