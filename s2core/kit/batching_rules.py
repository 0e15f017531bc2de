"""The batching rules of the conformance kit (s2core/kit/batching.py and
s2core/kit/voices_serving.py): their names, and what the tests share.

Each batching test checks one rule and fails with a message that starts with the rule's name
(BATCHING_RULES) and gives the numbers (which slot, which positions, by how much), as the
rules of s2core/kit/rules.py do.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from s2core.serving.batching import BatchedModel
from s2core.generation.loop import GenerationConfig
from s2core.kit.prompts import mixed_prompt, semantic_frame

from s2core.kit import rules
from s2core.kit.models import CONFIGS

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
VOICE_RELEASED = "a-released-voice-frees-only-itself"
SERVED = "served-requests-equal-generate"
SLOT_SNAPSHOTS = "slot-snapshots-are-copies"
VOICE_HELD_ONCE = "a-shared-voice-is-held-once"

#: rule name -> what it says (contract.md section 9 lists them)
BATCHING_RULES = {
    SLOT_METHODS: "a backend declaring max_batch_sequences > 1 overrides the slot methods, "
                  "and one declaring shares_kv_prefix overrides add_kv_prefix, "
                  "attach_kv_prefix and remove_kv_prefix",
    SLOTS_ALONE: "each slot of a call gets the hidden, logits and K/V of its sequence run "
                 "alone (chunked-prefill tolerance), returned in the order the slots were "
                 "asked, whatever its neighbours hold",
    OWN_ROWS: "a call writes each slot's K/V at that slot's own positions [n_past, n_past + "
              "its rows): slots of different lengths do not move each other, and a slot "
              "left out of a call keeps its K/V bit for bit",
    JOIN_LEAVE: "a slot reset and reused starts its new sequence as a new slot would (from "
                "position 0, or after the voice prefix it is given), keeping nothing of the "
                "last one, and its neighbours go on unchanged",
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
    VOICE_RELEASED: "a voice no slot references, released by the core (remove_kv_prefix), "
                    "frees its memory, and every other voice and slot stays bit for bit as "
                    "it was; the voice added again later gives the same numbers",
    SLOT_SNAPSHOTS: "kv_slot_snapshot() (read_kv_slot) returns float32 copies: later calls "
                    "do not change one, and changing one changes neither the slot nor a later "
                    "snapshot",
    VOICE_HELD_ONCE: "with shares_kv_prefix declared, N slots in one voice take the bytes of "
                     "the N slots plus one voice (the core counts that against the memory "
                     "limit): attaching a voice copies none of it",
    SERVED: "the server's requests give generate()'s codes under greedy sampling, joining "
            "and leaving, beside cancelled neighbours and in a shared voice; sampled ones "
            "repeat by seed",
}


def fail(rule: str, message: str) -> None:
    rules.fail(rule, message, BATCHING_RULES)


def checked_call(rule: str, what: str, call: Callable[[], Any]) -> Any:
    """call(); anything it raises breaks `rule` (a crash is no answer to a valid call)."""
    try:
        return call()
    except Exception as exc:  # noqa: BLE001 - reported as the rule it breaks
        fail(rule, f"{what} raised {type(exc).__name__}: {exc}")


def rel_err(out, ref) -> float:
    out, ref = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    return float(np.linalg.norm(out - ref) / np.linalg.norm(ref))


def worst_position(got: np.ndarray, ref: np.ndarray) -> tuple[int, float]:
    """The position (axis 1 of [n_layer, n, heads, dim]) where got is furthest from ref,
    relatively, and that error."""
    diff = np.asarray(got, np.float64) - np.asarray(ref, np.float64)
    num = np.sqrt((diff ** 2).sum(axis=(0, 2, 3)))
    den = np.sqrt((np.asarray(ref, np.float64) ** 2).sum(axis=(0, 2, 3)))
    errs = num / np.maximum(den, 1e-30)
    pos = int(np.argmax(errs))
    return pos, float(errs[pos])


def kv_differs(rule: str, what: str, got: tuple[np.ndarray, np.ndarray],
                ref: tuple[np.ndarray, np.ndarray], tol: float, why: str = "") -> None:
    """got's K and V equal ref's within tol (0: bit for bit), or fail naming the position."""
    for name, g, r in (("K", got[0], ref[0]), ("V", got[1], ref[1])):
        if g.shape != r.shape:
            fail(rule, f"{what}: {name} has shape {g.shape}, expected {r.shape}{why}")
        bad = not np.array_equal(g, r) if tol == 0 else rel_err(g, r) > tol
        if bad:
            pos, err = worst_position(g, r)
            bound = "bit for bit" if tol == 0 else f"bound {tol:.1e}"
            fail(rule, f"{what}: {name} differs ({bound}; overall {rel_err(g, r):.2e}), most "
                       f"at position {pos} of {r.shape[1]} (relative error {err:.2e}){why}")


def sequences(seed: int = 11):
    hp = CONFIGS[CONFIG]
    rng = np.random.default_rng(seed)
    return [(mixed_prompt(hp, n, rng), [semantic_frame(hp, rng) for _ in range(f)])
            for n, f in SEQUENCES]


def greedy(max_new_tokens: int, **kw) -> GenerationConfig:
    return GenerationConfig(max_new_tokens=max_new_tokens, im_end_id=IM_END, temperature=0,
                            seed=0, **kw)


def same_codes(got: np.ndarray, want: np.ndarray, what: str) -> None:
    if got.shape != want.shape or not np.array_equal(got, want):
        frames = min(got.shape[-1], want.shape[-1]) if got.ndim == want.ndim == 2 else 0
        first = next((t for t in range(frames) if not np.array_equal(got[:, t], want[:, t])),
                     frames)
        fail(SERVED, f"{what}: codes {got.shape} differ from generate()'s {want.shape}, "
                     f"first at frame {first}")


def describe_call(b: BatchedModel, pairs) -> str:
    """'slot 0: 12 rows at n_past 0, slot 1: 1 row at n_past 9' (before the call)."""
    return ", ".join(f"slot {s}: {len(np.atleast_2d(rows))} row(s) at n_past {b.n_past(s)}"
                     for s, rows in pairs)


def n_slots_for(m, wanted: int) -> int:
    """`wanted` slots, or as many as the backend evaluates in one call."""
    return min(wanted, m.capabilities.max_batch_sequences)


def alone_run(m, chunks: list[np.ndarray], capacity: int = 64):
    """Each chunk's (hidden, logits) and the K/V after it, the sequence alone on m (a 2-D
    chunk is prefilled, a frame stepped)."""
    m.init_kv_cache(capacity)
    out = []
    for rows in chunks:
        r = m.prefill(rows) if rows.ndim == 2 else m.step(rows)
        out.append((r.hidden.copy(), r.logits.copy(), m.kv_cache_snapshot()))
    m.clear_kv_cache()
    return out


def voice_prefix(m, rows: np.ndarray):
    """The KVPrefix of `rows` prefilled on m (whose cache is then freed)."""
    m.init_kv_cache(len(rows))
    m.prefill(rows)
    prefix = m.save_prefix()
    m.clear_kv_cache()
    return prefix
