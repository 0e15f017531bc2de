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
   into its kernels' layout, which torch maps as is: 27 s against 0.1 s at real size here,
   won back after 18 frames (docs/backend-choice.md), so one-shot commands (`s2core speak`)
   use the same rule.
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

