#!/usr/bin/env python
"""The VNNI/AVX2 integer kernels with a chunk of exactly BLOCK rows taken by the BLOCK-row
kernel ("block") against one row a call ("rows"), alternated, streaming from memory.

    python benchmarks/int_block_rows.py [--types Q8_0,Q4_K,Q6_K] [--rows 4,6,8] [--matrices 40]

simd.products takes BLOCK (4) activation rows a kernel call, sharing each weight load, while
as many remain. With exactly BLOCK rows each 256 inputs' call follows the previous one on the
same accumulators; on AMD's Zen that ran slower than one row a call, so simd.LONE_BLOCK turns
it off there (simd.lone_block). For each type, `--matrices` copies of one 9728 x 2560 matrix
of random valid blocks (S2 Pro's FFN shape; 40 copies pass any L3) are multiplied in turn by
each row count both ways: the mean per product, median of `--reps`, and block / rows. Past
BLOCK rows both ways take the block kernel (another call comes between), so 6 and 8 rows are
the control: their ratio is the noise. Both give the same bits (tests/test_int_dots.py).
Writes benchmarks/results/int-block-rows-<date>-<time>[-avx2].json with the CPU model, flags,
the host CPU's LLVM name and NUMBA_CPU_NAME (set it and NUMBA_CPU_FEATURES to HASWELL's to
measure the AVX2 build).
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
from kernel_rows import alternated_ms, kernel_args, packed_copies  # noqa: E402

from s2core.benchmarking.machine import cpu_flags, cpu_model  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--types", default="Q8_0,Q4_K,Q6_K")
    parser.add_argument("--rows", default="4,6,8")
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--matrices", type=int, default=40)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    args = parser.parse_args()

    from s2core_numpy import simd
    if not simd.isa():
        sys.exit("no integer kernels here: numba's target has neither AVX2 nor AVX-512 VNNI")
    rng = np.random.default_rng(0)
    kernels = {"block": lambda *a: simd.products(*a, True),
               "rows": lambda *a: simd.products(*a, False)}
    results = {}
    for name in args.types.split(","):
        mats = packed_copies(name, args.matrices)
        rows_out = []
        for rows in (int(r) for r in args.rows.split(",")):
            ms = alternated_ms(kernels, mats, kernel_args(mats[0], rows, rng), args.reps)
            row = {"rows": rows, **{f"{k}_ms": v for k, v in ms.items()}}
            row["block_over_rows"] = row["block_ms"] / row["rows_ms"]
            rows_out.append(row)
            print(name, json.dumps(row), flush=True)
        results[name] = rows_out
    report = {"results": results, "matrices": args.matrices, "cpu_model": cpu_model(),
              "cpu_flags": cpu_flags(), "host_cpu": simd.host_cpu(), "isa": simd.isa(),
              "numba_cpu_name": os.environ.get("NUMBA_CPU_NAME", ""),
              "lone_block": {str(k): v for k, v in simd.LONE_BLOCK.items()}}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tag = "-avx2" if simd.isa() == "avx2" else ""  # the two builds, run in one minute
    path = out / f"int-block-rows-{time.strftime('%Y%m%d-%H%M')}{tag}.json"
    path.write_text(json.dumps(report, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
