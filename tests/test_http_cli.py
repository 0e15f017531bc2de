"""`s2core serve` as users run it: the embedded default model right after install, the
README's curl and openai examples, and SIGTERM letting a running request finish."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

from s2core.http.local import free_port  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def served(tmp_path):
    port = free_port()
    env = dict(os.environ, S2CORE_CACHE=str(tmp_path / "cache"))
    proc = subprocess.Popen([sys.executable, "-m", "s2core.cli", "serve", "--port", str(port),
                             "--backend", "numpy", "--grace", "60"], env=env, cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    while True:
        assert proc.poll() is None, proc.stdout.read()
        try:
            if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                break
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, "s2core serve did not become healthy"
        time.sleep(0.3)
    yield proc, base
    if proc.poll() is None:
        proc.kill()
        proc.wait()


@pytest.mark.slow
def test_serve_answers_the_readme_examples_and_drains_on_sigterm(served, tmp_path):
    proc, base = served
    # README: curl
    out = tmp_path / "hello.wav"
    if shutil.which("curl"):
        subprocess.run(["curl", "-sS", "--fail", f"{base}/v1/audio/speech", "-H",
                        "Content-Type: application/json", "-d",
                        '{"model": "s2-pro", "input": "Hello there.", "voice": "default", '
                        '"response_format": "wav"}', "-o", str(out)], check=True, timeout=600)
        assert out.read_bytes()[:4] == b"RIFF" and out.stat().st_size > 44
    # README: the openai package
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="none")
    speech = client.audio.speech.create(model="s2-pro", voice="default", input="Hello there.",
                                        response_format="wav")
    assert speech.content[:4] == b"RIFF" and len(speech.content) > 44
    # SIGTERM while a request runs: it finishes, then the server exits
    result = {}
    long = {"input": "A longer sentence to speak.", "voice": "default",
            "response_format": "pcm", "seed": 1, "max_new_tokens": 60}
    whole = httpx.post(f"{base}/v1/audio/speech", json=long, timeout=600).content

    def long_request():
        with httpx.stream("POST", f"{base}/v1/audio/speech", timeout=600, json=long) as r:
            result["audio"] = b"".join(r.iter_bytes())
            result["status"] = r.status_code

    t = threading.Thread(target=long_request)
    t.start()
    time.sleep(1.5)
    proc.send_signal(signal.SIGTERM)
    t.join(timeout=600)
    assert result.get("status") == 200 and result["audio"] == whole  # all of it
    assert proc.wait(timeout=120) == 0
