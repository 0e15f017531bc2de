"""arithmetic="ggml" against ggml itself: every type's product, computed by ggml's CPU backend
(benchmarks/ggml_products/mm.c), reproduced by the NumPy backend and the kit's transcription.
Needs a ggml checkout with its CPU library built, named by $S2CORE_GGML_DIR (see
benchmarks/ggml_products/compare.py); skipped without one."""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from pathlib import Path

import pytest

GGML_DIR = os.environ.get("S2CORE_GGML_DIR", "")
pytestmark = pytest.mark.skipif(
    not (GGML_DIR and list(Path(GGML_DIR).glob("build*/src/libggml-cpu.so"))
         and shutil.which("cc")),
    reason="no ggml build: set S2CORE_GGML_DIR to a ggml checkout with build*/src/libggml-cpu.so "
           "(and have a C compiler)")


def _compare_module():
    path = Path(__file__).parents[1] / "benchmarks" / "ggml_products" / "compare.py"
    spec = importlib.util.spec_from_file_location("ggml_products_compare", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_products_reproduce_ggml(tmp_path):
    compare = _compare_module()
    rows = compare.compare(compare.build(Path(GGML_DIR), tmp_path))
    assert len(rows) == 3 * len(compare.TYPES)
    for r in rows:
        what = f"{r['type']} x {r['rows']} rows"
        assert r["numpy_ggml"] < 3e-6, f"{what}: NumPy ggml arithmetic {r['numpy_ggml']:.1e}"
        assert r["kit_reference"] < 3e-6, f"{what}: kit reference {r['kit_reference']:.1e}"
        assert r["numpy_f32"] > 30 * r["numpy_ggml"], what  # the rounding is what is matched
