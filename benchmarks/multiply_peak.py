#!/usr/bin/env python
"""The machine's multiply-add ceiling beside its read floor, and how near the kernels come to
each: what bounds a product of several activation rows (a batched step, the Fast-AR of
several sequences).

    python benchmarks/multiply_peak.py [--types Q4_K,Q6_K,Q8_0,F16,F16_GGML] [--rows 1,4,8]
                                       [--reps 7]

A decode step of one sequence streams its weights once: its floor is their bytes at the read
bandwidth. With B sequences the weights still stream once, but every weight meets B
activations, and past a few rows the products run out of multiply-adds before they run out
of memory. This measures that second floor the way the first is measured, with the
instruction the kernels spend it on, alone:

* **int8 peak**: one thread per core, each running independent chains of the integer dot the
  kernels use (simd.Emitter.dot: one AVX-512 VNNI `vpdpbusd` on 64 bytes, or AVX2's
  `vpmaddubsw` + `vpmaddwd`), registers only: int8 multiply-adds a second.
* **float peak**: the same with float32 fused multiply-adds on the target's vector width (the
  F16 products' instruction): multiply-adds a second. "F16" is the tiled kernel of F16 files'
  default arithmetic (f16.py), "F16_GGML" their products under "ggml" (ggml_ops.py).

Then the kernels themselves, on the same thread count:
* **in cache**: a 512 x 2560 matrix (its tiles fit the cores' L2) times 4, 8 and 16 rows,
  many times over: the kernel's multiply-adds a second against the peak (its efficiency;
  what it spends besides the dots: unpacking, scales, the float step).
* **from memory**: copies of one 9728 x 2560 matrix (S2 Pro's FFN shape; their sum passes any
  L3) times `--rows` rows, the row counts alternated and a read-floor sample
  (bandwidth.GemvProbe) taken beside each: the product's time against its floor, the larger
  of its bytes at the bandwidth sampled beside it and its multiply-adds at the peak.

Integer types need a CPU with AVX2 or AVX-512 VNNI (simd.isa()); the F16 ones run everywhere
numba does. Writes benchmarks/results/multiply-peak-<date>-<time>-<isa>.json and .md with the CPU
model and flags (NUMBA_CPU_NAME and NUMBA_CPU_FEATURES set to HASWELL's measure the AVX2
build on an AVX-512 machine).
"""

from __future__ import annotations

import argparse
import datetime as dt
import functools
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "backends"):  # a checkout that is not pip-installed
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import numpy as np  # noqa: E402
from ab import write_report  # noqa: E402
from kernel_rows import SHAPE, kernel_args, packed_copies  # noqa: E402
from llvmlite import ir  # noqa: E402
from numba import njit, types  # noqa: E402
from numba.core import cgutils  # noqa: E402
from numba.extending import intrinsic  # noqa: E402

from s2core.benchmarking import machine  # noqa: E402
from s2core.benchmarking.bandwidth import GemvProbe, usable_cores  # noqa: E402

_I8, _I32, _I64 = ir.IntType(8), ir.IntType(32), ir.IntType(64)
#: independent accumulators per thread: enough to cover the instruction's latency times the
#: pipes that run it (vpdpbusd, a fused multiply-add: 4-5 cycles, one or two a cycle), few
#: enough for the registers (AVX2 has 16: its int8 chains are two halves, each with its own
#: weights, and twelve of those spilled to the stack and ran at a quarter of the peak)
FLOAT_CHAINS = 12
INT8_CHAINS = {"vnni": 12, "avx2": 4}


def float_lanes() -> int:
    """float32 lanes a fused multiply-add takes: the target's vector register, as in
    ggml_ops' F16 products (attention.vector_shape: 16 on AVX-512, 8 on AVX2)."""
    from s2core_numpy.attention import vector_shape
    return vector_shape()[0]


def _counted_loop(builder: ir.IRBuilder, n: ir.Value, start: list, step) -> list:
    """`step(values) -> values` n times (n >= 1) from `start`, in an LLVM loop; the last
    values. The values are loop-carried, so LLVM can neither drop nor hoist the work."""
    before = builder.block
    loop = builder.append_basic_block("peak_loop")
    done = builder.append_basic_block("peak_done")
    builder.branch(loop)
    builder.position_at_end(loop)
    i = builder.phi(_I64)
    carried = [builder.phi(v.type) for v in start]
    new = step(carried)
    i_next = builder.add(i, ir.Constant(_I64, 1))
    i.add_incoming(ir.Constant(_I64, 0), before)
    i.add_incoming(i_next, loop)
    for phi, first, last in zip(carried, start, new):
        phi.add_incoming(first, before)
        phi.add_incoming(last, loop)
    builder.cbranch(builder.icmp_signed("<", i_next, n), loop, done)
    builder.position_at_end(done)
    return new


