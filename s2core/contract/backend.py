"""The contract between the core and a backend.

The core validates input, prepares per-position values (SPEC 2.3), decides chunks and owns
n_past. A backend does the math only: it holds the weights, allocates and frees its KV cache,
runs `eval_cached` over already-validated input and runs `fast_decode`. It declares what it is
in one frozen `Capabilities` object, which is all the core's policies ever read about it.
"""

from __future__ import annotations

import dataclasses
import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
from gguf import GGMLQuantizationType

from s2core.codec.backend import CodecCapabilities
from s2core.errors import InvalidInputError
from s2core.modelfile.file import ModelFile
from s2core.contract.inputs import EvalBatch
from s2core.contract.host import host_memory_bytes

CACHE_DTYPES = ("f16", "bf16", "f32")
COMPUTE_DTYPES = ("f32", "f16", "bf16")
#: how products with non-F32 weights treat their activation: "f32" feeds it as float32;
#: "ggml" rounds it as s2.cpp's ggml does (8-bit blocks for quantized weights, f16 for F16)
ARITHMETICS = ("ggml", "f32")
#: every GGUF tensor type's lower-case name ("f16", "q8_0", "q4_k", ...)
GGUF_TYPE_NAMES = frozenset(t.name.lower() for t in GGMLQuantizationType)


