"""A broken plugin costs only its own row: every value it returns is validated, anything it
raises (SystemExit too) is caught, a slow probe is cut off, an import failure of the chosen
backend falls back to the next, and declared options are checked by the core.

Broken plugins are real modules registered the way a developer would, through
$S2CORE_PLUGINS, into the process-wide registry that load() and the CLI use.
"""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
import textwrap
import time
import warnings

import pytest

import s2core
from s2core import BackendUnavailableError, InvalidInputError
from s2core.runtime.loading import BackendFallbackWarning
from s2core.contract.registry import ENV_PLUGINS, Registry, get_registry

HEADER = """
from s2core.contract.backend import Capabilities
from s2core.contract.plugin_spec import BackendSpec, Option, Probe, hookimpl
NUMPY = "s2core_numpy.backend:NumpyBackend"
def ok_probe():
    return Probe(True, "ok", Capabilities(kv_cache_dtype="f32", native_weight_types=frozenset({"f32"})))
"""

#: name -> (plugin body, a fragment of the reason its row must show)
BROKEN = {
    "unknown_dtype": ("""
        import dataclasses
        def probe():
            caps = Capabilities()
            object.__setattr__(caps, "compute_dtype", "f8")  # past the constructor's check
            return Probe(True, "ok", caps)
        @hookimpl
        def s2core_backends():
            return [BackendSpec("unknown_dtype", NUMPY, probe)]
        """, "compute_dtype='f8' is not one of"),
    "bad_caps_ctor": ("""
        def probe():
            return Probe(True, "ok", Capabilities(kv_cache_dtype="f8"))
        @hookimpl
        def s2core_backends():
            return [BackendSpec("bad_caps_ctor", NUMPY, probe)]
        """, "kv_cache_dtype='f8' is not one of"),
    "string_priority": ("""
        @hookimpl
        def s2core_backends():
            return [BackendSpec("string_priority", NUMPY, ok_probe, priority="high")]
        """, "priority 'high' is not an int"),
    "probe_string_priority": ("""
        def probe():
            return Probe(True, "ok", Capabilities(), priority="999")
        @hookimpl
        def s2core_backends():
            return [BackendSpec("probe_string_priority", NUMPY, probe)]
        """, "priority='999' is not None or an int"),
    "not_capabilities": ("""
        def probe():
            return Probe(True, "ok", {"device": "cpu"})
        @hookimpl
        def s2core_backends():
            return [BackendSpec("not_capabilities", NUMPY, probe)]
        """, "capabilities is dict, not Capabilities"),
    "probe_returns_dict": ("""
        @hookimpl
        def s2core_backends():
            return [BackendSpec("probe_returns_dict", NUMPY, lambda: {"available": True})]
        """, "probe returned dict"),
    "hook_returns_string": ("""
        @hookimpl
        def s2core_backends():
            return "numpy-ish"
        """, "returned str 'numpy-ish', not a list of BackendSpec"),
    "exit_at_import": ("""
        raise SystemExit(3)
        """, "SystemExit(3)"),
    "exit_in_hook": ("""
        @hookimpl
        def s2core_backends():
            raise SystemExit("bye")
        """, "SystemExit('bye')"),
    "exit_in_probe": ("""
        def probe():
            raise SystemExit(4)
        @hookimpl
        def s2core_backends():
            return [BackendSpec("exit_in_probe", NUMPY, probe)]
        """, "probe raised SystemExit(4)"),
    "bad_name": ("""
        @hookimpl
        def s2core_backends():
            return [BackendSpec("has space", NUMPY, ok_probe)]
        """, "name 'has space' is not"),
    "bad_class_path": ("""
        @hookimpl
        def s2core_backends():
            return [BackendSpec("bad_class_path", "no colon here", ok_probe)]
        """, "backend_class 'no colon here' is not 'module:Class'"),
    "bad_option_default": ("""
        @hookimpl
        def s2core_backends():
            return [BackendSpec("bad_option_default", NUMPY, ok_probe,
                                options=(Option("kv_cache_dtype", choices=("f16",), default="f32"),))]
        """, "its default 'f32' is not accepted"),
    "options_not_tuple": ("""
        @hookimpl
        def s2core_backends():
            return [BackendSpec("options_not_tuple", NUMPY, ok_probe, options=["kv_cache_dtype"])]
        """, "is not a tuple of Option"),
}


def write_module(folder, name: str, body: str) -> str:
    (folder / f"{name}.py").write_text(HEADER + textwrap.dedent(body))
    return name


