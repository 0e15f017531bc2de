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

import os
from typing import Any

from .backend import Backend, Capabilities
from .errors import (BackendRegistryError, BackendUnavailableError, CacheNotInitializedError,
                     CacheOverflowError, FileFormatError, InvalidInputError, InvalidTokensError,
                     ModelFileError, PrefixFileError, PrefixMismatchError, S2CoreError,
                     TokenizerError, VoiceFileError)
from .gguf_file import ModelFile
from .hparams import FastHparams, Hparams
from .inputs import EvalBatch
from .model import Result, SlowARModel
from .prefix import KVPrefix, ModelIdentity
from .text.tokenizer import Tokenizer
from .registry import ENV_BACKEND, BackendInfo, get_registry
from .selection import choose_backend

__version__ = "0.1.0"

__all__ = [
    "load", "list_backends", "default_backend", "SlowARModel", "Result", "Backend",
    "Capabilities", "EvalBatch", "Hparams", "FastHparams", "ModelFile", "BackendInfo",
    "S2CoreError", "InvalidInputError", "InvalidTokensError", "CacheOverflowError",
    "CacheNotInitializedError", "ModelFileError", "BackendUnavailableError",
    "BackendRegistryError", "__version__", "KVPrefix", "ModelIdentity", "Tokenizer",
    "PrefixMismatchError", "FileFormatError", "PrefixFileError", "VoiceFileError",
    "TokenizerError",
]


def list_backends() -> list[BackendInfo]:
    """Every registered backend (best first): name, priority, available or not and why,
    capabilities. Plugins that failed to load are listed last with their reason."""
    return get_registry().list()


def default_backend() -> str:
    """The name `load()` uses when none is given: $S2CORE_BACKEND if set, else the
    available backend of highest priority."""
    return get_registry().default()


def load(path: str | os.PathLike, backend: str | None = None, **options: Any) -> SlowARModel:
    """Open a GGUF model file on a backend and return the model object.

    backend=None: $S2CORE_BACKEND if set, else the best backend for this file
    (`s2core.selection`). `options` go to the backend (for example device="cuda:0",
    kv_cache_dtype="f32").
    """
    registry = get_registry()
    model_file = ModelFile(path)
    if backend is None:
        backend = (registry.default() if os.environ.get(ENV_BACKEND, "").strip()
                   else choose_backend(registry.list(), model_file))
    backend_cls = registry.backend_class(backend)
    return SlowARModel(model_file, backend_cls(model_file, **options))
