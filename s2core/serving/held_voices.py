"""The voice prefixes a BatchedModel holds, which slot references which, and which to release.

A voice is held from the first slot that starts with it. On a backend that shares voice
prefixes (Capabilities.shares_kv_prefix) the backend holds its K/V once and each slot in that
voice references them; elsewhere the core keeps the K/V it converted once and copies them into
each slot (no slot references the voice afterwards). A voice that no slot references is idle:
it is kept, so that the next request in that voice finds it ready, until

- more voices are idle than the pool keeps (`idle_limit`), or
- a new voice would pass the memory limit: idle voices are then released least recently
  used first, just enough for the new one (and none when releasing every idle voice would
  not be enough).

This module only keeps the books; BatchedModel asks the backend to release (remove_kv_prefix).
The references are derived from one list (the voice of each slot), so they cannot drift from
what the slots hold.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["HeldVoice", "HeldVoices"]


@dataclass(eq=False)
class HeldVoice:
    """One voice held for the slots: shared (the backend's `handle`, `n_bytes` of K/V it
    holds, the voice's token rows) or converted (`k`, `v` in float32, copied into slots)."""

    prefix: Any
    handle: Any = None
    tokens: np.ndarray | None = None
    k: np.ndarray | None = None
    v: np.ndarray | None = None
    n_bytes: int = 0

    @property
    def shared(self) -> bool:
        return self.tokens is not None


class HeldVoices:
    """Voices by KVPrefix object, least recently used first, and the voice of each slot."""

    def __init__(self, idle_limit: int):
        self.idle_limit = idle_limit
        self._voices: OrderedDict[int, HeldVoice] = OrderedDict()  # by id(prefix)
        self._of_slot: list[HeldVoice | None] = []

    def reset(self, n_slots: int) -> None:
        """No voices, n_slots slots that reference none (the backend dropped them too)."""
        self._voices.clear()
        self._of_slot = [None] * n_slots

    def __len__(self) -> int:
        return len(self._voices)

    def prefixes(self) -> tuple[Any, ...]:
        """The KVPrefix of every voice held, least recently used first."""
        return tuple(v.prefix for v in self._voices.values())

    def get(self, prefix: Any) -> HeldVoice | None:
        """The voice held for this KVPrefix object, marked as the most recently used."""
        voice = self._voices.get(id(prefix))
        if voice is None or voice.prefix is not prefix:  # the voice holds its prefix: an id
            return None                                   # is not reused while it is held
        self._voices.move_to_end(id(prefix))
        return voice

    def add(self, voice: HeldVoice) -> None:
        self._voices[id(voice.prefix)] = voice

    def forget(self, voice: HeldVoice) -> None:
        assert self.references(voice) == 0, "a voice a slot references is never released"
        del self._voices[id(voice.prefix)]

    def set_slot(self, slot: int, voice: HeldVoice | None) -> None:
        """The slot now references `voice` (None: no voice, or a copy of one)."""
        self._of_slot[slot] = voice

    def references(self, voice: HeldVoice) -> int:
        return sum(v is voice for v in self._of_slot)

    def held_bytes(self) -> int:
        """What the backend holds for the shared voices (converted ones are host memory
        the core keeps, not the backend's: 0)."""
        return sum(v.n_bytes for v in self._voices.values())

    def idle(self) -> list[HeldVoice]:
        """Voices no slot references, least recently used first."""
        in_use = {id(v) for v in self._of_slot if v is not None}
        return [v for v in self._voices.values() if id(v) not in in_use]

    def beyond_idle_limit(self) -> list[HeldVoice]:
        """The least recently used idle voices past the `idle_limit` the pool keeps."""
        idle = self.idle()
        return idle[:max(len(idle) - self.idle_limit, 0)]

    def to_release_for(self, excess: int) -> list[HeldVoice] | None:
        """The fewest least recently used idle voices whose bytes reach `excess`, or None
        when all of them together do not (then nothing is to be released)."""
        chosen, freed = [], 0
        for voice in self.idle():
            if freed >= excess:
                break
            if voice.n_bytes:
                chosen.append(voice)
                freed += voice.n_bytes
        return chosen if freed >= excess else None
