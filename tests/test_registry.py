"""Discovery, failure isolation, duplicate names, selection, and a cheap `import s2core`."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

import s2core
from s2core.errors import BackendUnavailableError
from s2core.contract.registry import Registry


@pytest.fixture
def plugin_dir(tmp_path, monkeypatch):
    """A folder on sys.path for throwaway plugin modules."""
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def make_plugin(folder, module: str, body: str) -> str:
    (folder / f"{module}.py").write_text(textwrap.dedent(body))
    return module


SPEC = """
from s2core.contract.plugin_spec import BackendSpec, Probe, hookimpl
from s2core.contract.backend import Capabilities

def probe():
    {probe}

@hookimpl
def s2core_backends():
    return [BackendSpec(name={name!r}, backend_class="s2core_numpy.backend:NumpyBackend",
                        probe=probe, priority={priority})]
"""


def spec_plugin(folder, module, name, priority=5, probe="return Probe(True, 'ok')"):
    return make_plugin(folder, module, SPEC.format(name=name, priority=priority, probe=probe))


def test_builtin_numpy_and_installed_example_are_listed():
    rows = {r.name: r for r in s2core.list_backends()}
    assert rows["numpy"].available and rows["numpy"].source == "builtin s2core_numpy.plugin"
    import importlib.util
    expected = ({"f32", "f16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q2_k", "q3_k", "q4_k",
                 "q5_k", "q6_k"} if importlib.util.find_spec("numba") else {"f32"})
    assert rows["numpy"].capabilities.native_weight_types == frozenset(expected)
    if "example" not in rows:
        pytest.skip("s2core-example not installed")
    assert rows["example"].source == "entry point example = s2core_example.plugin"
    assert rows["example"].available and rows["example"].priority == 0


def test_example_plugin_is_selectable_by_name_and_env(tiny_model, monkeypatch):
    if "example" not in {r.name for r in s2core.list_backends()}:
        pytest.skip("s2core-example not installed")
    assert s2core.load(tiny_model, backend="example").backend.name == "example"
    monkeypatch.setenv("S2CORE_BACKEND", "example")
    assert s2core.default_backend() == "example"
    assert s2core.load(tiny_model).backend.name == "example"


def test_default_is_highest_priority_available(plugin_dir):
    spec_plugin(plugin_dir, "p_low", "low", priority=1)
    spec_plugin(plugin_dir, "p_high", "high", priority=500, probe="return Probe(False, 'no device')")
    spec_plugin(plugin_dir, "p_mid", "mid", priority=200)
    reg = Registry(["s2core_numpy.plugin", "p_low", "p_high", "p_mid"], entry_point_group=None)
    names = [r.name for r in reg.list()]
    assert names == ["mid", "numpy", "low", "high"]  # unavailable last
    assert reg.default() == "mid"
    with pytest.raises(BackendUnavailableError, match="unavailable here: no device"):
        reg.backend_class("high")


def test_env_var_overrides_and_rejects_unknown_or_unavailable(plugin_dir, monkeypatch):
    spec_plugin(plugin_dir, "p_off", "off", probe="return Probe(False, 'needs a GPU')")
    reg = Registry(["s2core_numpy.plugin", "p_off"], entry_point_group=None)
    monkeypatch.setenv("S2CORE_BACKEND", "numpy")
    assert reg.default() == "numpy"
    monkeypatch.setenv("S2CORE_BACKEND", "nosuch")
    with pytest.raises(BackendUnavailableError, match=r"unknown backend 'nosuch' \(registered: numpy, off\)"):
        reg.default()
    monkeypatch.setenv("S2CORE_BACKEND", "off")
    with pytest.raises(BackendUnavailableError, match="S2CORE_BACKEND='off'.*needs a GPU"):
        reg.default()


def test_a_duplicate_name_keeps_the_first_registration_and_lists_the_second(plugin_dir):
    """A plugin claiming a taken name must not take load(backend=...) from its owner."""
    spec_plugin(plugin_dir, "p_dup", "numpy")
    reg = Registry(["s2core_numpy.plugin", "p_dup"], entry_point_group=None)
    rows = reg.list()
    assert reg.info("numpy").source == "builtin s2core_numpy.plugin"
    dup = [r for r in rows if r.source == "builtin p_dup"]
    assert len(dup) == 1 and not dup[0].available
    assert "registers backend 'numpy', which builtin s2core_numpy.plugin registered first" \
        in dup[0].reason


def test_broken_plugins_are_recorded_never_fatal(plugin_dir):
    make_plugin(plugin_dir, "p_import", "raise ImportError('needs libfoo')")
    make_plugin(plugin_dir, "p_hook", """
        from s2core.contract.plugin_spec import hookimpl
        @hookimpl
        def s2core_backends():
            raise RuntimeError('hook exploded')
        """)
    make_plugin(plugin_dir, "p_type", """
        from s2core.contract.plugin_spec import hookimpl
        @hookimpl
        def s2core_backends():
            return ["not a spec"]
        """)
    spec_plugin(plugin_dir, "p_probe", "flaky", probe="raise OSError('driver crashed')")
    spec_plugin(plugin_dir, "p_badclass", "badclass")
    reg = Registry(["s2core_numpy.plugin", "p_import", "p_hook", "p_type", "p_probe"],
                   entry_point_group=None)
    rows = {r.name: r for r in reg.list()}
    assert rows["numpy"].available
    assert "needs libfoo" in rows["p_import"].reason and not rows["p_import"].available
    assert "hook exploded" in rows["p_hook"].reason
    assert "not BackendSpec" in rows["p_type"].reason
    assert not rows["flaky"].available and "driver crashed" in rows["flaky"].reason
    assert reg.default() == "numpy"
    with pytest.raises(BackendUnavailableError, match="p_import"):
        reg.info("nosuch")


def test_backend_class_must_be_a_backend(plugin_dir):
    make_plugin(plugin_dir, "p_notbackend", """
        from s2core.contract.plugin_spec import BackendSpec, Probe, hookimpl
        @hookimpl
        def s2core_backends():
            return [BackendSpec(name="wrong", backend_class="collections:OrderedDict",
                                probe=lambda: Probe(True))]
        """)
    reg = Registry(["p_notbackend"], entry_point_group=None)
    with pytest.raises(BackendUnavailableError, match="not a subclass of s2core.Backend"):
        reg.backend_class("wrong")


def test_probes_run_lazily_and_once(plugin_dir):
    make_plugin(plugin_dir, "p_count", """
        from s2core.contract.plugin_spec import BackendSpec, Probe, hookimpl
        CALLS = []
        def probe():
            CALLS.append(1)
            return Probe(True, "counted")
        @hookimpl
        def s2core_backends():
            return [BackendSpec(name="counted", backend_class="x:y", probe=probe)]
        """)
    import p_count
    reg = Registry(["p_count"], entry_point_group=None)
    assert p_count.CALLS == []
    reg.list()
    reg.list()
    reg.info("counted")
    assert p_count.CALLS == [1]
    reg.refresh()
    reg.list()
    assert p_count.CALLS == [1, 1]


def test_import_s2core_imports_no_framework_and_runs_no_probe():
    code = ("import sys, s2core; "
            "heavy = [m for m in ('torch', 'mlx', 'mlx.core', 'matplotlib') if m in sys.modules]; "
            "print(heavy); print(s2core.contract.registry.get_registry()._specs is None)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split("\n")[:2] == ["[]", "True"]
