"""Audio files for the codec: read any common format as float32 mono, write 16-bit PCM WAV,
resample to the codec's rate.

Reading uses soundfile (libsndfile: WAV of every sample format, FLAC, OGG, ...) when installed
(`pip install 's2core[audio]'`), else Python's own `wave` module (PCM WAV only). Writing needs
nothing: 16-bit PCM mono WAV is what the codec's 44.1 kHz output is heard as. Resampling uses
soxr (the SoX resampler, very high quality preset), never a hand-written filter.
"""

from __future__ import annotations

import importlib.util
import os
import wave
from pathlib import Path

import numpy as np

from s2core.errors import S2CoreError

AUDIO_EXTRA_HINT = "pip install 's2core[audio]'"


class AudioFileError(S2CoreError, ValueError):
    """An audio file that cannot be read or written, or a resampling that cannot run here."""


def read_audio(path: str | os.PathLike) -> tuple[np.ndarray, int]:
    """(float32 samples in [-1, 1], mixed down to mono; sample rate) of an audio file."""
    path = Path(path)
    if not path.is_file():
        raise AudioFileError(f"audio file not found: {path}")
    if importlib.util.find_spec("soundfile") is not None:
        import soundfile
        try:
            data, rate = soundfile.read(str(path), dtype="float32", always_2d=True)
        except (RuntimeError, soundfile.LibsndfileError) as exc:
            raise AudioFileError(f"{path}: not a readable audio file ({exc})") from exc
    else:
        data, rate = _read_pcm_wav(path)
    if data.shape[0] == 0:
        raise AudioFileError(f"{path}: holds no samples")
    mono = data.mean(axis=1, dtype=np.float64).astype(np.float32) if data.shape[1] > 1 else data[:, 0]
    return np.ascontiguousarray(mono), int(rate)


def _read_pcm_wav(path: Path) -> tuple[np.ndarray, int]:
    """PCM WAV (8/16/24/32-bit integers) through the standard library: [frames, channels]."""
    try:
        with wave.open(str(path), "rb") as w:
            width, channels, rate = w.getsampwidth(), w.getnchannels(), w.getframerate()
            raw = w.readframes(w.getnframes())
    except (wave.Error, EOFError) as exc:
        raise AudioFileError(f"{path}: not a PCM WAV file ({exc}); other formats (float WAV, "
                             f"FLAC, ...) need soundfile: {AUDIO_EXTRA_HINT}") from exc
    if width == 1:
        ints = np.frombuffer(raw, np.uint8).astype(np.int32) - 128
    elif width == 3:  # little-endian 24-bit: widen to 32 bits, sign kept by the top byte
        b = np.frombuffer(raw, np.uint8).reshape(-1, 3).astype(np.int32)
        ints = (b[:, 0] << 8 | b[:, 1] << 16 | b[:, 2] << 24) >> 8
    else:
        ints = np.frombuffer(raw, {2: "<i2", 4: "<i4"}[width]).astype(np.int32)
    scale = float(2 ** (8 * width - 1))
    return (ints / scale).astype(np.float32).reshape(-1, channels), rate


def write_wav(path: str | os.PathLike, audio: np.ndarray, sample_rate: int) -> Path:
    """Mono 16-bit PCM WAV; samples are clipped to [-1, 1] and rounded."""
    to_pcm16(audio, str(path))  # refuse before a file exists
    with WavWriter(path, sample_rate) as w:
        w.write(audio)
    return w.path


def to_pcm16(audio: np.ndarray, what: str = "audio") -> np.ndarray:
    """float samples -> little-endian int16 (clipped to [-1, 1], rounded); non-finite refused."""
    audio = np.asarray(audio, dtype=np.float32).reshape(-1)
    if not np.all(np.isfinite(audio)):
        raise AudioFileError(f"{what}: refusing to write non-finite samples")
    return np.round(np.clip(audio, -1.0, 1.0) * 32767.0).astype("<i2")


class WavWriter:
    """A mono 16-bit PCM WAV that grows as audio arrives (streaming synthesis).

    The header's lengths are rewritten after every `write` (the `wave` module patches them on a
    seekable file), so the file on disk is a complete, playable WAV at every moment, and a
    crash or Ctrl-C leaves the audio made so far.
    """

    def __init__(self, path: str | os.PathLike, sample_rate: int):
        self.path = Path(path)
        self.sample_rate = int(sample_rate)
        self.samples = 0
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "wb")
        self._wav = wave.open(self._file, "wb")
        self._wav.setnchannels(1)
        self._wav.setsampwidth(2)
        self._wav.setframerate(self.sample_rate)
        self._wav.writeframes(b"")  # the header now, so an empty stream is still a valid file
        self._file.flush()

    @property
    def seconds(self) -> float:
        return self.samples / self.sample_rate

    def write(self, audio: np.ndarray) -> None:
        if self._wav is None:
            raise AudioFileError(f"{self.path}: already closed")
        pcm = to_pcm16(audio, str(self.path))
        self._wav.writeframes(pcm.tobytes())
        self._file.flush()  # readers (a player, a tail) see every sample written so far
        self.samples += pcm.size

    def close(self) -> None:
        if self._wav is not None:
            self._wav.close()  # wave leaves a file object it was given open
            self._file.close()
            self._wav = None

    def __enter__(self) -> "WavWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def resample(audio: np.ndarray, rate_in: int, rate_out: int) -> np.ndarray:
    """float32 mono audio from rate_in to rate_out (soxr, very high quality)."""
    audio = np.asarray(audio, dtype=np.float32)
    if rate_in == rate_out:
        return audio
    if importlib.util.find_spec("soxr") is None:
        raise AudioFileError(f"resampling {rate_in} Hz to {rate_out} Hz needs soxr: {AUDIO_EXTRA_HINT}")
    import soxr
    return np.asarray(soxr.resample(audio, rate_in, rate_out, quality="VHQ"), dtype=np.float32)


def read_for_codec(path: str | os.PathLike, sample_rate: int) -> np.ndarray:
    """A recording as the codec's encoder takes it: float32 mono at `sample_rate`."""
    audio, rate = read_audio(path)
    return resample(audio, rate, sample_rate)
