"""The NumPy backend's numba cache follows every source of the package (kernel_cache.py): a
cached function that compiles in another module's code must not keep running that code
after the other module changed. numba alone keys an entry on its function's own file, and
the served model ran stale integer kernels that way for a day."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("numba")

from s2core_numpy import kernel_cache  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def test_refresh_empties_the_packages_entries_when_a_source_changes(tmp_path):
    package, cache = tmp_path / "pkg", tmp_path / "cache"
    package.mkdir()
    cache.mkdir()
    (package / "a.py").write_text("x = 1\n")
    (package / "b.py").write_text("y = 2\n")

    def entries(*names):
        for name in names:
            (cache / name).write_bytes(b"entry")

    ours = ["a.f-1.py311.nbi", "a.f-1.py311.1.nbc", "b.g-3.py311.nbi"]
    others = ["c.h-1.py311.nbi", "a.cpython-311.pyc"]  # another module's; bytecode
    entries(*ours, *others)
    assert kernel_cache.refresh(cache, package)  # no fingerprint yet: made from unknown sources
    assert sorted(p.name for p in cache.iterdir()) == sorted(
        others + [kernel_cache.FINGERPRINT_NAME])

    entries(*ours)  # compiled again from these sources
    assert not kernel_cache.refresh(cache, package)
    assert all((cache / name).exists() for name in ours + others)

    (package / "b.py").write_text("y = 3\n")  # one module changes: every entry goes
    assert kernel_cache.refresh(cache, package)
    assert not any((cache / name).exists() for name in ours)
    assert all((cache / name).exists() for name in others)
    assert (cache / kernel_cache.FINGERPRINT_NAME).read_text() == \
        kernel_cache.sources_fingerprint(package)


_CHILD = """
import json, sys
import numpy as np
from s2core_numpy.act_quant_kernels import integer_codes
x = np.linspace(-3, 3, 2 * 512, dtype=np.float32).reshape(2, 512)
codes, d, sums = integer_codes(x, True)
stats = integer_codes.stats
print(json.dumps({"hits": sum(stats.cache_hits.values()),
                  "misses": sum(stats.cache_misses.values()),
                  "codes": codes.tolist(), "d": d.tolist()}))
"""


def _run_copy(copy_root: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(copy_root), str(ROOT)]))
    env.pop("NUMBA_CACHE_DIR", None)  # the copy's own __pycache__
    done = subprocess.run([sys.executable, "-c", _CHILD], env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_change_to_a_module_another_compiles_in_recompiles_it(tmp_path):
    """integer_codes (act_quant_kernels.py) compiles in f16.py's _through_half. Run from a
    copy of the package: the second run loads the cached code; after f16.py alone changes,
    the third compiles it again (numba's own key, act_quant_kernels.py, did not change)."""
    copy_root = tmp_path / "copy"
    shutil.copytree(ROOT / "backends" / "s2core_numpy", copy_root / "s2core_numpy",
                    ignore=shutil.ignore_patterns("__pycache__"))
    first = _run_copy(copy_root)
    assert first["misses"] == 1 and first["hits"] == 0
    second = _run_copy(copy_root)
    assert second["hits"] == 1 and second["misses"] == 0, "the cache did not hold"
    f16 = copy_root / "s2core_numpy" / "f16.py"
    f16.write_text(f16.read_text() + "\n# changed\n")
    third = _run_copy(copy_root)
    assert third["misses"] == 1 and third["hits"] == 0, \
        "a cached function kept the code of a module that changed"
    assert third["codes"] == first["codes"] and np.allclose(third["d"], first["d"])
