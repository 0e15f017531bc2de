"""The codec object users hold: validation, clamping, streaming and life cycle.

Every check runs before the backend is called; a streaming decoder's state advances only
after a push succeeds, so a failed call leaves everything exactly as it was.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from s2core.errors import InvalidInputError, S2CoreError, backend_call
from s2core.codec.backend import CodecBackend, CodecCapabilities
from s2core.codec.file import CodecFile
from s2core.codec.hparams import CodecHparams

STREAM_MODES = ("auto", "exact", "windowed")


class CodecClosedError(S2CoreError, RuntimeError):
    """A call on a codec after close()."""


class Codec:
    """The S2 Pro audio codec on one backend. Create it with `s2core.load_codec()`."""

    def __init__(self, codec_file: CodecFile, backend: CodecBackend):
        self.codec_file = codec_file
        self.backend: CodecBackend | None = backend
        self.hparams: CodecHparams = codec_file.hparams

    # ------------------------------------------------------------------ what it is
    @property
    def sample_rate(self) -> int:
        return self.hparams.sample_rate

    @property
    def samples_per_frame(self) -> int:
        """Audio samples per code frame (2048 for S2 Pro)."""
        return self.hparams.samples_per_frame

    @property
    def num_codebooks(self) -> int:
        return self.hparams.num_codebooks

    @property
    def codebook_sizes(self) -> tuple[int, ...]:
        """Entries of each codebook, semantic first: codes are clamped into [0, size - 1]."""
        return self.hparams.codebook_sizes

    @property
    def capabilities(self) -> CodecCapabilities:
        return self._backend().capabilities

    @property
    def backend_name(self) -> str:
        return self._backend().name

    @property
    def can_encode(self) -> bool:
        return self.capabilities.encode and self.codec_file.can_encode

    # ------------------------------------------------------------------ decode
    def decode(self, codes: Any) -> np.ndarray:
        """codes [num_codebooks, T] (any integer dtype; out-of-range values are clamped into
        their codebook as s2.cpp does) -> float32 audio [T * samples_per_frame]."""
        codes = self.check_codes(codes)
        if codes.shape[1] == 0:
            return np.zeros(0, np.float32)
        backend = self._backend()
        with backend_call(backend.name, f"decode({codes.shape[1]} frames)"):
            audio = backend.decode(codes)
        return self._audio(audio, codes.shape[1])

    def stream_decoder(self, mode: str = "auto", history_frames: int | None = None
                       ) -> "StreamDecoder":
        """A decoder that takes frames as they come: `.push(codes [C, n])` returns the audio
        of those n frames, `.flush()` whatever remains (nothing: every op is causal).

        mode "exact" (the backend's stateful decode: the same samples as one-shot decode,
        at a cost per frame that does not grow), "windowed" (s2.cpp's way: re-decode the last
        `history_frames` frames with the new ones and keep the new samples; approximate once
        the stream is longer than the history), "auto" (exact where the backend streams)."""
        if mode not in STREAM_MODES:
            raise InvalidInputError("stream_mode", f"mode={mode!r} is not one of {STREAM_MODES}")
        backend = self._backend()
        exact = mode == "exact" or (mode == "auto" and backend.capabilities.streaming)
        if exact and not (backend.capabilities.streaming and backend.streams):
            raise InvalidInputError("stream_mode", f"backend {backend.name!r} declares no exact "
                                    "streaming decode; use mode='windowed' or 'auto'")
        if history_frames is None:
            history_frames = self.hparams.streaming_history_frames
        if isinstance(history_frames, bool) or not isinstance(history_frames, (int, np.integer)) \
                or history_frames < 0:
            raise InvalidInputError("history_frames", "history_frames must be an int >= 0, got "
                                    f"{history_frames!r}")
        return StreamDecoder(self, exact, int(history_frames))

    # ------------------------------------------------------------------ encode
    def encode(self, audio: Any) -> np.ndarray:
        """float mono audio at `sample_rate` (1-D, finite) -> int32 codes [num_codebooks, T],
        T = ceil(len / samples_per_frame) (of the length padded to frame_length). Resample
        other rates first (s2core.codec.audio)."""
        backend = self._backend()
        if not backend.capabilities.encode:
            raise InvalidInputError("encode_supported",
                                    f"backend {backend.name!r} declares no codec encoder")
        if not self.codec_file.can_encode:
            raise InvalidInputError("encode_supported", f"{self.codec_file.path}: "
                                    f"{self.codec_file.encode_unavailable_reason}")
        audio = self.check_audio(audio)
        pad = -len(audio) % self.hparams.frame_length  # CODEC.md 5.1
        padded = np.concatenate([audio, np.zeros(pad, np.float32)]) if pad else audio
        # the strided convs pad the rest (CODEC.md 5.5): ceil(N / 2048) when frame_length
        # divides samples_per_frame, as in S2 Pro
        n_frames = -(-len(padded) // self.samples_per_frame)
        with backend_call(backend.name, f"encode({len(padded)} samples)"):
            codes = np.asarray(backend.encode(padded))
        if codes.shape != (self.num_codebooks, n_frames):
            raise S2CoreError(f"backend {backend.name!r} encoded {len(audio)} samples into codes "
                              f"of shape {codes.shape}, expected {(self.num_codebooks, n_frames)}")
        return codes.astype(np.int32, copy=False)

    # ------------------------------------------------------------------ checks
    def check_codes(self, codes: Any) -> np.ndarray:
        """Validated codes as clamped int32 [num_codebooks, T]; InvalidInputError otherwise."""
        try:
            arr = np.asarray(codes)
        except (ValueError, TypeError, OverflowError) as exc:  # a ragged list, say
            raise InvalidInputError("codes_shape", f"codes must be a rectangular "
                                    f"[num_codebooks, T] array: {exc}") from None
        if arr.dtype == np.bool_ or not np.issubdtype(arr.dtype, np.integer):
            raise InvalidInputError("codes_dtype", f"codes must be integers, got dtype {arr.dtype}")
        if arr.ndim != 2 or arr.shape[0] != self.num_codebooks:
            raise InvalidInputError(
                "codes_shape", f"codes must have shape [num_codebooks={self.num_codebooks}, T] "
                f"(codebook-major, semantic first), got {list(arr.shape)}")
        return self.clamp(arr)

    def clamp(self, codes: np.ndarray) -> np.ndarray:
        """Each row into [0, size - 1] of its codebook, as s2.cpp (negatives -> 0)."""
        upper = np.asarray(self.codebook_sizes, np.int64)[:, None] - 1
        if np.issubdtype(codes.dtype, np.unsignedinteger):
            codes = np.minimum(codes, np.iinfo(np.int64).max).astype(np.int64)
        return np.clip(codes.astype(np.int64, copy=False), 0, upper).astype(np.int32)

    def check_audio(self, audio: Any) -> np.ndarray:
        arr = np.asarray(audio)
        if not np.issubdtype(arr.dtype, np.floating):
            raise InvalidInputError(
                "audio_dtype", f"audio must be floating point in [-1, 1], got dtype {arr.dtype} "
                "(s2core.codec.audio.read_wav converts PCM)")
        if arr.ndim != 1:
            raise InvalidInputError("audio_shape", f"audio must be mono, 1-D, got shape "
                                    f"{list(arr.shape)} (mix channels down first)")
        if arr.size == 0:
            raise InvalidInputError("audio_length", "audio is empty")
        if not np.all(np.isfinite(arr)):
            bad = int(np.size(arr) - np.count_nonzero(np.isfinite(arr)))
            raise InvalidInputError("audio_finite", f"audio holds {bad} non-finite samples "
                                    f"(first at index {int(np.flatnonzero(~np.isfinite(arr))[0])})")
        return np.ascontiguousarray(arr, dtype=np.float32)

    def _audio(self, audio: Any, n_frames: int) -> np.ndarray:
        out = np.asarray(audio, dtype=np.float32).reshape(-1)
        expected = n_frames * self.samples_per_frame
        if out.shape[0] != expected:
            raise S2CoreError(f"backend {self._backend().name!r} decoded {n_frames} frames into "
                              f"{out.shape[0]} samples, expected {expected}")
        return out

    # ------------------------------------------------------------------ life cycle
    def _backend(self) -> CodecBackend:
        if self.backend is None:
            raise CodecClosedError("the codec was closed")
        return self.backend

    def close(self) -> None:
        """Release the backend's weights and the file's memory map (idempotent)."""
        if self.backend is not None:
            backend, self.backend = self.backend, None
            try:
                with backend_call(backend.name, "close"):
                    backend.close()
            finally:
                self.codec_file.close()

    def __enter__(self) -> "Codec":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        name = self.backend.name if self.backend is not None else "closed"
        return (f"Codec({str(self.codec_file.path)!r}, backend={name!r}, "
                f"sample_rate={self.sample_rate}, samples_per_frame={self.samples_per_frame})")


class StreamDecoder:
    """Frames in, audio out, as they come (`Codec.stream_decoder()`)."""

    def __init__(self, codec: Codec, exact: bool, history_frames: int):
        self.codec = codec
        self.exact = exact
        self.history_frames = history_frames
        self._state: Any = None                  # exact: the backend's state
        self._history = np.zeros((codec.num_codebooks, 0), np.int32)  # windowed: past codes
        self._frames = 0

    @property
    def frames_decoded(self) -> int:
        return self._frames

    @property
    def mode(self) -> str:
        return "exact" if self.exact else "windowed"

    def push(self, codes: Any) -> np.ndarray:
        """Audio [n * samples_per_frame] for the next n frames, codes [num_codebooks, n]."""
        codes = self.codec.check_codes(codes)
        n = codes.shape[1]
        if n == 0:
            return np.zeros(0, np.float32)
        backend = self.codec._backend()
        if self.exact:
            with backend_call(backend.name, f"decode_stream({n} frames)"):
                state = backend.begin_stream() if self._state is None else self._state
                audio, new_state = backend.decode_stream(state, codes)
            audio = self.codec._audio(audio, n)
            self._state = new_state
        else:
            window = np.concatenate([self._history, codes], axis=1)
            with backend_call(backend.name, f"decode({window.shape[1]} frames)"):
                decoded = backend.decode(window)
            audio = self.codec._audio(decoded, window.shape[1])
            audio = audio[-n * self.codec.samples_per_frame:]
            self._history = window[:, window.shape[1] - min(self.history_frames, window.shape[1]):]
        self._frames += n
        return audio

    def flush(self) -> np.ndarray:
        """The audio still held back: none. Each push returns all of its frames' samples, since
        no operation of the decode path looks ahead (CODEC.md 4). Kept for the usual protocol."""
        self.codec._backend()
        return np.zeros(0, np.float32)

    def reset(self) -> None:
        """Start a new stream (position 0, no history)."""
        self._state = None
        self._history = self._history[:, :0]
        self._frames = 0
