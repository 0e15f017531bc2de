#!/usr/bin/env python
"""The F16 few-row kernels' two forms against each other: what f16.wide_registers decides by.

    python benchmarks/f16_row_forms.py [--rows 2,4,8] [--reps 9] [--bytes 300e6]
                                       [--shapes 9728x2560,...]
    NUMBA_CPU_NAME=haswell NUMBA_CPU_FEATURES=<machine.HASWELL> python benchmarks/f16_row_forms.py

A batched decode step multiplies each F16 matrix (arithmetic "f32", the tiled layout of
f16.py) by one activation row per sequence. f16.f16_rows takes four rows of a whole tile
(64 outputs) a pass, f16.f16_pair two; f16.f16_row_pairs takes a pair of rows by 32 outputs a
pass, over spans of a tile's inputs. Both give the same bits (checked here before timing, and
in tests/test_f16_row_forms.py). For each of S2 Pro's four matrix shapes (the FFN's gate and
up, its down, the attention's fused projection and its output) and each row count, copies of
the matrix whose sum passes L3 are streamed from memory by each form in turn, the order
reversed every other repetition (kernel_rows.alternated_ms): the median time of each and
pairs / four rows (two rows: pairs / f16_pair). The compiled target and the row count decide
which form a model takes (f16.wide_registers); this measures both on it. Writes
benchmarks/results/f16-row-forms-<date>-<time>-<machine tag>.json and .md with the CPU model
and flags.
"""

from __future__ import annotations

import argparse
import sys
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "backends"):  # a checkout that is not pip-installed
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import numpy as np  # noqa: E402
from kernel_rows import alternated_ms, write_kernel_report  # noqa: E402

#: S2 Pro's F16 matrices of a layer (out, in): gate and up, down, q/k/v fused, output
SHAPES = ((9728, 2560), (2560, 9728), (6144, 2560), (2560, 4096))


def copies_of(shape: tuple[int, int], total_bytes: float, rng) -> list:
    """Copies of one random F16 matrix in the tiled layout, as many as `total_bytes` holds
    (at least 3), each a namespace with .codes (int16 bits) as alternated_ms takes it."""
    from s2core_numpy.f16 import F16Matrix
    values = (rng.standard_normal(shape) * 0.05).astype(np.float16)
    n = max(3, int(total_bytes // values.nbytes))
    return [types.SimpleNamespace(kind=None, codes=F16Matrix.from_raw(values).codes.view(np.int16))
            for _ in range(n)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="2,4,8")
    ap.add_argument("--shapes", default=",".join(f"{o}x{i}" for o, i in SHAPES),
                    help="matrices as OUTxIN, comma-separated (S2 Pro's by default)")
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--bytes", type=float, default=300e6,
                    help="bytes of copies streamed per shape (their sum must pass L3)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    args = ap.parse_args(argv)

    from s2core_numpy import f16, simd
    rng = np.random.default_rng(0)
    results = []
    shapes = [tuple(int(n) for n in shape.split("x")) for shape in args.shapes.split(",")]
    for shape in shapes:
        mats = copies_of(shape, args.bytes, rng)
        for rows in (int(r) for r in args.rows.split(",")):
            x = rng.standard_normal((rows, shape[1])).astype(np.float32)
            four = f16.f16_pair if rows == 2 else f16.f16_rows
            forms = {"four_rows": four, "pairs": f16.f16_row_pairs}
            outs = {}
            for key, kernel in forms.items():
                outs[key] = np.zeros((rows, mats[0].codes.shape[0] * f16.TILE), np.float32)
                kernel(mats[0].codes, x, outs[key])
            if not np.array_equal(outs["four_rows"], outs["pairs"]):
                print(f"{shape} {rows} rows: the two forms differ", file=sys.stderr)
                return 1
            ms = alternated_ms({k: (lambda _, codes, f=f, o=outs[k]: f(codes, x, o))
                                for k, f in forms.items()}, mats, (), args.reps)
            row = {"out": shape[0], "in": shape[1], "rows": rows, "copies": len(mats),
                   "four_rows_ms": ms["four_rows"], "pairs_ms": ms["pairs"],
                   "pairs_over_four_rows": ms["pairs"] / ms["four_rows"]}
            results.append(row)
            print(f"{shape[0]} x {shape[1]}, {rows} rows: four rows {ms['four_rows']:.3f} ms, "
                  f"pairs {ms['pairs']:.3f} ms, {row['pairs_over_four_rows']:.2f}", flush=True)

    build = simd.isa() or "no integer kernels"
    lines = [f"F16 few-row kernels, pairs of rows by {f16.PAIR_OUTPUTS} outputs over spans of "
             f"{f16.PAIR_SPAN} inputs (f16_row_pairs) against four rows of a whole tile "
             f"(f16_rows; two rows: f16_pair); numba's target: {build} (a model here takes "
             f"{'four rows' if f16.wide_registers() else 'pairs from eight rows'}). Median ms "
             f"of {args.reps} alternated reps over copies streamed from memory.", "",
             "| matrix | rows | copies | four rows ms | pairs ms | pairs / four rows |",
             "|---|---:|---:|---:|---:|---:|"]
    for r in results:
        lines.append(f"| {r['out']} x {r['in']} | {r['rows']} | {r['copies']} | "
                     f"{r['four_rows_ms']:.3f} | {r['pairs_ms']:.3f} | "
                     f"{r['pairs_over_four_rows']:.2f} |")
    write_kernel_report(args.out, "f16-row-forms", results, lines,
                        wide_registers=f16.wide_registers())
    return 0


if __name__ == "__main__":
    sys.exit(main())
