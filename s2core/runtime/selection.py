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
3. Between equal holdings, priority: the backends' own rank of their steady-state speed.
4. Then the one that copies fewer bytes at load: weights used in place from the memory map
   load instantly and are shared through the page cache, but the steps that follow count
   for more (issue 26: the pick is what the user feels over a session). Ranked above
   priority, the copy would give f16 files to torch on the CPU: 2.99 frames/s alone and 3.13
   with four sequences, where NumPy served 3.40 and 13.21 (`batch-20261207-1509`,
   docs/backend-choice.md).

f32 and f16 files: NumPy and torch on the CPU both hold 2 (f16) or 4 (f32) bytes a weight,
and NumPy's priority decides: NumPy maps f32 files, and copies f16 files into its tiled
layout under its default arithmetic for them, "f32" (the faster; torch maps them).
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
                                           -r.priority,
                                           copied_weight_bytes(model_file, r.capabilities),
                                           r.name))
        order.append(chosen.name)
        available.remove(chosen)
    return order
