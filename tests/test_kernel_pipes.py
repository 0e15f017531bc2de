"""benchmarks/kernel_pipes.py's instrument: the machine code it reads must be the kernel's
(its dot instructions are the tile-block's multiply-adds), and llvm-mca's model, where it
runs, cannot run that code faster than its dot instructions alone allow."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

pytest.importorskip("numba")

from s2core_numpy import simd  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import kernel_pipes  # noqa: E402

pytestmark = pytest.mark.skipif(
    simd.isa() not in kernel_pipes.DOT,
    reason="this CPU has neither AVX2 nor AVX-512 VNNI: no integer kernels")

#: a model llvm-mca carries for each build's instructions (Zen 3 has no AVX-512)
_MCPU = {"avx2": "znver3", "vnni": "icelake-server"}


@pytest.fixture(scope="module")
def block_body():
    return kernel_pipes.function_body(kernel_pipes.compiled_asm(simd.q4_k_blocks))


def test_the_code_read_is_the_kernels(block_body):
    dot, macs = kernel_pipes.DOT[simd.isa()]
    counted = kernel_pipes.counts(block_body, dot)
    assert counted["dots"] == simd.BLOCK * kernel_pipes.TILE_BLOCK_MACS // macs
    assert block_body[-1].startswith("ret")
    assert counted["instructions"] > counted["dots"]


@pytest.mark.skipif(shutil.which("llvm-mca") is None,
                    reason="llvm-mca is not installed (apt-get install llvm)")
def test_the_model_is_no_faster_than_the_dots_alone(block_body):
    dot, macs = kernel_pipes.DOT[simd.isa()]
    model = kernel_pipes.pipe_model(block_body, _MCPU[simd.isa()], dot)
    assert isinstance(model, dict), model
    dots = simd.BLOCK * kernel_pipes.TILE_BLOCK_MACS // macs
    assert model["dot_rthroughput"] > 0
    assert model["cycles"] >= model["busiest_pipe_cycles"] >= dots * model["dot_rthroughput"]


def test_an_unknown_cpu_is_named(block_body):
    if shutil.which("llvm-mca") is None:
        assert "not installed" in kernel_pipes.pipe_model(block_body, "znver3", "x")
    else:
        why = kernel_pipes.pipe_model(block_body, "no-such-cpu", "vpdpbusd")
        assert isinstance(why, str) and "no-such-cpu" in why
