"""The FastAPI app of `s2core serve`:

    engine = Engine.from_args("model.gguf", "tokenizer.json", max_sequences=8)
    app = create_app(engine, api_key="secret")
    uvicorn.run(app, host="127.0.0.1", port=8080)

The app starts the engine (its thread, the voices' prefixes) when it starts and closes it when
it stops. `replica_name` (or the engine's) names the replica in an `X-S2core-Replica` header on
every response (Ray Serve's replicas).
"""

from __future__ import annotations

from contextlib import asynccontextmanager

import anyio
from fastapi import FastAPI, Request

from s2core.http import errors
from s2core.http.engine import Engine
from s2core.http.errors import APIError, error_response
from s2core.http.guard import BodyTooLarge, Guard
from s2core.http.metrics import Metrics
from s2core.http.routes import fish, openai, s2cpp, service, voices
from s2core.http.synthesis import Limits
from s2core.version import __version__


def create_app(engine: Engine, *, api_key: str | None = None, limits: Limits | None = None,
               replica_name: str | None = None, manage_engine: bool = True) -> FastAPI:
    """The app serving `engine`. manage_engine: start it at startup and close it at shutdown
    (False when the caller owns its life)."""
    limits = limits or Limits()
    metrics = Metrics(engine)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        if manage_engine:
            await anyio.to_thread.run_sync(engine.start)
        try:
            yield
        finally:
            if manage_engine:
                await anyio.to_thread.run_sync(engine.close)

    app = FastAPI(title="s2core", version=__version__, lifespan=lifespan,
                  docs_url="/docs", redoc_url=None)
    app.state.engine = engine
    app.state.limits = limits
    app.state.metrics = metrics
    errors.install(app)

    @app.exception_handler(BodyTooLarge)
    async def _too_large(request: Request, exc: BodyTooLarge):
        return error_response(APIError(413, str(exc), "body", "too_large"))

    for module in (service, openai, voices, fish, s2cpp):
        app.include_router(module.router)
    # the whole body, at most: an upload and its form fields, or base64 of one in JSON
    max_body = 2 * limits.max_upload_bytes + 1024 * 1024
    app.add_middleware(Guard, api_key=api_key, max_body_bytes=max_body, metrics=metrics,
                       replica_name=replica_name or engine.replica_name)
    return app
