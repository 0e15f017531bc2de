"""Backend discovery (pluggy), probing, listing, option checks and backend classes.

Built-in backends register through the same hook as third parties; third parties through the
entry point group `s2core.backends`, or, while developing, through $S2CORE_PLUGINS (module
names, comma-separated). Discovery and probes run lazily on first use, never at
`import s2core`.

A plugin is third-party code and is treated as such: whatever fails or misbehaves at import,
in its hook, in its probe or in the values it returns (s2core/contract/checks.py) is recorded as
a row with the reason and shown as unavailable; it never takes down list_backends(), the CLI
or another backend's load(). Exceptions of any kind are caught there (SystemExit included;
KeyboardInterrupt is the user's and passes). Probes run side by side in worker threads under
one time limit (PROBE_TIMEOUT_S, $S2CORE_PROBE_TIMEOUT), so a hanging probe costs at most that,
once per process, and nothing to a command that names another backend: info(name) and
load(backend=name) probe that backend only. A name registered twice keeps its
first registration (built-ins first); the second is listed as the failure.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import pluggy

from s2core.contract.backend import Backend, Capabilities
from s2core.errors import BackendUnavailableError, InvalidInputError
from s2core.contract.plugin_spec import ENTRY_POINT_GROUP, PROJECT, BackendSpec, HookSpecs, Option, Probe
from s2core.contract.checks import probe_problems, short, spec_problems

#: plugin modules shipped in the s2core distribution itself
BUILTIN_PLUGINS = ("s2core_numpy.plugin", "s2core_torch.plugin")
ENV_BACKEND = "S2CORE_BACKEND"
#: extra plugin modules to register without installing them (comma-separated)
ENV_PLUGINS = "S2CORE_PLUGINS"
ENV_PROBE_TIMEOUT = "S2CORE_PROBE_TIMEOUT"
#: seconds every probe together may take; a probe still running then is listed unavailable
PROBE_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class BackendInfo:
    """One row of `list_backends()`."""

    name: str
    priority: int
    available: bool
    reason: str
    capabilities: Capabilities | None
    source: str  # the plugin that registered it ("builtin ...", "entry point ...", "env ...")
    description: str = ""
    backend_class: str = ""
    #: the keyword options load() accepts for this backend
    options: tuple[Option, ...] = ()
    codec_class: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "priority": self.priority, "available": self.available,
            "reason": self.reason, "source": self.source, "description": self.description,
            "codec_class": self.codec_class,
            "capabilities": self.capabilities.describe() if self.capabilities else None,
            "options": {o.name: {"allowed": o.allowed(), "default": repr(o.default),
                                 "doc": o.doc} for o in self.options},
        }


def _reraise_interrupt(exc: BaseException) -> None:
    """Plugins may raise anything, SystemExit included; only the user's ^C gets through."""
    if isinstance(exc, KeyboardInterrupt):
        raise exc


