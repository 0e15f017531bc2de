"""Which backend `load()` picks for a model file when none is named.

The pick is the one that runs fastest over a session (serve, generate_many, a long text), as
far as declared capabilities can tell; a pick that the benchmark on the same machine shows
slower is a bug (`s2core bench --case batch` prints its verdict per file). It reads
capabilities and the file only, never a backend's name.

1. Priority ranks backends (accelerators far above CPU ones). Backends whose priority is
   within PEER_BAND of the best available are peers.
2. Among peers, the one that holds the file in the fewest bytes: a decode step reads every
   weight once, so it runs at memory speed and its time follows the bytes held
   (benchmarks/results: NumPy's q8_0 and q4_k_m kept as stored beat torch's f16 copies).
3. Between equal holdings, the one that copies fewer bytes at load: weights used in place
   from the memory map load instantly and are shared through the page cache.
4. Then priority (f32: both map it; NumPy's float32 GEMV was the faster a step on the AMD
   EPYC; on the Intel Xeon the two tie alone and torch batches f32 faster: an open question
   in docs/backend-choice.md).

Step 3 decides f16 files: NumPy (with numba) packs them into its layout, torch maps them. Which
of the two then steps faster depends on the CPU: torch on this project's Intel Xeon (4 layers,
quiet: 117 against 266 ms a step, 2.32 against 1.78 frames/s with 4 sequences), NumPy on its
AMD EPYC (49 against 70 ms). The capabilities cannot tell those apart, so the tie goes to the
mapped file, instant to load and the faster where last measured (docs/backend-choice.md).
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
