"""What every speech endpoint shares: a request's values checked and turned into a prompt, a
generation config and a voice prefix (before anything is queued, so a refusal costs no model
work), then the engine's frames turned into audio bytes as they come.

The prompt and config are those `s2core.speak.speak()` builds for the same values, and the
frames go through the same `AudioOut` (the codec's exact streaming decoder): the same seed
gives the same samples over HTTP as in process.
"""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable

import anyio
import numpy as np

from s2core.codec.audio import AudioFileError, read_for_codec
from s2core.errors import InvalidInputError, S2CoreError
from s2core.generation.loop import GenerationConfig, check_prompt
from s2core.http.audio import Encoder, available_formats
from s2core.http.engine import DEFAULT_VOICE, Engine, Stream
from s2core.http.errors import APIError, from_library
from s2core.runtime.prefix import KVPrefix
from s2core.speak.audio_out import AudioOut
from s2core.text.prompt import check_reference, split_prompt
from s2core.voice.library import check_name


@dataclass
class Limits:
    """What one request may ask for (the server's options)."""

    max_input_chars: int = 4096
    max_upload_bytes: int = 20 * 1024 * 1024
    max_reference_seconds: float = 30.0


@dataclass
class SpeechValues:
    """A speech request's values, whichever protocol brought them; `names` maps each value to
    the field the client called it (for naming it in an error)."""

    text: Any
    voice: str | None = None
    reference_audio: bytes | None = None
    reference_text: str | None = None
    seed: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    max_new_tokens: int | None = None
    names: dict[str, str] | None = None

    def name(self, value: str) -> str:
        return (self.names or {}).get(value, value)


@dataclass
class Prepared:
    prompt: np.ndarray
    config: GenerationConfig
    prefix: KVPrefix | None
    input_tokens: int


def check_format(fmt: Any, param: str) -> str:
    formats = available_formats()
    if not isinstance(fmt, str) or fmt not in formats:
        raise APIError(400, f"{param} {fmt!r} is not one this server encodes: "
                       f"{', '.join(formats)}", param, "unsupported_format")
    return fmt


def check_sample_rate(rate: Any, param: str = "sample_rate") -> int | None:
    if rate is None:
        return None
    if isinstance(rate, bool) or not isinstance(rate, int) or not 8000 <= rate <= 192000:
        raise APIError(400, f"{param} must be an integer in [8000, 192000] Hz, got {rate!r}",
                       param, "invalid_sample_rate")
    return rate


def check_voice_name(name: Any, param: str) -> str:
    try:
        check_name(name)
    except InvalidInputError as exc:
        raise APIError(400, f"{param}: {exc}", param, "invalid_voice_name") from exc
    return name


async def reference_codes(engine: Engine, data: bytes, limits: Limits, param: str
                          ) -> np.ndarray:
    """A recording's bytes -> the codec's codes; 400 naming `param` for bytes that are not
    audio, too long or too large. Read through s2core.codec.audio (its checks apply)."""
    if not data:
        raise APIError(400, f"{param} is empty", param, "empty_audio")
    if len(data) > limits.max_upload_bytes:
        raise APIError(413, f"{param} is {len(data)} bytes, more than the limit of "
                       f"{limits.max_upload_bytes}", param, "too_large")
    if not engine.codec.can_encode:
        raise APIError(400, f"this model's codec cannot encode: {param} cannot be used; "
                       "use a stored voice", param, "encode_unsupported")

    def read_and_encode() -> np.ndarray:
        fd, path = tempfile.mkstemp(suffix=".audio")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            audio = read_for_codec(path, engine.codec.sample_rate)
        finally:
            os.unlink(path)
        seconds = len(audio) / engine.codec.sample_rate
        if seconds > limits.max_reference_seconds:
            raise APIError(400, f"{param} is {seconds:.1f} s long, more than the limit of "
                           f"{limits.max_reference_seconds:g} s", param, "too_long")
        with engine.codec_lock:
            return engine.codec.encode(audio)

    try:
        return await anyio.to_thread.run_sync(read_and_encode)
    except AudioFileError as exc:
        raise APIError(400, f"{param}: not audio this server reads "
                       f"({str(exc).split(': ', 1)[-1]})", param, "invalid_audio") from exc


def check_text(text: Any, limits: Limits, param: str) -> str:
    if not isinstance(text, str):
        raise APIError(400, f"{param} must be a string, got {type(text).__name__}", param,
                       "invalid_type")
    if not text.strip():
        raise APIError(400, f"{param} is empty", param, "empty")
    if len(text) > limits.max_input_chars:
        raise APIError(400, f"{param} has {len(text)} characters, more than the limit of "
                       f"{limits.max_input_chars} (--max-input-chars)", param, "too_long")
    return text


