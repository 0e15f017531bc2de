#!/usr/bin/env python
"""One matrix-vector product of the NumPy backend's block-quantized kernels, alone.

    python benchmarks/quant_matvec.py [--types q4_k,q5_k,q6_k] [--rows 9728,155776] [--reps 15]

For each type and shape (rows x 2560: S2 Pro's FFN and its 155776-row embeddings/output
head), random valid blocks are packed as the backend packs them and x @ W^T is timed for one
row of x: best and median of `--reps`, as GB/s of blocks streamed and as a multiple of the
read floor (the blocks' bytes over the read bandwidth measured before and after, best of the
two). Results go to benchmarks/results/quant-matvec-<date>-<time>-<machine tag>.json / .md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "backends"):  # a checkout that is not pip-installed
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import numpy as np  # noqa: E402
from gguf import GGMLQuantizationType as QT  # noqa: E402

from s2core.benchmarking import machine  # noqa: E402
from s2core.benchmarking.bandwidth import measure_bandwidth  # noqa: E402
from s2core.kit.blocks import random_blocks  # noqa: E402
from s2core_numpy.quants import QuantMatrix  # noqa: E402

WIDTH = 2560


def time_matvec(m: QuantMatrix, reps: int) -> list[float]:
    x = np.random.default_rng(0).standard_normal((1, WIDTH)).astype(np.float32)
    m(x)  # compilation (or the on-disk cache) and page faults are not timed
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        m(x)
        times.append(time.perf_counter() - t0)
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--types", default="q4_k,q5_k,q6_k")
    ap.add_argument("--rows", default="9728,155776")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    args = ap.parse_args()
    before = measure_bandwidth()
    rows_out = []
    for name in args.types.split(","):
        qtype = QT[name.upper()]
        for rows in (int(r) for r in args.rows.split(",")):
            m = QuantMatrix.from_raw(random_blocks(qtype, rows, WIDTH // 256, seed=1), qtype)
            times = time_matvec(m, args.reps)
            rows_out.append({"type": name, "rows": rows, "cols": WIDTH, "bytes": m.nbytes,
                             "best_s": min(times), "median_s": statistics.median(times)})
            del m
    after = measure_bandwidth()
    read = max(before.read_gbps, after.read_gbps)
    info = machine.describe()
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%d-%H%M")
    stem = Path(args.out) / f"quant-matvec-{stamp}-{machine.machine_tag(info)}"
    lines = [f"# Quantized matrix-vector products, NumPy backend ({stamp} UTC)", "",
             f"Read bandwidth {before.read_gbps:.1f} GB/s before, {after.read_gbps:.1f} after "
             f"(floors use {read:.1f}); {args.reps} repetitions.", "",
             "| type | matrix | MB | best ms | GB/s | x read floor | median ms |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for r in rows_out:
        floor = r["bytes"] / (read * 1e9)
        r["x_floor"] = r["best_s"] / floor
        lines.append(f"| {r['type']} | {r['rows']} x {r['cols']} | {r['bytes'] / 1e6:.1f} | "
                     f"{r['best_s'] * 1e3:.2f} | {r['bytes'] / r['best_s'] / 1e9:.1f} | "
                     f"{r['x_floor']:.2f} | {r['median_s'] * 1e3:.2f} |")
    stem.with_suffix(".json").write_text(json.dumps(
        {"machine": info, "bandwidth_before": before.as_dict(), "bandwidth_after": after.as_dict(),
         "results": rows_out}, indent=1))
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"\nwritten {stem}.json / .md")


if __name__ == "__main__":
    main()
