"""What a backend plugin author imports: the hook markers, `BackendSpec` and `Probe`.

A plugin is a module (named by an entry point in the group `s2core.backends`) that implements
one hook:

    from s2core.contract.plugin_spec import BackendSpec, Probe, hookimpl

    @hookimpl
    def s2core_backends():
        return [BackendSpec(name="mine", backend_class="my_pkg.backend:MyBackend",
                            probe=my_cheap_probe, priority=10,
                            options=(Option("kv_cache_dtype", choices=("f16", "f32"),
                                            default="f16", doc="type of the KV cache"),))]

The module must stay cheap to import: the heavy framework is imported only by
`backend_class`, and only when that backend is chosen. Every value a plugin hands over is
validated by the registry (s2core/contract/checks.py); one that is not what these classes say
leaves that backend listed as unavailable with the reason, never breaks the host.

While developing, a plugin module need not be installed: S2CORE_PLUGINS="my_pkg.plugin"
(comma-separated module names) registers it at discovery, like pytest's -p.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import pluggy

from s2core.contract.backend import Capabilities
from s2core.errors import InvalidInputError

PROJECT = "s2core"
ENTRY_POINT_GROUP = "s2core.backends"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@dataclass(frozen=True)
class Probe:
    """A probe's answer: can this backend run here, why not, and what it would be."""

    available: bool
    reason: str = ""
    capabilities: Capabilities = field(default_factory=Capabilities)
    #: replaces the spec's priority when set (MLX: high on Metal, low on a CPU build)
    priority: int | None = None


def same_value(a: Any, b: Any) -> bool:
    """a == b with types kept apart: True is not 1, 1 is not 1.0, a string is any str."""
    if isinstance(a, str) and isinstance(b, str):
        return a == b
    if type(a) is not type(b):
        return False
    try:
        return bool(a == b)
    except Exception:  # an array's elementwise ==, or an object whose == raises
        return False


@dataclass(frozen=True)
class Option:
    """One keyword option a backend takes in `s2core.load(path, backend=..., **options)`.

    The core checks every option against the chosen backend's declared options before the
    backend's module is imported: an unknown name or a value outside `choices` (or refused by
    `accepts`) is an InvalidInputError naming the option. Give `choices` (the allowed values,
    compared with their types: True is not 1) or `accepts` (a predicate, for open-ended
    values such as a device name) with `values` saying in words what it accepts. `default`
    and `doc` are what `s2core backends` and the docs show; the backend's own keyword default
    is what applies (the kit checks that the two agree)."""

    name: str
    choices: tuple[Any, ...] | None = None
    accepts: Callable[[Any], bool] | None = None
    values: str = ""
    default: Any = None
    doc: str = ""

    def allowed(self) -> str:
        """The accepted values in words."""
        if self.choices is not None:
            return " | ".join(repr(c) for c in self.choices)
        return self.values

    def check(self, value: Any) -> None:
        """Raise InvalidInputError (check = the option's name) unless `value` is accepted."""
        if self.choices is not None:
            ok = any(same_value(value, c) for c in self.choices)
        else:
            try:
                ok = bool(self.accepts(value))
            except Exception:
                ok = False
        if not ok:
            shown = repr(value)
            shown = shown if len(shown) <= 60 else shown[:57] + "..."
            raise InvalidInputError(self.name, f"{self.name}={shown} is not accepted; "
                                               f"allowed: {self.allowed()}")


@dataclass(frozen=True)
class BackendSpec:
    """A backend as the registry knows it before anything heavy is imported."""

    name: str
    #: "module:Class", imported only when the backend is chosen
    backend_class: str
    #: cheap availability check; runs lazily, once per registry
    probe: Callable[[], Probe]
    priority: int = 0
    description: str = ""
    #: the keyword options the backend's class takes; any other name is refused by the core
    options: tuple[Option, ...] = ()
    #: "module:Class" of its s2core.codec.CodecBackend, imported only when chosen; "" = none.
    #: The probe's Capabilities.codec declares what it is.
    codec_class: str = ""


class HookSpecs:
    """The hooks s2core calls on plugins."""

    @hookspec
    def s2core_backends(self) -> list[BackendSpec]:  # type: ignore[empty-body]
        """Return the backends this plugin provides."""
