#!/usr/bin/env python
"""The sampler's ways of drawing a batch's codes, alternated in one process: alone, and
inside the server.

    python benchmarks/sampler.py [--type q4_k_m] [--sizes 1,8] [--rounds 5] [--frames 12]

The ways (every one gives the same numbers: tests/test_sampler_kernels.py, and checked here
on every block of logits drawn alone):
- "rows": what the server does, sampling.candidates_rows, each compiled pass once for all of
  a codebook's rows, the rows spread over the cores (s2core/generation/sampler_compiled.py);
- "one at a time": sampling.candidates row after row with the compiled one-row passes (the
  server's way before candidates_rows);
- "numpy": the same with NumPy's passes (sampler_kernels.descending_numpy, ...).

Alone: the candidates and draws of B rows (each size of --sizes) of 4096 float32 logits, flat
(standard normal x 3, as the bench's random-weight models give) and peaked (x 12), s2.cpp's
defaults (top_p 0.8, top_k 30, temperature 0.8), the ways in turn. Served: one NumPy model
of the bench's 4-layer file of `--type` serving each size of requests
(served_frames.ServedFrames), switched between the ways between runs of `--frames` frames,
the order reversed every other round; reports each way's ms a frame, the time its draws took
a frame (FrameRule.sample_main's main tokens and the codes' draws, timed around the calls),
and each way's paired ratio to "rows". Writes benchmarks/results/sampler-<date>-<time>-<type>-
<machine tag>.json and .md with the CPU model and flags.
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
from s2core.serving import request  # noqa: E402

def one_at_a_time(logits, top_p, top_k):
    """candidates_rows' result, sampling.candidates row after row."""
    return [sampling.candidates(row, p, k) for row, p, k in zip(logits, top_p, top_k)]


#: each way's (frame.candidates_rows, sampling.descending, sampling.sequential_sum)
WAYS = {"rows": (sampling.candidates_rows, sampler_kernels.descending,
                 sampler_kernels.sequential_sum),
        "one at a time": (one_at_a_time, sampler_kernels.descending,
                          sampler_kernels.sequential_sum),
        "numpy": (one_at_a_time, sampler_kernels.descending_numpy,
                  sampler_kernels.sequential_sum_numpy)}


@contextlib.contextmanager
def way_of(name: str):
    """The server's draws (frame.draw_codes) and candidates() taken `name`'s way."""
    saved = frame.candidates_rows, sampling.descending, sampling.sequential_sum
    frame.candidates_rows, sampling.descending, sampling.sequential_sum = WAYS[name]
    try:
        yield
    finally:
        frame.candidates_rows, sampling.descending, sampling.sequential_sum = saved


class DrawClock:
    """Seconds spent in the server's draws (main tokens and codes) while installed."""

    def __init__(self):
        self.seconds = 0.0
        self._saved = {}

    def __enter__(self):
        for owner, name in ((frame.FrameRule, "sample_main"), (request, "draw_codes")):
            original = getattr(owner, name)
            self._saved[(owner, name)] = original

            def timed(*args, _original=original, **kwargs):
                t = time.perf_counter()
                try:
                    return _original(*args, **kwargs)
                finally:
                    self.seconds += time.perf_counter() - t
            setattr(owner, name, timed)
        return self

    def __exit__(self, *exc):
        for (owner, name), original in self._saved.items():
            setattr(owner, name, original)


