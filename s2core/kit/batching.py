"""Conformance of several sequences per call (part of BackendConformance).

A backend that declares `max_batch_sequences` > 1 evaluates KV slots itself (eval_slots,
fast_decode_batch); every other backend gets the core's one-slot fallback on its
single-sequence cache. Either way a sequence's numbers must not depend on its neighbours:
slots of different lengths, prefills and decode rows in the same call, slots that leave and
are reused, all within the chunked-prefill tolerance of each sequence run alone; and the
server's requests give generate()'s codes, cancelled neighbours or not.
"""

from __future__ import annotations

import numpy as np
import pytest

from s2core.backend import Backend
from s2core.batching import BatchedModel
from s2core.errors import CacheAllocationError, CacheNotInitializedError, CacheOverflowError, \
    InvalidInputError, InvalidTokensError
from s2core.memory import backend_kv_cache_bytes
from s2core.generation import GenerationConfig, generate
from s2core.serving import CANCELLED, Server, generate_many
from s2core.testing.prompts import mixed_prompt, semantic_frame

from .models import CONFIGS
from .tolerances import fast_tolerance, kv_tolerance, output_tolerance

CONFIG = "gqa4"
#: a text id of the kit's gqa4 model used as <|im_end|> (its semantic ids are 160..191)
IM_END = 199
#: (prompt length, frames) of the sequences of the slot scenario
SEQUENCES = [(20, 6), (9, 3), (33, 4), (5, 5)]


def _rel(out, ref) -> float:
    out, ref = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    return float(np.linalg.norm(out - ref) / np.linalg.norm(ref))


def _sequences(seed: int = 11):
    hp = CONFIGS[CONFIG]
    rng = np.random.default_rng(seed)
    return [(mixed_prompt(hp, n, rng), [semantic_frame(hp, rng) for _ in range(f)])
            for n, f in SEQUENCES]


def _greedy(max_new_tokens: int, **kw) -> GenerationConfig:
    return GenerationConfig(max_new_tokens=max_new_tokens, im_end_id=IM_END, temperature=0,
                            seed=0, **kw)


