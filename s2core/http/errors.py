"""Every refusal in OpenAI's error shape, and the handlers that map what FastAPI, the engine
and the library raise onto it: a client's mistake is a 4xx naming the field, never a 500.

    {"error": {"message": "...", "type": "invalid_request_error", "param": "input",
               "code": "empty"}}
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from s2core.errors import InvalidInputError, S2CoreError

_TYPES = {401: "authentication_error", 404: "not_found_error", 429: "rate_limit_error",
          503: "server_error", 500: "server_error"}


class APIError(Exception):
    """A refusal: HTTP status, the field at fault (None: the request as a whole), a short
    machine-readable code and a message for people."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers or {}


def error_body(status: int, message: str, param: str | None = None,
               code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": _TYPES.get(status, "invalid_request_error"),
                      "param": param, "code": code}}


def error_response(exc: APIError) -> JSONResponse:
    return JSONResponse(error_body(exc.status, exc.message, exc.param, exc.code),
                        status_code=exc.status, headers=exc.headers)


def from_library(exc: S2CoreError, param: str | None = None) -> APIError:
    """A library error raised by a request's own values: 400 naming the field."""
    code = getattr(exc, "check", None) or type(exc).__name__
    return APIError(400, str(exc), param or code, code)


def install(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        # FastAPI's 422 is 400 here, with the first field at fault named
        first = exc.errors()[0] if exc.errors() else {}
        loc = [str(x) for x in first.get("loc", ()) if x != "body"]
        kind = first.get("type", "invalid")
        if kind == "json_invalid":
            return error_response(APIError(400, f"the body is not valid JSON: "
                                           f"{first.get('msg', '')}", "body", "invalid_json"))
        param = ".".join(loc) or "body"
        return error_response(APIError(400, f"{param}: {first.get('msg', 'invalid')}", param,
                                       kind))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
        if exc.status_code == 404:
            message = f"no route {request.method} {request.url.path}"
        return error_response(APIError(exc.status_code, message, None,
                                       "not_found" if exc.status_code == 404 else None,
                                       dict(exc.headers or {})))

    @app.exception_handler(InvalidInputError)
    async def _library(request: Request, exc: InvalidInputError) -> JSONResponse:
        return error_response(from_library(exc))
