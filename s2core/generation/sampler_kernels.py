"""The sampler's two passes over the whole vocabulary (sampling.py, step 1): the logits in
descending order (those of masked ids, -inf, left out) and the float32 sum of their softmax
terms in that order, compiled with numba where it is installed (the `fast` extra:
sampler_compiled.py, imported at first use), NumPy's otherwise.

Both give NumPy's numbers: a sort is a permutation of the values (here a radix sort of their
bits, 20 us for 4096 float32 on a Zen 4 where NumPy's comparison sort took 45: that NumPy
build does not dispatch its AVX-512 sort there), and the sum is the same float32 additions in
the same order (np.cumsum's, 15 us there, 4 us compiled). A frame draws ten tokens, each over
about 4096 ids, between the Fast-AR's calls: the draws took 3 % of a four-layer q4_k_m frame
of one sequence and 7 % of one of eight. With these passes compiled a draw alone takes
0.57-0.59x the time; served, the draws take 0.85x and 0.79x (2.19 against 2.58 and 8.38
against 10.56 ms a frame, `sampler-20261207-2018-q4_k_m-...`): there each draw finds the
caches full of the weights just streamed.

A batch's draws of a codebook then went from one sequence after another to one call of each
pass for all of them, the rows spread over the cores (sampling.candidates_rows): eight rows
of 4096 logits, candidates and draws, 0.67x the time row after row (flat logits; 0.47x
peaked); served, eight q4_k_m sequences' draws 5.67 against 8.17 ms a frame, their frames
within the noise (row after row 0.99x, 0.94-1.06; `sampler-20261208-0117-q4_k_m-...`).

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


def descending_numpy(values: np.ndarray) -> np.ndarray:
    """descending's numbers with NumPy's sort."""
    ordered = -np.sort(-values)
    return ordered[:np.count_nonzero(ordered != -np.inf)]  # -inf sorts last


def sequential_sum_numpy(x: np.ndarray) -> np.float32:
    """sequential_sum's number with NumPy's cumulative sum."""
    return np.cumsum(x, dtype=np.float32)[-1]


@functools.cache
def compiled():
    """The compiled passes (sampler_compiled.py), imported at their first use; None without
    numba."""
    if not COMPILED:
        return None
    from s2core.generation import sampler_compiled
    return sampler_compiled


def descending(values: np.ndarray) -> np.ndarray:
    """The values (1-D, no NaN) but -inf as float32 in descending order."""
    values = np.ascontiguousarray(values, dtype=np.float32)
    c = compiled()
    return descending_numpy(values) if c is None else c.descending(values)


def sequential_sum(x: np.ndarray) -> np.float32:
    """Sum in index order in float32, as a C loop does (np.sum is pairwise)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    c = compiled()
    return sequential_sum_numpy(x) if c is None else c.sequential_sum(x)