class BatchingConformance:
    """Mixed into BackendConformance; uses its `open_model` fixture."""

    batch_weight_type = "q8_0"

    def _slots(self, m, wanted: int) -> int:
        return min(wanted, m.capabilities.max_batch_sequences)

    # ------------------------------------------------------------ contract
    def test_batching_capability_is_backed_by_methods(self, open_model):
        """A backend that declares more than one sequence per call implements the slot
        methods (the defaults only hold the one-slot case)."""
        m = open_model(CONFIG, self.batch_weight_type)
        n = m.capabilities.max_batch_sequences
        assert isinstance(n, int) and n >= 1
        if n > 1:
            cls = type(m.backend)
            for name in ("allocate_kv_slots", "free_kv_slots", "read_kv_slot", "eval_slots",
                         "fast_decode_batch"):
                assert getattr(cls, name) is not getattr(Backend, name), \
                    f"max_batch_sequences={n} but {cls.__name__} does not override {name}"
            if m.capabilities.writes_kv_cache:
                assert cls.write_kv_slot is not Backend.write_kv_slot
        if m.capabilities.shares_kv_prefix:
            cls = type(m.backend)
            for name in ("add_kv_prefix", "attach_kv_prefix"):
                assert getattr(cls, name) is not getattr(Backend, name), \
                    f"shares_kv_prefix but {cls.__name__} does not override {name}"

    # ------------------------------------------------------------ numbers
    def test_slots_equal_sequences_alone(self, open_model):
        """Sequences of different lengths share calls (one's prefill beside the others'
        decode rows), leave, and their slots are reused: each gets the numbers it gets alone."""
        seqs = _sequences()
        alone = open_model(CONFIG, self.batch_weight_type)
        expected = []
        for prompt, frames in seqs:
            alone.init_kv_cache(64)
            rs = [alone.prefill_fast(prompt)] + [alone.step(f) for f in frames]
            expected.append(([(r.hidden.copy(), r.logits.copy()) for r in rs],
                             alone.kv_cache_snapshot()))
        alone.clear_kv_cache()

        m = open_model(CONFIG, self.batch_weight_type)
        b = BatchedModel(m)
        n_slots = self._slots(m, 3)
        b.init_slots(n_slots, 64)
        got = {i: [] for i in range(len(seqs))}
        waiting = list(range(len(seqs)))
        running: dict[int, int] = {}  # slot -> sequence
        done_kv = {}
        calls = 0
        while waiting or running:
            for slot in range(n_slots):  # a free slot takes the next sequence
                if slot not in running and waiting:
                    running[slot] = waiting.pop(0)
                    b.reset_slot(slot)
            pairs = []
            for slot, i in running.items():
                prompt, frames = seqs[i]
                k = len(got[i])
                pairs.append((slot, prompt if k == 0 else frames[k - 1]))
            results = b.eval(pairs)
            calls += 1
            for (slot, _), r in zip(pairs, results):
                i = running[slot]
                got[i].append((r.hidden.copy(), r.logits.copy()))
                assert b.n_past(slot) == len(seqs[i][0]) + len(got[i]) - 1
                if len(got[i]) == len(seqs[i][1]) + 1:  # the sequence leaves
                    done_kv[i] = b.kv_slot_snapshot(slot)
                    del running[slot]
        if n_slots > 1:
            assert calls < sum(f + 1 for _, f in SEQUENCES), "sequences never shared a call"
        tol, kv_tol = output_tolerance(m.capabilities), kv_tolerance(m.capabilities)
        for i, (want, (k_ref, v_ref)) in enumerate(expected):
            assert len(got[i]) == len(want)
            for t, ((h, lg), (h_ref, lg_ref)) in enumerate(zip(got[i], want)):
                assert np.all(np.isfinite(h)) and np.all(np.isfinite(lg))
                for what, out, ref in (("hidden", h, h_ref), ("logits", lg, lg_ref)):
                    err = _rel(out, ref)
                    assert err <= tol, f"sequence {i}, call {t}: {what} differs from the " \
                                       f"sequence alone by {err:.2e} > {tol:.1e}"
            k, v = done_kv[i]
            assert k.shape == k_ref.shape
            assert _rel(k, k_ref) <= kv_tol and _rel(v, v_ref) <= kv_tol, f"sequence {i}: K/V"
        b.close()

    def test_fast_decode_batch_equals_rows_alone(self, open_model):
        m = open_model(CONFIG, self.batch_weight_type)
        hp = m.hparams
        rng = np.random.default_rng(5)
        hiddens = rng.standard_normal((3, hp.dim)).astype(np.float32)
        codes = rng.integers(0, hp.codebook_size, (3, hp.num_codebooks - 1))
        b = BatchedModel(m)
        tol = fast_tolerance(m.capabilities)
        for k in range(hp.num_codebooks):  # extends the previous call (the incremental path)
            got = b.fast_decode(hiddens, codes[:, :k])
            assert got.shape == (3, hp.codebook_size) and got.dtype == np.float32
            for row in range(3):
                ref = m.fast_decode(hiddens[row], codes[row, :k])
                assert _rel(got[row], ref) <= tol, f"row {row}, prefix length {k}"
        # a new call that does not extend the last one starts over
        again = b.fast_decode(hiddens[::-1], codes[::-1, :2])
        assert _rel(again[0], m.fast_decode(hiddens[2], codes[2, :2])) <= tol

    # ------------------------------------------------------------ checks
    def test_slot_bad_input_leaves_slots_unchanged(self, open_model):
        seqs = _sequences()
        m = open_model(CONFIG, self.batch_weight_type)
        b = BatchedModel(m)
        with pytest.raises(CacheNotInitializedError):
            b.eval([(0, seqs[0][0])])
        n_slots = self._slots(m, 2)
        with pytest.raises(InvalidInputError) as info:
            b.init_slots(m.capabilities.max_batch_sequences + 1, 32)
        assert info.value.check == "n_slots_range"
        b.init_slots(n_slots, 32)
        b.eval([(s, seqs[s][0][:6]) for s in range(n_slots)])
        before = [(b.n_past(s), b.kv_slot_snapshot(s)) for s in range(n_slots)]
        hp = m.hparams
        bad_frame = seqs[0][1][0].copy()
        bad_frame[2] = hp.codebook_size
        good = seqs[1][1][0]
        cases = [
            ([], InvalidInputError, "slot_requests"),
            ([(n_slots, good)], InvalidInputError, "slot_range"),
            ([(-1, good)], InvalidInputError, "slot_range"),
            ([("0", good)], InvalidInputError, "slot_type"),
            ([(0, good), (0, good)], InvalidInputError, "slot_duplicate"),
            ([(0, good), (n_slots - 1, bad_frame)] if n_slots > 1 else [(0, bad_frame)],
             InvalidTokensError, "code_range"),
            ([(0, good), (n_slots - 1, np.tile(seqs[2][0], (2, 1)))] if n_slots > 1
             else [(0, np.tile(seqs[2][0], (2, 1)))], CacheOverflowError, "capacity"),
        ]
        for pairs, exc, check in cases:
            with pytest.raises(exc) as info:
                b.eval(pairs)
            assert info.value.check == check, f"{check}: raised {info.value!r}"
            for s, (n, (k, v)) in enumerate(before):
                assert b.n_past(s) == n
                k2, v2 = b.kv_slot_snapshot(s)
                np.testing.assert_array_equal(k2, k)
                np.testing.assert_array_equal(v2, v)
        with pytest.raises(InvalidInputError) as info:
            b.fast_decode(np.zeros((2, hp.dim + 1), np.float32), [[1], [2]])
        assert info.value.check == "hiddens_shape"
        with pytest.raises(InvalidInputError) as info:
            b.fast_decode(np.zeros((2, hp.dim), np.float32), [[1], [hp.codebook_size]])
        assert info.value.check == "prefix_code_range"
        with pytest.raises(InvalidInputError) as info:
            b.fast_decode(np.zeros((2, hp.dim), np.float32), [[1, 2]])
        assert info.value.check == "prefix_shape"
        b.close()
        assert b.max_seq_len is None

    def test_slots_start_with_a_shared_prefix(self, open_model):
        """Slots that start with one voice prefix (restore_prefix) beside a slot without one,
        in the same calls: each gets the numbers of model.restore_prefix + prefill + steps
        alone. On a backend that shares prefixes the slots reference its K/V ("shared") and
        hold only their own positions: a slot of capacity c reaches the prefix's length + c;
        a slot reset and reused without the prefix is a plain slot again."""
        seqs = _sequences(seed=61)
        m = open_model(CONFIG, self.batch_weight_type)
        caps = m.capabilities
        voice = seqs[2][0][:14]
        m.init_kv_cache(32)
        m.prefill(voice)
        prefix = m.save_prefix()
        p = prefix.n_positions
        plans = [(prefix, seqs[0][0][:7], seqs[0][1][:3]), (prefix, seqs[1][0][:4], seqs[1][1][:3]),
                 (None, seqs[3][0], seqs[3][1][:3])]
        expected = []
        for pre, rest, frames in plans:
            m.init_kv_cache(64)
            if pre is not None:
                m.restore_prefix(pre)
            rs = [m.prefill(rest)] + [m.step(f) for f in frames]
            expected.append(([r.logits.copy() for r in rs], m.kv_cache_snapshot()))
        m.clear_kv_cache()
        b = BatchedModel(m)
        n_slots = self._slots(m, 3)
        # capacity: the longest plan's own positions (a copied prefix is held by the slot)
        own = max(len(rest) + len(frames) for _, rest, frames in plans)
        b.init_slots(n_slots, own + (0 if caps.shares_kv_prefix else p))
        tol, kv_tol = output_tolerance(caps), kv_tolerance(caps)
        for first in range(0, len(plans), n_slots):
            group = plans[first:first + n_slots]
            idx = list(range(first, first + len(group)))
            for slot, (pre, _, _) in enumerate(group):
                b.reset_slot(slot)
                if pre is not None:
                    how = b.restore_prefix(slot, pre)
                    want = "shared" if caps.shares_kv_prefix else (
                        "written" if caps.writes_kv_cache else "recomputed")
                    assert how == want, f"restore_prefix gave {how!r}, capabilities say {want!r}"
                    assert b.n_past(slot) == p
                    assert b.shared_positions(slot) == (p if how == "shared" else 0)
            got = {i: [] for i in idx}
            for t in range(4):
                pairs = [(slot, rest if t == 0 else frames[t - 1])
                         for slot, (_, rest, frames) in enumerate(group)]
                for (slot, _), r in zip(pairs, b.eval(pairs)):
                    got[idx[slot]].append(r.logits.copy())
            for slot, i in enumerate(idx):
                want_logits, (k_ref, v_ref) = expected[i]
                for t, (lg, ref) in enumerate(zip(got[i], want_logits)):
                    err = _rel(lg, ref)
                    assert err <= tol, f"plan {i}, call {t}: logits differ from the " \
                                       f"sequence alone by {err:.2e} > {tol:.1e}"
                k, v = b.kv_slot_snapshot(slot)
                assert k.shape == k_ref.shape, f"plan {i}: K/V {k.shape}, alone {k_ref.shape}"
                assert _rel(k, k_ref) <= kv_tol and _rel(v, v_ref) <= kv_tol, f"plan {i}: K/V"
        # the first slot, reset, is a plain slot again (no prefix, full capacity from 0)
        b.reset_slot(0)
        assert b.shared_positions(0) == 0
        prompt, frames = plans[2][1], plans[2][2]
        rs = [b.eval([(0, prompt)])[0]] + [b.eval([(0, f)])[0] for f in frames]
        for t, (r, ref) in enumerate(zip(rs, expected[2][0])):
            assert _rel(r.logits, ref) <= tol, f"reused slot, call {t}"
        b.close()

    def test_slots_beyond_the_memory_limit_are_refused(self, open_model):
        """init_slots is held to the limit init_kv_cache uses (kv_cache_limit_bytes), counted
        for every slot: a request beyond it raises CacheAllocationError naming the sizes and
        keeps the previous slots, their n_past and K/V, which go on as before."""
        seqs = _sequences(seed=51)
        m = open_model("huge-context", "f32")
        b = BatchedModel(m)
        n_slots = self._slots(m, 2)
        b.init_slots(n_slots, 16)
        b.eval([(s, seqs[s][0][:5]) for s in range(n_slots)])
        before = [(b.n_past(s), b.kv_slot_snapshot(s)) for s in range(n_slots)]
        hp, caps = m.hparams, m.capabilities
        limit = m.backend.kv_cache_limit_bytes()
        per_position = backend_kv_cache_bytes(hp, 1, caps)
        requests = [(n_slots, hp.context_length)]
        if limit is not None and n_slots > 1:
            # each slot alone fits, all of them do not: the limit counts every slot
            length = (limit // per_position) * 6 // (10 * n_slots) * 2
            if 0 < length <= hp.context_length:
                requests.append((n_slots, length))
        for want_slots, length in requests:
            try:
                b.init_slots(want_slots, length)
            except CacheAllocationError as exc:
                text = str(exc)
                need = want_slots * backend_kv_cache_bytes(hp, length, caps)
                assert f"init_slots({want_slots}, {length})" in text and "kept" in text, text
                assert need > (limit or 0) or "failed" in text, text
            else:
                pytest.fail(f"init_slots({want_slots}, {length}) allocated "
                            f"{want_slots * backend_kv_cache_bytes(hp, length, caps)} bytes "
                            f"beyond kv_cache_limit_bytes()={limit}")
            assert (b.n_slots, b.max_seq_len) == (n_slots, 16)
            for s, (n, (k, v)) in enumerate(before):
                assert b.n_past(s) == n
                k2, v2 = b.kv_slot_snapshot(s)
                np.testing.assert_array_equal(k2, k)
                np.testing.assert_array_equal(v2, v)
        # the kept slots go on as a fresh set of slots given the same rows
        after = b.eval([(s, seqs[s][1][0]) for s in range(n_slots)])
        fresh = BatchedModel(open_model("huge-context", "f32"))
        fresh.init_slots(n_slots, 16)
        fresh.eval([(s, seqs[s][0][:5]) for s in range(n_slots)])
        again = fresh.eval([(s, seqs[s][1][0]) for s in range(n_slots)])
        for s, (r, ref) in enumerate(zip(after, again)):
            np.testing.assert_array_equal(r.logits, ref.logits, err_msg=f"slot {s}")
        fresh.close()
        b.close()

    # ------------------------------------------------------------ serving
    def test_generate_many_equals_generate(self, open_model):
        """Requests of different lengths join as slots free up (max_sequences 2), each with
        its own seed; under greedy sampling every request's codes are generate()'s. On a
        backend without batching the same call runs them one after another."""
        seqs = _sequences(seed=21)
        m = open_model(CONFIG, self.batch_weight_type)
        configs = [_greedy(3 + 2 * i, min_tokens_before_end=3 + 2 * i) for i in range(len(seqs))]
        prompts = [p for p, _ in seqs]
        alone = [generate(m, p, c) for p, c in zip(prompts, configs)]
        assert [a.shape[1] for a in alone] == [c.max_new_tokens for c in configs]
        for n in sorted({1, self._slots(m, 2)}):
            many = generate_many(m, prompts, configs, max_sequences=n)
            for i, (a, g) in enumerate(zip(alone, many)):
                np.testing.assert_array_equal(g, a, err_msg=f"request {i}, {n} at a time")
        sampled = [GenerationConfig(max_new_tokens=4, im_end_id=IM_END, seed=s,
                                    min_tokens_before_end=4) for s in range(len(seqs))]
        # sampled: each request's own generator; the same seed gives the same codes again
        first = generate_many(m, prompts, sampled)
        second = generate_many(m, prompts[::-1], sampled[::-1])[::-1]
        for a, g in zip(first, second):
            np.testing.assert_array_equal(g, a)

    def test_cancel_leaves_the_others_unchanged(self, open_model):
        seqs = _sequences(seed=31)
        m = open_model(CONFIG, self.batch_weight_type)
        prompts = [p for p, _ in seqs[:3]]
        config = _greedy(6, min_tokens_before_end=6)
        alone = [generate(m, p, config) for p in prompts]
        with Server(m, max_sequences=self._slots(m, 3)) as server:
            reqs = [server.submit(p, config) for p in prompts]
            seen = []
            for frame in reqs[1]:
                seen.append(frame)
                if len(seen) == 2:
                    reqs[1].cancel()
            server.run()
            assert reqs[1].done and reqs[1].stats.stopped_by == CANCELLED
            np.testing.assert_array_equal(reqs[1].codes(), alone[1][:, :2])
            for i in (0, 2):
                np.testing.assert_array_equal(reqs[i].codes(), alone[i], err_msg=f"request {i}")
        # on_frame returning False stops that request alone
        stop_at = {0: 3}
        many = generate_many(m, prompts, config,
                             on_frame=lambda r, j, f: not (j + 1 == stop_at.get(r)))
        np.testing.assert_array_equal(many[0], alone[0][:, :3])
        for i in (1, 2):
            np.testing.assert_array_equal(many[i], alone[i])

    def test_requests_share_a_voice_prefix(self, open_model):
        """Requests starting with the same KVPrefix give generate(prefix=...)'s codes."""
        seqs = _sequences(seed=41)
        m = open_model(CONFIG, self.batch_weight_type)
        voice = seqs[2][0][:12]
        prompts = [np.vstack([voice, p[:8]]) for p, _ in seqs[:3]]
        m.init_kv_cache(32)
        m.prefill(voice)
        prefix = m.save_prefix()
        m.clear_kv_cache()
        config = _greedy(4, min_tokens_before_end=4)
        alone = [generate(m, p, config, prefix=prefix) for p in prompts]
        with Server(m) as server:
            reqs = [server.submit(p, config, prefix=prefix) for p in prompts]
            server.run()
            for i, r in enumerate(reqs):
                np.testing.assert_array_equal(r.codes(), alone[i], err_msg=f"request {i}")
                assert r.stats.restored_positions == len(voice)
                assert r.stats.prefix_shared == m.capabilities.shares_kv_prefix
                assert r.stats.prefilled_positions == 8
