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

from .backend import Backend, Capabilities
from .codec import Codec, CodecBackend, CodecCapabilities, StreamDecoder
from .errors import (BackendRegistryError, BackendUnavailableError, CacheAllocationError,
                     CacheNotInitializedError, CacheOverflowError, ModelBusyError,
                     ModelClosedError, FileFormatError, InvalidInputError, InvalidTokensError,
                     ModelFileError, PrefixFileError, PrefixMismatchError, S2CoreError,
                     TokenizerError, VoiceFileError)
from .gguf_file import ModelFile
from .hparams import FastHparams, Hparams
from .inputs import EvalBatch
from .loading import default_backend, load, load_codec
from .model import Result, SlowARModel
from .prefix import KVPrefix, ModelIdentity
from .registry import BackendInfo, get_registry
from .text.tokenizer import Tokenizer

__version__ = "0.1.0"

__all__ = [
    "load", "list_backends", "default_backend", "SlowARModel", "Result", "Backend",
    "Capabilities", "EvalBatch", "Hparams", "FastHparams", "ModelFile", "BackendInfo",
    "S2CoreError", "InvalidInputError", "InvalidTokensError", "CacheOverflowError",
    "CacheNotInitializedError", "CacheAllocationError", "ModelBusyError", "ModelClosedError",
    "ModelFileError", "BackendUnavailableError",
    "BackendRegistryError", "__version__", "KVPrefix", "ModelIdentity", "Tokenizer",
    "PrefixMismatchError", "FileFormatError", "PrefixFileError", "VoiceFileError",
    "TokenizerError",
    "load_codec", "Codec", "CodecBackend", "CodecCapabilities", "StreamDecoder",
]


def list_backends() -> list[BackendInfo]:
    """Every registered backend (best first): name, priority, available or not and why,
    capabilities. Plugins that failed to load are listed last with their reason."""
    return get_registry().list()