@pytest.fixture
def use_plugins(tmp_path, monkeypatch):
    """use_plugins(name -> body): register modules through $S2CORE_PLUGINS in the process's
    own registry (and in subprocesses, through the environment), forgotten afterwards."""
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path) + os.pathsep + os.environ.get("PYTHONPATH", ""))

    def use(modules: dict[str, str]) -> None:
        for name, body in modules.items():
            write_module(tmp_path, name, body)
        monkeypatch.setenv(ENV_PLUGINS, ",".join(modules))
        get_registry().refresh()
    yield use
    get_registry().refresh()


def test_every_broken_plugin_is_a_row_and_breaks_nothing_else(use_plugins, tiny_model):
    use_plugins({f"broken_{k}": body for k, (body, _) in BROKEN.items()})
    rows = s2core.list_backends()
    by_source = {}
    for r in rows:
        by_source.setdefault(r.source.rsplit(" ", 1)[-1], []).append(r)
    for key, (_, reason) in BROKEN.items():
        (row,) = by_source[f"broken_{key}"]  # listed once, whatever it returned
        assert not row.available and reason in row.reason, (key, row.reason)
        assert row.capabilities is None
    # the healthy backends are untouched, and so is everything that reads the rows
    assert {"numpy", "torch"} <= {r.name for r in rows if r.available}
    assert s2core.default_backend() in {r.name for r in rows if r.available}
    assert s2core.load(tiny_model, backend="numpy").backend.name == "numpy"
    assert s2core.load(tiny_model).backend.name == s2core.default_backend(tiny_model)
    for args in (["backends"], ["backends", "--json"], ["info", str(tiny_model)]):
        run = subprocess.run([sys.executable, "-m", "s2core.cli", *args], capture_output=True,
                             text=True, timeout=300)
        assert run.returncode == 0, (args, run.stderr[-2000:])
        assert "Traceback" not in run.stderr


