"""s2.cpp's voice profile file (`.s2voice`, SPEC 8): a reference voice's codes and transcript.

Little-endian: magic `S2VOICE\\0`; u32 version = 1; i32 num_codebooks; i32 T_prompt;
i32 sample_rate; i32 codebook_size; u64 transcript_len (bytes with the final NUL);
u64 codes_size (bytes); the transcript (NUL-terminated UTF-8); codes int32 [num_codebooks, T].

Files written here load in s2.cpp and the other way round. Reading refuses everything s2.cpp
refuses (wrong magic or version, a zero transcript length, a transcript without its NUL, a
truncated file) and what s2.cpp would read into undefined behaviour: sizes that disagree
(codes_size != num_codebooks x T x 4), non-positive counts, codes outside the codebook, a
transcript that is not UTF-8 or holds a NUL, bytes after the codes. Every refusal is a
VoiceFileError whose `check` names the rule; nothing crashes and nothing huge is allocated
before the sizes are checked against the file's length.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from s2core.errors import VoiceFileError
from s2core.fileio import atomic_output, read_bounded
from s2core.modelfile.hparams import Hparams

MAGIC = b"S2VOICE\0"
VERSION = 1
#: S2 Pro's codec sample rate (s2.cpp checks a profile's against its codec's)
SAMPLE_RATE = 44100
_HEADER = struct.Struct("<8sIiiiiQQ")  # 44 bytes
#: the largest .s2voice read (a minute of reference is ~60 KB of codes; this allows hours)
MAX_VOICE_BYTES = 16 << 20


@dataclass(frozen=True, eq=False)
class Voice:
    """A reference voice: its transcript and codes [num_codebooks, T] (int32)."""

    transcript: str
    codes: np.ndarray
    sample_rate: int = SAMPLE_RATE
    codebook_size: int = 4096

    @property
    def num_codebooks(self) -> int:
        return int(self.codes.shape[0])

    @property
    def n_frames(self) -> int:
        return int(self.codes.shape[1])

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Voice":
        return read_s2voice(path)

    def save(self, path: str | os.PathLike) -> Path:
        return write_s2voice(path, self)

    def check_fits(self, hp: Hparams, source: str = "voice") -> None:
        """s2.cpp's is_compatible: the model's codebooks and the codec's sample rate."""
        mine = (self.num_codebooks, self.codebook_size, self.sample_rate)
        want = (hp.num_codebooks, hp.codebook_size, SAMPLE_RATE)
        if mine != want:
            raise VoiceFileError(f"{source}: the voice has (num_codebooks, codebook_size, "
                                 f"sample_rate) = {mine}; this model needs {want}", "compatible")

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, Voice) and self.transcript == other.transcript
                and np.array_equal(self.codes, other.codes)
                and (self.sample_rate, self.codebook_size)
                == (other.sample_rate, other.codebook_size))


def write_s2voice(path: str | os.PathLike, voice: Voice) -> Path:
    """Write `voice` as s2.cpp does (atomically: a crash never leaves half a file)."""
    codes = np.asarray(voice.codes)
    if codes.ndim != 2 or codes.shape[0] < 1 or codes.shape[1] < 1 or codes.dtype.kind not in "iu":
        raise VoiceFileError(f"codes must be integers [num_codebooks, T >= 1], got "
                             f"{codes.dtype} {codes.shape}", "codes_shape")
    if ((codes < 0) | (codes >= voice.codebook_size)).any():
        raise VoiceFileError(f"codes must lie in [0, codebook_size={voice.codebook_size})",
                             "codes_range")
    if not isinstance(voice.transcript, str) or not voice.transcript or "\0" in voice.transcript:
        raise VoiceFileError("the transcript must be a non-empty string without NUL "
                             f"characters, got {voice.transcript!r}", "transcript")
    text = voice.transcript.encode("utf-8") + b"\0"
    body = codes.astype("<i4").tobytes()
    header = _HEADER.pack(MAGIC, VERSION, codes.shape[0], codes.shape[1], voice.sample_rate,
                          voice.codebook_size, len(text), len(body))
    path = Path(path)
    with atomic_output(path, _error, "voice file") as f:  # a unique temporary name, renamed
        f.write(header + text + body)
    return path


