"""Conformance of several sequences per call (part of BackendConformance).

A backend that declares `max_batch_sequences` > 1 evaluates KV slots itself (eval_slots,
fast_decode_batch); every other backend gets the core's one-slot fallback on its
single-sequence cache. Either way a sequence's numbers must not depend on its neighbours:
slots of different lengths, prefills and decode rows in the same call, slots that leave and
are reused, all within the chunked-prefill tolerance of each sequence run alone; and the
server's requests give generate()'s codes, cancelled neighbours or not.

Each test checks one rule (BATCHING_RULES) and fails with a message that starts with the
rule's name and gives the numbers (which slot, which positions, by how much), as the rules
of s2core/kit/rules.py do. Where the core enforces a rule for every backend (the checks of
BatchedModel's arguments, n_past, the slot memory limit), the test checks it all the same:
it costs little and shows the rule holds.
"""

from __future__ import annotations

from typing import Any, Callable

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

SLOT_METHODS = "batching-capability-backed-by-methods"
SLOTS_ALONE = "slots-equal-sequences-alone"
OWN_ROWS = "slots-advance-by-their-own-rows"
JOIN_LEAVE = "slots-join-leave-and-are-reused"
SLOT_RESULTS_KEPT = "slot-results-unchanged-after-later-calls"
MAX_BATCH = "declared-max-batch-sequences-holds"
FAST_BATCH = "batched-fast-ar-equals-rows-alone"
SLOT_CHECKS = "bad-slot-input-changes-nothing"
SHARED_PREFIX = "slots-start-with-a-shared-prefix"
PREFIX_UNCHANGED = "shared-prefix-unchanged-by-its-slots"
SLOT_MEMORY = "slots-beyond-the-limit-are-refused-and-kept"
SERVED = "served-requests-equal-generate"

#: rule name -> what it says (contract.md section 9 lists them)
BATCHING_RULES = {
    SLOT_METHODS: "a backend declaring max_batch_sequences > 1 overrides the slot methods, "
                  "and one declaring shares_kv_prefix overrides add_kv_prefix and "
                  "attach_kv_prefix",
    SLOTS_ALONE: "each slot of a call gets the hidden, logits and K/V of its sequence run "
                 "alone (chunked-prefill tolerance), returned in the order the slots were "
                 "asked, whatever its neighbours hold",
    OWN_ROWS: "a call writes each slot's K/V at that slot's own positions [n_past, n_past + "
              "its rows): slots of different lengths do not move each other, and a slot "
              "left out of a call keeps its K/V bit for bit",
    JOIN_LEAVE: "a slot reset and reused (with or without a voice prefix) starts its new "
                "sequence from position 0 as if new, and its neighbours go on unchanged",
    SLOT_RESULTS_KEPT: "eval_slots' hidden and logits, and the batched Fast-AR's logits, stay "
                       "unchanged after later calls",
    MAX_BATCH: "the declared max_batch_sequences slots allocate and evaluate in one call, "
               "each with its sequence's numbers alone",
    FAST_BATCH: "row b of the batched Fast-AR equals fast_decode(hiddens[b], codes[b]) "
                "alone, extending or not the previous call",
    SLOT_CHECKS: "bad slot input raises the named check before anything changes: every "
                 "slot's n_past and K/V stay as they were",
    SHARED_PREFIX: "slots that start with a voice prefix equal restore_prefix + prefill "
                   "alone; the prefix is 'shared' exactly when shares_kv_prefix is declared, "
                   "and then the slot holds only its own positions",
    PREFIX_UNCHANGED: "a voice prefix referenced by several slots is read-only: after its "
                      "slots evaluated, the KVPrefix, each slot's prefix positions and a new "
                      "slot starting with it are as before",
    SLOT_MEMORY: "init_slots beyond kv_cache_limit_bytes (counted for every slot), or one "
                 "whose allocation fails, raises CacheAllocationError and keeps the previous "
                 "slots, their n_past and K/V, which go on as before",
    SERVED: "the server's requests give generate()'s codes under greedy sampling, joining "
            "and leaving, beside cancelled neighbours and in a shared voice; sampled ones "
            "repeat by seed",
}


def fail(rule: str, message: str) -> None:
    pytest.fail(f"rule '{rule}' ({BATCHING_RULES[rule]}): {message}", pytrace=False)


