"""Backend discovery (pluggy), probing, listing and auto-selection.

Built-in backends register through the same hook as third parties; third parties through the
entry point group `s2core.backends`. Discovery and probes run lazily on first use, never at
`import s2core`. A plugin that fails to import, or whose hook or probe raises, is recorded with
its reason and shown as unavailable; it never takes the host down.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import threading
from dataclasses import dataclass
from typing import Any, Iterable

import pluggy

from .backend import Backend, Capabilities
from .errors import BackendRegistryError, BackendUnavailableError
from .plugin import ENTRY_POINT_GROUP, PROJECT, BackendSpec, HookSpecs, Probe

#: plugin modules shipped in the s2core distribution itself
BUILTIN_PLUGINS = ("s2core_numpy.plugin", "s2core_torch.plugin")
ENV_BACKEND = "S2CORE_BACKEND"


@dataclass(frozen=True)
class BackendInfo:
    """One row of `list_backends()`."""

    name: str
    priority: int
    available: bool
    reason: str
    capabilities: Capabilities | None
    source: str  # the plugin that registered it ("builtin:..." or "entry point NAME = VALUE")
    description: str = ""
    backend_class: str = ""
    codec_class: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "priority": self.priority, "available": self.available,
            "reason": self.reason, "source": self.source, "description": self.description,
            "codec_class": self.codec_class,
            "capabilities": self.capabilities.describe() if self.capabilities else None,
        }


class Registry:
    """All backends known in this process. `s2core` keeps one; tests may build their own."""

    def __init__(self, builtin_plugins: Iterable[str] = BUILTIN_PLUGINS,
                 entry_point_group: str | None = ENTRY_POINT_GROUP):
        self._builtin_plugins = tuple(builtin_plugins)
        self._group = entry_point_group
        self._lock = threading.Lock()
        self._specs: dict[str, tuple[BackendSpec, str]] | None = None
        self._failures: list[BackendInfo] = []
        self._probes: dict[str, BackendInfo] = {}

    # ------------------------------------------------------------------ discovery
    def _discover(self) -> dict[str, tuple[BackendSpec, str]]:
        with self._lock:
            if self._specs is None:
                self._specs, self._failures = _discover(self._builtin_plugins, self._group)
            return self._specs

    def refresh(self) -> None:
        """Forget discovery and probe results (after installing a plugin, say)."""
        with self._lock:
            self._specs = None
            self._failures = []
            self._probes = {}

    # ------------------------------------------------------------------ queries
    def list(self) -> list[BackendInfo]:
        """Every registered backend, probed, best first; failed plugins at the end."""
        rows = [self.info(name) for name in self._discover()]
        rows.sort(key=lambda r: (not r.available, -r.priority, r.name))
        return rows + list(self._failures)

    def info(self, name: str) -> BackendInfo:
        specs = self._discover()
        if name not in specs:
            known = ", ".join(sorted(specs)) or "none"
            failed = "".join(f"; plugin {f.name!r} failed to load: {f.reason}" for f in self._failures)
            raise BackendUnavailableError(f"unknown backend {name!r} (registered: {known}){failed}")
        if name not in self._probes:
            spec, source = specs[name]
            self._probes[name] = _probe(spec, source)
        return self._probes[name]

    def default(self) -> str:
        """The backend `load()` uses when none is named: $S2CORE_BACKEND, else the best available."""
        wanted = os.environ.get(ENV_BACKEND, "").strip()
        if wanted:
            info = self.info(wanted)
            if not info.available:
                raise BackendUnavailableError(
                    f"{ENV_BACKEND}={wanted!r} names a backend that is unavailable here: {info.reason}")
            return wanted
        for row in self.list():
            if row.available:
                return row.name
        reasons = "; ".join(f"{r.name}: {r.reason}" for r in self.list()) or "none registered"
        raise BackendUnavailableError(f"no backend is available ({reasons})")

    def backend_class(self, name: str) -> type[Backend]:
        """Import and return the class of an available backend (the only heavy import)."""
        info = self.info(name)
        if not info.available:
            raise BackendUnavailableError(f"backend {name!r} is unavailable here: {info.reason}")
        try:
            cls = _import_object(info.backend_class)
        except Exception as exc:
            raise BackendUnavailableError(
                f"backend {name!r}: importing {info.backend_class} failed: {exc!r}") from exc
        if not (isinstance(cls, type) and issubclass(cls, Backend)):
            raise BackendUnavailableError(
                f"backend {name!r}: {info.backend_class} is not a subclass of s2core.Backend")
        return cls

    def codec_class(self, name: str) -> type:
        """Import and return the codec class of an available backend that provides one."""
        from .codec.backend import CodecBackend
        info = self.info(name)
        if not info.available:
            raise BackendUnavailableError(f"backend {name!r} is unavailable here: {info.reason}")
        if not info.codec_class or info.capabilities is None or info.capabilities.codec is None:
            raise BackendUnavailableError(f"backend {name!r} provides no codec")
        try:
            cls = _import_object(info.codec_class)
        except Exception as exc:
            raise BackendUnavailableError(
                f"backend {name!r}: importing codec {info.codec_class} failed: {exc!r}") from exc
        if not (isinstance(cls, type) and issubclass(cls, CodecBackend)):
            raise BackendUnavailableError(
                f"backend {name!r}: {info.codec_class} is not a subclass of s2core.codec.CodecBackend")
        return cls


def _discover(builtin_plugins: tuple[str, ...], group: str | None
              ) -> tuple[dict[str, tuple[BackendSpec, str]], list[BackendInfo]]:
    pm = pluggy.PluginManager(PROJECT)
    pm.add_hookspecs(HookSpecs)
    failures: list[BackendInfo] = []

    def failed(name: str, source: str, what: str, exc: BaseException) -> None:
        failures.append(BackendInfo(name=name, priority=0, available=False,
                                    reason=f"plugin {what} failed: {exc!r}", capabilities=None,
                                    source=source))

    registered: list[tuple[Any, str]] = []  # in registration order: built-ins first

    def register(load: Any, name: str, source: str) -> None:
        try:
            plugin = load()
            pm.register(plugin, name=source)
            registered.append((plugin, source))
        except Exception as exc:
            failed(name, source, "import", exc)

    for module_name in builtin_plugins:
        register(lambda: importlib.import_module(module_name), module_name, f"builtin {module_name}")
    if group:
        for ep in importlib.metadata.entry_points(group=group):
            register(ep.load, ep.name, f"entry point {ep.name} = {ep.value}")

    specs: dict[str, tuple[BackendSpec, str]] = {}
    duplicates: list[str] = []
    for plugin, source in registered:
        others = [p for p, _ in registered if p is not plugin]
        try:
            provided = pm.subset_hook_caller("s2core_backends", remove_plugins=others)()
        except Exception as exc:
            failed(source, source, "hook s2core_backends", exc)
            continue
        for spec in (s for batch in provided for s in (batch or [])):
            if not isinstance(spec, BackendSpec):
                failed(source, source, "hook s2core_backends",
                       TypeError(f"returned {type(spec).__name__}, not BackendSpec"))
            elif spec.name in specs:
                duplicates.append(f"{spec.name!r} is registered by both {specs[spec.name][1]} "
                                  f"and {source}")
            else:
                specs[spec.name] = (spec, source)
    if duplicates:
        raise BackendRegistryError("duplicate backend names: " + "; ".join(duplicates))
    return specs, failures


def _probe(spec: BackendSpec, source: str) -> BackendInfo:
    try:
        probe = spec.probe()
        if not isinstance(probe, Probe):
            raise TypeError(f"probe returned {type(probe).__name__}, not Probe")
    except Exception as exc:
        probe = Probe(available=False, reason=f"probe raised {exc!r}")
    priority = spec.priority if probe.priority is None else probe.priority
    return BackendInfo(name=spec.name, priority=priority, available=probe.available,
                       reason=probe.reason, capabilities=probe.capabilities, source=source,
                       description=spec.description, backend_class=spec.backend_class,
                       codec_class=spec.codec_class)


def _import_object(path: str) -> Any:
    module_name, _, attr = path.partition(":")
    obj: Any = importlib.import_module(module_name)
    for part in attr.split(".") if attr else []:
        obj = getattr(obj, part)
    return obj


_REGISTRY = Registry()


def get_registry() -> Registry:
    return _REGISTRY
