"""One worker thread per core, and BLAS held to one thread while they run: how the NumPy
backend spreads a many-row call (a prompt's prefill) over the cores.

Why not BLAS's own threads: a prefill alternates numba kernels, BLAS products and numpy
element-wise work. OpenBLAS's threads spin for a while after each product (waiting for the
next one), on the cores the numba kernels and the next step then need. Measured on a 56-row
prefill of the 4-layer S2 Pro-shaped f16 model (2 cores): 431 ms with BLAS's threads, 319 ms
with everything on these workers. And a product computed tile by tile (tile_gemm) needs the
tiles decoded on the core that multiplies them, which only one's own threads can arrange.

The workers are Python threads (the numba kernels and BLAS release the GIL). `share(work, n)`
runs work(0) .. work(n - 1) on them, each worker taking the next index not yet taken, so a core
busy with something else does less instead of holding everyone up. The one-thread limit on
BLAS (threadpoolctl) is process-wide while held, so one caller holds it at a time (a second
model's many-row call waits for the first: the workers occupy every core anyway), and BLAS's
own setting comes back when it leaves.
"""

from __future__ import annotations

import itertools
import os
import threading
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Callable, Iterator

import numba

try:
    from threadpoolctl import ThreadpoolController
except ImportError:  # pragma: no cover - s2core[fast] installs it
    ThreadpoolController = None


class _OneBlasThread:
    """BLAS limited to one thread while a caller is inside. One caller at a time (others
    wait: the holder's workers occupy every core anyway); re-entrant for the holder. Each BLAS
    library's count is read on the way in and set back on the way out by the same thread:
    with two threads raising and lowering OpenBLAS's count in interleaved turns, a raise
    was seen not to take, and BLAS stayed on one thread for good."""

    def __init__(self):
        self._lock = threading.RLock()
        self._depth = 0
        self._saved: list[tuple[object, int]] = []
        self._blas = None

    def __enter__(self):
        self._lock.acquire()
        self._depth += 1
        if self._depth == 1 and ThreadpoolController is not None:
            if self._blas is None:  # scanning the loaded libraries takes ~ms: once
                self._blas = ThreadpoolController().select(user_api="blas").lib_controllers
            self._saved = [(lib, lib.get_num_threads()) for lib in self._blas]
            for lib, _ in self._saved:
                lib.set_num_threads(1)

    def __exit__(self, *exc):
        try:
            self._depth -= 1
            if self._depth == 0:
                for lib, n in self._saved:
                    lib.set_num_threads(n)
                self._saved = []
        finally:
            self._lock.release()


one_blas_thread = _OneBlasThread()
_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _workers() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(numba.config.NUMBA_NUM_THREADS,
                                       thread_name_prefix="s2core-numpy-worker")
        return _pool


def _forget_pool_after_fork() -> None:
    """A forked child has none of the parent's threads: it starts its own pool when needed."""
    global _pool, _pool_lock
    _pool, _pool_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_pool_after_fork)


def n_workers() -> int:
    """Workers a call uses: numba's thread count (NUMBA_NUM_THREADS / set_num_threads)."""
    return numba.get_num_threads()


def _take(work: Callable[[int], None], indices: Iterator[int], n: int) -> None:
    # itertools.count's next() is atomic under the GIL: each index goes to one worker
    while (i := next(indices)) < n:
        work(i)


def share(work: Callable[[int], None], n: int) -> None:
    """work(i) for i in range(n), spread over the workers, BLAS held to one thread. Returns
    when every worker has stopped (none may still write into the caller's arrays), raising
    the first error."""
    workers = min(n_workers(), n)
    indices = itertools.count()
    if workers <= 1:
        with one_blas_thread:
            _take(work, indices, n)
        return
    with one_blas_thread:
        jobs = [_workers().submit(_take, work, indices, n) for _ in range(workers)]
        wait(jobs)
    for job in jobs:
        job.result()

