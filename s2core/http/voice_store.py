"""The voices of the voices directory as the HTTP endpoints see them: listed, added from a
recording (encoded by the codec, stored as s2.cpp's .s2voice, its voice prefix computed and
stored at once so the first request in it is as fast as the next), and deleted. OpenAI-style
voices and fish-speech's references are the same voices."""

from __future__ import annotations

import re

import anyio

from s2core.errors import S2CoreError, VoiceFileError
from s2core.http.engine import Engine
from s2core.http.errors import APIError
from s2core.http.schemas import Voice as VoiceInfo
from s2core.http.synthesis import Limits, check_voice_name, reference_codes
from s2core.text.prompt import check_reference
from s2core.voice.file import SAMPLE_RATE, Voice, read_s2voice
from s2core.voice.library import PREFIX_SUFFIX


def describe(engine: Engine, name: str) -> VoiceInfo:
    path = engine.library.path_of(name)
    try:
        voice = read_s2voice(path)
    except VoiceFileError:
        return VoiceInfo(id=name, name=name)
    return VoiceInfo(id=name, name=name, frames=voice.n_frames,
                     seconds=round(voice.n_frames * engine.codec.samples_per_frame
                                   / engine.codec.sample_rate, 3),
                     transcript=voice.transcript)


def names(engine: Engine) -> list[str]:
    from s2core.http.engine import DEFAULT_VOICE
    stored = engine.library.names()
    return stored if DEFAULT_VOICE in stored else [DEFAULT_VOICE] + stored


async def add(engine: Engine, name: str, audio: bytes, transcript: str, limits: Limits,
              params: tuple[str, str, str]) -> VoiceInfo:
    """params: what the client calls the name, the recording and the transcript."""
    name_param, audio_param, text_param = params
    check_voice_name(name, name_param)
    if name in engine.library.names():
        raise APIError(409, f"a voice {name!r} exists; delete it first", name_param,
                       "voice_exists")
    if not isinstance(transcript, str) or not transcript.strip():
        raise APIError(400, f"{text_param} (the recording's transcript) is empty", text_param,
                       "empty")
    codes = await reference_codes(engine, audio, limits, audio_param)
    try:
        check_reference(transcript, codes, engine.hparams)
    except S2CoreError as exc:
        raise APIError(400, str(exc), audio_param, "invalid_reference") from exc
    voice = Voice(transcript, codes.astype("int32"), SAMPLE_RATE, engine.hparams.codebook_size)
    await anyio.to_thread.run_sync(engine.library.save, name, voice)
    try:
        await engine.voice_prefix(name)
    except S2CoreError as exc:
        delete_files(engine, name)
        raise APIError(400, f"voice {name!r} cannot be used with this model: {exc}",
                       audio_param, "voice_unusable") from exc
    return describe(engine, name)


def delete(engine: Engine, name: str, param: str) -> None:
    check_voice_name(name, param)
    if name not in engine.library.names():
        raise APIError(404, f"no voice {name!r}", param, "voice_not_found")
    delete_files(engine, name)


def delete_files(engine: Engine, name: str) -> None:
    engine.forget_voice(name)
    directory = engine.library.directory
    # NAME.<digest>-<cache type>.kvprefix.safetensors, not another voice's (NAME.x's)
    mine = re.compile(re.escape(name) + r"\.[0-9a-f]{16}-\w+" + re.escape(PREFIX_SUFFIX) + "$")
    for path in directory.glob(f"{name}.*{PREFIX_SUFFIX}"):
        if mine.match(path.name):
            path.unlink(missing_ok=True)
    engine.library.path_of(name).unlink(missing_ok=True)
