"""The Slow-AR model object users hold: validation, n_past and the KV cache's life cycle.

prefill(), prefill_fast() and step() all end in one eval_cached(); the backend behind it does
the math. Every check runs before anything changes, and n_past advances only after success,
so a failed call leaves the model exactly as it was. Every public method runs under the
model's guard (s2core/runtime/guard.py): calls from several threads take turns, a stream holds the
model against other threads, and a closed model refuses every call.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from s2core.contract import inputs
from s2core.contract.backend import Backend, Capabilities
from s2core.runtime.chunking import chunk_bounds, prefill_chunk_size
from s2core.errors import (CacheAllocationError, CacheNotInitializedError, CacheOverflowError,
                     InvalidInputError, PrefixMismatchError, S2CoreError, backend_call)
from s2core.modelfile.file import ModelFile
from s2core.runtime.fast_session import FastSession, fast_incremental
from s2core.runtime.guard import ModelGuard, guarded
from s2core.modelfile.hparams import Hparams
from s2core.contract.inputs import EvalBatch, LogitRows, batch_for_backend, pick_logit_rows
from s2core.runtime.memory import backend_kv_cache_bytes, describe_bytes

if TYPE_CHECKING:
    from s2core.runtime.prefix import KVPrefix, ModelIdentity


class Result:
    """hidden and logits of the last position of one call.

    `.hidden` / `.logits` are host float32 numpy arrays, converted once on first access;
    `.hidden_native` / `.logits_native` are the backend's own arrays (a torch tensor, an mlx
    array), so a generation loop can stay on the device.

    `.logit_rows` is what `.logits` covers: None for the whole vocabulary, or the
    `LogitRows` the call asked for (then `.logits[i]` is the logit of `logit_rows.ids[i]`).
    `.logits_native` holds the rows the backend computed: those, where it declares
    `Capabilities.logit_rows`, else the whole vocabulary.
    """

    __slots__ = ("hidden_native", "logits_native", "n_tokens", "logit_rows", "_native_rows",
                 "_backend", "_hidden", "_logits")

    def __init__(self, hidden_native: Any, logits_native: Any, n_tokens: int, backend: Backend,
                 logit_rows: LogitRows | None = None, native_rows: LogitRows | None = None):
        self.hidden_native = hidden_native
        self.logits_native = logits_native
        self.n_tokens = n_tokens
        self.logit_rows = logit_rows
        self._native_rows = native_rows
        self._backend = backend
        self._hidden: np.ndarray | None = None
        self._logits: np.ndarray | None = None

    @property
    def hidden(self) -> np.ndarray:
        if self._hidden is None:
            with backend_call(self._backend.name, "to_numpy"):
                self._hidden = self._backend.to_numpy(self.hidden_native)
        return self._hidden

    @property
    def logits(self) -> np.ndarray:
        if self._logits is None:
            with backend_call(self._backend.name, "to_numpy"):
                native = self._backend.to_numpy(self.logits_native)
            self._logits = pick_logit_rows(native, self._native_rows, self.logit_rows)
        return self._logits

    def __repr__(self) -> str:
        return f"Result(n_tokens={self.n_tokens}, backend={self._backend.name!r})"


class SlowARModel:
    """A loaded S2 Pro Slow-AR (+ Fast-AR) on one backend. Create it with `s2core.load()`."""

    def __init__(self, model_file: ModelFile, backend: Backend):
        self.model_file = model_file
        self.backend = backend
        self.hparams: Hparams = model_file.hparams
        self._capabilities = backend.capabilities  # frozen; still readable after close()
        self._guard = ModelGuard(lambda: str(model_file.path))
        self._identity: "ModelIdentity | None" = None
        self._n_past = 0
        self._max_seq_len: int | None = None
        self._fast: FastSession | None = None
        # the canonical token rows behind cache positions [0, n_past), for save_prefix
        self._rows: list[np.ndarray] = []
        # the BatchedModel whose slots the backend holds (a weak reference), or None:
        # the backend has one set of slots, so a second BatchedModel must not take them
        self._slot_owner: Any = None

    # ------------------------------------------------------------------ state
    @property
    def n_past(self) -> int:
        """Positions already in the KV cache."""
        return self._n_past

    @property
    def max_seq_len(self) -> int | None:
        """KV cache capacity in positions, or None when no cache is allocated."""
        return self._max_seq_len

    @property
    def capabilities(self) -> Capabilities:
        return self._capabilities

    @property
    def closed(self) -> bool:
        return self._guard.closed

    @guarded
    def init_kv_cache(self, max_seq_len: int) -> None:
        """Allocate a zeroed cache for one synthesis (prompt + max new tokens); n_past = 0.

        A cache larger than the backend can hold raises CacheAllocationError before anything
        is allocated, as does an allocation that fails; either way the previous cache, n_past
        and its contents stay as they were."""
        if isinstance(max_seq_len, bool) or not isinstance(max_seq_len, (int, np.integer)):
            raise InvalidInputError("max_seq_len_type", f"max_seq_len must be an int, got {max_seq_len!r}")
        max_seq_len = int(max_seq_len)
        ctx = self.hparams.context_length
        if not 0 < max_seq_len <= ctx:
            raise InvalidInputError(
                "max_seq_len_range", f"max_seq_len must be in [1, context_length={ctx}], got {max_seq_len}")
        need = backend_kv_cache_bytes(self.hparams, max_seq_len, self.capabilities)
        with self._calling("kv_cache_limit_bytes"):
            limit = self.backend.kv_cache_limit_bytes()
        if limit is not None and need > limit:
            raise CacheAllocationError(self._allocation_message(
                max_seq_len, need, f"more than the {describe_bytes(limit)} backend "
                f"{self.backend.name!r} can allocate here"))
        try:
            self.backend.allocate_kv_cache(max_seq_len)  # keeps the old cache if it raises
        except S2CoreError:
            raise
        except Exception as exc:  # noqa: BLE001 - third-party code: any failure is this one
            raise CacheAllocationError(self._allocation_message(
                max_seq_len, need, f"the allocation failed: {type(exc).__name__}: "
                f"{str(exc)[:300]}")) from exc
        self._max_seq_len = max_seq_len
        self._n_past = 0
        self._rows = []

    def _allocation_message(self, max_seq_len: int, need: int, why: str) -> str:
        hp, held = self.hparams, self.capabilities.kv_cache_held_dtype
        kept = ("no cache was allocated before" if self._max_seq_len is None else
                f"the previous cache (max_seq_len={self._max_seq_len}, n_past={self._n_past}) "
                "is kept")
        return (f"init_kv_cache({max_seq_len}): K and V of {hp.n_layer} layers x {max_seq_len} "
                f"positions x {hp.n_head_kv} KV heads x {hp.head_dim} in {held} take "
                f"{describe_bytes(need)}, {why}; {kept}")

    @guarded
    def reset(self) -> None:
        """n_past = 0; the allocation stays for the next synthesis of the same size."""
        self._require_cache()
        with self._calling("reset_kv_cache"):
            self.backend.reset_kv_cache()
        self._n_past = 0
        self._rows = []

    def clear_kv_cache(self) -> None:
        """Free the cache at the end of a synthesis (repeated syntheses do not grow memory).
        On a closed model there is nothing to free: a no-op."""
        with self._guard.call("clear_kv_cache()", allow_closed=True):
            if not self.closed:
                self._clear()

    def _clear(self) -> None:
        with self._calling("free_kv_cache"):
            self.backend.free_kv_cache()
        self._forget_cache()

    def _forget_cache(self) -> None:
        """No cache from now on, without freeing the backend's (a one-slot BatchedModel took
        it over as its slot)."""
        self._max_seq_len = None
        self._n_past = 0
        self._rows = []

    @guarded
    def kv_cache_snapshot(self) -> tuple[np.ndarray, np.ndarray]:
        """Copies of K and V for positions < n_past, float32 [n_layer, n_past, n_head_kv, head_dim]."""
        self._require_cache()
        with self._calling(f"read_kv_cache({self._n_past})"):
            return self.backend.read_kv_cache(self._n_past)

    # ------------------------------------------------------------------ compute
    @guarded
    def prefill(self, tokens: Any, n_tokens: int | None = None,
                chunk_size: int | None = None, logit_rows: Any = None) -> Result:
        """Prompt prefill, chunked as SPEC section 4 decides (or by `chunk_size`).
        logit_rows (every method that evaluates takes it): the token ids whose logits the
        result needs (a `LogitRows` or a sequence of ids); None, the whole vocabulary."""
        batch = self._prepare(tokens, n_tokens, logit_rows)
        chunk = prefill_chunk_size(batch.n_tokens, batch.n_semantic, self.capabilities, chunk_size)
        n_past_before = self._n_past
        try:
            for start, stop in chunk_bounds(batch.n_tokens, chunk):
                result = self._run(batch.slice(start, stop))
        except BaseException:
            # Rows below the original n_past were never written; forget the partial chunks.
            self._n_past = n_past_before
            self._trim_rows(n_past_before)
            raise
        result.n_tokens = batch.n_tokens
        return result

    @guarded
    def prefill_fast(self, tokens: Any, n_tokens: int | None = None,
                     logit_rows: Any = None) -> Result:
        """Direct evaluation of the whole prompt in one call (never chunked)."""
        return self.eval_cached(tokens, n_tokens, logit_rows)

    @guarded
    def step(self, frame: Any, logit_rows: Any = None) -> Result:
        """One generation frame: [semantic id, code_0 .. code_{C-1}]."""
        mat = inputs.frame_matrix(frame, self.hparams)
        return self._run(self._batch_from_matrix(mat, None, self._logit_rows(logit_rows)))

    @guarded
    def eval_cached(self, tokens: Any, n_tokens: int | None = None,
                    logit_rows: Any = None) -> Result:
        """The one compute path: validate, evaluate all positions in one backend call."""
        return self._run(self._prepare(tokens, n_tokens, logit_rows))

    @guarded
    def fast_decode(self, hidden: Any, prefix_codes: Any = ()) -> np.ndarray:
        """Fast-AR logits (codebook_size,) for the next code given the codes so far."""
        native = self.fast_decode_native(hidden, prefix_codes)
        with self._calling("to_numpy"):
            return self.backend.to_numpy(native)

    @guarded
    def fast_decode_native(self, hidden: Any, prefix_codes: Any = ()) -> Any:
        """fast_decode returning the backend's native array (no host copy)."""
        if self.hparams.fast is None:
            raise S2CoreError(f"{self.model_file.path} has no Fast-AR "
                              f"(architecture {self.hparams.architecture!r})")
        hidden = inputs.hidden_state(hidden, self.hparams)
        codes = inputs.prefix_codes(prefix_codes, self.hparams)
        if not self.backend.incremental_fast_decode:
            with self._calling("fast_decode"):
                return self.backend.fast_decode(hidden, codes)
        return self._fast_decode_incremental(hidden, codes)

    def _fast_decode_incremental(self, hidden: Any, codes: np.ndarray) -> Any:
        """Append only the new codes when this call extends the previous one (the calls of
        one frame); otherwise start over from the hidden state. The same numbers either way,
        up to float32 rounding where a backend's attention sums by the call's length: s2.cpp's
        softmax, which NumPy's arithmetic="ggml" reproduces, takes a position's exp by
        ggml's polynomial or libm's by where it falls in the call (docs/arithmetic.md)."""
        session, self._fast = self._fast, None  # stays dropped if the backend raises midway
        if isinstance(hidden, np.ndarray):
            values = hidden
        else:
            with self._calling("to_numpy"):
                values = self.backend.to_numpy(hidden)
        be = self.backend

        def start(new):
            with self._calling("fast_start"):
                return be.fast_start(hidden, new[0])

        def extend(state, new):
            with self._calling("fast_extend"):
                return be.fast_extend(state, new[0])

        self._fast, logits = fast_incremental(session, np.asarray(values)[None], codes[None],
                                              start, extend)
        return logits

    # ------------------------------------------------------------------ internals
    def _require_cache(self) -> int:
        if self._max_seq_len is None:
            raise CacheNotInitializedError(
                "no KV cache: call init_kv_cache(max_seq_len) before evaluating")
        return self._max_seq_len

    def _prepare(self, tokens: Any, n_tokens: int | None, logit_rows: Any = None) -> EvalBatch:
        capacity = self._require_cache()
        mat = inputs.token_matrix(tokens, n_tokens, self.hparams)
        return self._batch_from_matrix(mat, capacity, self._logit_rows(logit_rows))

    def _logit_rows(self, logit_rows: Any) -> LogitRows | None:
        return inputs.logit_rows(logit_rows, self.hparams)

    def _batch_from_matrix(self, mat: np.ndarray, capacity: int | None = None,
                           logit_rows: LogitRows | None = None) -> EvalBatch:
        capacity = self._require_cache() if capacity is None else capacity
        n = mat.shape[0]
        if self._n_past + n > capacity:
            raise CacheOverflowError(
                "capacity", f"n_past ({self._n_past}) + n_tokens ({n}) = {self._n_past + n} "
                f"exceeds the KV cache capacity max_seq_len={capacity}")
        return inputs.make_batch(mat, self._n_past, self.hparams, logit_rows)

    def _calling(self, call: str):
        """The context of one backend call: its exceptions become s2core errors naming it."""
        return backend_call(self.backend.name, call)

    def _run(self, batch: EvalBatch) -> Result:
        computed = batch_for_backend(batch, self.capabilities)
        with self._calling(f"eval_cached(n_past={batch.n_past}, n_tokens={batch.n_tokens})"):
            hidden, logits = self.backend.eval_cached(computed)
        self._n_past += batch.n_tokens  # only after success
        self._rows.append(inputs.batch_rows(batch, self.hparams))
        return Result(hidden, logits, batch.n_tokens, self.backend, batch.logit_rows,
                      computed.logit_rows)

    def _trim_rows(self, n: int) -> None:
        rows = self.token_rows()[:n]
        self._rows = [rows] if len(rows) else []

    @guarded
    def token_rows(self) -> np.ndarray:
        """The token rows (canonical: text code slots 0) of cache positions [0, n_past)."""
        if not self._rows:
            return np.zeros((0, self.hparams.row_width), dtype=np.int64)
        if len(self._rows) > 1:
            self._rows = [np.concatenate(self._rows)]
        return self._rows[0][:self._n_past]

    # ------------------------------------------------------------------ voice prefix
    @property
    @guarded
    def identity(self) -> "ModelIdentity":
        """What a saved prefix must match: hparams, tensor table, content digest."""
        from s2core.runtime.prefix import ModelIdentity
        if self._identity is None:
            self._identity = ModelIdentity.of(self.model_file)
        return self._identity

    @guarded
    def save_prefix(self, n_positions: int | None = None) -> "KVPrefix":
        """K/V of positions [0, n_positions) (default n_past) with their token rows, the
        cache type and this model's identity: restorable into any later synthesis."""
        from s2core.runtime.prefix import KVPrefix
        self._require_cache()
        n = self._n_past if n_positions is None else n_positions
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or not 0 < n <= self._n_past:
            raise InvalidInputError("prefix_positions", f"a prefix needs 1..n_past={self._n_past}"
                                    f" positions, got {n_positions!r}")
        with self._calling(f"read_kv_cache({int(n)})"):
            k, v = self.backend.read_kv_cache(int(n))
        return KVPrefix(k, v, self.token_rows()[:n], self.capabilities.kv_cache_dtype,
                        self.identity, self.backend.name)

    @guarded
    def check_prefix(self, prefix: "KVPrefix", capacity: int | None = None) -> None:
        """Every check of restore_prefix, without changing anything. `capacity`: check
        against a cache of that size instead of the allocated one."""
        from s2core.runtime.prefix import KVPrefix
        if not isinstance(prefix, KVPrefix):
            raise PrefixMismatchError("prefix_type", f"expected an s2core.KVPrefix, got "
                                      f"{type(prefix).__name__}")
        if capacity is None:
            capacity = self._require_cache()
        hp = self.hparams
        if prefix.model != self.identity:
            why = "; ".join(self.identity.differences(prefix.model))
            raise PrefixMismatchError("prefix_model", f"the prefix was made by another model "
                                      f"file than {self.model_file.path} ({why})")
        dtype = self.capabilities.kv_cache_dtype
        if prefix.kv_cache_dtype != dtype:
            raise PrefixMismatchError("prefix_kv_cache_dtype", f"the prefix holds "
                                      f"{prefix.kv_cache_dtype} K/V but this backend's cache is "
                                      f"{dtype} (load with kv_cache_dtype="
                                      f"{prefix.kv_cache_dtype!r}, or recompute the prefix)")
        n = prefix.n_positions
        want = (hp.n_layer, n, hp.n_head_kv, hp.head_dim)
        if prefix.shape != want or prefix.tokens.shape != (n, hp.row_width) or n == 0:
            raise PrefixMismatchError("prefix_shape", f"K/V {prefix.shape} and token rows "
                                      f"{prefix.tokens.shape}; this model needs {want} and "
                                      f"({n}, {hp.row_width}), with at least one position")
        if n > capacity:
            raise CacheOverflowError("capacity", f"the prefix holds {n} positions, more than the "
                                     f"KV cache capacity max_seq_len={capacity}")
        inputs.token_matrix(prefix.tokens, None, hp)  # ids and codes in range (a file's too)
        prefix.check_finite()  # NaN K/V would fail this synthesis, or a batch's other requests

    @guarded
    def restore_prefix(self, prefix: "KVPrefix") -> str:
        """Make cache positions [0, n) the prefix's; n_past = n. Needs an allocated cache that
        holds it; refuses another model's prefix, another cache type or a wrong shape, leaving
        everything as it was. Returns "written" (the backend wrote the saved K/V) or
        "recomputed" (a backend without `writes_kv_cache`: the token rows were prefilled)."""
        self.check_prefix(prefix)
        n = prefix.n_positions
        if not self.capabilities.writes_kv_cache:
            self.reset()
            self.prefill(prefix.tokens)
            return "recomputed"
        k, v = prefix.k, prefix.v
        try:
            with self._calling(f"write_kv_cache({n} positions)"):
                self.backend.write_kv_cache(k, v)
        except BaseException:
            # rows were (partly) overwritten: whatever the cache held is gone
            self._n_past, self._rows = 0, []
            raise
        self._n_past = n
        self._rows = [prefix.tokens.copy()]
        return "written"

    # ------------------------------------------------------------------ life cycle
    def close(self) -> None:
        """Release the KV cache, the backend's weights and the file's memory map. Every later
        call raises ModelClosedError (clear_kv_cache and close itself do nothing). Results
        made before stay readable."""
        with self._guard.closing() as first:
            if not first:
                return
            self._fast = None
            self._max_seq_len = None
            self._n_past = 0
            self._rows = []
            try:
                with self._calling("close"):
                    self.backend.close()
            finally:
                self.model_file.close()

    def __enter__(self) -> "SlowARModel":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        state = ("closed" if self.closed else
                 f"n_past={self._n_past}, max_seq_len={self._max_seq_len}")
        return f"SlowARModel({str(self.model_file.path)!r}, backend={self.backend.name!r}, {state})"
