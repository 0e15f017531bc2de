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
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterator

import numpy as np

from s2core.contract import inputs
from s2core.errors import CacheOverflowError, InvalidInputError, PrefixMismatchError
from s2core.runtime.model import SlowARModel
from s2core.generation.sampling import (DEFAULT_TEMPERATURE, DEFAULT_TOP_K, DEFAULT_TOP_P, candidates,
                       check_sampling, draw, sample_token)

if TYPE_CHECKING:
    from s2core.runtime.prefix import KVPrefix

__all__ = ["GenerationConfig", "GenerationStats", "Sampling", "generate", "sample_token",
           "stream", "QWEN_IM_END_ID"]

#: Qwen3's <|im_end|>, the end-of-turn token of S2 Pro's text vocabulary
QWEN_IM_END_ID = 151645
#: s2.cpp's repetition-aware sampling: window, and the settings of the resample
RAS_WINDOW = 10
RAS_TEMPERATURE = 1.0
RAS_TOP_P = 0.9


@dataclass(frozen=True)
class Sampling:
    """temperature <= 0 is greedy; top_k <= 0 and top_p >= 1 turn those filters off."""

    temperature: float = DEFAULT_TEMPERATURE
    top_p: float = DEFAULT_TOP_P
    top_k: int = DEFAULT_TOP_K

    def __post_init__(self):
        check_sampling(self.temperature, self.top_p, self.top_k)


#: the largest count or id a setting may hold (positions, frames, ids: far below it)
MAX_SETTING = 2**31 - 1


