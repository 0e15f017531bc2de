"""The codec's hyperparameters, `fish_speech.codec.*` (CODEC.md 2), read as s2.cpp reads them.

Unlike the Slow-AR's keys, every codec key except five is required (a missing one makes
s2.cpp's codec refuse the file), so a missing or mistyped key is a ModelFileError naming it.
The checks of CODEC.md 6 that the computation needs (widths that split into heads, matching
latent widths, consistent frame sizes) run here too, before any tensor is read.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

from s2core.errors import ModelFileError

KEY_PREFIX = "fish_speech.codec."
#: the attention window of encoder-block transformers: hard-coded in s2.cpp (CODEC.md 4)
ENCODER_WINDOW = 512
#: frame_length when the key is absent (CODEC.md 2)
DEFAULT_FRAME_LENGTH = 512


@dataclass(frozen=True)
class TransformerHparams:
    """One family of codec transformers (the encoder block's, or the RVQ pre/post modules)."""

    head_dim: int
    #: KV heads; < 1 means as many as query heads
    n_local_heads: int
    rope_freq_base: float
    rms_norm_eps: float
    #: attention window in positions; 0 means plain causal attention (CODEC.md 4)
    window: int
    #: RoPE n_ctx_orig in s2.cpp; no effect on the numbers (YaRN off), kept for writers
    block_size: int

    def n_head(self, width: int) -> int:
        return width // self.head_dim

    def n_kv_head(self, width: int) -> int:
        return self.n_local_heads if self.n_local_heads >= 1 else self.n_head(width)


@dataclass(frozen=True)
class CodecHparams:
    """Every `fish_speech.codec.*` value s2.cpp reads. Widths of layers come from tensors."""

    sample_rate: int
    hop_length: int
    frame_length: int
    encoder_dim: int
    decoder_dim: int
    latent_dim: int
    encoder_rates: tuple[int, ...]
    decoder_rates: tuple[int, ...]
    encoder_transformer_layers: tuple[int, ...]
    quantizer_input_dim: int
    codebook_dim: int
    residual_codebooks: int
    residual_codebook_size: int
    semantic_codebook_size: int
    downsample_factor: tuple[int, ...]
    encoder_transformer: TransformerHparams
    rvq_transformer: TransformerHparams
    #: read, not used in compute (layer counts come from tensor names): kept for writers
    rvq_n_layer: int
    rvq_dim: int

    # ------------------------------------------------------------------ derived
    @property
    def num_codebooks(self) -> int:
        """Semantic codebook plus the residual ones (10 for S2 Pro)."""
        return self.residual_codebooks + 1

    @property
    def codebook_sizes(self) -> tuple[int, ...]:
        """Entries per codebook, semantic first: the clamp bounds of CODEC.md 4.1."""
        return (self.semantic_codebook_size,) + (self.residual_codebook_size,) * self.residual_codebooks

    @property
    def upsample_factor(self) -> int:
        """Latent steps per code frame: prod(quantizer_downsample_factor)."""
        return math.prod(self.downsample_factor)

    @property
    def samples_per_frame(self) -> int:
        """Audio samples per code frame: hop_length * prod(downsample factors) (2048)."""
        return self.hop_length * self.upsample_factor

    @property
    def streaming_history_frames(self) -> int:
        """s2.cpp's history for windowed re-decoding: ceil8(window - 1 + 16) (144 for S2 Pro)."""
        return -(-(max(self.rvq_transformer.window, 1) - 1 + 16) // 8) * 8

    # ------------------------------------------------------------------ reading
    @classmethod
    def from_metadata(cls, meta: Mapping[str, Any]) -> "CodecHparams":
        """From a file's `fish_speech.codec.*` fields (names without the prefix)."""
        r = _KeyReader(meta)
        enc_tf = TransformerHparams(
            head_dim=r.int("transformer.head_dim"),
            n_local_heads=r.int("transformer.n_local_heads", signed=True),
            rope_freq_base=r.float("transformer.rope_freq_base"),
            rms_norm_eps=r.float("transformer.layer_norm_rms_eps"),
            window=ENCODER_WINDOW, block_size=r.int("transformer.block_size"))
        rvq_tf = TransformerHparams(
            head_dim=r.int("rvq_transformer.head_dim"),
            n_local_heads=r.int("rvq_transformer.n_local_heads", signed=True),
            rope_freq_base=r.float("rvq_transformer.rope_freq_base"),
            rms_norm_eps=r.float("rvq_transformer.layer_norm_rms_eps"),
            window=r.int("rvq_transformer.window_size"),
            block_size=r.int("rvq_transformer.block_size"))
        hp = cls(
            sample_rate=r.int("sample_rate"), hop_length=r.int("hop_length"),
            frame_length=r.int("frame_length", default=DEFAULT_FRAME_LENGTH),
            encoder_dim=r.int("encoder_dim"), decoder_dim=r.int("decoder_dim"),
            latent_dim=r.int("latent_dim"),
            encoder_rates=r.ints("encoder_rates"), decoder_rates=r.ints("decoder_rates"),
            encoder_transformer_layers=r.ints("encoder_transformer_layers", positive=False),
            quantizer_input_dim=r.int("quantizer_input_dim"),
            codebook_dim=r.int("quantizer_codebook_dim"),
            residual_codebooks=r.int("quantizer_residual_codebooks"),
            residual_codebook_size=r.int("quantizer_residual_codebook_size"),
            semantic_codebook_size=r.int("quantizer_semantic_codebook_size"),
            downsample_factor=r.ints("quantizer_downsample_factor"),
            encoder_transformer=enc_tf, rvq_transformer=rvq_tf,
            rvq_n_layer=r.int("rvq_transformer.n_layer"), rvq_dim=r.int("rvq_transformer.dim"))
        hp.validate()
        return hp

    def validate(self) -> None:
        """The consistency the computation relies on (CODEC.md 6); ModelFileError otherwise."""
        problems = []
        positive = {"sample_rate": self.sample_rate, "hop_length": self.hop_length,
                    "frame_length": self.frame_length, "encoder_dim": self.encoder_dim,
                    "decoder_dim": self.decoder_dim, "latent_dim": self.latent_dim,
                    "quantizer_codebook_dim": self.codebook_dim,
                    "quantizer_residual_codebook_size": self.residual_codebook_size,
                    "quantizer_semantic_codebook_size": self.semantic_codebook_size,
                    "transformer.head_dim": self.encoder_transformer.head_dim,
                    "rvq_transformer.head_dim": self.rvq_transformer.head_dim}
        problems += [f"{k} = {v} must be > 0" for k, v in positive.items() if v <= 0]
        for key, rates in (("encoder_rates", self.encoder_rates),
                           ("decoder_rates", self.decoder_rates),
                           ("quantizer_downsample_factor", self.downsample_factor)):
            if not rates or min(rates) <= 0:
                problems.append(f"{key} = {list(rates)} must be a non-empty list of positive ints")
        if len(self.encoder_transformer_layers) != len(self.encoder_rates):
            problems.append(f"encoder_transformer_layers has {len(self.encoder_transformer_layers)} "
                            f"entries, encoder_rates {len(self.encoder_rates)}")
        if self.decoder_dim % 2 ** len(self.decoder_rates):
            problems.append(f"decoder_dim = {self.decoder_dim} does not halve "
                            f"{len(self.decoder_rates)} times (one per decoder block)")
        if self.latent_dim != self.quantizer_input_dim:
            problems.append(f"latent_dim = {self.latent_dim} != quantizer_input_dim = "
                            f"{self.quantizer_input_dim} (the decoder reads the quantizer's output)")
        if problems:  # the checks below divide by these values
            raise ModelFileError("codec hyperparameters: " + "; ".join(problems))
        hop_dec, hop_enc = math.prod(self.decoder_rates), math.prod(self.encoder_rates)
        if not self.hop_length == hop_dec == hop_enc:
            problems.append(f"hop_length = {self.hop_length} but prod(decoder_rates) = {hop_dec} "
                            f"and prod(encoder_rates) = {hop_enc}: the audio per code frame "
                            "would not be what the file reports")
        rvq = self.rvq_transformer
        problems += _heads_problems("rvq_transformer", rvq, self.latent_dim)
        for i, n in enumerate(self.encoder_transformer_layers):
            if n > 0:
                problems += _heads_problems(f"transformer (encoder block {i + 1})",
                                            self.encoder_transformer, self.encoder_width(i))
        if problems:
            raise ModelFileError("codec hyperparameters: " + "; ".join(problems))

    def encoder_width(self, i: int) -> int:
        """W_i = encoder_dim * 2^(i+1): the width after encoder block i+1 (CODEC.md 3)."""
        return self.encoder_dim * 2 ** (i + 1)

    def decoder_width(self, i: int) -> int:
        """C / 2^i: the width entering decoder block i+1."""
        return self.decoder_dim // 2 ** i


def _heads_problems(what: str, tf: TransformerHparams, width: int) -> list[str]:
    out = []
    if width % tf.head_dim:
        out.append(f"{what}: width {width} is not a multiple of head_dim {tf.head_dim}")
        return out
    if tf.head_dim % 2:
        out.append(f"{what}: head_dim {tf.head_dim} is odd (RoPE rotates pairs)")
    h, hkv = tf.n_head(width), tf.n_kv_head(width)
    if hkv > h or h % hkv:
        out.append(f"{what}: {h} query heads do not share {hkv} KV heads evenly")
    return out


class _KeyReader:
    """Typed access to the codec keys: a missing or mistyped key is a ModelFileError naming it."""

    def __init__(self, meta: Mapping[str, Any]):
        self.meta = meta

    def _get(self, key: str, default: Any = None) -> Any:
        if key not in self.meta:
            if default is not None:
                return default
            raise ModelFileError(f"codec key {KEY_PREFIX}{key} is missing (s2.cpp requires it)")
        return self.meta[key]

    def int(self, key: str, default: int | None = None, signed: bool = False) -> int:
        v = self._get(key, default)
        if isinstance(v, bool) or not isinstance(v, int):
            raise ModelFileError(f"codec key {KEY_PREFIX}{key} = {v!r} is not an integer")
        if v < 0 and not signed:
            raise ModelFileError(f"codec key {KEY_PREFIX}{key} = {v} is negative")
        return v

    def float(self, key: str) -> float:
        v = self._get(key)
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ModelFileError(f"codec key {KEY_PREFIX}{key} = {v!r} is not a number")
        if not math.isfinite(v):
            raise ModelFileError(f"codec key {KEY_PREFIX}{key} = {v} is not a finite number")
        return float(v)

    def ints(self, key: str, positive: bool = True) -> tuple[int, ...]:
        v = self._get(key)
        if not isinstance(v, (list, tuple)) or not all(
                isinstance(x, int) and not isinstance(x, bool) for x in v):
            raise ModelFileError(f"codec key {KEY_PREFIX}{key} = {v!r} is not an integer array")
        if any(x < 0 for x in v) or (positive and any(x == 0 for x in v)):
            raise ModelFileError(f"codec key {KEY_PREFIX}{key} = {list(v)} holds values "
                                 f"{'<= 0' if positive else '< 0'}")
        return tuple(int(x) for x in v)
