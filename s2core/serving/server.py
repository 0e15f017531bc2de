"""Continuous batching: many requests on one model, each in its own KV slot.

    server = Server(model, max_sequences=4)
    a = server.submit(prompt_a, GenerationConfig(seed=1))
    b = server.submit(prompt_b, GenerationConfig(seed=2), prefix=voice_prefix)
    for frame in a: ...        # iterating a request drives the server: b advances too
    codes_b = b.codes()

One `step()`:
1. requests waiting for a slot take the free ones: the voice prefix goes into the slot
   (BatchedModel.restore_prefix: on a backend that shares prefixes its K/V are held once and
   every slot in that voice references them; otherwise they are converted once and copied
   into each slot) and the rest of the prompt is prefilled, one call per request (so its
   numbers are those of generate()'s prefill);
2. every running request's next frame: its main token's code 0, then codes 1..C-1 with the
   Fast-AR run for all of them at once (one pass per codebook);
3. the frames are handed out; requests that reached max_new_tokens, or were cancelled, leave
   and free their slot;
4. one Slow-AR call evaluates the new frame of every remaining request (one row per slot,
   each weight read once for all), then each samples its next main token; those that drew
   <|im_end|> leave.

A backend with max_batch_sequences = 1 has one slot: its requests run one after another.
A backend error ends every running request with it (the waiting ones stay queued); a
request's on_frame that raises ends that request alone.

Voices: a slot that frees up is reset at once, so the voice it referenced is idle when no
other request uses it: BatchedModel keeps a few idle voices for the next request in them and
releases the least recently used when a new voice needs their memory. A request whose voice
does not fit beside the voices the running requests use waits at the head of the queue (the
requests behind it wait too, so it is not overtaken) until they leave; one whose voice does
not fit even with no other voice held ends alone with CacheAllocationError, raised to
whoever reads its codes.
The server is driven from one thread (whoever iterates a request or calls step()).
"""

from __future__ import annotations

import contextlib
import time
from collections import deque
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from s2core.contract.inputs import is_integer
from s2core.serving.batching import IDLE_VOICES, BatchedModel
from s2core.errors import CacheAllocationError, CacheOverflowError, InvalidInputError
from s2core.generation.config import GenerationConfig
from s2core.generation.loop import check_prompt
from s2core.runtime.model import SlowARModel
from s2core.serving.request import CANCELLED, FAILED, Request, add_codes

if TYPE_CHECKING:
    from s2core.runtime.prefix import KVPrefix


