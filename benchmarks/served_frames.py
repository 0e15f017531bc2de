"""What the in-process batch scripts (batch_products.py, kernels_ab.py, served_arithmetic.py)
share: one NumPy model of the bench's 4-layer S2 Pro-shaped file serving B concurrent
requests through s2core.serving.Server, as the batch case does, timed a frame at a time, and
their common options."""

from __future__ import annotations

import functools
import time
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results"


def add_served_options(ap, type_name: str, sizes: str, rounds: int) -> None:
    """The options every in-process batch script takes, with its own defaults for the first
    three: --type, --sizes (comma-separated), --rounds, --frames, --out."""
    ap.add_argument("--type", default=type_name)
    ap.add_argument("--sizes", default=sizes)
    ap.add_argument("--rounds", type=int, default=rounds)
    ap.add_argument("--frames", type=int, default=12)
    ap.add_argument("--out", default=str(RESULTS))


def sizes_of(args) -> list[int]:
    return [int(s) for s in args.sizes.split(",")]


@functools.cache
def bench_model(type_name: str) -> Path:
    """The bench's 4-layer file of `type_name` (BenchConfig), written if the cache lacks it
    and read once into the page cache: once a process, however many models serve it."""
    from s2core.benchmarking.config import BenchConfig
    from s2core.benchmarking.models import prepare_model

    cfg = BenchConfig()
    return prepare_model(cfg.hparams(), type_name, cfg.seed, 1, None).path


class ServedFrames:
    """A NumPy model of weight type `type_name` (the bench's file, BenchConfig) and
    `max_sequences` 64-position prompts (kit.prompts.mixed_prompt), loaded with `options`
    (arithmetic=...). `seconds_per_frame(b)`
    serves the first b prompts at once, as the batch case does (batch.frames_config): their
    admission (prefills and first frames) untimed, then `frames` frames timed;
    `before_timing()` runs between the two. `seconds_of_prefill(prompt)` times a prefill."""

    def __init__(self, type_name: str, frames: int, max_sequences: int, **options):
        import s2core
        from s2core.benchmarking.batch import frames_config
        from s2core.kit.prompts import mixed_prompt

        self.model = s2core.load(str(bench_model(type_name)), backend="numpy", **options)
        hp = self.model.hparams
        self.frames = frames
        self.config = frames_config(hp, frames)
        rng = np.random.default_rng(0)
        self.prompts = [mixed_prompt(hp, 64, rng) for _ in range(max_sequences)]

    def seconds_per_frame(self, b: int, before_timing=lambda: None) -> float:
        from s2core.generation.loop import GenerationConfig
        from s2core.serving import Server

        with Server(self.model, max_sequences=b) as server:
            for i in range(b):
                server.submit(self.prompts[i], GenerationConfig(seed=i, **self.config))
            server.step()  # admission: prefills and first frames, not timed
            before_timing()
            t0 = time.perf_counter()
            server.run()
            return (time.perf_counter() - t0) / self.frames

    def seconds_of_prefill(self, prompt) -> float:
        """A prefill of `prompt` into an emptied cache."""
        self.model.init_kv_cache(len(prompt) + 8)
        t0 = time.perf_counter()
        self.model.prefill(prompt)
        return time.perf_counter() - t0

    def close(self) -> None:
        self.model.close()
