"""A tile's accumulators (stack.stack_tile) sit on a cache line wherever the caller's frame
puts the kernel's: the tiled kernels spill some of them there on AVX2, and straddling lines
made them up to 2.6x slower in some processes (stack.py; benchmarks/stack_alignment.py)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("numba")

from numba import njit, prange  # noqa: E402

from s2core_numpy import stack  # noqa: E402
from s2core_numpy.stack import stack_array, stack_tile  # noqa: E402


def _tile_address_from_frames_moved_by(pads, tile_align):
    """The address of a stack_tile, compiled with stack.TILE_ALIGN = tile_align, taken in a
    function called from frames `pad` bytes larger (a 4-byte-aligned stack_array each)."""
    saved = stack.TILE_ALIGN
    stack.TILE_ALIGN = tile_align
    try:
        @njit(parallel=True)
        def tile_address(pad):
            # a parallel loop's body: a function of its own, which LLVM does not inline
            # into the caller (one iteration: run by the calling thread); `pad` is the
            # caller's, so that its frame keeps it
            found = np.zeros(1, np.int64)
            for i in prange(1):
                tile = stack_tile(np.float32)
                tile[0] = pad[0, 0]
                found[i] = tile.ctypes.data
            return found[0]
        tile_address(np.zeros((1, 1), np.float32))  # compiled now, under tile_align
        addresses = []
        for pad in pads:
            namespace = {"stack_array": stack_array, "np": np, "tile_address": tile_address}
            exec(f"def caller():\n"
                 f"    pad = stack_array(1, {pad // 4 + 4}, np.float32)\n"
                 f"    pad[0, 0] = 0\n"
                 f"    return tile_address(pad)\n", namespace)
            addresses.append(njit(namespace["caller"])())
        return addresses
    finally:
        stack.TILE_ALIGN = saved


def test_a_tiles_accumulators_sit_on_a_cache_line_wherever_the_caller_stands():
    addresses = _tile_address_from_frames_moved_by((0, 16, 32, 48), stack.TILE_ALIGN)
    assert stack.TILE_ALIGN == 64
    assert [a % 64 for a in addresses] == [0, 0, 0, 0]


def test_without_the_alignment_some_places_straddle():
    """The control: with the element's alignment the same frames put the tile at other
    offsets, so the test above can fail."""
    addresses = _tile_address_from_frames_moved_by((0, 16, 32, 48), None)
    assert len({a % 32 for a in addresses}) > 1
