"""One HTTP request through an ASGI app in this process, its response as the app's messages.

The gateway reads a request and sends it to a replica as an `HttpRequest` (plain data, so it
crosses processes); the replica runs it through its FastAPI app with `respond()` and streams
the app's messages (`http.response.start`, then `http.response.body` pieces) back as they
come. A caller that stops reading (the client went away) closes the stream: the app then sees
`http.disconnect`, as behind a real server, and cancels the request's generation.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

Message = dict[str, Any]
ASGIApp = Callable[[dict, Callable[[], Awaitable[Message]], Callable[[Message], Awaitable[None]]],
                   Awaitable[None]]


@dataclass
class HttpRequest:
    """What an ASGI app needs of one HTTP request, with its whole body."""

    method: str
    path: str
    query_string: bytes = b""
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    body: bytes = b""
    client: tuple[str, int] | None = None
    scheme: str = "http"
    http_version: str = "1.1"

    @classmethod
    def from_scope(cls, scope: dict, body: bytes) -> HttpRequest:
        return cls(scope["method"], scope["path"], scope.get("query_string", b""),
                   [(bytes(k), bytes(v)) for k, v in scope.get("headers", [])], body,
                   tuple(scope["client"]) if scope.get("client") else None,
                   scope.get("scheme", "http"), scope.get("http_version", "1.1"))

    def header(self, name: str) -> str:
        name_b = name.lower().encode("latin-1")
        return next((v.decode("latin-1") for k, v in self.headers if k.lower() == name_b), "")

    def header_dict(self) -> dict[str, str]:
        return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in self.headers}

    def scope(self) -> dict:
        return {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"},
                "http_version": self.http_version, "method": self.method,
                "scheme": self.scheme, "path": self.path,
                "raw_path": self.path.encode("utf-8"), "root_path": "",
                "query_string": self.query_string, "headers": list(self.headers),
                "client": self.client, "server": ("127.0.0.1", 0), "state": {}}


async def respond(app: ASGIApp, request: HttpRequest) -> AsyncIterator[Message]:
    """The app's response messages to `request`, as it sends them. Raises what the app raises
    (after the messages it sent before)."""
    outbox: asyncio.Queue[Message] = asyncio.Queue()
    finished = asyncio.Event()   # the response ended, or its reader went away
    body_given = False

    async def receive() -> Message:
        nonlocal body_given
        if not body_given:
            body_given = True
            return {"type": "http.request", "body": request.body, "more_body": False}
        await finished.wait()
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        await outbox.put(message)

    task = asyncio.ensure_future(app(request.scope(), receive, send))
    try:
        while True:
            get = asyncio.ensure_future(outbox.get())
            await asyncio.wait({get, task}, return_when=asyncio.FIRST_COMPLETED)
            if not get.done():
                get.cancel()
                while not outbox.empty():   # what it sent before it returned or raised
                    yield outbox.get_nowait()
                task.result()
                return
            message = get.result()
            yield message
            if message["type"] == "http.response.body" and not message.get("more_body"):
                return
    finally:
        finished.set()   # an unfinished streaming response sees the disconnect and stops
        if not task.done():
            with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError, Exception):
                await asyncio.wait_for(asyncio.shield(task), timeout=2.0)
            task.cancel()
