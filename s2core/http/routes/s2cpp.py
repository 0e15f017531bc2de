"""s2.cpp's `POST /generate` (multipart: text, reference, reference_text, voice, params), for
people moving from its --server (docs/http.md 4). s2.cpp answers 503 when busy; requests
queue here instead."""

from __future__ import annotations

import json

from fastapi import APIRouter, Request

from s2core.http.body import validate
from s2core.http.errors import APIError
from s2core.http.form import file_field, read_form, text_field
from s2core.http.responses import speech_response
from s2core.http.schemas import GenerateParams
from s2core.http.synthesis import SpeechValues, prepare

router = APIRouter()

_NAMES = {"reference_audio": "reference", "reference_text": "reference_text",
          "max_new_tokens": "params.max_new_tokens", "temperature": "params.temperature",
          "top_p": "params.top_p", "top_k": "params.top_k", "seed": "params.seed"}


@router.post("/generate")
async def generate(request: Request):
    form = await read_form(request)
    text = text_field(form, "text")
    raw = text_field(form, "params", required=False)
    try:
        params = json.loads(raw) if raw else {}
    except json.JSONDecodeError as exc:
        raise APIError(400, f"params is not valid JSON ({exc})", "params",
                       "invalid_json") from exc
    p = validate(GenerateParams, params if isinstance(params, dict) else {"_": params})
    values = SpeechValues(text, text_field(form, "voice", required=False),
                          await file_field(form, "reference", required=False),
                          text_field(form, "reference_text", required=False), p.seed,
                          p.temperature, p.top_p, p.top_k, p.max_new_tokens, names=_NAMES)
    prepared = await prepare(request.app.state.engine, values, request.app.state.limits)
    fmt = "pcm" if p.output_format == "pcm_s16le" else "wav"
    return speech_response(request, prepared, fmt, None, streamed=p.stream)
