"""Shared fixtures of the project's own tests (the conformance kit brings its own)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from s2core.cli.main import main
from s2core.embedded.writer import tiny_hparams, write_model

DATA = Path(__file__).parent / "data"
S2CPP_VECTOR = DATA / "s2cpp_vector"


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
