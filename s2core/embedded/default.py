"""The embedded default model as `s2core demo` and `s2core serve` use it: the model file (with
its codec), its tokenizer and the reference voice it speaks with.

The weights are random, so the voice is random codes too: what matters is that every command
finds the same files and the same voice.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np

from s2core.embedded.cache import cached_model, model_path
from s2core.embedded.codec_writer import demo_codec_config
from s2core.embedded.tokenizer import cached_tokenizer
from s2core.embedded.writer import demo_hparams
from s2core.modelfile.hparams import Hparams

#: the transcript of the default reference voice
DEFAULT_TRANSCRIPT = "This is the voice the demo speaks with."
#: frames of the default reference voice (about 2.2 s of audio)
DEFAULT_REFERENCE_FRAMES = 48


def default_reference(hp: Hparams, seed: int = 1234) -> np.ndarray:
    """The default voice's codes [num_codebooks, T] (random: the embedded model is random too)."""
    rng = np.random.default_rng(seed)
    return rng.integers(0, hp.codebook_size, (hp.num_codebooks, DEFAULT_REFERENCE_FRAMES))


def default_model_is_cached(weight_type: str = "f16", seed: int = 0) -> bool:
    return model_path(demo_hparams(), weight_type, seed=seed, stem="demo",
                      codec=demo_codec_config()).exists()


def default_model_files(weight_type: str = "f16", seed: int = 0,
                        progress: Callable[[int, int], None] | None = None) -> tuple[Path, Path]:
    """(model path, tokenizer path) of the embedded default model, written once into the
    cache."""
    hp = demo_hparams()
    path = cached_model(hp, weight_type, seed=seed, stem="demo", codec=demo_codec_config(),
                        progress=progress)
    return path, cached_tokenizer(hp, stem="demo-tokenizer")
