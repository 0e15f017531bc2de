#!/usr/bin/env python
"""AMX against the VNNI kernels for arithmetic="ggml", by rows of activations, in one run.

    python benchmarks/amx_rows.py [--types Q8_0,Q4_K,Q6_K] [--rows 1,2,4,8,16,64] [--reps 9]
                                  [--matrices N]

For each type, one 9728 x 2560 matrix (S2 Pro's FFN shape) of random valid blocks, packed as
the NumPy backend packs it, is multiplied by 1, 2, 4, ... activation rows with the VNNI
kernels (simd.products) and with the tile units (amx.products), alternated: the median of
`--reps` each, and each as a multiple of the VNNI kernels' one-row product (the shared timing: benchmarks/kernel_rows.py). Both give the same
bits (tests/test_amx.py); this measures which is faster at each row count, which is what
amx.MIN_ROWS encodes. The 480 MB L3 of the machine it was written on holds one matrix: those
are compute times. `--matrices N` packs N copies and multiplies them in turn (a time is then
the mean per product), so that with N x the matrix's bytes past the L3 (40 copies of Q8_0:
1.06 GB) each product streams its matrix from memory, as a model's do. Writes
benchmarks/results/amx-rows-<date>-<time>.json with the CPU model and flags.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "backends"):  # a checkout that is not pip-installed
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import numpy as np  # noqa: E402
from gguf import GGMLQuantizationType as QT  # noqa: E402
from kernel_rows import alternated_ms, kernel_args, packed_copies  # noqa: E402

from s2core.benchmarking.machine import cpu_flags, cpu_model  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--types", default="Q8_0,Q4_K,Q6_K")
    parser.add_argument("--rows", default="1,2,4,8,16,64")
    parser.add_argument("--reps", type=int, default=9)
    parser.add_argument("--matrices", type=int, default=1)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    args = parser.parse_args()

    from s2core_numpy import amx, simd
    if not amx.available():
        sys.exit(f"no AMX here: {amx.unavailable_reason()}")
    rng = np.random.default_rng(0)
    kernels = {"vnni": lambda *a: simd.products(*a, simd.LONE_BLOCK[a[0]]), "amx": amx.products}
    results = {}
    for name in args.types.split(","):
        mats = packed_copies(name, args.matrices)
        rows_out, one = [], None
        for rows in (int(r) for r in args.rows.split(",")):
            ms = alternated_ms(kernels, mats, kernel_args(mats[0], rows, rng), args.reps)
            row = {"rows": rows, **{f"{k}_ms": v for k, v in ms.items()}}
            one = one or row["vnni_ms"]
            row.update(vnni_x_one_row=row["vnni_ms"] / one, amx_x_one_row=row["amx_ms"] / one,
                       amx_over_vnni=row["amx_ms"] / row["vnni_ms"])
            print(f"{name} {rows:3d} rows: VNNI {row['vnni_ms']:.3f} ms "
                  f"({row['vnni_x_one_row']:.2f}x one row), AMX {row['amx_ms']:.3f} ms "
                  f"({row['amx_x_one_row']:.2f}x), AMX / VNNI {row['amx_over_vnni']:.2f}",
                  flush=True)
            rows_out.append(row)
        results[name] = rows_out
    report = {"shape": [9728, 2560], "matrices": args.matrices, "results": results, "min_rows": {
        QT(k).name: v for k, v in amx.MIN_ROWS.items()}, "cpu_model": cpu_model(),
        "cpu_flags": cpu_flags()}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    suffix = f"-{args.matrices}m" if args.matrices > 1 else ""
    path = out / f"amx-rows-{time.strftime('%Y%m%d-%H%M')}{suffix}.json"
    path.write_text(json.dumps(report, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
