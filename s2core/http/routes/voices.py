"""Voices, OpenAI-style: `GET|POST /v1/audio/voices`, `DELETE /v1/audio/voices/{id}`
(docs/http.md 2)."""

from __future__ import annotations

from fastapi import APIRouter, Request

from s2core.http import voice_store
from s2core.http.form import file_field, read_form, text_field
from s2core.http.schemas import Voice, VoiceList

router = APIRouter()


@router.get("/v1/audio/voices", response_model=VoiceList)
async def list_voices(request: Request) -> VoiceList:
    engine = request.app.state.engine
    return VoiceList(voices=[voice_store.describe(engine, n) for n in voice_store.names(engine)])


@router.post("/v1/audio/voices", response_model=Voice, status_code=201)
async def add_voice(request: Request) -> Voice:
    form = await read_form(request)
    name = text_field(form, "name")
    transcript = text_field(form, "ref_text")
    audio = await file_field(form, "audio")
    return await voice_store.add(request.app.state.engine, name, audio, transcript,
                                 request.app.state.limits, ("name", "audio", "ref_text"))


@router.delete("/v1/audio/voices/{voice_id}")
async def delete_voice(request: Request, voice_id: str) -> dict:
    voice_store.delete(request.app.state.engine, voice_id, "voice_id")
    return {"id": voice_id, "object": "voice", "deleted": True}
