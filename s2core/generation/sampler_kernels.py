"""The sampler's two passes over the whole vocabulary (sampling.py, step 1): the logits in
descending order (those of masked ids, -inf, left out) and the float32 sum of their softmax
terms in that order, compiled with numba where it is installed (the `fast` extra), NumPy's
otherwise.

Both give NumPy's numbers: a sort is a permutation of the values (here a radix sort of their
bits, 20 us for 4096 float32 on a Zen 4 where NumPy's comparison sort took 45: that NumPy
build does not dispatch its AVX-512 sort there), and the sum is the same float32 additions in
the same order (np.cumsum's, 15 us there, 4 us compiled). A frame draws ten tokens, each over
about 4096 ids, one sequence after another between the Fast-AR's calls: the draws took 3 % of
a four-layer q4_k_m frame of one sequence and 7 % of one of eight. With these passes compiled
a draw alone takes 0.57-0.59x the time; served, the draws take 0.85x and 0.79x (2.19 against
2.58 and 8.38 against 10.56 ms a frame, `sampler-20261207-2018-q4_k_m-...`): there each draw
finds the caches full of the weights just streamed.

Only the sign of a zero may differ from np.sort's output: -0.0 sorts as +0.0 here, which
np.sort leaves in either place; every later step compares or subtracts them, where the two
are equal.
"""

from __future__ import annotations

import functools
import importlib.util

import numpy as np

#: whether numba is installed: the passes are compiled at their first use (importing numba
#: takes a while, and `import s2core` imports no framework)
COMPILED = importlib.util.find_spec("numba") is not None

#: bits of the sort key taken per radix pass (three passes cover 32 bits)
_DIGIT_BITS = 11


def descending_numpy(values: np.ndarray) -> np.ndarray:
    """descending's numbers with NumPy's sort."""
    ordered = -np.sort(-values)
    return ordered[:np.count_nonzero(ordered != -np.inf)]  # -inf sorts last


def sequential_sum_numpy(x: np.ndarray) -> np.float32:
    """sequential_sum's number with NumPy's cumulative sum."""
    return np.cumsum(x, dtype=np.float32)[-1]


def _descending_radix(values):
    """values (float32, no NaN) but -inf in descending order: an LSD radix sort of keys that
    order as the floats do, inverted for the descending order."""
    sign, minus_inf = np.uint32(0x80000000), np.uint32(0xFF800000)
    keys = np.empty(values.shape[0], np.uint32)
    bits = values.view(np.uint32)
    n = 0
    for i in range(values.shape[0]):
        k = bits[i]
        if k == minus_inf:
            continue
        if k == sign:  # -0.0 sorts as +0.0
            k = np.uint32(0)
        # ascending key: negatives' bits inverted, positives' sign bit set; then inverted
        keys[n] = k if k & sign else ~(k | sign)
        n += 1
    keys = keys[:n]
    spare = np.empty(n, np.uint32)
    buckets = 1 << _DIGIT_BITS
    count = np.empty(buckets, np.int64)
    mask = np.uint32(buckets - 1)
    for shift in range(0, 32, _DIGIT_BITS):
        count[:] = 0
        for i in range(n):
            count[(keys[i] >> np.uint32(shift)) & mask] += 1
        if count.max() == n:  # every key has this digit: the order stands
            continue
        total = 0
        for b in range(buckets):
            c = count[b]
            count[b] = total
            total += c
        for i in range(n):
            b = (keys[i] >> np.uint32(shift)) & mask
            spare[count[b]] = keys[i]
            count[b] += 1
        keys, spare = spare, keys
    out = np.empty(n, np.float32)
    out_bits = out.view(np.uint32)
    for i in range(n):
        k = ~keys[i]
        out_bits[i] = k & ~sign if k & sign else ~k
    return out


def _sequential_sum_loop(x):
    """float32 additions in index order, as a C loop (and np.cumsum) makes them."""
    total = np.float32(0.0)
    for i in range(x.shape[0]):
        total += x[i]
    return total


@functools.cache
def _passes() -> tuple:
    """(descending, sequential_sum) on contiguous float32: compiled, or NumPy's."""
    if not COMPILED:
        return descending_numpy, sequential_sum_numpy
    from numba import njit
    return (njit(cache=True, nogil=True)(_descending_radix),
            njit(cache=True, nogil=True)(_sequential_sum_loop))


def descending(values: np.ndarray) -> np.ndarray:
    """The values (1-D, no NaN) but -inf as float32 in descending order."""
    return _passes()[0](np.ascontiguousarray(values, dtype=np.float32))


def sequential_sum(x: np.ndarray) -> np.float32:
    """Sum in index order in float32, as a C loop does (np.sum is pairwise)."""
    return _passes()[1](np.ascontiguousarray(x, dtype=np.float32))
