"""The contract between the core and a backend's codec.

The core (`s2core.codec.model.Codec`) validates input, clamps codes (CODEC.md 4.1), pads audio
(CODEC.md 5.1) and owns the streaming state between pushes. A codec backend does the math only:
it holds the weights, decodes clamped codes and encodes padded audio. It declares what it is in
one frozen `CodecCapabilities`, which the selection policy and the kit read; a backend provides
one through its plugin (`BackendSpec.codec_class`) and announces it in its probe
(`Capabilities.codec`), so nothing heavy is imported until it is chosen.

Streaming is exact by construction (CODEC.md 4): every operation of the decode path is causal,
so a decoder needs only a bounded state (the last inputs of each causal conv, the previous
input of each overlapping ConvTranspose, the K/V of the post_module's last window - 1 frames
and the next RoPE position) to turn each pushed frame into exactly samples_per_frame samples.
A backend that implements `begin_stream` / `decode_stream` declares `streaming=True`; one-shot
decode is then one push from a fresh state. A backend that cannot stream declares False and the
core re-decodes a window of history instead (approximate, s2.cpp's way).
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from s2core.codec.file import CodecFile


@dataclass(frozen=True)
class CodecCapabilities:
    """What a backend's codec is, as far as the selection policy and the kit care."""

    device: str = "cpu"
    #: runs on an accelerator (GPU, Apple GPU)
    accelerator: bool = False
    #: precision of the arithmetic ("f32": F16 weights are widened and computed in float32)
    compute_dtype: str = "f32"
    #: exact stateful streaming decode (begin_stream / decode_stream)
    streaming: bool = True
    #: audio -> codes
    encode: bool = True
    #: GGUF types kept in memory as stored; the others are widened to float32
    native_weight_types: frozenset[str] = frozenset({"f32"})
    #: rank among codec providers (which backend decodes audio when none is named); None = the
    #: backend's own priority. A backend sets it from measurements of its convolutions.
    priority: int | None = None

    def describe(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["native_weight_types"] = sorted(self.native_weight_types)
        return d


class CodecBackend(ABC):
    """Base class of every backend's codec. Subclasses load weights in __init__."""

    #: registry name of the backend that provides it, set by subclasses
    name: ClassVar[str] = ""

    def __init__(self, codec_file: CodecFile, **options: Any):
        self.codec_file = codec_file
        self.hparams = codec_file.hparams
        self.layout = codec_file.layout

    @property
    @abstractmethod
    def capabilities(self) -> CodecCapabilities:
        """Concrete capabilities of this loaded codec."""

    # ---------------------------------------------------------------- decode
    def decode(self, codes: np.ndarray) -> np.ndarray:
        """One-shot decode of clamped int32 codes [num_codebooks, T] (T >= 1) into float32
        audio [T * samples_per_frame]. Default: one push from a fresh stream state."""
        audio, _ = self.decode_stream(self.begin_stream(), codes)
        return audio

    def begin_stream(self) -> Any:
        """A fresh streaming state: what decoding with nothing before looks like (zero
        history, RoPE position 0)."""
        raise NotImplementedError

    def decode_stream(self, state: Any, codes: np.ndarray) -> tuple[np.ndarray, Any]:
        """Decode the next frames `codes` [num_codebooks, n] (n >= 1, clamped int32) after
        those `state` has seen. Returns (float32 audio [n * samples_per_frame], the new state).

        Must not modify `state`: the core keeps it until the call succeeds, so a failure
        leaves the stream where it was."""
        raise NotImplementedError

    @property
    def streams(self) -> bool:
        """Whether this class implements the stateful decode."""
        return type(self).decode_stream is not CodecBackend.decode_stream

    # ---------------------------------------------------------------- encode
    def encode(self, audio: np.ndarray) -> np.ndarray:
        """float32 mono audio, already zero-padded to a multiple of frame_length (CODEC.md 5.1),
        -> int32 codes [num_codebooks, ceil(N / samples_per_frame)]."""
        raise NotImplementedError

    # ---------------------------------------------------------------- host hand-off
    def close(self) -> None:
        """Release the weights and anything else held."""
