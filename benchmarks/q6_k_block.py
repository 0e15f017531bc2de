#!/usr/bin/env python
"""Q6_K products of several rows: block kernels by sub-block and by quarters, one row a call.

Alternated in one process: the block kernel by quarters (simd._q6_k: four sub-blocks' sums
side by side), the block kernel by sub-block (simd._q6_k_by_sub_block, what blocks take),
and one row a call.

    python benchmarks/q6_k_block.py [--rows 4,8] [--reps 9]
    NUMBA_CPU_NAME=haswell NUMBA_CPU_FEATURES=... python benchmarks/q6_k_block.py   # AVX2 build

A Q6_K group's three loads (two runs of low bits, one of high bits) give the codes of four
sub-blocks. By quarters a kernel keeps their four sums a row side by side, which with a block
of four rows is more than the registers hold (VNNI: 155 vector moves a tile-block to the stack
and back); by sub-block it keeps one a row and loads each group again per sub-block. One row
a call is what a chunk of exactly four rows took on AMD's Zen before (simd.lone_block).

For each row count and each place (in cache: one 512 x 2560 matrix; from memory: 24 copies
of one 9728 x 2560 matrix), simd.products is compiled over its own code (kernel_rows.
products_over) with the block kernel of each form; the three give the same bits (checked
here) and run in turn, the order reversed every other repetition. Writes benchmarks/results/
q6-k-block-<date>-<time>-<machine tag>.json and .md with the CPU model and flags.
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


def with_block(body):
    """simd.products whose Q6_K block kernel has `body`."""
    from s2core_numpy import simd
    namespace = dict(simd.__dict__)
    namespace["q6_k_blocks"] = simd._make(body, simd.BLOCK, simd.AHEAD["q6_k"],
                                          halves=simd.halves(simd.BLOCK))
    return products_over(namespace)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="4,8")
    add_streaming_options(ap, ROOT / "benchmarks" / "results")
    args = ap.parse_args(argv)

    from s2core_numpy import simd
    if not simd.isa():
        print("no integer kernels here: numba's target has neither AVX2 nor AVX-512 VNNI",
              file=sys.stderr)
        return 2
    quarters, by_sub_block = with_block(simd._q6_k), with_block(simd._q6_k_by_sub_block)
    forms = {"quarters": lambda k, c, *a: quarters(k, c, *a, True),
             "by_sub_block": lambda k, c, *a: by_sub_block(k, c, *a, True),
             "one_row_a_call": lambda k, c, *a: quarters(k, c, *a, False)}
    rng = np.random.default_rng(0)
    rows_list = [int(r) for r in args.rows.split(",")]
    results = []
    places = {"cache": (packed_copies("Q6_K", 1, (512, 2560)), 20),
              "memory": (packed_copies("Q6_K", args.copies), 1)}
    for place, (mats, repeat) in places.items():
        for rows in rows_list:
            xq, xd, xs, out = kernel_args(mats[0], rows, rng)
            # one row a call differs from the block only with exactly a block of rows
            here = {k: f for k, f in forms.items()
                    if k != "one_row_a_call" or rows == simd.BLOCK}
            outs = []
            for f in here.values():
                o = np.zeros_like(out)
                f(mats[0].kind, mats[0].codes, xq, xd, xs, o)
                outs.append(o)
            if not all(np.array_equal(outs[0], o) for o in outs[1:]):
                print("the forms differ", file=sys.stderr)
                return 1
            ms = alternated_ms(here, mats * repeat, (xq, xd, xs, out), args.reps)
            row = {"place": place, "rows": rows, **{f"{k}_ms": v for k, v in ms.items()}}
            results.append(row)
            print(place, rows, {k: round(v, 4) for k, v in ms.items()}, flush=True)

    lines = [f"Q6_K products of several rows ({simd.isa()}; median ms of {args.reps} alternated "
             f"reps; in cache 512 x 2560, from memory {args.copies} copies of 9728 x 2560): "
             "the block kernel by quarters and by sub-block, and one row a call; their ratios "
             "to by quarters.", "",
             "| where | rows | by quarters ms | by sub-block ms | one row a call ms | "
             "by sub-block / by quarters | one row a call / by quarters |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        q, one = r["quarters_ms"], r.get("one_row_a_call_ms")
        lines.append(f"| {r['place']} | {r['rows']} | {q:.4f} | {r['by_sub_block_ms']:.4f} | "
                     + (f"{one:.4f}" if one else "-") + f" | {r['by_sub_block_ms'] / q:.2f} | "
                     + (f"{one / q:.2f}" if one else "-") + " |")
    write_kernel_report(args.out, "q6-k-block", results, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
