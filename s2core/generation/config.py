"""The settings of one synthesis (GenerationConfig, with s2.cpp's defaults) and what it did
(GenerationStats)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


from s2core.contract.inputs import is_integer
from s2core.errors import InvalidInputError
from s2core.generation.sampling import DEFAULT_TEMPERATURE, DEFAULT_TOP_K, DEFAULT_TOP_P, check_sampling

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
    if not is_integer(value):
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

    def check_for(self, vocab_size: int) -> None:
        """What only the model can tell: im_end_id is one of its tokens."""
        if self.im_end_id >= vocab_size:
            raise InvalidInputError("im_end_id", f"im_end_id {self.im_end_id} is outside the "
                                    f"vocab [0, {vocab_size})")

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
    #: one entry per frame: its Fast-AR calls and the draws of their codes
    fast_decode_s: list[float] = field(default_factory=list)
    #: drawing main tokens (the Slow-AR's logits)
    sample_s: float = 0.0
    #: drawing codes 1..C-1 from the Fast-AR's logits (a part of fast_decode_s)
    code_sample_s: float = 0.0
    frames: int = 0
    total_s: float = 0.0
    stopped_by: str = ""  # "im_end", "max_new_tokens", "closed" (the caller stopped early)