def _call(rule: str, what: str, call: Callable[[], Any]) -> Any:
    """call(); anything it raises breaks `rule` (a crash is no answer to a valid call)."""
    try:
        return call()
    except Exception as exc:  # noqa: BLE001 - reported as the rule it breaks
        fail(rule, f"{what} raised {type(exc).__name__}: {exc}")


def _rel(out, ref) -> float:
    out, ref = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    return float(np.linalg.norm(out - ref) / np.linalg.norm(ref))


def _worst_position(got: np.ndarray, ref: np.ndarray) -> tuple[int, float]:
    """The position (axis 1 of [n_layer, n, heads, dim]) where got is furthest from ref,
    relatively, and that error."""
    diff = np.asarray(got, np.float64) - np.asarray(ref, np.float64)
    num = np.sqrt((diff ** 2).sum(axis=(0, 2, 3)))
    den = np.sqrt((np.asarray(ref, np.float64) ** 2).sum(axis=(0, 2, 3)))
    errs = num / np.maximum(den, 1e-30)
    pos = int(np.argmax(errs))
    return pos, float(errs[pos])


def _kv_differs(rule: str, what: str, got: tuple[np.ndarray, np.ndarray],
                ref: tuple[np.ndarray, np.ndarray], tol: float, why: str = "") -> None:
    """got's K and V equal ref's within tol (0: bit for bit), or fail naming the position."""
    for name, g, r in (("K", got[0], ref[0]), ("V", got[1], ref[1])):
        if g.shape != r.shape:
            fail(rule, f"{what}: {name} has shape {g.shape}, expected {r.shape}{why}")
        bad = not np.array_equal(g, r) if tol == 0 else _rel(g, r) > tol
        if bad:
            pos, err = _worst_position(g, r)
            bound = "bit for bit" if tol == 0 else f"bound {tol:.1e}"
            fail(rule, f"{what}: {name} differs ({bound}; overall {_rel(g, r):.2e}), most "
                       f"at position {pos} of {r.shape[1]} (relative error {err:.2e}){why}")


def _sequences(seed: int = 11):
    hp = CONFIGS[CONFIG]
    rng = np.random.default_rng(seed)
    return [(mixed_prompt(hp, n, rng), [semantic_frame(hp, rng) for _ in range(f)])
            for n, f in SEQUENCES]


def _greedy(max_new_tokens: int, **kw) -> GenerationConfig:
    return GenerationConfig(max_new_tokens=max_new_tokens, im_end_id=IM_END, temperature=0,
                            seed=0, **kw)


def _same_codes(got: np.ndarray, want: np.ndarray, what: str) -> None:
    if got.shape != want.shape or not np.array_equal(got, want):
        frames = min(got.shape[-1], want.shape[-1]) if got.ndim == want.ndim == 2 else 0
        first = next((t for t in range(frames) if not np.array_equal(got[:, t], want[:, t])),
                     frames)
        fail(SERVED, f"{what}: codes {got.shape} differ from generate()'s {want.shape}, "
                     f"first at frame {first}")


def _describe(b: BatchedModel, pairs) -> str:
    """'slot 0: 12 rows at n_past 0, slot 1: 1 row at n_past 9' (before the call)."""
    return ", ".join(f"slot {s}: {len(np.atleast_2d(rows))} row(s) at n_past {b.n_past(s)}"
                     for s, rows in pairs)


