"""Audio files for the codec: read any common format as float32 mono, write 16-bit PCM WAV,
resample to the codec's rate.

Every recording is given as a path, bytes or a binary file object; its sample rate, channels
and length are checked against `AudioLimits` from the header, before a sample is read, and it
is read and resampled in blocks. Every file is written under a unique temporary name and
renamed into place.

Reading uses soundfile (libsndfile: WAV of every sample format, FLAC, OGG, ...) when installed
(`pip install 's2core[audio]'`), else Python's own `wave` module (PCM WAV only). Writing needs
nothing: 16-bit PCM mono WAV is what the codec's 44.1 kHz output is heard as. Resampling uses
soxr (the SoX resampler, very high quality preset), never a hand-written filter.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import os
import struct
import wave
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Iterable, Union

import numpy as np

from s2core.errors import S2CoreError
from s2core.fileio import atomic_output, open_regular, temporary_sibling

AUDIO_EXTRA_HINT = "pip install 's2core[audio]'"


class AudioFileError(S2CoreError, ValueError):
    """An audio file that cannot be read or written, or a resampling that cannot run here;
    `check` names the rule (`not_regular_file`, `sample_rate`, `duration`, `format`, ...)."""

    def __init__(self, message: str, check: str = "audio_file"):
        super().__init__(f"[{check}] {message}")
        self.check = check


def _error(message: str, check: str) -> AudioFileError:
    return AudioFileError(message, check)


@dataclass(frozen=True)
class AudioLimits:
    """What a recording may be, checked from its header before a sample is read (and again
    while reading, for formats whose header does not say): a sample rate in [min_sample_rate,
    max_sample_rate] and at most max_seconds long (None: no bound). The defaults are for a
    reference voice: S2 Pro is trained on references of seconds, and 60 s keeps a reference's
    memory and encoding time small whatever is uploaded."""

    min_sample_rate: int = 4000
    max_sample_rate: int = 384000
    max_seconds: float | None = 60.0
    max_channels: int = 64


#: the limits read_audio and read_for_codec apply unless given others
DEFAULT_LIMITS = AudioLimits()
#: frames read (and resampled) at a time: memory does not grow with the recording's length
BLOCK_FRAMES = 1 << 16

AudioSource = Union[str, os.PathLike, bytes, bytearray, memoryview, BinaryIO]


def read_audio(source: AudioSource, limits: AudioLimits = DEFAULT_LIMITS
               ) -> tuple[np.ndarray, int]:
    """(float32 samples in [-1, 1], mixed down to mono; sample rate) of an audio file, given
    as a path, as bytes (an upload) or as a binary file object."""
    with _Reader(source, limits) as reader:
        return reader.read_all(), reader.rate


def probe_audio(source: AudioSource, limits: AudioLimits = DEFAULT_LIMITS
                ) -> tuple[int, int, int]:
    """(sample rate, frames, channels) from a recording's header, checked against `limits`;
    no sample is read."""
    with _Reader(source, limits) as reader:
        return reader.rate, reader.frames, reader.channels


def read_for_codec(source: AudioSource, sample_rate: int,
                   limits: AudioLimits = DEFAULT_LIMITS) -> np.ndarray:
    """A recording as the codec's encoder takes it: float32 mono at `sample_rate`, read and
    resampled block by block (the same samples as resampling it whole)."""
    with _Reader(source, limits) as reader:
        if reader.rate == sample_rate:
            return reader.read_all()
        return _Resampler(reader.rate, sample_rate).resample_blocks(reader.blocks(),
                                                                    reader.frames)


class _Reader:
    """One recording opened for reading: header checked against `limits`, then mono blocks."""

    def __init__(self, source: AudioSource, limits: AudioLimits):
        self.limits = limits
        self.name, self._file, self._own = _open_source(source)
        try:
            self._open_decoder()
            self._check_header()
        except BaseException:
            self.close()
            raise

    def _open_decoder(self) -> None:
        self._sf = self._wav = None
        if importlib.util.find_spec("soundfile") is not None:
            import soundfile
            try:
                self._sf = soundfile.SoundFile(self._file)
            except (RuntimeError, TypeError, ValueError, OverflowError,
                    soundfile.LibsndfileError) as exc:
                raise AudioFileError(f"{self.name}: not a readable audio file ({exc})",
                                     "format") from None
            self.rate, self.frames, self.channels = (self._sf.samplerate, self._sf.frames,
                                                     self._sf.channels)
            return
        try:
            self._wav = wave.open(self._file, "rb")
            self.rate, self.channels = self._wav.getframerate(), self._wav.getnchannels()
            self.frames, self._width = self._wav.getnframes(), self._wav.getsampwidth()
        except (wave.Error, EOFError, ValueError, OverflowError, struct.error) as exc:
            raise AudioFileError(f"{self.name}: not a PCM WAV file ({exc}); other formats (float "
                                 f"WAV, FLAC, ...) need soundfile: {AUDIO_EXTRA_HINT}",
                                 "format") from None
        if self._width not in (1, 2, 3, 4):
            raise AudioFileError(f"{self.name}: {8 * self._width}-bit samples are not PCM WAV",
                                 "format")
        # a forged RIFF or data size: the header may not promise more than the file holds
        left = _bytes_left(self._file)
        if left is not None:
            self.frames = min(self.frames, left // max(1, self._width * self.channels))

    def _check_header(self) -> None:
        lim = self.limits
        if not lim.min_sample_rate <= self.rate <= lim.max_sample_rate:
            raise AudioFileError(f"{self.name}: sample rate {self.rate} Hz is outside "
                                 f"[{lim.min_sample_rate}, {lim.max_sample_rate}] "
                                 "(AudioLimits.min_sample_rate/max_sample_rate)", "sample_rate")
        if not 1 <= self.channels <= lim.max_channels:
            raise AudioFileError(f"{self.name}: {self.channels} channels, outside [1, "
                                 f"{lim.max_channels}]", "channels")
        if self.frames <= 0:
            raise AudioFileError(f"{self.name}: holds no samples", "empty")
        if lim.max_seconds is not None and self.frames > self.max_frames:
            raise AudioFileError(f"{self.name}: {self.frames / self.rate:.1f} s long, more than "
                                 f"the {lim.max_seconds:g} s allowed (AudioLimits.max_seconds)",
                                 "duration")

    @property
    def max_frames(self) -> int:
        s = self.limits.max_seconds
        return int(s * self.rate) if s is not None else self.frames

    def blocks(self):
        """Mono float32 blocks of at most BLOCK_FRAMES frames, at most `frames` in all."""
        left = self.frames
        while left > 0:
            data = self._read(min(BLOCK_FRAMES, left))
            if data.shape[0] == 0:
                return
            left -= data.shape[0]
            yield (data.mean(axis=1, dtype=np.float64).astype(np.float32)
                   if data.shape[1] > 1 else np.ascontiguousarray(data[:, 0]))

    def read_all(self) -> np.ndarray:
        out = np.empty(self.frames, np.float32)
        n = 0
        for block in self.blocks():
            out[n:n + block.size] = block
            n += block.size
        if n == 0:
            raise AudioFileError(f"{self.name}: holds no samples", "empty")
        return out[:n] if n < self.frames else out

    def _read(self, n: int) -> np.ndarray:
        try:
            if self._sf is not None:
                return self._sf.read(n, dtype="float32", always_2d=True)
            return _pcm_to_float(self._wav.readframes(n), self._width, self.channels)
        except (RuntimeError, ValueError, EOFError, wave.Error, OSError) as exc:
            raise AudioFileError(f"{self.name}: cannot read its samples ({exc})",
                                 "format") from None

    def close(self) -> None:
        for obj in (getattr(self, "_sf", None), getattr(self, "_wav", None)):
            if obj is not None:
                with contextlib.suppress(Exception):
                    obj.close()
        if self._own:
            self._file.close()

    def __enter__(self) -> "_Reader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _open_source(source: AudioSource) -> tuple[str, BinaryIO, bool]:
    """(a name for messages, a binary file object, whether we opened it)."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        return "<audio bytes>", io.BytesIO(bytes(source)), True
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        return str(path), open_regular(path, _error, "audio file"), True
    if hasattr(source, "read") and hasattr(source, "seek"):
        return getattr(source, "name", "<audio stream>"), source, False
    raise AudioFileError(f"audio must be a path, bytes or a binary file object, got "
                         f"{type(source).__name__}", "source_type")


