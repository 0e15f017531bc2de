#!/usr/bin/env python
"""The integer kernels of this tree against REV's, inside the server, alternated in one
process: a kernel change's effect on batched frames.

    python benchmarks/kernels_ab.py --against REV [--type q4_k_m] [--sizes 1,4,8]
                                    [--rounds 5] [--frames 12] [--prefill POSITIONS]

batch_ab.py compares whole trees in fresh processes; on this kind of VM the read bandwidth
moves 20-50 % between minutes, more than a kernel change makes. Here one model (the bench's
4-layer file of `--type`, served_frames.ServedFrames) serves every size both ways, switched between
runs of `--frames` frames, the ways' order reversed every other run: "this tree" multiplies
with simd.products as it is here, REV with REV's backends/s2core_numpy/simd.py (compiled
from its source; the packed matrices are this tree's, so REV must share their layout). Both
round the activation the same way (act_quant_kernels.integer_codes) and give the same bits,
checked on one product of every integer matrix before timing. Reports per size each way's
milliseconds a frame, their ratio, and each way's frames gain over the first size; with
--prefill, a prefill of that many positions each way too, alternated. Writes
benchmarks/results/kernels-ab-<date>-<time>-<type>-<machine tag>.json and .md with the CPU
model and flags; NUMBA_CPU_NAME and NUMBA_CPU_FEATURES set to HASWELL's measure the AVX2 build.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "backends"):  # a checkout that is not pip-installed
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import numpy as np  # noqa: E402
from ab import paired_ratio, revision, write_machine_report  # noqa: E402
from kernel_rows import multiplying_with  # noqa: E402
from served_frames import ServedFrames, add_served_options, sizes_of  # noqa: E402

from s2core.benchmarking import machine  # noqa: E402


def simd_of(rev: str):
    """REV's simd.py as a module of s2core_numpy (numba's disk cache off: no file backs it)."""
    source = subprocess.run(["git", "-C", str(ROOT), "show",
                             f"{rev}:backends/s2core_numpy/simd.py"],
                            capture_output=True, text=True, check=True).stdout
    name = f"s2core_numpy._simd_{revision(rev)}"
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(name, loader=None))
    module.__package__ = "s2core_numpy"
    exec(compile(source.replace("cache=True", "cache=False"), f"{rev}:simd.py", "exec"),
         module.__dict__)
    return module


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--against", required=True, help="the revision whose kernels to compare")
    add_served_options(ap, "q4_k_m", "1,4,8", 5)
    ap.add_argument("--prefill", type=int, default=0, metavar="POSITIONS",
                    help="also time a prefill of this many positions each way, alternated")
    args = ap.parse_args(argv)
    sizes = sizes_of(args)

    from s2core.kit.prompts import mixed_prompt
    from s2core_numpy import int_dots, simd
    if not simd.isa():
        print("no integer kernels here: numba's target has neither AVX2 nor AVX-512 VNNI",
              file=sys.stderr)
        return 2
    other = simd_of(args.against)
    ways = {"this tree": simd.products, revision(args.against): other.products}

    served = ServedFrames(args.type, args.frames, max(sizes))
    calls = {way: multiplying_with(f) for way, f in ways.items()}
    rng = np.random.default_rng(0)
    for m in {id(o): o for o in gc.get_objects() if isinstance(o, int_dots.IntDotMatrix)
              }.values():
        x = rng.standard_normal((max(sizes), m.n_in)).astype(np.float32)
        first, *rest = (call(m, x) for call in calls.values())
        for way, out in zip(list(ways)[1:], rest):
            if not np.array_equal(first, out):
                print(f"{way}'s kernels give other numbers than this tree's on a {m.qtype.name} "
                      f"{m.shape} product", file=sys.stderr)
                return 1

    original = int_dots.IntDotMatrix.__call__
    times: dict = {(b, way): [] for b in sizes for way in ways}
    try:
        for b in sizes:  # warm-up: compilation, first touches
            for call in calls.values():
                int_dots.IntDotMatrix.__call__ = call
                served.seconds_per_frame(b)
        order = list(calls.items())
        for k in range(args.rounds):
            for b in sizes:
                for way, call in order if k % 2 == 0 else order[::-1]:
                    int_dots.IntDotMatrix.__call__ = call
                    times[(b, way)].append(served.seconds_per_frame(b))
        prefills: dict = {way: [] for way in ways}
        prompt = (mixed_prompt(served.model.hparams, args.prefill, np.random.default_rng(1))
                  if args.prefill else None)
        for k in range(args.rounds + 1 if args.prefill else 0):  # the first warms
            for way, call in order if k % 2 == 0 else order[::-1]:
                int_dots.IntDotMatrix.__call__ = call
                seconds = served.seconds_of_prefill(prompt)
                if k:
                    prefills[way].append(seconds)
    finally:
        int_dots.IntDotMatrix.__call__ = original
        served.close()

    ms = {key: statistics.median(v) * 1e3 for key, v in times.items()}
    names = list(ways)
    first = sizes[0]
    rows = [{"sequences": b, "ms_per_frame": {w: ms[(b, w)] for w in names},
             **paired_ratio(times[(b, names[0])], times[(b, names[1])]),
             "frames_gain": {w: b * ms[(first, w)] / (first * ms[(b, w)]) for w in names}}
            for b in sizes]
    prefill = None
    if args.prefill:
        prefill = {"positions": args.prefill, "runs": prefills,
                   "ms": {w: statistics.median(v) * 1e3 for w, v in prefills.items()},
                   **paired_ratio(prefills[names[0]], prefills[names[1]])}
    report = {"args": vars(args),
              "against": names[1], "rows": rows, "prefill": prefill,
              "runs": {f"{b} {w}": v for (b, w), v in times.items()},
              "numba_target": machine.numba_target()}
    lines = [f"The integer kernels of this tree against {names[1]}'s inside the server "
             f"({args.type}, 4 layers, NumPy), alternated in one process: median over "
             f"{args.rounds} rounds of ms a frame (every sequence's); the ratio is the median of "
             f"the rounds' own (the two ways' runs of a size are neighbours), with its range.",
             "",
             f"| sequences | this tree ms | {names[1]} ms | this tree / {names[1]} (range) | "
             f"frames gain this tree | frames gain {names[1]} |", "|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        t = r["ms_per_frame"]
        lines.append(f"| {r['sequences']} | {t[names[0]]:.1f} | {t[names[1]]:.1f} | "
                     f"{r['ratio']:.3f} ({r['ratio_range'][0]:.2f}-{r['ratio_range'][1]:.2f}) | "
                     f"{r['frames_gain'][names[0]]:.2f}x | "
                     f"{r['frames_gain'][names[1]]:.2f}x |")
    if prefill:
        lines += ["", f"Prefill of {args.prefill} positions (median over {args.rounds} "
                  f"alternated rounds): this tree {prefill['ms'][names[0]]:.0f} ms, {names[1]} "
                  f"{prefill['ms'][names[1]]:.0f} ms; this tree / {names[1]} "
                  f"{prefill['ratio']:.3f} ({prefill['ratio_range'][0]:.2f}-"
                  f"{prefill['ratio_range'][1]:.2f})."]
    write_machine_report(args.out, "kernels-ab", report, lines, tag_prefix=f"{args.type}-")
    return 0


if __name__ == "__main__":
    sys.exit(main())
