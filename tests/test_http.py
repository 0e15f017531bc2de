"""`s2core serve` over real HTTP: a uvicorn server on 127.0.0.1 (a free port) serving the
embedded default model, spoken to by the clients people use (the openai package, httpx for
SSE, msgpack shaped like fish-speech's client)."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import threading
import time

import numpy as np
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

from http_helpers import make_engine, speak_pcm, wav_frames  # noqa: E402

from s2core.http.app import create_app  # noqa: E402
from s2core.http.local import local_server  # noqa: E402
from s2core.http.synthesis import Limits  # noqa: E402

TEXT = "Hello there, from the server."
FRAMES = 12


@pytest.fixture(scope="module")
def voices_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("voices")


@pytest.fixture(scope="module")
def base(assets, voices_dir):
    """The server most tests share: 16 sequences at a time, the default queue."""
    engine = make_engine(assets, voices_dir, max_sequences=16)
    with local_server(create_app(engine)) as url:
        yield url


@pytest.fixture(scope="module")
def recording(tmp_path_factory):
    """A real recording of speech: espeak-ng's."""
    if shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng is not installed (apt install espeak-ng)")
    path = tmp_path_factory.mktemp("rec") / "ref.wav"
    subprocess.run(["espeak-ng", "-w", str(path), "This is my voice."], check=True)
    return path


def speech(base, **fields):
    body = {"model": "s2-pro", "input": TEXT, "voice": "default", "response_format": "pcm",
            "seed": 7, "max_new_tokens": FRAMES, **fields}
    return httpx.post(f"{base}/v1/audio/speech", json=body, timeout=300)


def metric(base, name):
    for line in httpx.get(f"{base}/metrics").text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no metric {name}")


# ---------------------------------------------------------------------- the service
def test_health_models_and_metrics_names(base):
    assert httpx.get(f"{base}/health").json() == {"status": "ok"}
    assert httpx.get(f"{base}/v1/health").json() == {"status": "ok"}
    models = httpx.get(f"{base}/v1/models").json()
    assert models["object"] == "list"
    assert {m["id"] for m in models["data"]} == {"model.gguf", "s2-pro"}
    text = httpx.get(f"{base}/metrics").text
    for name in ("s2core_requests_total", "s2core_active_sequences", "s2core_queued_requests",
                 "s2core_frames_total", "s2core_time_to_first_audio_seconds_bucket",
                 "s2core_batch_size_bucket"):
        assert name in text, name


# ---------------------------------------------------------------------- real clients
def test_openai_client_gets_the_audio_speak_makes(base, assets, voices_dir):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused")
    wav = client.audio.speech.create(model="s2-pro", voice="default", input=TEXT,
                                     response_format="wav", extra_body={
                                         "seed": 7, "max_new_tokens": FRAMES})
    rate, pcm = wav_frames(wav.content)
    assert rate == 44100
    expected = speak_pcm(assets, voices_dir, TEXT, "default", 7, FRAMES)
    assert len(expected) > 0 and pcm == expected
    with client.audio.speech.with_streaming_response.create(
            model="s2-pro", voice="default", input=TEXT, response_format="pcm",
            extra_body={"seed": 7, "max_new_tokens": FRAMES}) as response:
        assert response.headers["x-audio-sample-rate"] == "44100"
        assert response.headers["x-audio-encoding"] == "pcm_s16le"
        assert response.headers["x-audio-channels"] == "1"
        streamed = b"".join(response.iter_bytes())
    assert streamed == expected


def test_sse_deltas_are_the_audio(base):
    pcm = speech(base).content
    pieces, done = [], None
    with httpx.stream("POST", f"{base}/v1/audio/speech", timeout=300, json={
            "model": "s2-pro", "input": TEXT, "voice": "default", "response_format": "pcm",
            "stream_format": "sse", "seed": 7, "max_new_tokens": FRAMES}) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            event = json.loads(line[6:])
            if event["type"] == "speech.audio.delta":
                pieces.append(base64.b64decode(event["audio"]))
            else:
                done = event
    assert len(pieces) > 1 and b"".join(pieces) == pcm
    assert done["type"] == "speech.audio.done"
    assert done["usage"]["output_tokens"] == len(pcm) // 2 // 2048 or \
        done["usage"]["output_tokens"] > 0


