"""s2core: the Slow-AR transformer of Fish Audio S2 Pro, with its KV cache, on any backend.

    import s2core
    m = s2core.load("s2-pro-q8_0.gguf")      # auto-selects the best available backend
    m.init_kv_cache(1024)
    r = m.prefill(prompt)                     # (n_tokens, num_codebooks + 1) integers
    r = m.step(frame)                         # r.hidden, r.logits: float32 numpy

Importing this package is cheap: no backend framework (torch, mlx) is imported until a
backend that needs it is chosen.
"""

from __future__ import annotations

from s2core.contract.backend import Backend, Capabilities
from s2core.codec import Codec, CodecBackend, CodecCapabilities, StreamDecoder
from s2core.errors import (BackendError, BackendOutOfMemoryError, BackendRegistryError,
                     BackendUnavailableError, CacheAllocationError,
                     CacheNotInitializedError, CacheOverflowError, ModelBusyError,
                     ModelClosedError, FileFormatError, InvalidInputError, InvalidTokensError,
                     ModelFileError, PrefixFileError, PrefixMismatchError, S2CoreError,
                     TokenizerError, VoiceFileError)
from s2core.modelfile.file import ModelFile
from s2core.modelfile.hparams import FastHparams, Hparams
from s2core.contract.inputs import EvalBatch, LogitRows
from s2core.runtime.loading import default_backend, load, load_codec
from s2core.runtime.model import Result, SlowARModel
from s2core.runtime.prefix import KVPrefix, ModelIdentity
from s2core.contract.registry import BackendInfo, get_registry
from s2core.text.tokenizer import Tokenizer

from s2core.version import __version__

__all__ = [
    "load", "list_backends", "default_backend", "SlowARModel", "Result", "Backend",
    "Capabilities", "EvalBatch", "LogitRows", "Hparams", "FastHparams", "ModelFile",
    "BackendInfo",
    "S2CoreError", "InvalidInputError", "InvalidTokensError", "CacheOverflowError",
    "CacheNotInitializedError", "CacheAllocationError", "ModelBusyError", "ModelClosedError",
    "ModelFileError", "BackendUnavailableError", "BackendError", "BackendOutOfMemoryError",
    "BackendRegistryError", "__version__", "KVPrefix", "ModelIdentity", "Tokenizer",
    "PrefixMismatchError", "FileFormatError", "PrefixFileError", "VoiceFileError",
    "TokenizerError",
    "load_codec", "Codec", "CodecBackend", "CodecCapabilities", "StreamDecoder",
]


def list_backends() -> list[BackendInfo]:
    """Every registered backend (best first): name, priority, available or not and why,
    capabilities. Plugins that failed to load are listed last with their reason."""
    return get_registry().list()
