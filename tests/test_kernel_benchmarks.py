"""The instruments of the kernel benchmarks that serve a model with other kernels
(benchmarks/kernel_rows.py's multiplying_with, kernels_ab.py's simd_of): they must really
multiply with the kernels they are given. step_prefetch_alone.py once switched a module name
that the compiled product no longer read, and three of its runs compared a kernel with
itself."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

pytest.importorskip("numba")

from s2core.embedded.kquants import quantize_k  # noqa: E402

from s2core_numpy import int_dots, simd  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import kernel_rows  # noqa: E402
import kernels_ab  # noqa: E402

needs_integer_kernels = pytest.mark.skipif(
    not simd.isa(), reason="this CPU has neither AVX2 nor AVX-512 VNNI: no integer kernels")


def q4_k_matrix() -> int_dots.IntDotMatrix:
    w = np.random.default_rng(0).standard_normal((40, 512)).astype(np.float32)
    return int_dots.IntDotMatrix.from_raw(quantize_k(w, QT.Q4_K).view(np.uint8).reshape(40, -1),
                                          QT.Q4_K)


@needs_integer_kernels
def test_a_matrix_multiplies_with_the_kernels_it_is_given(monkeypatch):
    m = q4_k_matrix()
    x = np.random.default_rng(1).standard_normal((3, 512)).astype(np.float32)
    want = m(x)
    used = []

    def counting(*args):
        used.append(args[0])
        simd.products(*args)

    monkeypatch.setattr(int_dots.IntDotMatrix, "__call__", kernel_rows.multiplying_with(counting))
    assert np.array_equal(m(x), want)
    assert used == [int(QT.Q4_K)]

    def wrong(kind, codes, xq, xd, xs, out, lone_block):
        out[:] = 0

    monkeypatch.setattr(int_dots.IntDotMatrix, "__call__", kernel_rows.multiplying_with(wrong))
    assert not m(x).any()


def _in_a_git_checkout() -> bool:
    return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"],
                          capture_output=True).returncode == 0


@needs_integer_kernels
@pytest.mark.skipif(not _in_a_git_checkout(), reason="not a git checkout: no revision to load")
def test_a_revisions_kernels_load_beside_this_trees():
    """HEAD's simd.py compiled as a module of its own: its products give this tree's numbers
    wherever HEAD's kernels are the working tree's (CI's clean checkout)."""
    other = kernels_ab.simd_of("HEAD")
    assert other is not simd and other.products is not simd.products
    m = q4_k_matrix()
    x = np.random.default_rng(2).standard_normal((5, 512)).astype(np.float32)
    theirs = kernel_rows.multiplying_with(other.products)(m, x)
    assert np.array_equal(theirs, m(x))