@functools.lru_cache(maxsize=None)  # compiled once, for one thread and for all
def _int8_spin():
    """(n, byte, 0) -> int: INT8_CHAINS accumulators, each taking two of simd.Emitter's dots
    (64 int8 multiply-adds each) per iteration, n iterations."""
    from s2core_numpy.simd import Emitter
    chains = INT8_CHAINS[_isa()]

    @intrinsic
    def spin(typingctx, n, byte, zero):
        def codegen(context, builder, signature, args):
            e = Emitter(builder, _isa())
            count, value, nothing = args
            # a weight byte below 64 (AVX2's int16 pair sums stay in range) and an activation
            # byte, from a run-time value so that nothing folds to a constant
            w = [builder.bitcast(v, e.bytes_t) for v in e.splat(builder.trunc(
                builder.and_(value, ir.Constant(_I64, 0x3F3F3F3F)), _I32))]
            x = [builder.bitcast(v, e.bytes_t) for v in e.splat(builder.trunc(value, _I32))]
            parts = e.parts
            # VNNI's dot takes its accumulator in the same instruction, so every chain's is its
            # own. AVX2's multiplies first and adds after: with the same loop-invariant
            # operands LLVM would multiply once, before the loop, and only add in it. There
            # each chain carries its own weights, xor a run-time zero every iteration (one
            # cheap op a register, off the multiply pipes), so every multiply stays in the
            # loop; each register's zero is another multiple of it, so LLVM cannot prove two
            # chains' weights equal and merge their products either.
            own = e.kind != "vnni"
            flips = [builder.bitcast(e.splat(builder.trunc(builder.mul(
                nothing, ir.Constant(_I64, k + 1)), _I32))[0], e.bytes_t)
                for k in range(chains * parts)] if own else None
            start = [a for _ in range(chains) for a in e.zero()]
            if own:
                start += w * chains

            def step(values):
                out, weights = [], []
                for c in range(chains):
                    acc = values[c * parts:(c + 1) * parts]
                    wc = w
                    if own:
                        at = chains * parts + c * parts
                        wc = e.op("xor", values[at:at + parts], flips[c * parts:(c + 1) * parts])
                        weights += wc
                    # two pairs a call: AVX2 adds their int16 sums before widening them, as
                    # the kernels do (simd.Emitter.dot); VNNI takes two dots
                    out += e.dot(acc, [(wc, x), (x, wc)])
                return out + weights

            last = _counted_loop(builder, count, start, step)[:chains * parts]
            # every register of every chain reaches the result: a chain (or an AVX2 half)
            # left unused after the loop would be dropped, and its work counted but not done
            total = last[0]
            for v in last[1:]:
                total = builder.add(total, v)
            return builder.sext(builder.extract_element(total, ir.Constant(_I32, 0)), _I64)
        return types.int64(n, byte, zero), codegen

    @njit(nogil=True)
    def run(n, byte, zero):
        """zero: 0, passed at run time (a default would be compiled in as a constant)."""
        return spin(n, byte, zero)

    return run, 2 * chains * 64  # multiply-adds an iteration


@functools.lru_cache(maxsize=None)
def _float_spin():
    """n -> float: FLOAT_CHAINS accumulators of float_lanes() float32, one fused
    multiply-add each per iteration."""
    lanes = float_lanes()
    vec = ir.VectorType(ir.FloatType(), lanes)

    @intrinsic
    def spin(typingctx, n, value):
        def codegen(context, builder, signature, args):
            fma = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(vec, [vec] * 3), f"llvm.fma.v{lanes}f32")
            count, v = args
            one = builder.insert_element(ir.Constant(vec, None), builder.fptrunc(
                v, ir.FloatType()), ir.Constant(_I32, 0))
            a = builder.shuffle_vector(one, ir.Constant(vec, None),
                                       ir.Constant(ir.VectorType(_I32, lanes), [0] * lanes))
            start = [ir.Constant(vec, [float(c)] * lanes) for c in range(FLOAT_CHAINS)]
            last = _counted_loop(builder, count, start,
                                 lambda values: [builder.call(fma, [acc, a, a])
                                                 for acc in values])
            total = last[0]
            for t in last[1:]:
                total = builder.fadd(total, t)
            return builder.fpext(builder.extract_element(total, ir.Constant(_I32, 0)),
                                 ir.DoubleType())
        return types.float64(n, value), codegen

    @njit(nogil=True)
    def run(n, value):
        return spin(n, value)

    return run, FLOAT_CHAINS * lanes


def _isa() -> str:
    from s2core_numpy.simd import isa
    return isa()


