#!/usr/bin/env python
"""Decode steps with the one-row integer kernels asking for lines ahead or not, and (with
--layout-against REV) with Q6_K in REV's tile-block layout, alternated step by step in one
process; with --forms, also the K-quants' one-row kernels in VNNI's and in AVX2's
instructions (simd._make's form), both and each alone, on a VNNI CPU.

    python benchmarks/step_prefetch_alone.py [--type q6_k] [--layers 4] [--steps 80]
                                             [--layout-against REV] [--forms] [--runs 3]

A decode step (`step()`, every logit) multiplies one activation row by every matrix
(simd.products' one-row path, whose kernel simd.PREFETCH_ALONE picks).
step_ab.py compares trees in fresh processes; on this kind of VM steps moved 20-50 % between
its runs, more than the 5-20 % these choices make. Here one model serves every way, switched
between steps (the order reversed every other step): "hint" has every one-row kernel ask
PREFETCH_BLOCKS tile-blocks ahead, "none" none, "current" is simd.products as configured;
every way, "current" too, multiplies through kernel_rows.multiplying_with.
With --layout-against REV, "REV layout" runs REV's Q6_K kernel (its source taken from REV's
simd.py; its one-row kernel asks ahead, as REV's did) over each Q6_K matrix rearranged into
REV's layout by int_dots.py's own packing as of REV: the layout change alone. Every way gives
the same bits (checked on one product of each type). Writes
benchmarks/results/step-prefetch-alone-<date>-<time>-<type>-<isa>.json and .md with the CPU
model and flags (NUMBA_CPU_NAME and NUMBA_CPU_FEATURES set to HASWELL's measure the AVX2
build).
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "backends"):  # a checkout that is not pip-installed
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import numpy as np  # noqa: E402
from ab import revision, write_report  # noqa: E402
from kernel_rows import multiplying_with, products_over  # noqa: E402

from s2core.benchmarking import machine  # noqa: E402
from s2core.benchmarking.config import BenchConfig  # noqa: E402
from s2core.benchmarking.models import prepare_model  # noqa: E402


def alone_asking(namespace: dict, alone_ahead: dict[str, int], form: str | None = None):
    """simd.products over `namespace` (simd's globals, some kernels swapped) with each type's
    one-row kernel asking `alone_ahead[type]` bytes ahead, in `form`'s instructions (simd._make;
    None: the target's)."""
    from s2core_numpy import simd
    swapped = dict(namespace)
    for name, ahead in alone_ahead.items():
        swapped[f"{name}_alone"] = simd._make(swapped[f"_{name}"], 1, ahead, form)
    return products_over(swapped)


def layout_of(rev: str):
    """(REV's _q6_k kernel body, the byte permutation taking a Q6_K tile-block from this
    tree's layout to REV's, whether REV's kernels make their activation sums themselves
    (before simd.kernel_sums)), from REV's own simd.py and int_dots.py: the permutation is
    found by packing one tile-block's file bytes, numbered, with each tree's _pack."""
    from s2core_numpy import int_dots, simd
    source = {f: subprocess.run(["git", "-C", str(ROOT), "show",
                                 f"{rev}:backends/s2core_numpy/{f}.py"],
                                capture_output=True, text=True, check=True).stdout
              for f in ("simd", "int_dots")}
    simd_src, pack_src = source["simd"], source["int_dots"]
    kernel_ns = dict(vars(simd))
    exec(simd_src[simd_src.index("def _q6_k("):simd_src.index("\n#: tile-block bytes")],
         kernel_ns)
    pack_src = pack_src[pack_src.index("@njit(inline=\"always\")\ndef _put_group"):
                        pack_src.index("# ----", pack_src.index("def _pack"))]
    pack_ns = dict(vars(int_dots))
    exec(pack_src.replace(", cache=True", ""), pack_ns)

    per_super, header = 210, simd.Q6_K_HEADER
    ids = np.arange(simd.ROWS * per_super).reshape(simd.ROWS, per_super)

    def numbered(pack) -> np.ndarray:
        out = 0
        for shift in (0, 8):  # ids up to 3359: two bytes, packed one at a time
            packed = np.zeros((1, 1, simd.ROWS * per_super), np.uint8)
            pack(simd.Q6_K_KIND, ((ids >> shift) & 255).astype(np.uint8), packed, header, 0)
            out = out | (packed[0, 0].astype(np.int64) << shift)
        return out

    here, there = numbered(int_dots._pack), numbered(pack_ns["_pack"])
    position_here = np.empty(here.size, np.int64)
    position_here[here] = np.arange(here.size)
    return kernel_ns["_q6_k"], position_here[there], "def kernel_sums" not in simd_src


def sums_scaled_in_kernel():
    """simd.kernel_sums for a Q6_K kernel older than it, which scales its sums itself (x 32):
    Q6_K's sums as they are, the other types' made."""
    from numba import njit
    from s2core_numpy import simd

    @njit
    def kernel_sums(kind, xs):
        if kind == simd.Q6_K_KIND:
            return xs.reshape(-1)
        return simd.kernel_sums(kind, xs)
    return kernel_sums


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--type", default="q6_k")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--steps", type=int, default=80, help="steps per way and run")
    ap.add_argument("--runs", type=int, default=3, help="fresh caches, the ways alternated")
    ap.add_argument("--layout-against", default=None, metavar="REV")
    ap.add_argument("--forms", action="store_true",
                    help="also the K-quants' one-row kernels in VNNI's and in AVX2's "
                         "instructions (a VNNI CPU)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    args = ap.parse_args(argv)

    import s2core
    from s2core.kit.prompts import mixed_prompt, semantic_frame
    from s2core_numpy import int_dots, simd
    if not simd.isa():
        sys.exit("no integer kernels here: numba's target has neither AVX2 nor AVX-512 VNNI")
    names = ("q8_0", "q4_k", "q6_k")
    ways = {"current": simd.products,
            "hint": alone_asking(vars(simd), {n: simd.AHEAD[n] for n in names}),
            "none": alone_asking(vars(simd), {n: 0 for n in names})}
    if args.forms:
        if simd.isa() != "vnni":
            sys.exit("--forms compares VNNI's one-row kernels with AVX2's: numba's target has "
                     "no AVX-512 VNNI")
        ahead = {n: simd.AHEAD[n] if simd.PREFETCH_ALONE else 0 for n in ("q4_k", "q6_k")}
        for form in ("vnni", "avx2"):  # the K-quants (Q8_0's VNNI layout is AVX2's xor 128)
            ways[f"{form} form"] = alone_asking(vars(simd), ahead, form)
        for n in ahead:  # each K-quant's alone
            ways[f"avx2 form {n}"] = alone_asking(vars(simd), {n: ahead[n]}, "avx2")
    model_path = prepare_model(BenchConfig(layers=args.layers).hparams(), args.type, seed=0,
                               prefill_tokens=256).path
    m = s2core.load(model_path, backend="numpy")
    q6 = [o for o in gc.get_objects()
          if isinstance(o, int_dots.IntDotMatrix) and o.kind == simd.Q6_K_KIND]
    codes = {way: [x.codes for x in q6] for way in ways}
    if args.layout_against:
        old_body, permutation, raw_sums = layout_of(args.layout_against)
        old_ns = dict(vars(simd), _q6_k=old_body)
        if raw_sums:
            old_ns["kernel_sums"] = sums_scaled_in_kernel()
        old_ns["q6_k_block"] = simd._make(old_body, 1, simd.AHEAD["q6_k"])
        old_ns["q6_k_blocks"] = simd._make(old_body, simd.BLOCK, simd.AHEAD["q6_k"])
        key = f"{revision(args.layout_against)} layout"
        ways[key] = alone_asking(old_ns, {"q6_k": simd.AHEAD["q6_k"]})
        codes[key] = [np.ascontiguousarray(x.codes[:, :, permutation]) for x in q6]

    calls = {way: multiplying_with(f) for way, f in ways.items()}

    def use(way: str) -> None:
        int_dots.IntDotMatrix.__call__ = calls[way]
        for x, c in zip(q6, codes[way]):
            x.codes = c

    # the same bits every way: one matrix of each integer type (Q6_K's in every layout) times
    # one random row
    every = [o for o in gc.get_objects() if isinstance(o, int_dots.IntDotMatrix)]
    probes = list({x.kind: x for x in every[::-1]}.values())
    rows = [np.random.default_rng(1).standard_normal((1, x.n_in)).astype(np.float32)
            for x in probes]
    want = [x(r) for x, r in zip(probes, rows)]
    for way in ways:
        use(way)
        for x, r, w in zip(probes, rows, want):
            assert np.array_equal(x(r), w), f"{way}: a {x.qtype.name} product differs"
    use("current")

    hp, rng = m.hparams, np.random.default_rng(0)
    prompt = mixed_prompt(hp, 256, rng)
    frame = semantic_frame(hp, rng)
    runs = []
    for run in range(args.runs):
        m.init_kv_cache(len(prompt) + (args.steps + 2) * len(ways) + 8)
        use("current")
        m.prefill(prompt)
        for way in ways:  # compile and warm
            use(way)
            m.step(frame)
        times: dict[str, list[float]] = {w: [] for w in ways}
        order = list(ways)
        for i in range(args.steps):
            for way in order if i % 2 == 0 else order[::-1]:
                use(way)
                t = time.perf_counter()
                m.step(frame)
                times[way].append(time.perf_counter() - t)
        runs.append({w: statistics.median(v) * 1e3 for w, v in times.items()}
                    | {f"{w} / current": statistics.median(
                        a / b for a, b in zip(times[w], times["current"])) for w in ways})
    use("current")
    info = machine.describe()
    report = {"when": dt.datetime.now().strftime("%Y%m%d-%H%M"), "type": args.type,
              "layers": args.layers, "steps": args.steps, "runs": runs,
              "prefetch_alone": simd.PREFETCH_ALONE,
              "isa": simd.isa(), "machine": info, "cpu_model": machine.cpu_model(),
              "cpu_flags": machine.cpu_flags()}
    lines = [f"{args.type}, {args.layers} S2 Pro-shaped layers: decode steps (context 256+), "
             f"the ways alternated step by step, {args.steps} each a run; medians (ms) and "
             f"the median of each step's ratio to the current one's beside it.", "",
             "| run | " + " | ".join(ways) + " | " + " | ".join(f"{w} / current"
                                                          for w in ways if w != "current")
             + " |", "|---" * (2 * len(ways)) + "|"]
    for i, r in enumerate(runs):
        lines.append(f"| {i + 1} | " + " | ".join(f"{r[w]:.2f}" for w in ways) + " | "
                     + " | ".join(f"{r[f'{w} / current']:.3f}" for w in ways if w != "current")
                     + " |")
    lines += ["", *machine.summary_lines(info)]
    write_report(args.out, "step-prefetch-alone", f"{args.type}-{simd.isa()}", report, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
