"""The frame rule (SPEC 6): how one Slow-AR step's logits become one frame of codes, in
s2.cpp's order. `generate()`/`stream()` and the server's requests both run it, so a served
request gives generate()'s codes for the same seed and numbers.

Per frame, every draw from the synthesis's one generator comes in this order:
1. the main token from the step's logits, over the semantic ids and <|im_end|> (<|im_end|>
   masked before `min_tokens_before_end` frames) -- `sample_main`;
2. RAS: a semantic main token already among the last `ras_window` frames' is drawn again from
   the same logits at the RAS settings; then code 0 = main - semantic_begin_id, clamped into
   the codebook -- `begin_frame`;
3. codes 1..C-1, each drawn from the Fast-AR's logits after the codes before it --
   `draw_code`.
"""

from __future__ import annotations

import time
from typing import Sequence

import numpy as np

from s2core.generation.config import GenerationConfig, GenerationStats, Sampling
from s2core.contract.inputs import LogitRows, pick_logit_rows
from s2core.generation.sampling import candidates, candidates_rows, draw


class _MainSampler:
    """The main token: logits + the semantic/<|im_end|> mask, sampled with `s`.

    Only the allowed ids are handed to the sampler (sorted ascending, so ties break by id as
    over the whole masked vocab): the masked ones are -inf there and never survive. So only
    their logits are needed: `rows`, which the steps ask the model for (LogitRows)."""

    def __init__(self, hp, im_end_id: int):
        last = min(hp.semantic_end_id, hp.vocab_size - 1)
        semantic = np.arange(hp.semantic_begin_id, last + 1, dtype=np.int64)
        self.with_end = np.union1d(semantic, [im_end_id]).astype(np.int64)
        self.rows = LogitRows.of(self.with_end, hp.vocab_size)
        #: the semantic ids without <|im_end|>, as places among with_end's
        self.without_end_at = np.flatnonzero(self.with_end != im_end_id)

    def __call__(self, allowed: np.ndarray, block_end: bool, s: Sampling,
                 rng: np.random.Generator) -> int:
        """allowed: the logits of `with_end`'s ids, in that order."""
        ids, sub = self.with_end, np.asarray(allowed, dtype=np.float32)
        if block_end:
            ids, sub = ids[self.without_end_at], sub[self.without_end_at]
        if np.isnan(sub).any() or not np.isfinite(sub).any():
            raise FloatingPointError(f"the model's logits over the allowed ids are not usable "
                                     f"(NaN or all -inf): {sub[:8]}...")
        return int(ids[draw(candidates(sub, s.top_p, s.top_k), s.temperature, rng)])


def _finite(logits: np.ndarray) -> np.ndarray:
    """The Fast-AR's logits (B, codebook_size) as float32; an error if a row holds a NaN or
    no finite value."""
    x = np.asarray(logits, dtype=np.float32)
    if np.isnan(x).any() or not np.isfinite(x).any(axis=-1).all():
        raise FloatingPointError("the Fast-AR's logits are NaN or all infinite")
    return x


class FrameRule:
    """One synthesis's sampling state: its generator (seeded by config.seed), the RAS window,
    and the time spent sampling (main tokens: stats.sample_s; codes: stats.code_sample_s)."""

    def __init__(self, hp, config: GenerationConfig, stats: GenerationStats):
        self._hp = hp
        self._config = config
        self._stats = stats
        self._rng = np.random.default_rng(config.seed)
        config.check_for(hp.vocab_size)
        self._main_sampler = _MainSampler(hp, config.im_end_id)
        self._window: list[int] = []

    @property
    def logit_rows(self) -> LogitRows:
        """The token ids whose logits the main token is drawn from: what a step asks for."""
        return self._main_sampler.rows

    def allowed(self, result) -> np.ndarray:
        """A step's logits over `logit_rows`, from its Result (computed for those rows, or
        over the whole vocabulary): what sample_main and begin_frame take."""
        return pick_logit_rows(result.logits, result.logit_rows, self.logit_rows)

    def sample_main(self, logits: np.ndarray, frames: int, ras: bool = False) -> int:
        """Step 1 (or the RAS draw of step 2): the main token after `frames` frames, from
        the logits over `logit_rows` (`allowed`)."""
        t = time.perf_counter()
        c = self._config
        token = self._main_sampler(logits, frames < c.min_tokens_before_end,
                                   c.ras if ras else c.main, self._rng)
        self._stats.sample_s += time.perf_counter() - t
        return token

    def begin_frame(self, main: int, logits: np.ndarray, frames: int) -> tuple[int, list[int]]:
        """Step 2: RAS on `main` (drawn from `logits`), then code 0. Returns the frame's main
        token (the one the next step is fed) and its codes so far, [code 0]."""
        c, hp = self._config, self._hp
        if (c.ras_window and main in self._window
                and hp.semantic_begin_id <= main <= hp.semantic_end_id):
            main = self.sample_main(logits, frames, ras=True)
        if c.ras_window:
            self._window.append(main)
            del self._window[:-c.ras_window]
        return main, [min(max(main - hp.semantic_begin_id, 0), hp.codebook_size - 1)]

    def draw_code(self, fast_logits: np.ndarray) -> int:
        """Step 3: the next code from the Fast-AR's logits."""
        return draw_codes([self], np.asarray(fast_logits)[None])[0]


def draw_codes(rules: Sequence[FrameRule], fast_logits: np.ndarray) -> list[int]:
    """Step 3 of several syntheses at once: rules[b]'s next code from row b of the Fast-AR's
    logits (B, codebook_size), each the code rules[b].draw_code would draw from it (its own
    settings and generator); the rows' candidates are computed together
    (sampling.candidates_rows). Each synthesis's code_sample_s gets the call's time, as its
    fast_decode_s gets the batch's Fast-AR time."""
    t = time.perf_counter()
    logits = _finite(fast_logits)
    settings = [r._config.codes for r in rules]
    kept = candidates_rows(logits, [s.top_p for s in settings], [s.top_k for s in settings])
    codes = [int(draw(c, s.temperature, r._rng)) for c, s, r in zip(kept, settings, rules)]
    dt = time.perf_counter() - t
    for r in rules:
        r._stats.code_sample_s += dt
    return codes