def peak(kind: str, threads: int, seconds: float = 0.3, reps: int = 5) -> float:
    """Multiply-adds a second (best of `reps`) of `threads` threads each spinning
    `kind`'s ("int8" or "float") instruction for about `seconds`."""
    run, per_iteration = _int8_spin() if kind == "int8" else _float_spin()
    args = (0x01020304, 0) if kind == "int8" else (1.0,)
    run(1000, *args)  # compile
    t0 = time.perf_counter()
    run(1_000_000, *args)
    n = max(1000, int(1_000_000 * seconds / (time.perf_counter() - t0)))
    best = float("inf")
    for _ in range(reps):
        workers = [threading.Thread(target=run, args=(n, *args)) for _ in range(threads)]
        t0 = time.perf_counter()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        best = min(best, time.perf_counter() - t0)
    return threads * n * per_iteration / best


#: the float types: F16 files' default kernel (arithmetic "f32": f16.F16Matrix, the tiled
#: layout) and their kernel under "ggml" (ggml_ops.GgmlRows, ggml's order of sums)
FLOAT_TYPES = ("F16", "F16_GGML")


def _products(name: str):
    """(f(matrix, args), args(matrix, rows), copies(k)) for type `name`: simd.products for the
    integer types (their quantized rows made once), F16Matrix or GgmlRows for the F16 ones."""
    if name in FLOAT_TYPES:
        from s2core_numpy.f16 import F16Matrix
        from s2core_numpy.ggml_ops import GgmlRows
        held = F16Matrix.from_raw if name == "F16" else GgmlRows

        def f16_copies(k: int, shape=SHAPE) -> list:
            rng = np.random.default_rng(0)
            values = (rng.standard_normal(shape) * 0.05).astype(np.float16)
            return [held(values.copy()) for _ in range(k)]

        def f16_args(m, rows):
            return (np.random.default_rng(rows).standard_normal(
                (rows, m.shape[1])).astype(np.float32),)

        return (lambda m, a: m(*a)), f16_args, f16_copies
    from s2core_numpy import simd

    def int_args(m, rows):
        return kernel_args(m, rows, np.random.default_rng(rows))

    def int_copies(k: int, shape=SHAPE) -> list:
        return packed_copies(name, k, shape)

    return (lambda m, a: simd.products(m.kind, m.codes, *a, simd.LONE_BLOCK[m.kind])), \
        int_args, int_copies


def in_cache(name: str, rows_list: list[int], peak_rate: float, seconds: float = 0.5
             ) -> dict[int, dict]:
    """Multiply-adds a second of a 512 x 2560 product (L2-resident) at each row count."""
    product, args_for, copies = _products(name)
    (m,) = copies(1, (512, SHAPE[1]))
    out = {}
    for rows in rows_list:
        args = args_for(m, rows)
        product(m, args)
        t0 = time.perf_counter()
        product(m, args)
        n = max(20, int(seconds / max(time.perf_counter() - t0, 1e-6)))
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            product(m, args)
            times.append(time.perf_counter() - t0)
        rate = rows * m.shape[0] * m.shape[1] / statistics.median(times)
        out[rows] = {"macs_per_s": rate, "of_peak": rate / peak_rate}
    return out


def from_memory(name: str, rows_list: list[int], peak_rate: float, copies_n: int, reps: int,
                probe: GemvProbe) -> dict[int, dict]:
    """Per row count: the median time of one 9728 x 2560 product streamed from memory, its
    floors (bytes at the read bandwidth sampled beside it, multiply-adds at the peak) and
    the median ratio to the larger."""
    product, args_for, copies = _products(name)
    mats = copies(copies_n)
    nbytes = mats[0].nbytes
    args = {rows: args_for(mats[0], rows) for rows in rows_list}
    for rows in rows_list:
        product(mats[0], args[rows])  # compile and warm
    times = {rows: [] for rows in rows_list}
    ratios = {rows: [] for rows in rows_list}
    bandwidths = []
    for rep in range(reps):
        order = rows_list if rep % 2 == 0 else rows_list[::-1]
        for rows in order:
            gbps = probe.sample()
            bandwidths.append(gbps)
            t0 = time.perf_counter()
            for m in mats:
                product(m, args[rows])
            each = (time.perf_counter() - t0) / len(mats)
            floor = max(nbytes / (gbps * 1e9), rows * SHAPE[0] * SHAPE[1] / peak_rate)
            times[rows].append(each)
            ratios[rows].append(each / floor)
    gbps = statistics.median(bandwidths)
    return {rows: {"ms": statistics.median(times[rows]) * 1e3,
                   "memory_floor_ms": nbytes / (gbps * 1e9) * 1e3,
                   "multiply_floor_ms": rows * SHAPE[0] * SHAPE[1] / peak_rate * 1e3,
                   "over_floor": statistics.median(ratios[rows]),
                   "read_gbps_median": gbps, "bytes": nbytes}
            for rows in rows_list}


