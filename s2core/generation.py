"""The Dual-AR generation loop of s2.cpp's generate() (SPEC section 5), on any backend.

prefill_fast(prompt); sample a main token among the semantic ids and <|im_end|>; until
<|im_end|> or max_new_tokens: code 0 = main - semantic_begin_id, codes 1..C-1 from the Fast-AR,
step() with the frame, sample again.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from .errors import InvalidInputError
from .model import SlowARModel

#: Qwen3's <|im_end|>, the end-of-turn token of S2 Pro's text vocabulary
QWEN_IM_END_ID = 151645


@dataclass(frozen=True)
class Sampling:
    """temperature 0 means greedy (argmax); top_k 0 and top_p 1 disable those filters."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0

    def sample(self, logits: np.ndarray, rng: np.random.Generator,
               allowed: np.ndarray | None = None) -> int:
        """One id from logits, only among `allowed` ids if given."""
        ids = np.arange(logits.shape[0]) if allowed is None else allowed
        vals = logits[ids].astype(np.float64)
        if self.temperature <= 0:
            return int(ids[int(np.argmax(vals))])
        vals = vals / self.temperature
        order = np.argsort(-vals, kind="stable")
        if self.top_k > 0:
            order = order[: self.top_k]
        probs = np.exp(vals[order] - vals[order[0]])
        probs /= probs.sum()
        if self.top_p < 1.0:
            keep = np.searchsorted(np.cumsum(probs), self.top_p) + 1  # smallest set reaching top_p
            order, probs = order[:keep], probs[:keep] / probs[:keep].sum()
        return int(ids[order[rng.choice(len(order), p=probs)]])


@dataclass(frozen=True)
class GenerationConfig:
    max_new_tokens: int = 1024
    im_end_id: int = QWEN_IM_END_ID
    #: <|im_end|> cannot be sampled before this many frames
    min_tokens_before_end: int = 0
    main: Sampling = field(default_factory=Sampling)
    codes: Sampling = field(default_factory=Sampling)
    #: a main token seen in the last `repetition_window` frames is resampled with this
    repetition_window: int = 10
    repetition_resample: Sampling = field(default_factory=lambda: Sampling(1.0, 0.9))
    seed: int = 0


@dataclass
class GenerationStats:
    """Wall time of each phase, in seconds (filled by generate() when passed)."""

    prefill_s: float = 0.0
    step_s: list[float] = field(default_factory=list)
    fast_decode_s: list[float] = field(default_factory=list)  # one entry per frame


def generate(model: SlowARModel, prompt: np.ndarray, config: GenerationConfig = GenerationConfig(),
             on_frame: Callable[[int, np.ndarray], None] | None = None,
             stats: GenerationStats | None = None) -> np.ndarray:
    """Codes (frames, num_codebooks) generated after `prompt` (n, num_codebooks + 1).

    Allocates the KV cache for prompt + max_new_tokens and frees it at the end, as s2.cpp's
    pipeline does for each synthesis. `on_frame(i, codes)` is called after each frame.
    """
    stats = GenerationStats() if stats is None else stats
    hp = model.hparams
    if not 0 <= config.im_end_id < hp.vocab_size:
        raise InvalidInputError("im_end_id", f"im_end_id {config.im_end_id} is outside the vocab "
                                f"[0, {hp.vocab_size})")
    if config.max_new_tokens <= 0:
        raise InvalidInputError("max_new_tokens", f"max_new_tokens must be positive, got "
                                f"{config.max_new_tokens}")
    rng = np.random.default_rng(config.seed)
    # Code 0 is main - semantic_begin_id, so only ids whose code fits the codebook can be chosen.
    last_semantic = min(hp.semantic_end_id, hp.semantic_begin_id + hp.codebook_size - 1)
    semantic_ids = np.arange(hp.semantic_begin_id, last_semantic + 1)
    semantic_ids = semantic_ids[semantic_ids != config.im_end_id]
    with_end = np.append(semantic_ids, config.im_end_id)

    def next_main(logits: np.ndarray, n_frames: int, recent: list[int]) -> int:
        allowed = with_end if n_frames >= config.min_tokens_before_end else semantic_ids
        token = config.main.sample(logits, rng, allowed)
        if token in recent[-config.repetition_window:]:
            token = config.repetition_resample.sample(logits, rng, allowed)
        return token

    frames: list[np.ndarray] = []
    mains: list[int] = []
    model.init_kv_cache(len(prompt) + config.max_new_tokens)
    try:
        t = time.perf_counter()
        result = model.prefill_fast(prompt)
        main = next_main(result.logits, 0, mains)
        stats.prefill_s = time.perf_counter() - t
        while main != config.im_end_id and len(frames) < config.max_new_tokens:
            t = time.perf_counter()
            codes = [main - hp.semantic_begin_id]
            for _ in range(1, hp.num_codebooks):
                logits = model.fast_decode(result.hidden, codes)
                codes.append(config.codes.sample(logits, rng))
            stats.fast_decode_s.append(time.perf_counter() - t)
            frame = np.asarray(codes, dtype=np.int64)
            frames.append(frame)
            mains.append(main)
            if on_frame:
                on_frame(len(frames) - 1, frame)
            if len(frames) == config.max_new_tokens:
                break
            t = time.perf_counter()
            result = model.step(np.concatenate([[main], frame]))
            main = next_main(result.logits, len(frames), mains)
            stats.step_s.append(time.perf_counter() - t)
    finally:
        model.clear_kv_cache()
    return np.stack(frames) if frames else np.zeros((0, hp.num_codebooks), dtype=np.int64)
