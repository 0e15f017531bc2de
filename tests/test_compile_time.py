"""The timing table's "numba compiling" row: compile_time counts numba's compiling inside its
block, and nothing for a kernel already compiled."""

from __future__ import annotations

import pytest

from s2core.cli.compile_time import compile_time

numba = pytest.importorskip("numba", reason="numba (the `fast` extra) is not installed")


def test_compile_time_counts_a_first_compile_and_not_a_compiled_kernel():
    @numba.njit  # a new function: nothing in any cache
    def twice(x):
        return 2 * x

    with compile_time() as first:
        assert twice(21) == 42
    with compile_time() as again:
        assert twice(4) == 8
    assert first.seconds > 0.0
    assert again.seconds == 0.0


def test_compile_time_reports_what_was_spent_when_the_block_fails():
    @numba.njit
    def plus_one(x):
        return x + 1

    with pytest.raises(RuntimeError):
        with compile_time() as spent:
            plus_one(1)
            raise RuntimeError("the command failed after compiling")
    assert spent.seconds > 0.0
