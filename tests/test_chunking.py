"""The chunking policy of SPEC section 4, driven by capabilities only."""

from __future__ import annotations

import pytest

from s2core.contract.backend import Capabilities
from s2core.runtime.chunking import chunk_bounds, prefill_chunk_size
from s2core.errors import InvalidInputError

CPU = Capabilities(device="cpu")
GPU = Capabilities(device="cuda:0", accelerator=True, n_accelerated_layers=36)
GPU_SINGLE = Capabilities(device="cuda:0", accelerator=True, n_accelerated_layers=36,
                          requires_single_token_semantic_prefill=True)


def test_cpu_never_chunks():
    assert prefill_chunk_size(5000, 4000, CPU) == 5000
    # even when a CPU backend declares the single-token need: rule 1 needs an accelerator
    cpu_single = Capabilities(requires_single_token_semantic_prefill=True)
    assert prefill_chunk_size(500, 400, cpu_single) == 500


@pytest.mark.parametrize("layers,chunk", [(36, 8), (16, 8), (4, 32), (2, 64), (1, 64), (3, 42)])
def test_accelerator_chunk_is_clamped_128_over_layers(layers, chunk):
    caps = Capabilities(accelerator=True, n_accelerated_layers=layers)
    assert prefill_chunk_size(1000, 0, caps) == chunk
    assert prefill_chunk_size(chunk, 0, caps) == chunk       # not longer: one call
    assert prefill_chunk_size(chunk - 1, 0, caps) == chunk - 1


def test_single_token_semantic_prefill_needs_more_than_one_semantic_position():
    assert prefill_chunk_size(300, 2, GPU_SINGLE) == 1
    assert prefill_chunk_size(300, 1, GPU_SINGLE) == 8   # falls through to rule 2
    assert prefill_chunk_size(300, 0, GPU_SINGLE) == 8
    assert prefill_chunk_size(300, 2, GPU) == 8


def test_override_wins_and_is_validated():
    assert prefill_chunk_size(100, 50, GPU_SINGLE, override=16) == 16
    assert prefill_chunk_size(10, 0, CPU, override=16) == 10
    for bad in (0, -3, 2.5, True):
        with pytest.raises(InvalidInputError, match="chunk_size"):
            prefill_chunk_size(10, 0, CPU, override=bad)


def test_bounds_cover_every_position_once_in_order():
    assert chunk_bounds(10, 4) == [(0, 4), (4, 8), (8, 10)]
    assert chunk_bounds(3, 8) == [(0, 3)]
    assert chunk_bounds(5, 1) == [(i, i + 1) for i in range(5)]


def test_probe_capabilities_resolve_all_layers():
    probe_caps = Capabilities(accelerator=True, n_accelerated_layers=None)
    assert probe_caps.resolved(36).n_accelerated_layers == 36
    assert Capabilities(n_accelerated_layers=None).resolved(36).n_accelerated_layers == 0
