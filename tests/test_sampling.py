"""The sampler against a direct transcription of SPEC 6 (s2.cpp's sample_token)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from s2core.errors import InvalidInputError
from s2core.generation.loop import sample_token
from s2core.generation.sampling import candidates, check_logits


def spec6_reference(logits, top_k: int, top_p: float, temperature: float):
    """SPEC 6 written out as s2.cpp's loop, one float32 scalar at a time, over the whole
    vocabulary (masked -inf ids included). Returns (kept ids, final probabilities)."""
    f32 = np.float32
    x = [f32(v) for v in logits]
    items = sorted(range(len(x)), key=lambda i: (-x[i], i))  # descending; ties by id
    top = x[items[0]]
    e = [f32(np.exp(f32(x[i] - top))) for i in items]
    total = f32(0)
    for value in e:
        total = f32(total + value)
    probs = [f32(value / total) for value in e]
    k = len(items) if top_k <= 0 else min(top_k, len(items))
    p = f32(min(max(top_p, 0.0), 1.0))
    kept, cumsum = [], f32(0)
    for i, item in enumerate(items):
        cumsum = f32(cumsum + probs[i])
        if i >= k or (i > 0 and cumsum > p):
            continue
        kept.append(item)
    if not kept:
        kept = [items[0]]
    if temperature <= 0:
        return kept, [1.0] + [0.0] * (len(kept) - 1)
    z = [math.exp((float(x[i]) - float(x[kept[0]])) / temperature) for i in kept]
    s = sum(z)
    return kept, [v / s for v in z]


def random_logits(rng: np.random.Generator) -> np.ndarray:
    n = int(rng.choice([2, 5, 17, 64, 300, 1025]))
    logits = rng.normal(0, rng.choice([0.3, 1.0, 3.0, 8.0]), n).astype(np.float32)
    if rng.random() < 0.3:  # ties
        logits[rng.integers(0, n, n // 3)] = logits[0]
    if rng.random() < 0.4:  # a mask, as the generation loop applies
        masked = rng.random(n) < 0.6
        masked[rng.integers(0, n)] = False
        logits[masked] = -np.inf
    return logits


def test_candidates_and_probabilities_match_spec6_on_random_logits():
    rng = np.random.default_rng(2024)
    n_cases, n_top_p_cut = 2000, 0
    for _ in range(n_cases):
        logits = random_logits(rng)
        top_k = int(rng.choice([0, -3, 1, 2, 5, 30, 10_000]))
        top_p = float(rng.choice([0.0, 0.1, 0.5, 0.8, 0.9, 0.95, 1.0, 1.7, -0.2]))
        temperature = float(rng.choice([0.0, -1.0, 0.3, 0.8, 1.0, 2.5]))
        ref_ids, ref_probs = spec6_reference(logits, top_k, top_p, temperature)
        # Masked (-inf) ids may stay in s2.cpp's kept list (they add 0 to the running sum)
        # but get probability 0; the implementation drops them up front.
        finite = [np.isfinite(logits[i]) for i in ref_ids]
        assert all(p == 0 for p, f in zip(ref_probs, finite) if not f)
        ref_ids = [i for i, f in zip(ref_ids, finite) if f]
        ref_probs = [p for p, f in zip(ref_probs, finite) if f]
        c = candidates(check_logits(logits), top_p, top_k)
        assert c.ids.tolist() == ref_ids, (logits, top_k, top_p)
        np.testing.assert_allclose(c.probabilities(temperature), ref_probs, rtol=2e-5, atol=1e-7)
        n_top_p_cut += len(ref_ids) < min(top_k if top_k > 0 else len(logits),
                                          int(np.isfinite(logits).sum()))
    assert n_top_p_cut > 300  # the top-p rule was exercised, not only top-k


def test_the_item_crossing_top_p_is_dropped_and_the_first_always_kept():
    logits = np.log(np.array([0.5, 0.3, 0.2], np.float32))
    # cumsum 0.5, 0.8, 1.0: with top_p 0.7 the second item crosses and is dropped
    assert candidates(logits, 0.7, 0).ids.tolist() == [0]
    assert candidates(logits, 0.85, 0).ids.tolist() == [0, 1]
    assert candidates(logits, 0.0, 0).ids.tolist() == [0]  # top_p 0 still keeps the first
    assert candidates(logits, 1.0, 2).ids.tolist() == [0, 1]
    # top-p reads the temperature-1 softmax: a high temperature does not widen the set
    rng = np.random.default_rng(0)
    draws = {sample_token(logits, temperature=50.0, top_p=0.7, top_k=0, rng=rng)
             for _ in range(200)}
    assert draws == {0}


def test_sampled_frequencies_follow_the_kept_distribution():
    rng = np.random.default_rng(7)
    logits = np.array([2.0, 1.5, 1.4, 0.3, -0.5, -np.inf, 0.9, -3.0], np.float32)
    n = 20_000
    for temperature, top_p, top_k in [(1.0, 1.0, 0), (0.8, 0.8, 30), (1.7, 0.95, 4),
                                      (0.5, 0.9, 0)]:
        ids, probs = spec6_reference(logits, top_k, top_p, temperature)
        ids, probs = zip(*[(i, p) for i, p in zip(ids, probs) if p > 0])  # masked: never drawn
        ids = list(ids)
        draws = np.array([sample_token(logits, temperature=temperature, top_p=top_p,
                                       top_k=top_k, rng=rng) for _ in range(n)])
        counts = np.bincount(draws, minlength=len(logits))
        assert counts[[i for i in range(len(logits)) if i not in ids]].sum() == 0
        expected = np.array(probs) * n
        chi2 = float((((counts[ids] - expected) ** 2) / expected).sum())
        dof = len(ids) - 1
        # chi-square with dof degrees of freedom: mean dof, sd sqrt(2 dof); 6 sd is p < 1e-6
        assert chi2 < dof + 6 * math.sqrt(2 * max(dof, 1)), (temperature, top_p, top_k, chi2)


def test_greedy_and_seeded_reproducibility():
    rng = np.random.default_rng(1)
    logits = rng.standard_normal(500).astype(np.float32)
    best = int(np.argmax(logits))
    for t in (0.0, -0.5):
        assert sample_token(logits, temperature=t, top_p=0.8, top_k=30, rng=rng) == best
    assert sample_token(logits, temperature=1.0, top_p=1.0, top_k=1, rng=rng) == best
    a = [sample_token(logits, rng=np.random.default_rng(5)) for _ in range(3)]
    b = [sample_token(logits, rng=np.random.default_rng(5)) for _ in range(3)]
    assert a == b


@pytest.mark.parametrize("kwargs,check", [
    (dict(logits=[1.0, float("nan")]), "logits_finite"),
    (dict(logits=[1.0, float("inf")]), "logits_finite"),
    (dict(logits=[-np.inf, -np.inf]), "logits_finite"),
    (dict(logits=[]), "logits"),
    (dict(logits=[[1.0, 2.0]]), "logits"),
    (dict(temperature=float("nan")), "temperature"),
    (dict(temperature=float("inf")), "temperature"),
    (dict(top_p=float("nan")), "top_p"),
    (dict(top_p="0.5"), "top_p"),
    (dict(top_k=2.5), "top_k"),
    (dict(top_k=True), "top_k"),
    (dict(rng=np.random.RandomState(0)), "rng"),
    (dict(rng=None), "rng"),
])
def test_bad_arguments_are_named(kwargs, check):
    args = dict(logits=[0.1, 0.2, 0.3], temperature=0.8, top_p=0.8, top_k=30,
                rng=np.random.default_rng(0))
    args.update(kwargs)
    logits = args.pop("logits")
    with pytest.raises(InvalidInputError) as info:
        sample_token(logits, **args)
    assert info.value.check == check