def _bytes_left(f: BinaryIO) -> int | None:
    try:
        here = f.tell()
        end = f.seek(0, io.SEEK_END)
        f.seek(here)
        return end - here
    except (OSError, ValueError):
        return None


def _pcm_to_float(raw: bytes, width: int, channels: int) -> np.ndarray:
    """PCM WAV bytes (8/16/24/32-bit integers) -> float32 [frames, channels]."""
    usable = len(raw) - len(raw) % (width * channels)
    raw = raw[:usable]
    if width == 1:
        ints = np.frombuffer(raw, np.uint8).astype(np.int32) - 128
    elif width == 3:  # little-endian 24-bit: widen to 32 bits, sign kept by the top byte
        b = np.frombuffer(raw, np.uint8).reshape(-1, 3).astype(np.int32)
        ints = (b[:, 0] << 8 | b[:, 1] << 16 | b[:, 2] << 24) >> 8
    else:
        ints = np.frombuffer(raw, {2: "<i2", 4: "<i4"}[width]).astype(np.int32)
    scale = float(2 ** (8 * width - 1))
    return (ints / scale).astype(np.float32).reshape(-1, channels)


def _read_pcm_wav(path: str | os.PathLike) -> tuple[np.ndarray, int]:
    """PCM WAV (8/16/24/32-bit integers) through the standard library: [frames, channels]."""
    with open_regular(path, _error, "audio file") as f:
        try:
            with wave.open(f, "rb") as w:
                width, channels, rate = w.getsampwidth(), w.getnchannels(), w.getframerate()
                raw = w.readframes(w.getnframes())
        except (wave.Error, EOFError) as exc:
            raise AudioFileError(f"{path}: not a PCM WAV file ({exc}); other formats (float "
                                 f"WAV, FLAC, ...) need soundfile: {AUDIO_EXTRA_HINT}",
                                 "format") from exc
    return _pcm_to_float(raw, width, channels), rate


