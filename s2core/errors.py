"""The package's exceptions: one base class, one subclass per kind of failure.

Every message names the check that failed and the numbers involved, so a caller can act on
it without reading our code. Input errors subclass ValueError, state errors RuntimeError.
"""

from __future__ import annotations


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
