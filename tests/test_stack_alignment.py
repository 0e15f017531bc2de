"""A tile's accumulators (stack.stack_tile) sit on a cache line wherever the caller's frame
puts the kernel's: the tiled kernels spill some of them there on AVX2, and straddling lines
made them up to 2.6x slower in some processes (stack.py). And benchmarks/stack_alignment.py's
instrument, its padded callers, really moves a kernel's frame: an earlier version's padding
was folded away by LLVM, and its runs compared one place with itself."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("numba")

from numba import prange  # noqa: E402

from s2core_numpy import stack  # noqa: E402
from s2core_numpy.stack import stack_tile  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import stack_alignment  # noqa: E402


def _record_tile_address(out):
    # a parallel loop's body is a function of its own, which LLVM does not inline into the
    # caller (one iteration: run by the calling thread)
    for i in prange(1):
        tile = stack_tile(np.float32)
        tile[0] = 0.0
        out[i] = tile.ctypes.data + np.int64(tile[0])


def _tile_addresses(tile_align) -> list[int]:
    """The address of a stack_tile (compiled with stack.TILE_ALIGN = tile_align) in a kernel
    called from each of stack_alignment's padded callers."""
    out = np.zeros(1, np.int64)
    kernel = stack_alignment.compiled_with(tile_align, _record_tile_address, (out,),
                                           parallel=True)
    addresses = []
    for call in stack_alignment.padded_callers(kernel, (out,)).values():
        call(np.zeros(1, np.int64), out)
        addresses.append(int(out[0]))
    return addresses


def test_a_tiles_accumulators_sit_on_a_cache_line_wherever_the_caller_stands():
    assert stack.TILE_ALIGN == 64
    assert [a % 64 for a in _tile_addresses(stack.TILE_ALIGN)] == [0] * len(stack_alignment.PADS)


def test_the_padded_callers_move_the_kernels_frame():
    """With only the element's alignment the tile lands at other offsets from each caller:
    the control of the test above, and the benchmark's instrument at work."""
    assert len({a % 32 for a in _tile_addresses(None)}) > 1