def draws_us(logits: np.ndarray, reps: int) -> dict[str, float]:
    """Median microseconds of the candidates and draws of logits' rows each way, alternated;
    the ways' candidates equal."""
    rng = np.random.default_rng(0)
    n = logits.shape[0]
    settings = ([0.8] * n, [30] * n)
    kept = {}
    for name in WAYS:
        with way_of(name):
            kept[name] = [(c.ids, c.logits) for c in frame.candidates_rows(logits, *settings)]
    first = kept["rows"]
    for name, other in kept.items():
        assert all(np.array_equal(a, c) and np.array_equal(b, d)
                   for (a, b), (c, d) in zip(first, other)), f"{name} differs from rows"
    times: dict[str, list[float]] = {name: [] for name in WAYS}
    order = list(WAYS)
    for k in range(reps):
        for name in order if k % 2 == 0 else order[::-1]:
            with way_of(name):
                t = time.perf_counter()
                for _ in range(100):
                    for c in frame.candidates_rows(logits, *settings):
                        sampling.draw(c, 0.8, rng)
                times[name].append((time.perf_counter() - t) / 100 * 1e6)
    return {name: statistics.median(v) for name, v in times.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_served_options(ap, "q4_k_m", "1,8", 5)
    args = ap.parse_args(argv)
    sizes = sizes_of(args)
    if not sampler_kernels.COMPILED:
        print("numba is not installed: there is no compiled way to compare", file=sys.stderr)
        return 2

    rng = np.random.default_rng(1)
    alone = {(name, b): draws_us((rng.standard_normal((b, 4096)) * scale).astype(np.float32),
                                 15)
             for name, scale in (("flat", 3.0), ("peaked", 12.0)) for b in sizes}

    served = ServedFrames(args.type, args.frames, max(sizes))
    times = {(b, way): [] for b in sizes for way in WAYS}
    drawing = {(b, way): [] for b in sizes for way in WAYS}
    try:
        for b in sizes:  # warm-up: compilation, first touches
            for way in WAYS:
                with way_of(way):
                    served.seconds_per_frame(b)
        order = list(WAYS)
        for k in range(args.rounds):
            for b in sizes:
                for way in order if k % 2 == 0 else order[::-1]:
                    clock = DrawClock()
                    with way_of(way):
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
             "against_rows": {w: paired_ratio(times[(b, w)], times[(b, "rows")])
                              for w in WAYS if w != "rows"}} for b in sizes]
    report = {"args": vars(args),
              "alone_us": [{"logits": name, "rows": b, **us} for (name, b), us in alone.items()],
              "rows": rows,
              "runs": {f"{b} {w}": v for (b, w), v in times.items()}}
    others = [w for w in WAYS if w != "rows"]
    lines = ["The sampler's ways of drawing a batch's codes (benchmarks/sampler.py), alternated "
             "in one process.", "",
             "The candidates and draws of B rows of 4096 logits (median us, 15 alternated runs "
             "of 100):", "",
             "| logits | rows | " + " | ".join(f"{w} us" for w in WAYS) + " | "
             + " | ".join(f"{w} / rows" for w in others) + " |",
             "|---|---:|" + "---:|" * (len(WAYS) + len(others))]
    for (name, b), us in alone.items():
        lines.append(f"| {name} | {b} | " + " | ".join(f"{us[w]:.1f}" for w in WAYS) + " | "
                     + " | ".join(f"{us[w] / us['rows']:.2f}" for w in others) + " |")
    lines += ["", f"Served ({args.type}, 4 layers, NumPy; median over {args.rounds} rounds of "
              f"{args.frames} frames; a ratio is the median of the rounds' own, with its "
              "range):", "",
              "| sequences | " + " | ".join(f"{w} ms a frame" for w in WAYS) + " | "
              + " | ".join(f"{w} / rows (range)" for w in others) + " | "
              + " | ".join(f"draws {w} ms a frame" for w in WAYS) + " |",
              "|---:|" + "---:|" * (2 * len(WAYS) + len(others))]
    for r in rows:
        t, d, a = r["ms_per_frame"], r["draws_ms_per_frame"], r["against_rows"]
        lines.append(f"| {r['sequences']} | " + " | ".join(f"{t[w]:.1f}" for w in WAYS) + " | "
                     + " | ".join(f"{a[w]['ratio']:.3f} ({a[w]['ratio_range'][0]:.2f}-"
                                  f"{a[w]['ratio_range'][1]:.2f})" for w in others) + " | "
                     + " | ".join(f"{d[w]:.2f}" for w in WAYS) + " |")
    write_machine_report(args.out, "sampler", report, lines, tag_prefix=f"{args.type}-")
    return 0


if __name__ == "__main__":
    sys.exit(main())
