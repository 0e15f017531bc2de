"""Which backend `load()` picks for a model file when none is named.

Priority ranks backends (accelerators far above CPU ones). Backends whose priority is within
PEER_BAND of the best available are peers, and among peers the one that holds the file in
the fewest bytes wins: a decode step reads every weight once, so it runs at memory speed and
its time follows the bytes held (benchmarks/results: on one CPU, NumPy's q8_0 kept as int8
beats torch's f16 copy of it, and without numba torch's f16 beats NumPy's float32 copies).
Between equal holdings, the one that copies fewer bytes at load wins (weights used in place
from the memory map load instantly and are shared through the page cache: torch maps an f16
file, NumPy packs it into its kernels' layout, 4.9 s at 4 layers), then priority (f32: both
map it, NumPy's float32 GEMV is faster). For f16 that choice now costs step speed: since
NumPy's F16 kernels widen in registers its step is the faster (49 against 70 ms, 4 layers,
benchmarks/results 2026-12-02 00:06); pass backend="numpy" for long generations. It reads
capabilities and the file only, never a backend's name.
"""

from __future__ import annotations

from s2core.errors import BackendUnavailableError
from s2core.modelfile.file import ModelFile
from s2core.runtime.memory import copied_weight_bytes, resident_weight_bytes
from s2core.contract.registry import BackendInfo

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
