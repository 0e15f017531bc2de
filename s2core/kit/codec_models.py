"""The small codecs the kit's codec tests run on, written once per process, and the shared
example (tiny_codec.gguf with the reference decoder's codes and audio, shipped in data/).

Four shapes cover what CODEC.md leaves open: the attention window smaller and larger than the
decoded length, one and several (unequal, so the upsampling's reversed order matters)
quantizer factors, grouped KV heads in the RVQ and encoder transformers, a transformer in the
first or last encoder block, two or three decoder blocks, other codebook counts and sizes, and
F16 and F32 files in both containers (a full file's `c.` prefix and a codec-only file).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from s2core.codec.file import CodecFile
from s2core.embedded.codec_writer import CodecConfig, codec_hparams, tiny_codec_config, write_codec
from s2core.kit.codec_reference import CodecReference
from s2core.kit.models import scratch_directory

EXAMPLE_DIR = Path(__file__).parent / "data" / "codec_example"


@dataclass(frozen=True)
class KitCodec:
    config: CodecConfig
    weight_type: str
    codec_only: bool
    #: frames the decode tests use
    n_frames: int


CODEC_CONFIGS: dict[str, KitCodec] = {
    # The shared example's shape; window 4 < 12 frames; F16 in a full file (c. prefix).
    "window-lt-T-f16-full": KitCodec(tiny_codec_config(), "f16", codec_only=False, n_frames=12),
    # GQA (4 query heads on 2 KV heads) in the RVQ and encoder transformers, window 16 > 9
    # frames, factors (3, 2), a transformer in the first encoder block, F32 codec-only.
    "gqa-window-gt-T-f32": KitCodec(CodecConfig(codec_hparams(
        sample_rate=16000, hop_length=8, frame_length=4, encoder_dim=8, decoder_dim=32,
        latent_dim=32, encoder_rates=(2, 4), decoder_rates=(2, 4), encoder_transformer_layers=(1, 0),
        codebook_dim=4, residual_codebooks=3, residual_codebook_size=8, semantic_codebook_size=32,
        downsample_factor=(3, 2), enc_head_dim=4, enc_kv_heads=2, rvq_head_dim=8, rvq_kv_heads=2,
        window=16, rvq_n_layer=3, rvq_rope_base=500.0), rvq_layers=3, rvq_ffn=48),
        "f32", codec_only=True, n_frames=9),
    # One quantizer factor (3), three decoder blocks, window 3, 1 KV head, F16 codec-only.
    "one-factor-f16": KitCodec(CodecConfig(codec_hparams(
        sample_rate=22050, hop_length=12, frame_length=12, encoder_dim=8, decoder_dim=48,
        latent_dim=24, encoder_rates=(3, 2, 2), decoder_rates=(2, 3, 2),
        encoder_transformer_layers=(0, 0, 2), codebook_dim=6, residual_codebooks=5,
        residual_codebook_size=16, semantic_codebook_size=40, downsample_factor=(3,),
        enc_head_dim=16, rvq_head_dim=6, rvq_kv_heads=1, window=3, rvq_n_layer=2),
        rvq_layers=2, rvq_ffn=40), "f16", codec_only=True, n_frames=10),
    # The demo-like layout with S2 Pro's rates at a tiny width, F32 in a full file.
    "s2-rates-f32-full": KitCodec(CodecConfig(codec_hparams(
        sample_rate=44100, hop_length=512, frame_length=512, encoder_dim=4, decoder_dim=32,
        latent_dim=16, encoder_rates=(2, 4, 8, 8), decoder_rates=(8, 8, 4, 2),
        encoder_transformer_layers=(0, 0, 0, 1), codebook_dim=4, residual_codebooks=9,
        residual_codebook_size=16, semantic_codebook_size=32, downsample_factor=(2, 2),
        enc_head_dim=16, rvq_head_dim=8, window=5, rvq_n_layer=1), rvq_layers=1, rvq_ffn=32),
        "f32", codec_only=False, n_frames=7),
}
CODEC_IDS = list(CODEC_CONFIGS)


@functools.lru_cache(maxsize=None)
def kit_codec(name: str, codec_only: bool | None = None) -> Path:
    """Path of the kit codec `name` (in its own container, or the one asked), written once."""
    kc = CODEC_CONFIGS[name]
    only = kc.codec_only if codec_only is None else codec_only
    path = scratch_directory("s2core-kit-codec-") / f"{name}-{'codec' if only else 'full'}.gguf"
    write_codec(path, kc.config, kc.weight_type, seed=11, codec_only=only)
    return path


@functools.lru_cache(maxsize=None)
def kit_codec_reference(name: str) -> CodecReference:
    return CodecReference(CodecFile(kit_codec(name)))


def example_path() -> Path:
    return EXAMPLE_DIR / "tiny_codec.gguf"


def example_codes_audio() -> tuple[np.ndarray, np.ndarray]:
    """The shared example's codes [10, 5] (int32) and the reference decoder's audio [160]."""
    return np.load(EXAMPLE_DIR / "codes.npy"), np.load(EXAMPLE_DIR / "audio.npy")


def random_codes(name: str, n_frames: int | None = None, seed: int = 0) -> np.ndarray:
    kc = CODEC_CONFIGS[name]
    rng = np.random.default_rng(seed)
    n = kc.n_frames if n_frames is None else n_frames
    return np.stack([rng.integers(0, size, n) for size in kc.config.hparams.codebook_sizes]).astype(np.int32)


def random_audio(name: str, n_frames: float = 5.5, seed: int = 0) -> np.ndarray:
    """Noise with a slow sine under it, n_frames code frames long (not a whole number: the last
    frame is padded as s2.cpp pads)."""
    hp = CODEC_CONFIGS[name].config.hparams
    n = int(n_frames * hp.samples_per_frame)
    rng = np.random.default_rng(seed)
    t = np.arange(n) / hp.sample_rate
    return (0.3 * np.sin(2 * np.pi * 220 * t) + 0.2 * rng.standard_normal(n)).astype(np.float32)


__all__ = ["CODEC_CONFIGS", "CODEC_IDS", "KitCodec", "example_codes_audio", "example_path",
           "kit_codec", "kit_codec_reference", "random_audio", "random_codes"]
