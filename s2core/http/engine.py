"""The model behind the HTTP app: one loaded model, its tokenizer, codec and voices, and the one
`s2core.serving.Server` every request joins, stepped by a thread of its own.

    engine = Engine.from_args(model="s2-pro-q8_0.gguf", tokenizer="tokenizer.json")
    engine.start()
    stream = engine.submit(prompt, config, prefix, loop)   # QueueFullError when full
    async for frame in stream: ...                          # frames as the steps make them
    engine.close()

The engine's thread owns the model: it submits waiting requests when a slot is free (at most
`max_sequences` run, at most `max_queue` more wait: `submit` refuses the next one at once),
steps the server, hands each frame to its request's asyncio queue, and cancels a request whose
client left before the next step. Work that needs the model's own single-sequence cache (a
voice prefix to compute) waits until no request runs and holds new ones back meanwhile.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from s2core.codec import Codec
from s2core.errors import S2CoreError
from s2core.generation.loop import GenerationConfig
from s2core.runtime.model import SlowARModel
from s2core.runtime.prefix import KVPrefix
from s2core.serving import Server
from s2core.speak.audio_out import check_codec_fits
from s2core.text.tokenizer import Tokenizer
from s2core.voice.library import VoiceLibrary

#: the voice name that means the served model's default voice
DEFAULT_VOICE = "default"
#: each slot's capacity when the model's context is longer (a slot's K/V is allocated whole)
DEFAULT_SLOT_POSITIONS = 4096


class QueueFullError(S2CoreError, RuntimeError):
    """Every slot is busy and `max_queue` requests already wait."""

    def __init__(self, message: str, retry_after_s: int):
        super().__init__(message)
        self.retry_after_s = retry_after_s


class EngineClosedError(S2CoreError, RuntimeError):
    """The engine stopped taking requests (the server is shutting down)."""


_END = object()


class Stream:
    """One request's frames, delivered from the engine's thread to an asyncio consumer."""

    def __init__(self, engine: "Engine", prompt: np.ndarray, config: GenerationConfig,
                 prefix: KVPrefix | None, loop: asyncio.AbstractEventLoop):
        self.engine = engine
        self.prompt = prompt
        self.config = config
        self.prefix = prefix
        self.frames = 0
        self.error: BaseException | None = None
        self.done = False
        self.submitted_at = time.perf_counter()
        self._loop = loop
        self._queue: asyncio.Queue = asyncio.Queue()
        self._request: Any = None          # the serving.Request, once submitted
        self._cancel = False

    def cancel(self) -> None:
        """The client left: free its slot at the next step (or drop it from the queue)."""
        self.engine._cancel(self)

    async def __aiter__(self):
        while True:
            item = await self._queue.get()
            if item is _END:
                if self.error is not None:
                    raise self.error
                return
            yield item

    # ------------------------------------------------------------------ the engine's side
    def _put(self, item: Any) -> None:
        with contextlib.suppress(RuntimeError):  # the consumer's loop is closed: it left
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)

    def _on_frame(self, i: int, frame: np.ndarray) -> bool:
        self.frames = i + 1
        self.engine.frames_made += 1
        if self.engine.on_frames is not None:
            self.engine.on_frames(1)
        self._put(frame)
        return not self._cancel

    def _finish(self, error: BaseException | None = None) -> None:
        if not self.done:
            self.done = True
            self.error = error
            self._put(_END)


@dataclass
class _Exclusive:
    """Work that needs the model alone (its single-sequence cache)."""
    fn: Callable[[], Any]
    future: concurrent.futures.Future = field(default_factory=concurrent.futures.Future)


class Engine:
    """See the module's docstring. `replica_name`, when set, names this engine's replica in
    every response (the app adds `X-S2core-Replica`)."""

    def __init__(self, model: SlowARModel, tokenizer: Tokenizer, codec: Codec,
                 voices_dir: str | os.PathLike, *, max_sequences: int | None = None,
                 max_queue: int = 64, slot_positions: int | None = None,
                 model_name: str = "s2-pro", default_voice_reference: Any = None,
                 replica_name: str | None = None):
        check_codec_fits(codec, model.hparams)
        self.model = model
        self.tokenizer = tokenizer
        self.codec = codec
        self.library = VoiceLibrary(voices_dir)
        self.model_name = model_name
        self.replica_name = replica_name
        self.hparams = model.hparams
        cap = model.capabilities.max_batch_sequences
        self.max_sequences = cap if max_sequences is None else min(int(max_sequences), cap)
        if int(max_queue) < 0:
            raise S2CoreError(f"max_queue must be >= 0, got {max_queue}")
        self.max_queue = int(max_queue)
        self.slot_positions = int(slot_positions or min(self.hparams.context_length,
                                                        DEFAULT_SLOT_POSITIONS))
        self.server = Server(model, max_sequences=self.max_sequences,
                             max_seq_len=self.slot_positions)
        #: codec calls from the request threads take turns
        self.codec_lock = threading.Lock()
        self.frames_made = 0
        #: called with the number of new frames (metrics), from the engine's thread
        self.on_frames: Callable[[int], Any] | None = None
        #: called with the number of running requests after each step (metrics)
        self.on_step: Callable[[int], Any] | None = None
        self.default_voice_reference = default_voice_reference
        self.ready = False
        self.closing = False
        self._prefixes: dict[str, tuple[float, KVPrefix]] = {}
        self._cond = threading.Condition()
        self._pending: deque[Stream] = deque()
        self._active: list[Stream] = []
        self._cancels: list[Stream] = []
        self._exclusive: deque[_Exclusive] = deque()
        self._stop = False
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_args(cls, model: str | os.PathLike | None = None,
                  tokenizer: str | os.PathLike | None = None, *,
                  voices_dir: str | os.PathLike | None = None, backend: str | None = None,
                  codec_backend: str | None = None, **options: Any) -> "Engine":
        """Load a model file (or, with model=None, the embedded default model with its
        tokenizer and its reference voice as the voice `default`) and make its engine.
        `options`: the constructor's keywords (max_sequences, max_queue, ...)."""
        import s2core
        from s2core.embedded.cache import cache_dir
        from s2core.embedded.default import (DEFAULT_TRANSCRIPT, default_model_files,
                                             default_reference)
        default_reference_voice = None
        if model is None:
            model, default_tokenizer = default_model_files()
            tokenizer = tokenizer or default_tokenizer
            voices_dir = voices_dir if voices_dir is not None else cache_dir() / "voices"
            default_reference_voice = (DEFAULT_TRANSCRIPT, default_reference)
        if tokenizer is None:
            raise S2CoreError("a model file needs its tokenizer (--tokenizer tokenizer.json)")
        loaded_tokenizer = Tokenizer.from_file(tokenizer)
        loaded = s2core.load(model, backend=backend)
        try:
            codec = s2core.load_codec(model, backend=codec_backend)
        except BaseException:
            loaded.close()
            raise
        if voices_dir is None:
            voices_dir = VoiceLibrary().directory
        engine = cls(loaded, loaded_tokenizer, codec, voices_dir, model_name=Path(model).name,
                     **options)
        if default_reference_voice is not None:
            transcript, make_codes = default_reference_voice
            engine.default_voice_reference = (transcript, make_codes(loaded.hparams))
        return engine

    # ------------------------------------------------------------------ life cycle
    def start(self) -> None:
        """Store the default voice (when it has one), start the thread, compute the voice
        prefixes of the stored voices, then report ready."""
        if self._thread is not None:
            return
        self._store_default_voice()
        self._thread = threading.Thread(target=self._run, name="s2core-engine", daemon=True)
        self._thread.start()
        for name in self.library.names():
            with contextlib.suppress(S2CoreError):
                self.voice_prefix_blocking(name)
        self.ready = True

    def close(self) -> None:
        """Stop: cancel what waits or runs, end the thread, free the model and codec."""
        self.closing = True
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=30)
        for s in list(self._pending) + list(self._active):
            s._finish(EngineClosedError("the server is shutting down"))
        self.server.close()
        self.codec.close()
        self.model.close()

    def _store_default_voice(self) -> None:
        if self.default_voice_reference is None or DEFAULT_VOICE in self.library.names():
            return
        from s2core.voice.file import SAMPLE_RATE, Voice
        transcript, codes = self.default_voice_reference
        self.library.save(DEFAULT_VOICE, Voice(transcript, np.asarray(codes, np.int32),
                                               SAMPLE_RATE, self.hparams.codebook_size))

    # ------------------------------------------------------------------ requests
    @property
    def running(self) -> int:
        return len(self._active)

    @property
    def queued(self) -> int:
        return len(self._pending)

    def submit(self, prompt: np.ndarray, config: GenerationConfig, prefix: KVPrefix | None,
               loop: asyncio.AbstractEventLoop | None = None) -> Stream:
        """Queue a checked request; QueueFullError at once when max_queue already wait."""
        loop = loop or asyncio.get_running_loop()
        stream = Stream(self, prompt, config, prefix, loop)
        with self._cond:
            if self._stop or self.closing:
                raise EngineClosedError("the server is shutting down")
            if len(self._pending) + len(self._active) >= self.max_sequences + self.max_queue:
                raise QueueFullError(f"the server is full: {len(self._active)} requests run "
                                     f"and {len(self._pending)} wait (--max-queue "
                                     f"{self.max_queue})", self.retry_after_s())
            self._pending.append(stream)
            self._cond.notify_all()
        return stream

    def retry_after_s(self) -> int:
        """A guess of when a slot frees: the running requests' frames so far at the recent
        rate are no guide, so one second, the time a client waits before asking again."""
        return 1

    def _cancel(self, stream: Stream) -> None:
        with self._cond:
            stream._cancel = True
            if stream in self._pending:
                self._pending.remove(stream)
                stream._finish(None)
            else:
                self._cancels.append(stream)
            self._cond.notify_all()

    def exclusive(self, fn: Callable[[], Any]) -> concurrent.futures.Future:
        """Run fn on the engine's thread once no request runs (new ones wait meanwhile)."""
        job = _Exclusive(fn)
        with self._cond:
            self._exclusive.append(job)
            self._cond.notify_all()
        return job.future

    # ------------------------------------------------------------------ voices
    def voice_prefix_blocking(self, name: str) -> KVPrefix:
        """The voice prefix of a stored voice (computed once and kept); waits for it."""
        cached = self.cached_prefix(name)
        if cached is not None:
            return cached
        if self._thread is None or threading.current_thread() is self._thread:
            return self._load_prefix(name)
        return self.exclusive(lambda: self._load_prefix(name)).result()

    async def voice_prefix(self, name: str) -> KVPrefix:
        cached = self.cached_prefix(name)
        if cached is not None:
            return cached
        return await asyncio.wrap_future(self.exclusive(lambda: self._load_prefix(name)))

    def cached_prefix(self, name: str) -> KVPrefix | None:
        entry = self._prefixes.get(name)
        path = self.library.path_of(name)
        if entry is None or not path.exists() or path.stat().st_mtime != entry[0]:
            return None
        return entry[1]

    def forget_voice(self, name: str) -> None:
        self._prefixes.pop(name, None)

    def _load_prefix(self, name: str) -> KVPrefix:
        """On the engine's thread with no request running: the stored prefix, else computed
        with the model's own cache (the server's slots are freed first) and stored."""
        from s2core.speak.pipeline import VoiceReport, stored_or_computed_prefix
        from s2core.text.prompt import split_prompt
        voice, path = self.library.load(name)
        voice.check_fits(self.hparams, str(path))
        rows, _ = split_prompt(self.tokenizer, ".", voice.transcript, voice.codes,
                               hparams=self.hparams)
        if not self.server.busy:
            self.server.batched.free_slots()
        report = VoiceReport(voice_path=path)
        prefix = stored_or_computed_prefix(self.model, self.library, report, rows)
        self._prefixes[name] = (path.stat().st_mtime, prefix)
        return prefix

    # ------------------------------------------------------------------ the thread
    def _run(self) -> None:
        while True:
            with self._cond:
                while not (self._stop or self._pending or self._active or self._cancels
                           or self._exclusive):
                    self._cond.wait()
                if self._stop:
                    return
                cancels, self._cancels = self._cancels, []
                job = self._exclusive.popleft() if self._exclusive and not self._active \
                    else None
                admit = []
                while (not self._exclusive and self._pending
                       and len(self._active) + len(admit) < self.max_sequences):
                    admit.append(self._pending.popleft())
                self._active.extend(admit)
            for s in cancels:
                if s._request is not None:
                    s._request.cancel()
            if job is not None:
                self._run_exclusive(job)
            for s in admit:
                try:
                    s._request = self.server.submit(s.prompt, s.config, prefix=s.prefix,
                                                    on_frame=s._on_frame)
                except Exception as exc:  # checked before queueing: a model-side refusal
                    s._finish(exc)
            if self.server.busy:
                with contextlib.suppress(Exception):  # the requests it ended carry the error
                    self.server.step()
                if self.on_step is not None:
                    self.on_step(len(self._active))
            with self._cond:
                for s in list(self._active):
                    r = s._request
                    if r is None or r.done:
                        self._active.remove(s)
                        s._finish(None if r is None else r.error)

    def _run_exclusive(self, job: _Exclusive) -> None:
        if not job.future.set_running_or_notify_cancel():
            return
        try:
            job.future.set_result(job.fn())
        except BaseException as exc:
            job.future.set_exception(exc)