def _check_int(name: str, value: Any, minimum: int, maximum: int = MAX_SETTING) -> int:
    """`value` as a Python int in [minimum, maximum] (a NumPy integer is converted first, so
    nothing computed from it later wraps)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise InvalidInputError(name, f"{name} must be an integer, got {value!r}")
    value = int(value)
    if not minimum <= value <= maximum:
        raise InvalidInputError(name, f"{name} must be in [{minimum}, {maximum}], got {value}")
    return value


@dataclass(frozen=True)
class GenerationConfig:
    """Settings of one synthesis. The defaults are s2.cpp's (GenerateParams); every value is
    checked here, so a bad config fails before any model is touched."""

    max_new_tokens: int = 1024
    temperature: float = DEFAULT_TEMPERATURE
    top_p: float = DEFAULT_TOP_P
    top_k: int = DEFAULT_TOP_K
    #: <|im_end|> cannot be sampled before this many frames
    min_tokens_before_end: int = 0
    #: the end-of-turn id; s2core.speak takes it from the tokenizer
    im_end_id: int = QWEN_IM_END_ID
    #: None: fresh randomness each run (s2.cpp seeds from the OS); an int >= 0: reproducible
    seed: int | None = None
    #: how codes 1..C-1 are sampled; None: the settings above (s2.cpp)
    code_sampling: Sampling | None = None
    #: repetition-aware sampling: a semantic main token seen among the last `ras_window`
    #: frames is resampled at ras_temperature / ras_top_p and the top_k above; 0 turns it off
    ras_window: int = RAS_WINDOW
    ras_temperature: float = RAS_TEMPERATURE
    ras_top_p: float = RAS_TOP_P

    def __post_init__(self):
        # stored back as Python ints: a NumPy uint64 would wrap in prompt + max_new_tokens
        for name in ("max_new_tokens", "min_tokens_before_end", "im_end_id", "ras_window"):
            object.__setattr__(self, name, _check_int(name, getattr(self, name),
                                                      1 if name == "max_new_tokens" else 0))
        if self.seed is not None:
            object.__setattr__(self, "seed", _check_int("seed", self.seed, 0, 2**64 - 1))
        check_sampling(self.temperature, self.top_p, self.top_k)
        check_sampling(self.ras_temperature, self.ras_top_p, self.top_k, "ras")
        object.__setattr__(self, "top_k", int(self.top_k))  # a Python int: nothing wraps
        if self.code_sampling is not None and not isinstance(self.code_sampling, Sampling):
            raise InvalidInputError("code_sampling", f"code_sampling must be a Sampling or None, "
                                    f"got {type(self.code_sampling).__name__}")

    @property
    def main(self) -> Sampling:
        return Sampling(self.temperature, self.top_p, self.top_k)

    @property
    def codes(self) -> Sampling:
        return self.code_sampling or self.main

    @property
    def ras(self) -> Sampling:
        return Sampling(self.ras_temperature, self.ras_top_p, self.top_k)


@dataclass
class GenerationStats:
    """What one synthesis did and how long each phase took (seconds); filled while it runs."""

    prompt_positions: int = 0
    #: positions whose K/V came from a restored prefix (0 without one)
    restored_positions: int = 0
    #: positions run through the Slow-AR for the prompt (prompt_positions - restored_positions)
    prefilled_positions: int = 0
    #: True when the prefix was recomputed from its token rows (a backend that cannot write
    #: its cache), not written
    prefix_recomputed: bool = False
    #: True when the prefix's K/V were not copied for this synthesis: a server's slot
    #: referenced the voice's K/V, held once by the backend (Capabilities.shares_kv_prefix)
    prefix_shared: bool = False
    restore_s: float = 0.0
    prefill_s: float = 0.0
    #: from the call to the first frame's codes (prompt, first sample, first Fast-AR codes)
    first_frame_s: float | None = None
    step_s: list[float] = field(default_factory=list)
    fast_decode_s: list[float] = field(default_factory=list)  # one entry per frame
    sample_s: float = 0.0
    frames: int = 0
    total_s: float = 0.0
    stopped_by: str = ""  # "im_end", "max_new_tokens", "closed" (the caller stopped early)


class _MainSampler:
    """The main token: logits + the semantic/<|im_end|> mask, sampled with `s`.

    Only the allowed ids are handed to the sampler (sorted ascending, so ties break by id as
    over the whole masked vocab): the masked ones are -inf there and never survive."""

    def __init__(self, hp, im_end_id: int):
        last = min(hp.semantic_end_id, hp.vocab_size - 1)
        semantic = np.arange(hp.semantic_begin_id, last + 1, dtype=np.int64)
        self.im_end_id = im_end_id
        self.without_end = semantic[semantic != im_end_id]
        self.with_end = np.union1d(semantic, [im_end_id]).astype(np.int64)

    def __call__(self, logits: np.ndarray, block_end: bool, s: Sampling,
                 rng: np.random.Generator) -> int:
        ids = self.without_end if block_end else self.with_end
        sub = np.asarray(logits[ids], dtype=np.float32)
        if np.isnan(sub).any() or not np.isfinite(sub).any():
            raise FloatingPointError(f"the model's logits over the allowed ids are not usable "
                                     f"(NaN or all -inf): {sub[:8]}...")
        return int(ids[draw(candidates(sub, s.top_p, s.top_k), s.temperature, rng)])


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
    if config.im_end_id >= hp.vocab_size:
        raise InvalidInputError("im_end_id", f"im_end_id {config.im_end_id} is outside the "
                                f"vocab [0, {hp.vocab_size})")
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
    rng = np.random.default_rng(config.seed)
    main_sampler = _MainSampler(hp, config.im_end_id)
    main_s, code_s, ras_s = config.main, config.codes, config.ras
    window: list[int] = []
    stats.prompt_positions = len(prompt)
    t_start = time.perf_counter()

    def sample_main(logits: np.ndarray, frames: int) -> int:
        t = time.perf_counter()
        block_end = frames < config.min_tokens_before_end
        token = main_sampler(logits, block_end, main_s, rng)
        stats.sample_s += time.perf_counter() - t
        return token

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
            result = model.prefill_fast(rest)
            logits = result.logits
            stats.prefill_s = time.perf_counter() - t
            stats.prefilled_positions = len(rest)
            main = sample_main(logits, 0)
            frames = 0
            stats.stopped_by = "closed"
            while main != config.im_end_id and frames < config.max_new_tokens:
                # RAS: a semantic token already in the window is resampled (s2.cpp's check order).
                if (config.ras_window and main in window
                        and hp.semantic_begin_id <= main <= hp.semantic_end_id):
                    t = time.perf_counter()
                    main = main_sampler(logits, frames < config.min_tokens_before_end, ras_s, rng)
                    stats.sample_s += time.perf_counter() - t
                if config.ras_window:
                    window.append(main)
                    del window[:-config.ras_window]
                t = time.perf_counter()
                codes = [min(max(main - hp.semantic_begin_id, 0), hp.codebook_size - 1)]
                for _ in range(1, hp.num_codebooks):
                    fast_logits = model.fast_decode(result.hidden_native, codes)
                    codes.append(int(draw(candidates(_finite(fast_logits), code_s.top_p,
                                                     code_s.top_k), code_s.temperature, rng)))
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
                result = model.step(np.concatenate([[main], frame]))
                logits = result.logits
                stats.step_s.append(time.perf_counter() - t)
                main = sample_main(logits, frames)
            stats.stopped_by = "im_end" if main == config.im_end_id else "max_new_tokens"
        finally:
            lease.claim()  # closed or collected, maybe from another thread
            model.clear_kv_cache()
            stats.total_s = time.perf_counter() - t_start


def _finite(logits: np.ndarray) -> np.ndarray:
    x = np.asarray(logits, dtype=np.float32)
    if np.isnan(x).any() or not np.isfinite(x).any():
        raise FloatingPointError("the Fast-AR's logits are NaN or all infinite")
    return x


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
