"""The sampler's compiled passes (s2core/generation/sampler_kernels.py) give NumPy's numbers:
the radix sort NumPy's descending sort, the loop np.cumsum's float32 sum, and candidates()
the same ids and logits either way."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from hypothesis.extra import numpy as hnp

from s2core.generation import sampler_kernels, sampling

pytestmark = [
    pytest.mark.skipif(not sampler_kernels.COMPILED,
                       reason="numba is not installed: the sampler runs NumPy's passes"),
    # logits 3.4e38 apart: their difference overflows to -inf, whose term is 0 (as in s2.cpp)
    pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")]

#: float32 logits as a sampler meets them (finite, -inf for masked ids), with ties, signed
#: zeros, subnormals and both ends of the range
_LOGIT = st.one_of(st.floats(-2.0 ** 100, 2.0 ** 100, width=32), st.sampled_from(
    [0.0, -0.0, 1.0, -1.0, 1e-45, -1e-45, 3.4e38, -3.4e38, float("-inf")]))
_LOGITS = hnp.arrays(np.float32, st.integers(1, 300), elements=_LOGIT)


def _numpy_candidates(logits, top_p, top_k):
    """candidates() with NumPy's passes."""
    with pytest.MonkeyPatch.context() as m:
        m.setattr(sampling, "descending", sampler_kernels.descending_numpy)
        m.setattr(sampling, "sequential_sum", sampler_kernels.sequential_sum_numpy)
        return sampling.candidates(logits, top_p, top_k)


@settings(max_examples=300, deadline=None)
@given(_LOGITS)
def test_the_radix_sort_orders_the_values_as_numpy_does(values):
    got = sampler_kernels.descending(values)
    want = -np.sort(-values[values != -np.inf])  # a masked id's -inf is left out
    assert got.dtype == np.float32 and np.array_equal(got, want)
    assert np.array_equal(sampler_kernels.descending_numpy(values), want)
    assert not np.signbit(got[got == 0]).any()  # -0.0 sorts (and comes out) as +0.0


def test_the_radix_sort_on_a_vocabulary_and_on_one_shared_digit():
    rng = np.random.default_rng(0)
    for values in (rng.standard_normal(4097).astype(np.float32) * 3,
                   np.float32(1.0) + np.arange(64, dtype=np.float32) * np.float32(2 ** -23),
                   np.full(9, 2.5, np.float32), -np.arange(5000, dtype=np.float32)):
        assert np.array_equal(sampler_kernels.descending(values), -np.sort(-values))


@settings(max_examples=200, deadline=None)
@given(hnp.arrays(np.float32, st.integers(1, 5000), elements=st.floats(0, 1, width=32)))
def test_the_sum_is_numpys_float32_sum_in_order(x):
    got = sampler_kernels.sequential_sum(x)
    assert np.float32(got).tobytes() == np.cumsum(x, dtype=np.float32)[-1].tobytes()


def test_the_sum_is_sequential_not_pairwise():
    x = np.array([1.0] + [2 ** -24] * 1000, np.float32)  # each term alone rounds away
    assert sampler_kernels.sequential_sum(x) == np.float32(1.0)


@settings(max_examples=200, deadline=None)
@given(_LOGITS, st.floats(0, 1), st.integers(-1, 40))
def test_candidates_are_the_same_compiled_or_not(logits, top_p, top_k):
    if not np.isfinite(logits).any():
        logits = np.append(logits, np.float32(0.5))
    want = _numpy_candidates(logits, top_p, top_k)
    got = sampling.candidates(logits, top_p, top_k)
    assert np.array_equal(got.ids, want.ids)
    assert np.array_equal(got.logits, want.logits)
    for t in (0.0, 0.7, 1.3):
        assert np.array_equal(got.probabilities(t), want.probabilities(t))


@st.composite
def _logit_rows(draw):
    """A block of logit rows of one width, each with a finite value, and each row's top_p and
    top_k."""
    n, width = draw(st.integers(1, 6)), draw(st.integers(1, 200))
    rows = draw(hnp.arrays(np.float32, (n, width), elements=_LOGIT))
    for row in rows:
        if not np.isfinite(row).any():
            row[draw(st.integers(0, width - 1))] = np.float32(0.5)
    top_p = draw(st.lists(st.floats(-0.5, 1.5), min_size=n, max_size=n))
    top_k = draw(st.lists(st.integers(-1, 40), min_size=n, max_size=n))
    return rows, top_p, top_k


@settings(max_examples=300, deadline=None)
@given(_logit_rows())
def test_the_rows_candidates_are_each_rows_own(block):
    """candidates_rows (every row's passes in one call) gives what candidates() gives each
    row alone, ids and logits bit for bit: ties, signed zeros, -inf, both ends of the range,
    and settings that differ between rows."""
    rows, top_p, top_k = block
    got = sampling.candidates_rows(rows, top_p, top_k)
    assert len(got) == len(rows)
    for row, p, k, c in zip(rows, top_p, top_k, got):
        want = sampling.candidates(row, p, k)
        assert np.array_equal(c.ids, want.ids), (c.ids, want.ids)
        assert np.array_equal(c.logits, want.logits)
        assert c.ids.dtype == want.ids.dtype == np.int64


def test_a_vocabulary_of_rows_is_each_rows_own():
    """The server's case: eight rows of 4096 logits as a random-weight model gives them
    (flat) and as a trained one does (peaked), s2.cpp's settings."""
    rng = np.random.default_rng(3)
    for scale in (3.0, 12.0):
        rows = (rng.standard_normal((8, 4096)) * scale).astype(np.float32)
        got = sampling.candidates_rows(rows, [0.8] * 8, [30] * 8)
        for row, c in zip(rows, got):
            want = sampling.candidates(row, 0.8, 30)
            assert np.array_equal(c.ids, want.ids) and np.array_equal(c.logits, want.logits)
