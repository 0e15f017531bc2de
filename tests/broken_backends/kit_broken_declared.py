"""Backends that break the rules issue 22's third-party author found the kit missing: lies in
the capabilities the core sizes memory and picks backends by, foreign exceptions, and state
shared or handed out where only copies may go. Each is NumPy's or the example's backend with
one fault, for tests/test_kit_catches_broken.py.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from s2core_example.backend import ExampleBackend
from s2core_example.plugin import CAPABILITIES
from s2core_numpy.backend import NumpyBackend


class CacheStorageUnderstated(NumpyBackend):
    """Holds its f16 cache in float32 (f16-rounded values, as NumPy's backend once did) but
    declares it held as f16: the memory limit and `s2core info` count half the bytes it
    takes."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._round = self.kv_dtype == np.float16
        self.kv_dtype = np.float32  # the cache (and slots) in float32

    def eval_cached(self, batch):
        out = super().eval_cached(batch)
        if self._round:  # the rows this call wrote, f16-rounded once it has read them
            rows = slice(batch.n_past, batch.n_past + batch.n_tokens)
            for c in (self._k, self._v):
                c[:, :, rows] = c[:, :, rows].astype(np.float16)
        return out

    @property
    def capabilities(self):
        return dataclasses.replace(super().capabilities, kv_cache_storage_dtype=None)


class ClaimsMappedButCopies(NumpyBackend):
    """Declares f16 and q8_0 kept as stored and mapped from the file, but packs or widens
    them into copies at load: auto-selection prefers it, `info` halves what it holds. (It
    computes with arithmetic="f32", where NumPy packs F16 matrices into its tiled layout;
    with "ggml" NumPy maps them, as it declares then.)"""

    def __init__(self, model_file, **options):
        super().__init__(model_file, **{**options, "arithmetic": "f32"})

    @property
    def capabilities(self):
        native = frozenset({"f32", "f16", "q8_0"})
        return dataclasses.replace(super().capabilities, native_weight_types=native,
                                   mapped_weight_types=native, native_weight_overhead=())


class SharesPrefixButCopies(NumpyBackend):
    """Declares shares_kv_prefix, and keeps a private copy of the voice in each slot that
    attaches it."""

    def attach_kv_prefix(self, slot, handle):
        super().attach_kv_prefix(slot, handle)
        copies = vars(self).setdefault("_voice_copies", {})
        copies[slot] = None if handle is None else \
            tuple(c.copy() for c in self._slots.prefixes[handle])


def _invalid(caps, **fields):
    """A Capabilities object holding values its own checks refuse (set past __post_init__)."""
    caps = dataclasses.replace(caps)
    for name, value in fields.items():
        object.__setattr__(caps, name, value)
    return caps


class LoadedCacheTypeF12(ExampleBackend):
    """Its probe is valid; the loaded backend declares kv_cache_dtype='f12'."""

    @property
    def capabilities(self):
        return _invalid(CAPABILITIES, kv_cache_dtype="f12")


class LoadedNegativeBatch(ExampleBackend):
    """Its probe is valid; the loaded backend declares max_batch_sequences=-3."""

    @property
    def capabilities(self):
        return _invalid(CAPABILITIES, max_batch_sequences=-3)


class KeyErrorInAllocate(ExampleBackend):
    """allocate_kv_cache looks its cache type up in a table that lacks it: a KeyError."""

    def allocate_kv_cache(self, max_seq_len):
        raise KeyError("f32")


class IndexErrorInEval(ExampleBackend):
    """eval_cached indexes past a table sized for the prompt: steps after 8 positions raise
    IndexError on valid input."""

    def eval_cached(self, batch):
        if batch.n_tokens == 1 and batch.n_past > 8:
            raise IndexError(f"index {batch.n_past} is out of bounds for axis 0 with size 8")
        return super().eval_cached(batch)


#: module-global scratch every instance writes its hidden state through
_SCRATCH = {}


class GlobalScratchHidden(ExampleBackend):
    """Passes hidden through a module-global buffer: two models in two threads read each
    other's. Logits and K/V are each instance's own, so only hidden shows it. The sleep
    stands for a device call that releases the GIL."""

    def eval_cached(self, batch):
        hidden, logits = super().eval_cached(batch)
        _SCRATCH["hidden"] = hidden
        time.sleep(0.002)
        return _SCRATCH["hidden"].copy(), logits


class SlotSnapshotViews(NumpyBackend):
    """read_kv_slot hands out views of the live slot (the slot has no voice here)."""

    def read_kv_slot(self, slot, n_positions):
        s = self._slots
        return tuple(c[slot, :, :, :n_positions].transpose(0, 2, 1, 3) for c in (s.k, s.v))


class BatchedDrift(NumpyBackend):
    """Batched results drift by 1e-3 from the sequence alone: under the f16 cache's 2e-3
    output bound, over what greedy codes equal to generate()'s allow."""

    def eval_slots(self, batches):
        return [(h * np.float32(1 + 1e-3), lg * np.float32(1 + 1e-3))
                for h, lg in super().eval_slots(batches)]
