"""The NumPy kernels' two low-level helpers: scratch arrays on the stack (stack.py) and
software prefetch (prefetch.py). The kernels' numbers are tested in test_numpy_kernels.py and
test_numpy_quants.py; here, what the helpers themselves promise."""

from __future__ import annotations

import platform

import numpy as np
import pytest

numba = pytest.importorskip("numba", reason="numba is not installed (pip install -e '.[fast]')")

from numba import njit, prange  # noqa: E402

from s2core_numpy.prefetch import prefetch, prefetch_rows  # noqa: E402
from s2core_numpy.stack import stack_array, stack_tile  # noqa: E402
from s2core_numpy.tiled import TILE  # noqa: E402


@njit(parallel=True)
def _per_tile_sums(x, out):
    """Each parallel iteration fills its own stack buffers, then reduces them."""
    for t in prange(out.shape[0]):
        acc = stack_tile(np.float32)
        block = stack_array(3, TILE, np.int32)
        for j in range(TILE):
            acc[j] = 0.0
            block[0, j], block[1, j], block[2, j] = t, j, t * j
        for i in range(x.shape[0]):
            for j in range(TILE):
                acc[j] += x[i] * (block[0, j] + block[1, j] + block[2, j])
        for j in range(TILE):
            out[t, j] = acc[j]


def test_stack_buffers_are_private_to_each_parallel_iteration():
    x = np.arange(1, 9, dtype=np.float32)
    out = np.empty((37, TILE), np.float32)
    _per_tile_sums(x, out)
    t, j = np.meshgrid(np.arange(37), np.arange(TILE), indexing="ij")
    np.testing.assert_array_equal(out, (x.sum() * (t + j + t * j)).astype(np.float32))


def test_a_stack_array_needs_sizes_known_at_compile_time():
    @njit
    def sized_at_run_time(n):
        return stack_array(n, TILE, np.float32)[0, 0]

    with pytest.raises(numba.core.errors.TypingError, match="_alloca"):
        sized_at_run_time(4)


@njit
def _sum_with_prefetch(a, ahead):
    total = 0
    for i in range(a.shape[0]):
        prefetch(a, i + ahead)  # far past the end near the last elements: clamped
        total += a[i]
    prefetch_rows(a, 64, 0, a.shape[0])  # rows past the end: clamped too
    return total


def test_prefetch_reads_nothing_and_is_clamped_to_the_array():
    a = np.arange(1000, dtype=np.int64)
    for ahead in (0, 64, 10 ** 9):
        assert _sum_with_prefetch(a, ahead) == a.sum()


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"),
                    reason="checks the x86 instruction; other machines have their own")
def test_prefetch_becomes_a_prefetch_instruction():
    a = np.arange(1000, dtype=np.int64)
    _sum_with_prefetch(a, 64)
    assembly = "\n".join(_sum_with_prefetch.inspect_asm().values())
    assert "prefetcht0" in assembly
