"""numba's disk cache of this package's compiled code, kept in step with the package's sources.

numba keys a cached function on its own file (modification time and size) and on nothing
else, yet many functions here compile in code from other modules of the package:
`int_dots._quantized_products`, which every integer product of a served model runs, holds
`simd.products` and its kernels and `act_quant_kernels.integer_codes`. A change to simd.py
alone therefore left that function's cached code as it was, and the model multiplying with
the kernels of the day int_dots.py last changed (found on 2026-12-07: the model's products
ran 1.1x, and on the AVX2 build 1.4-1.6x, the time of the current kernels called directly;
docs/performance.md, "sixth session"). A fresh install compiles everything anew, so this
hit working trees and caches kept across upgrades.

So the package's entries are emptied whenever any of its sources changes: a fingerprint of
all of them sits beside the entries and is compared on import. Every module of the package
that caches compiled code imports this one first, before any of its functions can be
called (numba reads the cache at a function's first call, not at its definition).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from numba import njit

#: the package whose sources and cache entries this keeps in step
PACKAGE = Path(__file__).resolve().parent
#: the file beside the cache entries holding the sources' fingerprint they were made from
FINGERPRINT_NAME = "s2core_numpy-sources.sha256"


def sources_fingerprint(package: Path = PACKAGE) -> str:
    """A SHA-256 over every module of `package`: names and contents."""
    digest = hashlib.sha256()
    for path in sorted(package.glob("*.py")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


@njit(cache=True)
def _where_numba_caches():
    """A cached function of this package: numba's cache directory for the package is its
    (`cache_dir`), however numba chose it (beside the sources, NUMBA_CACHE_DIR, or a
    per-user directory where the package's own is not writable)."""
    return 0


def cache_dir() -> Path:
    return Path(_where_numba_caches.stats.cache_path)


def refresh(directory: Path | None = None, package: Path = PACKAGE) -> bool:
    """Remove the cache entries (.nbi indexes, .nbc code) of `package`'s modules from
    `directory` (cache_dir()) unless they were made from the sources as they are now; then
    record the sources' fingerprint there. True when entries were removed, or there was no
    fingerprint yet. A process that already loaded an entry keeps it; one loading it as it
    goes finds it missing and compiles (numba treats a vanished entry as a miss)."""
    directory = cache_dir() if directory is None else directory
    mark = directory / FINGERPRINT_NAME
    now = sources_fingerprint(package)
    try:
        if mark.read_text() == now:
            return False
    except OSError:
        pass
    modules = {path.stem for path in package.glob("*.py")}
    for entry in [*directory.glob("*.nbi"), *directory.glob("*.nbc")]:
        if entry.name.split(".", 1)[0] in modules:
            entry.unlink(missing_ok=True)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        partial = directory / f"{FINGERPRINT_NAME}.{os.getpid()}"
        partial.write_text(now)
        os.replace(partial, mark)  # atomic: a reader sees the old fingerprint or the new
    except OSError:
        pass  # not writable: numba cannot cache there either
    return True


refresh()