class BatchingConformance:
    """Mixed into BackendConformance; uses its `open_model` fixture."""

    batch_weight_type = "q8_0"

    def _slots(self, m, wanted: int) -> int:
        return min(wanted, m.capabilities.max_batch_sequences)

    def _alone(self, m, chunks: list[np.ndarray], capacity: int = 64):
        """Each chunk's (hidden, logits) and the K/V after it, the sequence alone on m."""
        m.init_kv_cache(capacity)
        out = []
        for rows in chunks:
            r = m.prefill(rows) if rows.ndim == 2 else m.step(rows)
            out.append((r.hidden.copy(), r.logits.copy(), m.kv_cache_snapshot()))
        m.clear_kv_cache()
        return out

    # ------------------------------------------------------------ contract
    def test_batching_capability_is_backed_by_methods(self, open_model):
        """A backend that declares more than one sequence per call implements the slot
        methods (the defaults only hold the one-slot case)."""
        m = open_model(CONFIG, self.batch_weight_type)
        n = m.capabilities.max_batch_sequences
        if not isinstance(n, int) or n < 1:
            fail(SLOT_METHODS, f"max_batch_sequences must be an int >= 1, got {n!r}")
        cls = type(m.backend)
        needed = []
        if n > 1:
            needed += ["allocate_kv_slots", "free_kv_slots", "read_kv_slot", "eval_slots",
                       "fast_decode_batch"] + (["write_kv_slot"]
                                               if m.capabilities.writes_kv_cache else [])
        if m.capabilities.shares_kv_prefix:
            needed += ["add_kv_prefix", "attach_kv_prefix"]
        missing = [name for name in needed if getattr(cls, name) is getattr(Backend, name)]
        if missing:
            fail(SLOT_METHODS, f"max_batch_sequences={n}, shares_kv_prefix="
                 f"{m.capabilities.shares_kv_prefix}, but {cls.__name__} does not override "
                 f"{', '.join(missing)} (Backend's defaults only serve one slot and share "
                 "nothing)")

    # ------------------------------------------------------------ numbers
    def test_slots_equal_sequences_alone(self, open_model):
        """Sequences of different lengths share calls (one's prefill beside the others'
        decode rows), leave, and their slots are reused: each gets the numbers it gets alone."""
        seqs = _sequences()
        alone = open_model(CONFIG, self.batch_weight_type)
        expected = [self._alone(alone, [prompt] + frames) for prompt, frames in seqs]

        m = open_model(CONFIG, self.batch_weight_type)
        b = BatchedModel(m)
        n_slots = self._slots(m, 3)
        b.init_slots(n_slots, 64)
        tol, kv_tol = output_tolerance(m.capabilities), kv_tolerance(m.capabilities)
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
            desc = _describe(b, pairs)
            results = _call(SLOTS_ALONE, f"eval({desc})", lambda: b.eval(pairs))
            calls += 1
            want = {slot: expected[i][done[i]] for slot, i in running.items()}
            for (slot, _), r in zip(pairs, results):
                i = running[slot]
                for what, out, ref in (("hidden", r.hidden, want[slot][0]),
                                       ("logits", r.logits, want[slot][1])):
                    err = _rel(out, ref) if np.all(np.isfinite(out)) else np.inf
                    if err > tol:
                        whose = [s for s, w in want.items()
                                 if s != slot and _rel(out, w[1 if what == "logits" else 0]) <= tol]
                        fail(SLOTS_ALONE, f"call {calls} ({desc}): slot {slot}'s {what} "
                             f"(sequence {i}, its call {done[i]}) differs from the sequence "
                             f"alone by {err:.2e} > {tol:.1e}" + (
                                 f"; it is slot {whose[0]}'s: results must come back in the "
                                 "order the slots were asked" if whose else ""))
                done[i] += 1
                if b.n_past(slot) != len(seqs[i][0]) + done[i] - 1:
                    fail(SLOTS_ALONE, f"slot {slot}: n_past {b.n_past(slot)} after "
                         f"{done[i]} calls of sequence {i}")
                if done[i] == len(seqs[i][1]) + 1:  # the sequence leaves
                    _kv_differs(SLOTS_ALONE, f"sequence {i}'s K/V in slot {slot} at its end, "
                                f"against the sequence alone", b.kv_slot_snapshot(slot),
                                want[slot][2], kv_tol)
                    del running[slot]
        if n_slots > 1:
            assert calls < sum(f + 1 for _, f in SEQUENCES), "sequences never shared a call"
        b.close()

    def test_slots_advance_by_their_own_rows(self, open_model):
        """Slots of different lengths in the same calls, not in slot order, one slot left
        out of a call: each call writes a slot's K/V at its own positions (those of its
        sequence alone), and a slot left out keeps its K/V bit for bit."""
        seqs = _sequences(seed=71)
        m = open_model(CONFIG, self.batch_weight_type)
        n_slots = self._slots(m, 3)
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
        expected = [self._alone(alone, chunks[s]) for s in range(n_slots)]
        b = BatchedModel(m)
        b.init_slots(n_slots, 64)
        tol_kv = kv_tolerance(m.capabilities)
        held = [0] * n_slots  # rows each slot has had
        k_of = [0] * n_slots  # chunks each slot has had
        for t, pairs in enumerate(calls):
            desc = _describe(b, pairs)
            left_out = [s for s in range(n_slots) if held[s] and s not in dict(pairs)]
            before = {s: b.kv_slot_snapshot(s) for s in left_out}
            _call(OWN_ROWS, f"call {t} ({desc})", lambda: b.eval(pairs))
            for s, rows in pairs:
                held[s] += len(rows)
                if b.n_past(s) != held[s]:
                    fail(OWN_ROWS, f"call {t} ({desc}): slot {s}'s n_past is {b.n_past(s)}, "
                         f"not the {held[s]} rows it was given")
                _kv_differs(OWN_ROWS, f"call {t} ({desc}): slot {s}'s K/V against its "
                            f"sequence alone", b.kv_slot_snapshot(s), expected[s][k_of[s]][2],
                            tol_kv, f" (this call's rows are positions [{held[s] - len(rows)}, "
                            f"{held[s]}))")
                k_of[s] += 1
            for s in left_out:
                _kv_differs(OWN_ROWS, f"call {t} ({desc}): slot {s}, left out of the call, "
                            f"changed", b.kv_slot_snapshot(s), before[s], 0)
        b.close()

    def test_slots_join_leave_and_are_reused(self, open_model):
        """A sequence leaves its slot and another joins it beside a neighbour that goes on;
        then the slot starts with a voice prefix, and is reset and reused without one: every
        sequence gets its numbers alone, and so does the neighbour."""
        seqs = _sequences(seed=81)
        m = open_model(CONFIG, self.batch_weight_type)
        caps = m.capabilities
        n_slots = self._slots(m, 2)
        voice = seqs[2][0][:10]
        m.init_kv_cache(32)
        m.prefill(voice)
        prefix = m.save_prefix()
        m.clear_kv_cache()
        first, neighbour, joiner, plain = seqs[1], seqs[0], seqs[3], seqs[2]
        alone = open_model(CONFIG, self.batch_weight_type)
        want = {name: self._alone(alone, [p] + f[:3])
                for name, (p, f) in (("first", first), ("joiner", joiner),
                                     ("plain", (plain[0][10:20], plain[1])))}
        want["neighbour"] = self._alone(alone, [neighbour[0]] + neighbour[1])  # 7 calls
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
                desc = _describe(b, pairs)
                got = _call(JOIN_LEAVE, f"{story}, call {t} ({desc})", lambda: b.eval(pairs))
                err = _rel(got[0].logits, want[name][t][1])
                if err > tol:
                    fail(JOIN_LEAVE, f"{story}, call {t} ({desc}): slot {slot}'s logits differ "
                         f"from {name} alone by {err:.2e} > {tol:.1e}")
                if len(got) > 1:
                    err = _rel(got[1].logits, want["neighbour"][nb["t"]][1])
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
            got = _call(JOIN_LEAVE, f"slot 0 with a {how} prefix, call {t}",
                        lambda: b.eval([(0, rows)]))
            err = _rel(got[0].logits, voiced[t])
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
        seqs = _sequences(seed=91)
        m = open_model(CONFIG, self.batch_weight_type)
        be, hp = m.backend, m.hparams
        n_slots = self._slots(m, 2)
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
        want = [self._alone(alone, [p, f], 8) for p, f in seqs]
        b = BatchedModel(m)
        _call(MAX_BATCH, f"max_batch_sequences={n}: init_slots({n}, 8)",
              lambda: b.init_slots(n, 8))
        tol = output_tolerance(m.capabilities)
        for t in range(2):
            pairs = [(s, seqs[s][t]) for s in range(n)]
            got = _call(MAX_BATCH, f"max_batch_sequences={n}: one call over {n} slots "
                        f"({'prefill' if t == 0 else 'one decode row each'})",
                        lambda: b.eval(pairs))
            for s, r in enumerate(got):
                err = _rel(r.logits, want[s][t][1])
                if not err <= tol:
                    fail(MAX_BATCH, f"max_batch_sequences={n}: in one call over {n} slots, "
                         f"slot {s}'s logits ({'prefill' if t == 0 else 'decode'}) differ "
                         f"from its sequence alone by {err:.2e} > {tol:.1e}")
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
                err = _rel(got[row], m.fast_decode(hiddens[src], codes[src, :k]))
                if not err <= tol:
                    fail(FAST_BATCH, f"{how}: row {row} after {k} codes differs from "
                         f"fast_decode of that row alone by {err:.2e} > {tol:.1e}")

        for k in range(hp.num_codebooks):  # extends the previous call (the incremental path)
            got = _call(FAST_BATCH, f"fast_decode of 3 rows after {k} codes",
                        lambda: b.fast_decode(hiddens, codes[:, :k]))
            check(got, [0, 1, 2], k, "each call extending the last")
        # a new call that does not extend the last one starts over
        check(b.fast_decode(hiddens[::-1], codes[::-1, :2]), [2, 1, 0], 2,
              "a call that does not extend the last")

    # ------------------------------------------------------------ checks
    def test_slot_bad_input_leaves_slots_unchanged(self, open_model):
        """The core's checks of BatchedModel (every backend gets them): each bad call raises
        its named check, and every slot's n_past and K/V stay as they were."""
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
                _kv_differs(SLOT_CHECKS, f"after the refused call ({check}), slot {s}",
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
        seqs = _sequences(seed=61)
        m = open_model(CONFIG, self.batch_weight_type)
        caps = m.capabilities
        prefix = self._voice(m, seqs[2][0][:14])
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
        want = "shared" if caps.shares_kv_prefix else (
            "written" if caps.writes_kv_cache else "recomputed")
        for first in range(0, len(plans), n_slots):
            group = plans[first:first + n_slots]
            idx = list(range(first, first + len(group)))
            for slot, (pre, _, _) in enumerate(group):
                b.reset_slot(slot)
                if pre is not None:
                    how = _call(SHARED_PREFIX, f"restore_prefix({slot}, a prefix of {p} "
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
                desc = _describe(b, pairs)
                for (slot, _), r in zip(pairs, _call(SHARED_PREFIX, f"eval({desc})",
                                                     lambda: b.eval(pairs))):
                    got[idx[slot]].append(r.logits.copy())
            for slot, i in enumerate(idx):
                want_logits, kv_ref = expected[i]
                story = f"plan {i} in slot {slot} ({'a ' + want if group[slot][0] else 'no'} " \
                        f"prefix of {p} positions)"
                for t, (lg, ref) in enumerate(zip(got[i], want_logits)):
                    err = _rel(lg, ref)
                    if not err <= tol:
                        fail(SHARED_PREFIX, f"{story}, call {t}: logits differ from "
                             f"restore_prefix + prefill alone by {err:.2e} > {tol:.1e}")
                _kv_differs(SHARED_PREFIX, f"{story}: K/V against the sequence alone",
                            b.kv_slot_snapshot(slot), kv_ref, kv_tol)
        b.close()

    def test_shared_prefix_unchanged_by_its_slots(self, open_model):
        """Slots that start with one voice prefix prefill and decode beside each other: the
        KVPrefix object, every slot's prefix positions and the numbers of a slot that starts
        with the prefix afterwards are those of the prefix before (a backend that shares it
        must never write into it)."""
        seqs = _sequences(seed=111)
        m = open_model(CONFIG, self.batch_weight_type)
        caps = m.capabilities
        prefix = self._voice(m, seqs[2][0][:14])
        p = prefix.n_positions
        k0, v0 = prefix.k, prefix.v  # copies
        rest = seqs[0][0][:6]
        m.init_kv_cache(64)
        m.restore_prefix(prefix)
        late_ref = m.prefill(rest).logits.copy()
        m.clear_kv_cache()
        n_slots = self._slots(m, 3)
        b = BatchedModel(m)
        b.init_slots(n_slots, 24 + (0 if caps.shares_kv_prefix else p))
        hows = [b.restore_prefix(s, prefix) for s in range(n_slots)]
        for t in range(3):  # different lengths, then decode rows
            pairs = [(s, seqs[s][0][:3 + 4 * s] if t == 0 else seqs[s][1][t - 1])
                     for s in range(n_slots)]
            desc = _describe(b, pairs)
            _call(PREFIX_UNCHANGED, f"eval({desc})", lambda: b.eval(pairs))
        if not (np.array_equal(prefix.k, k0) and np.array_equal(prefix.v, v0)):
            fail(PREFIX_UNCHANGED, "the KVPrefix's own K/V changed after its slots evaluated: "
                 "the backend wrote into the arrays add_kv_prefix was given")
        # a recomputed prefix is a prefill again: its numbers, not its bits
        exact = 0 if hows[0] != "recomputed" else kv_tolerance(caps)
        for s in range(n_slots):
            k, v = b.kv_slot_snapshot(s)
            _kv_differs(PREFIX_UNCHANGED, f"slot {s}'s first {p} positions (a {hows[s]} voice "
                        f"prefix, referenced by {n_slots} slots) after 3 calls",
                        (k[:, :p], v[:, :p]), (k0, v0), exact)
        last = n_slots - 1
        b.reset_slot(last)
        b.restore_prefix(last, prefix)
        got = _call(PREFIX_UNCHANGED, "a slot starting with the prefix after the others",
                    lambda: b.eval([(last, rest)]))
        err = _rel(got[0].logits, late_ref)
        if not err <= output_tolerance(caps):
            fail(PREFIX_UNCHANGED, f"slot {last}, starting with the {hows[0]} prefix after "
                 f"{n_slots} slots used it, differs from restore_prefix + prefill alone by "
                 f"{err:.2e} > {output_tolerance(caps):.1e}")
        b.close()

    # ------------------------------------------------------------ memory
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
                got = _call(SLOT_MEMORY, f"after the refused init_slots({want_slots}, "
                            f"{length}), reading slot {s} (allocate the new slots before "
                            f"dropping the old)", lambda: b.kv_slot_snapshot(s))
                _kv_differs(SLOT_MEMORY, f"after the refused init_slots({want_slots}, "
                            f"{length}), slot {s}", got, kv, 0)
        # the kept slots go on as a fresh set of slots given the same rows
        after = _call(SLOT_MEMORY, "the next call on the kept slots",
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
            many = _call(SERVED, f"generate_many of {len(prompts)} requests, {n} at a time",
                         lambda: generate_many(m, prompts, configs, max_sequences=n))
            for i, (a, g) in enumerate(zip(alone, many)):
                _same_codes(g, a, f"request {i} of {len(prompts)}, {n} at a time")
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
            if not (reqs[1].done and reqs[1].stats.stopped_by == CANCELLED):
                fail(SERVED, f"request 1, cancelled after 2 frames, ended by "
                     f"{reqs[1].stats.stopped_by!r}")
            _same_codes(reqs[1].codes(), alone[1][:, :2], "request 1, cancelled after 2 frames")
            for i in (0, 2):
                _same_codes(reqs[i].codes(), alone[i], f"request {i}, beside request 1 "
                            "cancelled after 2 frames")
        # on_frame returning False stops that request alone
        stop_at = {0: 3}
        many = generate_many(m, prompts, config,
                             on_frame=lambda r, j, f: not (j + 1 == stop_at.get(r)))
        _same_codes(many[0], alone[0][:, :3], "request 0, stopped by on_frame after 3 frames")
        for i in (1, 2):
            _same_codes(many[i], alone[i], f"request {i}, beside request 0 stopped by on_frame")

    def test_requests_share_a_voice_prefix(self, open_model):
        """Requests starting with the same KVPrefix give generate(prefix=...)'s codes."""
        seqs = _sequences(seed=41)
        m = open_model(CONFIG, self.batch_weight_type)
        voice = seqs[2][0][:12]
        prompts = [np.vstack([voice, p[:8]]) for p, _ in seqs[:3]]
        prefix = self._voice(m, voice)
        config = _greedy(4, min_tokens_before_end=4)
        alone = [generate(m, p, config, prefix=prefix) for p in prompts]
        with Server(m) as server:
            reqs = [server.submit(p, config, prefix=prefix) for p in prompts]
            _call(SERVED, "serving 3 requests in one voice", server.run)
            for i, r in enumerate(reqs):
                _same_codes(r.codes(), alone[i], f"request {i} of 3 in one voice")
                st = r.stats
                if (st.restored_positions, st.prefilled_positions, st.prefix_shared) != (
                        len(voice), 8, m.capabilities.shares_kv_prefix):
                    fail(SERVED, f"request {i}: restored {st.restored_positions} positions "
                         f"(voice {len(voice)}), prefilled {st.prefilled_positions} (8), "
                         f"prefix_shared {st.prefix_shared} (shares_kv_prefix "
                         f"{m.capabilities.shares_kv_prefix})")
