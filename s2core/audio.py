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

from .errors import S2CoreError

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
    audio = np.asarray(audio, dtype=np.float32).reshape(-1)
    if not np.all(np.isfinite(audio)):
        raise AudioFileError(f"{path}: refusing to write non-finite samples")
    pcm = np.round(np.clip(audio, -1.0, 1.0) * 32767.0).astype("<i2")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(int(sample_rate))
        w.writeframes(pcm.tobytes())
    return path


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
