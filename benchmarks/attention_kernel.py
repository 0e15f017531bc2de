#!/usr/bin/env python
"""NumPy's attention kernel alone: the newest query row over a real-size layer's cache, at
256 and 2048 positions, against a plain read of the same bytes (issue 26, step 5).

    python benchmarks/attention_kernel.py [--positions 256,2048] [--threads 1,2]
                                          [--caches f16,f32] [--layers 36] [--rounds 5]
                                          [--ops kernels|ggml]

S2 Pro's attention shapes: 32 query heads of 128 over 8 KV heads. For each cache type, the
K and V of --layers layers in one array each [layer, KV head, capacity, 128] (the backend's
layout, slots.py; random values), so that a layer's turn finds its rows in memory, not in a
CPU cache, as in a decode step. Per round, for each positions count and thread count, in
turn: the kernel (row_kernels.attention, as a step calls it) on every layer, then a numba
loop that only reads the same K and V rows (xor of 8-byte words, on the same threads): the
floor. Medians over the rounds, per layer. The call goes through row_kernels, so this
script measures an older checkout's kernel too (PYTHONPATH=<checkout>:<checkout>/backends).

Writes benchmarks/results/attention-kernel-<date>-<time>.json (with the CPU model, its SIMD
flags, the numba target and the load average).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# a checkout that is not pip-installed; after PYTHONPATH's entries, so that an older
# checkout named there is the one measured (inserted first, this checkout shadowed it)
_AFTER_PYTHONPATH = 1 + len([p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
for path in (ROOT, ROOT / "backends"):
    if str(path) not in sys.path:
        sys.path.insert(_AFTER_PYTHONPATH, str(path))

import numba  # noqa: E402
import numpy as np  # noqa: E402
from numba import njit, prange  # noqa: E402

from s2core.benchmarking import machine  # noqa: E402
from s2core_numpy import ops, row_kernels  # noqa: E402

N_HEAD, N_KV, HEAD_DIM = 32, 8, 128


@njit(parallel=True, cache=True)
def _read(k, v, rows):
    """xor of the 8-byte words of K and V rows < rows of every KV head ([n_kv, capacity,
    words]): every byte the kernel reads, read once."""
    n_kv = k.shape[0]
    out = np.zeros(n_kv, np.uint64)
    for h in prange(n_kv):
        x = np.uint64(0)
        for j in range(rows):
            for i in range(k.shape[2]):
                x ^= k[h, j, i] ^ v[h, j, i]
        out[h] = x
    return out


def _words(a: np.ndarray) -> np.ndarray:
    return a.view(np.uint64)


def _ggml_attention():
    from s2core_numpy import ggml_ops
    return ggml_ops.attention


#: --ops: NumPy's own kernel (as a quantized file's step calls it), or the attention in
#: s2.cpp's order that arithmetic="ggml" runs on F16 and F32 files (ggml_ops.py)
ATTENTIONS = {"kernels": lambda: row_kernels.attention, "ggml": _ggml_attention}


def measure(cache: str, args) -> dict:
    rng = np.random.default_rng(0)
    dtype = np.float16 if cache == "f16" else np.float32
    capacity = max(args.positions) + 1
    shape = (args.layers, N_KV, capacity, HEAD_DIM)
    k, v = np.empty(shape, dtype), np.empty(shape, dtype)
    for layer in range(args.layers):  # a layer at a time: no float32 copy of all of it
        k[layer] = rng.standard_normal(shape[1:])
        v[layer] = rng.standard_normal(shape[1:])
    q = rng.standard_normal((1, N_HEAD, HEAD_DIM), dtype=np.float32)
    scale = 1 / np.sqrt(HEAD_DIM)
    times = {(n, t): {"kernel": [], "read": []} for n in args.positions for t in args.threads}

    attention = ATTENTIONS[args.ops]()

    def kernel(n):
        for layer in range(args.layers):
            attention(q, ops.Keys(None, (k[layer], v[layer]), n), n - 1, scale)

    def read(n):
        for layer in range(args.layers):
            _read(_words(k[layer]), _words(v[layer]), n)

    for threads in args.threads:  # compile, fault in
        numba.set_num_threads(threads)
        kernel(args.positions[0])
        read(args.positions[0])
    for _ in range(args.rounds):
        for n in args.positions:
            for threads in args.threads:
                numba.set_num_threads(threads)
                for name, run in (("kernel", kernel), ("read", read)):
                    t0 = time.perf_counter()
                    run(n)
                    times[n, threads][name].append((time.perf_counter() - t0) / args.layers)
    out = {}
    for (n, threads), t in times.items():
        kernel_ms = statistics.median(t["kernel"]) * 1e3
        read_ms = statistics.median(t["read"]) * 1e3
        nbytes = 2 * N_KV * n * HEAD_DIM * np.dtype(dtype).itemsize
        out[f"{n} positions, {threads} threads"] = {
            "positions": n, "threads": threads, "kv_bytes_per_layer": nbytes,
            "kernel_ms_per_layer": kernel_ms, "read_ms_per_layer": read_ms,
            "kernel_over_read": kernel_ms / read_ms,
            "kernel_gbps": nbytes / kernel_ms / 1e6, "read_gbps": nbytes / read_ms / 1e6,
            "kernel_ms_rounds": [x * 1e3 for x in t["kernel"]],
        }
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--positions", default="256,2048")
    p.add_argument("--threads", default="1,2")
    p.add_argument("--caches", default="f16,f32")
    p.add_argument("--layers", type=int, default=36)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--ops", choices=sorted(ATTENTIONS), default="kernels")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = p.parse_args(argv)
    args.positions = [int(x) for x in args.positions.split(",")]
    args.threads = [int(x) for x in args.threads.split(",")]
    load_before = os.getloadavg()
    results = {}
    for cache in args.caches.split(","):
        results[cache] = r = measure(cache, args)
        for label, m in r.items():
            print(f"{cache} cache, {label}: kernel {m['kernel_ms_per_layer']:.3f} ms a layer "
                  f"({m['kernel_gbps']:.1f} GB/s), read {m['read_ms_per_layer']:.3f} ms: "
                  f"{m['kernel_over_read']:.2f}x", file=sys.stderr)
    report = {
        "created": dt.datetime.now().isoformat(timespec="seconds"),
        "machine": machine.describe(), "cpu_model": machine.cpu_model(),
        "cpu_flags": machine.cpu_flags(), "numba_cpu_name": os.environ.get("NUMBA_CPU_NAME", ""),
        "kernel_module": ATTENTIONS[args.ops]().__module__, "ops": args.ops,
        "kernel_file": sys.modules[ATTENTIONS[args.ops]().__module__].__file__,
        "layers": args.layers, "rounds": args.rounds, "shape": {
            "n_head": N_HEAD, "n_kv": N_KV, "head_dim": HEAD_DIM},
        "load_average_before": load_before, "load_average_after": os.getloadavg(),
        "caches": results,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    suffix = "" if args.ops == "kernels" else f"-{args.ops}"
    out = args.out / f"attention-kernel-{time.strftime('%Y%m%d-%H%M')}{suffix}.json"
    out.write_text(json.dumps(report, indent=1))
    print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
