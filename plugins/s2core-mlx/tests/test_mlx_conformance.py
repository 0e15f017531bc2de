"""The s2core conformance kit on the MLX backend (pandas-style: subclass, provide `backend`)."""

from __future__ import annotations

import pytest

pytest.importorskip("mlx.core", reason="mlx is not installed (pip install mlx on macOS, "
                    "pip install 'mlx[cpu]' on Linux)")

from s2core.kit.conformance import BackendConformance  # noqa: E402


class TestMlxConformance(BackendConformance):
    """Default setup: F16 KV cache, as s2.cpp."""

    @pytest.fixture
    def backend(self):
        return "mlx"


class TestMlxConformanceFloat32Cache(BackendConformance):
    """With a float32 cache the kit's bounds are float32-tight (1e-5): any slip in RoPE, the
    causal offset or the quantized formats would show here, not hide under cache rounding."""

    @pytest.fixture
    def backend(self):
        return "mlx"

    @pytest.fixture
    def backend_options(self):
        return {"kv_cache_dtype": "f32"}
