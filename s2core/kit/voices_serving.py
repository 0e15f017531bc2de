"""Conformance of voice prefixes in slots and of the server (part of BackendConformance,
through BatchingConformance): slots that start with a shared voice prefix, the prefix left
unchanged by them, and the server's requests against generate(); releasing a voice is
s2core/kit/voice_release.py's.

Each test checks one rule of s2core/kit/batching_rules.py and fails naming it.
"""

from __future__ import annotations

import numpy as np

from s2core.serving.batching import BatchedModel
from s2core.generation.loop import GenerationConfig, generate
from s2core.serving import CANCELLED, Server, generate_many

from s2core.kit.batching_rules import (CONFIG, IM_END, PREFIX_UNCHANGED, SERVED, SHARED_PREFIX,
                             checked_call, describe_call, fail, greedy, kv_differs,
                             n_slots_for, rel_err, same_codes, sequences, voice_prefix)
from s2core.kit.tolerances import kv_tolerance, output_tolerance
from s2core.kit.voice_release import VoiceReleaseConformance


class VoiceAndServingConformance(VoiceReleaseConformance):
    """Mixed into BackendConformance (through BatchingConformance); uses its `open_model`
    fixture and `batch_weight_type`."""

    # ------------------------------------------------------------ voice prefixes
    def _voice(self, m, rows: np.ndarray):
        m.init_kv_cache(32)
        m.prefill(rows)
        prefix = m.save_prefix()
        m.clear_kv_cache()
        return prefix

    def test_slots_start_with_a_shared_prefix(self, open_model):
        """Slots that start with one voice prefix (restore_prefix) beside a slot without one,
        in the same calls: each gets the numbers of model.restore_prefix + prefill + steps
        alone. On a backend that shares prefixes the slots reference its K/V ("shared") and
        hold only their own positions: a slot of capacity c reaches the prefix's length + c."""
        seqs = sequences(seed=61)
        m = open_model(CONFIG, self.batch_weight_type)
        caps = m.capabilities
        prefix = voice_prefix(m, seqs[2][0][:14])
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
        n_slots = n_slots_for(m, 3)
        # capacity: the longest plan's own positions (a copied prefix is held by the slot)
        own = max(len(rest) + len(frames) for _, rest, frames in plans)
        b.init_slots(n_slots, own + (0 if caps.shares_kv_prefix else p))
        tol, kv_tol = output_tolerance(caps), kv_tolerance(caps)
        want = "shared" if caps.shares_kv_prefix else (
            "written" if caps.writes_kv_cache else "recomputed")
        for first in range(0, len(plans), n_slots):
            group = plans[first:first + n_slots]
            idx = list(range(first, first + len(group)))
            for slot, (pre, _, _) in enumerate(group):
                b.reset_slot(slot)
                if pre is not None:
                    how = checked_call(SHARED_PREFIX, f"restore_prefix({slot}, a prefix of {p} "
                                f"positions)", lambda: b.restore_prefix(slot, pre))
                    if how != want:
                        fail(SHARED_PREFIX, f"restore_prefix gave {how!r}, the capabilities "
                             f"(shares_kv_prefix={caps.shares_kv_prefix}, writes_kv_cache="
                             f"{caps.writes_kv_cache}) say {want!r}")
                    if (b.n_past(slot), b.shared_positions(slot)) != (
                            p, p if how == "shared" else 0):
                        fail(SHARED_PREFIX, f"slot {slot} after a {how} prefix of {p} "
                             f"positions: n_past {b.n_past(slot)}, shared positions "
                             f"{b.shared_positions(slot)}")
            got = {i: [] for i in idx}
            for t in range(4):
                pairs = [(slot, rest if t == 0 else frames[t - 1])
                         for slot, (_, rest, frames) in enumerate(group)]
                desc = describe_call(b, pairs)
                for (slot, _), r in zip(pairs, checked_call(SHARED_PREFIX, f"eval({desc})",
                                                     lambda: b.eval(pairs))):
                    got[idx[slot]].append(r.logits.copy())
            for slot, i in enumerate(idx):
                want_logits, kv_ref = expected[i]
                story = f"plan {i} in slot {slot} ({'a ' + want if group[slot][0] else 'no'} " \
                        f"prefix of {p} positions)"
                for t, (lg, ref) in enumerate(zip(got[i], want_logits)):
                    err = rel_err(lg, ref)
                    if not err <= tol:
                        fail(SHARED_PREFIX, f"{story}, call {t}: logits differ from "
                             f"restore_prefix + prefill alone by {err:.2e} > {tol:.1e}")
                kv_differs(SHARED_PREFIX, f"{story}: K/V against the sequence alone",
                            b.kv_slot_snapshot(slot), kv_ref, kv_tol)
        b.close()

    def test_shared_prefix_unchanged_by_its_slots(self, open_model):
        """Slots that start with one voice prefix prefill and decode beside each other: the
        KVPrefix object, every slot's prefix positions and the numbers of a slot that starts
        with the prefix afterwards are those of the prefix before (a backend that shares it
        must never write into it)."""
        seqs = sequences(seed=111)
        m = open_model(CONFIG, self.batch_weight_type)
        caps = m.capabilities
        prefix = voice_prefix(m, seqs[2][0][:14])
        p = prefix.n_positions
        k0, v0 = prefix.k, prefix.v  # copies
        rest = seqs[0][0][:6]
        m.init_kv_cache(64)
        m.restore_prefix(prefix)
        late_ref = m.prefill(rest).logits.copy()
        m.clear_kv_cache()
        n_slots = n_slots_for(m, 3)
        b = BatchedModel(m)
        b.init_slots(n_slots, 24 + (0 if caps.shares_kv_prefix else p))
        hows = [b.restore_prefix(s, prefix) for s in range(n_slots)]
        for t in range(3):  # different lengths, then decode rows
            pairs = [(s, seqs[s][0][:3 + 4 * s] if t == 0 else seqs[s][1][t - 1])
                     for s in range(n_slots)]
            desc = describe_call(b, pairs)
            checked_call(PREFIX_UNCHANGED, f"eval({desc})", lambda: b.eval(pairs))
        if not (np.array_equal(prefix.k, k0) and np.array_equal(prefix.v, v0)):
            fail(PREFIX_UNCHANGED, "the KVPrefix's own K/V changed after its slots evaluated: "
                 "its slots must never write into a voice")
        # a recomputed prefix is a prefill again: its numbers, not its bits
        exact = 0 if hows[0] != "recomputed" else kv_tolerance(caps)
        for s in range(n_slots):
            k, v = b.kv_slot_snapshot(s)
            kv_differs(PREFIX_UNCHANGED, f"slot {s}'s first {p} positions (a {hows[s]} voice "
                        f"prefix, referenced by {n_slots} slots) after 3 calls",
                        (k[:, :p], v[:, :p]), (k0, v0), exact)
        last = n_slots - 1
        b.reset_slot(last)
        b.restore_prefix(last, prefix)
        got = checked_call(PREFIX_UNCHANGED, "a slot starting with the prefix after the others",
                    lambda: b.eval([(last, rest)]))
        err = rel_err(got[0].logits, late_ref)
        if not err <= output_tolerance(caps):
            fail(PREFIX_UNCHANGED, f"slot {last}, starting with the {hows[0]} prefix after "
                 f"{n_slots} slots used it, differs from restore_prefix + prefill alone by "
                 f"{err:.2e} > {output_tolerance(caps):.1e}")
        b.close()

    # ------------------------------------------------------------ serving
    def test_generate_many_equals_generate(self, open_model):
        """Requests of different lengths join as slots free up (max_sequences 2), each with
        its own seed; under greedy sampling every request's codes are generate()'s. On a
        backend without batching the same call runs them one after another."""
        seqs = sequences(seed=21)
        m = open_model(CONFIG, self.batch_weight_type)
        configs = [greedy(3 + 2 * i, min_tokens_before_end=3 + 2 * i) for i in range(len(seqs))]
        prompts = [p for p, _ in seqs]
        alone = [generate(m, p, c) for p, c in zip(prompts, configs)]
        assert [a.shape[1] for a in alone] == [c.max_new_tokens for c in configs]
        for n in sorted({1, n_slots_for(m, 2)}):
            many = checked_call(SERVED, f"generate_many of {len(prompts)} requests, {n} at a time",
                         lambda: generate_many(m, prompts, configs, max_sequences=n))
            for i, (a, g) in enumerate(zip(alone, many)):
                same_codes(g, a, f"request {i} of {len(prompts)}, {n} at a time")
        sampled = [GenerationConfig(max_new_tokens=4, im_end_id=IM_END, seed=s,
                                    min_tokens_before_end=4) for s in range(len(seqs))]
        # sampled: each request's own generator; the same seed gives the same codes again
        first = generate_many(m, prompts, sampled)
        second = generate_many(m, prompts[::-1], sampled[::-1])[::-1]
        for i, (a, g) in enumerate(zip(first, second)):
            if not np.array_equal(g, a):
                fail(SERVED, f"sampled request {i} (seed {i}) gave other codes when the "
                     "requests were submitted in the reverse order")

    def test_cancel_leaves_the_others_unchanged(self, open_model):
        seqs = sequences(seed=31)
        m = open_model(CONFIG, self.batch_weight_type)
        prompts = [p for p, _ in seqs[:3]]
        config = greedy(6, min_tokens_before_end=6)
        alone = [generate(m, p, config) for p in prompts]
        with Server(m, max_sequences=n_slots_for(m, 3)) as server:
            reqs = [server.submit(p, config) for p in prompts]
            seen = []
            for frame in reqs[1]:
                seen.append(frame)
                if len(seen) == 2:
                    reqs[1].cancel()
            server.run()
            if not (reqs[1].done and reqs[1].stats.stopped_by == CANCELLED):
                fail(SERVED, f"request 1, cancelled after 2 frames, ended by "
                     f"{reqs[1].stats.stopped_by!r}")
            same_codes(reqs[1].codes(), alone[1][:, :2], "request 1, cancelled after 2 frames")
            for i in (0, 2):
                same_codes(reqs[i].codes(), alone[i], f"request {i}, beside request 1 "
                            "cancelled after 2 frames")
        # on_frame returning False stops that request alone
        stop_at = {0: 3}
        many = generate_many(m, prompts, config,
                             on_frame=lambda r, j, f: not (j + 1 == stop_at.get(r)))
        same_codes(many[0], alone[0][:, :3], "request 0, stopped by on_frame after 3 frames")
        for i in (1, 2):
            same_codes(many[i], alone[i], f"request {i}, beside request 0 stopped by on_frame")

    def test_requests_share_a_voice_prefix(self, open_model):
        """Requests starting with the same KVPrefix give generate(prefix=...)'s codes."""
        seqs = sequences(seed=41)
        m = open_model(CONFIG, self.batch_weight_type)
        voice = seqs[2][0][:12]
        prompts = [np.vstack([voice, p[:8]]) for p, _ in seqs[:3]]
        prefix = voice_prefix(m, voice)
        config = greedy(4, min_tokens_before_end=4)
        alone = [generate(m, p, config, prefix=prefix) for p in prompts]
        with Server(m) as server:
            reqs = [server.submit(p, config, prefix=prefix) for p in prompts]
            checked_call(SERVED, "serving 3 requests in one voice", server.run)
            for i, r in enumerate(reqs):
                same_codes(r.codes(), alone[i], f"request {i} of 3 in one voice")
                st = r.stats
                if (st.restored_positions, st.prefilled_positions, st.prefix_shared) != (
                        len(voice), 8, m.capabilities.shares_kv_prefix):
                    fail(SERVED, f"request {i}: restored {st.restored_positions} positions "
                         f"(voice {len(voice)}), prefilled {st.prefilled_positions} (8), "
                         f"prefix_shared {st.prefix_shared} (shares_kv_prefix "
                         f"{m.capabilities.shares_kv_prefix})")
