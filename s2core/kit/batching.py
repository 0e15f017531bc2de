"""Conformance of several sequences per call (part of BackendConformance).

A backend that declares `max_batch_sequences` > 1 evaluates KV slots itself (eval_slots,
fast_decode_batch); every other backend gets the core's one-slot fallback on its
single-sequence cache. Either way a sequence's numbers must not depend on its neighbours:
slots of different lengths, prefills and decode rows in the same call, slots that leave and
are reused, all within the chunked-prefill tolerance of each sequence run alone. Voice
prefixes and the server are s2core/kit/voices_serving.py's.

Each test checks one rule of s2core/kit/batching_rules.py (BATCHING_RULES) and fails with a
message that starts with the rule's name and gives the numbers. Where the core enforces a
rule for every backend (the checks of BatchedModel's arguments, n_past, the slot memory
limit), the test checks it all the same: it costs little and shows the rule holds.
"""

from __future__ import annotations

import numpy as np
import pytest

from s2core.contract.checks import unbacked_claims
from s2core.serving.batching import BatchedModel
from s2core.errors import CacheAllocationError, CacheNotInitializedError, CacheOverflowError, \
    InvalidInputError, InvalidTokensError
from s2core.runtime.memory import backend_kv_cache_bytes
from s2core.kit.prompts import mixed_prompt, semantic_frame

from s2core.kit.batching_rules import (CONFIG, FAST_BATCH, JOIN_LEAVE, MAX_BATCH, OWN_ROWS, SEQUENCES,
                             SLOT_CHECKS, SLOT_MEMORY, SLOT_METHODS, SLOT_RESULTS_KEPT,
                             SLOT_SNAPSHOTS, VOICE_HELD_ONCE,
                             SLOTS_ALONE, alone_run, checked_call, describe_call, fail,
                             kv_differs, n_slots_for, rel_err, sequences, voice_prefix)
from s2core.kit.tolerances import (batched_median_tolerance, batched_tolerance,
                                   fast_tolerance, kv_tolerance, output_tolerance)
from s2core.kit.voices_serving import VoiceAndServingConformance


