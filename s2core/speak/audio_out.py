"""Codes to sound for a synthesis: the codec that pairs with a model, and audio as frames come.

    codec = s2core.load_codec("s2-pro-f16.gguf")           # the same file as the model
    check_codec_fits(codec, model.hparams)                   # same codebooks, or a clear error
    result = speak(model, tokenizer, text, voice="anna", audio=AudioOut(codec, stream=True))
    result.audio                                             # float32 at codec.sample_rate

`AudioOut` is the only place speech meets the codec. With `stream=True` each frame goes
through the codec's exact streaming decoder the moment the Slow-AR/Fast-AR produce it, so the
first audio exists after one frame (and a `WavWriter` can grow on disk); otherwise the codes
are decoded in one shot at the end. Both give the same samples: the streaming decoder is exact
(docs/codec.md, "Why decode can stream").
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from s2core.codec.audio import DEFAULT_LIMITS, AudioLimits, AudioSource, read_for_codec
from s2core.codec import Codec
from s2core.errors import InvalidInputError
from s2core.modelfile.hparams import Hparams


def check_codec_fits(codec: Codec, hp: Hparams) -> None:
    """The codec decodes this model's frames: one codebook per code of a frame. (Codes beyond a
    codebook's size are clamped, as s2.cpp does: S2 Pro's Fast-AR samples 4096 values for
    residual codebooks of 1024 entries; docs/codec.md 4.1.)"""
    if codec.num_codebooks != hp.num_codebooks:
        raise InvalidInputError(
            "codec_codebooks", f"the codec has {codec.num_codebooks} codebooks, the model "
            f"makes {hp.num_codebooks} codes a frame: they are not a pair")


def reference_codes_from_audio(codec: Codec, path: "AudioSource",
                               limits: AudioLimits = DEFAULT_LIMITS) -> np.ndarray:
    """A recording (a path, bytes or a binary file; any rate, mono or not; within `limits`,
    60 s by default) -> reference codes [num_codebooks, T] int32."""
    if not codec.can_encode:
        raise InvalidInputError(
            "reference_audio", f"{codec.codec_file.path}: this codec cannot encode "
            "(no encoder tensors, or its backend declares no encoder); give reference codes")
    return codec.encode(read_for_codec(path, codec.sample_rate, limits))


@dataclass
class AudioStats:
    """Where the audio's time went (seconds)."""

    decode_s: float = 0.0
    #: from the start of generation to the first audio samples (one shot: after the last frame)
    first_audio_s: float | None = None
    samples: int = 0
    sample_rate: int = 0
    mode: str = ""               # "streamed" or "one shot"
    chunks: list[float] = field(default_factory=list)  # decode seconds per pushed frame

    @property
    def audio_s(self) -> float:
        return self.samples / self.sample_rate if self.sample_rate else 0.0


class AudioOut:
    """The audio side of one synthesis (give it to `speak(audio=...)`).

    `on_audio(samples)` receives each piece of audio as it is made (for a `WavWriter`, a
    player, a socket); `stream=False` decodes once at the end instead of frame by frame.
    """

    def __init__(self, codec: Codec, stream: bool = True,
                 on_audio: Callable[[np.ndarray], Any] | None = None):
        self.codec = codec
        self.stream = bool(stream)
        self.on_audio = on_audio
        self.stats = AudioStats(sample_rate=codec.sample_rate,
                                mode="streamed" if stream else "one shot")
        self._pieces: list[np.ndarray] = []
        self._decoder = codec.stream_decoder("exact") if stream else None
        self._t0: float | None = None

    def start(self) -> None:
        """The synthesis begins now (time to first audio counts from here)."""
        self._t0 = time.perf_counter()

    def frame(self, codes: np.ndarray) -> None:
        """One frame's codes (num_codebooks,) as the generation yields it."""
        if self._decoder is None:
            return
        t = time.perf_counter()
        audio = self._decoder.push(np.asarray(codes).reshape(-1, 1))
        self._emit(audio, time.perf_counter() - t)

    def finish(self, codes: np.ndarray) -> np.ndarray:
        """All codes [num_codebooks, frames] once generation ended -> the whole audio."""
        t = time.perf_counter()
        if self._decoder is not None:
            rest = self._decoder.flush()
            if rest.size:
                self._emit(rest, time.perf_counter() - t)
        elif codes.shape[1]:
            self._emit(self.codec.decode(codes), time.perf_counter() - t)
        return (np.concatenate(self._pieces) if self._pieces else np.zeros(0, np.float32))

    def _emit(self, audio: np.ndarray, seconds: float) -> None:
        self.stats.decode_s += seconds
        self.stats.chunks.append(seconds)
        if audio.size and self.stats.first_audio_s is None and self._t0 is not None:
            self.stats.first_audio_s = time.perf_counter() - self._t0
        self.stats.samples += audio.size
        self._pieces.append(audio)
        if self.on_audio is not None:
            self.on_audio(audio)
