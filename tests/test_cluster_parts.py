"""The parts of the Ray Serve deployment that need no Ray: the scaling options as Ray Serve's
deployment options, the voice a request is routed by, and one request through an ASGI app
in-process (what a replica does with each request the gateway sends it)."""

from __future__ import annotations

import asyncio
import json

import pytest

from s2core.cluster.asgi import HttpRequest, respond
from s2core.cluster.routing import voice_key
from s2core.cluster.scaling import RETRY_AFTER_S, Scaling
from s2core.errors import InvalidInputError


# ---------------------------------------------------------------------- scaling
def test_a_replica_takes_its_slots_not_rays_default_of_5_and_the_queue_waits_in_front():
    s = Scaling(replicas=3, max_sequences=8, max_queue=24)
    options = s.replica_options()
    assert options["num_replicas"] == 3
    assert options["max_ongoing_requests"] == 8
    # the engine's queue only bridges a step between Ray's count and the engine's
    assert s.engine_queue == 8
    # the gateway admits every replica's slots and the queue; Ray's bound is the same
    assert s.capacity == 3 * 8 + 24
    assert options["max_queued_requests"] == s.capacity
    assert options["backpressure_config"] == {"status_code": 429, "retry_after_s": RETRY_AFTER_S}
    assert "autoscaling_config" not in options
    # requests past the capacity reach the gateway, which refuses them itself
    assert s.gateway_options()["max_ongoing_requests"] > s.capacity
    assert Scaling(replicas=2, max_sequences=4, max_queue=0).capacity == 8


def test_autoscaling_maps_to_rays_autoscaling_config():
    s = Scaling(replicas=None, min_replicas=1, max_replicas=4, max_sequences=8, max_queue=8)
    config = s.replica_options()["autoscaling_config"]
    assert config == {"min_replicas": 1, "max_replicas": 4, "target_ongoing_requests": 8}
    assert "num_replicas" not in s.replica_options()
    s = Scaling(replicas=None, min_replicas=0, max_replicas=2, target_ongoing=3.5)
    assert s.replica_options()["autoscaling_config"]["target_ongoing_requests"] == 3.5


@pytest.mark.parametrize("kwargs, check", [
    ({"replicas": 0}, "replicas"),
    ({"replicas": True}, "replicas"),
    ({"replicas": 2, "min_replicas": 1, "max_replicas": 2}, "replicas"),
    ({"replicas": None, "min_replicas": 1}, "autoscaling"),
    ({"replicas": None, "min_replicas": 3, "max_replicas": 2}, "autoscaling"),
    ({"replicas": 2, "target_ongoing": 2.0}, "target_ongoing"),
    ({"replicas": None, "min_replicas": 1, "max_replicas": 2, "target_ongoing": 0},
     "target_ongoing"),
    ({"replicas": None, "min_replicas": 1, "max_replicas": 2, "target_ongoing": 1000},
     "target_ongoing"),
    ({"max_sequences": 0}, "max_sequences"),
    ({"max_queue": -1}, "max_queue"),
])
def test_scaling_refuses_what_ray_would_refuse_later(kwargs, check):
    with pytest.raises(InvalidInputError) as info:
        Scaling(**kwargs)
    assert info.value.check == check


# ---------------------------------------------------------------------- routing
def key(method, path, body, content_type="application/json"):
    return asyncio.run(voice_key(method, path, {"content-type": content_type}, body))


def test_the_voice_is_read_where_each_protocol_puts_it():
    import msgpack
    assert key("POST", "/v1/audio/speech", json.dumps({"input": "hi", "voice": "anna"})
               .encode()) == "anna"
    assert key("post", "/v1/tts/", json.dumps({"text": "hi", "reference_id": "bob"})
               .encode()) == "bob"
    assert key("POST", "/v1/tts", msgpack.packb({"text": "hi", "reference_id": "carl"}),
               "application/msgpack") == "carl"
    boundary = "XyZ"
    form = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"text\"\r\n\r\nhello\r\n"
            f"--{boundary}\r\nContent-Disposition: form-data; name=\"voice\"\r\n\r\ndora\r\n"
            f"--{boundary}--\r\n").encode()
    assert key("POST", "/generate", form, f"multipart/form-data; boundary={boundary}") == "dora"


def test_requests_without_a_readable_voice_go_anywhere():
    speech = "/v1/audio/speech"
    assert key("GET", "/v1/audio/voices", b"") == ""
    assert key("POST", speech, b"") == ""
    assert key("POST", speech, b"{not json") == ""
    assert key("POST", speech, b"[1, 2]") == ""
    assert key("POST", speech, json.dumps({"voice": 3}).encode()) == ""
    assert key("POST", speech, json.dumps({"voice": "x" * 500}).encode()) == ""
    assert key("POST", "/v1/tts", b"\xc1", "application/msgpack") == ""
    assert key("POST", "/generate", b"garbage", "multipart/form-data; boundary=a") == ""


