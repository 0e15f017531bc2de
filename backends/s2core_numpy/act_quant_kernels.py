"""numba forms of act_quant.py's Q8_0 and Q8_K rounding: int8 codes, d and the codes' sums per
16, for the integer kernels (int_dots.py) and, times d, for the rounded-float path. The same
float32 operations as act_quant.py's numpy forms, so the same numbers bit for bit, written as
passes LLVM vectorizes (a maximum, a rounding, sums): ~5x faster than one branchy pass."""

from __future__ import annotations

import numpy as np
from numba import njit

from . import kernel_cache  # noqa: F401  (first: numba's cache follows every source here)
from .f16 import _through_half, as_float32

_F32 = np.float32


#: adding then subtracting 1.5 * 2^23 rounds a float32 below 2^22 in magnitude to the nearest
#: integer, ties to even, as rint does (the default rounding mode), in two vector instructions:
#: numba's np.rint calls libm once per value.
_ROUNDER = _F32(12582912.0)


@njit(inline="always")
def _abs_max_bits(bits, b):
    """The bits of max |x| over row b of `bits` (the float32 blocks seen as int32): the bits of
    non-negative floats order as the floats do, and an integer maximum vectorizes where a
    float one does not (5x here). Indexed, not sliced: a view per 32 values cost more than
    the values."""
    top = np.int32(0)
    for i in range(bits.shape[1]):
        top = max(top, bits[b, i] & np.int32(0x7FFFFFFF))
    return top


@njit(inline="always")
def _codes_and_sums(blocks, b, scale, codes, sums):
    """Row b: codes = min(rint(x * scale), 127) as int8 (|x * scale| <= 127.5), and their
    sums per 16."""
    for i in range(blocks.shape[1]):
        codes[b, i] = np.int8(min((blocks[b, i] * scale + _ROUNDER) - _ROUNDER, _F32(127)))
    for s in range(blocks.shape[1] // 16):
        total = np.int32(0)
        for i in range(16 * s, 16 * s + 16):
            total += np.int32(codes[b, i])
        sums[b, s] = total


@njit(cache=True)
def q8_0_quantize(blocks, codes, d, sums):
    """blocks (n, 32) float32 -> int8 codes (n, 32) = rint(x * 127 / amax), d (n,) = amax / 127
    (unrounded: Q8_1's s needs it), and the codes' sums per 16 (n, 2) int32."""
    bits = blocks.view(np.int32)
    for b in range(blocks.shape[0]):
        amax = as_float32(_abs_max_bits(bits, b))
        d[b] = amax / _F32(127)
        inverse = _F32(127) / amax if amax != 0 else _F32(0)
        _codes_and_sums(blocks, b, inverse, codes, sums)


@njit(cache=True)
def q8_k_quantize(blocks, codes, d, sums):
    """blocks (n, 256) float32 -> Q8_K's int8 codes (n, 256), d (n,) and sums per 16
    (n, 16) int32: the peak is the first value of largest magnitude, iscale = -127 / peak."""
    bits = blocks.view(np.int32)
    for b in range(blocks.shape[0]):
        top = _abs_max_bits(bits, b)
        if top == 0:
            codes[b, :] = 0
            sums[b, :] = 0
            d[b] = 0
            continue
        peak = _F32(0)
        for i in range(256):
            if bits[b, i] & np.int32(0x7FFFFFFF) == top:
                peak = blocks[b, i]
                break
        iscale = _F32(-127) / peak
        d[b] = _F32(1) / iscale
        _codes_and_sums(blocks, b, iscale, codes, sums)


@njit(cache=True)
def quantize_blocks(blocks, q8_0):
    """blocks (n, 32 or 256) C-contiguous float32 -> (int8 codes (n, block), d (n,) float32
    unrounded, the codes' sums per 16 (n, block / 16) int32) by Q8_0's quantizer if q8_0,
    else Q8_K's."""
    codes = np.empty(blocks.shape, np.int8)
    d = np.empty(blocks.shape[0], _F32)
    sums = np.empty((blocks.shape[0], blocks.shape[1] // 16), np.int32)
    if q8_0:
        q8_0_quantize(blocks, codes, d, sums)
    else:
        q8_k_quantize(blocks, codes, d, sums)
    return codes, d, sums


@njit(cache=True)
def integer_codes(x, q8_0):
    """The rows x (n, in) float32, C-contiguous, as the integer kernels take them: (int8 codes
    (n, in), d (n, in / block) float32 as the dot uses it, the codes' sums per 16 (n, in / 16)
    int32), in Q8_0's blocks of 32 (d rounded to float16, as ggml stores it) if q8_0, else
    Q8_K's of 256 (d kept as float32). One compiled call for the whole rounding: between two
    products the caches hold the weights just streamed, and each call from Python then costs
    about ten times its warm time (Q8_0's rounding as numpy calls around the kernel: ~40 us
    in a step, 5 us warm). Only where the integer kernels run (x86 with AVX2 or AVX-512
    VNNI, whose F16C converts to float16 in one instruction: f16._through_half)."""
    n, width = x.shape
    block = 32 if q8_0 else 256
    codes, d, sums = quantize_blocks(x.reshape(n * (width // block), block), q8_0)
    if q8_0:
        for b in range(d.shape[0]):
            d[b] = _through_half(d[b])
    return codes.reshape(n, width), d.reshape(n, width // block), sums.reshape(n, width // 16)
