"""Memory bandwidth of this machine, measured the way a decode step uses memory: streaming.

Two figures, each the best of several repetitions over arrays far larger than any cache:

* copy: np.copyto of a float64 array into another, (bytes read + bytes written) / time. The
  conventional figure, single-threaded.
* read: bytes / time of BLAS kernels that only read, using every BLAS thread: float32
  matrix @ vector (gemv, the kernel of a decode step, over rows of S2 Pro's width 2560) and
  float64 x @ x (dot). A step only reads its weights, and on some machines (this project's
  Zen 4 VMs) reading streams faster than copying, so a step can beat the copy floor; the
  read floor is the one it cannot beat.
* sum: the array summed as float32 by one thread per core at once (numpy's sum releases the
  GIL), bytes / time: the figure issue 10 states its floors in ("a 1 GiB array summed with
  one thread per core"). numpy's pairwise sum is partly bound by its own arithmetic, so this
  reads lower than the BLAS kernels (29 against 39-73 GB/s here): floors from it are the
  loosest of the three.

A run measures both at the start, before every backend and at the end: on shared hosts the
bandwidth a VM gets varies over minutes, and the samples show by how much.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Callable

import numpy as np

MiB = 1 << 20
GEMV_WIDTH = 2560  # S2 Pro's dim: the rows a decode step's matrix products stream


@dataclass(frozen=True)
class Bandwidth:
    copy_gbps: float       # (read + written bytes) / best time, 1e9 bytes per second
    read_gbps: float       # the better of the two read-only kernels below
    gemv_f32_gbps: float   # matrix bytes / best time of float32 matrix @ vector
    dot_f64_gbps: float    # vector bytes / best time of float64 x @ x
    sum_gbps: float        # array bytes / best time of a float32 sum, one thread per core
    bytes_each: int        # size of each array
    reps: int

    def as_dict(self) -> dict:
        return asdict(self)


def _best_s(fn: Callable[[], object], reps: int) -> float:
    fn()  # first call: page faults and thread start-up are not timed
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def measure_bandwidth(size_mb: int = 512, reps: int = 5) -> Bandwidth:
    """Best-of-`reps` copy and read bandwidth over `size_mb` MiB arrays (2x that in RAM)."""
    n = size_mb * MiB // 8
    src = np.ones(n, dtype=np.float64)
    dst = np.zeros(n, dtype=np.float64)
    copy = 2 * src.nbytes / _best_s(lambda: np.copyto(dst, src), reps) / 1e9
    dst = None  # free it before the read measurements

    dot = src.nbytes / _best_s(lambda: src @ src, reps) / 1e9
    flat = src.view(np.float32)  # the same bytes seen as a float32 matrix
    matrix = flat[: flat.size // GEMV_WIDTH * GEMV_WIDTH].reshape(-1, GEMV_WIDTH)
    vec = np.ones(GEMV_WIDTH, dtype=np.float32)
    gemv = matrix.nbytes / _best_s(lambda: matrix @ vec, reps) / 1e9
    return Bandwidth(copy_gbps=copy, read_gbps=max(gemv, dot), gemv_f32_gbps=gemv,
                     dot_f64_gbps=dot, sum_gbps=_parallel_sum_gbps(flat, reps),
                     bytes_each=int(src.nbytes), reps=reps)


def _parallel_sum_gbps(values: np.ndarray, reps: int) -> float:
    """bytes / best time of summing `values`, split among one thread per usable core."""
    with SumProbe(values) as probe:
        return values.nbytes / _best_s(probe.run, reps) / 1e9


def usable_cores() -> int:
    """The cores this process may run on: the probes use one thread each."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, cores or 1)


class GemvProbe:
    """The read floor's own kernel (float32 matrix @ vector), one sample at a time, for a
    floor taken right beside each timed operation: on this project's VMs the read bandwidth
    moves between minutes (30-35 against 60 GB/s) and so does a step, so a floor sampled
    minutes away can be from a faster or slower moment.

    The matrix is split among one thread per core, each multiplying its rows with BLAS held
    to one thread: BLAS's own threads spin on the cores for a while after a product and
    would slow the operation timed next (a 4-layer step took 2.5-4x its time after a
    many-threaded gemv)."""

    def __init__(self, size_mb: int = 256):
        """size_mb: the matrix's size, far above any last-level cache so every sample reads
        from memory."""
        rows = size_mb * MiB // 4 // GEMV_WIDTH
        self.matrix = np.ones((rows, GEMV_WIDTH), dtype=np.float32)
        self._vec = np.ones(GEMV_WIDTH, dtype=np.float32)
        self._parts = np.array_split(self.matrix, usable_cores())
        self._pool = ThreadPoolExecutor(len(self._parts))
        from threadpoolctl import ThreadpoolController
        self._blas = ThreadpoolController()  # found once: a search costs ~0.7 ms
        self.sample()  # page faults are not timed

    def sample(self) -> float:
        """GB/s of one product over the whole matrix."""
        with self._blas.limit(limits=1, user_api="blas"):
            t0 = time.perf_counter()
            list(self._pool.map(self._vec.__rmatmul__, self._parts))
            seconds = time.perf_counter() - t0
        return self.matrix.nbytes / seconds / 1e9

    def close(self) -> None:
        self._pool.shutdown()


class SumProbe:
    """The sum bandwidth, one sample at a time: for a figure taken right beside each timed
    operation (the machine's speed moves between minutes here, and a floor measured minutes
    away can be from a faster or slower moment)."""

    def __init__(self, values: np.ndarray | int):
        """values: the array to sum, or its size in MiB (a float32 array of ones)."""
        if isinstance(values, int):
            values = np.ones(values * MiB // 4, dtype=np.float32)
        self.values = values
        self._parts = np.array_split(values, usable_cores())
        self._pool = ThreadPoolExecutor(len(self._parts))

    def run(self) -> None:
        list(self._pool.map(np.sum, self._parts))

    def sample(self) -> float:
        """GB/s of one sum of the whole array."""
        t0 = time.perf_counter()
        self.run()
        return self.values.nbytes / (time.perf_counter() - t0) / 1e9

    def close(self) -> None:
        self._pool.shutdown()

    def __enter__(self) -> "SumProbe":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
