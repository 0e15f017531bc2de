"""Conformance of releasing a voice prefix (part of BackendConformance, through
VoiceAndServingConformance): a voice no slot references any more is released by the core
(BatchedModel, idle_voices=0: at once), which on a backend that shares voices calls
remove_kv_prefix. The release must free that voice's memory and nothing else: the same calls
with the voice kept give the same bits.

The memory is measured with tracemalloc, which sees what NumPy arrays hold; on a backend whose
voices it does not see (their memory is a device's or a framework's own), only the numbers
are checked.
"""

from __future__ import annotations

import tracemalloc
from typing import Any

import numpy as np

from s2core.serving.batching import BatchedModel

from s2core.kit.batching_rules import (CONFIG, VOICE_RELEASED, checked_call, fail, n_slots_for,
                             sequences, voice_prefix)

#: a voice whose adding grew traced memory by less than this share of its bytes is not held
#: where tracemalloc sees it; a release must give back at least this share of them
TRACED_SHARE = 0.9


class _Run:
    """One pass of the release scenario on a BatchedModel: every result and K/V read, in
    order, and (when `measure`) what traced memory did while voice C was added and released."""

    def __init__(self, m, idle_voices: int, measure: bool):
        self.b = BatchedModel(m, idle_voices=idle_voices)
        self.measure = measure
        self.outputs: list[tuple[str, np.ndarray]] = []
        self.added = self.freed = self.voice_bytes = 0

    def call(self, what: str, pairs) -> None:
        b = self.b
        for (slot, _), r in zip(pairs, checked_call(VOICE_RELEASED, what,
                                                    lambda: b.eval(pairs))):
            self.outputs += [(f"{what}: slot {slot}'s hidden", r.hidden.copy()),
                             (f"{what}: slot {slot}'s logits", r.logits.copy())]

    def read(self, what: str, slot: int) -> None:
        k, v = checked_call(VOICE_RELEASED, f"{what}: kv_slot_snapshot({slot})",
                            lambda: self.b.kv_slot_snapshot(slot))
        self.outputs += [(f"{what}: slot {slot}'s K", k), (f"{what}: slot {slot}'s V", v)]

    def release(self, what: str, slot: int) -> None:
        """reset_slot(slot): its voice has no slot left (released at once by idle_voices=0)."""
        before = self.b.held_voice_bytes
        measure = self.measure and tracemalloc.is_tracing()
        traced = tracemalloc.get_traced_memory()[0]
        checked_call(VOICE_RELEASED, f"{what}: reset_slot({slot})",
                     lambda: self.b.reset_slot(slot))
        if measure:
            self.freed = traced - tracemalloc.get_traced_memory()[0]
            self.voice_bytes = before - self.b.held_voice_bytes

    def restore(self, what: str, slot: int, prefix: Any) -> None:
        measure = self.measure and tracemalloc.is_tracing()
        traced = tracemalloc.get_traced_memory()[0]
        checked_call(VOICE_RELEASED, f"{what}: restore_prefix({slot}, ...)",
                     lambda: self.b.restore_prefix(slot, prefix))
        if measure:
            self.added = tracemalloc.get_traced_memory()[0] - traced


class VoiceReleaseConformance:
    """Mixed into VoiceAndServingConformance; uses BackendConformance's `open_model`
    fixture and `batch_weight_type`."""

    def _release_scenario(self, m, voices, seqs, idle_voices: int, measure: bool) -> _Run:
        """A keeper slot in voice B goes on while the other slot is in voice A, is reset
        (A released), takes voice C, is reset (C released, measured) and takes A again."""
        a, b_voice, c = voices
        n_slots = n_slots_for(m, 2)
        keeper = 1 if n_slots > 1 else None
        run = _Run(m, idle_voices, measure)
        p = max(v.n_positions for v in voices)
        run.b.init_slots(n_slots, 24 + (0 if m.capabilities.shares_kv_prefix else p))
        with_keeper = (lambda pairs, rows: pairs + [(keeper, rows)]) if keeper else (
            lambda pairs, rows: pairs)
        if keeper:
            run.restore("the keeper in voice B", keeper, b_voice)
        run.restore("slot 0 in voice A", 0, a)
        run.call("voice A's and B's prompts", with_keeper([(0, seqs[0][0][:6])], seqs[1][0][:5]))
        run.release("slot 0 reset: voice A has no slot", 0)
        if keeper:
            run.read("after voice A was released", keeper)
        own_trace = measure and not tracemalloc.is_tracing()
        if own_trace:
            tracemalloc.start()
        try:
            run.restore("slot 0 in voice C", 0, c)
            run.call("voice C's prompt", with_keeper([(0, seqs[2][0][:4])], seqs[1][1][0]))
            run.release("slot 0 reset: voice C has no slot", 0)
        finally:
            if own_trace:
                tracemalloc.stop()
        if keeper:
            run.read("after voice C was released", keeper)
        run.restore("slot 0 in voice A again", 0, a)
        run.call("voice A again", with_keeper([(0, seqs[3][0][:5])], seqs[1][1][1]))
        for slot in ([0, keeper] if keeper else [0]):
            run.read("at the end", slot)
        run.b.close()
        return run

    def test_a_released_voice_frees_only_itself(self, open_model):
        """Voices released as soon as no slot references them (idle_voices=0) against the
        same calls with every voice kept: the same bits, for the slot that stays in its voice
        all along and for a voice added again after its release; and on a backend that
        shares voices, the memory traced while a voice was held is given back."""
        seqs = sequences(seed=71)
        m = open_model(CONFIG, self.batch_weight_type)
        voices = [voice_prefix(m, seqs[2][0][:10]), voice_prefix(m, seqs[0][0][:12]),
                  voice_prefix(m, seqs[2][0][:30])]
        shares = m.capabilities.shares_kv_prefix
        kept = self._release_scenario(m, voices, seqs, idle_voices=8, measure=False)
        released = self._release_scenario(m, voices, seqs, idle_voices=0, measure=shares)
        for (what, got), (_, want) in zip(released.outputs, kept.outputs):
            if got.shape != want.shape or not np.array_equal(got, want):
                diff = (float(np.max(np.abs(np.asarray(got, np.float64) - want)))
                        if got.shape == want.shape else float("nan"))
                fail(VOICE_RELEASED, f"{what}: with the voices released as their last slot "
                     f"left it differs from the same calls with every voice kept (shape "
                     f"{got.shape} against {want.shape}, largest difference {diff:.3e}); a "
                     f"release must change nothing but the memory of the voice released")
        n = released.voice_bytes
        if n and released.added >= TRACED_SHARE * n and released.freed < TRACED_SHARE * n:
            fail(VOICE_RELEASED, f"voice C ({voices[2].n_positions} positions, {n} bytes as "
                 f"the core counts them) grew the memory traced by {released.added} bytes "
                 f"when it was added, but its release (remove_kv_prefix) gave back only "
                 f"{released.freed}: the core counts those bytes as free for the next voice")
