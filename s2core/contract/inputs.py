"""Input checks (SPEC 2.1 and more) and the per-position values every backend consumes (SPEC 2.3).

All checks run before anything changes, so a rejected call leaves the model as it was.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from s2core.errors import InvalidInputError, InvalidTokensError
from s2core.modelfile.hparams import Hparams


class LogitRows:
    """The vocabulary rows whose logits a caller needs (contract.md, "Logit rows"): ids in
    ascending order, without repeats, held as contiguous runs [start, stop).

    The frame rule samples the main token from the semantic ids and <|im_end|> only: 4,097
    of S2 Pro's 155,776 rows. A batch asking for them gets logits of shape (len(rows),), the
    full logits at `ids` in that order; a backend declaring `Capabilities.logit_rows`
    computes only those rows of the output matrix, and the core takes them out of the full
    logits for every other backend."""

    __slots__ = ("runs", "ids", "_hash")

    def __init__(self, runs: tuple[tuple[int, int], ...]):
        self.runs = runs
        self.ids = np.concatenate([np.arange(a, b, dtype=np.int64) for a, b in runs]) \
            if runs else np.zeros(0, np.int64)
        self.ids.setflags(write=False)
        self._hash = hash(runs)

    @classmethod
    def of(cls, ids: Any, vocab_size: int) -> "LogitRows":
        """From ids in any order (repeats dropped); each must lie in [0, vocab_size)."""
        arr = _as_array(ids, "logit_rows", InvalidInputError, "logit_rows")
        if arr.ndim != 1 or arr.size == 0 or not np.issubdtype(arr.dtype, np.integer):
            raise InvalidInputError("logit_rows", f"logit_rows must be a non-empty 1-D sequence "
                                    f"of integer token ids, got {arr.dtype} of shape {arr.shape}")
        bad = arr[(arr < 0) | (arr >= vocab_size)]
        if bad.size:
            raise InvalidInputError("logit_rows", f"logit_rows id {int(bad[0])} is outside the "
                                    f"vocabulary [0, {vocab_size})")
        ids = np.unique(arr.astype(np.int64))
        breaks = np.flatnonzero(np.diff(ids) != 1) + 1
        starts = np.concatenate([[0], breaks])
        stops = np.concatenate([breaks, [ids.size]])
        return cls(tuple((int(ids[a]), int(ids[b - 1]) + 1) for a, b in zip(starts, stops)))

    def __len__(self) -> int:
        return int(self.ids.size)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LogitRows) and other.runs == self.runs

    def __hash__(self) -> int:
        return self._hash

    def __repr__(self) -> str:
        return f"LogitRows({len(self)} ids in {len(self.runs)} runs)"

    def take(self, full: np.ndarray) -> np.ndarray:
        """These rows of logits over the whole vocabulary (its last axis)."""
        return np.ascontiguousarray(np.asarray(full)[..., self.ids])

    def within(self, wider: "LogitRows") -> np.ndarray:
        """Where each of these ids sits among `wider`'s ids (which hold them all)."""
        return np.searchsorted(wider.ids, self.ids)


def shared_logit_rows(rows: list["LogitRows | None"]) -> "LogitRows | None":
    """The rows one product serves for several batches: their union, or None (every row) as
    soon as one batch asks for the whole vocabulary."""
    if any(r is None for r in rows):
        return None
    if all(r == rows[0] for r in rows):
        return rows[0]
    ids = np.unique(np.concatenate([r.ids for r in rows]))
    return LogitRows.of(ids, int(ids[-1]) + 1)


def pick_logit_rows(logits: np.ndarray, computed: "LogitRows | None",
                    wanted: "LogitRows | None") -> np.ndarray:
    """One batch's logits out of a product over `computed`'s rows (None: all of them)."""
    if wanted == computed:
        return logits
    if computed is None:
        return wanted.take(logits)
    return np.ascontiguousarray(logits[..., wanted.within(computed)])


