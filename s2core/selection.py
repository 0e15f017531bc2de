"""Which backend `load()` picks for a model file when none is named.

Priority ranks backends (accelerators far above CPU ones). Backends whose priority is within
PEER_BAND of the best available are peers, and among peers the one that holds the file in
the fewest bytes wins: a decode step reads every weight once, so it runs at memory speed and
its time follows the bytes held (benchmarks/results: on one CPU, NumPy's q8_0 kept as int8
beats torch's f16 copy of it, and without numba torch's f16 beats NumPy's float32 copies).
Between equal holdings, the one that copies fewer bytes at load wins (weights used in place
from the memory map load instantly and are shared through the page cache: torch maps an f16
file, NumPy packs it into its kernels' layout, and torch's f16 step was also the faster),
then priority (f32: both map it, NumPy's float32 GEMV is faster). It reads capabilities and
the file only, never a backend's name.
"""

from __future__ import annotations

from .errors import BackendUnavailableError
from .gguf_file import ModelFile
from .memory import copied_weight_bytes, resident_weight_bytes
from .registry import BackendInfo

PEER_BAND = 50


def choose_backend(rows: list[BackendInfo], model_file: ModelFile) -> str:
    """The backend load() tries first for this file."""
    return rank_backends(rows, model_file)[0]


def rank_backends(rows: list[BackendInfo], model_file: ModelFile) -> list[str]:
    """Every available backend in the order load() tries them: the rule above picks the
    first, then applies again to the rest (the next choice should the first fail to import)."""
    available = [r for r in rows if r.available and r.capabilities is not None]
    if not available:
        reasons = "; ".join(f"{r.name}: {r.reason}" for r in rows) or "none registered"
        raise BackendUnavailableError(f"no backend is available ({reasons})")
    order = []
    while available:
        best = max(r.priority for r in available)
        peers = [r for r in available if r.priority >= best - PEER_BAND]
        chosen = min(peers, key=lambda r: (resident_weight_bytes(model_file, r.capabilities),
                                           copied_weight_bytes(model_file, r.capabilities),
                                           -r.priority, r.name))
        order.append(chosen.name)
        available.remove(chosen)
    return order
