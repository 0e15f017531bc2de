"""Hyperparameters of the Slow-AR and Fast-AR (SPEC section 1), plus the values derived from them.

`Hparams.from_gguf` reads them the way s2.cpp does: each key with its S2 Pro default, warning
when a key is missing. head_dim is inferred from tensor shapes (SPEC 2.2), never dim / n_head.
Each key must be stored with its type (an integer type for counts, BOOL for flags, a finite
number for floats), and `Hparams.validate` refuses every value no backend could run with, so an
unusable file fails at load with the same message on every backend.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Protocol

from s2core.errors import ModelFileError

ARCH_DEFAULT = "fish-speech"
EXT = "fish_speech"  # extension keys use an underscore, the architecture a hyphen


#: integer hparams above this are refused: backends index with 32-bit integers
MAX_HPARAM = 2**31 - 1


class TypedMetadata(Protocol):
    """What `from_gguf` reads keys through (s2core.gguf.container.GGUFFile is one): `get`
    returns the value as `kind` or raises ModelFileError when it is stored as another type."""

    def __contains__(self, key: str) -> bool: ...

    def get(self, key: str, kind: type, default: Any = ...) -> Any: ...


class GGUFKeyWarning(UserWarning):
    """A metadata key was missing and its S2 Pro default was used (s2.cpp warns the same way)."""


@dataclass(frozen=True)
class StackShape:
    """What one transformer block needs to know about its stack (the Slow-AR's or the
    Fast-AR's): `Hparams.stack` and `FastHparams.stack`. Shared by every backend."""

    n_head: int
    n_head_kv: int
    head_dim: int
    eps: float
    rope_base: float

    @property
    def q_size(self) -> int:
        return self.n_head * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.n_head_kv * self.head_dim

    @property
    def attn_scale(self) -> float:
        return 1.0 / math.sqrt(self.head_dim)


class _Stack:
    """The attention geometry of a stack's hparams (Hparams and FastHparams both have it)."""

    @property
    def stack(self) -> StackShape:
        return StackShape(self.n_head, self.n_head_kv, self.head_dim, self.rms_norm_eps,
                          self.rope_freq_base)

    @property
    def q_size(self) -> int:
        return self.stack.q_size

    @property
    def kv_size(self) -> int:
        return self.stack.kv_size

    @property
    def attn_scale(self) -> float:
        return self.stack.attn_scale


@dataclass(frozen=True)
class FastHparams(_Stack):
    """The Fast-AR decoder that turns a Slow-AR `hidden` into the remaining codebook codes."""

    context_length: int = 11
    dim: int = 2560
    ffn: int = 9728
    n_layer: int = 4
    n_head: int = 32
    n_head_kv: int = 8
    head_dim: int = 128
    rope_freq_base: float = 1e6
    rms_norm_eps: float = 1e-6
    attention_qk_norm: bool = False
    project_in: bool = False


@dataclass(frozen=True)
class Hparams(_Stack):
    """Every SPEC section 1 value, the inferred head_dim, and the Fast-AR's (None if absent)."""

    architecture: str = ARCH_DEFAULT
    context_length: int = 32768
    vocab_size: int = 155776
    dim: int = 2560
    ffn: int = 9728
    n_layer: int = 36
    n_head: int = 32
    n_head_kv: int = 8
    head_dim: int = 128
    rope_freq_base: float = 1e6
    rms_norm_eps: float = 1e-6
    codebook_size: int = 4096
    num_codebooks: int = 10
    semantic_begin_id: int = 151678
    semantic_end_id: int = 155773  # inclusive
    tie_word_embeddings: bool = True
    attention_qk_norm: bool = True
    scale_codebook_embeddings: bool = True
    fast: FastHparams | None = None

    # Derived values (SPEC 2.2); q_size, kv_size, attn_scale and stack come from _Stack.
    @property
    def sem_scale(self) -> float:
        return 1.0 / math.sqrt(self.num_codebooks + 1)

    @property
    def row_width(self) -> int:
        """Integers per position: row 0 (text or semantic id) plus one code per codebook."""
        return self.num_codebooks + 1

    @property
    def gqa_group(self) -> int:
        return self.n_head // self.n_head_kv

    def as_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d.update(q_size=self.q_size, kv_size=self.kv_size, attn_scale=self.attn_scale,
                 sem_scale=self.sem_scale)
        return d

    def validate(self) -> None:
        """Every value usable by every backend, checked before any tensor is read: positive
        sizes (at most MAX_HPARAM), heads that group, even head_dims (RoPE rotates pairs),
        finite positive RoPE bases and epsilons, a semantic range inside the vocab, and a
        Fast-AR context that holds the hidden state and at least one code."""
        problems = _stack_problems("", self, context_min=1)
        if not 0 <= self.semantic_begin_id <= self.semantic_end_id < self.vocab_size:
            problems.append(
                f"semantic range [{self.semantic_begin_id}, {self.semantic_end_id}] "
                f"does not lie inside the vocab [0, {self.vocab_size})")
        for name in ("vocab_size", "codebook_size", "num_codebooks"):
            problems += _count_problem(name, getattr(self, name))
        if not self.tie_word_embeddings:
            problems.append("tie_word_embeddings is false; s2.cpp (and s2core) only support tied logits")
        if self.fast is not None:
            problems += _stack_problems("fast_", self.fast, context_min=2)
        if problems:
            raise ModelFileError("hparams: " + "; ".join(problems), check="hparams")

    # ------------------------------------------------------------------ reading
    @classmethod
    def from_gguf(cls, metadata: TypedMetadata,
                  tensor_shape: Callable[[str], tuple[int, ...] | None]) -> "Hparams":
        """Build from typed GGUF metadata and a tensor-shape lookup, then validate.

        `tensor_shape(name)` returns the PyTorch-order shape or None if the tensor is absent;
        it is needed because head_dim comes from tensor shapes (SPEC 2.2).
        """
        arch = metadata.get("general.architecture", str, ARCH_DEFAULT)
        base = cls()
        fb = FastHparams()

        def get(key: str, default, kind):
            if key in metadata:
                return metadata.get(key, kind)
            warnings.warn(f"GGUF key {key!r} missing; using default {default!r}", GGUFKeyWarning,
                          stacklevel=3)
            return default

        a, e = arch, EXT
        n_head = get(f"{a}.attention.head_count", base.n_head, int)
        qk_norm = get(f"{e}.attention_qk_norm", base.attention_qk_norm, bool)
        head_dim = _infer_head_dim("layers.0", n_head, qk_norm, tensor_shape)
        dim = get(f"{a}.embedding_length", base.dim, int)

        fast = None
        if arch == ARCH_DEFAULT:
            f_n_head = get(f"{e}.fast_head_count", fb.n_head, int)
            f_dim = get(f"{e}.fast_embedding_length", fb.dim, int)
            f_qk = get(f"{e}.fast_attention_qk_norm", fb.attention_qk_norm, bool)
            f_head_dim = _infer_head_dim("fast_layers.0", f_n_head, f_qk, tensor_shape)
            key_head_dim = metadata.get(f"{e}.fast_head_dim", int, None)
            if key_head_dim is not None and key_head_dim != f_head_dim:
                raise ModelFileError(
                    f"fast_head_dim: key says {key_head_dim} but the fast_layers.0 tensors "
                    f"imply {f_head_dim}", check="hparams")
            fast = FastHparams(
                context_length=get(f"{e}.fast_context_length", fb.context_length, int),
                dim=f_dim,
                ffn=get(f"{e}.fast_feed_forward_length", fb.ffn, int),
                n_layer=get(f"{e}.fast_block_count", fb.n_layer, int),
                n_head=f_n_head,
                n_head_kv=get(f"{e}.fast_head_count_kv", fb.n_head_kv, int),
                head_dim=f_head_dim,
                rope_freq_base=get(f"{e}.fast_rope_freq_base", fb.rope_freq_base, float),
                rms_norm_eps=get(f"{e}.fast_layer_norm_rms_eps", fb.rms_norm_eps, float),
                attention_qk_norm=f_qk,
                project_in=get(f"{e}.fast_project_in", f_dim != dim, bool),
            )

        hp = cls(
            architecture=arch,
            context_length=get(f"{a}.context_length", base.context_length, int),
            vocab_size=get(f"{a}.vocab_size", base.vocab_size, int),
            dim=dim,
            ffn=get(f"{a}.feed_forward_length", base.ffn, int),
            n_layer=get(f"{a}.block_count", base.n_layer, int),
            n_head=n_head,
            n_head_kv=get(f"{a}.attention.head_count_kv", base.n_head_kv, int),
            head_dim=head_dim,
            rope_freq_base=get(f"{a}.rope.freq_base", base.rope_freq_base, float),
            rms_norm_eps=get(f"{a}.attention.layer_norm_rms_epsilon", base.rms_norm_eps, float),
            codebook_size=get(f"{e}.codebook_size", base.codebook_size, int),
            num_codebooks=get(f"{e}.num_codebooks", base.num_codebooks, int),
            semantic_begin_id=get(f"{e}.semantic_begin_id", base.semantic_begin_id, int),
            semantic_end_id=get(f"{e}.semantic_end_id", base.semantic_end_id, int),
            tie_word_embeddings=get(f"{e}.tie_word_embeddings", base.tie_word_embeddings, bool),
            attention_qk_norm=qk_norm,
            scale_codebook_embeddings=get(f"{e}.scale_codebook_embeddings",
                                          base.scale_codebook_embeddings, bool),
            fast=fast,
        )
        hp.validate()
        return hp


def _infer_head_dim(prefix: str, n_head: int, qk_norm: bool,
                    tensor_shape: Callable[[str], tuple[int, ...] | None]) -> int:
    """SPEC 2.2: q_norm's length with QK-norm, else wo's input width / n_head."""
    if qk_norm:
        shape = tensor_shape(f"{prefix}.attention.q_norm.weight")
        if shape is None:
            raise ModelFileError(f"{prefix}.attention.q_norm.weight is missing but QK-norm is on",
                                 check="tensors")
        return int(shape[0])
    shape = tensor_shape(f"{prefix}.attention.wo.weight")
    if shape is None:
        raise ModelFileError(f"{prefix}.attention.wo.weight is missing; cannot infer head_dim",
                             check="tensors")
    if len(shape) != 2:
        raise ModelFileError(f"{prefix}.attention.wo.weight has shape {shape}, not 2-D; cannot "
                             "infer head_dim", check="tensors")
    width = int(shape[1])
    if n_head <= 0 or width % n_head:
        raise ModelFileError(
            f"head_dim: {prefix}.attention.wo input width {width} is not a multiple of "
            f"n_head={n_head}", check="hparams")
    return width // n_head


def _count_problem(name: str, value: int, minimum: int = 1) -> list[str]:
    if not minimum <= value <= MAX_HPARAM:
        return [f"{name}={value} is outside [{minimum}, {MAX_HPARAM}]"]
    return []


def _stack_problems(prefix: str, s: "Hparams | FastHparams", context_min: int) -> list[str]:
    """The checks a stack's values (the Slow-AR's or, with prefix "fast_", the Fast-AR's) pass."""
    problems = _count_problem(f"{prefix}context_length", s.context_length, context_min)
    for name in ("dim", "ffn", "n_layer", "n_head", "n_head_kv", "head_dim"):
        problems += _count_problem(prefix + name, getattr(s, name))
    if s.n_head_kv >= 1 and s.n_head % s.n_head_kv:
        problems.append(f"{prefix}n_head={s.n_head} is not a multiple of "
                        f"{prefix}n_head_kv={s.n_head_kv}")
    if s.head_dim % 2:
        problems.append(f"{prefix}head_dim={s.head_dim} is odd; RoPE rotates pairs")
    for name in ("rope_freq_base", "rms_norm_eps"):
        value = getattr(s, name)
        if not (math.isfinite(value) and value > 0):
            problems.append(f"{prefix}{name}={value} is not a finite positive number")
    return problems