@dataclass(frozen=True)
class EvalBatch:
    """Already-validated input of one eval_cached call, prepared as SPEC 2.3 says.

    Arrays are host numpy; a backend moves them to its device. Positions are global
    (n_past + t), so a slice of a batch is itself a valid batch (that is how chunks are made).
    """

    token_ids: np.ndarray      # int64 (n,): row 0, a text or semantic id
    positions: np.ndarray      # int64 (n,): n_past + t, for RoPE
    semantic_mask: np.ndarray  # float32 (n,): 1 at semantic positions, else 0
    codebook_ids: np.ndarray   # int64 (n, num_codebooks): code + cb * codebook_size; 0 at text
    scale: np.ndarray          # float32 (n,): sem_scale at semantic positions (if enabled), else 1
    #: the logits to return: None for the whole vocabulary (vocab,), else those rows only
    logit_rows: LogitRows | None = None

    @property
    def n_tokens(self) -> int:
        return int(self.token_ids.shape[0])

    @property
    def n_past(self) -> int:
        """First cache row this batch writes."""
        return int(self.positions[0])

    @property
    def n_semantic(self) -> int:
        return int(np.count_nonzero(self.semantic_mask))

    def slice(self, start: int, stop: int) -> "EvalBatch":
        return EvalBatch(self.token_ids[start:stop], self.positions[start:stop],
                         self.semantic_mask[start:stop], self.codebook_ids[start:stop],
                         self.scale[start:stop], self.logit_rows)


def token_matrix(tokens: Any, n_tokens: int | None, hp: Hparams) -> np.ndarray:
    """Validate `tokens` and return them as an int64 matrix (n_tokens, num_codebooks + 1).

    Accepts a 2-D array, or a flat token-major sequence (token t occupies
    flat[t*(C+1):(t+1)*(C+1)]) with n_tokens given or inferred from its length.
    """
    width = hp.row_width
    if n_tokens is not None:
        n_tokens = _as_int(n_tokens, "n_tokens")
        if n_tokens <= 0:
            raise InvalidTokensError("n_tokens>0", f"n_tokens must be positive, got {n_tokens}")
    arr = _as_array(tokens, "tokens", InvalidTokensError, "shape")

    if arr.ndim == 2:
        if arr.shape[1] != width:
            raise InvalidTokensError(
                "row_width", f"tokens have shape {arr.shape}; each position needs "
                f"num_codebooks + 1 = {width} integers, got {arr.shape[1]}")
        if n_tokens is not None and n_tokens != arr.shape[0]:
            raise InvalidTokensError(
                "flat_length", f"n_tokens={n_tokens} but the tokens hold {arr.shape[0]} positions")
        n = arr.shape[0]
    elif arr.ndim == 1:
        if n_tokens is None:
            if arr.size % width:
                raise InvalidTokensError(
                    "flat_length", f"flat input of {arr.size} integers is not a whole number of "
                    f"positions of {width} (num_codebooks + 1); pass n_tokens= to say how many")
            n = arr.size // width
        else:
            if arr.size != n_tokens * width:
                raise InvalidTokensError(
                    "flat_length", f"flat input holds {arr.size} integers, expected n_tokens x "
                    f"(num_codebooks + 1) = {n_tokens} x {width} = {n_tokens * width}")
            n = n_tokens
    else:
        raise InvalidTokensError(
            "shape", f"tokens must be 1-D (flat) or 2-D (n_tokens, {width}); got shape {arr.shape}")

    if n <= 0:
        raise InvalidTokensError("n_tokens>0", f"n_tokens must be positive, got {n}")
    if arr.dtype.kind not in "iu":
        raise InvalidTokensError(
            "dtype", f"tokens must be integers, got dtype {arr.dtype}")
    mat = arr.reshape(n, width)
    _check_ids(mat, hp)
    return mat.astype(np.int64, copy=False)


def frame_matrix(frame: Any, hp: Hparams) -> np.ndarray:
    """step()'s input: exactly one position, shape (C+1,) or (1, C+1)."""
    arr = _as_array(frame, "frame", InvalidTokensError, "step_shape")
    if arr.shape not in ((hp.row_width,), (1, hp.row_width)):
        raise InvalidTokensError(
            "step_shape", f"step() takes one position of num_codebooks + 1 = {hp.row_width} "
            f"integers, got shape {arr.shape}")
    return token_matrix(arr.reshape(-1), 1, hp)


