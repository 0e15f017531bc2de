"""The HTTP API on two Ray Serve replicas of the embedded default model (s2core.cluster):
concurrent requests over both replicas with a single server's audio, voice affinity, the
429 of a full cluster, and a replica killed by its pid."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time

import numpy as np
import pytest
from threadpoolctl import threadpool_limits

pytestmark = pytest.mark.slow

FRAMES = 6


def speech(i: int, voice: str = "default", frames: int = FRAMES, **extra) -> dict:
    return {"model": "s2-pro", "input": f"Sentence number {i}.", "voice": voice,
            "response_format": "pcm", "seed": i, "max_new_tokens": frames, **extra}


async def post_all(url: str, bodies: list[dict], timeout_s: float = 120.0):
    import httpx
    async with httpx.AsyncClient(base_url=url, timeout=timeout_s) as client:
        return await asyncio.gather(*[client.post("/v1/audio/speech", json=b) for b in bodies])


def single_process_audio(options: dict, bodies: list[dict]) -> list[bytes]:
    """The same requests, one at a time, on one in-process engine (no Ray)."""
    import httpx

    from s2core.http.app import create_app
    from s2core.http.engine import Engine

    engine = Engine.from_args(**options)
    engine.start()
    app = create_app(engine, manage_engine=False)

    async def run() -> list[bytes]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://local") as client:
            out = []
            for body in bodies:
                r = await client.post("/v1/audio/speech", json=body)
                assert r.status_code == 200, r.text
                out.append(r.content)
            return out

    try:
        return asyncio.run(run())
    finally:
        engine.close()


def test_sixteen_concurrent_requests_use_both_replicas_with_one_servers_audio(cluster):
    bodies = [speech(i) for i in range(16)]
    responses = asyncio.run(post_all(cluster.url, bodies))
    assert [r.status_code for r in responses] == [200] * 16, [r.text for r in responses
                                                              if r.status_code != 200]
    names = {r.headers["x-s2core-replica"] for r in responses}
    assert names == set(cluster.replicas()), names
    # one server with the replicas' BLAS threads (Replica.describe): the codec's BLAS
    # products are rounded by thread count, so another count differs in the last bit
    threads = {about["blas_threads"] for about in cluster.replicas().values()}
    assert len(threads) == 1, threads
    with threadpool_limits(limits=threads.pop(), user_api="blas"):
        expected = single_process_audio(cluster.engine_options, bodies)
    for i, (r, want) in enumerate(zip(responses, expected)):
        assert len(want) > 0
        assert r.content == want, f"request {i}: {len(r.content)} bytes vs {len(want)}"


def test_a_voice_is_loaded_on_one_replica_not_per_request(cluster):
    """Four voices written to the shared store after the replicas started: each request's
    voice goes to the replica that holds it, so each prefix is loaded once in all (and
    computed once: the other replicas would restore the stored file)."""
    from s2core.embedded.writer import demo_hparams
    from s2core.voice.file import SAMPLE_RATE, Voice
    from s2core.voice.library import VoiceLibrary

    hp = demo_hparams()
    library = VoiceLibrary(cluster.engine_options["voices_dir"])
    rng = np.random.default_rng(7)
    voices = [f"affinity-{k}" for k in range(4)]
    for name in voices:
        codes = rng.integers(0, hp.codebook_size, (hp.num_codebooks, 24)).astype(np.int32)
        library.save(name, Voice(f"The voice called {name}.", codes, SAMPLE_RATE,
                                 hp.codebook_size))
    before = cluster.replicas()
    # the first request of each voice places it, the next ones follow it (one a voice at a
    # time: four in all fit in one replica's four slots, so there is always room)
    rounds = [asyncio.run(post_all(cluster.url, [speech(10 * k + j, v, 2)
                                                 for j, v in enumerate(voices)]))
              for k in range(3)]
    answered: dict[str, set] = {v: set() for v in voices}
    for responses in rounds:
        assert [r.status_code for r in responses] == [200] * 4
        for r, name in zip(responses, voices):
            answered[name].add(r.headers["x-s2core-replica"])
    after = cluster.replicas()
    for name in voices:
        loads = {rep: about["voice_loads"].get(name, 0) - before[rep]["voice_loads"].get(name, 0)
                 for rep, about in after.items()}
        computes = sum(about["voice_computes"].get(name, 0) for about in after.values())
        assert sum(loads.values()) == 1, (name, loads)   # 3 requests, one load
        assert computes == 1, name
        assert answered[name] == {rep for rep, n in loads.items() if n}, (name, answered)


def test_a_full_cluster_answers_429_with_retry_after(cluster):
    """Two replicas take 4 requests each (their slots) and 8 more may wait for a slot: of 30
    at once, 16 are served, the rest refused at once; none is dropped unanswered."""
    assert cluster.scaling.capacity == 16
    responses = asyncio.run(post_all(cluster.url, [speech(i, frames=3) for i in range(30)]))
    codes = [r.status_code for r in responses]
    assert set(codes) <= {200, 429}, codes
    refused = [r for r in responses if r.status_code == 429]
    assert refused and codes.count(200) >= 16, codes
    for r in refused:
        assert r.headers["retry-after"]
        assert r.json()["error"]["code"] == "queue_full"


def test_a_killed_replica_costs_only_what_it_was_streaming_and_comes_back(cluster):
    import httpx

    replicas = cluster.replicas()
    victim, survivor = sorted(replicas)
    pid = replicas[victim]["pid"]

    async def one(client, body):
        """(status, complete, error): an audio body cut short shows as a read error, an SSE
        stream as its error event; a hang would show as the client's timeout."""
        try:
            async with client.stream("POST", "/v1/audio/speech", json=body) as r:
                data = b"".join([piece async for piece in r.aiter_bytes()])
            if body.get("stream_format") == "sse":
                events = [json.loads(line[6:]) for line in data.decode().splitlines()
                          if line.startswith("data: ")]
                kinds = [e["type"] for e in events]
                if r.status_code == 200 and kinds[-1] == "speech.audio.error":
                    return r.status_code, False, "sse error event"
                return r.status_code, kinds[-1:] == ["speech.audio.done"], None
            return r.status_code, True, None
        except httpx.TimeoutException:
            return None, False, "timeout"
        except httpx.HTTPError as exc:
            return None, False, type(exc).__name__

    async def run():
        async with httpx.AsyncClient(base_url=cluster.url, timeout=60.0) as client:
            # eight stream (four a replica), four wait for a slot: on the survivor after
            bodies = [speech(100 + i, frames=40, **({"stream_format": "sse"} if i % 2 else {}))
                      for i in range(12)]
            during = [asyncio.ensure_future(one(client, b)) for b in bodies]
            await asyncio.sleep(3.0)           # some of them stream from the victim now
            os.kill(pid, signal.SIGKILL)
            outcomes = await asyncio.gather(*during)
            # right after the kill: new requests are served, by the survivor or by the
            # replacement Ray may already have started; never by the dead victim
            after = await asyncio.gather(*[client.post("/v1/audio/speech", json=speech(200 + i))
                                           for i in range(4)])
            return outcomes, after

    t = time.monotonic()
    outcomes, after = asyncio.run(run())
    assert all(error != "timeout" for _, _, error in outcomes), outcomes
    assert all(complete or error for _, complete, error in outcomes), outcomes
    # only what the victim was streaming is lost: at most its slots
    lost = [o for o in outcomes if not o[1]]
    assert len(lost) <= cluster.scaling.max_sequences, outcomes
    assert [r.status_code for r in after] == [200] * 4, [r.text for r in after]
    served_after = {r.headers["x-s2core-replica"] for r in after}
    assert victim not in served_after, served_after
    assert time.monotonic() - t < 120
    # Ray replaces the dead replica: two again, a new process in place of the victim
    back = cluster.replicas(want=2, timeout_s=180)
    assert victim not in back and survivor in back
    assert all(about["pid"] != pid for about in back.values())
    # whoever answered after the kill is one of the two live replicas
    assert served_after <= set(back), (served_after, set(back))
