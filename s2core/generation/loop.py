"""The Dual-AR generation loop of s2.cpp's generate() (SPEC 6), on any backend, as a stream.

    for frame in stream(model, prompt, GenerationConfig(seed=0)):   # frame: (num_codebooks,)
        ...
    codes = generate(model, prompt, config)                          # (num_codebooks, frames)

prefill_fast(prompt) (or: restore a voice prefix, then prefill_fast the rest); sample the main
token among the semantic ids and <|im_end|>; until <|im_end|> or max_new_tokens: the
repetition check (RAS), code 0 = main - semantic_begin_id (clamped), codes 1..C-1 from the
Fast-AR, emit the frame, step() with it, sample again.

Codes come out codebook-major, [num_codebooks, frames]: the layout of SPEC 6, s2.cpp's
result, fish-speech's codes.npy and .s2voice files, and `reference_codes` in s2core.prompt.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Callable, Iterator

import numpy as np

from s2core.contract import inputs
from s2core.errors import CacheOverflowError, InvalidInputError, PrefixMismatchError
from s2core.runtime.model import SlowARModel
from s2core.generation.config import (QWEN_IM_END_ID, GenerationConfig, GenerationStats,
                                      Sampling)
from s2core.generation.frame import FrameRule
from s2core.generation.sampling import sample_token

if TYPE_CHECKING:
    from s2core.runtime.prefix import KVPrefix

__all__ = ["GenerationConfig", "GenerationStats", "Sampling", "generate", "sample_token",
           "stream", "QWEN_IM_END_ID"]


def check_prompt(model: SlowARModel, prompt: Any, config: GenerationConfig,
                 prefix: "KVPrefix | None") -> np.ndarray:
    """Every check of a synthesis, before the model is touched: config, prompt, prefix,
    capacity. Returns the prompt as an (n, C+1) int64 matrix."""
    if not isinstance(model, SlowARModel):
        raise InvalidInputError("model", f"model must be an s2core model (s2core.load), got "
                                f"{type(model).__name__}")
    model._guard.check("generate()")  # open, and not held by another thread's stream
    if not isinstance(config, GenerationConfig):
        raise InvalidInputError("config", f"config must be a GenerationConfig, got "
                                f"{type(config).__name__}")
    hp = model.hparams
    if hp.fast is None:
        raise InvalidInputError("fast_ar", f"{model.model_file.path} has no Fast-AR: it cannot "
                                "generate codes")
    if prompt is None:
        raise InvalidInputError("prompt", "prompt is None; pass token rows (n, num_codebooks + "
                                "1), e.g. from s2core.prompt.build_prompt")
    config.check_for(hp.vocab_size)
    mat = inputs.token_matrix(prompt, None, hp)
    capacity = len(mat) + config.max_new_tokens
    if capacity > hp.context_length:
        raise CacheOverflowError("context_length", f"prompt ({len(mat)} positions) + "
                                 f"max_new_tokens ({config.max_new_tokens}) = {capacity} exceeds "
                                 f"the model's context_length {hp.context_length}")
    if prefix is not None:
        n = getattr(prefix, "n_positions", 0)
        if n >= len(mat):
            raise PrefixMismatchError("prefix_length", f"the prefix holds {n} positions but the "
                                    f"prompt only {len(mat)}: nothing is left to prefill")
        model.check_prefix(prefix, capacity)
        if not np.array_equal(inputs.canonical_rows(mat[:n], hp), prefix.tokens):
            t = int(np.flatnonzero((inputs.canonical_rows(mat[:n], hp)
                                    != prefix.tokens).any(axis=1))[0])
            raise PrefixMismatchError("prefix_tokens", f"the prompt's first {n} positions differ "
                                    f"from the prefix's token rows (first at position {t}): "
                                    "the prefix was made for another voice or prompt")
    return mat


def stream(model: SlowARModel, prompt: Any, config: GenerationConfig | None = None,
           prefix: "KVPrefix | None" = None, stats: GenerationStats | None = None
           ) -> Iterator[np.ndarray]:
    """Yield each frame's codes (num_codebooks,) int64 as soon as they exist.

    `prompt`: the whole prompt (n, num_codebooks + 1). `prefix`: a KVPrefix whose token rows
    are the prompt's first positions; its K/V are restored instead of prefilled. The KV cache
    is allocated for prompt + max_new_tokens and freed when the stream ends, however it ends
    (exhausted, `break`/close(), an exception, KeyboardInterrupt): the model stays usable.

    Every check runs when the stream is created, before the model is touched.
    """
    config = GenerationConfig() if config is None else config
    mat = check_prompt(model, prompt, config, prefix)
    return _frames(model, mat, config, prefix, GenerationStats() if stats is None else stats)


def _frames(model: SlowARModel, prompt: np.ndarray, config: GenerationConfig,
            prefix: "KVPrefix | None", stats: GenerationStats) -> Iterator[np.ndarray]:
    hp = model.hparams
    rule = FrameRule(hp, config, stats)
    stats.prompt_positions = len(prompt)
    t_start = time.perf_counter()

    # The stream holds the model from its first frame to its end, across its yields:
    # another thread's call in between raises ModelBusyError (s2core/runtime/guard.py).
    with model._guard.lease("a stream") as lease:
        model.init_kv_cache(len(prompt) + config.max_new_tokens)
        try:
            rest = prompt
            if prefix is not None:
                t = time.perf_counter()
                stats.prefix_recomputed = not model.restore_prefix(prefix)
                stats.restore_s = time.perf_counter() - t
                stats.restored_positions = prefix.n_positions
                rest = prompt[prefix.n_positions:]
            t = time.perf_counter()
            result = model.prefill_fast(rest, logit_rows=rule.logit_rows)
            logits = rule.allowed(result)
            stats.prefill_s = time.perf_counter() - t
            stats.prefilled_positions = len(rest)
            main = rule.sample_main(logits, 0)
            frames = 0
            stats.stopped_by = "closed"
            while main != config.im_end_id and frames < config.max_new_tokens:
                main, codes = rule.begin_frame(main, logits, frames)
                t = time.perf_counter()
                for _ in range(1, hp.num_codebooks):
                    codes.append(rule.draw_code(model.fast_decode(result.hidden_native, codes)))
                stats.fast_decode_s.append(time.perf_counter() - t)
                frame = np.asarray(codes, dtype=np.int64)
                frames += 1
                stats.frames = frames
                if stats.first_frame_s is None:
                    stats.first_frame_s = time.perf_counter() - t_start
                yield frame
                lease.claim()  # the caller may resume the stream from another thread
                if frames == config.max_new_tokens:
                    break  # s2.cpp steps once more and discards the result: nothing to gain
                t = time.perf_counter()
                result = model.step(np.concatenate([[main], frame]), rule.logit_rows)
                logits = rule.allowed(result)
                stats.step_s.append(time.perf_counter() - t)
                main = rule.sample_main(logits, frames)
            stats.stopped_by = "im_end" if main == config.im_end_id else "max_new_tokens"
        finally:
            lease.claim()  # closed or collected, maybe from another thread
            model.clear_kv_cache()
            stats.total_s = time.perf_counter() - t_start


def generate(model: SlowARModel, prompt: Any, config: GenerationConfig | None = None,
             prefix: "KVPrefix | None" = None,
             on_frame: Callable[[int, np.ndarray], Any] | None = None,
             stats: GenerationStats | None = None) -> np.ndarray:
    """Codes [num_codebooks, frames] int64 generated after `prompt` (see `stream`).

    `on_frame(i, codes)` is called after each frame; returning False stops the synthesis
    there (as s2.cpp's frame callback)."""
    hp_codebooks = model.hparams.num_codebooks if isinstance(model, SlowARModel) else 0
    frames = []
    it = stream(model, prompt, config, prefix, stats)
    try:
        for frame in it:
            frames.append(frame)
            if on_frame is not None and on_frame(len(frames) - 1, frame) is False:
                break
    finally:
        it.close()
    if not frames:
        return np.zeros((hp_codebooks, 0), dtype=np.int64)
    return np.stack(frames, axis=1)


#: codec frames per second of audio (S2 Pro's codec: 44.1 kHz, 2048 samples a frame)
FRAME_RATE = 44100 / 2048


def audio_seconds(frames: int) -> float:
    """Seconds of audio that `frames` codec frames decode to."""
    return frames / FRAME_RATE