def write_wav(path: str | os.PathLike, audio: np.ndarray, sample_rate: int) -> Path:
    """Mono 16-bit PCM WAV; samples are clipped to [-1, 1] and rounded. Written to a unique
    temporary name beside `path` and renamed into place."""
    pcm = to_pcm16(audio, str(path))  # refuse before a file exists
    path = Path(path)
    with atomic_output(path, _error, "WAV file") as f:
        with wave.open(f, "wb") as w:
            w.setnchannels(1)
            w.setsampwidth(2)
            w.setframerate(int(sample_rate))
            w.writeframes(pcm.tobytes())
    return path


def to_pcm16(audio: np.ndarray, what: str = "audio") -> np.ndarray:
    """float samples -> little-endian int16 (clipped to [-1, 1], rounded); non-finite refused."""
    audio = np.asarray(audio, dtype=np.float32).reshape(-1)
    if not np.all(np.isfinite(audio)):
        raise AudioFileError(f"{what}: refusing to write non-finite samples", "finite")
    return np.round(np.clip(audio, -1.0, 1.0) * 32767.0).astype("<i2")


class WavWriter:
    """A mono 16-bit PCM WAV that grows as audio arrives (streaming synthesis).

    The file is created under a unique temporary name, its header written, and renamed onto
    `path` at once: `path` is then a new file (never the inode of what was there, so never an
    input's), playable at every moment. The header's lengths are rewritten after every `write`
    (the `wave` module patches them on a seekable file), so a crash or Ctrl-C leaves the audio
    made so far.
    """

    def __init__(self, path: str | os.PathLike, sample_rate: int):
        self.path = Path(path)
        self.sample_rate = int(sample_rate)
        self.samples = 0
        self._wav = None
        try:
            tmp = temporary_sibling(self.path)
        except OSError as exc:
            raise AudioFileError(f"cannot write the WAV file {self.path}: "
                                 f"{exc.strerror or exc}", "write") from None
        try:
            self._file = open(tmp, "r+b")
            self._wav = wave.open(self._file, "wb")
            self._wav.setnchannels(1)
            self._wav.setsampwidth(2)
            self._wav.setframerate(self.sample_rate)
            self._wav.writeframes(b"")  # the header now, so an empty stream is a valid file
            self._file.flush()
            os.replace(tmp, self.path)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise AudioFileError(f"cannot write the WAV file {self.path}: "
                                 f"{exc.strerror or exc}", "write") from None

    @property
    def seconds(self) -> float:
        return self.samples / self.sample_rate

    def write(self, audio: np.ndarray) -> None:
        if self._wav is None:
            raise AudioFileError(f"{self.path}: already closed", "closed")
        pcm = to_pcm16(audio, str(self.path))
        try:
            self._wav.writeframes(pcm.tobytes())
            self._file.flush()  # readers (a player, a tail) see every sample written so far
        except OSError as exc:
            raise AudioFileError(f"cannot write the WAV file {self.path}: "
                                 f"{exc.strerror or exc}", "write") from None
        self.samples += pcm.size

    def close(self) -> None:
        if self._wav is not None:
            wav, self._wav = self._wav, None
            try:
                wav.close()  # wave leaves a file object it was given open
            except OSError as exc:
                raise AudioFileError(f"cannot write the WAV file {self.path}: "
                                     f"{exc.strerror or exc}", "write") from None
            finally:
                self._file.close()

    def __enter__(self) -> "WavWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def resample(audio: np.ndarray, rate_in: int, rate_out: int) -> np.ndarray:
    """float32 mono audio from rate_in to rate_out (soxr, very high quality), in blocks: the
    memory beyond the output does not grow with the length."""
    audio = np.asarray(audio, dtype=np.float32).reshape(-1)
    if rate_in == rate_out:
        return audio
    blocks = (audio[start:start + BLOCK_FRAMES] for start in range(0, audio.size, BLOCK_FRAMES))
    return _Resampler(rate_in, rate_out).resample_blocks(blocks, audio.size)


