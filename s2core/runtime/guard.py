"""One model object shared by threads: calls are serialized, a stream is never interleaved.

Every public method of SlowARModel runs under its model's reentrant lock (`guarded`), so two
threads calling step() take turns instead of writing the same cache row; a method may call
another on the same thread. A streaming generation spans many calls with the caller's code
running between them, so it holds a *lease* on the model from its first frame to its end:
while it does, a call from any other thread raises ModelBusyError at once (waiting could
block forever on a stream nobody finishes). The lease follows the stream: whichever thread
resumes the generator holds it. After close() every guarded call raises ModelClosedError.
"""

from __future__ import annotations

import functools
import threading
from contextlib import contextmanager
from typing import Any, Callable, Iterator, TypeVar

from s2core.errors import ModelBusyError, ModelClosedError

F = TypeVar("F", bound=Callable[..., Any])


class Lease:
    """A stream's hold on a model; `claim()` when the stream resumes (maybe in another thread)."""

    def __init__(self, guard: "ModelGuard", what: str):
        self._guard = guard
        self.what = what
        self.thread = threading.current_thread()

    def claim(self) -> None:
        with self._guard._lock:
            self.thread = threading.current_thread()


class ModelGuard:
    def __init__(self, describe: Callable[[], str]):
        self._lock = threading.RLock()
        self._lease: Lease | None = None
        self._describe = describe  # the model's name for messages (its file)
        self.closed = False

    def _check(self, what: str) -> None:
        """Under the lock: the model is open and no other thread's stream holds it."""
        if self.closed:
            raise ModelClosedError(f"{what}: the model of {self._describe()} was closed (its file "
                                   "and weights are released); load it again to use it")
        lease = self._lease
        if lease is not None and lease.thread is not threading.current_thread():
            raise ModelBusyError(
                f"{what}: {lease.what} in thread {lease.thread.name!r} holds the model of "
                f"{self._describe()} until it ends; finish or close() that stream first, or "
                "load one model per thread")

    @contextmanager
    def call(self, what: str, allow_closed: bool = False) -> Iterator[None]:
        with self._lock:
            if not (allow_closed and self.closed):
                self._check(what)
            yield

    def check_no_stream(self, what: str) -> None:
        """Refuse (ModelBusyError) while any stream holds the model, this thread's included:
        for a call that would replace the cache the stream is using."""
        with self._lock:
            self._check(what)
            if self._lease is not None:
                raise ModelBusyError(
                    f"{what}: {self._lease.what} holds the model of {self._describe()} and its "
                    "KV cache until it ends; finish or close() that stream first")

    def check(self, what: str) -> None:
        """The checks of a call, for a function that touches the model later (generate)."""
        with self._lock:
            self._check(what)

    @contextmanager
    def lease(self, what: str) -> Iterator[Lease]:
        """Hold the model for a stream; a lease taken inside one (same thread) nests."""
        with self._lock:
            self._check(what)
            outer, self._lease = self._lease, Lease(self, what)
            lease = self._lease
        try:
            yield lease
        finally:
            with self._lock:
                self._lease = outer

    @contextmanager
    def closing(self) -> Iterator[bool]:
        """close(): yields False when already closed (closing twice is fine), else marks the
        model closed once the body has run."""
        with self._lock:
            if self.closed:
                yield False
                return
            self._check("close()")
            try:
                yield True
            finally:
                self.closed = True


def guarded(method: F) -> F:
    """Run a SlowARModel method under its model's guard (see the module docstring)."""
    what = f"{method.__name__}()"

    @functools.wraps(method)
    def wrapper(self, *args: Any, **kwargs: Any) -> Any:
        with self._guard.call(what):
            return method(self, *args, **kwargs)

    wrapper.__s2core_guarded__ = True  # type: ignore[attr-defined]
    return wrapper  # type: ignore[return-value]
