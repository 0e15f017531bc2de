"""Request bodies read by hand, so that each way a body can be wrong gets its own answer:
an unsupported content type 415, JSON or msgpack that does not parse 400 `body`, a field of
the wrong type 400 naming it."""

from __future__ import annotations

import json
from typing import Any, TypeVar

from fastapi import Request
from pydantic import BaseModel, ValidationError

from s2core.http.errors import APIError

M = TypeVar("M", bound=BaseModel)

MSGPACK_TYPES = ("application/msgpack", "application/x-msgpack")


async def parse(request: Request, model: type[M], msgpack_ok: bool = False) -> M:
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    raw = await request.body()
    if kind in MSGPACK_TYPES and msgpack_ok:
        import msgpack
        try:
            data = msgpack.unpackb(raw, raw=False)
        except Exception as exc:  # msgpack raises several unrelated types for bad input
            raise APIError(400, f"the body is not valid msgpack ({exc})", "body",
                           "invalid_msgpack") from exc
    elif kind in ("application/json", "") or kind.endswith("+json"):
        try:
            data = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise APIError(400, f"the body is not valid JSON ({exc})", "body",
                           "invalid_json") from exc
    else:
        accepted = "application/json" + (" or application/msgpack" if msgpack_ok else "")
        raise APIError(415, f"content-type {kind!r} is not supported here: send {accepted}",
                       "content-type", "unsupported_media_type")
    if not isinstance(data, dict):
        raise APIError(400, f"the body must be an object, got {type(data).__name__}", "body",
                       "invalid_type")
    return validate(model, data)


def validate(model: type[M], data: Any) -> M:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = ".".join(str(x) for x in first.get("loc", ())) or "body"
        raise APIError(400, f"{param}: {first.get('msg', 'invalid')}", param,
                       first.get("type", "invalid")) from exc
