"""OpenAI's `POST /v1/audio/speech` (docs/http.md 1)."""

from __future__ import annotations

import base64
import binascii
import re

from fastapi import APIRouter, Request

from s2core.http.body import parse
from s2core.http.errors import APIError
from s2core.http.responses import speech_response
from s2core.http.schemas import SpeechRequest
from s2core.http.synthesis import SpeechValues, check_format, check_sample_rate, prepare

router = APIRouter()

_NAMES = {"text": "input", "reference_audio": "ref_audio", "reference_text": "ref_text"}
_DATA_URL = re.compile(r"^data:[\w/+.-]*(;[\w=.-]+)*;base64,", re.IGNORECASE)


def decode_base64(value: str, param: str) -> bytes:
    """Base64, or a `data:` URL of it. A URL to fetch is refused: the server never fetches
    (it could be made to reach private addresses)."""
    if re.match(r"^[a-z][a-z0-9+.-]*://", value, re.IGNORECASE):
        raise APIError(400, f"{param} must be the audio itself (base64 or a data: URL); this "
                       "server never fetches a URL", param, "url_not_allowed")
    value = _DATA_URL.sub("", value, count=1)
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise APIError(400, f"{param} is not valid base64 ({exc})", param,
                       "invalid_base64") from exc


def model_ids(request: Request) -> list[str]:
    return [request.app.state.engine.model_name, "s2-pro"]


@router.post("/v1/audio/speech")
async def speech(request: Request):
    req = await parse(request, SpeechRequest)
    if req.model is not None and req.model not in model_ids(request):
        raise APIError(404, f"model {req.model!r} is not served here (GET /v1/models: "
                       f"{', '.join(model_ids(request))})", "model", "model_not_found")
    fmt = check_format(req.response_format, "response_format")
    if req.speed != 1.0:
        raise APIError(400, f"speed {req.speed} is not supported: S2 Pro has no speed "
                       "control (send 1.0)", "speed", "unsupported")
    if req.instructions:
        raise APIError(400, "instructions are not supported by S2 Pro (put the style in the "
                       "text)", "instructions", "unsupported")
    rate = check_sample_rate(req.sample_rate)
    voice = req.voice["id"] if isinstance(req.voice, dict) and "id" in req.voice else req.voice
    if not isinstance(voice, str):
        raise APIError(400, f"voice must be a string, got {type(voice).__name__}", "voice",
                       "invalid_type")
    audio = decode_base64(req.ref_audio, "ref_audio") if req.ref_audio is not None else None
    values = SpeechValues(req.input, voice, audio, req.ref_text, req.seed, req.temperature,
                          req.top_p, req.top_k, req.max_new_tokens, names=_NAMES)
    prepared = await prepare(request.app.state.engine, values, request.app.state.limits)
    sse = req.stream_format == "sse" or (
        req.stream_format is None and req.stream is True
        and "text/event-stream" in request.headers.get("accept", ""))
    return speech_response(request, prepared, fmt, rate, sse=sse)
