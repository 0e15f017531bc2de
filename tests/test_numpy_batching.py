"""The NumPy backend's batching: few-row products whose rows equal one-row products bit for
bit (so a batched sequence gets the numbers it gets alone), and slot evaluation against the
single-sequence path."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

import s2core
from s2core.serving.batching import BatchedModel
from s2core.kit.batching_rules import voice_prefix
from s2core.kit.models import CONFIGS, kit_model
from s2core.kit.prompts import mixed_prompt, semantic_frame
from s2core_numpy import plugin
from s2core_numpy.plugin import MAX_BATCH_SEQUENCES

numba_only = pytest.mark.skipif(not plugin.numba_available(), reason="numba not installed")


def _matrices(n_out: int, n_in: int):
    from s2core_numpy.f16 import F16Matrix
    from s2core_numpy.f32_rows import F32Matrix
    from s2core_numpy.q8_0 import Q8Matrix
    rng = np.random.default_rng(1)
    w = rng.standard_normal((n_out, n_in), dtype=np.float32)
    w16 = (w * 0.05).astype(np.float16)
    w16.flat[:3] = [0.0, -0.0, 6e-8]  # zeros and a float16 subnormal
    return {"f32": F32Matrix(w), "f16": F16Matrix.from_raw(w16),
            "q8_0": Q8Matrix.from_raw(gguf.quants.quantize(w, QT.Q8_0))}


@numba_only
@pytest.mark.parametrize("n_rows", [2, 3, 4, 5, 6, 8, 13, MAX_BATCH_SEQUENCES])
@pytest.mark.parametrize("n_out,n_in", [(100, 96), (200, 320)])
def test_few_row_products_equal_one_row_products_bit_for_bit(n_out, n_in, n_rows):
    """Every batch size a step evaluates stays on the few-row kernels (below gemm_rows), which
    give each row exactly its one-row product."""
    x = np.random.default_rng(n_rows).standard_normal((n_rows, n_in), dtype=np.float32)
    from s2core_numpy.tiled import GEMM_ROWS
    for name, m in _matrices(n_out, n_in).items():
        assert n_rows < getattr(m, "gemm_rows", GEMM_ROWS), name
        out = m(x)
        assert out.shape == (n_rows, n_out)
        rows = np.stack([m(x[r:r + 1])[0] for r in range(n_rows)])
        np.testing.assert_array_equal(out, rows, err_msg=name)
        ref = x.astype(np.float64) @ m.dequantize().astype(np.float64).T
        assert np.abs(out - ref).max() <= 1e-4 * np.abs(ref).max(), name


@numba_only
@pytest.mark.parametrize("n_rows", [1, 2, 3, 5, MAX_BATCH_SEQUENCES])
def test_f32_few_rows_with_a_tail_and_an_odd_output_count(n_rows):
    """F32 in place (f32_rows.py): inputs past the last whole 16 (100 = 6 x 16 + 4) and an
    odd number of outputs (computed in pairs) still give each row its one-row product bit
    for bit, within float32 rounding of float64."""
    from s2core_numpy.f32_rows import F32Matrix
    rng = np.random.default_rng(n_rows)
    w = rng.standard_normal((37, 100), dtype=np.float32)
    x = rng.standard_normal((n_rows, 100), dtype=np.float32)
    m = F32Matrix(w)
    out = m(x)
    assert out.shape == (n_rows, 37)
    np.testing.assert_array_equal(out, np.stack([m(x[r:r + 1])[0] for r in range(n_rows)]))
    ref = x.astype(np.float64) @ w.astype(np.float64).T
    assert np.abs(out - ref).max() <= 1e-5 * np.abs(ref).max()


@numba_only
@pytest.mark.parametrize("weight_type", ["f32", "f16", "q8_0"])
def test_batched_decode_is_bit_identical_to_each_sequence_alone(weight_type):
    """With the numba kernels a decode step of several slots and the batched Fast-AR give
    exactly the single-sequence numbers (not only within the kit's tolerance)."""
    hp = CONFIGS["gqa4"]
    rng = np.random.default_rng(2)
    prompts = [mixed_prompt(hp, n, rng) for n in (17, 6, 25)]
    frames = [semantic_frame(hp, rng) for _ in prompts]
    m = s2core.load(kit_model("gqa4", weight_type), backend="numpy")
    alone = []
    for p, f in zip(prompts, frames):
        m.init_kv_cache(40)
        m.prefill_fast(p)
        r = m.step(f)
        alone.append((r.hidden, r.logits, [m.fast_decode(r.hidden, [3, 1][:k]) for k in range(3)]))
    b = BatchedModel(m)
    b.init_slots(3, 40)
    for s, p in enumerate(prompts):
        b.eval([(s, p)])
    rs = b.eval([(s, f) for s, f in enumerate(frames)])
    hiddens = np.stack([r.hidden for r in rs])
    for k in range(3):
        fast = b.fast_decode(hiddens, np.tile([3, 1][:k], (3, 1)).astype(np.int64))
        for s in range(3):
            np.testing.assert_array_equal(fast[s], alone[s][2][k])
    for s, r in enumerate(rs):
        np.testing.assert_array_equal(r.hidden, alone[s][0])
        np.testing.assert_array_equal(r.logits, alone[s][1])
    m.close()


def test_numpy_declares_batching():
    caps = plugin.numpy_capabilities()
    assert caps.max_batch_sequences == plugin.MAX_BATCH_SEQUENCES > 1


@pytest.mark.parametrize("cache", ["f16", "f32"])
def test_slots_in_one_voice_hold_its_prefix_once(cache):
    """Memory measured (tracemalloc sees NumPy's allocations): four slots that start with one
    voice hold its K/V once, in the cache's type, and only their own positions; a server
    sizes its slots so."""
    import tracemalloc

    from s2core.generation.loop import GenerationConfig
    from s2core.runtime.memory import kv_cache_bytes
    from s2core.serving import Server

    hp = CONFIGS["gqa4"]
    m = s2core.load(kit_model("gqa4", "f16"), backend="numpy", kv_cache_dtype=cache)
    rng = np.random.default_rng(3)
    voice = mixed_prompt(hp, 200, rng)
    prefix = voice_prefix(m, voice)
    one_prefix = kv_cache_bytes(hp, len(voice), cache)
    own = 10
    b = BatchedModel(m)
    b.init_slots(4, own)
    slot_bytes = kv_cache_bytes(hp, own, cache) * 4
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        assert [b.restore_prefix(s, prefix) for s in range(4)] == ["shared"] * 4
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    # the prefix's K/V once, plus the voice's token rows (int64, kept by the core) and small
    # change; copied into each slot the K/V would be four times
    rows = len(voice) * hp.row_width * 8
    assert one_prefix <= held < one_prefix + rows + 4096, (held, one_prefix, rows)
    assert m.backend._slots.k.nbytes + m.backend._slots.v.nbytes == slot_bytes
    assert [b.n_past(s) for s in range(4)] == [len(voice)] * 4
    b.eval([(s, mixed_prompt(hp, own, rng)) for s in range(4)])  # all own positions used
    b.close()

    prompts = [np.vstack([voice, mixed_prompt(hp, 6, rng)]) for _ in range(4)]
    config = GenerationConfig(max_new_tokens=4, im_end_id=199, temperature=0, seed=0,
                              min_tokens_before_end=4)
    with Server(m, max_sequences=4) as server:
        reqs = [server.submit(p, config, prefix=prefix) for p in prompts]
        server.step()
        assert server.batched.max_seq_len == 6 + 4  # the positions after the voice
        assert len(m.backend._slots.prefixes) == 1 and m.backend._slots.attached == [0] * 4
        server.run()
        assert all(r.stats.prefix_shared and r.codes().shape[1] == 4 for r in reqs)
