"""A quick timing of the MLX backend through the public API, for the benchmark and by hand.

    python -m s2core_mlx.bench MODEL.gguf [--prompt 64] [--steps 16] [--kv-cache-dtype f16]
                                          [--quant-scale-dtype f16] [--recompute]

The main benchmark needs nothing from here: it calls s2core.load(path, backend="mlx") like any
backend. Every eval_cached and fast_decode ends in mx.eval, which blocks until the device is
done, so wall-clock timing around prefill()/step()/fast_decode_native() is honest.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any, Callable

import numpy as np

import s2core
from s2core.kit.prompts import mixed_prompt, semantic_frame


def _timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def measure(path: str, n_prompt: int = 64, n_steps: int = 16, seed: int = 0,
            recompute: bool = False, **options: Any) -> dict[str, Any]:
    """Seconds for: load, one prefill of n_prompt positions (after a warm-up), decode steps
    (median), and one Fast-AR frame (num_codebooks - 1 fast_decode calls through the model,
    so each call extends the previous one's state). `recompute` also times the frame with
    every position recomputed per call (the backend's fast_decode, s2.cpp's way)."""
    start = time.perf_counter()
    m = s2core.load(path, backend="mlx", **options)
    load_s = time.perf_counter() - start
    hp = m.hparams
    rng = np.random.default_rng(seed)
    prompt = mixed_prompt(hp, n_prompt, rng)
    frames = [semantic_frame(hp, rng) for _ in range(n_steps + 1)]
    m.init_kv_cache(n_prompt + n_steps + 1)

    m.prefill_fast(prompt[:8])  # warm-up: first-call setup is not prefill cost
    m.reset()
    prefill_s = _timed(lambda: m.prefill_fast(prompt))
    m.step(frames[0])
    steps = [_timed(lambda f=f: m.step(f)) for f in frames[1:]]

    fast_s = recompute_s = None
    if hp.fast is not None:
        h = np.random.default_rng(seed + 1).standard_normal(hp.dim).astype(np.float32)
        m.fast_decode_native(h, [])  # warm-up
        fast_s = _timed(lambda: [m.fast_decode_native(h, list(range(n)))
                                 for n in range(hp.num_codebooks - 1)])
        if recompute:
            recompute_s = _timed(lambda: [m.backend.fast_decode(h, np.arange(n))
                                          for n in range(hp.num_codebooks - 1)])
    caps = m.capabilities
    m.close()
    return {
        "backend": "mlx", "device": caps.device, "path": str(path), "options": options,
        "load_s": load_s, "prefill_tokens": n_prompt, "prefill_s": prefill_s,
        "prefill_tokens_per_s": n_prompt / prefill_s,
        "step_s_median": statistics.median(steps), "step_s_min": min(steps),
        "fast_frame_s": fast_s, "fast_frame_recompute_s": recompute_s,
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model")
    p.add_argument("--prompt", type=int, default=64)
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--kv-cache-dtype", default="f16")
    p.add_argument("--widened-weight-dtype", default="f32")
    p.add_argument("--quant-scale-dtype", default="f16")
    p.add_argument("--recompute", action="store_true",
                   help="also time the Fast-AR frame recomputed from scratch per call")
    a = p.parse_args(argv)
    print(json.dumps(measure(a.model, a.prompt, a.steps, recompute=a.recompute,
                             kv_cache_dtype=a.kv_cache_dtype,
                             widened_weight_dtype=a.widened_weight_dtype,
                             quant_scale_dtype=a.quant_scale_dtype), indent=2))


if __name__ == "__main__":
    main()
