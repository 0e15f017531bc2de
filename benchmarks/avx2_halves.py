#!/usr/bin/env python
"""The AVX2 integer kernels by halves of their 16 output rows against side by side.

The two forms alternated in one process: what simd.halves decides by.

    NUMBA_CPU_NAME=haswell NUMBA_CPU_FEATURES=<machine.HASWELL> \
        python benchmarks/avx2_halves.py [--types Q4_K,Q6_K,Q8_0] [--rows 1,4,8] [--reps 9]

On AVX2 a 64-byte group of weights is two 32-byte registers, one per half of a tile's 16
output rows. Emitted side by side, a kernel of four activation rows keeps both halves'
accumulators, weights and scales live, more than AVX2's 16 vector registers, and LLVM spills
to the stack; emitted by halves (simd.Emitter's `half`, a memory barrier between so that the
second half reloads its activation bytes instead of keeping the first half's), each half
needs half the registers, at the price of broadcasting every activation word twice.

For each type, each row count and each place (in cache: one 512 x 2560 matrix, its tiles in
L2; from memory: 24 copies of one 9728 x 2560 matrix, S2 Pro's FFN shape), simd.products is
compiled twice over its own code (kernel_rows.products_over), once with every kernel side by
side and once with every kernel by halves; the two give the same bits (checked here, and in
tests/test_int_dots.py) and run in turn, the order reversed every other repetition: the
median time of each and halves / side by side. Needs numba's AVX2 target (an AVX2-only CPU,
or the variables above on an AVX-512 one). Writes benchmarks/results/avx2-halves-<date>-
<time>-<machine tag>.json and .md with the CPU model and flags.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "backends"):  # a checkout that is not pip-installed
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import numpy as np  # noqa: E402
from kernel_rows import (add_streaming_options, alternated_ms, kernel_args,  # noqa: E402
                         packed_copies, products_over, write_kernel_report)


BODIES = ("q8_0", "q4_k", "q6_k")


def variant(halves: bool):
    """simd.products with every kernel side by side (False) or by halves (True)."""
    from s2core_numpy import simd
    namespace = dict(simd.__dict__)
    for name in BODIES:
        body, ahead = getattr(simd, f"_{name}"), simd.AHEAD[name]
        namespace[f"{name}_block"] = simd._make(body, 1, ahead, halves=halves)
        namespace[f"{name}_blocks"] = simd._make(body, simd.BLOCK, ahead, halves=halves)
        namespace[f"{name}_alone"] = (namespace[f"{name}_block"] if simd.PREFETCH_ALONE
                                      else simd._make(body, 1, 0, halves=halves))
    return products_over(namespace)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--types", default="Q4_K,Q6_K,Q8_0")
    ap.add_argument("--rows", default="1,4,8")
    add_streaming_options(ap, ROOT / "benchmarks" / "results")
    args = ap.parse_args(argv)

    from s2core_numpy import simd
    if simd.isa() != "avx2":
        print(f"numba's target here is {simd.isa() or 'without integer kernels'}, not AVX2: "
              "set NUMBA_CPU_NAME=haswell and NUMBA_CPU_FEATURES to "
              "s2core.benchmarking.machine.HASWELL", file=sys.stderr)
        return 2
    kernels = {"side_by_side": variant(False), "halves": variant(True)}
    rng = np.random.default_rng(0)
    rows_list = [int(r) for r in args.rows.split(",")]
    results = []
    for name in args.types.split(","):
        places = {"cache": (packed_copies(name, 1, (512, 2560)), 20),
                  "memory": (packed_copies(name, args.copies), 1)}
        for place, (mats, repeat) in places.items():
            lone = simd.LONE_BLOCK[mats[0].kind]
            for rows in rows_list:
                args_ = kernel_args(mats[0], rows, rng)
                outs = {}
                for key, f in kernels.items():
                    out = np.zeros_like(args_[3])
                    f(mats[0].kind, mats[0].codes, *args_[:3], out, lone)
                    outs[key] = out
                if not np.array_equal(outs["side_by_side"], outs["halves"]):
                    print(f"{name}: the two forms differ", file=sys.stderr)
                    return 1
                ms = alternated_ms({k: (lambda k_, c, *a, f=f: f(k_, c, *a, lone))
                                    for k, f in kernels.items()},
                                   mats * repeat, args_, args.reps)
                row = {"type": name, "place": place, "rows": rows,
                       "side_by_side_ms": ms["side_by_side"], "halves_ms": ms["halves"],
                       "halves_over_side_by_side": ms["halves"] / ms["side_by_side"]}
                results.append(row)
                print(f"{name} {place} {rows} rows: side by side {ms['side_by_side']:.4f} ms, "
                      f"halves {ms['halves']:.4f} ms, {row['halves_over_side_by_side']:.2f}",
                      flush=True)

    lines = ["AVX2 integer kernels by halves of the 16 output rows against side by side "
             f"(median ms of {args.reps} alternated reps; in cache 512 x 2560, from memory "
             f"{args.copies} copies of 9728 x 2560).", "",
             "| type | where | rows | side by side ms | halves ms | halves / side by side |",
             "|---|---|---:|---:|---:|---:|"]
    for r in results:
        lines.append(f"| {r['type']} | {r['place']} | {r['rows']} | {r['side_by_side_ms']:.4f} "
                     f"| {r['halves_ms']:.4f} | {r['halves_over_side_by_side']:.2f} |")
    write_kernel_report(args.out, "avx2-halves", results, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