def gains(from_memory: dict[int, dict]) -> dict[int, dict]:
    """Per row count, what a product of that many rows gains over one row (a batch's sequences
    against one sequence): the kernel's, rows x time(1) / time(rows), and the most the floors
    allow, rows x floor(1) / floor(rows), each floor the larger of the bytes at the read
    bandwidth and the multiply-adds at the peak. Empty without a one-row measurement."""
    if 1 not in from_memory:
        return {}

    def floor(m):
        return max(m["memory_floor_ms"], m["multiply_floor_ms"])

    one = from_memory[1]
    return {rows: {"kernel": rows * one["ms"] / m["ms"], "ceiling": rows * floor(one) / floor(m)}
            for rows, m in from_memory.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--types", default="Q4_K,Q6_K,Q8_0,F16,F16_GGML")
    ap.add_argument("--rows", default="1,4,8", help="rows of the products from memory")
    ap.add_argument("--cache-rows", default="4,8,16", help="rows of the products in cache")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--copies", type=int, default=24,
                    help="copies of the 9728 x 2560 matrix streamed (their sum must pass L3)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    args = ap.parse_args(argv)

    isa = _isa()
    names = [t for t in args.types.split(",") if t in FLOAT_TYPES or isa]
    if len(names) < len(args.types.split(",")):
        print("no integer kernels here (numba's target has neither AVX2 nor AVX-512 VNNI): "
              "the integer types are left out")
    threads = usable_cores()
    peaks = {"threads": threads}
    for kind in ("int8", "float") if isa else ("float",):
        peaks[kind] = {"one_thread": peak(kind, 1), "all_threads": peak(kind, threads)}
    probe = GemvProbe()
    rows_list = [int(r) for r in args.rows.split(",")]
    cache_rows = [int(r) for r in args.cache_rows.split(",")]
    results = {}
    for name in names:
        rate = peaks["float" if name in FLOAT_TYPES else "int8"]["all_threads"]
        streamed = from_memory(name, rows_list, rate, args.copies, args.reps, probe)
        results[name] = {"in_cache": in_cache(name, cache_rows, rate), "from_memory": streamed,
                         "gains": gains(streamed)}
    probe.close()

    info = machine.describe()
    report = {"when": dt.datetime.now().strftime("%Y%m%d-%H%M"), "isa": isa,
              "peaks": peaks, "results": results, "shape": list(SHAPE),
              "machine": info, "cpu_model": machine.cpu_model(),
              "cpu_flags": machine.cpu_flags()}
    lines = [f"Multiply-add peaks ({isa or 'no integer kernels'}; {threads} threads, one per "
             "core): the instruction alone, registers only, best of 5.", "",
             "| instruction | one thread (G/s) | all threads (G/s) |", "|---|---:|---:|"]
    for kind in ("int8", "float"):
        if kind in peaks:
            lines.append(f"| {kind} multiply-adds | {peaks[kind]['one_thread'] / 1e9:.0f} | "
                         f"{peaks[kind]['all_threads'] / 1e9:.0f} |")
    lines += ["", "In cache (512 x 2560, L2): the kernel's multiply-adds a second and their share "
              "of the peak.", "",
              "| type | " + " | ".join(f"{r} rows" for r in cache_rows) + " |",
              "|---" * (len(cache_rows) + 1) + "|"]
    for name, r in results.items():
        lines.append(f"| {name} | " + " | ".join(
            f"{r['in_cache'][k]['macs_per_s'] / 1e9:.0f} G/s ({r['in_cache'][k]['of_peak']:.0%})"
            for k in cache_rows) + " |")
    lines += ["", f"From memory ({SHAPE[0]} x {SHAPE[1]}, {args.copies} copies streamed, "
              f"{args.reps} alternated reps): median ms; the floors (bytes at the read "
              "bandwidth sampled beside, multiply-adds at the peak); the median ratio to the "
              "larger; the gain over one row, the kernel's and the most the floors allow "
              "(rows x time of one row / time of the rows: what a batch of that many "
              "sequences can gain in its products).", "",
              "| type | rows | ms | memory floor | multiply floor | over floor | gain | "
              "floors allow |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for name, r in results.items():
        for rows in rows_list:
            m, g = r["from_memory"][rows], r["gains"].get(rows)
            lines.append(f"| {name} | {rows} | {m['ms']:.3f} | {m['memory_floor_ms']:.3f} | "
                         f"{m['multiply_floor_ms']:.3f} | {m['over_floor']:.2f}x | "
                         + (f"{g['kernel']:.2f}x | {g['ceiling']:.2f}x |" if g else "- | - |"))
    lines += ["", *machine.summary_lines(info)]
    write_report(args.out, "multiply-peak", isa or "no-int", report, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