def test_fish_speech_msgpack_and_json(base, recording):
    msgpack = pytest.importorskip("msgpack")
    audio = recording.read_bytes()
    # as fish-speech's tools/api_client.py builds it: ServeTTSRequest with its defaults
    request = {"text": TEXT, "references": [{"audio": audio, "text": "This is my voice."}],
               "reference_id": None, "format": "wav", "max_new_tokens": FRAMES,
               "chunk_length": 200, "top_p": 0.7, "repetition_penalty": 1.2,
               "temperature": 0.7, "streaming": False, "use_memory_cache": "off",
               "seed": 3, "normalize": True, "latency": "normal"}
    r = httpx.post(f"{base}/v1/tts", content=msgpack.packb(request, use_bin_type=True),
                   headers={"content-type": "application/msgpack"}, timeout=300)
    assert r.status_code == 200, r.text
    rate, pcm = wav_frames(r.content)
    assert rate == 44100 and len(pcm) > 0
    # the same request in JSON (audio as base64) gives the same audio
    request["references"][0]["audio"] = base64.b64encode(audio).decode()
    r2 = httpx.post(f"{base}/v1/tts", json=request, timeout=300)
    assert r2.status_code == 200 and r2.content == r.content
    r3 = httpx.post(f"{base}/v1/tts", json={"text": TEXT, "reference_id": "default",
                                            "max_new_tokens": FRAMES, "seed": 1,
                                            "streaming": True}, timeout=300)
    assert r3.status_code == 200 and r3.content[4:8] == b"\xff\xff\xff\xff"
    assert httpx.get(f"{base}/v1/references/list").json()["reference_ids"][0] == "default"


def test_voice_uploaded_from_a_recording(base, recording, voices_dir):
    with recording.open("rb") as f:
        r = httpx.post(f"{base}/v1/audio/voices", data={"name": "espeak",
                                                        "ref_text": "This is my voice."},
                       files={"audio": ("ref.wav", f, "audio/wav")}, timeout=300)
    assert r.status_code == 201, r.text
    assert r.json()["id"] == "espeak" and r.json()["frames"] > 0
    assert (voices_dir / "espeak.s2voice").exists()
    assert list(voices_dir.glob("espeak.*.kvprefix.safetensors")), "prefix stored at upload"
    ids = [v["id"] for v in httpx.get(f"{base}/v1/audio/voices").json()["voices"]]
    assert "espeak" in ids
    assert speech(base, voice="espeak").status_code == 200
    assert httpx.delete(f"{base}/v1/audio/voices/espeak").status_code == 200
    assert not (voices_dir / "espeak.s2voice").exists()
    gone = speech(base, voice="espeak")
    assert gone.status_code == 404 and gone.json()["error"]["param"] == "voice"


def test_s2cpp_generate(base):
    r = httpx.post(f"{base}/generate", data={"text": TEXT, "voice": "default", "params": json.dumps(
        {"max_new_tokens": FRAMES, "seed": 7, "output_format": "pcm_s16le"})}, timeout=300)
    assert r.status_code == 200, r.text
    assert r.content == speech(base).content


# ---------------------------------------------------------------------- streaming and load
def test_first_audio_byte_arrives_well_before_the_last(base):
    frames = 40
    times = []
    with httpx.stream("POST", f"{base}/v1/audio/speech", timeout=300, json={
            "input": TEXT, "voice": "default", "response_format": "pcm", "seed": 7,
            "max_new_tokens": frames}) as r:
        t0 = time.perf_counter()
        for chunk in r.iter_raw():
            if chunk:
                times.append(time.perf_counter() - t0)
    assert len(times) >= 10, "frames are sent as they are made"
    assert times[0] < 0.5 * times[-1]


