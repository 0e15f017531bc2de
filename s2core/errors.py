"""The package's exceptions: one base class, one subclass per kind of failure.

Every message names the check that failed and the numbers involved, so a caller can act on
it without reading our code. Input errors subclass ValueError, state errors RuntimeError.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator


class S2CoreError(Exception):
    """Base class of every error raised by s2core."""


class InvalidInputError(S2CoreError, ValueError):
    """An argument failed a check; `check` names which one (for example "n_tokens>0")."""

    def __init__(self, check: str, message: str):
        super().__init__(f"[{check}] {message}")
        self.check = check


class InvalidTokensError(InvalidInputError):
    """Token input of the wrong shape, length, dtype, or with ids out of range."""


class CacheOverflowError(InvalidInputError):
    """n_past + n_tokens would exceed the KV cache capacity (SPEC 2.1, check 3)."""


class CacheNotInitializedError(S2CoreError, RuntimeError):
    """An eval was asked for before init_kv_cache() (or after clear_kv_cache())."""


class CacheAllocationError(S2CoreError, MemoryError):
    """init_kv_cache could not allocate the cache it was asked for (more bytes than the
    backend's memory holds, or the allocation itself failed). The message names the sizes; the
    model keeps its previous cache and n_past."""


class ModelClosedError(S2CoreError, RuntimeError):
    """A call on a model after close(): its file and weights are released."""


class ModelBusyError(S2CoreError, RuntimeError):
    """Another thread's streaming generation holds the model: a call from this thread would
    interleave with it. Finish or close() the stream, or use one model per thread."""


class ModelFileError(S2CoreError, ValueError):
    """A GGUF file that is not a valid S2 Pro model: not a regular file, truncated, a count
    or offset out of bounds, metadata of the wrong type, unusable hparams, a missing tensor,
    a wrong shape or type. `check` names which ("truncated", "metadata_type", "hparams", ...)."""

    def __init__(self, message: str, check: str = "model_file"):
        super().__init__(f"[{check}] {message}")
        self.check = check
        self.message = message


class BackendUnavailableError(S2CoreError, RuntimeError):
    """The requested backend is unknown, failed to load, or its probe says it cannot run here."""


class BackendError(S2CoreError, RuntimeError):
    """A backend raised something other than an s2core error: a bug or a failure of its own
    (an IndexError, a driver's RuntimeError). `backend` and `call` name where; the original
    exception is chained (`__cause__`). The model is as it was before the call."""

    def __init__(self, backend: str, call: str, exc: BaseException):
        super().__init__(f"backend {backend!r} failed in {call}: {type(exc).__name__}: "
                         f"{str(exc)[:500]}")
        self.backend = backend
        self.call = call


class BackendOutOfMemoryError(BackendError, MemoryError):
    """A backend ran out of memory outside a cache allocation (an evaluation's scratch, a
    decode's activations): MemoryError inside the backend."""


class BackendRegistryError(S2CoreError, RuntimeError):
    """The registry itself is inconsistent, for example two backends with the same name."""


class PrefixMismatchError(InvalidInputError):
    """A KV prefix that does not fit this model: another model file, another KV cache type,
    wrong shapes, or a prompt that does not start with its token rows (`check` says which)."""


class FileFormatError(S2CoreError, ValueError):
    """A file s2core reads (KV prefix, .s2voice, tokenizer.json) is malformed; the message
    names the file and what is wrong with it, `check` (where set) which rule it broke."""

    def __init__(self, message: str, check: str = ""):
        super().__init__(f"[{check}] {message}" if check else message)
        self.check = check


class PrefixFileError(FileFormatError):
    """A saved KV prefix (.safetensors) that cannot be read back."""


class VoiceFileError(FileFormatError):
    """An .s2voice file that s2.cpp would refuse (SPEC 8), or that does not fit the model."""


class TokenizerError(FileFormatError):
    """A tokenizer.json that cannot be loaded or lacks the special tokens S2 Pro's prompt uses."""


@contextmanager
def backend_call(backend: str, call: str,
                 memory_error: Callable[[BaseException], S2CoreError] | None = None
                 ) -> Iterator[None]:
    """Where the core calls a backend (third-party code): what it raises reaches the user as
    an s2core error. An S2CoreError passes as it is; a MemoryError becomes `memory_error(exc)`
    (the caller's: CacheAllocationError for an allocation) or BackendOutOfMemoryError; any
    other Exception a BackendError naming `backend` and `call`, the original chained. The
    caller changes nothing before the backend returns, so its state is as it was."""
    try:
        yield
    except S2CoreError:
        raise
    except MemoryError as exc:
        raise (memory_error(exc) if memory_error is not None
               else BackendOutOfMemoryError(backend, call, exc)) from exc
    except Exception as exc:  # noqa: BLE001 - third-party code: every kind is wrapped
        raise BackendError(backend, call, exc) from exc
