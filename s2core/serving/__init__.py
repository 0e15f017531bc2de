"""Serving several requests from one process: continuous batching over KV slots.

    from s2core.serving import Server, generate_many
    codes = generate_many(model, [prompt_a, prompt_b, prompt_c], GenerationConfig(seed=0))

    with Server(model, max_sequences=4) as server:
        requests = [server.submit(p, config, prefix=voice) for p in prompts]
        for frame in requests[0]:      # streams; the other requests advance in the same steps
            ...

See server.py for what one step does. A request's codes are what generate() gives it alone
(always under greedy sampling; see request.py for when float32 rounding may differ).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from s2core.errors import InvalidInputError
from s2core.generation.loop import GenerationConfig
from s2core.runtime.model import SlowARModel
from s2core.serving.batching import BatchedModel
from s2core.serving.request import CANCELLED, FAILED, Request
from s2core.serving.server import Server

__all__ = ["Server", "Request", "BatchedModel", "generate_many", "CANCELLED", "FAILED"]


def generate_many(model: SlowARModel, prompts: Sequence[Any],
                  config: GenerationConfig | Sequence[GenerationConfig] = GenerationConfig(),
                  max_sequences: int | None = None, prefixes: Sequence[Any] | None = None,
                  on_frame: Callable[[int, int, np.ndarray], Any] | None = None,
                  max_seq_len: int | None = None) -> list[np.ndarray]:
    """Each prompt's codes [num_codebooks, frames], generated together with continuous
    batching (at most max_sequences at a time; None = as many as the backend evaluates in one
    call). `config`: one for all, or one per prompt (each request samples with its own
    generator, seeded by its config, exactly as generate()). `prefixes`: None, or one
    KVPrefix (or None) per prompt; requests with the same prefix object share its converted
    K/V. `on_frame(request_index, frame_index, codes)`: returning False cancels that request.
    `max_seq_len`: each slot's capacity in positions (None: the context length; a slot's K/V
    is allocated whole, so a smaller one costs less memory and allocation time). Every
    request is checked before any runs."""
    prompts = list(prompts)
    if not prompts:
        raise InvalidInputError("prompts", "generate_many needs at least one prompt")
    n = len(prompts)
    configs = [config] * n if isinstance(config, GenerationConfig) else list(config)
    prefixes = [None] * n if prefixes is None else list(prefixes)
    for name, values in (("config", configs), ("prefixes", prefixes)):
        if len(values) != n:
            raise InvalidInputError(name, f"{len(values)} {name} for {n} prompts")
    if not isinstance(model, SlowARModel):
        raise InvalidInputError("model", f"model must be an s2core model (s2core.load), got "
                                f"{type(model).__name__}")
    # at most what the backend evaluates in one call (one on a backend without batching:
    # the requests then run one after another), and no more slots than requests
    limit = min(model.capabilities.max_batch_sequences, n)
    if max_sequences is None:
        max_sequences = limit
    elif isinstance(max_sequences, (int, np.integer)) and not isinstance(max_sequences, bool) \
            and max_sequences >= 1:
        max_sequences = min(int(max_sequences), limit)
    server = Server(model, max_sequences=max_sequences, max_seq_len=max_seq_len)  # checks the rest
    try:
        requests = []
        for i, (p, c, x) in enumerate(zip(prompts, configs, prefixes)):
            cb = None if on_frame is None else (lambda j, f, i=i: on_frame(i, j, f))
            requests.append(server.submit(p, c, prefix=x, on_frame=cb))
        server.run()
        return [r.codes() for r in requests]
    finally:
        server.close()
