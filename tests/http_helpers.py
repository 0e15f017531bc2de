"""Shared pieces of the HTTP tests: an engine on the demo's exported model, and the same
request answered in process by speak()."""

from __future__ import annotations

import io
import wave
from pathlib import Path

import numpy as np

import s2core
from s2core.codec.audio import to_pcm16
from s2core.generation.loop import GenerationConfig
from s2core.speak import AudioOut, speak
from s2core.text.tokenizer import Tokenizer


def make_engine(assets: Path, voices_dir: Path, backend: str = "numpy", **options):
    """The embedded default model (as `s2core demo --export` writes it) with its reference
    voice as `default`, as `s2core serve` without MODEL serves it."""
    from s2core.http.engine import Engine
    reference = (assets / "reference.txt").read_text(encoding="utf-8").strip()
    codes = np.load(assets / "reference.npy")
    return Engine.from_args(assets / "model.gguf", assets / "tokenizer.json",
                            voices_dir=voices_dir, backend=backend,
                            default_voice_reference=(reference, codes), **options)


def speak_pcm(assets: Path, voices_dir: Path, text: str, voice: str | None, seed: int,
              max_new_tokens: int, backend: str = "numpy", **sampling) -> bytes:
    """The 16-bit PCM that in-process speak() makes for these values."""
    tokenizer = Tokenizer.from_file(assets / "tokenizer.json")
    config = GenerationConfig(seed=seed, max_new_tokens=max_new_tokens,
                              im_end_id=tokenizer.im_end_id, **sampling)
    with s2core.load(assets / "model.gguf", backend=backend) as model, \
            s2core.load_codec(assets / "model.gguf") as codec:
        result = speak(model, tokenizer, text, voice=voice, voices_dir=voices_dir,
                       config=config, audio=AudioOut(codec, stream=True))
    return to_pcm16(result.audio).tobytes()


def wav_frames(data: bytes) -> tuple[int, bytes]:
    """(sample rate, PCM bytes) of a WAV, including a streamed one (sizes 0xFFFFFFFF)."""
    assert data[:4] == b"RIFF" and data[8:12] == b"WAVE"
    if data[4:8] == b"\xff\xff\xff\xff":
        rate = int.from_bytes(data[24:28], "little")
        return rate, data[44:]
    with wave.open(io.BytesIO(data)) as w:
        return w.getframerate(), w.readframes(w.getnframes())
