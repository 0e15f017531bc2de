#!/usr/bin/env python
"""How far ahead the integer kernels ask for their lines (simd.PREFETCH_BLOCKS): the
products with each distance, alternated, streaming from memory.

    python benchmarks/prefetch_ahead.py [--blocks 0,2,8] [--types Q8_0,Q4_K,Q6_K] [--rows 1,4,8]
                                        [--matrices 40] [--reps 7]

Each group a kernel reads asks for the line PREFETCH_BLOCKS tile-blocks on (simd.py,
prefetch.py), except where a product of one row asks for none (simd.PREFETCH_ALONE). For
each distance in `--blocks` (0: no hint at all) this builds every kernel anew at that
distance and runs simd.products' own code over them (its function with the kernels it calls
swapped, nothing copied), beside simd.products as configured ("current"); `--matrices`
copies of one 9728 x 2560 matrix (40 pass any L3) are multiplied in turn by each, the mean
per product, median of `--reps` (kernel_rows.alternated_ms). Every way gives the same bits
(checked). Writes benchmarks/results/prefetch-ahead-<date>-<time>.json with the CPU model,
flags and numba's target (set NUMBA_CPU_NAME and NUMBA_CPU_FEATURES to HASWELL's for the AVX2
build).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "backends"):  # a checkout that is not pip-installed
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import numpy as np  # noqa: E402
from kernel_rows import (alternated_ms, kernel_args, packed_copies,  # noqa: E402
                         products_over)

from s2core.benchmarking.machine import cpu_flags, cpu_model  # noqa: E402

_BODIES = {"q8_0": "_q8_0", "q4_k": "_q4_k", "q6_k": "_q6_k"}


def products_with(blocks: int):
    """simd.products over kernels that ask `blocks` tile-blocks ahead."""
    from s2core_numpy import simd
    swapped = dict(vars(simd))
    for name, body in _BODIES.items():
        ahead = simd.TILE_BLOCK_BYTES[name] * blocks
        swapped[f"{name}_block"] = swapped[f"{name}_alone"] = simd._make(getattr(simd, body),
                                                                           1, ahead)
        swapped[f"{name}_blocks"] = simd._make(getattr(simd, body), simd.BLOCK, ahead)
    return products_over(swapped)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--blocks", default="0,2,8")
    parser.add_argument("--types", default="Q8_0,Q4_K,Q6_K")
    parser.add_argument("--rows", default="1,4,8")
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--matrices", type=int, default=40)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    args = parser.parse_args()

    from s2core_numpy import simd
    if not simd.isa():
        sys.exit("no integer kernels here: numba's target has neither AVX2 nor AVX-512 VNNI")
    rng = np.random.default_rng(0)
    ways = {"current": simd.products}
    ways.update({f"ahead {b}": products_with(int(b)) for b in args.blocks.split(",")})
    results = {}
    for name in args.types.split(","):
        mats = packed_copies(name, args.matrices)
        lone = simd.LONE_BLOCK[mats[0].kind]
        kernels = {k: (lambda f: lambda *a: f(*a, lone))(f) for k, f in ways.items()}
        rows_out = []
        for rows in (int(r) for r in args.rows.split(",")):
            call = kernel_args(mats[0], rows, rng)
            outs = []
            for f in kernels.values():
                f(mats[0].kind, mats[0].codes, *call)
                outs.append(call[3].copy())
            assert all(np.array_equal(o, outs[0]) for o in outs), f"{name}: ways differ"
            ms = alternated_ms(kernels, mats, call, args.reps)
            row = {"rows": rows, **{f"{k} ms": v for k, v in ms.items()}}
            rows_out.append(row)
            print(name, json.dumps({k: round(v, 3) if isinstance(v, float) else v
                                    for k, v in row.items()}), flush=True)
        results[name] = rows_out
    report = {"results": results, "matrices": args.matrices, "cpu_model": cpu_model(),
              "cpu_flags": cpu_flags(), "host_cpu": simd.host_cpu(), "isa": simd.isa(),
              "numba_cpu_name": os.environ.get("NUMBA_CPU_NAME", ""),
              "prefetch_blocks": simd.PREFETCH_BLOCKS,
              "prefetch_alone": simd.PREFETCH_ALONE}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tag = "-avx2" if simd.isa() == "avx2" else ""
    path = out / f"prefetch-ahead-{time.strftime('%Y%m%d-%H%M')}{tag}.json"
    path.write_text(json.dumps(report, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
