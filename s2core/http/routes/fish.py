"""fish-speech's API (its tools/api_server.py): `POST /v1/tts` in JSON or msgpack and the
`/v1/references/*` voices (docs/http.md 3). fish-speech's fields that S2 Pro's sampler has no
use for (repetition_penalty: s2.cpp's sampler resamples repeats instead; chunk_length,
normalize, use_memory_cache, latency) are accepted and have no effect."""

from __future__ import annotations

import base64
import binascii

from fastapi import APIRouter, Request

from s2core.http import voice_store
from s2core.http.body import parse
from s2core.http.errors import APIError
from s2core.http.form import file_field, read_form, text_field
from s2core.http.responses import speech_response
from s2core.http.schemas import (DeleteReference, ReferenceList, ReferenceResult,
                                 TTSRequest)
from s2core.http.synthesis import SpeechValues, check_format, prepare

router = APIRouter()

_NAMES = {"voice": "reference_id", "reference_audio": "references.0.audio",
          "reference_text": "references.0.text"}
_FISH_FORMATS = ("wav", "pcm", "mp3", "opus")


@router.post("/v1/tts")
async def tts(request: Request):
    req = await parse(request, TTSRequest, msgpack_ok=True)
    if req.format not in _FISH_FORMATS:
        raise APIError(400, f"format {req.format!r} is not one of {', '.join(_FISH_FORMATS)}",
                       "format", "unsupported_format")
    fmt = check_format(req.format, "format")
    if req.streaming and fmt != "wav":
        raise APIError(400, "streaming sends wav only (as fish-speech)", "format",
                       "unsupported_format")
    if len(req.references) > 1:
        raise APIError(400, "S2 Pro's prompt takes one reference; store several as voices",
                       "references", "too_many")
    audio = text = None
    if req.references:
        ref = req.references[0]
        audio, text = ref.audio, ref.text
        if isinstance(audio, str):  # base64 in JSON
            try:
                audio = base64.b64decode(audio, validate=True)
            except (binascii.Error, ValueError) as exc:
                raise APIError(400, f"references.0.audio is not valid base64 ({exc})",
                               "references.0.audio", "invalid_base64") from exc
    values = SpeechValues(req.text, req.reference_id, audio, text, req.seed,
                          req.temperature, req.top_p, None,
                          # fish-speech's 0 means "no limit": the server's cap
                          req.max_new_tokens or None, names=_NAMES)
    prepared = await prepare(request.app.state.engine, values, request.app.state.limits)
    return speech_response(request, prepared, fmt, None, streamed=req.streaming)


@router.post("/v1/references/add", response_model=ReferenceResult)
async def add_reference(request: Request) -> ReferenceResult:
    form = await read_form(request)
    name = text_field(form, "id")
    transcript = text_field(form, "text")
    audio = await file_field(form, "audio")
    await voice_store.add(request.app.state.engine, name, audio, transcript,
                          request.app.state.limits, ("id", "audio", "text"))
    return ReferenceResult(success=True, message="reference added", reference_id=name)


@router.get("/v1/references/list", response_model=ReferenceList)
async def list_references(request: Request) -> ReferenceList:
    return ReferenceList(reference_ids=voice_store.names(request.app.state.engine))


@router.delete("/v1/references/delete", response_model=ReferenceResult)
async def delete_reference(request: Request) -> ReferenceResult:
    req = await parse(request, DeleteReference, msgpack_ok=True)
    voice_store.delete(request.app.state.engine, req.reference_id, "reference_id")
    return ReferenceResult(success=True, message="reference deleted",
                           reference_id=req.reference_id)