class Registry:
    """All backends known in this process. `s2core` keeps one; tests may build their own."""

    def __init__(self, builtin_plugins: Iterable[str] = BUILTIN_PLUGINS,
                 entry_point_group: str | None = ENTRY_POINT_GROUP,
                 env_plugins: bool = True, probe_timeout: float | None = None):
        self._builtin_plugins = tuple(builtin_plugins)
        self._group = entry_point_group
        self._env_plugins = env_plugins
        self._probe_timeout = probe_timeout
        self._lock = threading.Lock()
        self._specs: dict[str, tuple[BackendSpec, str]] | None = None
        self._failures: list[BackendInfo] = []
        self._probes: dict[str, BackendInfo] = {}
        self._classes: dict[str, type[Backend] | BackendUnavailableError] = {}

    @property
    def probe_timeout(self) -> float:
        if self._probe_timeout is not None:
            return self._probe_timeout
        try:
            return float(os.environ.get(ENV_PROBE_TIMEOUT, "") or PROBE_TIMEOUT_S)
        except ValueError:
            return PROBE_TIMEOUT_S

    # ------------------------------------------------------------------ discovery
    def _discover(self) -> dict[str, tuple[BackendSpec, str]]:
        with self._lock:
            if self._specs is None:
                env = os.environ.get(ENV_PLUGINS, "") if self._env_plugins else ""
                extra = tuple(m.strip() for m in env.split(",") if m.strip())
                self._specs, self._failures = _discover(self._builtin_plugins, self._group, extra)
            return self._specs

    def refresh(self) -> None:
        """Forget discovery, probe and import results (after installing a plugin, say)."""
        with self._lock:
            self._specs = None
            self._failures = []
            self._probes = {}
            self._classes = {}

    # ------------------------------------------------------------------ queries
    def list(self, on_row: Callable[[BackendInfo], None] | None = None) -> list[BackendInfo]:
        """Every registered backend, probed, best first; failed plugins at the end.
        `on_row(row)` is called for each row as its probe answers (at once for rows probed
        before), a slow probe's when its time is up: a caller can show the others first."""
        specs = self._discover()
        self._probe_all(list(specs), on_row)
        rows = [self._probes[name] for name in specs]
        rows.sort(key=lambda r: (not r.available, -r.priority, r.name))
        return rows + list(self._failures)

    def info(self, name: str) -> BackendInfo:
        specs = self._discover()
        if not isinstance(name, str) or name not in specs:
            known = ", ".join(sorted(specs)) or "none"
            failed = "".join(f"; plugin {f.name!r} failed to load: {f.reason}"
                             for f in self._failures[:5])
            raise BackendUnavailableError(
                f"unknown backend {short(name)} (registered: {known}){failed}")
        self._probe_all([name])
        return self._probes[name]

    def _probe_all(self, names: list[str],
                   on_row: Callable[[BackendInfo], None] | None = None) -> None:
        """Probe every name not probed yet, side by side, each in a daemon thread: all of them
        together wait at most `probe_timeout` seconds, once per registry (a hung probe's
        thread is left behind; its row says it timed out). Rows are recorded, and passed to
        `on_row`, in the order their probes answer."""
        for name in names:
            if name in self._probes and on_row is not None:
                on_row(self._probes[name])
        pending = [n for n in names if n not in self._probes]
        if not pending:
            return
        specs = self._discover()
        answered: queue.Queue = queue.Queue()
        for name in pending:
            spec, _ = specs[name]
            thread = threading.Thread(target=_run_probe, args=(spec, answered, name),
                                      daemon=True, name=f"s2core-probe-{name}")
            thread.start()
        timeout = self.probe_timeout
        deadline = time.monotonic() + timeout
        waiting = set(pending)
        while waiting:
            try:
                name, probe, failed = answered.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            self._record(specs, name, probe, failed, on_row)
            waiting.discard(name)
        for name in pending:  # in the order asked: the ones still running
            if name in waiting:
                self._record(specs, name, Probe(
                    False, f"probe timed out: did not answer within {timeout:g} s "
                           f"(${ENV_PROBE_TIMEOUT} sets the limit)"), True, on_row)

    def _record(self, specs: dict[str, tuple[BackendSpec, str]], name: str, probe: Probe,
                failed: bool, on_row: Callable[[BackendInfo], None] | None) -> None:
        spec, source = specs[name]
        self._probes[name] = _row(spec, source, probe, trusted=not failed)
        if on_row is not None:
            on_row(self._probes[name])

    def default(self) -> str:
        """$S2CORE_BACKEND if set, else the available backend of highest priority (load()
        also weighs the file's bytes: `s2core.default_backend(path)` says what it picks)."""
        wanted = os.environ.get(ENV_BACKEND, "").strip()
        if wanted:
            info = self.info(wanted)
            if not info.available:
                raise BackendUnavailableError(
                    f"{ENV_BACKEND}={wanted!r} names a backend that is unavailable here: {info.reason}")
            return wanted
        rows = self.list()
        for row in rows:
            if row.available:
                return row.name
        reasons = "; ".join(f"{r.name}: {r.reason}" for r in rows) or "none registered"
        raise BackendUnavailableError(f"no backend is available ({reasons})")

    def check_options(self, name: str, options: dict[str, Any]) -> None:
        """Refuse option names the backend does not declare and values its schema refuses,
        before its module is imported (InvalidInputError naming the option)."""
        declared = {o.name: o for o in self.info(name).options}
        for key, value in options.items():
            option = declared.get(key)
            if option is None:
                known = ", ".join(sorted(declared)) or "none"
                raise InvalidInputError(
                    "unknown_option", f"backend {name!r} has no option {short(key)} "
                    f"(its options: {known})")
            option.check(value)

    def backend_class(self, name: str) -> type[Backend]:
        """Import and return the class of an available backend (the only heavy import).
        The outcome is remembered, so a failing import is tried once per registry."""
        info = self.info(name)
        if not info.available:
            raise BackendUnavailableError(f"backend {name!r} is unavailable here: {info.reason}")
        if name not in self._classes:
            self._classes[name] = _import_backend(name, info.backend_class)
        outcome = self._classes[name]
        if isinstance(outcome, BackendUnavailableError):
            raise outcome
        return outcome

    def codec_class(self, name: str) -> type:
        """Import and return the codec class of an available backend that provides one."""
        from s2core.codec.backend import CodecBackend
        info = self.info(name)
        if not info.available:
            raise BackendUnavailableError(f"backend {name!r} is unavailable here: {info.reason}")
        if not info.codec_class or info.capabilities is None or info.capabilities.codec is None:
            raise BackendUnavailableError(f"backend {name!r} provides no codec")
        try:
            cls = _import_object(info.codec_class)
        except BaseException as exc:
            _reraise_interrupt(exc)
            raise BackendUnavailableError(
                f"backend {name!r}: importing codec {info.codec_class} failed: {exc!r}") from exc
        if not (isinstance(cls, type) and issubclass(cls, CodecBackend)):
            raise BackendUnavailableError(
                f"backend {name!r}: {info.codec_class} is not a subclass of s2core.codec.CodecBackend")
        return cls


