"""Multipart forms (voice uploads, s2.cpp's /generate): fields read with their names checked."""

from __future__ import annotations

from typing import Any

from fastapi import Request
from starlette.datastructures import UploadFile

from s2core.http.errors import APIError
from s2core.http.guard import BodyTooLarge


async def read_form(request: Request) -> Any:
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind not in ("multipart/form-data", "application/x-www-form-urlencoded"):
        raise APIError(415, f"content-type {kind!r} is not supported here: send "
                       "multipart/form-data", "content-type", "unsupported_media_type")
    try:
        return await request.form(max_files=2, max_fields=32)
    except (APIError, BodyTooLarge):
        raise
    except Exception as exc:  # python-multipart's parse errors have no common type
        raise APIError(400, f"the form does not parse ({exc})", "body", "invalid_form") from exc


def text_field(form: Any, name: str, required: bool = True) -> str | None:
    value = form.get(name)
    if value is None:
        if required:
            raise APIError(400, f"{name} is missing", name, "missing")
        return None
    if isinstance(value, UploadFile):
        raise APIError(400, f"{name} must be a text field, not a file", name, "invalid_type")
    return value


async def file_field(form: Any, name: str, required: bool = True) -> bytes | None:
    value = form.get(name)
    if value is None:
        if required:
            raise APIError(400, f"{name} (an audio file) is missing", name, "missing")
        return None
    if isinstance(value, str):
        raise APIError(400, f"{name} must be a file upload", name, "invalid_type")
    return await value.read()
