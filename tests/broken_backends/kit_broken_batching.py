"""Backends that each break one batching rule of the contract (contract.md section 9), for
tests/test_kit_catches_broken.py.

Each is the NumPy backend (or, for the capability, the example backend) with one fault
added, the kind a backend that serves several sequences at once gets wrong: everything else
is correct, so the kit must name the one rule (s2core/kit/batching.py, BATCHING_RULES).
"""

from __future__ import annotations

import dataclasses

import numpy as np
from s2core_example.backend import ExampleBackend
from s2core_example.plugin import CAPABILITIES
from s2core_numpy.backend import NumpyBackend

BATCH_DECLARED = dataclasses.replace(CAPABILITIES, max_batch_sequences=4)
SHARES_DECLARED = dataclasses.replace(CAPABILITIES, shares_kv_prefix=True)


def _at(batch, n_past: int):
    """The batch moved to start at n_past (positions are all a backend reads of it)."""
    return dataclasses.replace(batch, positions=n_past + np.arange(batch.n_tokens))


class DeclaresBatchingWithoutMethods(ExampleBackend):
    """Declares four sequences per call and keeps Backend's one-slot slot methods."""

    @property
    def capabilities(self):
        return BATCH_DECLARED


class DeclaresSharingWithoutMethods(ExampleBackend):
    """Declares shared voice prefixes without add_kv_prefix / attach_kv_prefix."""

    @property
    def capabilities(self):
        return SHARES_DECLARED


class ResultsInSlotOrder(NumpyBackend):
    """Returns the results sorted by slot, not in the order the slots were asked."""

    def eval_slots(self, batches):
        outs = super().eval_slots(batches)
        return [out for _, out in sorted(zip([s for s, _ in batches], outs),
                                         key=lambda pair: pair[0])]


class CountsTheCallsRows(NumpyBackend):
    """Keeps its own position per slot and advances every slot of a call by all the rows of
    the call (not by its own): slots of different lengths write at the wrong positions."""

    def eval_slots(self, batches):
        pos = self.__dict__.setdefault("_pos", {})
        starts = {s: pos[s] if b.n_past and s in pos else b.n_past for s, b in batches}
        total = sum(b.n_tokens for _, b in batches)
        for s, start in starts.items():
            pos[s] = start + total
        return super().eval_slots([(s, _at(b, starts[s])) for s, b in batches])


class KeepsPositionsOnReuse(NumpyBackend):
    """Keeps its own position per slot, advanced by the slot's own rows, and resets it only
    when the slots are allocated: a slot reused for a new sequence goes on where the old one
    ended."""

    def allocate_kv_slots(self, n_slots, max_seq_len):
        super().allocate_kv_slots(n_slots, max_seq_len)
        self._pos = [0] * n_slots

    def attach_kv_prefix(self, slot, handle):
        super().attach_kv_prefix(slot, handle)
        if handle is not None:
            self._pos[slot] = self._slots.prefixes[handle][0].shape[2]

    def eval_slots(self, batches):
        moved = [(s, _at(b, self._pos[s])) for s, b in batches]
        for s, b in batches:
            self._pos[s] += b.n_tokens
        return super().eval_slots(moved)


class KeepsPrefixAfterReset(NumpyBackend):
    """Ignores attach_kv_prefix(slot, None): a slot reset after a voice prefix keeps it."""

    def attach_kv_prefix(self, slot, handle):
        if handle is not None:
            super().attach_kv_prefix(slot, handle)


class AliasSlotResults(NumpyBackend):
    """Copies each slot's hidden and logits into buffers that every call reuses."""

    def eval_slots(self, batches):
        outs = super().eval_slots(batches)
        bufs = self.__dict__.setdefault("_bufs", [])
        while len(bufs) < len(outs):
            bufs.append(tuple(np.empty_like(x) for x in outs[0]))
        for (h, lg), (bh, blg) in zip(outs, bufs):
            bh[:], blg[:] = h, lg
        return bufs[:len(outs)]


class AliasBatchedFastLogits(NumpyBackend):
    """The batched Fast-AR's logits in a buffer that every call reuses."""

    def fast_extend_batch(self, state, codes):
        state, logits = super().fast_extend_batch(state, codes)
        if getattr(self, "_fast_buf", None) is None or self._fast_buf.shape != logits.shape:
            self._fast_buf = np.empty_like(logits)
        self._fast_buf[:] = logits
        return state, self._fast_buf


class FourSlotsAtMost(NumpyBackend):
    """Declares NumPy's max_batch_sequences but allocates at most four slots (a kernel
    written for four rows)."""

    def allocate_kv_slots(self, n_slots, max_seq_len):
        super().allocate_kv_slots(min(n_slots, 4), max_seq_len)


class FastBatchFirstRowCodes(NumpyBackend):
    """The batched Fast-AR embeds the first row's code for every row (a broadcast gone
    wrong)."""

    def fast_extend_batch(self, state, codes):
        return super().fast_extend_batch(state, np.full_like(codes, codes[0]))


class WritesIntoSharedPrefix(NumpyBackend):
    """Holds a voice prefix writable and, off by one, stores each slot's first own position
    in the prefix's last row: every slot in that voice sees it changed."""

    def add_kv_prefix(self, k, v):
        handle = super().add_kv_prefix(k, v)
        self._slots.prefixes[handle] = tuple(c.copy() for c in self._slots.prefixes[handle])
        return handle

    def eval_slots(self, batches):
        outs = super().eval_slots(batches)
        for s, _ in batches:
            h = self._slots.attached[s]
            if h is not None:
                for own, shared in zip((self._slots.k, self._slots.v), self._slots.prefixes[h]):
                    shared[:, :, -1] = own[s, :, :, 0]
        return outs


class LosesSlotsOnFailedInit(NumpyBackend):
    """States no memory limit and drops the slots held before allocating new ones: an
    allocation that fails leaves none."""

    def kv_cache_limit_bytes(self):
        return None

    def allocate_kv_slots(self, n_slots, max_seq_len):
        self._slots = None
        super().allocate_kv_slots(n_slots, max_seq_len)


class ReadsOwnRowsOnly(NumpyBackend):
    """read_kv_slot of a slot that references a shared prefix returns the slot's own rows
    only, not the prefix's before them."""

    def read_kv_slot(self, slot, n_positions):
        h = self._slots.attached[slot]
        if h is None:
            return super().read_kv_slot(slot, n_positions)
        own = n_positions - self._slots.prefixes[h][0].shape[2]
        return tuple(c[slot, :, :, :own].transpose(0, 2, 1, 3).copy()
                     for c in (self._slots.k, self._slots.v))


class RemovesAnotherVoice(NumpyBackend):
    """remove_kv_prefix drops the first voice it holds, not the one it is given (an index
    mixed up with a handle): a slot still in that voice loses it."""

    def remove_kv_prefix(self, handle):
        del self._slots.prefixes[min(self._slots.prefixes)]


class KeepsRemovedVoice(NumpyBackend):
    """remove_kv_prefix does nothing: the voice's memory stays held while the core counts
    it as free for the next voice."""

    def remove_kv_prefix(self, handle):
        pass
