"""The child process: measure one backend on one model file, write the figures as JSON.

    python -m s2core.benchmarking.measure SPEC.json RESULT.json

Each (backend, weight type) runs in a fresh process so its peak memory is its own and no
backend's allocations or thread pools affect the next. The order inside is fixed:
import the backend -> baseline memory -> load -> init_kv_cache -> prefill -> decode -> Fast-AR.

Every timed call ends by materializing its outputs on the host (Result.logits / .hidden, and
fast_decode's numpy logits), so a lazy backend (MLX) is timed for the work, not for building
a graph, and every backend pays the same hand-off a generation loop pays for sampling.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np

from s2core.benchmarking import resident
from s2core.benchmarking.bandwidth import SumProbe, measure_bandwidth
from s2core.benchmarking.machine import numba_target
from s2core.benchmarking.timing import repeat


def _log(tag: str, msg: str) -> None:
    print(f"    [{tag}] {msg}", file=sys.stderr, flush=True)


def _gb(n: int) -> str:
    return f"{n / 1e9:.2f} GB"


def _load_average() -> float | None:
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else None


def _realize(result: Any) -> None:
    result.logits  # noqa: B018  (host copies: forces lazy backends to compute)
    result.hidden  # noqa: B018


def _runtime_info() -> dict[str, Any]:
    """Threads and BLAS of the libraries this process has loaded (after the backend import)."""
    info: dict[str, Any] = {}
    try:
        from threadpoolctl import threadpool_info
        info["threadpools"] = [{k: lib.get(k) for k in ("internal_api", "prefix", "version",
                                                         "architecture", "num_threads")}
                               for lib in threadpool_info()]
    except ImportError:
        info["threadpools"] = None
    if "torch" in sys.modules:
        torch = sys.modules["torch"]
        info["torch_threads"] = torch.get_num_threads()
        info["torch_interop_threads"] = torch.get_num_interop_threads()
    if "mlx.core" in sys.modules:
        info["mlx_device"] = str(sys.modules["mlx.core"].default_device())
    info["numba_target"] = numba_target()  # which kernels ran (--avx2)
    return info


def _apply_threads_and_seed(threads: int | None, seed: int) -> None:
    if "torch" in sys.modules:
        torch = sys.modules["torch"]
        torch.manual_seed(seed)
        if threads:
            torch.set_num_threads(threads)
    if "mlx.core" in sys.modules:
        sys.modules["mlx.core"].random.seed(seed)


def measure(spec: dict[str, Any]) -> dict[str, Any]:
    import s2core
    from s2core.contract.registry import get_registry
    from s2core.kit.prompts import mixed_prompt, semantic_frame

    name, wtype = spec["backend"], spec["weight_type"]
    tag = f"{name} {wtype}"
    budget, min_reps = spec["phase_budget_s"], spec["min_reps"]
    out: dict[str, Any] = {"backend": name, "weight_type": wtype, "status": "ok",
                           "pid": os.getpid(), "load_average_start": _load_average()}
    try:
        get_registry().backend_class(name)  # the framework import is not counted as weights
        _apply_threads_and_seed(spec.get("threads"), spec["seed"])
        mem: dict[str, Any] = {"baseline": resident.snapshot()}
        out["memory"] = mem
        mem["peak_reset_supported"] = resident.reset_peak()

        t0 = time.perf_counter()
        model = s2core.load(spec["path"], backend=name)
        out["load_s"] = time.perf_counter() - t0
        _apply_threads_and_seed(spec.get("threads"), spec["seed"])  # the load may import torch
        mem["after_load"] = resident.snapshot()  # its peak = the load's transient peak
        out["capabilities"] = model.capabilities.describe()
        out["runtime"] = _runtime_info()
        _log(tag, f"load {out['load_s']:.1f} s, RSS {_gb(mem['after_load']['rss'])} "
                  f"(peak {_gb(mem['after_load']['peak'])})")

        resident.reset_peak()
        model.init_kv_cache(spec["kv_capacity"])
        mem["after_kv_init"] = resident.snapshot()
        out["kv_capacity"] = spec["kv_capacity"]

        hp = model.hparams
        prompt = mixed_prompt(hp, spec["prefill_tokens"], np.random.default_rng([spec["seed"], 1]))

        def prefill_once() -> None:
            model.reset()
            _realize(model.prefill_fast(prompt))

        first = repeat(prefill_once, 1, math.inf, 1)  # first touch of weights and buffers
        timed = repeat(prefill_once, spec["prefill_reps"], budget, 1)
        out["prefill"] = {"n_tokens": spec["prefill_tokens"], "first_ms": first.times_ms[0],
                          **timed.as_dict()}
        _log(tag, f"prefill {spec['prefill_tokens']} tokens: "
                  f"{timed.stats()['median_ms']:.0f} ms (n={timed.n})")

        # Decode from a full context. When it has the prefill's length the last prefill already
        # left exactly that context in the cache.
        if spec["context"] != spec["prefill_tokens"]:
            model.reset()
            ctx = mixed_prompt(hp, spec["context"], np.random.default_rng([spec["seed"], 2]))
            _realize(model.prefill_fast(ctx))
        out["context"] = model.n_past
        frame_rng = np.random.default_rng([spec["seed"], 3])
        frames = iter([semantic_frame(hp, frame_rng)
                       for _ in range(spec["warmup_steps"] + spec["steps"]
                                      + spec.get("beside_steps", 0))])
        last: dict[str, Any] = {}

        def step_once() -> None:
            frame = next(frames)
            result = model.step(frame)
            _realize(result)
            last["result"], last["frame"] = result, frame

        repeat(step_once, spec["warmup_steps"], math.inf, spec["warmup_steps"])
        steps = repeat(step_once, spec["steps"], budget, min_reps)
        out["decode"] = {"warmup_steps": spec["warmup_steps"], **steps.as_dict()}
        mem["after_decode"] = resident.snapshot()
        _log(tag, f"step {steps.stats()['median_ms']:.1f} ms median (n={steps.n}), "
                  f"RSS {_gb(mem['after_decode']['rss'])}")

        if hp.fast is not None:
            hidden = last["result"].hidden_native
            codes = last["frame"][1:]
            calls = hp.num_codebooks - 1

            def frame_once() -> None:
                for k in range(1, calls + 1):  # prefix lengths 1..num_codebooks-1
                    model.fast_decode(hidden, codes[:k])

            repeat(frame_once, 1, math.inf, 1)
            fast = repeat(frame_once, spec["fast_frames"], budget, 1)
            out["fast"] = {"calls_per_frame": calls, **fast.as_dict()}
            _log(tag, f"Fast-AR frame ({calls} calls) {fast.stats()['median_ms']:.0f} ms")
        mem["end"] = resident.snapshot()  # its peak = the compute phases' peak (with the cache)
        if spec.get("beside_steps"):
            out["decode_beside"] = _steps_beside_sums(step_once, spec["beside_steps"])
        out["load_average_end"] = _load_average()
        model.close()
        # Bandwidth in this process, after its memory was measured: the memory state the
        # backend ran in (page backing in a VM can change read bandwidth by 2x between processes).
        out["bandwidth_in_child"] = measure_bandwidth(spec["bandwidth_mb"], 3).as_dict()
    except BaseException as exc:  # report what was measured, and why the rest was not
        out["status"] = "error"
        out["error"] = f"{type(exc).__name__}: {exc}"
        out["traceback"] = traceback.format_exc()
        _log(tag, f"FAILED: {out['error']}")
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    spec_path, result_path = Path(argv[0]), Path(argv[1])
    result = measure(json.loads(spec_path.read_text()))
    result_path.write_text(json.dumps(result, indent=1))
    return 0


def _steps_beside_sums(step_once, n: int) -> dict[str, list[float]]:
    """n decode steps, each followed by one sum of 256 MiB (bandwidth.SumProbe): the step's
    time and the sum bandwidth of the same moment."""
    times, sums = [], []
    with SumProbe(256) as probe:
        for _ in range(n):
            t0 = time.perf_counter()
            step_once()
            times.append((time.perf_counter() - t0) * 1e3)
            sums.append(probe.sample())
    return {"step_ms": times, "sum_gbps": sums}


if __name__ == "__main__":
    sys.exit(main())
