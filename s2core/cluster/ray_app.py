"""The HTTP API on Ray Serve: a gateway every request enters and N replicas that each run the
model with its own continuous-batching Server behind the same FastAPI app as `s2core serve`.

    serve run s2core.cluster.ray_app:app replicas=2                # the embedded default model
    serve run s2core.cluster.ray_app:app model=s2-pro-q8_0.gguf tokenizer=tokenizer.json \
        voices_dir=/shared/voices replicas=4

The gateway reads a request's body, finds the voice it asks for (routing.py) and hands the
request to a replica through Ray Serve's model multiplexing keyed by that voice: a replica
that already holds the voice's prefix gets it whenever one has room, so a voice's prefix is
loaded once per replica that serves it, not once per request. The voices live in one
directory every replica reads (a voice uploaded through one replica is usable on all).

Faults: a replica that dies before the first byte of its response reached the gateway costs
nothing: the gateway sends the request to another replica. One that dies while streaming ends
that response with an error: an SSE `speech.audio.error` event, or (audio bodies) a cut
response, logged. When every replica's slots are busy and `max_queue` requests wait, the
next is answered 429 with Retry-After. Ray restarts a dead replica.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from ray import serve
from ray.exceptions import RayActorError
from ray.serve.exceptions import BackPressureError, ReplicaUnavailableError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from s2core.cluster.asgi import HttpRequest, Message, respond
from s2core.cluster.routing import voice_key
from s2core.cluster.scaling import RETRY_AFTER_S, Scaling
from s2core.errors import S2CoreError

log = logging.getLogger("s2core.cluster")

#: a request's body, read whole by the gateway (an upload's recording is the largest)
MAX_BODY_BYTES = 64 << 20
#: replicas a request is tried on when the one it went to died before answering
ATTEMPTS = 4
RETRY_PAUSE_S = 0.25
#: voice prefixes a replica keeps loaded (Ray's multiplexing drops the least recently used)
VOICES_PER_REPLICA = 8
#: the failures that mean "that replica is gone", not "the request is bad"
REPLICA_LOST = (RayActorError, ReplicaUnavailableError)


def _error(status: int, message: str, code: str, headers: dict[str, str] | None = None
           ) -> JSONResponse:
    from s2core.http.errors import error_body
    return JSONResponse(error_body(status, message, None, code), status_code=status,
                        headers=headers)


# ---------------------------------------------------------------------- the replicas
class Replica:
    """One replica: the model, its engine (Server thread) and the FastAPI app of `s2core
    serve`, named in every response's X-S2core-Replica."""

    def __init__(self, engine_options: dict[str, Any], app_options: dict[str, Any]):
        from s2core.http.app import create_app
        from s2core.http.engine import Engine
        self.name = serve.get_replica_context().replica_tag
        self.engine = Engine.from_args(**engine_options, replica_name=self.name)
        # the replica owns the engine's life: started here, closed when Ray stops the replica
        self.app = create_app(self.engine, manage_engine=False, **app_options)
        self.engine.start()
        #: voice -> times this replica loaded its prefix; how many of them computed it
        self.voice_loads: Counter[str] = Counter()
        self.voice_computes: Counter[str] = Counter()

    @serve.multiplexed(max_num_models_per_replica=VOICES_PER_REPLICA)
    async def hold_voice(self, voice: str) -> _HeldVoice:
        """Load a voice's prefix into this replica (from the shared store, or computed and
        stored there); Ray's multiplexing keeps the most recently used ones and routes the
        voice's requests here meanwhile."""
        library, model = self.engine.library, self.engine.model
        stored = library.prefix_path(library.path_of(voice), model.identity,
                                     model.capabilities.kv_cache_dtype).exists()
        await self.engine.voice_prefix(voice)
        self.voice_loads[voice] += 1
        self.voice_computes[voice] += not stored
        return _HeldVoice(self.engine, voice)

    async def handle(self, request: HttpRequest) -> AsyncIterator[Message]:
        """The app's response to one request, as its ASGI messages."""
        voice = serve.get_multiplexed_model_id()
        if voice:
            try:
                await self.hold_voice(voice)
            except (S2CoreError, OSError):
                pass  # an unknown or unreadable voice: the app answers it with its 4xx
        async for message in respond(self.app, request):
            yield message

    def describe(self) -> dict[str, Any]:
        """This replica's name, process, the voices it loaded and its BLAS threads (for tests
        and ops: Ray gives each replica OMP_NUM_THREADS = its num_cpus, and the codec's BLAS
        products round differently with another thread count, by one in the last bit of a
        16-bit sample; docs/scale-out.md)."""
        from threadpoolctl import threadpool_info
        blas = [lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"]
        return {"replica": self.name, "pid": os.getpid(), "voice_loads": dict(self.voice_loads),
                "voice_computes": dict(self.voice_computes),
                "blas_threads": max(blas) if blas else None}

    def __del__(self) -> None:
        engine = getattr(self, "engine", None)
        if engine is not None:
            engine.close()


class _HeldVoice:
    """A voice Ray's multiplexing holds on a replica: dropping it frees the engine's copy."""

    def __init__(self, engine: Any, voice: str):
        self.engine, self.voice = engine, voice

    def __del__(self) -> None:
        self.engine.forget_voice(self.voice)


# ---------------------------------------------------------------------- the gateway
class Gateway:
    """Every request enters here: read it, route it by voice, stream the replica's answer."""

    def __init__(self, replicas: Any, capacity: int, max_body_bytes: int = MAX_BODY_BYTES):
        self.replicas = replicas
        self.capacity = capacity
        self.max_body_bytes = max_body_bytes
        self.admitted = 0   # requests between admission and their response's end

    async def __call__(self, request: Request) -> Response:
        if self.admitted >= self.capacity:
            return _error(429, f"every replica is full and {self.admitted} requests are "
                          f"admitted (the cluster takes {self.capacity}); try again",
                          "queue_full", {"Retry-After": f"{RETRY_AFTER_S:g}"})
        self.admitted += 1
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                self.admitted -= 1

        try:
            response = await self._answer(request, release)
        except BaseException:
            release()
            raise
        if not isinstance(response, StreamingResponse):
            release()
        return response

    async def _answer(self, request: Request, release: Any) -> Response:
        body = await self._body(request)
        if body is None:
            return _error(413, f"the request body is larger than {self.max_body_bytes} "
                          "bytes", "body_too_large")
        forwarded = HttpRequest.from_scope(request.scope, body)
        voice = await voice_key(forwarded.method, forwarded.path, forwarded.header_dict(), body)
        handle = self.replicas.options(stream=True, multiplexed_model_id=voice)
        for attempt in range(1, ATTEMPTS + 1):
            messages = handle.handle.remote(forwarded)
            try:
                start = await messages.__anext__()
                first = await messages.__anext__()
            except BackPressureError as exc:
                retry = exc.retry_after_s
                return _error(exc.status_code, f"every replica is full: {exc}", "queue_full",
                              {"Retry-After": f"{retry:g}"} if retry is not None else None)
            except REPLICA_LOST as exc:
                log.warning("%s %s: the replica was lost before answering (attempt %d of "
                            "%d): %s", forwarded.method, forwarded.path, attempt, ATTEMPTS, exc)
                await asyncio.sleep(RETRY_PAUSE_S * attempt)  # Ray learns the replica died
                continue
            return _streamed(start, first, messages, forwarded, release)
        return _error(503, f"no replica could answer after {ATTEMPTS} attempts (replicas "
                      "were lost); try again", "replica_lost", {"Retry-After": "1"})

    async def _body(self, request: Request) -> bytes | None:
        """The whole body, or None past max_body_bytes (stopped reading there)."""
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self.max_body_bytes:
            return None
        pieces, size = [], 0
        async for piece in request.stream():
            size += len(piece)
            if size > self.max_body_bytes:
                return None
            pieces.append(piece)
        return b"".join(pieces)


def _streamed(start: Message, first: Message, messages: Any, request: HttpRequest,
              release: Any) -> Response:
    """The replica's response: its status and headers, then its body as it comes."""
    headers = [(bytes(k), bytes(v)) for k, v in start.get("headers", [])]
    content_type = next((v.decode("latin-1") for k, v in headers
                         if k.lower() == b"content-type"), "")

    async def body() -> AsyncIterator[bytes]:
        message = first
        try:
            while True:
                if message.get("body"):
                    yield message["body"]
                if not message.get("more_body"):
                    return
                message = await messages.__anext__()
        except StopAsyncIteration:
            return
        except REPLICA_LOST as exc:
            log.error("%s %s: the replica was lost while streaming its response: %s",
                      request.method, request.path, exc)
            if content_type.startswith("text/event-stream"):
                yield _sse_error(f"the replica serving this request was lost: {exc}")
                return
            raise  # an audio body is cut: the client's read fails, it never hangs

    def closed() -> None:
        messages.cancel()  # a client that left early: the replica cancels its request
        release()

    response = _Relay(body(), status_code=start["status"], on_close=closed)
    response.raw_headers = [(k, v) for k, v in headers if k.lower() != b"content-length"]
    return response


class _Relay(StreamingResponse):
    """A streamed response that calls `on_close` however it ends (finished, failed, or its
    client gone before the first byte)."""

    def __init__(self, content: Any, status_code: int, on_close: Any):
        super().__init__(content, status_code=status_code)
        self.on_close = on_close

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.on_close()


def _sse_error(message: str) -> bytes:
    event = {"type": "speech.audio.error",
             "error": {"message": message, "type": "server_error", "code": "replica_lost"}}
    return f"data: {json.dumps(event)}\n\n".encode()


# ---------------------------------------------------------------------- the application
def build(engine_options: dict[str, Any], scaling: Scaling,
          app_options: dict[str, Any] | None = None) -> Any:
    """The Ray Serve application: the gateway in front of the model's replicas."""
    replicas = serve.deployment(Replica, name="s2core-replica",
                                **scaling.replica_options())
    gateway = serve.deployment(Gateway, name="s2core-gateway", **scaling.gateway_options(),
                               ray_actor_options={"num_cpus": 0})
    return gateway.bind(replicas.bind(engine_options, app_options or {}), scaling.capacity)


#: `serve run s2core.cluster.ray_app:app key=value ...`: the keys of `s2core serve`
APP_KEYS = {"model", "tokenizer", "voices_dir", "backend", "codec_backend", "max_sequences",
            "max_queue", "replicas", "min_replicas", "max_replicas", "target_ongoing_requests"}


def app(args: dict[str, str]) -> Any:
    """The application builder for Ray's tooling (`serve run`, a Serve config's
    import_path): `args` are strings, as `serve run` passes them."""
    from s2core.errors import InvalidInputError
    unknown = set(args) - APP_KEYS
    if unknown:
        raise InvalidInputError("app_args", f"unknown key(s) {sorted(unknown)}; known: "
                                f"{sorted(APP_KEYS)}")

    def number(key: str, default: Any = None, kind: type = int) -> Any:
        if args.get(key) in (None, ""):
            return default
        try:
            return kind(args[key])
        except (TypeError, ValueError):
            raise InvalidInputError(key, f"{key} must be a number, got {args[key]!r}") from None

    autoscaled = "min_replicas" in args or "max_replicas" in args
    scaling = Scaling(replicas=None if autoscaled else number("replicas", 1),
                      min_replicas=number("min_replicas"), max_replicas=number("max_replicas"),
                      target_ongoing=number("target_ongoing_requests", kind=float),
                      max_sequences=number("max_sequences", 4),
                      max_queue=number("max_queue", 16))
    return build(engine_options(args.get("model"), args.get("tokenizer"),
                                args.get("voices_dir"), args.get("backend"),
                                args.get("codec_backend"), scaling), scaling)


def engine_options(model: str | None, tokenizer: str | None, voices_dir: str | None,
                   backend: str | None, codec_backend: str | None, scaling: Scaling
                   ) -> dict[str, Any]:
    """Engine.from_args's keywords, with every path absolute: every replica, on any node that
    sees the same paths, loads the same files and reads the same voices. Without a model, the
    embedded default model is written here, before any replica starts (they would race to
    write it), and each replica's engine finds it in the cache."""
    if model is None:
        from s2core.embedded.cache import cache_dir
        from s2core.embedded.default import default_model_files
        default_model_files()
        voices_dir = voices_dir or str(cache_dir() / "voices")
    elif voices_dir is None:
        from s2core.voice.library import default_directory
        voices_dir = str(default_directory())
    absolute = {k: (None if v is None else str(Path(v).resolve()))
                for k, v in (("model", model), ("tokenizer", tokenizer),
                             ("voices_dir", voices_dir))}
    return {**absolute, "backend": backend, "codec_backend": codec_backend,
            "max_sequences": scaling.max_sequences, "max_queue": scaling.engine_queue}
