"""A prepared speech request answered: the audio body streamed as frames are decoded, or
Server-Sent Events carrying it in base64, with s2.cpp's X-Audio-* headers. The request is
queued here; a full queue is a 429 with Retry-After, before any byte of the body."""

from __future__ import annotations

import base64
import json
import time
from typing import AsyncIterator

from fastapi import Request
from fastapi.responses import StreamingResponse

from s2core.http.audio import ENCODING_NAMES, MEDIA_TYPES, Encoder
from s2core.http.engine import EngineClosedError, QueueFullError
from s2core.http.errors import APIError
from s2core.http.synthesis import Prepared, audio_bytes


def audio_headers(fmt: str, rate: int) -> dict[str, str]:
    return {"X-Audio-Sample-Rate": str(rate), "X-Audio-Channels": "1",
            "X-Audio-Encoding": ENCODING_NAMES.get(fmt, fmt), "Cache-Control": "no-cache",
            "X-Accel-Buffering": "no"}  # proxies (nginx) pass each piece on at once


def _queue(request: Request, prepared: Prepared):
    engine = request.app.state.engine
    try:
        return engine.submit(prepared.prompt, prepared.config, prepared.prefix)
    except QueueFullError as exc:
        raise APIError(429, str(exc), None, "queue_full",
                       {"Retry-After": str(exc.retry_after_s)}) from exc
    except EngineClosedError as exc:
        raise APIError(503, str(exc), None, "shutting_down") from exc


def speech_response(request: Request, prepared: Prepared, fmt: str, sample_rate: int | None,
                    sse: bool = False, streamed: bool = True) -> StreamingResponse:
    """Queue the request and answer it (see the module's docstring)."""
    app = request.app
    t0 = getattr(request.state, "t0", time.perf_counter())
    engine, metrics = app.state.engine, app.state.metrics
    stream = _queue(request, prepared)
    rate = sample_rate or engine.codec.sample_rate
    encoder = Encoder(fmt, engine.codec.sample_rate, rate, streamed=streamed or sse)

    def first_audio() -> None:
        metrics.time_to_first_audio.observe(time.perf_counter() - t0)

    body = audio_bytes(engine, stream, encoder, first_audio)
    headers = audio_headers(fmt, rate)
    if not sse:
        return StreamingResponse(body, media_type=MEDIA_TYPES[fmt], headers=headers)

    async def events() -> AsyncIterator[bytes]:
        try:
            async for piece in body:
                yield _event({"type": "speech.audio.delta",
                              "audio": base64.b64encode(piece).decode()})
            frames = stream.frames
            yield _event({"type": "speech.audio.done", "usage": {
                "input_tokens": prepared.input_tokens, "output_tokens": frames,
                "total_tokens": prepared.input_tokens + frames}})
        except Exception as exc:  # after the stream started: the error is an event
            yield _event({"type": "speech.audio.error", "error": {
                "message": str(exc), "type": "server_error", "code": type(exc).__name__}})
        finally:
            await body.aclose()

    return StreamingResponse(events(), media_type="text/event-stream", headers=headers)


def _event(data: dict) -> bytes:
    return f"data: {json.dumps(data)}\n\n".encode()