def _config(engine: Engine, v: SpeechValues) -> GenerationConfig:
    given = {k: getattr(v, k) for k in ("seed", "temperature", "top_p", "top_k")
             if getattr(v, k) is not None}
    for key, value in given.items():
        kind = int if key in ("seed", "top_k") else (int, float)
        if isinstance(value, bool) or not isinstance(value, kind):
            raise APIError(400, f"{v.name(key)} must be a number, got {value!r}", v.name(key),
                           "invalid_type")
    # s2.cpp reads a negative temperature as greedy and clamps top_p: over HTTP such values
    # are more likely a client's mistake than a wish, so they are refused
    for key, low, high in (("temperature", 0.0, 2.0), ("top_p", 0.0, 1.0),
                           ("top_k", 0, None), ("seed", 0, 2 ** 63 - 1)):
        value = given.get(key)
        if value is not None and (value < low or (high is not None and value > high)
                                  or (key == "top_p" and value == 0)):
            span = f"({low}, {high}]" if key == "top_p" else (
                f"[{low}, {high}]" if high is not None else f">= {low}")
            raise APIError(400, f"{v.name(key)} must be in {span}, got {value!r}", v.name(key),
                           "out_of_range")
    if v.max_new_tokens is not None:
        ctx = engine.hparams.context_length
        m = v.max_new_tokens
        if isinstance(m, bool) or not isinstance(m, int) or not 1 <= m <= ctx:
            raise APIError(400, f"{v.name('max_new_tokens')} must be an integer in [1, "
                           f"{ctx}] (the model's context length), got {m!r}",
                           v.name("max_new_tokens"), "out_of_range")
        given["max_new_tokens"] = m
    try:
        return GenerationConfig(im_end_id=engine.tokenizer.im_end_id, **given)
    except InvalidInputError as exc:
        param = next((v.name(k) for k in ("temperature", "top_p", "top_k", "seed")
                      if k in exc.check), "body")
        raise from_library(exc, param) from exc


async def prepare(engine: Engine, v: SpeechValues, limits: Limits) -> Prepared:
    """Every check of a speech request, then its prompt, config and voice prefix."""
    text = check_text(v.text, limits, v.name("text"))
    config = _config(engine, v)
    hp = engine.hparams
    codes, transcript, prefix_name = None, None, None
    if v.reference_audio is not None:
        if v.voice not in (None, DEFAULT_VOICE):
            raise APIError(400, f"give either {v.name('voice')} or {v.name('reference_audio')}"
                           ", not both", v.name("reference_audio"), "voice_and_reference")
        if not isinstance(v.reference_text, str) or not v.reference_text.strip():
            raise APIError(400, f"{v.name('reference_audio')} needs its transcript in "
                           f"{v.name('reference_text')}", v.name("reference_text"), "missing")
        codes = await reference_codes(engine, v.reference_audio, limits,
                                      v.name("reference_audio"))
        transcript = v.reference_text
    elif v.voice is not None:
        name = check_voice_name(v.voice, v.name("voice"))
        if name in engine.library.names():
            try:
                voice, path = engine.library.load(name)
                voice.check_fits(hp, str(path))
            except S2CoreError as exc:
                raise APIError(400, f"voice {name!r} cannot be used with this model: {exc}",
                               v.name("voice"), "voice_unusable") from exc
            codes, transcript, prefix_name = voice.codes, voice.transcript, name
        elif name != DEFAULT_VOICE:  # `default` without a stored one: no reference voice
            raise APIError(404, f"no voice {name!r} (GET /v1/audio/voices lists them)",
                           v.name("voice"), "voice_not_found")
    try:
        check_reference(transcript, codes, hp)
        prefix_rows, rest = split_prompt(engine.tokenizer, text, transcript, codes, hparams=hp)
    except InvalidInputError as exc:
        raise from_library(exc, v.name("text")) from exc
    prompt = np.vstack([prefix_rows, rest])
    prefix = await engine.voice_prefix(prefix_name) if prefix_name is not None else None
    held = len(prompt) - (prefix.n_positions if prefix is not None and
                          engine.model.capabilities.shares_kv_prefix else 0)
    room = engine.slot_positions - held
    if v.max_new_tokens is None:
        if room < 1:
            raise APIError(400, f"the prompt takes {held} positions, the slots hold "
                           f"{engine.slot_positions}: shorten {v.name('text')}",
                           v.name("text"), "too_long")
        config = GenerationConfig(**{**config.__dict__, "max_new_tokens":
                                     min(config.max_new_tokens, room)})
    elif config.max_new_tokens > room:
        raise APIError(400, f"the prompt takes {held} positions and "
                       f"{v.name('max_new_tokens')}={config.max_new_tokens} more would pass "
                       f"the slots' {engine.slot_positions}", v.name("max_new_tokens"),
                       "too_long")
    try:
        check_prompt(engine.model, prompt, config, prefix)
    except InvalidInputError as exc:
        raise from_library(exc, v.name("max_new_tokens")
                           if "context" in exc.check else v.name("text")) from exc
    return Prepared(prompt, config, prefix, int(len(rest)))


async def audio_bytes(engine: Engine, stream: Stream, encoder: Encoder,
                      on_first_audio: Callable[[], Any] | None = None) -> AsyncIterator[bytes]:
    """The response's bytes as the frames come; a client that leaves cancels the request."""
    pieces: list[np.ndarray] = []
    audio = AudioOut(engine.codec, stream=True, on_audio=pieces.append)
    audio.start()

    def decode(frame: np.ndarray | None) -> list[np.ndarray]:
        with engine.codec_lock:
            if frame is None:
                audio.finish(np.zeros((engine.hparams.num_codebooks, 0), np.int64))
            else:
                audio.frame(frame)
        out = pieces[:]
        pieces.clear()
        return out

    first = True
    try:
        head = encoder.begin()
        if head:
            yield head
        async for frame in stream:
            for piece in await anyio.to_thread.run_sync(decode, frame):
                data = encoder.piece(piece)
                if data:
                    if first and on_first_audio is not None:
                        on_first_audio()
                    first = False
                    yield data
        for piece in await anyio.to_thread.run_sync(decode, None):
            data = encoder.piece(piece)
            if data:
                yield data
        tail = encoder.end()
        if tail:
            if first and on_first_audio is not None:
                on_first_audio()
            yield tail
    finally:
        if not stream.done:
            stream.cancel()


def elapsed_since(t0: float) -> float:
    return time.perf_counter() - t0
