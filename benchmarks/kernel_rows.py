"""What the integer kernels' benchmarks (amx_rows.py, int_block_rows.py, kernels_ab.py,
multiply_peak.py, prefetch_ahead.py, step_prefetch_alone.py, ...) share: copies of one
9728 x 2560 matrix (S2 Pro's FFN shape) of random valid blocks, packed as the NumPy backend
packs them for its integer kernels, the quantized activation rows they take, the time of each
of several kernels over all copies, alternated, simd.products compiled over other kernels,
and a model's integer matrices made to multiply with them. Import it after the scripts have
put the repository on sys.path."""

from __future__ import annotations

import statistics
import time
import types
from pathlib import Path
from typing import Callable

import numpy as np
from gguf import GGMLQuantizationType as QT

from ab import write_machine_report

from s2core.kit.blocks import random_blocks

SHAPE = (9728, 2560)


def add_streaming_options(parser, results_dir, reps: int = 9) -> None:
    """The options of a script that alternates kernels over copies of the matrix: --reps,
    --copies and --out (default `results_dir`)."""
    parser.add_argument("--reps", type=int, default=reps)
    parser.add_argument("--copies", type=int, default=24,
                        help="copies of the 9728 x 2560 matrix streamed (their sum must pass L3)")
    parser.add_argument("--out", default=str(results_dir))


def write_kernel_report(out, kind: str, results: list, lines: list[str], **extra) -> Path:
    """A kernel benchmark's `results` and `extra` beside numba's target (simd.isa) and LLVM's
    name for the host CPU, with what ab.write_machine_report records of the machine."""
    from s2core_numpy import simd
    return write_machine_report(out, kind, {"isa": simd.isa(), "results": results,
                                            "host_cpu": simd.host_cpu(), **extra}, lines)


def packed_copies(name: str, copies: int, shape: tuple[int, int] = SHAPE) -> list:
    """`copies` IntDotMatrix of one matrix of type `name` ("Q8_0", "Q4_K", "Q6_K")."""
    from s2core_numpy.int_dots import IntDotMatrix
    qt = QT[name]
    per_block = 32 if qt == QT.Q8_0 else 256
    raw = random_blocks(qt, shape[0], shape[1] // per_block, 3)
    return [IntDotMatrix.from_raw(raw, qt) for _ in range(copies)]


def kernel_args(m, rows: int, rng: np.random.Generator) -> tuple:
    """(xq, xd, xs, out) for `rows` random activation rows of m: a kernel's arguments after
    (kind, codes)."""
    from s2core_numpy import act_quant
    x = rng.standard_normal((rows, SHAPE[1])).astype(np.float32)
    xq, xd, xs = act_quant.quantize(m.dot_type, x)
    return xq, xd, xs, np.empty((rows, m.codes.shape[0] * 16), np.float32)


def alternated_ms(kernels: dict[str, Callable], mats: list, args: tuple, reps: int
                  ) -> dict[str, float]:
    """Median over `reps` of each kernel's mean time per product (ms) over `mats`, each
    kernel `f(kind, codes, *args)`: warmed (compiled) first, then run in turn, the order
    reversed every other repetition so that a drift of the machine hits them alike."""
    m = mats[0]
    for f in kernels.values():
        f(m.kind, m.codes, *args)
    times: dict[str, list[float]] = {k: [] for k in kernels}
    order = list(kernels.items())
    for rep in range(reps):
        for key, f in order if rep % 2 == 0 else order[::-1]:
            t = time.perf_counter()
            for each in mats:
                f(each.kind, each.codes, *args)
            times[key].append((time.perf_counter() - t) / len(mats))
    return {k: statistics.median(v) * 1e3 for k, v in times.items()}


def products_over(namespace: dict) -> Callable:
    """simd.products' own code (nothing copied) compiled over `namespace`: simd's globals with
    some kernels swapped."""
    from numba import njit
    from s2core_numpy import simd
    code = simd.products.py_func
    return njit(parallel=True)(types.FunctionType(code.__code__, namespace, code.__name__))


def multiplying_with(products: Callable) -> Callable:
    """An IntDotMatrix.__call__ that multiplies with `products` (simd.products' signature)
    instead of the compiled call int_dots makes (int_dots._quantized_products, which holds
    simd.products inside: reassigning a module's name does not reach it): the same rounding
    of the activation (act_quant_kernels.integer_codes) and the same output. Assign it to
    int_dots.IntDotMatrix.__call__ to serve a model with other kernels."""
    from s2core_numpy import simd
    from s2core_numpy.act_quant_kernels import integer_codes

    def call(matrix, x):
        x = np.ascontiguousarray(x, dtype=np.float32)
        out = np.empty((x.shape[0], matrix.codes.shape[0] * simd.ROWS), np.float32)
        xq, xd, xs = integer_codes(x, matrix.kind == simd.Q8_0_KIND)
        products(matrix.kind, matrix.codes, xq, xd, xs, out, simd.LONE_BLOCK[matrix.kind])
        return out[:, :matrix.n_out]
    return call
