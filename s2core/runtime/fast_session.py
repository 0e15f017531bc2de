"""The Fast-AR sequences a frame's calls share: B rows (B = 1 for a model's own fast_decode,
one per slot for a BatchedModel's), the hidden values and codes each holds and the backend's
state (K/V of those positions). A call that extends the previous one's codes for the same
hiddens only appends the new codes; any other call starts over. Same numbers either way."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np


class FastSession:
    """What the last call left: hiddens (B, dim) float32 values, codes (B, n) int64, and the
    backend's state."""

    def __init__(self, hiddens: np.ndarray, state: Any):
        # a copy of the values: the caller may change its array (numpy or native) in place
        self.hiddens = np.array(hiddens, dtype=np.float32, copy=True)
        self.codes = np.zeros((self.hiddens.shape[0], 0), dtype=np.int64)
        self.state = state

    def continues(self, hiddens: np.ndarray, codes: np.ndarray) -> bool:
        """`codes` strictly extends every row's codes, for hiddens of the same values."""
        n = self.codes.shape[1]
        return (hiddens.shape == self.hiddens.shape and codes.shape[1] > n
                and np.array_equal(codes[:, :n], self.codes)
                and np.array_equal(hiddens, self.hiddens))


def fast_incremental(session: FastSession | None, hiddens: np.ndarray, codes: np.ndarray,
                     start: Callable[[np.ndarray], tuple[Any, Any]],
                     extend: Callable[[Any, np.ndarray], tuple[Any, Any]]
                     ) -> tuple[FastSession, Any]:
    """The logits after `codes` (B, n) for `hiddens` (B, dim), and the session to keep.
    start(codes): a new state holding the hiddens and these codes, and its logits;
    extend(state, new_codes (B, k)): the state with k more codes, and its logits."""
    if session is None or not session.continues(hiddens, codes):
        state, logits = start(codes)
        session = FastSession(hiddens, state)
    else:
        session.state, logits = extend(session.state, codes[:, session.codes.shape[1]:])
    session.codes = codes.copy()
    return session, logits
