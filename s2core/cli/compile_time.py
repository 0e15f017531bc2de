"""How long a command spent in numba's compiler. The NumPy backend's kernels compile the
first time a file of their weight type is used on a machine (numba then keeps them in its
disk cache, and loading them fires no compile event), and that one-time cost lands in
whichever phase first ran them: the timing table names it, so that a first run's 20-odd
seconds of "prefill" read as what they are."""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass


@dataclass
class CompileTime:
    seconds: float = 0.0


@contextmanager
def compile_time():
    """Yields a CompileTime whose seconds are numba's compiling within the block (0.0
    without numba: then nothing compiles)."""
    spent = CompileTime()
    try:
        from numba.core import event
    except ImportError:
        yield spent
        return
    with event.install_listener("numba:compile", event.TimingListener()) as timer:
        try:
            yield spent
        finally:
            spent.seconds = timer.duration if timer.done else 0.0
