"""Random sequences of voice calls on KV slots (hypothesis's stateful testing): restore a
voice into a slot, reset a slot, evaluate a slot's next rows, on a NumPy backend (and a torch
one on the CPU) whose memory limit holds the slots and only part of the voices.

The machine keeps its own account: the rows behind each slot's positions and the voice each
slot references. After every call:
- the core's voices are exactly those the backend holds, and each slot is attached to the
  voice the core says (so a voice released is gone from the backend, and one in use is not);
- the slots and the voices held fit the limit, and no more voices are idle than kept;
- each slot's K/V are the float64 reference's for its rows (its voice's, then its own).
A voice is refused exactly when it would not fit even with every idle voice released, and
then nothing changes.

Bounded for CI: derandomized, a fixed number of runs and steps.
"""

from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from s2core.serving.batching import BatchedModel
from s2core.errors import CacheAllocationError
from s2core.modelfile.file import ModelFile
from s2core.kit.models import CONFIGS, kit_model, kit_reference
from s2core.kit.tolerances import kv_tolerance
from s2core.runtime.memory import backend_kv_cache_bytes
from s2core.runtime.model import SlowARModel
from s2core.kit.prompts import mixed_prompt

HP = CONFIGS["gqa4"]
RUNS = int(os.environ.get("S2CORE_STATEFUL_RUNS", "30"))
N_SLOTS, OWN = 2, 12                 # slots and the positions each holds after its voice
VOICE_LENGTHS = (4, 6, 8, 10)


def _limited_model(backend_cls, limit_positions: int, **options):
    """The kit's gqa4 model on a backend whose limit is `limit_positions` positions of K/V
    (the slots' and the voices')."""
    class Limited(backend_cls):
        def kv_cache_limit_bytes(self):
            return backend_kv_cache_bytes(self.hparams, limit_positions, self.capabilities)
    mf = ModelFile(kit_model("gqa4", "f32"))
    return SlowARModel(mf, Limited(mf, **options))


class NumpySlots:
    """What the NumPy backend holds: its voices' handles, and the handle each slot is
    attached to (None: no voice)."""

    @staticmethod
    def model(limit_positions: int):
        from s2core_numpy.backend import NumpyBackend
        return _limited_model(NumpyBackend, limit_positions)

    @staticmethod
    def handles(backend) -> list:
        return sorted(backend._slots.prefixes)

    @staticmethod
    def attached(backend) -> list:
        return list(backend._slots.attached)


class TorchSlots:
    """The same on the torch backend (the CPU), whose slots reference a SharedPrefix."""

    @staticmethod
    def model(limit_positions: int):
        from s2core_torch.backend import TorchBackend
        return _limited_model(TorchBackend, limit_positions, device="cpu")

    @staticmethod
    def handles(backend) -> list:
        return sorted(backend._prefixes.held)

    @staticmethod
    def attached(backend) -> list:
        held = backend._prefixes.held.items()
        return [next((h for h, p in held if p is c.prefix), None) for c in backend._slots]