def _check_ids(mat: np.ndarray, hp: Hparams) -> None:
    """Ranges s2.cpp leaves as undefined behaviour: row 0 in the vocab, codes in the codebook."""
    row0 = mat[:, 0]
    bad = np.flatnonzero((row0 < 0) | (row0 >= hp.vocab_size))
    if bad.size:
        t = int(bad[0])
        raise InvalidTokensError(
            "token_id_range", f"position {t}: row-0 id {int(row0[t])} is outside the vocab "
            f"[0, {hp.vocab_size}) ({bad.size} such positions)")
    semantic = (row0 >= hp.semantic_begin_id) & (row0 <= hp.semantic_end_id)
    codes = mat[semantic, 1:]
    bad_codes = (codes < 0) | (codes >= hp.codebook_size)
    if bad_codes.any():
        i, cb = (int(v[0]) for v in np.nonzero(bad_codes))
        t = int(np.flatnonzero(semantic)[i])
        raise InvalidTokensError(
            "code_range", f"position {t} (semantic id {int(row0[t])}), codebook {cb}: code "
            f"{int(codes[i, cb])} is outside [0, codebook_size={hp.codebook_size}) "
            f"({int(bad_codes.sum())} such codes)")


def logit_rows(value: Any, hp: Hparams) -> LogitRows | None:
    """A call's logit_rows argument, checked against the vocabulary: None, a `LogitRows` or
    a sequence of token ids."""
    if value is None:
        return None
    if isinstance(value, LogitRows) and _well_formed(value.runs, hp.vocab_size):
        return value  # each step of a generation hands the same one: no re-sorting its ids
    # any other ids, or a LogitRows built by hand with runs out of order, sorted and checked
    return LogitRows.of(value.ids if isinstance(value, LogitRows) else value, hp.vocab_size)


def _well_formed(runs: tuple[tuple[int, int], ...], vocab_size: int) -> bool:
    """Runs as LogitRows.of makes them: ascending, apart, non-empty, inside the vocabulary."""
    at = -1
    for start, stop in runs:
        if not at < start < stop <= vocab_size:
            return False
        at = stop
    return bool(runs)


def batch_for_backend(batch: EvalBatch, caps: Any) -> EvalBatch:
    """The batch a backend is handed: logit_rows kept where it declares computing them
    (Capabilities.logit_rows), else dropped (the core picks the rows out of the whole
    vocabulary's logits: Result, pick_logit_rows)."""
    if batch.logit_rows is None or caps.logit_rows:
        return batch
    return dataclasses.replace(batch, logit_rows=None)


def make_batch(mat: np.ndarray, n_past: int, hp: Hparams,
               logit_rows: LogitRows | None = None) -> EvalBatch:
    """SPEC 2.3: the per-position values, from a validated token matrix."""
    n = mat.shape[0]
    row0 = mat[:, 0]
    semantic = (row0 >= hp.semantic_begin_id) & (row0 <= hp.semantic_end_id)
    offsets = np.arange(hp.num_codebooks, dtype=np.int64) * hp.codebook_size
    # Text positions may hold anything in their code slots: point them at row 0 (masked out).
    cb_ids = np.where(semantic[:, None], mat[:, 1:] + offsets, 0)
    if hp.scale_codebook_embeddings:
        scale = np.where(semantic, np.float32(hp.sem_scale), np.float32(1.0)).astype(np.float32)
    else:
        scale = np.ones(n, dtype=np.float32)
    return EvalBatch(
        token_ids=row0.copy(),
        positions=np.arange(n_past, n_past + n, dtype=np.int64),
        semantic_mask=semantic.astype(np.float32),
        codebook_ids=cb_ids.astype(np.int64),
        scale=scale,
        logit_rows=logit_rows,
    )


