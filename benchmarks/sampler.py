#!/usr/bin/env python
"""The sampler's two passes over the vocabulary compiled (s2core/generation/sampler_kernels.py)
against NumPy's, alternated in one process: alone, and inside the server.

    python benchmarks/sampler.py [--type q4_k_m] [--sizes 1,8] [--rounds 5] [--frames 12]

Alone: one draw (sampling.candidates then draw, s2.cpp's defaults top_p 0.8, top_k 30,
temperature 0.8) over 4096 float32 logits, flat (standard normal x 3, as the bench's
random-weight models give) and peaked (x 12), the two ways in turn. Served: one NumPy model
of the bench's 4-layer file of `--type` serving 1 and 8 requests (served_frames.ServedFrames),
switched between the ways between runs of `--frames` frames, the order reversed every other
round; reports each way's ms a frame, the time its draws took a frame (FrameRule's main-token
and code draws, timed around the calls), and the paired ratio. Both ways give the same
numbers (tests/test_sampler_kernels.py); checked here on every logits vector drawn alone.
Writes benchmarks/results/sampler-<date>-<time>-<type>-<machine tag>.json and .md with the
CPU model and flags.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for path in (ROOT, ROOT / "backends"):  # a checkout that is not pip-installed
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import numpy as np  # noqa: E402
from ab import paired_ratio, write_machine_report  # noqa: E402
from served_frames import ServedFrames, add_served_options, sizes_of  # noqa: E402

from s2core.generation import frame, sampler_kernels, sampling  # noqa: E402

WAYS = {"compiled": (sampler_kernels.descending, sampler_kernels.sequential_sum),
        "numpy": (sampler_kernels.descending_numpy, sampler_kernels.sequential_sum_numpy)}


@contextlib.contextmanager
def passes(way: str):
    """candidates() with `way`'s two passes."""
    saved = sampling.descending, sampling.sequential_sum
    sampling.descending, sampling.sequential_sum = WAYS[way]
    try:
        yield
    finally:
        sampling.descending, sampling.sequential_sum = saved


class DrawClock:
    """Seconds spent in FrameRule's draws (main tokens and codes) while installed."""

    def __init__(self):
        self.seconds = 0.0
        self._saved = {}

    def __enter__(self):
        for name in ("sample_main", "draw_code"):
            original = getattr(frame.FrameRule, name)
            self._saved[name] = original

            def timed(*args, _original=original, **kwargs):
                t = time.perf_counter()
                try:
                    return _original(*args, **kwargs)
                finally:
                    self.seconds += time.perf_counter() - t
            setattr(frame.FrameRule, name, timed)
        return self

    def __exit__(self, *exc):
        for name, original in self._saved.items():
            setattr(frame.FrameRule, name, original)


def one_draw_us(logits: np.ndarray, reps: int) -> dict[str, float]:
    """Median microseconds of one draw each way, alternated; the ways' candidates equal."""
    rng = np.random.default_rng(0)
    kept = {}
    for way in WAYS:
        with passes(way):
            c = sampling.candidates(logits, 0.8, 30)
            kept[way] = (c.ids, c.logits)
    (ids, values), (ids2, values2) = kept.values()
    assert np.array_equal(ids, ids2) and np.array_equal(values, values2), "the ways differ"
    times: dict[str, list[float]] = {way: [] for way in WAYS}
    order = list(WAYS)
    for k in range(reps):
        for way in order if k % 2 == 0 else order[::-1]:
            with passes(way):
                t = time.perf_counter()
                for _ in range(200):
                    sampling.draw(sampling.candidates(logits, 0.8, 30), 0.8, rng)
                times[way].append((time.perf_counter() - t) / 200 * 1e6)
    return {way: statistics.median(v) for way, v in times.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_served_options(ap, "q4_k_m", "1,8", 5)
    args = ap.parse_args(argv)
    sizes = sizes_of(args)
    if not sampler_kernels.COMPILED:
        print("numba is not installed: there is no compiled way to compare", file=sys.stderr)
        return 2

    rng = np.random.default_rng(1)
    alone = {name: one_draw_us((rng.standard_normal(4096) * scale).astype(np.float32), 15)
             for name, scale in (("flat", 3.0), ("peaked", 12.0))}

    served = ServedFrames(args.type, args.frames, max(sizes))
    times = {(b, way): [] for b in sizes for way in WAYS}
    drawing = {(b, way): [] for b in sizes for way in WAYS}
    try:
        for b in sizes:  # warm-up: compilation, first touches
            for way in WAYS:
                with passes(way):
                    served.seconds_per_frame(b)
        order = list(WAYS)
        for k in range(args.rounds):
            for b in sizes:
                for way in order if k % 2 == 0 else order[::-1]:
                    clock = DrawClock()
                    with passes(way):
                        # the clock starts with the timed frames (admission's draws left out)
                        seconds = served.seconds_per_frame(b, before_timing=clock.__enter__)
                    clock.__exit__()
                    times[(b, way)].append(seconds)
                    drawing[(b, way)].append(clock.seconds / args.frames)
    finally:
        served.close()

    rows = [{"sequences": b,
             "ms_per_frame": {w: statistics.median(times[(b, w)]) * 1e3 for w in WAYS},
             "draws_ms_per_frame": {w: statistics.median(drawing[(b, w)]) * 1e3 for w in WAYS},
             **paired_ratio(times[(b, "compiled")], times[(b, "numpy")])} for b in sizes]
    report = {"args": vars(args),
              "alone_us": alone, "rows": rows,
              "runs": {f"{b} {w}": v for (b, w), v in times.items()}}
    lines = ["The sampler's passes over the vocabulary compiled (sampler_kernels.py) against "
             "NumPy's, alternated in one process.", "",
             "One draw over 4096 logits (median us, 15 alternated runs of 200):", "",
             "| logits | compiled us | NumPy us | compiled / NumPy |", "|---|---:|---:|---:|"]
    for name, us in alone.items():
        lines.append(f"| {name} | {us['compiled']:.1f} | {us['numpy']:.1f} | "
                     f"{us['compiled'] / us['numpy']:.2f} |")
    lines += ["", f"Served ({args.type}, 4 layers, NumPy; median over {args.rounds} rounds of "
              f"{args.frames} frames; the ratio is the median of the rounds' own, with its "
              "range):", "",
              "| sequences | compiled ms a frame | NumPy ms a frame | compiled / NumPy (range) | "
              "draws compiled ms a frame | draws NumPy ms a frame |",
              "|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        t, d = r["ms_per_frame"], r["draws_ms_per_frame"]
        lines.append(f"| {r['sequences']} | {t['compiled']:.1f} | {t['numpy']:.1f} | "
                     f"{r['ratio']:.3f} ({r['ratio_range'][0]:.2f}-{r['ratio_range'][1]:.2f}) | "
                     f"{d['compiled']:.2f} | {d['numpy']:.2f} |")
    write_machine_report(args.out, "sampler", report, lines, tag_prefix=f"{args.type}-")
    return 0


if __name__ == "__main__":
    sys.exit(main())
