#!/usr/bin/env python
"""The tiled kernels' accumulators aligned to a cache line (stack.TILE_ALIGN) against their
element's alignment, at every place of the caller's stack: the time of a kernel by the
offset of the frame that calls it.

    python benchmarks/stack_alignment.py [--rows 4] [--reps 11]

A kernel whose accumulators spill into its stack arrays (stack.py) reads and writes them on
every input; whether those vector accesses straddle cache lines depends on where the calling
thread's stack sits, which Linux randomizes per process in steps of 16 bytes. Here each
kernel is compiled twice in one process, its tiles' accumulators aligned as stack.TILE_ALIGN
says and with only their element's alignment, and each copy is called from numba functions
whose frames hold
0, 16, 32, 48 or 64 bytes more (a stack array of their element's alignment, so that the frame
is not realigned), from one thread (numba's threads set to 1): the places a process may give
it. Kernels: the tiled F16 and Q8_0 rows (f16.f16_rows, q8_0.q8_0_rows: the "f32"
arithmetic of F16 and Q8_0 files), on one 512 x 2560 matrix held in cache, `--rows`
activation rows (a multiple of four); median microseconds a call over `--reps` repetitions
of 30 calls, both copies at every place taken in turn. Writes
benchmarks/results/stack-alignment-<date>-<time>-<rows>rows-<machine tag>.json and .md with
the CPU model and flags; NUMBA_CPU_NAME=haswell (and NUMBA_CPU_FEATURES) measures
the AVX2 build, whose 16 registers make both spill.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "backends"):  # a checkout that is not pip-installed
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import numpy as np  # noqa: E402
from ab import write_machine_report  # noqa: E402

from s2core.benchmarking import machine  # noqa: E402

#: bytes the calling frame is moved by
PADS = (0, 16, 32, 48, 64)


def compiled_with(align, py_func, args: tuple, **options):
    """py_func compiled now (called once on args) with tiles' accumulators aligned to
    `align` (stack.TILE_ALIGN is read when a kernel compiles: a lazy compilation would see
    another)."""
    from numba import njit
    from s2core_numpy import stack
    saved = stack.TILE_ALIGN
    stack.TILE_ALIGN = align
    try:
        compiled = njit(**options)(py_func)
        compiled(*args)
        return compiled
    finally:
        stack.TILE_ALIGN = saved


def padded_callers(kernel, args: tuple) -> dict:
    """pad -> a numba function `caller(sink, *args)` that calls kernel(*args) from a frame
    `pad` bytes larger: its padding a stack_array, of its element's alignment (the frame is
    not realigned), whose address it stores in sink (so that LLVM keeps it)."""
    from s2core_numpy.stack import stack_array
    callers = {}
    sink = np.zeros(1, np.int64)
    for pad in PADS:
        namespace = {"stack_array": stack_array, "np": np, "kernel": kernel}
        exec(f"def caller(sink, *args):\n"
             f"    pad = stack_array(1, {pad // 4 + 4}, np.float32)\n"
             f"    sink[0] = pad.ctypes.data\n"
             f"    kernel(*args)\n", namespace)
        callers[pad] = compiled_with(None, namespace["caller"], (sink, *args))
    return callers


def kernels(rows: int, rng: np.random.Generator) -> dict:
    """name -> ({"aligned": kernel, "element": kernel}, its arguments, the array it writes)."""
    import gguf
    from s2core_numpy import stack
    from s2core_numpy.f16 import F16Matrix, f16_rows
    from s2core_numpy.q8_0 import Q8Matrix, q8_0_rows
    w = (rng.standard_normal((512, 2560)) * 0.02).astype(np.float32)
    f16 = F16Matrix.from_raw(w.astype(np.float16))
    q8 = Q8Matrix.from_raw(gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q8_0))
    x = rng.standard_normal((rows, 2560)).astype(np.float32)
    outs = [np.empty((rows, 512), np.float32) for _ in range(2)]
    found = {"F16 rows (tiled)": (f16_rows.py_func, (f16.codes.view(np.int16), x, outs[0]),
                                  outs[0]),
             "Q8_0 rows (tiled)": (q8_0_rows.py_func, (q8.codes, q8.scales, x, outs[1]),
                                   outs[1])}
    built = {}
    for name, (py_func, args, out) in found.items():
        options = dict(parallel=True, fastmath={"contract"})
        copies = {"aligned": compiled_with(stack.TILE_ALIGN, py_func, args, **options),
                  "element": compiled_with(None, py_func, args, **options)}
        built[name] = (copies, args, out)
    return built


def by_pad(copies: dict, args: tuple, reps: int) -> dict[str, dict[int, float]]:
    """way -> pad -> median microseconds a call of the way's kernel(*args) from each padded
    caller: every (way, pad) in turn, the order reversed every other repetition, so that a
    drift of the machine meets both ways alike."""
    callers = [((way, pad), call) for way, kernel in copies.items()
               for pad, call in padded_callers(kernel, args).items()]
    sink = np.zeros(1, np.int64)
    times: dict[tuple, list[float]] = {key: [] for key, _ in callers}
    for k in range(reps):
        for key, call in callers if k % 2 == 0 else callers[::-1]:
            t = time.perf_counter()
            for _ in range(30):
                call(sink, *args)
            times[key].append((time.perf_counter() - t) / 30 * 1e6)
    return {way: {pad: statistics.median(times[(way, pad)]) for pad in PADS} for way in copies}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=4, help="a multiple of four")
    ap.add_argument("--reps", type=int, default=11)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    args = ap.parse_args(argv)

    import numba
    numba.set_num_threads(1)  # the calling thread alone: its stack is the one moved
    rng = np.random.default_rng(0)
    rows = []
    for name, (copies, call_args, out) in kernels(args.rows, rng).items():
        us = by_pad(copies, call_args, args.reps)
        outs = []
        for f in copies.values():
            f(*call_args)
            outs.append(out.copy())
        if not np.array_equal(*outs):
            print(f"{name}: the two copies give other numbers", file=sys.stderr)
            return 1
        rows.append({"kernel": name, "us_by_pad": us,
                     "spread": {w: max(v.values()) / min(v.values()) for w, v in us.items()}})

    report = {"args": vars(args), "rows": rows, "numba_target": machine.numba_target()}
    head = " | ".join(f"+{pad} B" for pad in PADS)
    lines = [f"A kernel's time by the place of its caller's frame (moved by 0-64 bytes; one "
             f"thread; {args.rows} rows of a 512 x 2560 matrix in cache; median us a call over "
             f"{args.reps} repetitions of 30, both copies at every place in turn), its tiles' "
             "accumulators aligned to a cache line (stack.TILE_ALIGN) or to their element "
             "only. Slowest over fastest place: the spread.", "",
             f"| kernel | accumulators | {head} | spread |",
             "|---|---|" + "---:|" * (len(PADS) + 1)]
    for r in rows:
        for way, us in r["us_by_pad"].items():
            cells = " | ".join(f"{us[pad]:.0f}" for pad in PADS)
            label = "cache line" if way == "aligned" else "element (4 bytes)"
            lines.append(f"| {r['kernel']} | {label} | {cells} | {r['spread'][way]:.2f} |")
    write_machine_report(args.out, "stack-alignment", report, lines, tag_prefix=f"{args.rows}rows-")
    return 0


if __name__ == "__main__":
    sys.exit(main())
