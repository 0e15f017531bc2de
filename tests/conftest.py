"""Shared fixtures of the project's own tests (the conformance kit brings its own)."""

from __future__ import annotations

from pathlib import Path

import pytest

from s2core.embedded.writer import tiny_hparams, write_model

DATA = Path(__file__).parent / "data"
S2CPP_VECTOR = DATA / "s2cpp_vector"


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    """The tiny config in f32, written once per session."""
    path = tmp_path_factory.mktemp("models") / "tiny-f32.gguf"
    write_model(path, tiny_hparams(), "f32", seed=3)
    return path
