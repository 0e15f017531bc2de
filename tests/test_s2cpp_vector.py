"""Reproduce the outputs s2.cpp itself produced for the shared tiny model, on every backend.

Bound from the issue: max|out - ref| / max|ref| below 5e-4 with the default F16 cache.
"""

from __future__ import annotations

import json

import pytest

import s2core
from conftest import S2CPP_VECTOR
from s2cpp_replay import replay, worst

BOUND = 5e-4


@pytest.mark.parametrize("name", ["s1_prefill_steps", "s5_fast_decode"])
@pytest.mark.parametrize("prefill", ["prefill_fast", "prefill_chunked"])
def test_reproduces_s2cpp(backend, name, prefill):
    """The chunked prefill against the one-call goldens: chunks joined through the cache give
    the same numbers (SPEC 4), up to the F16 cache's rounding of the earlier chunks."""
    m = s2core.load(S2CPP_VECTOR / "tiny_f32.gguf", backend=backend)
    errors = replay(m, S2CPP_VECTOR / name, prefill)
    which, error = worst(errors)
    assert error < BOUND, f"worst: {which} = {error:.2e}"
    assert len(errors) >= 18


def test_hparams_match_what_s2cpp_parsed():
    facts = json.loads((S2CPP_VECTOR / "s2cpp_facts.json").read_text())
    hp = s2core.ModelFile(S2CPP_VECTOR / "tiny_f32.gguf").hparams
    f = facts["hparams"]
    assert hp.head_dim == facts["head_dim_eval_cached"] == facts["head_dim_init_kv_cache"]
    assert (hp.context_length, hp.vocab_size, hp.dim, hp.ffn, hp.n_layer, hp.n_head,
            hp.n_head_kv) == (f["context_length"], f["vocab_size"], f["embedding_length"],
                              f["feed_forward_length"], f["block_count"], f["head_count"],
                              f["head_count_kv"])
    assert (hp.codebook_size, hp.num_codebooks, hp.semantic_begin_id, hp.semantic_end_id) == (
        f["codebook_size"], f["num_codebooks"], f["semantic_begin_id"], f["semantic_end_id"])
    assert hp.rope_freq_base == f["rope_freq_base"]
    assert hp.rms_norm_eps == pytest.approx(f["rms_norm_eps"])
    assert (hp.attention_qk_norm, hp.scale_codebook_embeddings, hp.tie_word_embeddings) == (
        bool(f["attention_qk_norm"]), bool(f["scale_codebook_embeddings"]),
        bool(f["tie_word_embeddings"]))
    fast = hp.fast
    assert (fast.context_length, fast.dim, fast.ffn, fast.n_layer, fast.n_head, fast.n_head_kv,
            fast.head_dim, fast.attention_qk_norm, fast.project_in) == (
        f["fast_context_length"], f["fast_embedding_length"], f["fast_feed_forward_length"],
        f["fast_block_count"], f["fast_head_count"], f["fast_head_count_kv"], f["fast_head_dim"],
        bool(f["fast_attention_qk_norm"]), bool(f["fast_has_project_in"]))
