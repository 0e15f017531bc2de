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
time a call, and of the step's wall time. Ratios are to the first size.

Then what the machine allows (`ceilings`): a frame's weight bytes (each shape's calls a frame
times its bytes) at the read bandwidth sampled beside every run (bandwidth.GemvProbe; the
read floor), and its multiply-adds per sequence at the peaks measured in the same run
(multiply_peak.peak: int8 for the integer kernels, float32 for the tiled ones; the multiply
floor, times the size); then the most each size's frames could gain over one sequence's if
its products took the longer of the two floors and the rest of its frame (norms, attention,
sampling, the server) cost what one sequence's does. The read floor taken is the lower of
the sampled one and one sequence's products (the probe's gemv reads slower than the kernels
in some minutes), so the ceiling stays a bound: a target above it cannot be met on this
machine with the instruction the peak spins (multiply_peak: VNNI's vpdpbusd, the fewest
instructions an int8 multiply-add can take there; AVX2's vpmaddubsw with a vpmaddwd every
two groups, which a kernel summing more groups in int16 before widening can pass, as AVX2's
Q4_K blocks of rows do: simd._q4_k). Writes
benchmarks/results/batch-products-<date>-<time>-<machine tag>.json and .md with the CPU
model and flags (NUMBA_CPU_NAME=haswell measures the AVX2 build).
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
from served_frames import ServedFrames, add_served_options, sizes_of  # noqa: E402

from s2core.benchmarking import machine  # noqa: E402
from s2core.benchmarking.bandwidth import GemvProbe, usable_cores  # noqa: E402


