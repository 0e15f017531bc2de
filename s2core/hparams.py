"""Hyperparameters of the Slow-AR and Fast-AR (SPEC section 1), plus the values derived from them.

`Hparams.from_gguf` reads them the way s2.cpp does: each key with its S2 Pro default, warning
when a key is missing. head_dim is inferred from tensor shapes (SPEC 2.2), never dim / n_head.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from .errors import ModelFileError

ARCH_DEFAULT = "fish-speech"
EXT = "fish_speech"  # extension keys use an underscore, the architecture a hyphen


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
        """Consistency checks a model file must pass before any tensor is read."""
        problems = []
        if self.n_head_kv <= 0 or self.n_head % self.n_head_kv:
            problems.append(f"n_head={self.n_head} is not a multiple of n_head_kv={self.n_head_kv}")
        if self.head_dim % 2:
            problems.append(f"head_dim={self.head_dim} is odd; RoPE rotates pairs")
        if not 0 <= self.semantic_begin_id <= self.semantic_end_id < self.vocab_size:
            problems.append(
                f"semantic range [{self.semantic_begin_id}, {self.semantic_end_id}] "
                f"does not lie inside the vocab [0, {self.vocab_size})")
        if not self.tie_word_embeddings:
            problems.append("tie_word_embeddings is false; s2.cpp (and s2core) only support tied logits")
        f = self.fast
        if f is not None and (f.n_head_kv <= 0 or f.n_head % f.n_head_kv):
            problems.append(f"fast n_head={f.n_head} is not a multiple of fast n_head_kv={f.n_head_kv}")
        if f is not None and f.head_dim % 2:
            problems.append(f"fast head_dim={f.head_dim} is odd; RoPE rotates pairs")
        if problems:
            raise ModelFileError("hparams: " + "; ".join(problems))

    # ------------------------------------------------------------------ reading
    @classmethod
    def from_gguf(cls, metadata: Mapping[str, Any],
                  tensor_shape: Callable[[str], tuple[int, ...] | None]) -> "Hparams":
        """Build from GGUF metadata (key -> python value) and a tensor-shape lookup.

        `tensor_shape(name)` returns the PyTorch-order shape or None if the tensor is absent;
        it is needed because head_dim comes from tensor shapes (SPEC 2.2).
        """
        arch = str(metadata.get("general.architecture", ARCH_DEFAULT))
        base = cls()
        fb = FastHparams()

        def get(key: str, default, conv):
            if key in metadata:
                return conv(metadata[key])
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
            key_head_dim = metadata.get(f"{e}.fast_head_dim")
            if key_head_dim is not None and int(key_head_dim) != f_head_dim:
                raise ModelFileError(
                    f"fast_head_dim: key says {int(key_head_dim)} but the fast_layers.0 tensors "
                    f"imply {f_head_dim}")
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
            raise ModelFileError(f"{prefix}.attention.q_norm.weight is missing but QK-norm is on")
        return int(shape[0])
    shape = tensor_shape(f"{prefix}.attention.wo.weight")
    if shape is None:
        raise ModelFileError(f"{prefix}.attention.wo.weight is missing; cannot infer head_dim")
    width = int(shape[1])
    if n_head <= 0 or width % n_head:
        raise ModelFileError(
            f"head_dim: {prefix}.attention.wo input width {width} is not a multiple of "
            f"n_head={n_head}")
    return width // n_head
