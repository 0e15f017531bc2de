"""Conformance of saved voice prefixes and streaming generation (part of BackendConformance).

A backend gets these for free: restoring a prefix either goes through its `write_kv_cache`
(when it declares `writes_kv_cache`) or through the core's recompute fallback, and streaming
is the core's loop over its eval_cached/fast_decode. What is checked is what users rely on:
a restored prefix gives bit-identical numbers to prefilling the same rows on the same
backend, it can be restored into many syntheses, every refusal leaves the model as it was,
and a stream frees its cache however it ends.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import s2core
from s2core.contract.backend import Backend
from s2core.errors import (CacheNotInitializedError, CacheOverflowError, InvalidInputError,
                           PrefixMismatchError)
from s2core.generation.loop import GenerationConfig, generate, stream
from s2core.runtime.prefix import KVPrefix

from s2core.kit.models import CONFIGS

CONFIG = "gqa4"
#: a text id of the kit's gqa4 model, used as <|im_end|> (its semantic ids are 160..191)
IM_END = 199


def _prompt(n: int = 30, seed: int = 0) -> np.ndarray:
    from s2core.kit.prompts import mixed_prompt
    return mixed_prompt(CONFIGS[CONFIG], n, np.random.default_rng(seed))


def _frame(seed: int) -> np.ndarray:
    from s2core.kit.prompts import semantic_frame
    return semantic_frame(CONFIGS[CONFIG], np.random.default_rng(seed))


def _run_rest(m, rest: np.ndarray, n_steps: int = 3) -> list[np.ndarray]:
    """prefill_fast(rest), then a few steps: every hidden and logits, and the K/V at the end."""
    out = []
    r = m.prefill_fast(rest)
    out += [r.hidden, r.logits]
    for i in range(n_steps):
        r = m.step(_frame(100 + i))
        out += [r.hidden, r.logits]
    return out + list(m.kv_cache_snapshot())


class PrefixAndStreamConformance:
    """Mixed into BackendConformance; uses its `open_model` and `backend` fixtures."""

    prefix_capacity = 48
    prefix_weight_type = "f16"

    def _chunked_reference(self, open_model, prompt: np.ndarray, k: int):
        """The prompt prefilled in two calls split at k (the prefix boundary), then steps."""
        m = open_model(CONFIG, self.prefix_weight_type)
        m.init_kv_cache(self.prefix_capacity)
        m.prefill(prompt[:k])
        prefix = m.save_prefix()
        return m, prefix, _run_rest(m, prompt[k:])

    # ------------------------------------------------------------ the capability
    def test_writes_kv_cache_capability_matches_the_method(self, open_model):
        m = open_model(CONFIG, self.prefix_weight_type)
        implemented = type(m.backend).write_kv_cache is not Backend.write_kv_cache
        declared = m.capabilities.writes_kv_cache
        assert implemented == declared, (
            "rule: Capabilities.writes_kv_cache must be True exactly when the backend "
            f"overrides write_kv_cache (declared {declared}, implemented {implemented})")

    # ------------------------------------------------------------ exactness
    @pytest.mark.parametrize("k", [1, 17, 29])
    def test_restored_prefix_is_bit_identical(self, open_model, k, tmp_path: Path):
        prompt = _prompt()
        _, prefix, expected = self._chunked_reference(open_model, prompt, k)
        assert prefix.n_positions == k and prefix.tokens.shape == (k, prompt.shape[1])
        path = prefix.save(tmp_path / "voice.safetensors")
        for restored in (prefix, KVPrefix.load(path)):
            m = open_model(CONFIG, self.prefix_weight_type)
            m.init_kv_cache(self.prefix_capacity)
            how = m.restore_prefix(restored)
            assert how == ("written" if m.capabilities.writes_kv_cache else "recomputed")
            assert m.n_past == k
            np.testing.assert_array_equal(m.token_rows(), prefix.tokens)
            got = _run_rest(m, prompt[k:])
            for i, (a, b) in enumerate(zip(got, expected)):
                np.testing.assert_array_equal(a, b, err_msg=(
                    f"rule: restore + prefill of the rest must equal prefilling the prompt "
                    f"chunked at the prefix boundary, bit for bit (output {i})"))

    def test_prefix_restores_into_many_syntheses(self, open_model):
        prompt = _prompt(40, seed=1)
        k = 20
        source = open_model(CONFIG, self.prefix_weight_type)
        source.init_kv_cache(self.prefix_capacity)
        source.prefill(prompt[:k])
        prefix = source.save_prefix()
        k_before = prefix.k
        m = open_model(CONFIG, self.prefix_weight_type)
        for rest_len in (5, 12, 20, 5):
            rest = prompt[k:k + rest_len]
            ref = open_model(CONFIG, self.prefix_weight_type)
            ref.init_kv_cache(self.prefix_capacity)
            ref.prefill(prompt[:k])
            expected = _run_rest(ref, rest, 2)
            m.init_kv_cache(self.prefix_capacity)
            m.restore_prefix(prefix)
            got = _run_rest(m, rest, 2)
            for a, b in zip(got, expected):
                np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(prefix.k, k_before)  # restoring never changes the prefix

    def test_generate_with_prefix(self, open_model):
        """stream/generate restore the prefix and prefill only the rest."""
        prompt = _prompt(30, seed=2)
        k = 22
        m = open_model(CONFIG, self.prefix_weight_type)
        m.init_kv_cache(self.prefix_capacity)
        m.prefill(prompt[:k])
        prefix = m.save_prefix()
        m.clear_kv_cache()
        config = GenerationConfig(max_new_tokens=4, im_end_id=IM_END, min_tokens_before_end=4,
                                  temperature=0)
        stats = s2core.generation.GenerationStats()
        codes = generate(m, prompt, config, prefix=prefix, stats=stats)
        assert codes.shape == (m.hparams.num_codebooks, 4)
        assert (stats.restored_positions, stats.prefilled_positions) == (k, len(prompt) - k)
        assert m.max_seq_len is None
        # the same frames as the loop run by hand over the chunked prompt
        m.init_kv_cache(len(prompt) + 4)
        m.prefill(prompt[:k])
        r = m.prefill_fast(prompt[k:])
        hp = m.hparams
        sem = slice(hp.semantic_begin_id, hp.semantic_end_id + 1)
        frames = []
        for _ in range(4):
            main = hp.semantic_begin_id + int(np.argmax(r.logits[sem]))
            codes_ = [main - hp.semantic_begin_id]
            for _ in range(1, hp.num_codebooks):
                codes_.append(int(np.argmax(m.fast_decode(r.hidden, codes_))))
            frames.append(codes_)
            r = m.step([main] + codes_)
        m.clear_kv_cache()
        # greedy with RAS: compare only while no token repeated (RAS resamples at random)
        mains = [f[0] for f in frames]
        n_distinct = next((i for i in range(1, 4) if mains[i] in mains[:i]), 4)
        np.testing.assert_array_equal(codes[:, :n_distinct], np.array(frames).T[:, :n_distinct])
        with pytest.raises(PrefixMismatchError) as info:
            other = prompt.copy()
            other[3, 0] = (other[3, 0] + 1) % hp.semantic_begin_id
            generate(m, other, config, prefix=prefix)
        assert info.value.check == "prefix_tokens"

    # ------------------------------------------------------------ refusals
    def test_prefix_refusals_leave_the_model_unchanged(self, open_model, backend):
        prompt = _prompt()
        m = open_model(CONFIG, self.prefix_weight_type)
        m.init_kv_cache(self.prefix_capacity)
        m.prefill(prompt[:12])
        good = m.save_prefix()
        m.prefill(prompt[12:20])
        k_before, v_before = m.kv_cache_snapshot()
        rows_before = m.token_rows().copy()

        other_file = open_model(CONFIG, "f32")  # same shapes, another file (other types)
        other_file.init_kv_cache(self.prefix_capacity)
        other_file.prefill(prompt[:12])
        other_model = other_file.save_prefix()
        dtype = good.kv_cache_dtype
        other_dtype = "f32" if dtype != "f32" else "f16"
        k16 = good.k.astype(np.float16).astype(np.float32)
        v16 = good.v.astype(np.float16).astype(np.float32)
        other_cache = KVPrefix(k16, v16, good.tokens, other_dtype, good.model, "kit")
        wrong_shape = KVPrefix(good.k[..., :-1], good.v[..., :-1], good.tokens, dtype,
                               good.model, "kit")
        wrong_rows = KVPrefix(good.k, good.v, good.tokens[:, :-1], dtype, good.model, "kit")
        cases = [
            (other_model, PrefixMismatchError, "prefix_model"),
            (other_cache, PrefixMismatchError, "prefix_kv_cache_dtype"),
            (wrong_shape, PrefixMismatchError, "prefix_shape"),
            (wrong_rows, PrefixMismatchError, "prefix_shape"),
            ("not a prefix", PrefixMismatchError, "prefix_type"),
        ]
        for prefix, exc, check in cases:
            with pytest.raises(exc) as info:
                m.restore_prefix(prefix)
            assert info.value.check == check, f"{check}: raised {info.value}"
            assert m.n_past == 20 and m.max_seq_len == self.prefix_capacity
            k2, v2 = m.kv_cache_snapshot()
            np.testing.assert_array_equal(k2, k_before)
            np.testing.assert_array_equal(v2, v_before)
            np.testing.assert_array_equal(m.token_rows(), rows_before)

        small = open_model(CONFIG, self.prefix_weight_type)
        small.init_kv_cache(8)
        small.prefill(prompt[:3])
        with pytest.raises(CacheOverflowError) as info:
            small.restore_prefix(good)
        assert info.value.check == "capacity" and small.n_past == 3
        small.clear_kv_cache()
        with pytest.raises(CacheNotInitializedError):
            small.restore_prefix(good)
        with pytest.raises(InvalidInputError) as info:
            m.save_prefix(21)
        assert info.value.check == "prefix_positions"
        # The model is still usable and gives what it would have given.
        after = m.step(_frame(5))
        clean = open_model(CONFIG, self.prefix_weight_type)
        clean.init_kv_cache(self.prefix_capacity)
        clean.prefill(prompt[:12])
        clean.prefill(prompt[12:20])
        np.testing.assert_array_equal(after.logits, clean.step(_frame(5)).logits)

    # ------------------------------------------------------------ streaming
    def test_stream_equals_generate_and_frees_the_cache(self, open_model):
        prompt = _prompt(24, seed=3)
        m = open_model(CONFIG, self.prefix_weight_type)
        config = GenerationConfig(max_new_tokens=6, im_end_id=IM_END, min_tokens_before_end=6,
                                  temperature=0, seed=0)
        codes = generate(m, prompt, config)
        assert codes.shape == (m.hparams.num_codebooks, 6) and m.max_seq_len is None
        frames = list(stream(m, prompt, config))
        np.testing.assert_array_equal(np.stack(frames, axis=1), codes)
        for frame in stream(m, prompt, config):
            break
        assert m.max_seq_len is None, "rule: breaking out of a stream frees the KV cache"
        with pytest.raises(ZeroDivisionError):
            for i, frame in enumerate(stream(m, prompt, config)):
                _ = 1 / (1 - i)
        assert m.max_seq_len is None, "rule: an exception in a stream's consumer frees the cache"
        np.testing.assert_array_equal(generate(m, prompt, config), codes)

