"""Several independent sequences on one loaded model: KV slots, each with its own n_past.

    batched = BatchedModel(model)                  # model: s2core.load(...)
    batched.init_slots(n_slots=4, max_seq_len=512)
    a, b = batched.eval([(0, prompt_a), (1, prompt_b)])     # one backend call
    a, b = batched.eval([(0, frame_a), (1, frame_b)])       # one decode row per slot
    logits = batched.fast_decode([a.hidden, b.hidden], [[3, 7], [1, 2]])  # (2, codebook)

A backend that declares `Capabilities.max_batch_sequences` > 1 evaluates all the rows of a
call with one read of each weight (`Backend.eval_slots`); every other backend has one slot on
its single-sequence cache, and the core serves its sequences one after another
(s2core.serving). The rules are the model object's (contract.md 5), per slot: every check runs
before any change, and a slot's n_past advances only after the backend call succeeded.

The batched model takes over the backend's cache: on a one-slot backend the slot is the
model's own cache, so `init_slots` frees the model's cache and the model's single-sequence
calls must not be used until `free_slots()`.

Voice prefixes (`restore_prefix`) are held for the slots and released when no slot references
them any more: kept idle for the next request in that voice, at most `idle_voices` of them,
and released least recently used first when a new voice would pass the memory limit
(s2core/serving/held_voices.py).
"""

from __future__ import annotations

import functools
import weakref
from typing import Any, Callable, Sequence, TypeVar

import numpy as np

from s2core.contract import inputs
from s2core.contract.inputs import is_integer
from s2core.errors import (BackendError, CacheAllocationError, CacheNotInitializedError,
                           CacheOverflowError, InvalidInputError, ModelBusyError, S2CoreError,
                           backend_call)
from s2core.serving.held_voices import HeldVoice, HeldVoices
from s2core.runtime.fast_session import FastSession, fast_incremental
from s2core.runtime.memory import backend_kv_cache_bytes, describe_bytes
from s2core.runtime.model import Result, SlowARModel

__all__ = ["BatchedModel"]

F = TypeVar("F", bound=Callable[..., Any])


def _guarded(method: F) -> F:
    """Run a BatchedModel method under its model's guard (s2core/runtime/guard.py): calls from
    several threads take turns with each other and with the model's own, a stream holding the
    model makes them raise ModelBusyError, and a closed model ModelClosedError."""
    what = f"BatchedModel.{method.__name__}()"
    allow_closed = method.__name__ in ("free_slots", "close")

    @functools.wraps(method)
    def wrapper(self, *args: Any, **kwargs: Any) -> Any:
        with self.model._guard.call(what, allow_closed=allow_closed):
            return method(self, *args, **kwargs)
    return wrapper  # type: ignore[return-value]


#: voices no slot references that a BatchedModel keeps for their next request by default
IDLE_VOICES = 8