def test_the_cli_lists_broken_plugins_with_their_reason(use_plugins):
    use_plugins({"broken_exit_at_import": BROKEN["exit_at_import"][0],
                 "broken_string_priority": BROKEN["string_priority"][0]})
    run = subprocess.run([sys.executable, "-m", "s2core.cli", "backends"], capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert "SystemExit(3)" in run.stdout and "priority 'high' is not an int" in run.stdout


def test_a_slow_probe_is_cut_off_and_listed(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    write_module(tmp_path, "p_slow", """
        import time
        def probe():
            time.sleep(60)
            return Probe(True, "late")
        @hookimpl
        def s2core_backends():
            return [BackendSpec("slow", NUMPY, probe, priority=1000)]
        """)
    reg = Registry(["s2core_numpy.plugin", "p_slow"], entry_point_group=None,
                   env_plugins=False, probe_timeout=0.5)
    start = time.monotonic()
    rows = {r.name: r for r in reg.list()}
    assert time.monotonic() - start < 5
    assert not rows["slow"].available
    assert "did not answer within 0.5 s" in rows["slow"].reason
    assert rows["numpy"].available and reg.default() == "numpy"


GHOST = """
def probe():
    # maps everything in place and outranks every CPU backend: selection's first choice
    return Probe(True, "ok", Capabilities(kv_cache_dtype="f32", supported_kv_cache_dtypes=("f32",),
                 native_weight_types=frozenset({"f32"}), mapped_weight_types=frozenset({"f32"})),
                 priority=1000)
@hookimpl
def s2core_backends():
    return [BackendSpec("ghost", "s2core_no_such_module.backend:Ghost", probe)]
"""


def test_auto_load_falls_back_past_a_backend_whose_class_fails_to_import(use_plugins,
                                                                        tiny_model):
    use_plugins({"p_ghost": GHOST})
    assert s2core.list_backends()[0].name == "ghost"
    with pytest.warns(BackendFallbackWarning, match="importing s2core_no_such_module.*failed"):
        m = s2core.load(tiny_model)
    assert m.backend.name != "ghost"
    assert s2core.default_backend(tiny_model) == m.backend.name
    with pytest.raises(BackendUnavailableError, match="s2core_no_such_module"):
        s2core.load(tiny_model, backend="ghost")  # a named backend is never replaced


@pytest.mark.parametrize("weight_type", ["f32", "f16", "q8_0", "q4_k"])
def test_default_backend_of_a_path_is_what_load_picks(tmp_path, weight_type):
    from dataclasses import replace
    from s2core.embedded.writer import tiny_hparams, write_model
    hp = replace(tiny_hparams(), dim=256, ffn=256, head_dim=64,
                 fast=replace(tiny_hparams().fast, dim=256, ffn=256))
    path = write_model(tmp_path / f"m-{weight_type}.gguf", hp, weight_type).path
    assert s2core.default_backend(path) == s2core.load(path).backend.name


# ---------------------------------------------------------------------- options
MARKER = """
import os
os.environ["S2CORE_TEST_MARKER_IMPORTED"] = "1"
from s2core_numpy.backend import NumpyBackend as Marked
"""


def test_options_are_checked_before_the_backend_is_imported(use_plugins, tiny_model,
                                                            monkeypatch, tmp_path):
    (tmp_path / "p_marker_backend.py").write_text(MARKER)
    use_plugins({"p_marker": """
        @hookimpl
        def s2core_backends():
            return [BackendSpec("marker", "p_marker_backend:Marked", ok_probe, options=(
                Option("kv_cache_dtype", choices=("f16", "f32"), default="f16"),))]
        """})
    monkeypatch.delenv("S2CORE_TEST_MARKER_IMPORTED", raising=False)
    with pytest.raises(InvalidInputError) as info:
        s2core.load(tiny_model, backend="marker", kv_cache_dtpye="f32")  # a typo
    assert info.value.check == "unknown_option"
    assert "no option 'kv_cache_dtpye' (its options: kv_cache_dtype)" in str(info.value)
    with pytest.raises(InvalidInputError) as info:
        s2core.load(tiny_model, backend="marker", kv_cache_dtype="f8")
    assert info.value.check == "kv_cache_dtype" and "'f16' | 'f32'" in str(info.value)
    assert "S2CORE_TEST_MARKER_IMPORTED" not in os.environ
    assert s2core.load(tiny_model, backend="marker", kv_cache_dtype="f32").backend.name == "numpy"


@pytest.mark.parametrize("options,check", [
    ({"kv_cache_dtype": "f8"}, "kv_cache_dtype"),
    ({"kv_cache_dtype": None}, "kv_cache_dtype"),
    ({"numba_kernels": 1}, "numba_kernels"),       # an int is not a bool
    ({"numba_kernels": "yes"}, "numba_kernels"),
    ({"device": "cuda"}, "unknown_option"),        # a torch option, not numpy's
    ({"kv_cache_dtype": ["f16"]}, "kv_cache_dtype"),
])
def test_bad_numpy_options_are_named(tiny_model, options, check):
    with pytest.raises(InvalidInputError) as info:
        s2core.load(tiny_model, backend="numpy", **options)
    assert info.value.check == check


@pytest.mark.parametrize("device", ["gpu", "cuda:x", 0, ["cpu"]])
def test_bad_torch_devices_are_refused_before_torch_is_imported(tiny_model, device):
    if not get_registry().info("torch").available:
        pytest.skip("torch not installed")
    with pytest.raises(InvalidInputError) as info:
        s2core.load(tiny_model, backend="torch", device=device)
    assert info.value.check == "device"


def test_declared_options_match_each_backend_class(tiny_model):
    """A schema that drifted from the class would refuse what the class takes, or let through
    what it does not: every built-in's declared names and defaults are its __init__'s."""
    checked = 0
    for row in s2core.list_backends():
        if not row.available or not row.backend_class:
            continue
        cls = get_registry().backend_class(row.name)
        params = {n: p.default for n, p in inspect.signature(cls.__init__).parameters.items()
                  if n not in ("self", "model_file") and p.kind is p.POSITIONAL_OR_KEYWORD}
        declared = {o.name: o.default for o in row.options}
        assert declared == params, row.name
        checked += 1
    assert checked >= 2


@pytest.mark.parametrize("bad", [3, ["numpy"], b"numpy"])
def test_load_with_a_non_string_backend_is_an_input_error(tiny_model, bad):
    with pytest.raises(InvalidInputError) as info:
        s2core.load(tiny_model, backend=bad)
    assert info.value.check == "backend_type"


def test_registry_rows_show_options(tiny_model):
    row = get_registry().info("numpy")
    assert [o.name for o in row.options] == ["kv_cache_dtype", "numba_kernels", "arithmetic"]
    assert row.as_dict()["options"]["kv_cache_dtype"]["allowed"] == "'f16' | 'f32'"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        s2core.load(tiny_model, backend="numpy", kv_cache_dtype="f32", numba_kernels=False)