def test_sixteen_concurrent_streams_equal_their_one_at_a_time_answers(base):
    seeds = list(range(16))
    alone = {s: speech(base, seed=s).content for s in seeds[:4]}
    together: dict[int, bytes] = {}

    def client(seed):
        chunks = []
        with httpx.stream("POST", f"{base}/v1/audio/speech", timeout=600, json={
                "input": TEXT, "voice": "default", "response_format": "pcm", "seed": seed,
                "max_new_tokens": FRAMES}) as r:
            assert r.status_code == 200
            chunks.extend(r.iter_bytes())
        together[seed] = b"".join(chunks)

    threads = [threading.Thread(target=client, args=(s,)) for s in seeds]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(together) == seeds
    for s in seeds[4:]:
        alone[s] = speech(base, seed=s).content
    for s in seeds:
        assert len(together[s]) > 0 and together[s] == alone[s], f"seed {s}"


def test_clients_that_disconnect_free_their_slots(base):
    def leave_early():
        with httpx.stream("POST", f"{base}/v1/audio/speech", timeout=300, json={
                "input": TEXT, "voice": "default", "response_format": "pcm",
                "max_new_tokens": 400}) as r:
            for chunk in r.iter_raw():
                if chunk:
                    return  # closes the connection mid-stream

    threads = [threading.Thread(target=leave_early) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    deadline = time.monotonic() + 30
    while metric(base, "s2core_active_sequences") != 0 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert metric(base, "s2core_active_sequences") == 0
    assert metric(base, "s2core_queued_requests") == 0
    assert speech(base).status_code == 200


# ---------------------------------------------------------------------- bad requests
BAD = [
    # (what, request, status, param)
    ("empty input", dict(input=""), 400, "input"),
    ("oversized input", dict(input="a" * 4097), 400, "input"),
    ("non-string input", dict(input=123), 400, "input"),
    ("unknown voice", dict(voice="nobody"), 404, "voice"),
    ("path-like voice", dict(voice="../../etc/passwd"), 400, "voice"),
    ("unsupported format", dict(response_format="aac"), 400, "response_format"),
    ("speed != 1", dict(speed=1.5), 400, "speed"),
    ("instructions", dict(instructions="whisper"), 400, "instructions"),
    ("bad base64", dict(ref_audio="***", ref_text="hi"), 400, "ref_audio"),
    ("not audio", dict(ref_audio=base64.b64encode(b"not audio at all").decode(),
                       ref_text="hi"), 400, "ref_audio"),
    ("a URL to fetch", dict(ref_audio="http://169.254.169.254/x", ref_text="hi"), 400,
     "ref_audio"),
    ("max_new_tokens past the context", dict(max_new_tokens=10 ** 6), 400, "max_new_tokens"),
    ("bad temperature", dict(temperature=-1), 400, "temperature"),
    ("unknown model", dict(model="gpt-4o-mini-tts"), 404, "model"),
]


@pytest.mark.parametrize("what,fields,status,param", BAD, ids=[b[0] for b in BAD])
def test_bad_request_is_a_named_4xx(base, what, fields, status, param):
    t = time.perf_counter()
    r = speech(base, **fields)
    assert time.perf_counter() - t < 1.0, "refused at once"
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["param"] == param and error["message"] and error["type"]


def test_malformed_bodies_are_named_4xx_and_the_server_keeps_serving(base):
    url = f"{base}/v1/audio/speech"
    r = httpx.post(url, content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "body"
    r = httpx.post(url, content=b"x", headers={"content-type": "text/plain"})
    assert r.status_code == 415
    r = httpx.post(f"{base}/v1/tts", content=b"\xc1\xc1",
                   headers={"content-type": "application/msgpack"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_msgpack"
    r = httpx.get(f"{base}/v1/nothing")
    assert r.status_code == 404 and "error" in r.json()
    assert speech(base).status_code == 200


@pytest.fixture(scope="module")
def small(assets, tmp_path_factory):
    """One sequence at a time, one waiting, and an API key."""
    engine = make_engine(assets, tmp_path_factory.mktemp("voices-small"), max_sequences=1,
                         max_queue=1)
    limits = Limits(max_upload_bytes=200_000, max_reference_seconds=1.0)
    with local_server(create_app(engine, api_key="s3cret", limits=limits)) as url:
        yield url


def test_a_full_queue_answers_429_at_once(small):
    statuses = []
    auth = {"Authorization": "Bearer s3cret"}

    def client():
        r = httpx.post(f"{small}/v1/audio/speech", headers=auth, timeout=300, json={
            "input": TEXT, "voice": "default", "response_format": "pcm", "seed": 1,
            "max_new_tokens": FRAMES})
        statuses.append((r.status_code, r.headers.get("retry-after")))

    threads = [threading.Thread(target=client) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    codes = sorted(s for s, _ in statuses)
    assert set(codes) <= {200, 429} and codes.count(200) >= 2 and 429 in codes, statuses
    assert all(retry is not None for s, retry in statuses if s == 429)


def test_api_key(small):
    url = f"{small}/v1/audio/voices"
    assert httpx.get(url).status_code == 401
    r = httpx.get(url, headers={"Authorization": "Bearer wrong"})
    assert r.status_code == 401 and r.json()["error"]["param"] == "authorization"
    assert httpx.get(url, headers={"Authorization": "Bearer s3cret"}).status_code == 200
    assert httpx.get(f"{small}/metrics").status_code == 401
    assert httpx.get(f"{small}/health").status_code == 200  # health checks need no key


def test_upload_limits(small, recording):
    auth = {"Authorization": "Bearer s3cret"}
    data = recording.read_bytes()  # espeak's "This is my voice.": more than a second
    r = httpx.post(f"{small}/v1/audio/voices", headers=auth, data={
        "name": "long", "ref_text": "This is my voice."},
        files={"audio": ("ref.wav", data, "audio/wav")}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "audio", r.text
    assert r.json()["error"]["code"] == "too_long"
    big = data + b"\0" * 200_000
    r = httpx.post(f"{small}/v1/audio/voices", headers=auth, data={
        "name": "big", "ref_text": "x"}, files={"audio": ("ref.wav", big, "audio/wav")},
        timeout=60)
    assert r.status_code == 413 and r.json()["error"]["param"] == "audio", r.text
    r = httpx.post(f"{small}/v1/audio/speech", headers={
        **auth, "content-type": "application/json"}, content=b"{" + b" " * 2_000_000 + b"}")
    assert r.status_code == 413 and r.json()["error"]["param"] == "body"
    r = httpx.post(f"{small}/v1/audio/voices", headers=auth, data={
        "name": "../up", "ref_text": "x"}, files={"audio": ("ref.wav", data, "audio/wav")})
    assert r.status_code == 400 and r.json()["error"]["param"] == "name"


def test_flac_is_the_same_audio_and_sample_rate_resamples(base):
    soundfile = pytest.importorskip("soundfile")
    import io
    pcm = np.frombuffer(speech(base).content, "<i2")
    r = speech(base, response_format="flac")
    assert r.status_code == 200 and r.headers["x-audio-encoding"] == "flac"
    flac, rate = soundfile.read(io.BytesIO(r.content), dtype="int16")
    assert rate == 44100 and np.array_equal(flac, pcm)  # lossless
    r = speech(base, sample_rate=24000)
    assert r.headers["x-audio-sample-rate"] == "24000"
    assert abs(len(r.content) // 2 - round(len(pcm) * 24000 / 44100)) <= 2
