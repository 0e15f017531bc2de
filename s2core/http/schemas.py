"""The requests and responses of every protocol, as pydantic models (field by field as the
clients send them: docs/http.md). Values are checked for type here; their ranges are checked
where they are used (s2core.http.synthesis), with the field named in the error."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Lenient(BaseModel):
    # clients send fields this server has no use for (OpenAI adds new ones): ignored
    model_config = ConfigDict(extra="ignore")


class SpeechRequest(_Lenient):
    """OpenAI's `POST /v1/audio/speech`, with vllm-omni's and sglang-omni's extensions."""

    model: str | None = None
    input: Any = None
    voice: Any = "default"
    response_format: str = "mp3"
    speed: float = 1.0
    stream_format: Literal["audio", "sse"] | None = None
    stream: bool | None = None
    instructions: str | None = None
    seed: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    max_new_tokens: int | None = None
    ref_audio: str | None = None
    ref_text: str | None = None
    sample_rate: int | None = None


class Voice(BaseModel):
    id: str
    name: str
    object: str = "voice"
    frames: int | None = None
    seconds: float | None = None
    transcript: str | None = None


class VoiceList(BaseModel):
    voices: list[Voice]


class Model(BaseModel):
    id: str
    object: str = "model"
    owned_by: str = "s2core"


class ModelList(BaseModel):
    object: str = "list"
    data: list[Model]


class Health(BaseModel):
    status: str


class Reference(_Lenient):
    audio: bytes | str
    text: str


class TTSRequest(_Lenient):
    """fish-speech's ServeTTSRequest (its defaults: a request that sends them all works)."""

    text: Any = None
    references: list[Reference] = Field(default_factory=list)
    reference_id: str | None = None
    format: str = "wav"
    streaming: bool = False
    seed: int | None = None
    max_new_tokens: int = 1024
    top_p: float = 0.8
    temperature: float = 0.8
    repetition_penalty: float = 1.1   # no effect: s2.cpp's sampler resamples repeats (RAS)
    chunk_length: int = 200           # no effect: the whole text is one prompt
    normalize: bool = True            # no effect
    use_memory_cache: str = "off"     # no effect: voice prefixes are always kept
    latency: str = "normal"           # no effect


class ReferenceResult(BaseModel):
    success: bool
    message: str
    reference_id: str | None = None


class ReferenceList(BaseModel):
    success: bool = True
    message: str = "ok"
    reference_ids: list[str]


class DeleteReference(_Lenient):
    reference_id: Any = None


class GenerateParams(_Lenient):
    """s2.cpp's `/generate` params (a JSON form field)."""

    max_new_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stream: bool = False
    output_format: Literal["wav", "pcm_s16le"] = "wav"
