"""Shared fixtures of the project's own tests (the conformance kit brings its own)."""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from s2core.cli.main import main
from s2core.embedded.writer import tiny_hparams, write_model

DATA = Path(__file__).parent / "data"
S2CPP_VECTOR = DATA / "s2cpp_vector"
S2CPP_FIDELITY = DATA / "s2cpp_fidelity"


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    """The tiny config in f32, written once per session."""
    path = tmp_path_factory.mktemp("models") / "tiny-f32.gguf"
    write_model(path, tiny_hparams(), "f32", seed=3)
    return path


@pytest.fixture(scope="session")
def assets(tmp_path_factory) -> Path:
    """`s2core demo --export`: the demo's model, tokenizer and reference voice."""
    d = tmp_path_factory.mktemp("demo")
    cache = tmp_path_factory.mktemp("cache")
    old = os.environ.get("S2CORE_CACHE")
    os.environ["S2CORE_CACHE"] = str(cache)
    try:
        assert main(["demo", "--export", str(d)]) == 0
    finally:
        if old is None:
            del os.environ["S2CORE_CACHE"]
        else:
            os.environ["S2CORE_CACHE"] = old
    assert {p.name for p in d.iterdir()} >= {"model.gguf", "tokenizer.json", "reference.npy",
                                              "reference.wav", "reference.txt"}
    return d


# ---------------------------------------------------------------------- Ray Serve (test_cluster_ray)
# One local Ray instance (`ray.init(num_cpus=2)`: starting and stopping one costs seconds), and
# one Serve application on it: two replicas of the embedded default model behind the gateway,
# on a free loopback port. Module-scoped: only test_cluster_ray uses them, so Ray starts once
# and stops when that module is done, rather than leaving its threads (some run Python's
# garbage collector on their own) beside every later test: a full run once ended in a
# segmentation fault in a native thread collecting garbage, Ray's threads alive.
RAY_APP = "s2core-test"


def _need(module: str) -> Any:
    return pytest.importorskip(module, reason=f"{module} is not installed: the cluster tests "
                               "need the ray extra (pip install 's2core[ray]')")


@pytest.fixture(scope="module")
def ray_instance():
    ray = _need("ray")
    _need("ray.serve")
    _need("fastapi")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield ray
    finally:
        from ray import serve
        serve.shutdown()
        ray.shutdown()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Cluster:
    url: str
    engine_options: dict
    scaling: Any
    handle: Any          # the replicas' deployment handle

    def replicas(self, want: int = 2, timeout_s: float = 60.0) -> dict[str, dict]:
        """describe() of `want` distinct replicas (calls land on random ones)."""
        seen: dict[str, dict] = {}
        deadline = time.monotonic() + timeout_s
        while len(seen) < want:
            if time.monotonic() > deadline:
                raise TimeoutError(f"saw {len(seen)} replicas, wanted {want}: {list(seen)}")
            try:
                about = self.handle.describe.remote().result(timeout_s=10)
            except Exception:  # noqa: BLE001 - a replica being replaced: ask again
                time.sleep(0.5)
                continue
            seen[about["replica"]] = about
        return seen


@pytest.fixture(scope="module")
def cluster(ray_instance, tmp_path_factory):
    from ray import serve

    from s2core.cluster.ray_app import build, engine_options
    from s2core.cluster.scaling import Scaling

    voices = tmp_path_factory.mktemp("shared-voices")
    port = free_port()
    scaling = Scaling(replicas=2, max_sequences=4, max_queue=8)  # admits 2 x 4 + 8 = 16
    options = engine_options(None, None, str(voices), "numpy", None, scaling)
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    serve.run(build(options, scaling), name=RAY_APP, route_prefix="/")
    handle = serve.get_deployment_handle("s2core-replica", app_name=RAY_APP)
    try:
        yield Cluster(f"http://127.0.0.1:{port}", options, scaling, handle)
    finally:
        serve.delete(RAY_APP)
