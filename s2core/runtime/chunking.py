"""The chunked-prefill policy of SPEC section 4, as pure functions of input and capabilities.

It reads a backend's declared capabilities only, never its name, so a new backend gets the
right behaviour by declaring what it is.
"""

from __future__ import annotations

from s2core.contract.backend import Capabilities
from s2core.errors import InvalidInputError

#: s2.cpp's materialization budget: positions x accelerated layers per graph
CHUNK_BUDGET = 128
CHUNK_MIN, CHUNK_MAX = 8, 64


def prefill_chunk_size(n_tokens: int, n_semantic: int, caps: Capabilities,
                       override: int | None = None) -> int:
    """How many positions each eval_cached call of a prefill takes (n_tokens = no chunking).

    1. accelerator, more than one semantic position, and the backend requires single-token
       semantic prefill: 1;
    2. accelerator: clamp(128 // accelerated layers, 8, 64) when the prompt is longer;
    3. CPU: no chunking.
    `override` (a positive int) replaces the policy, for tests and for users who know better.
    """
    if override is not None:
        if isinstance(override, bool) or not isinstance(override, int) or override <= 0:
            raise InvalidInputError("chunk_size", f"chunk_size must be a positive int, got {override!r}")
        return min(override, n_tokens)
    if not caps.accelerator:
        return n_tokens
    if n_semantic > 1 and caps.requires_single_token_semantic_prefill:
        return 1
    layers = max(1, caps.n_accelerated_layers or 0)
    chunk = min(max(CHUNK_BUDGET // layers, CHUNK_MIN), CHUNK_MAX)
    return chunk if n_tokens > chunk else n_tokens


def chunk_bounds(n_tokens: int, chunk: int) -> list[tuple[int, int]]:
    """[start, stop) of each chunk, in order, covering 0..n_tokens."""
    return [(s, min(s + chunk, n_tokens)) for s in range(0, n_tokens, chunk)]