class VoiceMachine(RuleBasedStateMachine):
    slots = NumpySlots

    @initialize(idle=st.sampled_from([0, 1, 8]), room=st.integers(10, 24))
    def load(self, idle, room):
        """Room for the slots and `room` positions of voices (one to three of them)."""
        self.model = self.slots.model(N_SLOTS * OWN + room)
        self.ref = kit_reference("gqa4", "f32")
        self.rng = np.random.default_rng(1)
        self.idle = idle
        self.voices, self.voice_rows = [], []
        for n in VOICE_LENGTHS:
            rows = mixed_prompt(HP, n, self.rng)
            self.model.init_kv_cache(n)
            self.model.prefill(rows)
            self.voices.append(self.model.save_prefix())
            self.voice_rows.append(rows)
        self.model.clear_kv_cache()
        self.b = BatchedModel(self.model, idle_voices=idle)
        self.b.init_slots(N_SLOTS, OWN)
        self.room = room
        self.voice_of: list[int | None] = [None] * N_SLOTS  # index into self.voices
        self.own: list[np.ndarray] = [np.zeros((0, HP.row_width), np.int64)] * N_SLOTS

    def teardown(self):
        if hasattr(self, "b"):
            self.b.close()
            self.model.close()

    def _rows(self, slot: int) -> np.ndarray:
        i = self.voice_of[slot]
        return self.own[slot] if i is None else np.vstack([self.voice_rows[i], self.own[slot]])

    def _state(self):
        b = self.b
        return (b.held_voices, self.slots.handles(self.model.backend),
                [(b.n_past(s), b.kv_slot_snapshot(s)) for s in range(N_SLOTS)])

    # ------------------------------------------------------------------ rules
    @rule(slot=st.integers(0, N_SLOTS - 1), i=st.integers(0, len(VOICE_LENGTHS) - 1))
    def restore(self, slot, i):
        voice = self.voices[i]
        held = any(v is voice for v in self.b.held_voices)
        in_use = {j for j in self.voice_of if j is not None}
        fits = held or sum(VOICE_LENGTHS[j] for j in in_use) + voice.n_positions <= self.room
        before = self._state()
        try:
            assert self.b.restore_prefix(slot, voice) == "shared"
        except CacheAllocationError:
            assert not fits, f"voice {i} refused with voices {sorted(in_use)} in use"
            (voices, handles, slots), after = before, self._state()
            assert after[0] == voices and after[1] == handles
            for (n, (k, v)), (n2, (k2, v2)) in zip(slots, after[2]):
                assert n == n2
                np.testing.assert_array_equal(k, k2)
                np.testing.assert_array_equal(v, v2)
            return
        assert fits, f"voice {i} accepted with voices {sorted(in_use)} in use"
        self.voice_of[slot] = i
        self.own[slot] = np.zeros((0, HP.row_width), np.int64)

    @rule(slot=st.integers(0, N_SLOTS - 1))
    def reset(self, slot):
        self.b.reset_slot(slot)
        self.voice_of[slot] = None
        self.own[slot] = np.zeros((0, HP.row_width), np.int64)

    @rule(slot=st.integers(0, N_SLOTS - 1), k=st.integers(1, 4))
    def evaluate(self, slot, k):
        if len(self.own[slot]) + k > OWN:
            return
        rows = mixed_prompt(HP, k, self.rng)
        self.b.eval([(slot, rows)])
        self.own[slot] = np.vstack([self.own[slot], rows])

    # ------------------------------------------------------------------ invariants
    @invariant()
    def the_backend_holds_the_cores_voices(self):
        if not hasattr(self, "b"):
            return
        backend, pool = self.model.backend, self.b._voices
        held = {id(v.prefix): v.handle for v in pool._voices.values()}  # LRU order untouched
        assert sorted(held.values()) == self.slots.handles(backend)
        attached = self.slots.attached(backend)
        for slot, i in enumerate(self.voice_of):
            want = None if i is None else held[id(self.voices[i])]
            assert attached[slot] == want, (slot, attached, want)

    @invariant()
    def the_voices_fit_and_few_are_idle(self):
        if not hasattr(self, "b"):
            return
        limit = self.model.backend.kv_cache_limit_bytes()
        slots = N_SLOTS * backend_kv_cache_bytes(HP, OWN, self.model.capabilities)
        assert slots + self.b.held_voice_bytes <= limit
        in_use = {id(self.voices[i]) for i in self.voice_of if i is not None}
        idle = [p for p in self.b.held_voices if id(p) not in in_use]
        assert len(idle) <= self.idle

    @invariant()
    def each_slot_holds_its_rows(self):
        if not hasattr(self, "b"):
            return
        tol = kv_tolerance(self.model.capabilities)
        for slot in range(N_SLOTS):
            rows = self._rows(slot)
            assert self.b.n_past(slot) == len(rows)
            if not len(rows):
                continue
            k, v = self.b.kv_slot_snapshot(slot)
            expected = self.ref.forward(rows)
            for got, want in ((k, expected.k), (v, expected.v)):
                err = np.linalg.norm(got - want) / np.linalg.norm(want)
                assert err <= tol, (slot, err)


VoiceMachine.TestCase.settings = settings(
    max_examples=RUNS, stateful_step_count=30, deadline=20000, derandomize=True,
    suppress_health_check=[HealthCheck.too_slow])
test_voice_state_machine = VoiceMachine.TestCase


class TorchVoiceMachine(VoiceMachine):
    slots = TorchSlots


TorchVoiceMachine.TestCase.settings = VoiceMachine.TestCase.settings
test_torch_voice_state_machine = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None, reason="torch is not installed")(
    TorchVoiceMachine.TestCase)
