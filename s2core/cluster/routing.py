"""The voice a request speaks in: the key the gateway routes it by, so that the requests in one
voice go to a replica that already holds that voice's prefix.

The voice is where each protocol puts it (see HTTP.md of the project's serving docs):
OpenAI's `voice` (JSON), fish-speech's `reference_id` (JSON or msgpack), s2.cpp's `voice`
(multipart form). A request without one, or one this cannot read, gets the empty key: it goes
to any replica, which answers it (a malformed body gets its 400 there, with the same words as
on a single server).
"""

from __future__ import annotations

import json
from typing import Any

#: (method, path) -> (where the voice is, its field)
VOICE_FIELDS = {
    ("POST", "/v1/audio/speech"): "voice",
    ("POST", "/v1/tts"): "reference_id",
    ("POST", "/generate"): "voice",
}
#: longer keys are not voice names (VoiceLibrary's names are short): they are not routed on
MAX_KEY_CHARS = 128


async def voice_key(method: str, path: str, headers: dict[str, str], body: bytes) -> str:
    """The voice this request asks for, or "" (see the module's docstring)."""
    field = VOICE_FIELDS.get((method.upper(), path.rstrip("/") or "/"))
    if field is None or not body:
        return ""
    content_type = headers.get("content-type", "").split(";")[0].strip().lower()
    try:
        if content_type == "application/msgpack":
            import msgpack
            fields = msgpack.unpackb(body, raw=False)
        elif content_type == "multipart/form-data":
            fields = await _form(headers, body)
        else:  # JSON, declared or not: the replica decides whether the type is acceptable
            fields = json.loads(body)
    except Exception:  # noqa: BLE001 - any unreadable body: not ours to refuse, the app's
        return ""
    value = fields.get(field) if hasattr(fields, "get") else None
    return value if isinstance(value, str) and 0 < len(value) <= MAX_KEY_CHARS else ""


async def _form(headers: dict[str, str], body: bytes) -> Any:
    """A multipart body's fields, with Starlette's parser (FastAPI's, so the same rules)."""
    from starlette.requests import Request

    scope = {"type": "http", "method": "POST", "path": "/", "query_string": b"",
             "headers": [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]}
    sent = False

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    form = await Request(scope, receive).form()
    try:
        return {k: v for k, v in form.items() if isinstance(v, str)}
    finally:
        await form.close()
