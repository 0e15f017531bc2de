"""Checks on every value a plugin hands the registry: its BackendSpecs, their options, and
what its probe returns. A plugin is third-party code: a string where an int belongs, an
unknown dtype or a non-Probe answer must cost that plugin its row (listed unavailable, with
the reason), never sort orders, policies or the CLI of every user.
"""

from __future__ import annotations

import re
from typing import Any

from s2core.contract.backend import Backend, Capabilities, is_int
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


def unbacked_claims(cls: type, capabilities: Capabilities) -> list[str]:
    """Declared abilities whose methods `cls` does not implement (Backend's defaults serve one
    slot, write nothing and share nothing)."""
    claims = []
    if capabilities.writes_kv_cache:
        claims.append(("writes_kv_cache=True", ["write_kv_cache"]))
    if capabilities.max_batch_sequences > 1:
        claims.append((f"max_batch_sequences={capabilities.max_batch_sequences}",
                       ["allocate_kv_slots", "free_kv_slots", "read_kv_slot", "eval_slots",
                        "fast_decode_batch"] + (["write_kv_slot"]
                                                if capabilities.writes_kv_cache else [])))
    if capabilities.shares_kv_prefix:
        claims.append(("shares_kv_prefix=True",
                       ["add_kv_prefix", "attach_kv_prefix", "remove_kv_prefix"]))
    p = []
    for claim, methods in claims:
        missing = [m for m in methods if getattr(cls, m, None) is getattr(Backend, m)]
        if missing:
            p.append(f"{claim} but {cls.__name__} does not override {', '.join(missing)}")
    return p


def loaded_capabilities_problems(capabilities: Any, probed: Capabilities | None,
                                 cls: type | None = None) -> list[str]:
    """What is wrong with a loaded backend's `capabilities`: the probe's checks, the claim
    the probe's answer bounds (the cache type among those it offers), and abilities declared
    without the methods behind them (`cls`, the backend's class)."""
    if not isinstance(capabilities, Capabilities):
        return [f"capabilities is {type(capabilities).__name__}, not Capabilities"]
    p = capabilities.problems()
    if p:
        return p
    if cls is not None:
        p += unbacked_claims(cls, capabilities)
    if probed is None:
        return p
    if capabilities.kv_cache_dtype not in probed.supported_kv_cache_dtypes:
        p.append(f"kv_cache_dtype={capabilities.kv_cache_dtype!r} is not among the "
                 f"{probed.supported_kv_cache_dtypes} its probe offers")
    return p
