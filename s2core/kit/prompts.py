"""Prompts for tests, the demo and the benchmarks: text and semantic positions mixed."""

from __future__ import annotations

import numpy as np

from s2core.modelfile.hparams import Hparams


def text_ids(hp: Hparams, n: int, rng: np.random.Generator) -> np.ndarray:
    """n ids outside the semantic range (text tokens)."""
    n_text_ids = hp.vocab_size - (hp.semantic_end_id - hp.semantic_begin_id + 1)
    ids = rng.integers(0, n_text_ids, n)
    return np.where(ids >= hp.semantic_begin_id, ids + (hp.semantic_end_id - hp.semantic_begin_id + 1), ids)


def semantic_frame(hp: Hparams, rng: np.random.Generator) -> np.ndarray:
    """One generation frame: a semantic id and valid codes (code 0 = id - semantic_begin_id
    when that fits the codebook, as the generation loop makes it)."""
    sem = int(rng.integers(hp.semantic_begin_id, hp.semantic_end_id + 1))
    codes = rng.integers(0, hp.codebook_size, hp.num_codebooks)
    codes[0] = (sem - hp.semantic_begin_id) % hp.codebook_size
    return np.concatenate([[sem], codes]).astype(np.int64)


def mixed_prompt(hp: Hparams, n_tokens: int, rng: np.random.Generator,
                 semantic_fraction: float = 0.5) -> np.ndarray:
    """(n_tokens, C+1): a text prefix, then alternating runs of semantic and text positions.

    Code slots of text positions hold arbitrary integers, even out-of-range ones: they must be
    ignored (SPEC 2.3), and filling them with junk makes a test notice if they are not."""
    out = np.empty((n_tokens, hp.row_width), dtype=np.int64)
    is_sem = rng.random(n_tokens) < semantic_fraction
    is_sem[: max(1, n_tokens // 8)] = False  # prompts open with text
    for t in range(n_tokens):
        if is_sem[t]:
            out[t] = semantic_frame(hp, rng)
        else:
            out[t, 0] = text_ids(hp, 1, rng)[0]
            out[t, 1:] = rng.integers(-1000, 10**6, hp.num_codebooks)
    return out
