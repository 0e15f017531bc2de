"""`s2core demo`: the whole path on the embedded default model, with the time of each phase.

Writes a small S2 Pro-structured model into the cache directory (once), loads it on the
auto-selected backend, prefills a prompt of text and reference-voice codes, and generates
frames greedily: Slow-AR step + Fast-AR codes per frame.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass

import numpy as np

import s2core

from .generation import GenerationConfig, GenerationStats, generate
from .hparams import Hparams
from .progress import Progress
from .embedded.cache import cached_model, model_path
from .testing.prompts import semantic_frame, text_ids
from .embedded.writer import demo_hparams

#: the demo model's <|im_end|>: a text id (outside the semantic range)
DEMO_IM_END_ID = 8190


def demo_prompt(hp: Hparams, rng: np.random.Generator, n_text: int = 16, n_reference: int = 48,
                n_target: int = 12) -> np.ndarray:
    """Instruction text, reference-voice frames (semantic positions), then the text to speak."""
    def text(n: int) -> np.ndarray:
        rows = np.zeros((n, hp.row_width), dtype=np.int64)
        rows[:, 0] = text_ids(hp, n, rng)
        return rows
    reference = np.stack([semantic_frame(hp, rng) for _ in range(n_reference)])
    return np.vstack([text(n_text), reference, text(n_target)])


@dataclass
class DemoReport:
    backend: str
    model_path: str
    prompt_positions: int
    frames: np.ndarray
    write_s: float
    load_s: float
    stats: GenerationStats
    model_from_cache: bool = False  # the model file was already there (write_s is a lookup)


def run_demo(backend: str | None = None, steps: int = 32, weight_type: str = "f16",
             seed: int = 0, out=sys.stdout) -> DemoReport:
    hp = demo_hparams()
    from_cache = model_path(hp, weight_type, seed=seed, stem="demo").exists()
    t = time.perf_counter()
    path = cached_model(hp, weight_type, seed=seed, stem="demo",
                        progress=Progress("writing model", 1))
    write_s = time.perf_counter() - t

    t = time.perf_counter()
    model = s2core.load(path, backend=backend)
    load_s = time.perf_counter() - t
    caps = model.capabilities
    print(f"backend      {model.backend.name} on {caps.device} (compute {caps.compute_dtype}, "
          f"KV cache {caps.kv_cache_dtype})", file=out)
    print(f"model        {path} ({path.stat().st_size / 1e6:.1f} MB, {weight_type}, "
          f"{hp.n_layer} layers, dim {hp.dim})", file=out)

    prompt = demo_prompt(hp, np.random.default_rng(seed))
    bar = Progress("generating", steps)
    stats = GenerationStats()
    config = GenerationConfig(max_new_tokens=steps, im_end_id=DEMO_IM_END_ID,
                              min_tokens_before_end=steps, seed=seed, temperature=0)
    with model:
        frames = generate(model, prompt, config, on_frame=lambda i, _: bar.update(i + 1),
                          stats=stats)
    report = DemoReport(model.backend.name, str(path), len(prompt), frames, write_s, load_s,
                        stats, from_cache)
    _print_report(report, out)
    return report


def _print_report(r: DemoReport, out) -> None:
    s = r.stats
    steps_ms = np.array(s.step_s) * 1e3
    fast_ms = np.array(s.fast_decode_s) * 1e3
    print(f"prompt       {r.prompt_positions} positions (text + reference codes)", file=out)
    print(f"{'phase':<24}{'total s':>9}{'per call ms':>13}", file=out)
    label = "model (from the cache)" if r.model_from_cache else "model write"
    print(f"{label:<24}{r.write_s:>9.3f}", file=out)
    print(f"{'load':<24}{r.load_s:>9.3f}", file=out)
    print(f"{'prefill_fast':<24}{s.prefill_s:>9.3f}{s.prefill_s * 1e3:>13.2f}", file=out)
    if steps_ms.size:
        print(f"{'step (Slow-AR)':<24}{steps_ms.sum() / 1e3:>9.3f}{np.median(steps_ms):>13.2f}",
              file=out)
    if fast_ms.size:
        print(f"{'fast_decode (9 codes)':<24}{fast_ms.sum() / 1e3:>9.3f}{np.median(fast_ms):>13.2f}",
              file=out)
    print(f"generated    {r.frames.shape[1]} frames; first frame codes: "
          f"{r.frames[:, 0].tolist() if r.frames.shape[1] else []}", file=out)
