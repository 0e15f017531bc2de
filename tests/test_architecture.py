"""The house's architecture, read from the code's own imports (docs/architecture.md):
import-linter's contracts in pyproject.toml hold, every name the README shows imports, and the
plugins' own tests reach the core only through its public faces."""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: what a plugin (code or tests) may import from s2core: the package's public faces
PLUGIN_FACES = ("s2core", "s2core.plugin", "s2core.errors", "s2core.kit", "s2core.generation",
                "s2core.serving", "s2core.speak", "s2core.prompt")


def test_import_contracts_hold():
    """Layers, no circles at any depth (imports inside functions included), the core never
    importing a backend, backends reaching the core only through s2core.plugin: each contract
    in pyproject.toml is kept. A new circle fails here the day it is written."""
    lint = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or shutil.which(
        "lint-imports")
    if lint is None:
        pytest.skip("import-linter is not installed (pip install -e '.[test]')")
    run = subprocess.run([lint, "--no-cache"], cwd=ROOT, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
    counts = re.search(r"Contracts: (\d+) kept, (\d+) broken", run.stdout)
    assert counts and int(counts.group(1)) >= 6 and counts.group(2) == "0", run.stdout


def _readme_python_blocks() -> list[str]:
    text = (ROOT / "README.md").read_text()
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def test_every_import_the_readme_shows_works():
    """Public API unchanged: each `import` / `from ... import` line of the README's Python
    examples runs, and each `s2core.x.y` it names resolves."""
    lines, dotted = [], set()
    for block in _readme_python_blocks():
        for line in block.splitlines():
            code = line.split("#", 1)[0].strip()
            if re.match(r"(from s2core[\w.]* import |import s2core)", code):
                lines.append(code)
            dotted |= set(re.findall(r"\bs2core(?:\.[A-Za-z_]\w*)+", code))
    assert len(lines) >= 6, lines
    for code in lines:
        if code.startswith("from my_package"):
            continue
        exec(code, {})  # noqa: S102 (the README's own lines)
    import importlib
    for name in sorted(dotted):
        parts = name.split(".")
        obj = importlib.import_module("s2core")
        for i, part in enumerate(parts[1:], 1):
            if not hasattr(obj, part):
                obj = importlib.import_module(".".join(parts[:i + 1]))
            else:
                obj = getattr(obj, part)
        assert obj is not None, name


def _imported_modules(path: Path) -> list[tuple[int, str]]:
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.lineno, node.module))
        elif isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
    return out


def _plugin_files() -> list[Path]:
    files = list((ROOT / "backends").rglob("*.py"))
    files += [p for p in (ROOT / "plugins").rglob("*.py") if "build" not in p.parts]
    return [p for p in files if "__pycache__" not in p.parts]


def test_plugins_and_their_tests_use_only_the_public_faces():
    """Backends, plugins and the plugins' tests import s2core only through s2core.plugin,
    s2core.errors, s2core.kit and the public modules the README shows, so that moving a module
    inside the core breaks no third party."""
    files = _plugin_files()
    assert len(files) > 40
    bad = [f"{p.relative_to(ROOT)}:{n}: {m}" for p in files for n, m in _imported_modules(p)
           if (m == "s2core" or m.startswith("s2core."))
           and not any(m == face or m.startswith(face + ".") and face == "s2core.kit"
                       for face in PLUGIN_FACES)]
    assert not bad, "imports past the plugin face:\n" + "\n".join(bad)
