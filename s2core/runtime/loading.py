"""`load()` and `default_backend()`: which backend opens a model file, and opening it.

The order of a load: the arguments' types, the named backend's options (before any file is
read or backend module imported), the file (s2core/modelfile/file.py validates all of it), the
backend (named, $S2CORE_BACKEND, or the best for this file by s2core/runtime/selection.py), then its
class. When the backend was chosen automatically and its class fails to import (a broken
install, a missing shared library), the next in the selection order is tried, with a
warning that says why; a backend the user named is never replaced by another.
"""

from __future__ import annotations

import os
import warnings
from typing import Any

from s2core.contract.backend import ARITHMETICS, Backend
from s2core.codec.model import Codec
from s2core.contract.checks import loaded_capabilities_problems
from s2core.errors import BackendUnavailableError, InvalidInputError, backend_call
from s2core.modelfile.file import ModelFile
from s2core.runtime.model import SlowARModel
from s2core.contract.checks import short
from s2core.contract.registry import ENV_BACKEND, Registry, get_registry
from s2core.runtime.selection import rank_backends


#: names the backend load_codec() uses when none is given
ENV_CODEC_BACKEND = "S2CORE_CODEC_BACKEND"


class BackendFallbackWarning(UserWarning):
    """The automatically chosen backend failed to import; load() used the next one."""


def offering(registry: Registry, arithmetic: str) -> list[str]:
    """The available backends whose capabilities offer this arithmetic."""
    return [r.name for r in registry.list() if r.available and r.capabilities is not None
            and arithmetic in r.capabilities.arithmetics]


def check_arithmetic(registry: Registry, backend: str | None, arithmetic: Any) -> None:
    """`arithmetic=` is the core's option (Capabilities.arithmetics): a known value, offered
    by the named backend, or by some backend when none is named."""
    if arithmetic is None:
        return
    if arithmetic not in ARITHMETICS:
        raise InvalidInputError("arithmetic", f"arithmetic={short(arithmetic)} is not one of "
                                              f"{ARITHMETICS} (or None: the backend's default)")
    names = offering(registry, arithmetic)
    if (backend is not None and backend not in names) or not names:
        raise InvalidInputError(
            "arithmetic", f"{'backend ' + repr(backend) if backend else 'no backend'} does not "
                          f"offer arithmetic={arithmetic!r}; backends that do: "
                          f"{', '.join(names) or 'none available here'}")


def with_arithmetic(registry: Registry, name: str, options: dict[str, Any],
                    arithmetic: str | None) -> dict[str, Any]:
    """The options for backend `name`: `arithmetic` passed on to a backend that declares it
    as an option (one that does not computes only "f32")."""
    if arithmetic is None or "arithmetic" not in {o.name for o in registry.info(name).options}:
        return options
    return {**options, "arithmetic": arithmetic}


def pick_backend(registry: Registry, model_file: ModelFile, backend: str | None,
                 options: dict[str, Any], arithmetic: str | None = None
                 ) -> tuple[str, type[Backend]]:
    """(name, class) of the backend load() uses for this file with these options; with an
    arithmetic, among the backends that offer it."""
    if backend is None and os.environ.get(ENV_BACKEND, "").strip():
        backend = registry.default()  # checks that it is registered and available
    if backend is not None:
        check_arithmetic(registry, backend, arithmetic)
        registry.check_options(backend, options)
        return backend, registry.backend_class(backend)
    check_arithmetic(registry, None, arithmetic)
    failures = []
    ranked = rank_backends(registry.list(), model_file)
    if arithmetic is not None:
        ranked = [n for n in ranked if n in offering(registry, arithmetic)]
    for name in ranked:
        registry.check_options(name, options)
        try:
            cls = registry.backend_class(name)
        except BackendUnavailableError as exc:
            failures.append(str(exc))
            continue
        if failures:
            warnings.warn(f"{'; '.join(failures)}; using backend {name!r} instead",
                          BackendFallbackWarning, stacklevel=3)
        return name, cls
    raise BackendUnavailableError("no available backend could be imported: " + "; ".join(failures))


