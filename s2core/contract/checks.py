"""Checks on every value a plugin hands the registry: its BackendSpecs, their options, and
what its probe returns. A plugin is third-party code: a string where an int belongs, an
unknown dtype or a non-Probe answer must cost that plugin its row (listed unavailable, with
the reason), never sort orders, policies or the CLI of every user.
"""

from __future__ import annotations

import re
from typing import Any

from s2core.contract.backend import Capabilities, is_int
from s2core.contract.plugin_spec import BackendSpec, Option, Probe

#: backend names: what users type in load(backend=...) and $S2CORE_BACKEND
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]{0,63}$")
#: "package.module:Class" (attribute path after the colon)
CLASS_PATTERN = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")
OPTION_PATTERN = re.compile(r"^[A-Za-z_]\w*$")


def short(value: Any, width: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= width else text[:width - 3] + "..."


def spec_problems(spec: Any) -> list[str]:
    """What is wrong with one element of a plugin's s2core_backends() answer."""
    if not isinstance(spec, BackendSpec):
        return [f"returned {type(spec).__name__} {short(spec)}, not BackendSpec"]
    p = []
    if not (isinstance(spec.name, str) and NAME_PATTERN.match(spec.name)):
        p.append(f"name {short(spec.name)} is not 1-64 letters, digits or _.+- "
                 "(starting with a letter or digit)")
    if not (isinstance(spec.backend_class, str) and CLASS_PATTERN.match(spec.backend_class)):
        p.append(f"backend_class {short(spec.backend_class)} is not 'module:Class'")
    codec = getattr(spec, "codec_class", "")
    if not (codec == "" or (isinstance(codec, str) and CLASS_PATTERN.match(codec))):
        p.append(f"codec_class {short(codec)} is not '' or 'module:Class'")
    if not callable(spec.probe):
        p.append(f"probe {short(spec.probe)} is not callable")
    if not is_int(spec.priority):
        p.append(f"priority {short(spec.priority)} is not an int")
    if not isinstance(spec.description, str):
        p.append(f"description {short(spec.description)} is not a str")
    if not isinstance(spec.options, tuple):
        p.append(f"options {short(spec.options)} is not a tuple of Option")
    else:
        seen = set()
        for opt in spec.options:
            p += option_problems(opt)
            name = getattr(opt, "name", None)
            if name in seen:
                p.append(f"option {short(name)} is declared twice")
            seen.add(name)
    return p


def option_problems(opt: Any) -> list[str]:
    if not isinstance(opt, Option):
        return [f"option {short(opt)} is not an s2core.contract.plugin_spec.Option"]
    p = []
    if not (isinstance(opt.name, str) and OPTION_PATTERN.match(opt.name)):
        p.append(f"option name {short(opt.name)} is not a Python identifier")
    if (opt.choices is None) == (opt.accepts is None):
        p.append(f"option {short(opt.name)} needs exactly one of choices and accepts")
    elif opt.choices is not None and not (isinstance(opt.choices, tuple) and opt.choices):
        p.append(f"option {short(opt.name)}: choices {short(opt.choices)} is not a non-empty tuple")
    elif opt.accepts is not None and not (callable(opt.accepts) and isinstance(opt.values, str)
                                          and opt.values):
        p.append(f"option {short(opt.name)}: accepts needs a callable and `values` in words")
    if not isinstance(opt.doc, str):
        p.append(f"option {short(opt.name)}: doc is not a str")
    if not p:
        try:
            opt.check(opt.default)
        except Exception:
            p.append(f"option {opt.name}: its default {short(opt.default)} is not accepted by "
                     "its own schema")
    return p


def probe_problems(probe: Any) -> list[str]:
    """What is wrong with a probe's answer."""
    if not isinstance(probe, Probe):
        return [f"probe returned {type(probe).__name__} {short(probe)}, not Probe"]
    p = []
    if not isinstance(probe.available, bool):
        p.append(f"available={short(probe.available)} is not a bool")
    if not isinstance(probe.reason, str):
        p.append(f"reason={short(probe.reason)} is not a str")
    if not (probe.priority is None or is_int(probe.priority)):
        p.append(f"priority={short(probe.priority)} is not None or an int")
    if not isinstance(probe.capabilities, Capabilities):
        p.append(f"capabilities is {type(probe.capabilities).__name__}, not Capabilities")
    else:
        p += probe.capabilities.problems()
    return p
