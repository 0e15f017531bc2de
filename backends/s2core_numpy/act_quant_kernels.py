"""numba forms of act_quant.py's Q8_0/Q8_1 codes and Q8_K rounding: one pass per block instead
of numpy's several whole-array passes (a 2560-wide row: ~140 -> ~20 us under load), the same
float32 operations in the same order, so the same numbers bit for bit."""

from __future__ import annotations

import numpy as np
from numba import njit

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


@njit(cache=True)
def q8_0_quantize(blocks, codes, d, sums):
    """blocks (n, 32) float32 -> int8 codes (n, 32) as q8_codes, d (n,) = amax / 127
    (unrounded), and the codes' sums per 16 (n, 2) int32, for the integer kernels."""
    for b in range(blocks.shape[0]):
        amax = _F32(0)
        for i in range(32):
            amax = max(amax, abs(blocks[b, i]))
        d[b] = amax / _F32(127)
        inverse = _F32(127) / amax if amax != 0 else _F32(0)
        for half in range(2):
            total = 0
            for i in range(16 * half, 16 * half + 16):
                q = np.int8(np.rint(blocks[b, i] * inverse))
                codes[b, i] = q
                total += q
            sums[b, half] = total


@njit(cache=True)
def q8_k_quantize(blocks, codes, d, sums):
    """blocks (n, 256) float32 -> Q8_K's int8 codes (n, 256), d (n,) and sums per 16
    (n, 16) int32 (q8_k_snap's rounding)."""
    for b in range(blocks.shape[0]):
        amax, peak = _F32(0), _F32(0)
        for i in range(256):
            if abs(blocks[b, i]) > amax:
                amax, peak = abs(blocks[b, i]), blocks[b, i]
        if amax == 0:
            codes[b, :] = 0
            sums[b, :] = 0
            d[b] = 0
            continue
        iscale = _F32(-127) / peak
        d[b] = _F32(1) / iscale
        for s in range(16):
            total = 0
            for i in range(16 * s, 16 * s + 16):
                q = np.int8(min(np.rint(blocks[b, i] * iscale), _F32(127)))
                codes[b, i] = q
                total += q
            sums[b, s] = total
