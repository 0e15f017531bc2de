"""What every request passes before its route (a plain ASGI middleware, so streamed responses
pass through untouched): the API key, the body size limit, the replica's name on the
response, and the request counted by endpoint and status.

The key is compared in constant time (hmac.compare_digest); the health checks, the page and
its script need none (the page asks for the key and sends it with its API calls).
"""

from __future__ import annotations

import hmac
import json
import time
from typing import Any

from s2core.http.errors import error_body
from s2core.http.metrics import Metrics

#: paths answered without a key
OPEN_PATHS = ("/health", "/v1/health", "/", "/static/app.js", "/favicon.ico")


class Guard:
    def __init__(self, app: Any, api_key: str | None, max_body_bytes: int, metrics: Metrics,
                 replica_name: str | None = None):
        self.app = app
        self.api_key = api_key.encode() if api_key else None
        self.max_body_bytes = max_body_bytes
        self.metrics = metrics
        self.replica = replica_name.encode() if replica_name else None

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope.get("path", "")
        scope.setdefault("state", {})["t0"] = time.perf_counter()  # time to first audio
        status_seen: list[int] = []

        async def send_counted(message: dict) -> None:
            if message["type"] == "http.response.start":
                status_seen.append(message["status"])
                if self.replica is not None:
                    message.setdefault("headers", [])
                    message["headers"] = list(message["headers"]) + [
                        (b"x-s2core-replica", self.replica)]
            await send(message)

        try:
            refusal = self._refusal(scope, path)
            if refusal is not None:
                return await self._refuse(send_counted, *refusal)
            await self.app(scope, self._limited(receive, send_counted), send_counted)
        finally:
            endpoint = scope.get("route_path") or _endpoint(scope)
            self.metrics.requests.labels(endpoint, str(status_seen[0] if status_seen
                                                       else 499)).inc()

    def _refusal(self, scope: dict, path: str) -> tuple | None:
        headers = dict(scope.get("headers") or [])
        if self.api_key is not None and path not in OPEN_PATHS:
            auth = headers.get(b"authorization", b"")
            scheme, _, given = auth.partition(b" ")
            if scheme.lower() != b"bearer" or not hmac.compare_digest(given.strip(),
                                                                      self.api_key):
                what = "missing" if not auth else "wrong"
                return (401, f"{what} API key: send 'Authorization: Bearer KEY'",
                        "authorization", "invalid_api_key", {"www-authenticate": "Bearer"})
        length = headers.get(b"content-length")
        if length is not None:
            try:
                n = int(length)
            except ValueError:
                return 400, "content-length is not a number", "content-length", "invalid"
            if n > self.max_body_bytes:
                return (413, f"the body is {n} bytes, more than the limit of "
                        f"{self.max_body_bytes}", "body", "too_large")
        return None

    def _limited(self, receive: Any, send: Any) -> Any:
        """A body sent without a length (chunked) is cut off at the limit too."""
        seen = 0
        limit = self.max_body_bytes

        async def receive_limited() -> dict:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise BodyTooLarge(limit)
            return message
        return receive_limited

    @staticmethod
    async def _refuse(send: Any, status: int, message: str, param: str, code: str,
                      headers: dict[str, str] | None = None) -> None:
        body = json.dumps(error_body(status, message, param, code)).encode()
        raw = [(b"content-type", b"application/json"),
               (b"content-length", str(len(body)).encode())]
        raw += [(k.encode(), v.encode()) for k, v in (headers or {}).items()]
        await send({"type": "http.response.start", "status": status, "headers": raw})
        await send({"type": "http.response.body", "body": body})


class BodyTooLarge(Exception):
    def __init__(self, limit: int):
        super().__init__(f"the body is more than the limit of {limit} bytes")
        self.limit = limit


def _endpoint(scope: dict) -> str:
    route = scope.get("route")
    return getattr(route, "path", None) or "unmatched"
