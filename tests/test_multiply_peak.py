"""benchmarks/multiply_peak.py's instrument: the spin loops that measure the machine's
multiply-add peak must do exactly the work they count (an LLVM that folded or hoisted some of
it away would report a peak above the machine's, and every kernel would look inefficient).
Their results are checked against the sums worked out by hand, in both builds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("numba")

from s2core.benchmarking.machine import HASWELL  # noqa: E402

from s2core_numpy import simd  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import multiply_peak  # noqa: E402

needs_integer_kernels = pytest.mark.skipif(
    not simd.isa(), reason="this CPU has neither AVX2 nor AVX-512 VNNI: no integer kernels")

#: spins of each instrument, run in a child process under another numba target (the AVX2
#: build); prints its results as JSON
_CHILD = """
import json, sys
sys.path.insert(0, {benchmarks!r})
import multiply_peak
from s2core_numpy import simd
run, per = multiply_peak._int8_spin()
result = run({n}, 0x01020304, 0)
asm = run.inspect_asm(run.signatures[0])
print(json.dumps({{"isa": simd.isa(), "int8": result, "per": per,
                  "multiplies": asm.count("vpmaddubsw")}}))
"""


def int8_expected(n: int, isa: str) -> int:
    """Lane 0's sum over the chains and their registers (one on VNNI, two halves on AVX2:
    each does its share of a dot's 64) after n iterations of two dots of the bytes
    (1, 2, 3, 4) with themselves (1 + 4 + 9 + 16 = 30 each), wrapped to int32 as the registers
    wrap."""
    parts = 1 if isa == "vnni" else 2
    total = parts * multiply_peak.INT8_CHAINS[isa] * 2 * 30 * n
    return (total + 2**31) % 2**32 - 2**31


#: the instruction that multiplies, per build, and the registers a dot takes
MULTIPLY = {"vnni": ("vpdpbusd", 1), "avx2": ("vpmaddubsw", 2)}


def check_every_multiply_in_code(count: int, isa: str) -> None:
    """The compiled spin holds a whole number of copies of the loop's dots: had LLVM hoisted
    the multiplies out of the loop (loop-invariant operands), one copy of each distinct
    product would remain and the count would fall short."""
    per_loop = 2 * multiply_peak.INT8_CHAINS[isa] * MULTIPLY[isa][1]
    assert count >= per_loop and count % per_loop == 0, (
        f"{count} {MULTIPLY[isa][0]} in the spin's code, not a multiple of the {per_loop} "
        "its loop counts: some multiplies left the loop")


@needs_integer_kernels
def test_int8_spin_keeps_its_multiplies_in_the_loop():
    run, _ = multiply_peak._int8_spin()
    run(3, 0x01020304, 0)
    asm = run.inspect_asm(run.signatures[0])
    check_every_multiply_in_code(asm.count(MULTIPLY[simd.isa()][0]), simd.isa())


@needs_integer_kernels
@pytest.mark.parametrize("n", [1, 7, 100_000_000])
def test_int8_spin_does_every_dot_it_counts(n):
    run, per_iteration = multiply_peak._int8_spin()
    assert per_iteration == multiply_peak.INT8_CHAINS[simd.isa()] * 2 * 64, "64 per dot"
    assert run(n, 0x01020304, 0) == int8_expected(n, simd.isa())


@needs_integer_kernels
def test_int8_spin_of_the_avx2_build():
    """The AVX2 form (vpmaddubsw + vpmaddwd) counts the same work, built on this machine by
    naming a Haswell to numba."""
    if simd.isa() != "vnni":
        pytest.skip("the host build is the AVX2 one already (tested above)")
    env = dict(os.environ, NUMBA_CPU_NAME="haswell", NUMBA_CPU_FEATURES=HASWELL,
               NUMBA_CACHE_DIR=str(ROOT / ".pytest_cache" / "numba-haswell-peak"))
    n = 12345
    out = subprocess.run([sys.executable, "-c", _CHILD.format(
        benchmarks=str(ROOT / "benchmarks"), n=n)], env=env, capture_output=True,
        text=True, check=True, timeout=600)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["isa"] == "avx2"
    assert got["int8"] == int8_expected(n, "avx2")
    check_every_multiply_in_code(got["multiplies"], "avx2")


@pytest.mark.parametrize("n", [1, 1000, 1_000_000])
def test_float_spin_does_every_multiply_add_it_counts(n):
    """Chain c starts at c and adds 1 * 1 each iteration: lane 0 of the sum over chains is
    sum(c) + chains * n (exact in float32 at these sizes)."""
    run, per_iteration = multiply_peak._float_spin()
    chains = multiply_peak.FLOAT_CHAINS
    assert per_iteration == chains * multiply_peak.float_lanes()
    assert run(n, 1.0) == chains * (chains - 1) / 2 + chains * n


def test_peak_reports_a_positive_rate():
    assert multiply_peak.peak("float", 1, seconds=0.01, reps=1) > 0


def test_float_spin_keeps_its_multiply_adds_in_the_loop():
    run, _ = multiply_peak._float_spin()
    run(3, 1.0)
    count = run.inspect_asm(run.signatures[0]).count("vfmadd")
    chains = multiply_peak.FLOAT_CHAINS
    assert count >= chains and count % chains == 0, (
        f"{count} fused multiply-adds in the spin's code, not a multiple of its {chains} chains")


def test_gains_set_the_kernel_against_what_the_floors_allow():
    """gains(): a batch's gain in its products, worked out by hand. One row 0.5 ms against a
    0.4 ms memory floor (multiply 0.05); eight rows 1.6 ms, floors 0.4 and 0.4 (multiply):
    the kernel gains 8 x 0.5 / 1.6 = 2.5x, the floors allow 8 x 0.4 / 0.4 = 8x; with sixteen
    rows the multiply floor (0.8) rules: 16 x 0.4 / 0.8 = 8x."""
    def m(ms, memory, multiply):
        return {"ms": ms, "memory_floor_ms": memory, "multiply_floor_ms": multiply}

    g = multiply_peak.gains({1: m(0.5, 0.4, 0.05), 8: m(1.6, 0.4, 0.4), 16: m(2.0, 0.4, 0.8)})
    assert g[1] == {"kernel": 1.0, "ceiling": 1.0}
    assert g[8]["kernel"] == pytest.approx(2.5) and g[8]["ceiling"] == pytest.approx(8.0)
    assert g[16]["kernel"] == pytest.approx(4.0) and g[16]["ceiling"] == pytest.approx(8.0)
    assert multiply_peak.gains({8: m(1.6, 0.4, 0.4)}) == {}  # no one-row baseline


def test_a_batch_frames_ceiling_worked_out_by_hand():
    """batch_products.ceilings(): one sequence's 72 ms frame holds 64 ms of products, its
    weights read in 60 ms at the read bandwidth; a sequence's frame is 4.5 G int8
    multiply-adds and the peak 450 G/s, 10 ms a sequence. Four sequences: their multiply-adds
    (40 ms) fit in the reading, so at best 60 + 8 ms: 4 x 72 / 68 = 4.24x. Eight: the
    multiply floor (80 ms) rules, 8 x 72 / (80 + 8) = 6.55x. Two families add their times:
    1 G float at 100 G/s is 10 ms more a sequence."""
    import batch_products
    c = batch_products.ceilings({1: 72.0, 4: 110.0, 8: 160.0}, {1: 64.0, 4: 92.0, 8: 135.0},
                                60.0, {"int8": 4.5e9}, {"int8": 450e9})
    assert c[1]["ceiling"] == pytest.approx(72 / 68)  # one sequence's products, 4 ms over
    assert c[4]["multiply_floor_ms"] == pytest.approx(40.0) and c[4]["rest_ms"] == 18.0
    assert c[4]["ceiling"] == pytest.approx(4 * 72 / 68)
    assert c[8]["ceiling"] == pytest.approx(8 * 72 / 88)
    both = batch_products.ceilings({1: 72.0, 8: 160.0}, {1: 64.0, 8: 135.0}, 60.0,
                                   {"int8": 4.5e9, "float": 1e9},
                                   {"int8": 450e9, "float": 100e9})
    assert both[8]["multiply_floor_ms"] == pytest.approx(160.0)
    assert both[8]["ceiling"] == pytest.approx(8 * 72 / 168)
    # one sequence's products (55 ms) read faster than the sampled floor (60): they bound it
    fast = batch_products.ceilings({1: 63.0, 4: 100.0}, {1: 55.0, 4: 80.0}, 60.0,
                                   {"int8": 4.5e9}, {"int8": 450e9})
    assert fast[1]["ceiling"] == pytest.approx(1.0)
    assert fast[4]["ceiling"] == pytest.approx(4 * 63 / 63)
