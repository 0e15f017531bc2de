"""The sampler's compiled passes (numba): sampler_kernels.py imports this module at their first
use, where numba is installed, and gives NumPy's versions otherwise.

One row: the logits in descending order (a radix sort of their bits) and the float32 sum in
index order. Rows: the same for every row of a (B, V) block of logits at once, the rows
spread over the cores, then what `sampling.candidates` keeps of each row (its running sum,
the cut, the kept ids), so that a batch's B draws of a codebook cost one call of each pass
instead of B rows of NumPy calls one after another. Every number is the one-row path's:
the same float32 operations in the same order (tests/test_sampler_kernels.py)."""

from __future__ import annotations

import numpy as np
from numba import njit, prange

#: bits of the sort key taken per radix pass (three cover 32 bits)
_DIGIT_BITS = 11
_SIGN = np.uint32(0x80000000)
_MINUS_INF = np.uint32(0xFF800000)


@njit(cache=True, nogil=True)
def descending_into(values, out):
    """values (float32, no NaN) but -inf, in descending order, into out[:n]; returns n. An
    LSD radix sort of keys that order as the floats do, inverted for the descending order
    (-0.0 sorts as +0.0), the three digits' counts taken in the pass that makes the keys."""
    keys = np.empty(values.shape[0], np.uint32)
    bits = values.view(np.uint32)
    buckets = 1 << _DIGIT_BITS
    mask = np.uint32(buckets - 1)
    count = np.zeros((3, buckets), np.int32)
    n = 0
    for i in range(values.shape[0]):
        k = bits[i]
        if k == _MINUS_INF:
            continue
        if k == _SIGN:  # -0.0
            k = np.uint32(0)
        # ascending key: negatives' bits inverted, positives' sign bit set; then inverted
        k = np.uint32(k if k & _SIGN else ~(k | _SIGN))
        keys[n] = k
        count[0, k & mask] += 1
        count[1, (k >> np.uint32(_DIGIT_BITS)) & mask] += 1
        count[2, (k >> np.uint32(2 * _DIGIT_BITS)) & mask] += 1
        n += 1
    spare = np.empty(n, np.uint32)
    for d in range(3):
        at = count[d]
        total = 0
        for b in range(buckets):  # each bucket's first place
            c = at[b]
            if c == n:  # every key has this digit: the order stands
                break
            at[b] = total
            total += c
        if total == 0:
            continue
        shift = np.uint32(_DIGIT_BITS * d)
        for i in range(n):
            k = keys[i]
            b = (k >> shift) & mask
            spare[at[b]] = k
            at[b] += 1
        keys, spare = spare, keys
    out_bits = out.view(np.uint32)
    for i in range(n):
        k = ~keys[i]
        out_bits[i] = k & ~_SIGN if k & _SIGN else ~k
    return n


@njit(cache=True, nogil=True)
def descending(values):
    """descending_into's values, as a new array of n."""
    out = np.empty(values.shape[0], np.float32)
    return out[:descending_into(values, out)]


@njit(cache=True, nogil=True)
def sequential_sum(x):
    """float32 additions in index order, as a C loop (and np.cumsum) makes them."""
    total = np.float32(0.0)
    for i in range(x.shape[0]):
        total += x[i]
    return total


@njit(cache=True, parallel=True)
def descending_rows(logits, out, counts):
    """descending_into for every row of logits (B, V) into out (B, V), the rest of each row
    -inf; counts[b]: row b's values left (its non -inf logits)."""
    for b in prange(logits.shape[0]):
        n = descending_into(logits[b], out[b])
        counts[b] = n
        out[b, n:] = -np.inf


@njit(cache=True, parallel=True)
def kept_rows(logits, ordered, terms, counts, top_p, top_k, keep, ids):
    """sampling.candidates' cut and ids for every row: ordered (B, V), a row's logits in
    descending order (descending_rows); terms (B, V), np.exp(ordered - ordered[:, :1]) (0
    past a row's count); top_p (float32, clamped to [0, 1]) and top_k per row. Writes keep[b]
    (how many candidates) and ids[b, :keep[b]] (their ids, best first, equal logits by
    ascending id)."""
    for b in prange(logits.shape[0]):
        m = counts[b]
        n = m if top_k[b] <= 0 else min(top_k[b], m)
        total = sequential_sum(terms[b, :m])
        p = top_p[b]
        # the running sum of the first n probabilities, item 0 always kept, the first item
        # whose sum passes top_p and those after it dropped
        k = n
        running = np.float32(0.0)
        for i in range(n):
            running += terms[b, i] / total
            if i > 0 and running > p:
                k = i
                break
        keep[b] = k
        # the ids: those whose logit is at least the last kept one, in a stable sort by
        # descending logit, the first k
        last = ordered[b, k - 1]
        row = logits[b]
        above = 0
        for j in range(row.shape[0]):
            if row[j] >= last:
                above += 1
        at = np.empty(above, np.int64)
        negated = np.empty(above, np.float32)
        above = 0
        for j in range(row.shape[0]):
            if row[j] >= last:
                at[above] = j
                negated[above] = -row[j]
                above += 1
        order = np.argsort(negated, kind="mergesort")
        for i in range(k):
            ids[b, i] = at[order[i]]