class BatchingConformance(VoiceAndServingConformance):
    """Mixed into BackendConformance; uses its `open_model` fixture."""

    batch_weight_type = "q8_0"

    # ------------------------------------------------------------ contract
    def test_batching_capability_is_backed_by_methods(self, open_model):
        """A backend that declares more than one sequence per call implements the slot
        methods (the defaults only hold the one-slot case)."""
        m = open_model(CONFIG, self.batch_weight_type)
        n = m.capabilities.max_batch_sequences
        if not isinstance(n, int) or n < 1:
            fail(SLOT_METHODS, f"max_batch_sequences must be an int >= 1, got {n!r}")
        # the same check load() makes (a backend failing it is refused before this runs)
        unbacked = unbacked_claims(type(m.backend), m.capabilities)
        if unbacked:
            fail(SLOT_METHODS, "; ".join(unbacked) + " (Backend's defaults only serve one "
                 "slot and share nothing)")

    # ------------------------------------------------------------ numbers
    def test_slots_equal_sequences_alone(self, open_model, backend):
        """Sequences of different lengths share calls (one's prefill beside the others'
        decode rows), leave, and their slots are reused: each gets the numbers it gets alone,
        with every cache type the backend offers."""
        import s2core
        offered = s2core.get_registry().info(backend).capabilities.supported_kv_cache_dtypes
        for dtype in offered:
            self._slots_equal_sequences_alone(open_model, dtype)

    def _slots_equal_sequences_alone(self, open_model, dtype: str) -> None:
        seqs = sequences()
        alone = open_model(CONFIG, self.batch_weight_type, kv_cache_dtype=dtype)
        expected = [alone_run(alone, [prompt] + frames) for prompt, frames in seqs]

        m = open_model(CONFIG, self.batch_weight_type, kv_cache_dtype=dtype)
        b = BatchedModel(m)
        n_slots = n_slots_for(m, 3)
        b.init_slots(n_slots, 64)
        tol, kv_tol = batched_tolerance(m.capabilities), kv_tolerance(m.capabilities)
        errors = []  # every result's error: their median is held to the bound without flips
        done = [0] * len(seqs)  # calls each sequence has had
        waiting = list(range(len(seqs)))
        running: dict[int, int] = {}  # slot -> sequence
        calls = 0
        while waiting or running:
            for slot in range(n_slots):  # a free slot takes the next sequence
                if slot not in running and waiting:
                    running[slot] = waiting.pop(0)
                    b.reset_slot(slot)
            # after a reuse the pairs are not in slot order: results come back as asked
            pairs = [(slot, seqs[i][0] if done[i] == 0 else seqs[i][1][done[i] - 1])
                     for slot, i in running.items()]
            desc = describe_call(b, pairs)
            results = checked_call(SLOTS_ALONE, f"eval({desc})", lambda: b.eval(pairs))
            calls += 1
            want = {slot: expected[i][done[i]] for slot, i in running.items()}
            for (slot, _), r in zip(pairs, results):
                i = running[slot]
                for what, out, ref in (("hidden", r.hidden, want[slot][0]),
                                       ("logits", r.logits, want[slot][1])):
                    err = rel_err(out, ref) if np.all(np.isfinite(out)) else np.inf
                    errors.append(err)
                    if err > tol:
                        whose = [s for s, w in want.items()
                                 if s != slot and rel_err(out, w[1 if what == "logits" else 0]) <= tol]
                        fail(SLOTS_ALONE, f"{dtype} cache, call {calls} ({desc}): slot "
                             f"{slot}'s {what} "
                             f"(sequence {i}, its call {done[i]}) differs from the sequence "
                             f"alone by {err:.2e} > {tol:.1e}" + (
                                 f"; it is slot {whose[0]}'s: results must come back in the "
                                 "order the slots were asked" if whose else ""))
                done[i] += 1
                if b.n_past(slot) != len(seqs[i][0]) + done[i] - 1:
                    fail(SLOTS_ALONE, f"slot {slot}: n_past {b.n_past(slot)} after "
                         f"{done[i]} calls of sequence {i}")
                if done[i] == len(seqs[i][1]) + 1:  # the sequence leaves
                    kv_differs(SLOTS_ALONE, f"sequence {i}'s K/V in slot {slot} at its end, "
                                f"against the sequence alone", b.kv_slot_snapshot(slot),
                                want[slot][2], kv_tol)
                    del running[slot]
        if n_slots > 1:
            assert calls < sum(f + 1 for _, f in SEQUENCES), "sequences never shared a call"
        median_tol = batched_median_tolerance(m.capabilities)
        if np.median(errors) > median_tol:
            fail(SLOTS_ALONE, f"{dtype} cache: the median result differs from its sequence "
                 f"alone by {np.median(errors):.2e} > {median_tol:.1e}: more than an "
                 f"occasional rounding flip of arithmetic {m.capabilities.arithmetic!r}")
        b.close()

    def test_slot_snapshots_are_copies(self, open_model):
        m = open_model(CONFIG, "f32")  # one KV head: the shape where a view is easiest to leak
        b = BatchedModel(m)
        n_slots = n_slots_for(m, 2)
        (prompt, frames), = sequences()[:1]
        b.init_slots(n_slots, len(prompt) + 2)
        b.eval([(0, prompt)])
        first = b.kv_slot_snapshot(0)
        if any(a.dtype != np.float32 for a in first):
            fail(SLOT_SNAPSHOTS, f"expected float32 snapshots, seen {first[0].dtype} and "
                 f"{first[1].dtype}")
        kept = tuple(a.copy() for a in first)
        b.eval([(0, frames[0])])
        b.eval([(0, frames[1])])  # the slot is now full
        if not all(np.array_equal(a, c) for a, c in zip(first, kept)):
            fail(SLOT_SNAPSHOTS, "expected a snapshot unchanged by later calls, seen it "
                 "changed: read_kv_slot returned views of the live slot, not copies")
        second = b.kv_slot_snapshot(0)
        kept = tuple(a.copy() for a in second)
        for a in second:
            if a.flags.writeable:
                a += 1.0
        third = b.kv_slot_snapshot(0)
        if not all(np.array_equal(a, c) for a, c in zip(third, kept)):
            fail(SLOT_SNAPSHOTS, "expected the slot unchanged when a snapshot of it is "
                 "changed, seen a later snapshot change with it: read_kv_slot returned views")
        if any(np.shares_memory(a, c) for a, c in zip(third, second)):
            fail(SLOT_SNAPSHOTS, "expected two snapshots in separate memory, seen them share it")
        b.close()

    def test_a_shared_voice_is_held_once(self, open_model):
        from s2core.kit.declared import traced_growth
        m = open_model(CONFIG, "f32")
        if not m.capabilities.shares_kv_prefix:
            pytest.skip(f"{m.backend.name}: declares no shared voice prefixes")
        (prompt, _), = sequences()[:1]
        prefix = voice_prefix(m, prompt)
        b = BatchedModel(m)
        n_slots = n_slots_for(m, 4)
        b.init_slots(n_slots, 16)
        _, grown = traced_growth(lambda: [b.restore_prefix(s, prefix) for s in range(n_slots)])
        voice = backend_kv_cache_bytes(m.hparams, prefix.n_positions, m.capabilities)
        b.close()
        if grown < voice / 4:
            pytest.skip(f"{m.backend.name}: the voice is not allocated through Python's or "
                        "NumPy's allocators: tracemalloc cannot measure it")
        # + the core's copy of the token rows and its small records of the voice
        allowed = 1.1 * voice + prefix.tokens.nbytes + 8 * 1024
        if grown > allowed:
            fail(VOICE_HELD_ONCE, f"expected {n_slots} slots restoring one voice of "
                 f"{prefix.n_positions} positions to add about {voice} bytes (one voice in "
                 f"{m.capabilities.kv_cache_held_dtype}), at most {allowed:.0f}, seen {grown}: "
                 "attach_kv_prefix copies the voice into each slot")

    def test_slots_advance_by_their_own_rows(self, open_model):
        """Slots of different lengths in the same calls, not in slot order, one slot left
        out of a call: each call writes a slot's K/V at its own positions (those of its
        sequence alone), and a slot left out keeps its K/V bit for bit."""
        seqs = sequences(seed=71)
        m = open_model(CONFIG, self.batch_weight_type)
        n_slots = n_slots_for(m, 3)
        streams = [np.vstack([p] + f) for p, f in seqs[:3]]  # slot s runs sequence s
        plan = [[(0, 12), (1, 3)], [(1, 6), (0, 1), (2, 5)], [(2, 1), (0, 1)], [(1, 2), (2, 4)]]
        plan = [[(s, n) for s, n in call if s < n_slots] for call in plan]
        plan = [call for call in plan if call]
        chunks: list[list[np.ndarray]] = [[] for _ in range(n_slots)]
        used = [0] * n_slots
        calls = []
        for call in plan:
            pairs = []
            for s, n in call:
                rows = streams[s][used[s]:used[s] + n]
                used[s] += n
                chunks[s].append(rows)
                pairs.append((s, rows))
            calls.append(pairs)
        alone = open_model(CONFIG, self.batch_weight_type)
        expected = [alone_run(alone, chunks[s]) for s in range(n_slots)]
        b = BatchedModel(m)
        b.init_slots(n_slots, 64)
        tol_kv = kv_tolerance(m.capabilities)
        held = [0] * n_slots  # rows each slot has had
        k_of = [0] * n_slots  # chunks each slot has had
        for t, pairs in enumerate(calls):
            desc = describe_call(b, pairs)
            left_out = [s for s in range(n_slots) if held[s] and s not in dict(pairs)]
            before = {s: b.kv_slot_snapshot(s) for s in left_out}
            checked_call(OWN_ROWS, f"call {t} ({desc})", lambda: b.eval(pairs))
            for s, rows in pairs:
                held[s] += len(rows)
                if b.n_past(s) != held[s]:
                    fail(OWN_ROWS, f"call {t} ({desc}): slot {s}'s n_past is {b.n_past(s)}, "
                         f"not the {held[s]} rows it was given")
                kv_differs(OWN_ROWS, f"call {t} ({desc}): slot {s}'s K/V against its "
                            f"sequence alone", b.kv_slot_snapshot(s), expected[s][k_of[s]][2],
                            tol_kv, f" (this call's rows are positions [{held[s] - len(rows)}, "
                            f"{held[s]}))")
                k_of[s] += 1
            for s in left_out:
                kv_differs(OWN_ROWS, f"call {t} ({desc}): slot {s}, left out of the call, "
                            f"changed", b.kv_slot_snapshot(s), before[s], 0)
        b.close()

    def test_slots_join_leave_and_are_reused(self, open_model):
        """A sequence leaves its slot and another joins it beside a neighbour that goes on;
        then the slot starts with a voice prefix, and is reset and reused without one: every
        sequence gets its numbers alone, and so does the neighbour."""
        seqs = sequences(seed=81)
        m = open_model(CONFIG, self.batch_weight_type)
        caps = m.capabilities
        n_slots = n_slots_for(m, 2)
        prefix = voice_prefix(m, seqs[2][0][:10])
        first, neighbour, joiner, plain = seqs[1], seqs[0], seqs[3], seqs[2]
        alone = open_model(CONFIG, self.batch_weight_type)
        want = {name: alone_run(alone, [p] + f[:3])
                for name, (p, f) in (("first", first), ("joiner", joiner),
                                     ("plain", (plain[0][10:20], plain[1])))}
        want["neighbour"] = alone_run(alone, [neighbour[0]] + neighbour[1])  # 7 calls
        alone.init_kv_cache(64)
        alone.restore_prefix(prefix)
        voiced = [alone.prefill(seqs[1][0][:5]).logits.copy(),
                  alone.step(seqs[1][1][0]).logits.copy()]
        alone.clear_kv_cache()
        b = BatchedModel(m)
        b.init_slots(n_slots, 40)
        tol = output_tolerance(caps)
        other = 1 if n_slots > 1 else None  # the neighbour's slot

        def run(slot: int, name: str, rows: list, story: str) -> None:
            """Feed the rows to `slot` (beside the neighbour's next rows, when there is one)
            and compare with the sequence alone."""
            for t, r in enumerate(rows):
                pairs = [(slot, r)]
                if other is not None and nb["t"] < len(nb["rows"]):
                    pairs.append((other, nb["rows"][nb["t"]]))
                desc = describe_call(b, pairs)
                got = checked_call(JOIN_LEAVE, f"{story}, call {t} ({desc})", lambda: b.eval(pairs))
                err = rel_err(got[0].logits, want[name][t][1])
                if err > tol:
                    fail(JOIN_LEAVE, f"{story}, call {t} ({desc}): slot {slot}'s logits differ "
                         f"from {name} alone by {err:.2e} > {tol:.1e}")
                if len(got) > 1:
                    err = rel_err(got[1].logits, want["neighbour"][nb["t"]][1])
                    if err > tol:
                        fail(JOIN_LEAVE, f"{story}, call {t} ({desc}): the neighbour in slot "
                             f"{other} differs from its sequence alone by {err:.2e} > {tol:.1e}")
                    nb["t"] += 1

        p, f = neighbour
        nb = {"rows": [p] + f, "t": 0}  # it outlives the first and goes on beside the joiner
        run(0, "first", [first[0]] + first[1][:3], "slot 0's first sequence")
        b.reset_slot(0)  # it leaves; the next joins the same slot, the neighbour goes on
        run(0, "joiner", [joiner[0]] + joiner[1][:3], f"slot 0 reused after a sequence of "
            f"{len(first[0]) + 3} positions")
        b.reset_slot(0)
        how = b.restore_prefix(0, prefix)
        for t, rows in enumerate([seqs[1][0][:5], seqs[1][1][0]]):
            got = checked_call(JOIN_LEAVE, f"slot 0 with a {how} prefix, call {t}",
                        lambda: b.eval([(0, rows)]))
            err = rel_err(got[0].logits, voiced[t])
            if err > tol:
                fail(JOIN_LEAVE, f"slot 0 reused with a {how} voice prefix of "
                     f"{prefix.n_positions} positions, call {t}: logits differ from "
                     f"restore_prefix + prefill alone by {err:.2e} > {tol:.1e}")
        b.reset_slot(0)
        if b.n_past(0) != 0 or b.shared_positions(0) != 0:
            fail(JOIN_LEAVE, f"after reset_slot(0): n_past {b.n_past(0)}, shared positions "
                 f"{b.shared_positions(0)}")
        run(0, "plain", [plain[0][10:20]] + plain[1][:3], f"slot 0 reused without a prefix "
            f"after one with a {how} prefix of {prefix.n_positions} positions")
        b.close()

    def test_slot_results_unchanged_after_later_calls(self, open_model):
        """Results handed out (native and numpy) are not buffers a later call overwrites:
        eval's hidden and logits, the batched Fast-AR's logits."""
        seqs = sequences(seed=91)
        m = open_model(CONFIG, self.batch_weight_type)
        be, hp = m.backend, m.hparams
        n_slots = n_slots_for(m, 2)
        b = BatchedModel(m)
        b.init_slots(n_slots, 48)
        saved = []  # (label, Result, hidden copy, logits copy, numpy taken at once or None)

        def keep(label: str, results, host_now: bool) -> None:
            for s, r in enumerate(results):
                h = np.array(be.to_numpy(r.hidden_native), np.float32, copy=True)
                lg = np.array(be.to_numpy(r.logits_native), np.float32, copy=True)
                saved.append((f"{label}, slot {s}", r, h, lg,
                              (r.hidden, r.logits) if host_now else None))

        keep("the first call", b.eval([(s, seqs[s][0]) for s in range(n_slots)]), True)
        keep("the second call", b.eval([(s, seqs[s][1][0]) for s in range(n_slots)]), False)
        rng = np.random.default_rng(92)
        hiddens = rng.standard_normal((n_slots, hp.dim)).astype(np.float32)
        codes = rng.integers(0, hp.codebook_size, (n_slots, 3))
        fast = []
        for k in range(3):  # each extends the last: the incremental path, where it is one
            out = b.fast_decode(hiddens, codes[:, :k])
            fast.append((f"batched Fast-AR logits after {k} codes", out, out.copy()))
        # later calls of every kind
        b.eval([(s, seqs[s][1][1]) for s in range(n_slots)])
        b.fast_decode(hiddens[::-1], codes[::-1, :1])
        b.fast_decode(hiddens[::-1], codes[::-1, :2])
        b.reset_slot(0)
        b.eval([(0, seqs[3][0])])
        b.eval([(s, seqs[s][1][2]) for s in range(n_slots)])
        for label, r, h, lg, host in saved:
            for what, expected, native, now in (("hidden", h, r.hidden_native, host and host[0]),
                                                ("logits", lg, r.logits_native, host and host[1])):
                for form, value in (("native", be.to_numpy(native)), ("numpy", now)):
                    if value is not None and not np.array_equal(value, expected):
                        fail(SLOT_RESULTS_KEPT, f"{label}: its {what} ({form}) changed after "
                             f"later calls (max change "
                             f"{np.abs(np.asarray(value) - expected).max():.3g}): eval_slots "
                             "returned a buffer that a later call overwrites")
        for label, out, copy in fast:
            if not np.array_equal(out, copy):
                fail(SLOT_RESULTS_KEPT, f"{label} changed after later calls (max change "
                     f"{np.abs(out - copy).max():.3g}): the batched Fast-AR returned a buffer "
                     "that a later call overwrites")
        b.close()

    def test_declared_max_batch_sequences_holds(self, open_model):
        """As many slots as the backend declares, in one call (prefill, then a decode row
        each): each slot's numbers are its sequence's alone."""
        m = open_model(CONFIG, self.batch_weight_type)
        n = m.capabilities.max_batch_sequences
        hp = m.hparams
        rng = np.random.default_rng(101)
        seqs = [(mixed_prompt(hp, 3 + s % 5, rng), semantic_frame(hp, rng)) for s in range(n)]
        alone = open_model(CONFIG, self.batch_weight_type)
        want = [alone_run(alone, [p, f], 8) for p, f in seqs]
        b = BatchedModel(m)
        checked_call(MAX_BATCH, f"max_batch_sequences={n}: init_slots({n}, 8)",
              lambda: b.init_slots(n, 8))
        tol = output_tolerance(m.capabilities)
        errors = []
        for t in range(2):
            pairs = [(s, seqs[s][t]) for s in range(n)]
            got = checked_call(MAX_BATCH, f"max_batch_sequences={n}: one call over {n} slots "
                        f"({'prefill' if t == 0 else 'one decode row each'})",
                        lambda: b.eval(pairs))
            for s, r in enumerate(got):
                err = rel_err(r.logits, want[s][t][1])
                errors.append(err)
                if not err <= tol:
                    fail(MAX_BATCH, f"max_batch_sequences={n}: in one call over {n} slots, "
                         f"slot {s}'s logits ({'prefill' if t == 0 else 'decode'}) differ "
                         f"from its sequence alone by {err:.2e} > {tol:.1e}")
        median_tol = batched_median_tolerance(m.capabilities)
        if not np.median(errors) <= median_tol:
            fail(MAX_BATCH, f"max_batch_sequences={n}: the median slot differs from its "
                 f"sequence alone by {np.median(errors):.2e} > {median_tol:.1e}: more than an "
                 f"occasional rounding flip of arithmetic {m.capabilities.arithmetic!r}")
        b.close()

    def test_fast_decode_batch_equals_rows_alone(self, open_model):
        m = open_model(CONFIG, self.batch_weight_type)
        hp = m.hparams
        rng = np.random.default_rng(5)
        hiddens = rng.standard_normal((3, hp.dim)).astype(np.float32)
        codes = rng.integers(0, hp.codebook_size, (3, hp.num_codebooks - 1))
        b = BatchedModel(m)
        tol = fast_tolerance(m.capabilities)

        def check(got, rows, k: int, how: str) -> None:
            if got.shape != (3, hp.codebook_size) or got.dtype != np.float32:
                fail(FAST_BATCH, f"{how}: logits of shape {got.shape} and type {got.dtype}, "
                     f"expected (3, {hp.codebook_size}) float32")
            for row, src in enumerate(rows):
                err = rel_err(got[row], m.fast_decode(hiddens[src], codes[src, :k]))
                if not err <= tol:
                    fail(FAST_BATCH, f"{how}: row {row} after {k} codes differs from "
                         f"fast_decode of that row alone by {err:.2e} > {tol:.1e}")

        for k in range(hp.num_codebooks):  # extends the previous call (the incremental path)
            got = checked_call(FAST_BATCH, f"fast_decode of 3 rows after {k} codes",
                        lambda: b.fast_decode(hiddens, codes[:, :k]))
            check(got, [0, 1, 2], k, "each call extending the last")
        # a new call that does not extend the last one starts over
        check(b.fast_decode(hiddens[::-1], codes[::-1, :2]), [2, 1, 0], 2,
              "a call that does not extend the last")

    # ------------------------------------------------------------ checks
    def test_slot_bad_input_leaves_slots_unchanged(self, open_model):
        """The core's checks of BatchedModel (every backend gets them): each bad call raises
        its named check, and every slot's n_past and K/V stay as they were."""
        seqs = sequences()
        m = open_model(CONFIG, self.batch_weight_type)
        b = BatchedModel(m)
        with pytest.raises(CacheNotInitializedError):
            b.eval([(0, seqs[0][0])])
        n_slots = n_slots_for(m, 2)
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
            try:
                b.eval(pairs)
            except exc as raised:
                if raised.check != check:
                    fail(SLOT_CHECKS, f"{check}: raised {raised!r}")
            except Exception as raised:  # noqa: BLE001 - the wrong error breaks the rule
                fail(SLOT_CHECKS, f"{check}: raised {raised!r}, not {exc.__name__}")
            else:
                fail(SLOT_CHECKS, f"{check}: the call was accepted")
            for s, (n, kv) in enumerate(before):
                if b.n_past(s) != n:
                    fail(SLOT_CHECKS, f"after the refused call ({check}) slot {s}'s n_past is "
                         f"{b.n_past(s)}, not {n}")
                kv_differs(SLOT_CHECKS, f"after the refused call ({check}), slot {s}",
                            b.kv_slot_snapshot(s), kv, 0)
        for hiddens, codes, check in ((np.zeros((2, hp.dim + 1), np.float32), [[1], [2]],
                                       "hiddens_shape"),
                                      (np.zeros((2, hp.dim), np.float32),
                                       [[1], [hp.codebook_size]], "prefix_code_range"),
                                      (np.zeros((2, hp.dim), np.float32), [[1, 2]],
                                       "prefix_shape")):
            with pytest.raises(InvalidInputError) as info:
                b.fast_decode(hiddens, codes)
            if info.value.check != check:
                fail(SLOT_CHECKS, f"{check}: raised {info.value!r}")
        b.close()
        assert b.max_seq_len is None

    def test_slots_beyond_the_memory_limit_are_refused(self, open_model):
        """init_slots is held to the limit init_kv_cache uses (kv_cache_limit_bytes), counted
        for every slot: a request beyond it raises CacheAllocationError naming the sizes and
        keeps the previous slots, their n_past and K/V, which go on as before."""
        seqs = sequences(seed=51)
        m = open_model("huge-context", "f32")
        b = BatchedModel(m)
        n_slots = n_slots_for(m, 2)
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
            need = want_slots * backend_kv_cache_bytes(hp, length, caps)
            try:
                b.init_slots(want_slots, length)
            except CacheAllocationError as exc:
                text = str(exc)
                if f"init_slots({want_slots}, {length})" not in text or "kept" not in text:
                    fail(SLOT_MEMORY, f"the refusal does not name the request and what was "
                         f"kept: {text}")
                if not (need > (limit or 0) or "failed" in text):
                    fail(SLOT_MEMORY, f"init_slots({want_slots}, {length}) ({need} bytes, "
                         f"within the limit {limit}) was refused: {text}")
            except Exception as exc:  # noqa: BLE001 - anything else breaks the rule
                fail(SLOT_MEMORY, f"init_slots({want_slots}, {length}) raised {exc!r}, not "
                     "CacheAllocationError")
            else:
                fail(SLOT_MEMORY, f"init_slots({want_slots}, {length}) allocated {need} bytes "
                     f"beyond kv_cache_limit_bytes()={limit}")
            if (b.n_slots, b.max_seq_len) != (n_slots, 16):
                fail(SLOT_MEMORY, f"after the refused init_slots({want_slots}, {length}): "
                     f"{b.n_slots} slots of {b.max_seq_len}, not {n_slots} of 16")
            for s, (n, kv) in enumerate(before):
                if b.n_past(s) != n:
                    fail(SLOT_MEMORY, f"after the refused init_slots({want_slots}, {length}) "
                         f"slot {s}'s n_past is {b.n_past(s)}, not {n}")
                got = checked_call(SLOT_MEMORY, f"after the refused init_slots({want_slots}, "
                            f"{length}), reading slot {s} (allocate the new slots before "
                            f"dropping the old)", lambda: b.kv_slot_snapshot(s))
                kv_differs(SLOT_MEMORY, f"after the refused init_slots({want_slots}, "
                            f"{length}), slot {s}", got, kv, 0)
        # the kept slots go on as a fresh set of slots given the same rows
        after = checked_call(SLOT_MEMORY, "the next call on the kept slots",
                      lambda: b.eval([(s, seqs[s][1][0]) for s in range(n_slots)]))
        fresh = BatchedModel(open_model("huge-context", "f32"))
        fresh.init_slots(n_slots, 16)
        fresh.eval([(s, seqs[s][0][:5]) for s in range(n_slots)])
        again = fresh.eval([(s, seqs[s][1][0]) for s in range(n_slots)])
        for s, (r, ref) in enumerate(zip(after, again)):
            if not np.array_equal(r.logits, ref.logits):
                fail(SLOT_MEMORY, f"after the refused init_slots, slot {s}'s next logits "
                     f"differ from fresh slots given the same rows (max difference "
                     f"{np.abs(r.logits - ref.logits).max():.3g})")
        fresh.close()
        b.close()
