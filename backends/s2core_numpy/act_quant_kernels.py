"""numba forms of act_quant.py's Q8_0/Q8_1 codes and Q8_K rounding: one pass per block instead
of numpy's several whole-array passes (a 2560-wide row: ~140 -> ~20 us under load), the same
float32 operations in the same order, so the same numbers bit for bit."""

from __future__ import annotations

import numpy as np
from numba import njit

from .f16 import _as_float32

_F32 = np.float32


@njit(cache=True)
def q8_codes(blocks, codes, d):
    """blocks (n, 32) float32 -> codes (n, 32) (rint(x * 127 / amax), float32) and
    d (n,) = amax / 127."""
    for b in range(blocks.shape[0]):
        amax = _F32(0)
        for i in range(32):
            amax = max(amax, abs(blocks[b, i]))
        d[b] = amax / _F32(127)
        inverse = _F32(127) / amax if amax != 0 else _F32(0)
        for i in range(32):
            codes[b, i] = np.rint(blocks[b, i] * inverse)


@njit(cache=True)
def q8_k_snap(blocks, out):
    """blocks (n, 256) float32 -> d * codes, Q8_K's rounding (act_quant.snap_q8_k)."""
    for b in range(blocks.shape[0]):
        amax, peak = _F32(0), _F32(0)
        for i in range(256):
            if abs(blocks[b, i]) > amax:
                amax, peak = abs(blocks[b, i]), blocks[b, i]
        if amax == 0:
            out[b, :] = 0
            continue
        iscale = _F32(-127) / peak
        d = _F32(1) / iscale
        for i in range(256):
            out[b, i] = min(np.rint(blocks[b, i] * iscale), _F32(127)) * d


# The integer codes for the integer kernels (int_dots.py): the same rounding as above, written
# as separate passes that LLVM vectorizes (a maximum, a rounding, sums); ~5x faster than one
# branchy pass.
#: adding then subtracting 1.5 * 2^23 rounds a float32 below 2^22 in magnitude to the nearest
#: integer, ties to even, as rint does (the default rounding mode), in two vector instructions:
#: numba's np.rint calls libm once per value.
_ROUNDER = _F32(12582912.0)


@njit(inline="always")
def _abs_max_bits(x):
    """The bits of max |x| (as int32): the bits of non-negative floats order as the floats do,
    and an integer maximum vectorizes where a float one does not (5x here)."""
    bits = x.view(np.int32)
    top = np.int32(0)
    for i in range(bits.shape[0]):
        top = max(top, bits[i] & np.int32(0x7FFFFFFF))
    return top


@njit(inline="always")
def _codes_and_sums(x, scale, cap, codes, sums):
    """codes = min(rint(x * scale), cap) as int8 (|x * scale| <= 127.5), their sums per 16."""
    for i in range(x.shape[0]):
        codes[i] = np.int8(min((x[i] * scale + _ROUNDER) - _ROUNDER, cap))
    for s in range(x.shape[0] // 16):
        total = np.int32(0)
        for i in range(16 * s, 16 * s + 16):
            total += np.int32(codes[i])
        sums[s] = total


@njit(cache=True)
def q8_0_quantize(blocks, codes, d, sums):
    """blocks (n, 32) float32 -> int8 codes (n, 32) as q8_codes, d (n,) = amax / 127
    (unrounded), and the codes' sums per 16 (n, 2) int32. Indexed loops, no per-block views:
    a view per 32 values cost more than the values."""
    bits = blocks.view(np.int32)
    for b in range(blocks.shape[0]):
        top = np.int32(0)
        for i in range(32):
            top = max(top, bits[b, i] & np.int32(0x7FFFFFFF))
        amax = _as_float32(top)
        d[b] = amax / _F32(127)
        inverse = _F32(127) / amax if amax != 0 else _F32(0)
        for i in range(32):
            codes[b, i] = np.int8(min((blocks[b, i] * inverse + _ROUNDER) - _ROUNDER, _F32(127)))
        for half in range(2):
            total = np.int32(0)
            for i in range(16 * half, 16 * half + 16):
                total += np.int32(codes[b, i])
            sums[b, half] = total


@njit(cache=True)
def q8_k_quantize(blocks, codes, d, sums):
    """blocks (n, 256) float32 -> Q8_K's int8 codes (n, 256), d (n,) and sums per 16
    (n, 16) int32 (q8_k_snap's rounding: the peak is the first value of largest magnitude)."""
    for b in range(blocks.shape[0]):
        x = blocks[b]
        top = _abs_max_bits(x)
        amax = _as_float32(top)
        if amax == 0:
            codes[b, :] = 0
            sums[b, :] = 0
            d[b] = 0
            continue
        peak = amax
        bits = x.view(np.int32)
        for i in range(256):
            if bits[i] & np.int32(0x7FFFFFFF) == top:
                peak = x[i]
                break
        iscale = _F32(-127) / peak
        d[b] = _F32(1) / iscale
        _codes_and_sums(x, iscale, _F32(127), codes[b], sums[b])