def _import_backend(name: str, path: str) -> type[Backend] | BackendUnavailableError:
    try:
        cls = _import_object(path)
    except BaseException as exc:
        _reraise_interrupt(exc)
        return BackendUnavailableError(f"backend {name!r}: importing {path} failed: {exc!r}")
    if not (isinstance(cls, type) and issubclass(cls, Backend)):
        return BackendUnavailableError(
            f"backend {name!r}: {path} is not a subclass of s2core.Backend")
    return cls


def _discover(builtin_plugins: tuple[str, ...], group: str | None, env_plugins: tuple[str, ...]
              ) -> tuple[dict[str, tuple[BackendSpec, str]], list[BackendInfo]]:
    pm = pluggy.PluginManager(PROJECT)
    pm.add_hookspecs(HookSpecs)
    failures: list[BackendInfo] = []

    def failed(name: str, source: str, reason: str) -> None:
        failures.append(BackendInfo(name=name, priority=0, available=False, reason=reason,
                                    capabilities=None, source=source))

    registered: list[tuple[Any, str, str]] = []  # (plugin, source, name), built-ins first

    def register(load: Any, name: str, source: str) -> None:
        try:
            plugin = load()
            if pm.is_registered(plugin):
                return  # the same module named twice (an entry point and $S2CORE_PLUGINS)
            pm.register(plugin, name=source)
            registered.append((plugin, source, name))
        except BaseException as exc:
            _reraise_interrupt(exc)
            failed(name, source, f"plugin import failed: {exc!r}")

    for module_name in builtin_plugins:
        register(lambda: importlib.import_module(module_name), module_name, f"builtin {module_name}")
    if group:
        try:
            entry_points = list(importlib.metadata.entry_points(group=group))
        except BaseException as exc:  # broken package metadata in the environment
            _reraise_interrupt(exc)
            entry_points = []
            failed(group, f"entry point group {group}", f"listing entry points failed: {exc!r}")
        for ep in entry_points:
            register(ep.load, ep.name, f"entry point {ep.name} = {ep.value}")
    for module_name in env_plugins:
        register(lambda: importlib.import_module(module_name), module_name,
                 f"env {ENV_PLUGINS} {module_name}")

    specs: dict[str, tuple[BackendSpec, str]] = {}
    for plugin, source, plugin_name in registered:
        others = [p for p, _, _ in registered if p is not plugin]
        try:
            batches = pm.subset_hook_caller("s2core_backends", remove_plugins=others)()
        except BaseException as exc:
            _reraise_interrupt(exc)
            failed(plugin_name, source, f"plugin hook s2core_backends failed: {exc!r}")
            continue
        for batch in batches:
            if batch is None:
                continue
            if not isinstance(batch, (list, tuple)):
                failed(plugin_name, source, f"plugin hook s2core_backends returned "
                                       f"{type(batch).__name__} {short(batch)}, not a list of "
                                       "BackendSpec")
                continue
            for spec in batch:
                problems = spec_problems(spec)
                if problems:
                    label = getattr(spec, "name", None)
                    what = f"backend spec {short(label)}" if isinstance(spec, BackendSpec) \
                        else "plugin hook s2core_backends"
                    failed(plugin_name, source, f"{what} is invalid: " + "; ".join(problems))
                elif spec.name in specs:
                    failed(plugin_name, source,
                           f"registers backend {spec.name!r}, which {specs[spec.name][1]} "
                           "registered first; ignored")
                else:
                    specs[spec.name] = (spec, source)
    return specs, failures


def _run_probe(spec: BackendSpec, answered: "queue.Queue", name: str) -> None:
    """A worker thread's body: puts (name, the probe's answer, False), or (name, an
    unavailable Probe saying why, True)."""
    failed = True
    try:
        probe = spec.probe()
        problems = probe_problems(probe)
        if problems:
            probe = Probe(False, "probe returned an invalid answer: " + "; ".join(problems))
        else:
            failed = False
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt):
            exc = RuntimeError("KeyboardInterrupt in the probe's thread")
        probe = Probe(available=False, reason=f"probe raised {exc!r}")
    answered.put((name, probe, failed))


def _row(spec: BackendSpec, source: str, probe: Probe, trusted: bool) -> BackendInfo:
    """A probed row; a failed probe's row carries no capabilities (nothing to plan with)."""
    priority = spec.priority if probe.priority is None else probe.priority
    return BackendInfo(name=spec.name, priority=priority, available=probe.available,
                       reason=probe.reason,
                       capabilities=probe.capabilities if trusted else None, source=source,
                       description=spec.description, backend_class=spec.backend_class,
                       options=spec.options, codec_class=spec.codec_class)


def _import_object(path: str) -> Any:
    module_name, _, attr = path.partition(":")
    obj: Any = importlib.import_module(module_name)
    for part in attr.split(".") if attr else []:
        obj = getattr(obj, part)
    return obj


_REGISTRY = Registry()


def get_registry() -> Registry:
    return _REGISTRY
