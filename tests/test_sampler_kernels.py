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
_LOGITS = hnp.arrays(
    np.float32, st.integers(1, 300),
    elements=st.one_of(st.floats(-2.0 ** 100, 2.0 ** 100, width=32), st.sampled_from(
        [0.0, -0.0, 1.0, -1.0, 1e-45, -1e-45, 3.4e38, -3.4e38, float("-inf")])))


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
