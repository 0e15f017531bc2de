"""What a backend plugin author imports: the hook markers, `BackendSpec` and `Probe`.

A plugin is a module (named by an entry point in the group `s2core.backends`) that implements
one hook:

    from s2core.plugin import BackendSpec, Probe, hookimpl

    @hookimpl
    def s2core_backends():
        return [BackendSpec(name="mine", backend_class="my_pkg.backend:MyBackend",
                            probe=my_cheap_probe, priority=10)]

The module must stay cheap to import: the heavy framework is imported only by
`backend_class`, and only when that backend is chosen.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import pluggy

from .backend import Capabilities

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
    #: "module:Class" of its s2core.codec.CodecBackend, imported only when chosen; "" = none.
    #: The probe's Capabilities.codec declares what it is.
    codec_class: str = ""


class HookSpecs:
    """The hooks s2core calls on plugins."""

    @hookspec
    def s2core_backends(self) -> list[BackendSpec]:  # type: ignore[empty-body]
        """Return the backends this plugin provides."""