def is_int(value: Any) -> bool:
    """A plain Python int, not a bool: what a plugin's declared values must be."""
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class Capabilities:
    """What a backend is, as far as the core's policies and the user's planning care."""

    device: str = "cpu"
    #: layers run on an accelerator (GPU, Apple GPU), which turns on chunked prefill (SPEC 4)
    accelerator: bool = False
    #: how many Slow-AR layers run there; None in a probe means "all of the model's layers"
    n_accelerated_layers: int | None = 0
    #: s2.cpp's guard for quantized embedding lookups on CUDA: prefill semantics one at a time
    requires_single_token_semantic_prefill: bool = False
    #: type of the cached values: "f16" (s2.cpp's), "bf16" or "f32"
    kv_cache_dtype: str = "f16"
    #: type the cache is held in, when wider than its values (a backend may keep f16-rounded
    #: values in float32 to skip a conversion per step); None = kv_cache_dtype
    kv_cache_storage_dtype: str | None = None
    #: every cache type this backend offers (the kv_cache_dtype= option)
    supported_kv_cache_dtypes: tuple[str, ...] = ("f16", "f32")
    #: precision of the activations fed to matrix products ("f32", "f16", "bf16")
    compute_dtype: str = "f32"
    #: GGUF weight types kept in memory as stored (lower-case names: "f16", "q8_0", ...)
    native_weight_types: frozenset[str] = frozenset({"f32"})
    #: what every other type is dequantized to on load
    widened_weight_dtype: str = "f32"
    #: (type, resident bytes per file byte) for native types not held byte for byte, such as
    #: a quantized format with wider scales; every other native type counts 1.0
    native_weight_overhead: tuple[tuple[str, float], ...] = ()
    #: native types used in place from the file's memory map: no copy at load (instant), and
    #: the pages are the OS page cache's, shared with every process that maps the file
    mapped_weight_types: frozenset[str] = frozenset()
    #: the backend implements `write_kv_cache`, so a saved voice prefix is restored by writing
    #: its K/V; without it the core recomputes the prefix from its token rows (slower)
    writes_kv_cache: bool = False
    #: the audio codec this backend provides (its plugin names the class), or None
    codec: CodecCapabilities | None = None
    #: how many independent sequences (KV slots) one `eval_slots` call evaluates; 1 (the
    #: default) is a backend without batching: the core then serves one sequence at a time
    max_batch_sequences: int = 1
    #: the backend's KV slots can reference a shared, read-only voice prefix
    #: (`add_kv_prefix`, `attach_kv_prefix`, `remove_kv_prefix`): slots in one voice hold its
    #: K/V once, and a voice no slot references can be dropped. Without
    #: it the core copies the prefix's K/V into each slot (writes_kv_cache) or recomputes it
    shares_kv_prefix: bool = False
    #: eval_cached and eval_slots compute only the logits a batch's `logit_rows` name (the
    #: rows of the output matrix it asks for); without it the core takes those rows out of
    #: the whole vocabulary's logits
    logit_rows: bool = False
    #: every arithmetic this backend offers (the core's `arithmetic=` load option, ARITHMETICS)
    arithmetics: tuple[str, ...] = ("f32",)
    #: the one this instance computes with (a probe states the backend's default)
    arithmetic: str = "f32"

    def __post_init__(self):
        # Sets and lists where frozensets and tuples are meant are taken as such.
        for name in ("native_weight_types", "mapped_weight_types"):
            value = getattr(self, name)
            if isinstance(value, (set, list, tuple)):
                object.__setattr__(self, name, frozenset(value))
        for name in ("supported_kv_cache_dtypes", "native_weight_overhead", "arithmetics"):
            value = getattr(self, name)
            if isinstance(value, list):
                object.__setattr__(self, name, tuple(value))
        problems = self.problems()
        if problems:
            raise InvalidInputError("capabilities", "; ".join(problems))

    def problems(self) -> list[str]:
        """Every field of the wrong type or outside its known values (empty when valid): the
        core's policies and the kit's bounds index tables by these strings."""
        p = []

        def names(v: Any) -> bool:
            return isinstance(v, frozenset) and all(isinstance(x, str) for x in v)

        if not (isinstance(self.device, str) and self.device):
            p.append(f"device={self.device!r} is not a non-empty string")
        for flag in ("accelerator", "requires_single_token_semantic_prefill", "writes_kv_cache",
                     "shares_kv_prefix", "logit_rows"):
            if not isinstance(getattr(self, flag), bool):
                p.append(f"{flag}={getattr(self, flag)!r} is not a bool")
        n = self.n_accelerated_layers
        if not (n is None or (is_int(n) and n >= 0)):
            p.append(f"n_accelerated_layers={n!r} is not None or an int >= 0")
        for name, allowed in (("kv_cache_dtype", CACHE_DTYPES), ("compute_dtype", COMPUTE_DTYPES),
                              ("widened_weight_dtype", COMPUTE_DTYPES)):
            if getattr(self, name) not in allowed:
                p.append(f"{name}={getattr(self, name)!r} is not one of {allowed}")
        if self.kv_cache_storage_dtype not in (None, *CACHE_DTYPES):
            p.append(f"kv_cache_storage_dtype={self.kv_cache_storage_dtype!r} is not None or "
                     f"one of {CACHE_DTYPES}")
        supported = self.supported_kv_cache_dtypes
        if not (isinstance(supported, tuple) and supported
                and all(d in CACHE_DTYPES for d in supported)):
            p.append(f"supported_kv_cache_dtypes={supported!r} is not a non-empty tuple of "
                     f"{CACHE_DTYPES}")
        elif self.kv_cache_dtype not in supported:
            p.append(f"kv_cache_dtype={self.kv_cache_dtype!r} is not among the supported "
                     f"{supported}")
        for name in ("native_weight_types", "mapped_weight_types"):
            value = getattr(self, name)
            if not names(value) or not value <= GGUF_TYPE_NAMES:
                p.append(f"{name}={value!r} is not a set of GGUF type names (f32, q8_0, ...)")
        if names(self.mapped_weight_types) and names(self.native_weight_types) \
                and not self.mapped_weight_types <= self.native_weight_types:
            p.append("mapped_weight_types are not all native_weight_types")
        overhead = self.native_weight_overhead
        if not (isinstance(overhead, tuple) and all(
                isinstance(e, tuple) and len(e) == 2 and e[0] in GGUF_TYPE_NAMES
                and isinstance(e[1], (int, float)) and not isinstance(e[1], bool)
                and math.isfinite(e[1]) and e[1] > 0 for e in overhead)):
            p.append(f"native_weight_overhead={overhead!r} is not a tuple of (type name, "
                     "positive factor)")
        if not (isinstance(self.arithmetics, tuple) and self.arithmetics
                and all(a in ARITHMETICS for a in self.arithmetics)):
            p.append(f"arithmetics={self.arithmetics!r} is not a non-empty tuple of {ARITHMETICS}")
        elif self.arithmetic not in self.arithmetics:
            p.append(f"arithmetic={self.arithmetic!r} is not among the offered {self.arithmetics}")
        if not (is_int(self.max_batch_sequences) and self.max_batch_sequences >= 1):
            p.append(f"max_batch_sequences={self.max_batch_sequences!r} is not an int >= 1")
        if not (self.codec is None or isinstance(self.codec, CodecCapabilities)):
            p.append(f"codec={self.codec!r} is not None or a CodecCapabilities")
        return p

    @property
    def kv_cache_held_dtype(self) -> str:
        """The type that sizes the cache in memory."""
        return self.kv_cache_storage_dtype or self.kv_cache_dtype

    def resolved(self, n_layer: int) -> "Capabilities":
        """The same with n_accelerated_layers made concrete for a model of n_layer layers."""
        if self.n_accelerated_layers is None:
            return dataclasses.replace(self, n_accelerated_layers=n_layer if self.accelerator else 0)
        return self

    def keeps_native(self, gguf_type_name: str) -> bool:
        return gguf_type_name in self.native_weight_types

    def held_bytes_per_file_byte(self, gguf_type_name: str) -> float:
        """For a native type: how much memory one byte of the file takes once loaded."""
        return dict(self.native_weight_overhead).get(gguf_type_name, 1.0)

    def describe(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["native_weight_types"] = sorted(self.native_weight_types)
        d["mapped_weight_types"] = sorted(self.mapped_weight_types)
        d["kv_cache_storage_dtype"] = self.kv_cache_held_dtype
        d["codec"] = self.codec.describe() if self.codec is not None else None
        return d


class Backend(ABC):
    """Base class of every backend. Subclasses load weights in __init__ from a `ModelFile`."""

    #: registry name, set by subclasses
    name: ClassVar[str] = ""

    def __init__(self, model_file: ModelFile, **options: Any):
        self.model_file = model_file
        self.hparams = model_file.hparams

    @property
    @abstractmethod
    def capabilities(self) -> Capabilities:
        """Concrete capabilities of this loaded backend (n_accelerated_layers resolved)."""

    # ---------------------------------------------------------------- KV cache
    @abstractmethod
    def allocate_kv_cache(self, max_seq_len: int) -> None:
        """Allocate K and V, [n_layer, max_seq_len, n_head_kv, head_dim] each, zero-filled,
        replacing any cache held. If it raises, the previous cache must still be held,
        unchanged: build the new one before dropping the old."""

    def kv_cache_limit_bytes(self) -> int | None:
        """The largest cache, in held bytes (memory.backend_kv_cache_bytes), this backend can
        allocate now; the core refuses a larger init_kv_cache before calling
        allocate_kv_cache, and holds the slots and the shared voice prefixes together to it
        (BatchedModel.restore_prefix). None: no limit known. The default is the host's RAM plus swap;
        a backend whose allocator touches every page, or runs on a device, says less."""
        return host_memory_bytes()

    def reset_kv_cache(self) -> None:
        """Called by reset(). Rows at or past n_past are never read, so nothing need happen."""

    @abstractmethod
    def free_kv_cache(self) -> None:
        """Release the cache's memory (clear_kv_cache at the end of a synthesis)."""

    @abstractmethod
    def read_kv_cache(self, n_positions: int) -> tuple[np.ndarray, np.ndarray]:
        """Copies of K (after QK-norm and RoPE) and V for positions [0, n_positions), as
        float32 numpy arrays [n_layer, n_positions, n_head_kv, head_dim]."""

    def write_kv_cache(self, k: np.ndarray, v: np.ndarray) -> None:
        """Optional (declare `Capabilities.writes_kv_cache`): write K and V, float32
        [n_layer, n, n_head_kv, head_dim] holding values of the cache type (what
        read_kv_cache returned), into cache rows [0, n). The core has checked the shapes and
        that n fits the allocated cache; rows at or past n are not touched."""
        raise NotImplementedError(f"backend {self.name!r} cannot write its KV cache")

    # ---------------------------------------------------------------- compute
    @abstractmethod
    def eval_cached(self, batch: EvalBatch) -> tuple[Any, Any]:
        """Run the Slow-AR over batch (SPEC 2.4-2.6): write K/V at rows
        [batch.n_past, batch.n_past + batch.n_tokens) and return (hidden, logits) of the last
        position as native arrays of shapes (dim,) and (vocab,); with batch.logit_rows set
        (declare `Capabilities.logit_rows`), logits of shape (len(batch.logit_rows),): the
        full logits at batch.logit_rows.ids, computed for those rows only.

        Returned arrays must not alias buffers a later call overwrites. Must not write cache
        rows below batch.n_past.
        """

    @abstractmethod
    def fast_decode(self, hidden: Any, prefix_codes: np.ndarray) -> Any:
        """Fast-AR logits (codebook_size,) for the next code after `prefix_codes` (SPEC 5).

        `hidden` is a float32 numpy array (dim,) or this backend's native array."""

    # Optional: incremental Fast-AR. A frame asks for codes 1..C-1 with prefixes that grow by
    # one code per call; s2.cpp recomputes every position each time. A backend that implements
    # these two keeps the Fast-AR's K/V between such calls, and the core uses them whenever a
    # call extends the previous one (same hidden, longer prefix). Results equal fast_decode's.
    def fast_begin(self, hidden: Any) -> tuple[Any, Any]:
        """Start a sequence at position 0 = [project_in(hidden) or hidden].
        Returns (state, logits after position 0)."""
        raise NotImplementedError

    def fast_extend(self, state: Any, codes: np.ndarray) -> tuple[Any, Any]:
        """Append `codes` (one or more) after the positions in `state`.
        Returns (state, logits after the last of them); `state` may be updated in place."""
        raise NotImplementedError

    def fast_start(self, hidden: Any, codes: np.ndarray) -> tuple[Any, Any]:
        """fast_begin(hidden), then fast_extend(state, codes) when there are codes: (state,
        logits after the last position). A backend may run the positions together (NumPy:
        the first call of a frame reads its weights once for both positions, not twice)."""
        state, logits = self.fast_begin(hidden)
        if len(codes):
            state, logits = self.fast_extend(state, codes)
        return state, logits

    @property
    def incremental_fast_decode(self) -> bool:
        return type(self).fast_begin is not Backend.fast_begin

    # ---------------------------------------------------------------- several sequences
    # KV slots: independent sequences in one cache, each with its own n_past (kept by the
    # core, s2core.serving.batching). A backend that declares max_batch_sequences > 1 overrides all
    # of these; the defaults below are the one-slot case on the single-sequence cache, so
    # every backend serves through the same core code (one sequence at a time).
    def allocate_kv_slots(self, n_slots: int, max_seq_len: int) -> None:
        """Allocate n_slots caches of max_seq_len positions each, zero-filled, replacing the
        slots held and dropping the prefix segments held (add_kv_prefix). The core
        guarantees 1 <= n_slots <= max_batch_sequences and that n_slots caches fit
        kv_cache_limit_bytes(). If it raises, the previous slots (and segments) must still be
        held, unchanged: build the new ones before dropping the old."""
        self.allocate_kv_cache(max_seq_len)

    def free_kv_slots(self) -> None:
        """Release the slots' memory; may be called when none are allocated."""
        self.free_kv_cache()

    def read_kv_slot(self, slot: int, n_positions: int) -> tuple[np.ndarray, np.ndarray]:
        """read_kv_cache for one slot: copies of its rows [0, n_positions)."""
        return self.read_kv_cache(n_positions)

    def write_kv_slot(self, slot: int, k: np.ndarray, v: np.ndarray) -> None:
        """write_kv_cache for one slot (declare writes_kv_cache): its rows [0, n)."""
        self.write_kv_cache(k, v)

    def eval_slots(self, batches: list[tuple[int, EvalBatch]]) -> list[tuple[Any, Any]]:
        """Evaluate several slots in one call: `batches` holds (slot, EvalBatch) with distinct
        slots, each batch's positions continuing that slot's own sequence. Each slot's K/V
        go to its own rows and its attention sees only its own rows; returns (hidden, logits)
        of each batch's last position, in the order of `batches` (the rules of eval_cached,
        per slot: arrays no later call overwrites). Positions come from each batch, never
        from a count the backend keeps; a slot not in the call is not touched. A batching
        backend evaluates every row of the call with one read of each weight."""
        return [self.eval_cached(batch) for _, batch in batches]

    # Optional (declare `Capabilities.shares_kv_prefix`): a voice prefix held once and
    # referenced by every slot that starts with it, never copied into the slots.
    def add_kv_prefix(self, k: np.ndarray, v: np.ndarray) -> Any:
        """Hold one read-only prefix segment: K and V float32 [n_layer, n, n_head_kv,
        head_dim] holding values of the cache type (what read_kv_slot returns). Returns a
        handle for attach_kv_prefix. Segments live until remove_kv_prefix or free_kv_slots
        and are read-only: no slot's call writes into them. The core has checked the
        segment's bytes, with the slots and segments held, against kv_cache_limit_bytes();
        if this raises, the segments and slots held must stay as they were."""
        raise NotImplementedError(f"backend {self.name!r} cannot share a KV prefix")

    def remove_kv_prefix(self, handle: Any) -> None:
        """Drop one segment held by add_kv_prefix and free its memory now: the core counts
        its bytes as available again at once (its next add_kv_prefix may need them). Every
        other segment, every slot's rows and every attachment stay bit for bit as they were.
        The core only removes a segment that no slot references (it detaches the slots
        first: attach_kv_prefix(slot, None) or write_kv_slot), and never a handle twice or
        one add_kv_prefix did not return: a backend may raise for either, as for a bug."""
        raise NotImplementedError(f"backend {self.name!r} cannot share a KV prefix")

    def attach_kv_prefix(self, slot: int, handle: Any) -> None:
        """The slot's positions [0, n) become the segment's (handle from add_kv_prefix), or,
        with handle None, the slot has no prefix again. The core then sets the slot's n_past
        to n (or 0): eval_slots batches at positions >= n attend over the segment's n rows
        and then the slot's own rows (its K/V of positions n and later), and read_kv_slot
        returns the segment's rows followed by the slot's own. write_kv_slot detaches."""
        raise NotImplementedError(f"backend {self.name!r} cannot share a KV prefix")

    def fast_decode_batch(self, hiddens: np.ndarray, prefix_codes: np.ndarray) -> Any:
        """Fast-AR logits (B, codebook_size) for B sequences at once: row b is
        fast_decode(hiddens[b], prefix_codes[b]); `hiddens` float32 (B, dim), `prefix_codes`
        int64 (B, k) (every row has the same number of codes: one codebook of a frame for
        all slots), in an array no later call overwrites. A batching backend runs one pass
        per position for the whole batch."""
        return np.stack([self.to_numpy(self.fast_decode(h, c))
                         for h, c in zip(hiddens, prefix_codes)])

    # Optional: the incremental Fast-AR for B sequences (as fast_begin / fast_extend for
    # one). The core uses them for every frame of a batch when the subclass overrides both.
    def fast_begin_batch(self, hiddens: Any) -> tuple[Any, Any]:
        """Start B sequences at position 0; returns (state, logits (B, codebook_size))."""
        raise NotImplementedError

    def fast_extend_batch(self, state: Any, codes: np.ndarray) -> tuple[Any, Any]:
        """Append one code to each of the B sequences (codes int64 (B,)); returns (state,
        logits (B, codebook_size)); `state` may be updated in place."""
        raise NotImplementedError

    @property
    def incremental_fast_decode_batch(self) -> bool:
        return type(self).fast_begin_batch is not Backend.fast_begin_batch

    # ---------------------------------------------------------------- host hand-off
    def to_numpy(self, x: Any) -> np.ndarray:
        """A native result as a float32 numpy array (host memory)."""
        return np.asarray(x, dtype=np.float32)

    def close(self) -> None:
        """Release everything: the cache, then every weight (the default drops every attribute
        of the instance, so nothing keeps the file's memory map alive). Called once; only
        `to_numpy` (on results made before) and `name` are used afterwards."""
        self.free_kv_cache()
        vars(self).clear()


def check_option(option: str, value: Any, choices: tuple[Any, ...]) -> Any:
    """A backend option's value, or InvalidInputError naming the option and its choices."""
    if value not in choices:
        raise InvalidInputError(option, f"{option}={value!r} is not one of {choices}")
    return value
