"""The generation loop and its sampler."""

from __future__ import annotations

import numpy as np
import pytest

import s2core
from s2core.errors import InvalidInputError
from s2core.generation import GenerationConfig, GenerationStats, Sampling, generate
from s2core.testing.prompts import mixed_prompt
from s2core.embedded.writer import tiny_hparams


def test_greedy_is_argmax_within_allowed_ids():
    logits = np.array([0.0, 5.0, 1.0, 3.0, -2.0])
    rng = np.random.default_rng(0)
    assert Sampling().sample(logits, rng) == 1
    assert Sampling().sample(logits, rng, allowed=np.array([2, 3, 4])) == 3


def test_top_k_1_and_tiny_top_p_are_greedy_and_sampling_stays_in_allowed():
    rng = np.random.default_rng(0)
    logits = rng.standard_normal(50)
    best = int(np.argmax(logits))
    assert all(Sampling(1.0, top_k=1).sample(logits, rng) == best for _ in range(20))
    assert all(Sampling(1.0, top_p=1e-6).sample(logits, rng) == best for _ in range(20))
    allowed = np.array([3, 7, 11])
    seen = {Sampling(2.0).sample(logits, rng, allowed) for _ in range(200)}
    assert seen <= set(allowed.tolist()) and len(seen) == 3


def test_temperature_sampling_follows_the_softmax():
    rng = np.random.default_rng(1)
    logits = np.log(np.array([0.7, 0.2, 0.1]))
    draws = np.array([Sampling(1.0).sample(logits, rng) for _ in range(4000)])
    freq = np.bincount(draws, minlength=3) / len(draws)
    np.testing.assert_allclose(freq, [0.7, 0.2, 0.1], atol=0.03)


def test_generate_produces_valid_frames_and_frees_the_cache(tiny_model):
    hp = tiny_hparams()
    m = s2core.load(tiny_model, backend="numpy")
    prompt = mixed_prompt(hp, 20, np.random.default_rng(0))
    stats = GenerationStats()
    seen = []
    config = GenerationConfig(max_new_tokens=6, im_end_id=199, min_tokens_before_end=6)
    codes = generate(m, prompt, config, on_frame=lambda i, c: seen.append(i), stats=stats)
    assert codes.shape == (6, hp.num_codebooks)
    assert ((codes >= 0) & (codes < hp.codebook_size)).all()
    assert seen == list(range(6)) and len(stats.step_s) == 5 and len(stats.fast_decode_s) == 6
    assert m.max_seq_len is None  # cleared at the end of the synthesis
    again = generate(m, prompt, config)
    np.testing.assert_array_equal(codes, again)  # greedy is deterministic


def test_generate_stops_at_im_end_and_min_tokens_blocks_it(tiny_model):
    hp = tiny_hparams()
    m = s2core.load(tiny_model, backend="numpy")
    prompt = mixed_prompt(hp, 20, np.random.default_rng(0))
    m.init_kv_cache(32)
    logits = m.prefill_fast(prompt).logits
    # Declare the id greedy picks first to be <|im_end|>: the loop must stop at once...
    first = int(hp.semantic_begin_id + np.argmax(logits[hp.semantic_begin_id:hp.semantic_end_id + 1]))
    codes = generate(m, prompt, GenerationConfig(max_new_tokens=5, im_end_id=first))
    assert codes.shape == (0, hp.num_codebooks)
    # ...unless min_tokens_before_end forbids ending yet.
    codes = generate(m, prompt, GenerationConfig(max_new_tokens=3, im_end_id=first,
                                                 min_tokens_before_end=3))
    assert codes.shape == (3, hp.num_codebooks)
    assert codes[0, 0] != first - hp.semantic_begin_id


def test_generate_rejects_bad_config(tiny_model):
    m = s2core.load(tiny_model, backend="numpy")
    prompt = mixed_prompt(tiny_hparams(), 4, np.random.default_rng(0))
    with pytest.raises(InvalidInputError, match="im_end_id"):
        generate(m, prompt, GenerationConfig(im_end_id=500))
    with pytest.raises(InvalidInputError, match="max_new_tokens"):
        generate(m, prompt, GenerationConfig(max_new_tokens=0, im_end_id=199))
