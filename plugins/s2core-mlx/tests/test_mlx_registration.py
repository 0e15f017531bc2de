"""s2core-mlx registers as a third party does: through the entry point group, cheaply."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys

import pytest

import s2core
from s2core.plugin import ENTRY_POINT_GROUP
from s2core.kit import Registry

plugin = pytest.importorskip("s2core_mlx.plugin", reason="the s2core-mlx plugin is not installed "
                             "(pip install ./plugins/s2core-mlx)")

EXPECTED_SOURCE = "entry point mlx = s2core_mlx.plugin"


def run_python(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_entry_point_is_declared():
    eps = importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
    assert [ep.value for ep in eps if ep.name == "mlx"] == ["s2core_mlx.plugin"]


def test_list_backends_shows_mlx_from_its_entry_point():
    rows = {r.name: r for r in s2core.list_backends()}
    assert "mlx" in rows
    row = rows["mlx"]
    assert row.source == EXPECTED_SOURCE
    assert row.backend_class == "s2core_mlx.backend:MlxBackend"


def test_only_entry_points_are_needed():
    """A registry with no built-in plugins still finds mlx: nothing in s2core names it."""
    names = {r.name: r.source for r in Registry(builtin_plugins=()).list()}
    assert names.get("mlx") == EXPECTED_SOURCE


def test_probe_on_this_machine():
    pytest.importorskip("mlx.core", reason="mlx is not installed")
    row = s2core.get_registry().info("mlx")
    assert row.available, row.reason
    caps = row.capabilities
    assert caps.supported_kv_cache_dtypes == ("f16", "bf16", "f32")
    assert caps.kv_cache_dtype == "f16"
    assert {"f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q4_k",
            "q5_k", "q2_k", "q3_k", "q6_k"} == caps.native_weight_types  # every GGUF type
    overhead = dict(caps.native_weight_overhead)
    assert overhead["q6_k"] == pytest.approx(14 / 6.5625) and overhead["q2_k"] > 3
    if plugin.is_apple_silicon():
        assert row.priority == 400 > max(r.priority for r in s2core.list_backends()
                                         if r.name != "mlx")
        assert caps.device == "metal" and caps.accelerator and caps.n_accelerated_layers is None
    else:
        assert row.priority == 10
        numpy_row = s2core.get_registry().info("numpy")
        assert row.priority < numpy_row.priority
        assert "reference BLAS" in row.reason and "correctness" in row.reason
        assert caps.device == "cpu" and not caps.accelerator


def test_not_the_default_on_a_cpu_build():
    pytest.importorskip("mlx.core", reason="mlx is not installed")
    if plugin.is_apple_silicon():
        pytest.skip("on Apple silicon mlx is meant to be the default")
    assert s2core.get_registry().default() != "mlx"


def test_import_s2core_and_probing_do_not_import_mlx():
    out = run_python(
        "import sys, s2core\n"
        "assert 'mlx' not in sys.modules, 'import s2core imported mlx'\n"
        "rows = s2core.list_backends()\n"
        "assert any(r.name == 'mlx' for r in rows)\n"
        "s2core.get_registry().info('mlx')\n"
        "print(sorted(m for m in sys.modules if m == 'mlx' or m.startswith('mlx.')))\n")
    assert out.strip() == "[]"


def test_choosing_mlx_imports_it_and_builds_the_backend():
    pytest.importorskip("mlx.core", reason="mlx is not installed")
    from s2core.kit.models import kit_model
    from s2core_mlx.backend import MlxBackend
    with s2core.load(kit_model("gqa4", "f32"), backend="mlx") as m:
        assert isinstance(m.backend, MlxBackend)
        assert m.backend.name == "mlx"
        assert m.capabilities.n_accelerated_layers == (m.hparams.n_layer
                                                       if m.capabilities.accelerator else 0)


def test_without_mlx_core_the_probe_says_how_to_install(tmp_path):
    """An `mlx` package without the core extension (shadowing the real one) is unavailable,
    with the install commands as the reason, and the host keeps working."""
    (tmp_path / "mlx").mkdir()
    (tmp_path / "mlx" / "__init__.py").write_text("")
    out = run_python(
        f"import sys; sys.path.insert(0, {str(tmp_path)!r})\n"
        "import s2core\n"
        "row = s2core.get_registry().info('mlx')\n"
        "print(row.available, '|', row.reason)\n"
        "print(s2core.default_backend() != 'mlx')\n")
    first, second = out.strip().splitlines()
    assert first.startswith("False |") and "mlx[cpu]" in first and "pip install mlx" in first
    assert second == "True"
