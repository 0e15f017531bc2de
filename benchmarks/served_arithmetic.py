#!/usr/bin/env python
"""arithmetic="ggml" against "f32" as a server feels them: frames a second with 1, 4 and 8
concurrent sequences, both models in one process, alternated.

    python benchmarks/served_arithmetic.py [--type f16] [--sizes 1,4,8] [--rounds 3]
                                           [--frames 12]

The NumPy backend's default arithmetic for a file (plugin.default_arithmetic) is the faster
of the two; this is the measurement behind it. Two NumPy models of the bench's 4-layer S2
Pro-shaped file of `--type` (one per arithmetic) serve the same prompts through
s2core.serving.Server (served_frames.py, as the batch case does); every round runs each size
on each model in turn, so both see the same drift of the memory's speed. Reports, per size,
the median frames a second of each and the median of the rounds' own ratios f32 / ggml.
Writes benchmarks/results/served-arithmetic-<date>-<time>-<type>-<machine tag>.json and .md
with the CPU model and flags.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "backends"):  # a checkout that is not pip-installed
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from ab import paired_ratio, write_machine_report  # noqa: E402
from served_frames import ServedFrames, add_served_options, sizes_of  # noqa: E402


ARITHMETICS = ("ggml", "f32")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_served_options(ap, "f16", "1,4,8", 3)
    args = ap.parse_args(argv)
    sizes = sizes_of(args)

    served = {a: ServedFrames(args.type, args.frames, max(sizes), arithmetic=a)
              for a in ARITHMETICS}
    seconds = {(a, b): [] for a in ARITHMETICS for b in sizes}
    try:
        for b in sizes:  # warm-up: compilation, first touches
            for a in ARITHMETICS:
                served[a].seconds_per_frame(b)
        for k in range(args.rounds):
            for b in sizes:
                for a in ARITHMETICS if k % 2 == 0 else ARITHMETICS[::-1]:
                    seconds[(a, b)].append(served[a].seconds_per_frame(b))
    finally:
        for s in served.values():
            s.close()

    fps = {a: {b: b / statistics.median(seconds[(a, b)]) for b in sizes} for a in ARITHMETICS}
    # seconds ggml / f32 of each round's neighbouring runs: frames a second f32 / ggml
    ratio = {b: paired_ratio(seconds[("ggml", b)], seconds[("f32", b)])["ratio"] for b in sizes}
    gains = {a: {b: fps[a][b] / fps[a][sizes[0]] for b in sizes} for a in ARITHMETICS}
    report = {"args": vars(args),
              "seconds_per_frame": {f"{a} {b}": v for (a, b), v in seconds.items()},
              "frames_per_second": fps, "f32_over_ggml": ratio, "gains": gains}
    lines = [f"Served frames a second, {args.type} (4 S2 Pro layers, NumPy), arithmetic "
             f"\"ggml\" against \"f32\", alternated over {args.rounds} rounds of "
             f"{args.frames} frames: medians, and the median of the rounds' ratios.", "",
             "| sequences | ggml frames/s | f32 frames/s | f32 / ggml (frames/s) | ggml vs one | "
             "f32 vs one |", "|---:|---:|---:|---:|---:|---:|"]
    for b in sizes:
        lines.append(f"| {b} | {fps['ggml'][b]:.2f} | {fps['f32'][b]:.2f} | {ratio[b]:.2f}x | "
                     f"{gains['ggml'][b]:.2f}x | {gains['f32'][b]:.2f}x |")
    write_machine_report(args.out, "served-arithmetic", report, lines, tag_prefix=f"{args.type}-")
    return 0


if __name__ == "__main__":
    sys.exit(main())
