"""The frame rule exists once (s2core/generation/frame.py): generate() and the server's requests
run it, so the same seeds give the same codes through both, on every registered backend.

Sampled, not greedy: the main tokens, the RAS redraws and the code draws all come from the
seeded generator, so a served request that drew in another order, or skipped a draw, would
give other codes. The server runs its requests together (its batched calls) and one at a time
(max_sequences=1: the same calls as generate() bar the batching), against generate() alone.
"""

from __future__ import annotations

import numpy as np
import pytest

import s2core
from s2core.generation import GenerationConfig, generate
from s2core.kit.models import CONFIGS, kit_model
from s2core.kit.prompts import mixed_prompt
from s2core.serving import Server

CONFIG = "gqa4"
IM_END = 199  # in the kit model's vocab, outside its semantic range
SEEDS = (0, 1, 2, 3)


def sampled(seed: int) -> GenerationConfig:
    # a narrow RAS window at a high temperature: redraws happen within a few frames
    return GenerationConfig(max_new_tokens=8, im_end_id=IM_END, seed=seed, temperature=1.0,
                            top_p=0.95, top_k=20, ras_window=3, ras_temperature=1.0,
                            ras_top_p=0.9)


def prompts() -> list[np.ndarray]:
    rng = np.random.default_rng(21)
    return [mixed_prompt(CONFIGS[CONFIG], n, rng) for n in (14, 9, 21, 6)]


@pytest.fixture(scope="module")
def model(backend):
    m = s2core.load(kit_model(CONFIG, "f32"), backend=backend)
    yield m
    m.close()


@pytest.fixture(scope="module")
def alone(model) -> list[np.ndarray]:
    return [generate(model, p, sampled(seed)) for p, seed in zip(prompts(), SEEDS)]


def test_the_seeds_draw_more_than_greedy_would(model, alone):
    """The check has teeth: a different seed gives different codes for the same prompt."""
    other = generate(model, prompts()[0], sampled(SEEDS[0] + 100))
    assert alone[0].shape[0] == model.hparams.num_codebooks
    assert not np.array_equal(other, alone[0])


@pytest.mark.parametrize("max_sequences", [None, 1], ids=["together", "one_at_a_time"])
def test_server_gives_generates_codes_for_the_same_seeds(model, alone, max_sequences):
    cap = model.capabilities.max_batch_sequences
    with Server(model, max_sequences=None if max_sequences is None else min(max_sequences, cap)
                ) as server:
        requests = [server.submit(p, sampled(seed)) for p, seed in zip(prompts(), SEEDS)]
        served = [r.codes() for r in requests]
    for i, (got, want) in enumerate(zip(served, alone)):
        assert got.shape == want.shape and np.array_equal(got, want), (
            f"request {i} (seed {SEEDS[i]}): served codes {got.shape} differ from generate()'s "
            f"{want.shape}")