# ---------------------------------------------------------------------- one request in-process
def streaming_app(pieces: int, fail_after: int | None = None, seen: list | None = None):
    """A Starlette app that streams `pieces` pieces (raising after `fail_after`) and records
    whether its generator was stopped early."""
    from starlette.applications import Starlette
    from starlette.responses import StreamingResponse
    from starlette.routing import Route

    async def endpoint(request):
        body = await request.body()

        async def gen():
            try:
                for i in range(pieces):
                    if fail_after is not None and i == fail_after:
                        raise RuntimeError("the model failed")
                    yield f"{body.decode()}:{i};".encode()
                    await asyncio.sleep(0.01)
            finally:
                if seen is not None:
                    seen.append("generator closed")

        return StreamingResponse(gen(), headers={"x-piece-count": str(pieces)})

    return Starlette(routes=[Route("/s", endpoint, methods=["POST"])])


def collect(app, request, limit=None):
    async def run():
        out = []
        stream = respond(app, request)
        async for message in stream:
            out.append(message)
            if limit is not None and len(out) >= limit:
                await stream.aclose()
                break
        return out
    return asyncio.run(run())


def test_a_request_streams_through_the_app_as_its_messages():
    messages = collect(streaming_app(3), HttpRequest("POST", "/s", body=b"hey"))
    assert messages[0]["type"] == "http.response.start" and messages[0]["status"] == 200
    assert (b"x-piece-count", b"3") in messages[0]["headers"]
    body = b"".join(m.get("body", b"") for m in messages[1:])
    assert body == b"hey:0;hey:1;hey:2;"
    assert not messages[-1].get("more_body")
    missing = collect(streaming_app(3), HttpRequest("POST", "/nowhere"))
    assert missing[0]["status"] == 404


def test_a_reader_that_leaves_stops_the_apps_generator():
    seen: list = []
    messages = collect(streaming_app(1000, seen=seen), HttpRequest("POST", "/s", body=b"a"),
                       limit=3)
    assert len(messages) == 3
    assert seen == ["generator closed"]


def test_an_app_that_fails_mid_stream_raises_after_what_it_sent():
    out: list = []

    async def run():
        async for message in respond(streaming_app(5, fail_after=2),
                                     HttpRequest("POST", "/s", body=b"b")):
            out.append(message)

    with pytest.raises(RuntimeError, match="the model failed"):
        asyncio.run(run())
    assert b"".join(m.get("body", b"") for m in out) == b"b:0;b:1;"


def test_a_request_crosses_processes_as_plain_data():
    import pickle
    scope = {"type": "http", "method": "POST", "path": "/v1/tts", "query_string": b"a=1",
             "headers": [(b"content-type", b"application/json")], "client": ("127.0.0.1", 5)}
    request = HttpRequest.from_scope(scope, b"{}")
    again = pickle.loads(pickle.dumps(request))
    assert again == request and again.header("Content-Type") == "application/json"
    assert again.scope()["query_string"] == b"a=1"


# ---------------------------------------------------------------------- the command
@pytest.mark.parametrize("argv, check", [
    (["--replicas", "0", "--max-sequences", "2"], "replicas"),
    (["--replicas", "2", "--max-sequences", "0"], "max_sequences"),
    (["--replicas", "2", "--min-replicas", "1", "--max-replicas", "3"], "replicas"),
    (["--min-replicas", "1"], "autoscaling"),
    (["--min-replicas", "3", "--max-replicas", "2"], "autoscaling"),
    (["--replicas", "2", "--target-ongoing-requests", "2"], "target_ongoing"),
    (["--replicas", "2", "--max-sequences", "2", "--max-queue", "-1"], "max_queue"),
])
def test_serve_replicas_refuses_bad_options_before_starting_ray(argv, check, capsys):
    from s2core.cli.main import main
    assert main(["serve", *argv]) == 2
    assert f"[{check}]" in capsys.readouterr().err


@pytest.mark.parametrize("args, check", [
    ({"replicas": "0"}, "replicas"),
    ({"min_replicas": "2", "max_replicas": "1"}, "autoscaling"),
    ({"max_sequences": "0"}, "max_sequences"),
    ({"modell": "x.gguf"}, "app_args"),
    ({"replicas": "two"}, "replicas"),
])
def test_the_serve_run_builder_refuses_bad_args(args, check):
    pytest.importorskip("ray", reason="Ray is not installed (the ray extra)")
    from s2core.cluster.ray_app import app
    with pytest.raises(InvalidInputError) as info:
        app(args)
    assert info.value.check == check
