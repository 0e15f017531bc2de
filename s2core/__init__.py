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

#: names the backend load_codec() uses when none is given
ENV_CODEC_BACKEND = "S2CORE_CODEC_BACKEND"

from .backend import Backend, Capabilities
from .codec import Codec, CodecBackend, CodecCapabilities, StreamDecoder
from .errors import (BackendRegistryError, BackendUnavailableError, CacheNotInitializedError,
                     CacheOverflowError, InvalidInputError, InvalidTokensError, ModelFileError,
                     S2CoreError)
from .gguf_file import ModelFile
from .hparams import FastHparams, Hparams
from .inputs import EvalBatch
from .model import Result, SlowARModel
from .registry import ENV_BACKEND, BackendInfo, get_registry
from .selection import choose_backend

__version__ = "0.1.0"

__all__ = [
    "load", "list_backends", "default_backend", "SlowARModel", "Result", "Backend",
    "Capabilities", "EvalBatch", "Hparams", "FastHparams", "ModelFile", "BackendInfo",
    "S2CoreError", "InvalidInputError", "InvalidTokensError", "CacheOverflowError",
    "CacheNotInitializedError", "ModelFileError", "BackendUnavailableError",
    "BackendRegistryError", "__version__", "load_codec", "Codec", "CodecBackend",
    "CodecCapabilities", "StreamDecoder",
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


def load_codec(path: str | os.PathLike, backend: str | None = None, **options: Any) -> Codec:
    """Open the audio codec of a GGUF file (a full S2 Pro file's `c.*` tensors, or a
    codec-only file) on a backend that provides one.

    backend=None: $S2CORE_CODEC_BACKEND if set, else the best codec provider
    (`s2core.codec.selection`). `options` go to the backend's codec (for example device="cpu").
    """
    from .codec.file import CodecFile
    from .codec.selection import choose_codec_backend
    registry = get_registry()
    if backend is None:
        backend = os.environ.get(ENV_CODEC_BACKEND, "").strip() or choose_codec_backend(registry.list())
    codec_cls = registry.codec_class(backend)
    codec_file = CodecFile(path)
    try:
        return Codec(codec_file, codec_cls(codec_file, **options))
    except BaseException:
        codec_file.close()
        raise
