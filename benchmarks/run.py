#!/usr/bin/env python
"""Run the s2core benchmark from a checkout: `python benchmarks/run.py [options]`.

The same as `s2core bench [options]` and `python -m s2core.benchmarking [options]`; see
benchmarks/README.md and `--help`.
"""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# A checkout that is not pip-installed still finds s2core and its built-in backends.
for path in (ROOT, ROOT / "backends"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from s2core.benchmarking.cli import main  # noqa: E402

if __name__ == "__main__":
    argv = sys.argv[1:]
    if not any(a == "--out" or a.startswith("--out=") for a in argv):
        argv += ["--out", str(ROOT / "benchmarks" / "results")]  # wherever it is run from
    sys.exit(main(argv))
