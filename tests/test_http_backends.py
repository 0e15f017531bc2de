"""The same seed over HTTP gives the same audio bytes as in-process speak(), on every
backend this machine has."""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

import s2core  # noqa: E402
from http_helpers import make_engine, speak_pcm  # noqa: E402

from s2core.http.app import create_app  # noqa: E402
from s2core.http.local import local_server  # noqa: E402

BACKENDS = [r.name for r in s2core.list_backends() if r.available]
TEXT = "The same seed, the same sound."


@pytest.mark.slow
@pytest.mark.parametrize("backend_name", BACKENDS)
def test_http_audio_equals_speak(assets, tmp_path, backend_name):
    engine = make_engine(assets, tmp_path, backend=backend_name)
    with local_server(create_app(engine)) as base:
        r = httpx.post(f"{base}/v1/audio/speech", timeout=600, json={
            "input": TEXT, "voice": "default", "response_format": "pcm", "seed": 11,
            "max_new_tokens": 8})
        assert r.status_code == 200, r.text
    expected = speak_pcm(assets, tmp_path, TEXT, "default", 11, 8, backend=backend_name)
    assert len(expected) > 0 and r.content == expected