def prefix_codes(prefix: Any, hp: Hparams) -> np.ndarray:
    """fast_decode's codes so far: 1-D integers in [0, codebook_size); fewer than
    num_codebooks (as s2.cpp: the last codebook has no next one to predict) and fitting the
    Fast-AR's context beside the hidden slot."""
    f = hp.fast
    arr = _as_array(prefix if prefix is not None else [], "prefix codes", InvalidInputError,
                    "prefix_shape")
    if arr.size == 0 and arr.ndim <= 1:
        return np.zeros(0, dtype=np.int64)
    if arr.ndim != 1:
        raise InvalidInputError("prefix_shape", f"prefix codes must be 1-D, got shape {arr.shape}")
    if arr.dtype.kind not in "iu":
        raise InvalidInputError("prefix_dtype", f"prefix codes must be integers, got {arr.dtype}")
    if arr.size >= hp.num_codebooks:
        raise InvalidInputError(
            "prefix_length", f"{arr.size} prefix codes: a frame has num_codebooks="
            f"{hp.num_codebooks} codes, so at most {hp.num_codebooks - 1} can precede the "
            "next one")
    if arr.size > f.context_length - 1:
        raise InvalidInputError(
            "prefix_length", f"{arr.size} prefix codes plus the hidden state exceed the Fast-AR "
            f"context of {f.context_length} (at most {f.context_length - 1} codes)")
    bad = np.flatnonzero((arr < 0) | (arr >= hp.codebook_size))
    if bad.size:
        i = int(bad[0])
        raise InvalidInputError(
            "prefix_code_range", f"prefix code {i} is {int(arr[i])}, outside "
            f"[0, codebook_size={hp.codebook_size})")
    return arr.astype(np.int64)


def hidden_state(hidden: Any, hp: Hparams) -> Any:
    """fast_decode's hidden, checked: host input (a numpy array, list or tuple of real
    numbers) comes back as a contiguous float32 copy-or-view of shape (dim,); a backend's own
    array (anything with a shape and a dtype, such as Result.hidden_native) is passed on after
    its shape is checked. Anything else (None, a string) is refused."""
    if isinstance(hidden, (list, tuple, np.ndarray, np.generic)):
        arr = _as_array(hidden, "hidden", InvalidInputError, "hidden_shape")
        if arr.dtype.kind not in "fiu":
            raise InvalidInputError(
                "hidden_dtype", f"hidden must hold real numbers, got dtype {arr.dtype}")
        _check_hidden_shape(arr.shape, hp)
        return np.ascontiguousarray(arr, dtype=np.float32)
    if hasattr(hidden, "shape") and hasattr(hidden, "dtype"):
        _check_hidden_shape(hidden.shape, hp)
        return hidden
    raise InvalidInputError(
        "hidden_type", f"hidden must be an array of shape ({hp.dim},) (numpy, or this "
        f"backend's own result), got {type(hidden).__name__}")


def check_hidden(hidden: Any, hp: Hparams) -> None:
    """hidden_state's checks alone (for callers that convert the input themselves)."""
    hidden_state(hidden, hp)


def _check_hidden_shape(shape: Any, hp: Hparams) -> None:
    shape = tuple(shape)
    if shape != (hp.dim,):
        raise InvalidInputError(
            "hidden_shape", f"hidden must have shape ({hp.dim},) (the Slow-AR's dim), got {shape}")


def _as_array(value: Any, what: str, error: type[InvalidInputError], check: str) -> np.ndarray:
    """np.asarray, with ragged nesting and unconvertible objects as the caller's input error
    (numpy raises ValueError or TypeError for those)."""
    try:
        return np.asarray(value)
    except (ValueError, TypeError, OverflowError) as exc:
        raise error(check, f"{what}: not a rectangular array of numbers "
                           f"({str(exc)[:200]})") from None


def is_integer(value: Any) -> bool:
    """A Python or NumPy integer, and not a bool (True would pass for 1)."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _as_int(value: Any, what: str) -> int:
    if not is_integer(value):
        raise InvalidTokensError("n_tokens_type", f"{what} must be an integer, got {value!r}")
    return int(value)


def canonical_rows(mat: np.ndarray, hp: Hparams) -> np.ndarray:
    """Validated token rows with the code slots of text positions set to 0: two prompts with
    equal canonical rows give the same K/V (text positions ignore their code slots)."""
    row0 = mat[:, 0]
    semantic = (row0 >= hp.semantic_begin_id) & (row0 <= hp.semantic_end_id)
    out = np.array(mat, dtype=np.int64, copy=True)
    out[~semantic, 1:] = 0
    return out


def batch_rows(batch: EvalBatch, hp: Hparams) -> np.ndarray:
    """The canonical token rows a batch was made from (make_batch undone)."""
    offsets = np.arange(hp.num_codebooks, dtype=np.int64) * hp.codebook_size
    semantic = batch.semantic_mask[:, None] > 0
    codes = np.where(semantic, batch.codebook_ids - offsets, 0)
    return np.column_stack([batch.token_ids, codes]).astype(np.int64)