def read_s2voice(path: str | os.PathLike, max_bytes: int | None = None) -> Voice:
    """Read an .s2voice: a regular file of at most `max_bytes` (default MAX_VOICE_BYTES),
    refused before its body is read otherwise."""
    path = Path(path)
    limit = MAX_VOICE_BYTES if max_bytes is None else max_bytes
    return parse_s2voice(read_bounded(path, limit, _error, "voice file"), str(path))


def _error(message: str, check: str) -> VoiceFileError:
    return VoiceFileError(message, check)


def parse_s2voice(data: bytes, source: str = "<bytes>") -> Voice:
    def fail(check: str, message: str) -> VoiceFileError:
        return VoiceFileError(f"{source}: {message}", check)

    if len(data) < len(MAGIC) or data[:len(MAGIC)] != MAGIC:
        if len(data) < len(MAGIC) and MAGIC.startswith(data):
            raise fail("truncated", f"truncated: {len(data)} bytes, not even the magic")
        raise fail("magic", f"not an .s2voice file (magic {data[:8]!r}, expected {MAGIC!r})")
    if len(data) < _HEADER.size:
        raise fail("truncated", f"truncated: {len(data)} bytes, the header needs {_HEADER.size}")
    _, version, n_cb, T, rate, cb_size, text_len, codes_size = _HEADER.unpack_from(data)
    if version != VERSION:
        raise fail("version", f"unsupported version {version} (s2.cpp writes and reads {VERSION})")
    if text_len == 0:
        raise fail("transcript_length", "the transcript length is 0 (it counts the final NUL)")
    end_text = _HEADER.size + text_len
    if end_text > len(data):
        raise fail("truncated", f"truncated: the transcript needs {text_len} bytes, the file "
                   f"has {len(data) - _HEADER.size} after the header")
    raw = data[_HEADER.size:end_text]
    if raw[-1:] != b"\0":
        raise fail("transcript_nul", "the transcript is not NUL-terminated")
    if b"\0" in raw[:-1]:
        raise fail("transcript_nul", "the transcript holds a NUL before its end (s2.cpp would "
                   "cut it there)")
    try:
        transcript = raw[:-1].decode("utf-8")
    except UnicodeDecodeError as exc:
        raise fail("transcript_utf8", f"the transcript is not UTF-8: {exc}") from exc
    if end_text + codes_size > len(data):
        raise fail("truncated", f"truncated: the codes need {codes_size} bytes, the file has "
                   f"{len(data) - end_text} after the transcript")
    if n_cb <= 0 or T <= 0 or cb_size <= 0 or rate <= 0:
        raise fail("header_values", f"num_codebooks={n_cb}, T_prompt={T}, codebook_size="
                   f"{cb_size}, sample_rate={rate}: all must be positive")
    if codes_size != n_cb * T * 4:
        raise fail("codes_size", f"codes_size is {codes_size} bytes but num_codebooks x "
                   f"T_prompt x 4 = {n_cb} x {T} x 4 = {n_cb * T * 4}")
    if end_text + codes_size != len(data):
        raise fail("trailing_bytes", f"{len(data) - end_text - codes_size} bytes follow the "
                   "codes")
    codes = np.frombuffer(data, dtype="<i4", count=n_cb * T, offset=end_text)
    codes = codes.reshape(n_cb, T).astype(np.int32)
    bad = (codes < 0) | (codes >= cb_size)
    if bad.any():
        cb, t = (int(x[0]) for x in np.nonzero(bad))
        raise fail("codes_range", f"code [{cb}, {t}] is {int(codes[cb, t])}, outside "
                   f"[0, codebook_size={cb_size}) ({int(bad.sum())} such codes)")
    return Voice(transcript, codes, rate, cb_size)