class _Resampler:
    """soxr's streaming resampler (its samples equal a one-shot resample's), with rates checked
    as positive ints first: soxr would otherwise fail with a raw error or allocate without end."""

    def __init__(self, rate_in: int, rate_out: int):
        for name, rate in (("rate_in", rate_in), ("rate_out", rate_out)):
            if isinstance(rate, bool) or not isinstance(rate, (int, np.integer)) or \
                    not 0 < rate <= DEFAULT_LIMITS.max_sample_rate:
                raise AudioFileError(f"resampling: {name} must be an int in [1, "
                                     f"{DEFAULT_LIMITS.max_sample_rate}], got {rate!r}",
                                     "sample_rate")
        self.rate_in, self.rate_out = int(rate_in), int(rate_out)
        if importlib.util.find_spec("soxr") is None:
            raise AudioFileError(f"resampling {rate_in} Hz to {rate_out} Hz needs soxr: "
                                 f"{AUDIO_EXTRA_HINT}", "soxr")
        import soxr
        self._stream = soxr.ResampleStream(self.rate_in, self.rate_out, 1, dtype="float32",
                                           quality="VHQ")

    def bound(self, n_in: int) -> int:
        """More output samples than n_in input samples can give."""
        return -(-n_in * self.rate_out // self.rate_in) + 64

    def push(self, block: np.ndarray, last: bool = False) -> np.ndarray:
        return np.asarray(self._stream.resample_chunk(block, last=last), np.float32)

    def resample_blocks(self, blocks: Iterable[np.ndarray], n_in: int) -> np.ndarray:
        """The n_in samples that `blocks` hold, resampled into one array allocated once at
        its bound (so the peak is the output, not the output twice)."""
        out = np.empty(self.bound(n_in), np.float32)
        n = 0
        for block in blocks:
            piece = self.push(block)
            out[n:n + piece.size] = piece
            n += piece.size
        piece = self.push(np.zeros(0, np.float32), last=True)
        out[n:n + piece.size] = piece
        return out[:n + piece.size]  # a view: a copy would double the peak
