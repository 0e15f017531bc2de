"""Products of a few rows (2 to the type's gemm_rows - 1, tiled.py: a batched decode step, one
row per sequence) from the F16 and Q8_0 tiled layouts, each weight read from memory once for
all rows.

The generic few-row kernels these replace (Q8_0: every row a separate pass over the tile,
converting its codes again; F16: accumulators of a run-time row count) took 2.8x (F16) and
3.8x (Q8_0) the time of one row for 4 rows of 9728 x 2560: a batch of 4 gained little.
Here rows go in groups of four with four accumulators of the compile-time TILE: each widened
weight feeds four multiply-adds, and the loops vectorize fully (AVX-512 here). The
accumulators are stack arrays (stack.py), which LLVM keeps in vector registers: with heap
arrays they went through L1 on every input (four rows of 9728 x 2560, four runs: F16
1.57-2.68 -> 1.08-1.70 ms against one row's 1.06-1.42; Q8_0 1.41-1.56 -> 1.02-1.13 ms against
0.72-0.76; more below). The rows left after the groups of four go to a two-row form of each kernel when
they are one or two (one padded with a zero row), so a batch of two costs about half what
four do; three are padded to four (zero rows, outputs dropped).

Measured on 9728 x 2560 (2 shared cores, noisy): 4 rows in 10.5 ms (F16, was 16) and 3.7 ms
(Q8_0, was 11); 28 rows (a prefill chunk) 61 and 28 ms (were 69 and 92).
With the two-row kernels (same matrix, medians of 15, 2 cores): F16 1 / 2 / 4 rows 4.7 / 5.8
/ 8.8 ms, Q8_0 2.3 / 1.7 / 6.2 ms (two rows had cost what four do).
Four 9728 x 2560 matrices in turn (read from memory, not L3), medians of 12, quiet: Q8_0 1 / 2
/ 4 / 8 rows 1.41 / 1.97 / 4.01 / 4.97 ms; F16 1.83 / 1.75 / 4.34 / 7.68 ms, and 1.87 / 1.76 /
2.58 ms since F16 weights are widened in registers (f16._widen: no trip through a buffer).
With the accumulators on the stack (same matrices, medians of 15, quiet): F16 1 / 2 / 4 / 8
rows 1.52 / 1.26 / 1.86 / 2.25 ms, Q8_0 0.99 / 0.93 / 1.11 / 1.97 ms.

The kernels live beside their type's one-row kernels (f16.py: f16_rows, f16_pair; q8_0.py:
q8_0_rows, q8_0_pair); this module groups the rows for them. Every few-row kernel and the
one-row kernels fuse each multiply with its add
(fastmath "contract": one rounding instead of two; sums are not reordered). With separate
multiplies and adds, eight rows were bound by the arithmetic: measured alternated, 8 rows
1.96-2.15 -> 1.58-1.73 ms (F16), 1.50-2.03 -> 1.26-1.54 ms (Q8_0); one row unchanged within
the noise.

Every row is accumulated exactly as the one-row kernels do it (F16: sum over inputs of
(w * 2^112) * x in input order; Q8_0: each block's integer-weighted sum in input order, then
scaled and added), so a row's result is bit-identical to the one-row product's and a batched
sequence gets the numbers it gets alone.
"""

from __future__ import annotations

import numpy as np

#: rows computed together from each widened weight
GROUP = 4


def few_rows(kernels: tuple, weights: tuple, x: np.ndarray, out: np.ndarray) -> None:
    """out (n, padded out) = x (n, in) @ W^T with kernels (four-row, two-row), each called
    as `kernel(*weights, x, out)`: groups of four, then one or two rows left by the two-row
    kernel, three left padded to four."""
    four, two = kernels
    n = x.shape[0]
    x = np.ascontiguousarray(x, dtype=np.float32)
    left = n % GROUP
    if left == 3:
        padded(four, weights, x, out, GROUP)
        return
    whole = n - left
    if whole:
        four(*weights, x[:whole], out[:whole])
    if left:
        padded(two, weights, x[whole:], out[whole:], 2)


def padded(kernel, weights: tuple, x: np.ndarray, out: np.ndarray, group: int) -> None:
    """kernel over x's rows padded with zero rows to a multiple of `group`."""
    n = x.shape[0]
    m = -(-n // group) * group
    if m == n:
        kernel(*weights, x, out)
        return
    xp = np.zeros((m, x.shape[1]), np.float32)
    xp[:n] = x
    tmp = np.empty((m, out.shape[1]), np.float32)
    kernel(*weights, xp, tmp)
    out[...] = tmp[:n]
