"""The benchmark's model files: written once into the model cache, then found there.

Writing an S2 Pro-shaped file takes minutes (random weights are generated and encoded tensor by
tensor), so it goes through `s2core.embedded.cache.cached_model` and shows progress. Before the
backends are measured the file is read once so every backend's load finds it in the OS page
cache: load times then compare the backends, not the disk.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from s2core.modelfile.file import ModelFile
from s2core.modelfile.hparams import Hparams
from s2core.embedded.cache import cache_dir, cached_model
from s2core.embedded.codec_writer import CodecConfig
from s2core.benchmarking.workload import ModelAccount, account

READ_CHUNK = 64 << 20

#: file types written with random valid blocks instead of quantized random weights: the K-quant
#: quantizer takes minutes a layer at S2 Pro's size, and a step's time does not depend on the
#: values (the benchmark's numbers are times and bytes, not outputs)
RANDOM_BLOCK_TYPES = frozenset({"q2_k", "q3_k", "q4_k", "q5_k", "q6_k", "q4_k_m", "q5_k_m"})


class WriteProgress:
    """progress(done, total) for the writer: a live line on a terminal, a few lines in a log."""

    def __init__(self, label: str, stream=sys.stderr):
        self.label, self.stream = label, stream
        self.start = time.perf_counter()
        self.last_quarter = -1

    def __call__(self, done: int, total: int) -> None:
        elapsed = time.perf_counter() - self.start
        line = f"  writing {self.label}: {done}/{total} tensors, {elapsed:.0f} s"
        if self.stream.isatty():
            self.stream.write("\r" + line + ("\n" if done == total else ""))
        elif done * 4 // total > self.last_quarter:  # a log gets a line per quarter
            self.last_quarter = done * 4 // total
            self.stream.write(line + "\n")
        self.stream.flush()


def prepare_model(hp: Hparams, weight_type: str, seed: int, prefill_tokens: int,
                  directory: Path | None = None, codec: CodecConfig | None = None
                  ) -> ModelAccount:
    """Write the model if the cache lacks it, warm the page cache, return its byte counts.
    `codec`: the file carries this codec too (as s2.cpp's files do)."""
    target = directory or cache_dir()
    label = (f"{weight_type} model ({hp.n_layer} layers{', with its codec' if codec else ''}) "
             f"into {target}")
    path = cached_model(hp, weight_type, seed=seed, stem="model", directory=directory,
                        progress=WriteProgress(label), codec=codec,
                        random_blocks=weight_type in RANDOM_BLOCK_TYPES)
    warm_page_cache(path)
    mf = ModelFile(path)
    try:
        return account(mf, weight_type, prefill_tokens)
    finally:
        mf.close()


def warm_page_cache(path: Path) -> float:
    """Read the whole file once (seconds taken); later loads then read from memory."""
    t0 = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        buf = bytearray(READ_CHUNK)
        while f.readinto(buf):
            pass
    return time.perf_counter() - t0
