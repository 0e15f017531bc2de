"""The state an exact streaming decode carries between pushes, for every backend's codec.

A push needs, from the past, only the last inputs of each causal op (a conv of effective
kernel Ke needs Ke - stride rows; an overlapping transposed conv needs one), the post_module's
K/V of the last window - 1 frames and the next RoPE position (CODEC.md 4, "Why decode can
stream"). `DecodeState` holds them, framework-neutral; `HistoryPass` is one push's view of it:
an op asks for its input with the rows before it on top, and the pass remembers the last rows
for the next push. Backends say only how their arrays are padded, joined and cut along time.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class DecodeState:
    """What the next push needs from the past; never modified (a push returns a new one)."""

    #: frames decoded so far: the RoPE position of the next one
    position: int
    #: the last input rows of each causal op, by op name (absent = zeros: a fresh stream)
    history: dict
    #: post_module K/V per layer after RoPE, at most window - 1 frames (backend arrays)
    kv: tuple

    @classmethod
    def fresh(cls) -> "DecodeState":
        return cls(position=0, history={}, kv=())


class HistoryPass(ABC):
    """One push: reads the old histories, collects the new ones."""

    def __init__(self, state: DecodeState):
        self.old = state.history
        self.new: dict[str, Any] = {}

    def extend(self, name: str, x: Any, rows: int) -> Any:
        """x with the `rows` inputs before it prepended along time (zeros at the start of a
        stream); remembers x's last `rows` inputs for the next push."""
        if rows == 0:
            return x
        hist = self.old.get(name)
        joined = self.join(self.zeros(x, rows) if hist is None else hist, x)
        self.new[name] = self.last(joined, rows)
        return joined

    def state(self, position: int, kv: tuple) -> DecodeState:
        """The state after this push."""
        return DecodeState(position, self.new, kv)

    # ---------------------------------------------------------------- per framework
    @abstractmethod
    def zeros(self, x: Any, rows: int) -> Any:
        """`rows` steps of silence shaped like x's time steps."""

    @abstractmethod
    def join(self, before: Any, x: Any) -> Any:
        """`before` then x, along time."""

    @abstractmethod
    def last(self, x: Any, rows: int) -> Any:
        """x's last `rows` time steps, as an array that later pushes cannot change."""