class BatchedModel:
    """KV slots on a loaded `SlowARModel`'s backend (see the module's docstring).

    idle_voices: how many voice prefixes no slot references are kept (least recently used
    released first); 0 releases a voice as soon as its last slot is reset or reused."""

    def __init__(self, model: SlowARModel, idle_voices: int = IDLE_VOICES):
        if not isinstance(model, SlowARModel):
            raise InvalidInputError("model", f"model must be an s2core model (s2core.load), "
                                    f"got {type(model).__name__}")
        if not is_integer(idle_voices) or idle_voices < 0:
            raise InvalidInputError("idle_voices", f"idle_voices must be an int >= 0, got "
                                    f"{idle_voices!r}")
        self.model = model
        self.backend = model.backend
        self.hparams = model.hparams
        self._n_past: list[int] = []
        self._shared: list[int] = []  # per slot: positions of the shared prefix it references
        self._rows: list[list[np.ndarray]] = []
        self._max_seq_len: int | None = None
        self._fast: FastSession | None = None
        self._voices = HeldVoices(int(idle_voices))

    # ------------------------------------------------------------------ state
    @property
    def max_batch_sequences(self) -> int:
        """How many slots this backend evaluates in one call (its capabilities)."""
        return self.backend.capabilities.max_batch_sequences

    @property
    def n_slots(self) -> int:
        return len(self._n_past)

    @property
    def max_seq_len(self) -> int | None:
        """Each slot's capacity in positions it holds itself, or None when no slots are
        allocated. A slot that references a shared prefix (restore_prefix -> "shared") holds
        only the positions after it: it reaches that prefix's length + max_seq_len."""
        return self._max_seq_len

    def shared_positions(self, slot: int) -> int:
        """Positions of the shared prefix the slot references (0 without one)."""
        return self._shared[self._check_slot(slot)]

    @property
    @_guarded
    def held_voices(self) -> tuple[Any, ...]:
        """The KVPrefix of every voice held for the slots, least recently used first."""
        return self._voices.prefixes()

    @property
    @_guarded
    def held_voice_bytes(self) -> int:
        """The bytes of K/V the backend holds for shared voices (as the limit counts them)."""
        return self._voices.held_bytes()

    @_guarded
    def n_past(self, slot: int) -> int:
        return self._n_past[self._check_slot(slot)]

    @_guarded
    def init_slots(self, n_slots: int, max_seq_len: int) -> None:
        """Allocate n_slots zeroed caches of max_seq_len positions; every n_past = 0.

        Slots larger than the backend can hold raise CacheAllocationError before anything is
        allocated, as does an allocation that fails; either way the previous slots (or the
        model's cache) stay as they were."""
        for name, value in (("n_slots", n_slots), ("max_seq_len", max_seq_len)):
            if not is_integer(value):
                raise InvalidInputError(f"{name}_type", f"{name} must be an int, got {value!r}")
        n_slots, max_seq_len = int(n_slots), int(max_seq_len)
        cap = self.max_batch_sequences
        if not 1 <= n_slots <= cap:
            raise InvalidInputError("n_slots_range", f"n_slots must be in [1, "
                                    f"max_batch_sequences={cap}] for backend "
                                    f"{self.backend.name!r}, got {n_slots}")
        ctx = self.hparams.context_length
        if not 0 < max_seq_len <= ctx:
            raise InvalidInputError("max_seq_len_range", f"max_seq_len must be in [1, "
                                    f"context_length={ctx}], got {max_seq_len}")
        self.model._guard.check_no_stream("BatchedModel.init_slots()")  # its cache stays
        self._check_no_other_owner("init_slots")
        self._allocate(n_slots, max_seq_len)  # keeps the previous slots if it raises
        self.model._slot_owner = weakref.ref(self)
        if cap == 1:
            self.model._forget_cache()  # the one slot replaced the model's cache
        else:
            self.model.clear_kv_cache()
        self._max_seq_len = max_seq_len
        self._n_past = [0] * n_slots
        self._shared = [0] * n_slots
        self._rows = [[] for _ in range(n_slots)]
        self._fast = None
        self._voices.reset(n_slots)  # the backend's new slots hold no voice

    def _other_owner(self) -> "BatchedModel | None":
        """Another live BatchedModel holding this model's slots, if any."""
        ref = self.model._slot_owner
        owner = ref() if ref is not None else None
        if owner is None or owner is self or owner._max_seq_len is None:
            return None
        return owner

    def _check_no_other_owner(self, what: str) -> None:
        """The backend holds one set of slots: a second BatchedModel allocating its own would
        drop the first's in the middle of its requests. An owner whose slots hold no sequence
        (every n_past 0: idle) gives them up: it allocates again when it next needs them."""
        owner = self._other_owner()
        if owner is not None and not any(owner._n_past) and not any(owner._shared):
            owner.free_slots()
            owner = None
        if owner is not None:
            raise ModelBusyError(
                f"BatchedModel.{what}(): another BatchedModel on {self.model.model_file.path} "
                f"holds the backend's KV slots ({owner.n_slots} slots, n_past={owner._n_past});"
                f" call its free_slots() or close() first, or load the model a second time")

    def _calling(self, call: str):
        """The context of one backend call: its exceptions become s2core errors naming it."""
        return backend_call(self.backend.name, call)

    def _allocate(self, n_slots: int, max_seq_len: int) -> None:
        """The slots' memory, checked against the limit init_kv_cache uses (the backend's
        kv_cache_limit_bytes) before the backend is asked: CacheAllocationError naming the
        sizes, the previous slots (or cache) kept."""
        need = n_slots * backend_kv_cache_bytes(self.hparams, max_seq_len,
                                                self.backend.capabilities)
        with self._calling("kv_cache_limit_bytes"):
            limit = self.backend.kv_cache_limit_bytes()
        if limit is not None and need > limit:
            raise CacheAllocationError(self._allocation_message(
                n_slots, max_seq_len, need, f"more than the {describe_bytes(limit)} backend "
                f"{self.backend.name!r} can allocate here"))
        try:
            self.backend.allocate_kv_slots(n_slots, max_seq_len)
        except S2CoreError:
            raise
        except NotImplementedError as exc:  # not a memory failure (a RuntimeError)
            raise BackendError(self.backend.name, "allocate_kv_slots", exc) from exc
        except Exception as exc:  # noqa: BLE001 - third-party code: any failure is this one
            raise CacheAllocationError(self._allocation_message(
                n_slots, max_seq_len, need, f"the allocation failed: {type(exc).__name__}: "
                f"{str(exc)[:300]}")) from exc

    def _allocation_message(self, n_slots: int, max_seq_len: int, need: int, why: str) -> str:
        hp = self.hparams
        held = self.backend.capabilities.kv_cache_held_dtype
        kept = ("no slots were allocated before" if self._max_seq_len is None else
                f"the previous {self.n_slots} slots (max_seq_len={self._max_seq_len}, n_past="
                f"{self._n_past}) are kept")
        return (f"init_slots({n_slots}, {max_seq_len}): {n_slots} slots of K and V, each "
                f"{hp.n_layer} layers x {max_seq_len} positions x {hp.n_head_kv} KV heads x "
                f"{hp.head_dim} in {held}, take {describe_bytes(need)}, {why}; {kept}")

    @_guarded
    def reset_slot(self, slot: int) -> None:
        """The slot starts a new sequence (n_past = 0); its rows are overwritten as it goes."""
        slot = self._check_slot(slot)
        if self.backend.capabilities.shares_kv_prefix:
            with self._calling(f"attach_kv_prefix({slot}, None)"):
                self.backend.attach_kv_prefix(slot, None)
        self._n_past[slot] = self._shared[slot] = 0
        self._rows[slot] = []
        self._voices.set_slot(slot, None)
        self._release_idle()

    @_guarded
    def free_slots(self) -> None:
        """Release the slots' memory (allowed at any time; a closed model has none). Another
        BatchedModel's slots are left alone: this one then holds nothing to free."""
        if not self.model.closed and self._other_owner() is None:
            with self._calling("free_kv_slots"):
                self.backend.free_kv_slots()
            self.model._slot_owner = None
        self._max_seq_len = None
        self._n_past, self._shared, self._rows, self._fast = [], [], [], None
        self._voices.reset(0)  # free_kv_slots dropped them

    @_guarded
    def kv_slot_snapshot(self, slot: int) -> tuple[np.ndarray, np.ndarray]:
        """Copies of the slot's K and V for positions < its n_past (as kv_cache_snapshot)."""
        slot = self._check_slot(slot)
        with self._calling(f"read_kv_slot({slot}, {self._n_past[slot]})"):
            return self.backend.read_kv_slot(slot, self._n_past[slot])

    @_guarded
    def token_rows(self, slot: int) -> np.ndarray:
        slot = self._check_slot(slot)
        rows = self._rows[slot]
        if not rows:
            return np.zeros((0, self.hparams.row_width), dtype=np.int64)
        return np.concatenate(rows)[:self._n_past[slot]]

    # ------------------------------------------------------------------ compute
    @_guarded
    def eval(self, requests: Sequence[tuple[Any, ...]]) -> list[Result]:
        """One backend call over (slot, token rows) pairs with distinct slots: each slot's rows
        continue its sequence. Returns the Result of each pair's last position, in order.
        A request may be (slot, token rows, logit_rows): its Result's logits cover those
        token ids only (SlowARModel.prefill says how)."""
        batches = self._prepare(requests)
        caps = self.model.capabilities
        computed = [inputs.batch_for_backend(b, caps) for _, b in batches]
        with self._calling(f"eval_slots({len(batches)} slots)"):
            outs = self.backend.eval_slots([(slot, c) for (slot, _), c in zip(batches, computed)])
        if len(outs) != len(batches):
            raise S2CoreError(f"backend {self.backend.name!r}: eval_slots returned "
                              f"{len(outs)} results for {len(batches)} slots")
        results = []
        for (slot, batch), c, (hidden, logits) in zip(batches, computed, outs):  # after success
            self._n_past[slot] += batch.n_tokens
            self._rows[slot].append(inputs.batch_rows(batch, self.hparams))
            results.append(Result(hidden, logits, batch.n_tokens, self.backend,
                                  batch.logit_rows, c.logit_rows))
        return results

    @_guarded
    def fast_decode(self, hiddens: Any, prefix_codes: Any) -> np.ndarray:
        """Fast-AR logits (B, codebook_size) of B sequences: row b is
        model.fast_decode(hiddens[b], prefix_codes[b]). Every row has the same number of codes
        (one codebook of a frame for every slot). Calls that extend the previous call's codes
        for the same hiddens only append (same numbers)."""
        if self.hparams.fast is None:
            raise S2CoreError(f"{self.model.model_file.path} has no Fast-AR "
                              f"(architecture {self.hparams.architecture!r})")
        hiddens = self._hiddens(hiddens)
        codes = self._prefixes(prefix_codes, hiddens.shape[0])
        be = self.backend
        if be.incremental_fast_decode_batch:
            logits = self._fast_incremental(hiddens, codes)
            with self._calling("to_numpy"):
                return be.to_numpy(logits)
        if be.capabilities.max_batch_sequences == 1 and be.incremental_fast_decode:
            # one row at a time through the model's own incremental session
            return np.stack([self.model.fast_decode(h, c) for h, c in zip(hiddens, codes)])
        with self._calling("fast_decode_batch"):
            return np.asarray(be.to_numpy(be.fast_decode_batch(hiddens, codes)), np.float32)

    def _fast_incremental(self, hiddens: np.ndarray, codes: np.ndarray) -> Any:
        session, self._fast = self._fast, None  # stays dropped if the backend raises
        be = self.backend

        def extend(state: Any, new: np.ndarray, logits: Any = None) -> tuple[Any, Any]:
            for c in range(new.shape[1]):  # the batched calls take one code per row
                with self._calling("fast_extend_batch"):
                    state, logits = be.fast_extend_batch(state, new[:, c])
            return state, logits

        def start(new: np.ndarray) -> tuple[Any, Any]:
            with self._calling("fast_begin_batch"):
                state, logits = be.fast_begin_batch(hiddens)
            return extend(state, new, logits)

        self._fast, logits = fast_incremental(session, hiddens, codes, start, extend)
        return logits

    # ------------------------------------------------------------------ voice prefix
    @_guarded
    def restore_prefix(self, slot: int, prefix: Any) -> str:
        """The slot's positions [0, n) become the prefix's, n_past = n (the model's
        restore_prefix for one slot). How, by the backend's capabilities: "shared" (the
        prefix's K/V are held once by the backend, for every slot that starts with this
        prefix object, and referenced by the slot), "written" (converted once, copied into
        the slot) or "recomputed" (prefilled again).

        A voice the backend is to hold that it does not hold already is checked against
        kv_cache_limit_bytes() with the slots and the voices held. If it does not fit, the
        idle voices (no slot references them) are released, least recently used first, just
        enough to make room. If even releasing all of them would not be enough, it raises
        CacheAllocationError naming the bytes, and nothing has changed (this slot, the
        others, their n_past, the voices held). If the backend's own allocation fails it
        raises CacheAllocationError too, the slots as they were; idle voices released to
        make room for it stay released."""
        slot = self._check_slot(slot)
        caps = self.backend.capabilities
        voice = self._voices.get(prefix)
        if voice is None:
            # a shared prefix is not in the slot: its positions count against the context
            self.model.check_prefix(prefix, self.hparams.context_length
                                    if caps.shares_kv_prefix else self._max_seq_len)
        if caps.shares_kv_prefix:
            if voice is None:
                voice = self._add_voice(slot, prefix)
            try:
                with self._calling(f"attach_kv_prefix({slot}, a voice)"):
                    self.backend.attach_kv_prefix(slot, voice.handle)
            except BaseException:
                # the slot's former voice stays referenced: the backend may still hold it
                self._n_past[slot], self._shared[slot], self._rows[slot] = 0, 0, []
                raise
            self._n_past[slot] = self._shared[slot] = prefix.n_positions
            self._rows[slot] = [voice.tokens]
            self._voices.set_slot(slot, voice)
            self._release_idle()
            return "shared"
        if not caps.writes_kv_cache:
            self.reset_slot(slot)
            self.eval([(slot, prefix.tokens)])
            return "recomputed"
        if voice is None:
            voice = HeldVoice(prefix, k=prefix.k, v=prefix.v)  # converted to float32 once
            self._voices.add(voice)
        self.write_prefix_kv(slot, prefix, voice.k, voice.v)
        return "written"

    def _add_voice(self, slot: int, prefix: Any) -> HeldVoice:
        """Have the backend hold a new voice's K/V (once, for every slot that starts with it),
        after checking the memory it adds against kv_cache_limit_bytes() with the slots and
        the voices held, and releasing idle voices if that makes room (see restore_prefix)."""
        need = self._voice_bytes(prefix)
        held = self._held_bytes()
        with self._calling("kv_cache_limit_bytes"):
            limit = self.backend.kv_cache_limit_bytes()
        release: list[HeldVoice] = []
        if limit is not None and held + need > limit:
            idle = self._voices.idle()
            chosen = self._voices.to_release_for(held + need - limit)
            if chosen is None:
                raise CacheAllocationError(self._voice_message(
                    slot, prefix, need, held, f"more than the {describe_bytes(limit)} backend "
                    f"{self.backend.name!r} can allocate here", idle=idle))
            release = chosen
            for voice in release:
                self._release(voice)
            held = self._held_bytes()
        try:
            handle = self.backend.add_kv_prefix(prefix.k, prefix.v)
        except S2CoreError:
            raise
        except NotImplementedError as exc:  # not a memory failure (a RuntimeError)
            raise BackendError(self.backend.name, "add_kv_prefix", exc) from exc
        except Exception as exc:  # noqa: BLE001 - third-party code: any failure is this one
            raise CacheAllocationError(self._voice_message(
                slot, prefix, need, held, f"the allocation failed: {type(exc).__name__}: "
                f"{str(exc)[:300]}", released=len(release))) from exc
        tokens = prefix.tokens.copy()  # one copy per voice, as its K/V
        tokens.flags.writeable = False
        voice = HeldVoice(prefix, handle=handle, tokens=tokens, n_bytes=need)
        self._voices.add(voice)
        return voice

    def _release(self, voice: HeldVoice) -> None:
        """Forget a voice no slot references; the backend frees what it held for it."""
        if voice.shared:
            with self._calling("remove_kv_prefix"):
                self.backend.remove_kv_prefix(voice.handle)
        self._voices.forget(voice)

    def _release_idle(self) -> None:
        """Release the least recently used idle voices past the number kept."""
        for voice in self._voices.beyond_idle_limit():
            self._release(voice)

    def _voice_bytes(self, prefix: Any) -> int:
        """What the backend holds for one shared voice: its K/V in the held cache type."""
        return backend_kv_cache_bytes(self.hparams, prefix.n_positions,
                                      self.backend.capabilities)

    def _held_bytes(self) -> int:
        """The slots' K/V and the shared voices held, as the backend holds them."""
        slots = self.n_slots * backend_kv_cache_bytes(self.hparams, self._max_seq_len or 0,
                                                      self.backend.capabilities)
        return slots + self._voices.held_bytes()

    def _voice_message(self, slot: int, prefix: Any, need: int, held: int, why: str,
                       idle: Sequence[HeldVoice] = (), released: int = 0) -> str:
        hp = self.hparams
        n_voices = len(self._voices)
        freeable = (f"; releasing the {len(idle)} voice(s) no slot uses "
                    f"({describe_bytes(sum(v.n_bytes for v in idle))}) would not make room"
                    if idle else "")
        kept = (f"the slots (n_past={self._n_past}) and the voices held are kept"
                if not released else f"the slots (n_past={self._n_past}) are kept; "
                f"{released} voice(s) no slot used were released to make room for it")
        return (f"restore_prefix({slot}, a voice prefix of {prefix.n_positions} positions): "
                f"its K and V, held once for every slot in that voice, {hp.n_layer} layers x "
                f"{prefix.n_positions} positions x {hp.n_head_kv} KV heads x {hp.head_dim} in "
                f"{self.backend.capabilities.kv_cache_held_dtype}, take "
                f"{describe_bytes(need)}; with the {self.n_slots} slots and {n_voices} "
                f"voice(s) held ({describe_bytes(held)}) that is {describe_bytes(held + need)}, "
                f"{why}{freeable}; {'nothing changed: ' if not released else ''}{kept}")

    @_guarded
    def write_prefix_kv(self, slot: int, prefix: Any, k: np.ndarray, v: np.ndarray) -> None:
        """Copy a prefix's float32 K/V (already converted) into the slot: restore_prefix's
        "written" form. The caller has run model.check_prefix."""
        try:
            with self._calling(f"write_kv_slot({slot}, {len(k[0]) if len(k) else 0} positions)"):
                self.backend.write_kv_slot(slot, k, v)
        except BaseException:
            self._n_past[slot], self._shared[slot], self._rows[slot] = 0, 0, []
            raise
        self._n_past[slot], self._shared[slot] = prefix.n_positions, 0
        self._rows[slot] = [prefix.tokens.copy()]
        self._voices.set_slot(slot, None)  # write_kv_slot detached a shared voice
        self._release_idle()

    # ------------------------------------------------------------------ checks
    def _require_slots(self) -> int:
        if self._max_seq_len is None:
            raise CacheNotInitializedError("no KV slots: call init_slots(n_slots, max_seq_len) "
                                           "before evaluating")
        return self._max_seq_len

    def _check_slot(self, slot: Any) -> int:
        self._require_slots()
        if not is_integer(slot):
            raise InvalidInputError("slot_type", f"a slot must be an int, got {slot!r}")
        if not 0 <= slot < self.n_slots:
            raise InvalidInputError("slot_range", f"slot {slot} is outside [0, n_slots="
                                    f"{self.n_slots})")
        return int(slot)

    def _prepare(self, requests: Sequence[tuple[int, Any]]) -> list[tuple[int, Any]]:
        """Every check of eval, before anything changes: the (slot, batch) pairs."""
        capacity = self._require_slots()
        pairs = []
        try:
            for request in requests:
                request = tuple(request)
                if len(request) not in (2, 3):
                    raise TypeError
                pairs.append((*request, None)[:3])
        except (TypeError, ValueError):
            raise InvalidInputError("slot_requests", "eval takes a sequence of (slot, token "
                                    "rows) pairs or (slot, token rows, logit_rows) "
                                    "triples") from None
        if not pairs:
            raise InvalidInputError("slot_requests", "eval needs at least one (slot, tokens) "
                                    "pair")
        seen: set[int] = set()
        batches = []
        for slot, tokens, rows in pairs:
            slot = self._check_slot(slot)
            rows = inputs.logit_rows(rows, self.hparams)
            if slot in seen:
                raise InvalidInputError("slot_duplicate", f"slot {slot} appears twice in one "
                                        "call: each slot's rows must be one contiguous batch")
            seen.add(slot)
            mat = inputs.token_matrix(tokens, None, self.hparams)
            n_past, shared = self._n_past[slot], self._shared[slot]
            if n_past - shared + len(mat) > capacity:
                held = f"n_past ({n_past}) - shared prefix ({shared})" if shared else \
                    f"n_past ({n_past})"
                raise CacheOverflowError("capacity", f"slot {slot}: {held} + n_tokens "
                                         f"({len(mat)}) = {n_past - shared + len(mat)} exceeds "
                                         f"the slot capacity max_seq_len={capacity}")
            ctx = self.hparams.context_length
            if n_past + len(mat) > ctx:
                raise CacheOverflowError("context_length", f"slot {slot}: n_past ({n_past}) + "
                                         f"n_tokens ({len(mat)}) = {n_past + len(mat)} exceeds "
                                         f"context_length={ctx}")
            batches.append((slot, inputs.make_batch(mat, n_past, self.hparams, rows)))
        return batches

    def _hiddens(self, hiddens: Any) -> np.ndarray:
        if isinstance(hiddens, (list, tuple)):
            hiddens = [self.backend.to_numpy(h) if not isinstance(h, (np.ndarray, list, tuple))
                       else h for h in hiddens]
        try:
            arr = np.asarray(hiddens)
        except (TypeError, ValueError):
            raise InvalidInputError("hiddens_shape", "hiddens must be a (B, dim) array") from None
        if arr.ndim != 2 or arr.shape[1] != self.hparams.dim or arr.shape[0] == 0:
            raise InvalidInputError("hiddens_shape", f"hiddens must have shape (B, "
                                    f"{self.hparams.dim}) with B >= 1, got {arr.shape}")
        if arr.dtype.kind not in "fiu":
            raise InvalidInputError("hidden_dtype", f"hiddens must hold real numbers, got "
                                    f"{arr.dtype}")
        return np.ascontiguousarray(arr, dtype=np.float32)

    def _prefixes(self, prefix_codes: Any, b: int) -> np.ndarray:
        try:
            arr = np.asarray(prefix_codes)
        except (TypeError, ValueError):
            raise InvalidInputError("prefix_shape", "prefix codes must be a (B, k) array of "
                                    "integers") from None
        if arr.size == 0:
            arr = np.zeros((b, 0), dtype=np.int64)
        if arr.ndim != 2 or arr.shape[0] != b:
            raise InvalidInputError("prefix_shape", f"prefix codes must have shape (B={b}, k), "
                                    f"got {arr.shape}")
        for row in arr:  # the single-sequence checks (range, dtype, length), row by row
            inputs.prefix_codes(row, self.hparams)
        return arr.astype(np.int64)

    # ------------------------------------------------------------------ life cycle
    @_guarded
    def close(self) -> None:
        self.free_slots()

    def __enter__(self) -> "BatchedModel":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"BatchedModel(backend={self.backend.name!r}, n_slots={self.n_slots}, "
                f"max_seq_len={self._max_seq_len}, n_past={self._n_past})")
