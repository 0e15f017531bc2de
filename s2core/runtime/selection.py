"""Which backend `load()` picks for a model file when none is named.

The pick is the one that runs fastest over a session (serve, generate_many, a long text):
its steady-state speed, not its load time. It reads declared capabilities and the file
only, never a backend's name.

1. Priority ranks backends (accelerators far above CPU ones). Backends whose priority is
   within PEER_BAND of the best available are peers.
2. Among peers, the one that holds the file in the fewest bytes: a decode step reads every
   weight once, so it runs at memory speed and its time follows the bytes held
   (benchmarks/results: NumPy's q8_0 kept as int8 beats torch's f16 copy of it, and without
   numba torch's f16 beats NumPy's float32 copies).
3. Between equal holdings, priority: each plugin sets it from the measured step and batch
   speed of its kernels (NumPy's numba F16 kernels widen in registers and step 1.1-1.3x
   faster than torch's f16 GEMV, and batch better; both map f32, and NumPy's float32 GEMV
   is the faster).
4. Only then the bytes copied at load (weights used in place from the memory map load
   instantly): load time is paid once, the step at every frame. NumPy packs an f16 file
   into its kernels' layout, which torch maps as is (docs/backend-choice.md gives both
   load times); `rank_backends(..., prefer="instant_load")` puts this before priority,
   for one-shot commands that load, speak a sentence and exit.
"""

from __future__ import annotations

from s2core.errors import BackendUnavailableError, InvalidInputError
from s2core.modelfile.file import ModelFile
from s2core.runtime.memory import copied_weight_bytes, resident_weight_bytes
from s2core.contract.registry import BackendInfo

PEER_BAND = 50


#: what the rule optimizes: the speed of every step after the load (the default), or the
#: load itself first (one-shot commands)
PREFERENCES = ("steady_state", "instant_load")


def choose_backend(rows: list[BackendInfo], model_file: ModelFile,
                   prefer: str = "steady_state") -> str:
    """The backend load() tries first for this file."""
    return rank_backends(rows, model_file, prefer)[0]


def rank_backends(rows: list[BackendInfo], model_file: ModelFile,
                  prefer: str = "steady_state") -> list[str]:
    """Every available backend in the order load() tries them: the rule above picks the
    first, then applies again to the rest (the next choice should the first fail to import)."""
    if prefer not in PREFERENCES:
        raise InvalidInputError("prefer", f"prefer={prefer!r} is not one of {PREFERENCES}")
    available = [r for r in rows if r.available and r.capabilities is not None]
    if not available:
        reasons = "; ".join(f"{r.name}: {r.reason}" for r in rows) or "none registered"
        raise BackendUnavailableError(f"no backend is available ({reasons})")
    order = []
    while available:
        best = max(r.priority for r in available)
        peers = [r for r in available if r.priority >= best - PEER_BAND]
        chosen = min(peers, key=lambda r: _rank_key(r, model_file, prefer))
        order.append(chosen.name)
        available.remove(chosen)
    return order


def _rank_key(row: BackendInfo, model_file: ModelFile, prefer: str) -> tuple:
    held = resident_weight_bytes(model_file, row.capabilities)
    copied = copied_weight_bytes(model_file, row.capabilities)
    if prefer == "instant_load":
        return held, copied, -row.priority, row.name
    return held, -row.priority, copied, row.name
