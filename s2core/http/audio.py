"""Audio in the formats HTTP clients ask for, piece by piece as the codec decodes.

`wav` (16-bit mono; a streamed one has its size fields at 0xFFFFFFFF, the length being
unknown when the header leaves) and `pcm` (raw s16le mono) go out as each piece comes;
`flac`, `mp3` and `opus` are compressed by libsndfile (soundfile) once the audio is complete,
and offered only where this install's libsndfile writes them.
"""

from __future__ import annotations

import importlib.util
import io
import struct

import numpy as np

from s2core.codec.audio import to_pcm16

#: what each format is called in the X-Audio-Encoding header, and its media type
MEDIA_TYPES = {"wav": "audio/wav", "pcm": "audio/pcm", "flac": "audio/flac",
               "mp3": "audio/mpeg", "opus": "audio/ogg", "aac": "audio/aac"}
ENCODING_NAMES = {"wav": "pcm_s16le", "pcm": "pcm_s16le", "flac": "flac", "mp3": "mp3",
                  "opus": "opus"}
#: the formats sent as they are decoded
STREAMED = ("wav", "pcm")
#: libsndfile's (format, subtype) of the compressed ones
_SOUNDFILE = {"flac": ("FLAC", "PCM_16"), "mp3": ("MP3", "MPEG_LAYER_III"),
              "opus": ("OGG", "OPUS")}


def available_formats() -> list[str]:
    """The response formats this install encodes."""
    formats = list(STREAMED)
    if importlib.util.find_spec("soundfile") is not None:
        import soundfile
        for name, (fmt, subtype) in _SOUNDFILE.items():
            if subtype in soundfile.available_subtypes(fmt):
                formats.append(name)
    return formats


def wav_header(sample_rate: int, n_samples: int | None) -> bytes:
    """A 44-byte 16-bit mono WAV header; n_samples None: streamed (sizes 0xFFFFFFFF)."""
    data = 0xFFFFFFFF if n_samples is None else 2 * n_samples
    riff = 0xFFFFFFFF if n_samples is None else 36 + data
    return (b"RIFF" + struct.pack("<I", riff) + b"WAVEfmt " +
            struct.pack("<IHHIIHH", 16, 1, 1, sample_rate, 2 * sample_rate, 2, 16) +
            b"data" + struct.pack("<I", data))


class Encoder:
    """Float audio pieces at `rate_in` -> the bytes of one response in `fmt` at `rate_out`.

    `begin()` the first bytes (a streamed WAV's header), `piece(audio)` the bytes of each
    decoded piece (empty for the compressed formats), `end()` the rest."""

    def __init__(self, fmt: str, rate_in: int, rate_out: int | None = None,
                 streamed: bool = True):
        self.fmt = fmt
        self.rate_in = rate_in
        self.rate_out = rate_out or rate_in
        self.streamed = streamed and fmt in STREAMED
        self._kept: list[np.ndarray] = []
        self._resampler = None
        if self.rate_out != rate_in:
            import soxr
            self._resampler = soxr.ResampleStream(rate_in, self.rate_out, 1, dtype="float32",
                                                  quality="VHQ")

    def begin(self) -> bytes:
        return wav_header(self.rate_out, None) if self.streamed and self.fmt == "wav" else b""

    def piece(self, audio: np.ndarray) -> bytes:
        audio = self._resample(audio, last=False)
        if not self.streamed:
            self._kept.append(audio)
            return b""
        return to_pcm16(audio).tobytes()

    def end(self) -> bytes:
        tail = self._resample(np.zeros(0, np.float32), last=True)
        if self.streamed:
            return to_pcm16(tail).tobytes() if tail.size else b""
        self._kept.append(tail)
        audio = np.concatenate(self._kept) if self._kept else np.zeros(0, np.float32)
        if self.fmt == "wav":
            pcm = to_pcm16(audio)
            return wav_header(self.rate_out, pcm.size) + pcm.tobytes()
        if self.fmt == "pcm":
            return to_pcm16(audio).tobytes()
        import soundfile
        fmt, subtype = _SOUNDFILE[self.fmt]
        out = io.BytesIO()
        # the 16-bit samples wav and pcm send (libsndfile would scale floats its own way)
        soundfile.write(out, to_pcm16(audio), self.rate_out, format=fmt, subtype=subtype)
        return out.getvalue()

    def _resample(self, audio: np.ndarray, last: bool) -> np.ndarray:
        audio = np.asarray(audio, np.float32).reshape(-1)
        if self._resampler is None:
            return audio
        return np.asarray(self._resampler.resample_chunk(audio, last=last), np.float32)
