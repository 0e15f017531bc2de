"""One request's decoding, step by step: the loop of s2core.generation's stream, cut at the
points where the scheduler batches the model calls of several requests.

The server drives the request; the request knows nothing of the server but the two callables
it is given: `drive` (run one server step, for a reader waiting on frames) and `on_cancel`.
Each frame comes from s2core.generation.frame's rule, as in generate(), so a request gives the codes generate() gives it alone whenever the model's
numbers are the same (always under greedy sampling on a backend whose batched rows equal its
single rows; a batch's float32 rounding can otherwise only flip a near-tie).
"""

from __future__ import annotations

import time
from collections import deque
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

import numpy as np

from s2core.generation.config import GenerationConfig, GenerationStats
from s2core.generation.frame import FrameRule, draw_codes

if TYPE_CHECKING:
    from s2core.runtime.prefix import KVPrefix

#: how a request ended (GenerationStats.stopped_by): the two of generate(), and these
CANCELLED = "cancelled"
FAILED = "failed"


class Request:
    """A request submitted to a `Server`: iterate it for its frames (num_codebooks,) as they
    come (iterating drives the server), `codes()` for all of them, `cancel()` to stop it."""

    def __init__(self, hparams: Any, prompt: np.ndarray, config: GenerationConfig,
                 prefix: "KVPrefix | None", on_frame: Callable[[int, np.ndarray], Any] | None,
                 drive: Callable[[], None], on_cancel: Callable[["Request"], None]):
        self._drive = drive
        self._on_cancel = on_cancel
        self.prompt = prompt
        self.config = config
        self.prefix = prefix
        self.on_frame = on_frame
        self.stats = GenerationStats(prompt_positions=len(prompt))
        self.frames: list[np.ndarray] = []
        self.slot: int | None = None
        self.done = False
        self.error: BaseException | None = None
        self._cancel = False
        self._unread: deque[np.ndarray] = deque()
        self._hp = hparams
        self._rule = FrameRule(hparams, config, self.stats)
        self._main = -1
        self._logits: np.ndarray | None = None
        self.hidden: Any = None     # the last Slow-AR hidden state (native)
        self.codes_so_far: list[int] = []
        self._t_start = time.perf_counter()

    # ------------------------------------------------------------------ the user's side
    def cancel(self) -> None:
        """Stop this request; its slot goes to the next request, the others are unaffected."""
        self._cancel = True
        self._on_cancel(self)

    @property
    def cancelled(self) -> bool:
        return self._cancel

    def __iter__(self) -> Iterator[np.ndarray]:
        while True:
            if self._unread:
                yield self._unread.popleft()
                continue
            if self.error is not None:
                raise self.error
            if self.done:
                return
            self._drive()

    def codes(self) -> np.ndarray:
        """Every frame as [num_codebooks, frames] int64 (runs the server until this request
        ends)."""
        while not self.done:
            self._drive()
        if self.error is not None:
            raise self.error
        if not self.frames:
            return np.zeros((self._hp.num_codebooks, 0), dtype=np.int64)
        return np.stack(self.frames, axis=1)

    def __repr__(self) -> str:
        state = self.stats.stopped_by if self.done else ("running" if self.slot is not None
                                                         else "waiting")
        return f"Request(frames={len(self.frames)}, slot={self.slot}, {state})"

    # ------------------------------------------------------------------ the server's side
    def after_eval(self, result) -> None:
        """The Slow-AR's result for this request's last row: sample the next main token; the
        request ends at <|im_end|>."""
        self._logits = self._rule.allowed(result)
        self.hidden = result.hidden_native
        self._main = self._rule.sample_main(self._logits, len(self.frames))
        if self._main == self.config.im_end_id:
            self.finish("im_end")

    def begin_frame(self) -> None:
        """RAS, then code 0 from the main token (the frame rule's step 2)."""
        self._main, self.codes_so_far = self._rule.begin_frame(self._main, self._logits,
                                                               len(self.frames))

    def end_frame(self) -> np.ndarray:
        """The frame is complete: hand it out; the request ends at max_new_tokens, or when
        on_frame returns False."""
        frame = np.asarray(self.codes_so_far, dtype=np.int64)
        self.frames.append(frame)
        self._unread.append(frame)
        self.stats.frames = len(self.frames)
        if self.stats.first_frame_s is None:
            self.stats.first_frame_s = time.perf_counter() - self._t_start
        if self.on_frame is not None:
            try:
                if self.on_frame(len(self.frames) - 1, frame) is False:
                    self._cancel = True
            except Exception as exc:  # this request's callback: it alone ends, with the error
                self.finish(FAILED, exc)
                return frame
        if len(self.frames) == self.config.max_new_tokens:
            self.finish("max_new_tokens")
        return frame

    @property
    def logit_rows(self):
        """The token ids whose logits this request's steps need (FrameRule.logit_rows)."""
        return self._rule.logit_rows

    def next_row(self) -> np.ndarray:
        """The row the next step evaluates: [main, codes of the last frame]."""
        return np.concatenate([[self._main], self.frames[-1]]).astype(np.int64)

    def finish(self, why: str, error: BaseException | None = None) -> None:
        if not self.done:
            self.done = True
            self.stats.stopped_by = why
            self.stats.total_s = time.perf_counter() - self._t_start
            self.error = error


def add_codes(requests: Sequence[Request], fast_logits: np.ndarray) -> None:
    """Each request's next code from its row of the Fast-AR's logits (B, codebook_size), the
    rows drawn together (frame.draw_codes)."""
    codes = draw_codes([r._rule for r in requests], fast_logits)
    for r, code in zip(requests, codes):
        r.codes_so_far.append(code)
