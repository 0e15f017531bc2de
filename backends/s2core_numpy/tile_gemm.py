"""Products of many rows from a tiled matrix: each core decodes its own tiles and multiplies
them by sgemm while they sit in its cache.

One worker per numba thread (Python threads: the decode kernels and BLAS both release the
GIL). Each worker takes the next tile not yet taken (a core that is busy with something else
then does fewer tiles instead of holding up the product): it decodes tile t to float32
(in, TILE) in its own buffer (640 KB for S2 Pro's 2560 inputs, within one core's 2 MB L2) and computes
out[:, t*TILE:(t+1)*TILE] = x @ tile with a single-threaded sgemm. The weights then cross
memory once, in their file type, instead of being decoded into a whole float32 matrix that is
written out and read back.

BLAS is limited to one thread for the duration (threadpoolctl), since the workers already
occupy every core; two threads handing each tile to BLAS's own pool and back cost more than
the product (measured: 1.5 ms a switch against 2 ms of work). The limit is process-wide while
a product runs; nested and concurrent products share it and the last one out restores it.

Measured on 9728 x 2560 F16, 2 cores (best of 15): 56 rows 29.0 -> 19.1 ms, 128 rows
47.5 -> 38.1, 343 rows 101 -> 92.5 (whole-matrix decode + multithreaded sgemm -> this).
"""

from __future__ import annotations

import itertools
import os
import threading
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Iterator

import numba
import numpy as np

try:
    from threadpoolctl import ThreadpoolController
except ImportError:  # pragma: no cover - s2core[fast] installs it
    ThreadpoolController = None


class _OneBlasThread:
    """Context: BLAS limited to one thread while any product is inside; refcounted."""

    def __init__(self):
        self._lock = threading.Lock()
        self._inside = 0
        self._limiter = None
        self._controller = None

    def __enter__(self):
        with self._lock:
            if self._inside == 0:
                if self._controller is None:  # scanning the loaded libraries takes ~ms: once
                    self._controller = ThreadpoolController()
                self._limiter = self._controller.limit(limits=1, user_api="blas")
            self._inside += 1

    def __exit__(self, *exc):
        with self._lock:
            self._inside -= 1
            if self._inside == 0:
                self._limiter.restore_original_limits()
                self._limiter = None


_one_blas_thread = _OneBlasThread()
_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()
_local = threading.local()


def _workers() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(numba.config.NUMBA_NUM_THREADS,
                                       thread_name_prefix="s2core-tile-gemm")
        return _pool


def _forget_pool_after_fork() -> None:
    """A forked child has none of the parent's threads: it starts its own pool when needed."""
    global _pool, _pool_lock
    _pool, _pool_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_pool_after_fork)


def _tile_buffer(n_in: int, tile: int) -> np.ndarray:
    """This thread's float32 (n_in, tile) buffer, reused across products."""
    buf = getattr(_local, "buf", None)
    if buf is None or buf.shape != (n_in, tile):
        buf = _local.buf = np.empty((n_in, tile), np.float32)
    return buf


def _run(matrix, x: np.ndarray, out: np.ndarray, tiles: Iterator[int]) -> None:
    """Products of tiles from `tiles` (shared by the workers: itertools.count's next() is
    atomic) until they run out."""
    n_tiles = matrix.codes.shape[0]
    tile = out.shape[1] // n_tiles
    w = _tile_buffer(x.shape[1], tile)
    while (t := next(tiles)) < n_tiles:
        matrix._decode_tile(t, w)
        np.matmul(x, w, out=out[:, t * tile:(t + 1) * tile])


def tile_gemm(matrix, x: np.ndarray, out: np.ndarray) -> None:
    """out (n, padded out) = x (n, in) @ W^T for a tiled matrix, tile by tile (see above)."""
    n_workers = min(numba.get_num_threads(), matrix.codes.shape[0])
    if n_workers <= 1 or ThreadpoolController is None:
        _run(matrix, x, out, itertools.count())
        return
    with _one_blas_thread:
        tiles = itertools.count()
        jobs = [_workers().submit(_run, matrix, x, out, tiles) for _ in range(n_workers)]
        wait(jobs)  # all of them, even when one fails: none may still be writing into `out`
    for job in jobs:
        job.result()
