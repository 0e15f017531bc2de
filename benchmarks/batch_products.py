#!/usr/bin/env python
"""A batched step's products inside the server, by shape, against one sequence's.

The sizes alternated in one process.

    python benchmarks/batch_products.py [--type q4_k_m] [--sizes 1,4] [--rounds 4] [--frames 12]

The batch case (s2core bench --case batch) gives frames per second; this says where a size's
extra time goes. One NumPy model of `--type` (4 S2 Pro layers, the bench's file) serves
`--sizes` concurrent requests through s2core.serving.Server, as the batch case does (64-
position prompts, `--frames` timed frames after the admitting step), the sizes in turn,
their order reversed every other round. Every product of a matrix held in its file's type
(int_dots.IntDotMatrix under arithmetic "ggml", the tiled layouts under "f32": tiled.py) is
timed by (weight type, shape, rows); per size, the median over rounds of each shape's mean
time a call, and of the step's wall time. Ratios are to the first size. Writes
benchmarks/results/batch-products-<date>-<time>-<machine tag>.json and .md with the CPU
model and flags.
"""

from __future__ import annotations

import argparse
import collections
import datetime as dt
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "backends"):  # a checkout that is not pip-installed
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from ab import write_report  # noqa: E402
from served_frames import ServedFrames  # noqa: E402

from s2core.benchmarking import machine  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--type", default="q4_k_m")
    ap.add_argument("--sizes", default="1,4")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--frames", type=int, default=12)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    args = ap.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]

    from s2core_numpy import int_dots, tiled

    served = ServedFrames(args.type, args.frames, max(sizes))

    spent: dict = collections.defaultdict(float)
    calls: collections.Counter = collections.Counter()
    classes = (int_dots.IntDotMatrix, tiled.TiledMatrix)
    products = [cls.__call__ for cls in classes]

    def timing(product):
        def timed(matrix, x):
            t = time.perf_counter()
            out = product(matrix, x)
            kind = matrix.qtype.name if hasattr(matrix, "qtype") else type(matrix).__name__
            key = (kind, matrix.shape)
            spent[key] += time.perf_counter() - t
            calls[key] += 1
            return out
        return timed

    def clear() -> None:
        spent.clear()
        calls.clear()

    def serve(b: int) -> float:
        return served.seconds_per_frame(b, clear)

    for cls, product in zip(classes, products):
        cls.__call__ = timing(product)
    try:
        for b in sizes:  # warm-up: compilation, first touches
            serve(b)
        per_call: dict = collections.defaultdict(list)
        per_frame: dict = {}  # calls a frame, by (type, shape, size)
        steps: dict = collections.defaultdict(list)
        for k in range(args.rounds):
            for b in sizes if k % 2 == 0 else sizes[::-1]:
                steps[b].append(serve(b))
                for key, seconds in spent.items():
                    per_call[key + (b,)].append(seconds / calls[key])
                    per_frame[key + (b,)] = calls[key] / args.frames
    finally:
        for cls, product in zip(classes, products):
            cls.__call__ = product
        served.close()

    first = sizes[0]
    shapes = sorted({key[:2] for key in per_call})
    rows = []
    for qtype, shape in shapes:
        ms = {b: statistics.median(per_call[(qtype, shape, b)]) * 1e3 for b in sizes}
        frame_ms = {b: ms[b] * per_frame[(qtype, shape, b)] for b in sizes}
        rows.append({"type": qtype, "shape": list(shape), "ms_per_call": ms,
                     "calls_per_frame": {b: per_frame[(qtype, shape, b)] for b in sizes},
                     "ms_per_frame": frame_ms,
                     "over_first": {b: ms[b] / ms[first] for b in sizes}})
    step_ms = {b: statistics.median(steps[b]) * 1e3 for b in sizes}
    gains = {b: b * step_ms[first] / (first * step_ms[b]) for b in sizes}

    info = machine.describe()
    report = {"when": dt.datetime.now().strftime("%Y%m%d-%H%M"), "args": vars(args),
              "products": rows, "step_ms": step_ms, "frames_gain": gains, "machine": info,
              "cpu_model": machine.cpu_model(), "cpu_flags": machine.cpu_flags()}
    lines = [f"Products inside the server ({args.type}, 4 layers, NumPy): median over "
             f"{args.rounds} alternated rounds of each shape's mean time a call (ms), its "
             f"ratio to {first} sequence(s), its calls a frame and their ms a frame.", "",
             "| type | shape | " + " | ".join(f"{b} seq. ms" for b in sizes) + " | "
             + " | ".join(f"{b} / {first}" for b in sizes[1:]) + " | calls a frame | "
             + " | ".join(f"{b} seq. ms a frame" for b in sizes) + " |",
             "|---|---|" + "---:|" * (3 * len(sizes))]
    for r in rows:
        lines.append(f"| {r['type']} | {r['shape'][0]} x {r['shape'][1]} | "
                     + " | ".join(f"{r['ms_per_call'][b]:.3f}" for b in sizes) + " | "
                     + " | ".join(f"{r['over_first'][b]:.2f}" for b in sizes[1:]) + " | "
                     + f"{r['calls_per_frame'][first]:.1f} | "
                     + " | ".join(f"{r['ms_per_frame'][b]:.1f}" for b in sizes) + " |")
    lines += ["", "Step (one frame for every sequence): " + ", ".join(
        f"{b} sequence(s) {step_ms[b]:.1f} ms (frames {gains[b]:.2f}x)" for b in sizes) + ".",
        "", *machine.summary_lines(info)]
    write_report(args.out, "batch-products", machine.machine_tag(info), report, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