class Server:
    """Requests on one model with continuous batching (see the module's docstring).

    max_sequences: slots (sequences evaluated together); None = the backend's
    max_batch_sequences; more than that is refused. max_seq_len: each slot's capacity, in the
    positions it holds itself (a voice prefix the backend shares is not among them); None =
    sized by the requests waiting when the slots are first allocated (a later request that
    needs more is refused). idle_voices: voice prefixes no request uses that are kept for
    the next request in them (BatchedModel's)."""

    def __init__(self, model: SlowARModel, max_sequences: int | None = None,
                 max_seq_len: int | None = None, idle_voices: int = IDLE_VOICES):
        self.batched = BatchedModel(model, idle_voices=idle_voices)
        self.model = model
        self.hparams = model.hparams
        cap = self.batched.max_batch_sequences
        if max_sequences is None:
            max_sequences = cap
        if not is_integer(max_sequences) or not 1 <= max_sequences <= cap:
            raise InvalidInputError("max_sequences", f"max_sequences must be an int in [1, "
                                    f"max_batch_sequences={cap}] for backend "
                                    f"{model.backend.name!r}, got {max_sequences!r}")
        if max_seq_len is not None:
            ctx = self.hparams.context_length
            if not is_integer(max_seq_len) or not 0 < max_seq_len <= ctx:
                raise InvalidInputError("max_seq_len_range", f"max_seq_len must be an int in "
                                        f"[1, context_length={ctx}], got {max_seq_len!r}")
        self.max_sequences = int(max_sequences)
        self.max_seq_len = max_seq_len
        self._waiting: deque[Request] = deque()
        self._running: dict[int, Request] = {}
        #: seconds of each step's batched Slow-AR call, with how many rows it evaluated
        self.step_times: list[tuple[int, float]] = []

    # ------------------------------------------------------------------ requests
    def submit(self, prompt: Any, config: GenerationConfig | None = None,
               prefix: "KVPrefix | None" = None,
               on_frame: Callable[[int, np.ndarray], Any] | None = None) -> Request:
        """Queue a request (every check of generate() runs here, before anything changes); it
        joins at the next step with a free slot. `on_frame(i, codes)` is called after each
        frame; returning False cancels the request."""
        config = GenerationConfig() if config is None else config
        mat = check_prompt(self.model, prompt, config, prefix)
        need = self._held(len(mat), config, prefix)
        if (self.max_seq_len is None and not self._running and self.batched.max_seq_len
                is not None and need > self.batched.max_seq_len):
            self.batched.free_slots()  # idle: the slots are sized again for what waits
        capacity = self.batched.max_seq_len or self.max_seq_len
        if capacity is not None and need > capacity:
            shared = len(mat) + config.max_new_tokens - need
            raise CacheOverflowError("capacity", f"prompt ({len(mat)} positions"
                                     f"{f', {shared} of them a shared prefix' if shared else ''}"
                                     f") + max_new_tokens ({config.max_new_tokens}) = {need} "
                                     f"slot positions exceeds the server's slot capacity "
                                     f"max_seq_len={capacity}")
        if on_frame is not None and not callable(on_frame):
            raise InvalidInputError("on_frame", f"on_frame must be callable, got "
                                    f"{type(on_frame).__name__}")
        request = Request(self.hparams, mat, config, prefix, on_frame, self.step, self._cancelled)
        self._waiting.append(request)
        return request

    @property
    def busy(self) -> bool:
        """Requests are waiting or running."""
        return bool(self._waiting or self._running)

    def run(self) -> None:
        """Step until every submitted request has ended."""
        while self.busy:
            self.step()

    def _cancelled(self, request: Request) -> None:
        if request.done:
            return
        if request.slot is None:
            if request in self._waiting:
                self._waiting.remove(request)
            request.finish(CANCELLED)
        # a running request leaves at the next point where its slot is not in use

    # ------------------------------------------------------------------ one step
    def step(self) -> None:
        """Admit, decode one frame of every running request, evaluate them (see above)."""
        try:
            self._retire()
            self._admit()
            self._frames()
            self._retire()
            self._evaluate()
            self._retire()
        except BaseException as exc:
            # The backend's state for the running requests is no longer known to match
            # theirs: they end with the error; waiting requests stay queued.
            for request in list(self._running.values()):
                request.finish(FAILED, exc)
            for slot in list(self._running):
                with contextlib.suppress(Exception):  # best effort: its voice is idle again
                    self.batched.reset_slot(slot)
            self._running.clear()
            raise

    def _free_slots(self) -> list[int]:
        return [s for s in range(self.batched.n_slots) if s not in self._running]

    def _held(self, n_prompt: int, config: GenerationConfig, prefix: Any) -> int:
        """Positions a request's slot holds itself: all of them, less a shared prefix's."""
        shared = prefix.n_positions if (prefix is not None and
                                        self.model.capabilities.shares_kv_prefix) else 0
        return n_prompt - shared + config.max_new_tokens

    def _allocate(self) -> None:
        need = max(self._held(len(r.prompt), r.config, r.prefix) for r in self._waiting)
        self.batched.init_slots(self.max_sequences, self.max_seq_len or need)

    def _admit(self) -> None:
        if not self._waiting:
            return
        if self.batched.max_seq_len is None:
            self._allocate()
        for slot in self._free_slots():
            if not self._waiting:
                break
            request = self._waiting.popleft()
            request.slot = slot
            self._running[slot] = request
            try:
                self._prefill(request)
            except CacheAllocationError as exc:
                # its voice does not fit beside the slots and the voices held: refused
                # before anything changed, and its slot is free again
                del self._running[slot]
                request.slot = None
                if self._voices_in_use():
                    self._waiting.appendleft(request)  # room comes when they leave
                    break
                request.finish(FAILED, exc)  # it would not fit with no other voice either

    def _voices_in_use(self) -> bool:
        """A running request references a voice the backend holds for it (one that will be
        released, or can be, when the request leaves)."""
        return any(r.stats.prefix_shared for r in self._running.values())

    def _prefill(self, request: Request) -> None:
        """The prompt into the request's slot, alone in its call (the numbers of generate()'s
        prefill), then its first main token."""
        b, slot, st = self.batched, request.slot, request.stats
        b.reset_slot(slot)
        rest = request.prompt
        if request.prefix is not None:
            t = time.perf_counter()
            self._restore(slot, request.prefix, st)
            st.restore_s = time.perf_counter() - t
            st.restored_positions = request.prefix.n_positions
            rest = rest[request.prefix.n_positions:]
        t = time.perf_counter()
        (result,) = b.eval([(slot, rest, request.logit_rows)])
        st.prefill_s = time.perf_counter() - t
        st.prefilled_positions = len(rest)
        request.after_eval(result)

    def _restore(self, slot: int, prefix: "KVPrefix", st) -> None:
        how = self.batched.restore_prefix(slot, prefix)
        st.prefix_recomputed = how == "recomputed"
        st.prefix_shared = how == "shared"

    def _frames(self) -> None:
        """Codes of the next frame of every running request: one Fast-AR pass per codebook
        for all of them."""
        running = [r for r in self._running.values() if not r.done]
        if not running:
            return
        t = time.perf_counter()
        for r in running:
            r.begin_frame()
        hiddens = [self.model.backend.to_numpy(r.hidden) for r in running]
        for _ in range(1, self.hparams.num_codebooks):
            logits = self.batched.fast_decode(hiddens, [r.codes_so_far for r in running])
            add_codes(running, logits)
        dt = time.perf_counter() - t
        for r in running:
            r.stats.fast_decode_s.append(dt)
            r.end_frame()

    def _evaluate(self) -> None:
        running = [r for r in self._running.values() if not r.done and not r.cancelled]
        if not running:
            return
        t = time.perf_counter()
        results = self.batched.eval([(r.slot, r.next_row(), r.logit_rows) for r in running])
        dt = time.perf_counter() - t
        self.step_times.append((len(running), dt))
        for r, result in zip(running, results):
            r.stats.step_s.append(dt)
            r.after_eval(result)

    def _retire(self) -> None:
        """Requests that ended or were cancelled leave; their slots are free again."""
        for slot, r in list(self._running.items()):
            if r.cancelled and not r.done:
                r.finish(CANCELLED)
            if r.done:
                del self._running[slot]
                r.slot = None
                self.batched.reset_slot(slot)  # its voice is idle unless another uses it

    # ------------------------------------------------------------------ life cycle
    def close(self) -> None:
        """Cancel everything and free the slots."""
        for r in list(self._waiting) + list(self._running.values()):
            r.finish(CANCELLED)
        self._waiting.clear()
        self._running.clear()
        self.batched.close()

    def __enter__(self) -> "Server":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
