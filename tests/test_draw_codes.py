"""The server draws a codebook's codes for all its requests at once (frame.draw_codes); each
request must get the code its own draw_code would draw, and leave its generator where that
leaves it."""

from __future__ import annotations

import numpy as np
import pytest

from s2core.embedded.writer import tiny_hparams
from s2core.generation.config import GenerationConfig, GenerationStats, Sampling
from s2core.generation.frame import FrameRule, draw_codes

#: settings that differ between requests: greedy, s2.cpp's defaults, filters off
_SETTINGS = [Sampling(temperature=0.0), Sampling(), Sampling(temperature=1.3, top_p=1.0,
                                                               top_k=0),
             Sampling(temperature=0.5, top_p=0.3, top_k=5)]


def _rules(seeds):
    hp = tiny_hparams()
    return [FrameRule(hp, GenerationConfig(im_end_id=3, seed=s,
                                           code_sampling=_SETTINGS[s % len(_SETTINGS)]),
                      GenerationStats()) for s in seeds]


def test_a_batch_draws_each_requests_own_codes():
    rng = np.random.default_rng(0)
    seeds = list(range(8))
    together, alone = _rules(seeds), _rules(seeds)
    for step in range(6):  # several codebooks: the generators must stay in step
        logits = (rng.standard_normal((len(seeds), 64)) * (3.0 if step % 2 else 12.0)
                  ).astype(np.float32)
        logits[:, rng.integers(0, 64, 5)] = -np.inf
        got = draw_codes(together, logits)
        want = [rule.draw_code(row) for rule, row in zip(alone, logits)]
        assert got == want
    for a, b in zip(together, alone):  # the next draws of every generator agree too
        assert a._rng.random() == b._rng.random()


def test_a_bad_row_is_an_error_naming_the_fast_ar():
    rules = _rules([0, 1])
    logits = np.zeros((2, 16), np.float32)
    logits[1, 3] = np.nan
    with pytest.raises(FloatingPointError, match="Fast-AR's logits are NaN"):
        draw_codes(rules, logits)
    logits[1] = -np.inf
    with pytest.raises(FloatingPointError, match="all infinite"):
        draw_codes(rules, logits)
