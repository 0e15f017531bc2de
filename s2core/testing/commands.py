"""The installed `s2core` console script, for tests that run it as a user does."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path


def s2core_executable() -> str:
    """The `s2core` command installed beside this interpreter; the test is skipped (with the
    reason) when the package was not installed with its console script."""
    exe = shutil.which("s2core", path=str(Path(sys.executable).parent))
    if exe is None:
        import pytest
        pytest.skip("the s2core console script is not installed in this environment")
    return exe