def ceilings(step_ms: dict[int, float], products_ms: dict[int, float], read_floor_ms: float,
             macs_per_sequence: dict[str, float], peaks: dict[str, float]) -> dict[int, dict]:
    """Per size b (step_ms and products_ms: a frame's wall time and its products' time, by
    size; one sequence among them): the multiply floor, b sequences' multiply-adds a frame at
    the peaks (macs_per_sequence and peaks by family, "int8" or "float"), and the ceiling on
    b sequences' frames gain over one sequence's, b x step(1) / (max(read floor, multiply
    floor(b)) + step(1) - products(1)): the read floor is the frame's weight bytes at the
    read bandwidth (read_floor_ms), the same for every size (the weights stream once a
    call), or one sequence's products where they read faster than that."""
    per_sequence_ms = sum(macs / peaks[family] for family, macs in macs_per_sequence.items()) * 1e3
    rest_one = step_ms[1] - products_ms[1]
    read_floor_ms = min(read_floor_ms, products_ms[1])
    out = {}
    for b in step_ms:
        floor = b * per_sequence_ms
        out[b] = {"multiply_floor_ms": floor, "rest_ms": step_ms[b] - products_ms[b],
                  "ceiling": b * step_ms[1] / (max(read_floor_ms, floor) + rest_one)}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_served_options(ap, "q4_k_m", "1,4", 4)
    args = ap.parse_args(argv)
    sizes = sizes_of(args)

    from s2core_numpy import int_dots, tiled

    served = ServedFrames(args.type, args.frames, max(sizes))

    spent: dict = collections.defaultdict(float)
    calls: collections.Counter = collections.Counter()
    integer_kinds: set = set()  # the weight types the integer kernels multiply
    nbytes: dict = {}  # a matrix's bytes, by (type, shape)
    classes = (int_dots.IntDotMatrix, tiled.TiledMatrix)
    products = [cls.__call__ for cls in classes]

    def timing(product):
        def timed(matrix, x):
            t = time.perf_counter()
            out = product(matrix, x)
            seconds = time.perf_counter() - t  # the product alone, not this bookkeeping
            kind = matrix.qtype.name if hasattr(matrix, "qtype") else type(matrix).__name__
            if isinstance(matrix, int_dots.IntDotMatrix):
                integer_kinds.add(kind)
            key = (kind, matrix.shape)
            nbytes[key] = matrix.nbytes
            spent[key] += seconds
            calls[key] += 1
            return out
        return timed

    def clear() -> None:
        spent.clear()
        calls.clear()

    probe = GemvProbe()
    bandwidths: list[float] = []

    def serve(b: int) -> float:
        seconds = served.seconds_per_frame(b, clear)
        bandwidths.append(probe.sample())  # the read floor's sample beside each run
        return seconds

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
        probe.close()

    first = sizes[0]
    shapes = sorted({key[:2] for key in per_call})
    rows = []
    for qtype, shape in shapes:
        ms = {b: statistics.median(per_call[(qtype, shape, b)]) * 1e3 for b in sizes}
        frame_ms = {b: ms[b] * per_frame[(qtype, shape, b)] for b in sizes}
        rows.append({"type": qtype, "shape": list(shape), "ms_per_call": ms,
                     "bytes": nbytes[(qtype, shape)],
                     "calls_per_frame": {b: per_frame[(qtype, shape, b)] for b in sizes},
                     "ms_per_frame": frame_ms,
                     "over_first": {b: ms[b] / ms[first] for b in sizes}})
    step_ms = {b: statistics.median(steps[b]) * 1e3 for b in sizes}
    gains = {b: b * step_ms[first] / (first * step_ms[b]) for b in sizes}
    products_ms = {b: sum(r["ms_per_frame"][b] for r in rows) for b in sizes}

    from multiply_peak import peak  # after serving: its spins compile numba code of their own
    macs: dict = collections.defaultdict(float)
    for r in rows:
        family = "int8" if r["type"] in integer_kinds else "float"
        macs[family] += r["calls_per_frame"][first] * r["shape"][0] * r["shape"][1]
    peaks = {family: peak(family, usable_cores()) for family in macs}
    read_gbps = statistics.median(bandwidths)
    frame_bytes = sum(r["calls_per_frame"][first] * r["bytes"] for r in rows)
    read_floor_ms = frame_bytes / (read_gbps * 1e9) * 1e3
    bounds = (ceilings(step_ms, products_ms, read_floor_ms, macs, peaks) if first == 1
              else {})

    info = machine.describe()
    report = {"when": dt.datetime.now().strftime("%Y%m%d-%H%M"), "args": vars(args),
              "products": rows, "step_ms": step_ms, "frames_gain": gains,
              "products_ms": products_ms, "macs_per_sequence": dict(macs),
              "peaks_macs_per_s": peaks, "read_gbps_median": read_gbps,
              "frame_bytes": frame_bytes, "read_floor_ms": read_floor_ms,
              "ceilings": bounds, "machine": info,
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
        ""]
    if bounds:
        lines += [f"What the machine allows: a frame's weights, {frame_bytes / 1e9:.2f} GB, "
                  f"take {read_floor_ms:.1f} ms at the read bandwidth sampled beside the runs "
                  f"(median {read_gbps:.1f} GB/s); its multiply-adds a sequence, "
                  + ", ".join(f"{family} {m / 1e9:.2f} G" for family, m in macs.items())
                  + ", at the peaks measured after serving (" + ", ".join(
                      f"{family} {p / 1e9:.0f} G/s" for family, p in peaks.items())
                  + f", {usable_cores()} threads). The ceiling: the frames gain if the "
                  "products took the longer of the two floors and the rest of the frame what "
                  "one sequence's does (`ceilings`).", "",
                  "| sequences | frame ms | products ms | rest ms | multiply floor ms | gain | "
                  "ceiling |", "|---:|---:|---:|---:|---:|---:|---:|"]
        lines += [f"| {b} | {step_ms[b]:.1f} | {products_ms[b]:.1f} | "
                  f"{bounds[b]['rest_ms']:.1f} | {bounds[b]['multiply_floor_ms']:.1f} | "
                  f"{gains[b]:.2f}x | {bounds[b]['ceiling']:.2f}x |" for b in sizes]
        lines.append("")
    lines += machine.summary_lines(info)
    write_report(args.out, "batch-products", machine.machine_tag(info), report, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