def open_backend(registry: Registry, name: str, backend_cls: type[Backend],
                 model_file: ModelFile, options: dict[str, Any]) -> Backend:
    """The backend class's instance on this file, its exceptions as s2core errors, refused
    (closed) when its capabilities fail the checks its probe's answer passed: the core
    sizes memory and picks paths by them."""
    with backend_call(name, f"{backend_cls.__name__}(model_file, **{options!r})"):
        instance = backend_cls(model_file, **options)
    try:
        with backend_call(name, "capabilities"):
            problems = loaded_capabilities_problems(instance.capabilities,
                                                    registry.info(name).capabilities,
                                                    type(instance))
    except BaseException:
        _close_quietly(instance)
        raise
    if problems:
        _close_quietly(instance)
        raise BackendUnavailableError(f"backend {name!r} declares invalid capabilities once "
                                      f"loaded: {'; '.join(problems)}")
    return instance


def _close_quietly(instance: Backend) -> None:
    """Release a backend that is refused; the refusal is the error the user needs."""
    try:
        instance.close()
    except Exception:  # noqa: BLE001 - third-party code, already being refused
        pass


def load(path: str | os.PathLike, backend: str | None = None, **options: Any) -> SlowARModel:
    """Open a GGUF model file on a backend and return the model object.

    backend=None: $S2CORE_BACKEND if set, else the best backend for this file
    (`s2core.runtime.selection`; `default_backend(path)` names it without loading). `options` go to
    the backend (for example device="cuda:0", kv_cache_dtype="f32"); each backend declares
    the ones it takes, and any other name or value is an InvalidInputError before anything is
    read.

    arithmetic: how products with non-F32 weights treat their activation, "ggml" (rounded as
    s2.cpp's ggml rounds it) or "f32"; None: the backend's default. A backend that does not
    offer it (Capabilities.arithmetics) is an InvalidInputError naming those that do.
    """
    registry = get_registry()
    arithmetic = options.pop("arithmetic", None)
    if backend is not None:
        if not isinstance(backend, str):
            raise InvalidInputError("backend_type", f"backend must be a name (str) or None, "
                                                    f"got {type(backend).__name__}")
        check_arithmetic(registry, backend, arithmetic)
        registry.check_options(backend, options)
    model_file = ModelFile(path)
    try:
        name, backend_cls = pick_backend(registry, model_file, backend, options, arithmetic)
        options = with_arithmetic(registry, name, options, arithmetic)
        return SlowARModel(model_file, open_backend(registry, name, backend_cls, model_file,
                                                    options))
    except BaseException:
        model_file.close()
        raise


def default_backend(path: str | os.PathLike | None = None) -> str:
    """The backend `load()` uses when none is named.

    With a path: exactly what `load(path)` picks ($S2CORE_BACKEND, else the best backend for
    that file, passing over one whose class fails to import: to know that, the chosen
    backend's module is imported). Without: $S2CORE_BACKEND, else the available backend of
    highest priority, which is load()'s choice unless a peer holds the file in fewer bytes.
    """
    registry = get_registry()
    if path is None:
        return registry.default()
    model_file = ModelFile(path)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", BackendFallbackWarning)
            return pick_backend(registry, model_file, None, {})[0]
    finally:
        model_file.close()


def load_codec(path: str | os.PathLike, backend: str | None = None, **options: Any) -> Codec:
    """Open the audio codec of a GGUF file (a full S2 Pro file's `c.*` tensors, or a
    codec-only file) on a backend that provides one.

    backend=None: $S2CORE_CODEC_BACKEND if set, else the best codec provider
    (`s2core.runtime.codec_selection`). `options` go to the backend's codec (for example device="cpu").
    """
    from s2core.codec.file import CodecFile
    from s2core.runtime.codec_selection import choose_codec_backend
    registry = get_registry()
    if backend is not None and not isinstance(backend, str):
        raise InvalidInputError("backend_type", f"backend must be a name (str) or None, "
                                                f"got {type(backend).__name__}")
    if backend is None:
        backend = os.environ.get(ENV_CODEC_BACKEND, "").strip() or choose_codec_backend(registry.list())
    codec_cls = registry.codec_class(backend)
    codec_file = CodecFile(path)
    try:
        with backend_call(backend, f"{codec_cls.__name__}(codec_file, **{options!r})"):
            instance = codec_cls(codec_file, **options)
        return Codec(codec_file, instance)
    except BaseException:
        codec_file.close()
        raise
