"""The s2core codec conformance kit on the MLX backend, as a third party runs it."""

from __future__ import annotations

import pytest

pytest.importorskip("mlx.core", reason="mlx is not installed (pip install mlx on macOS, "
                    "pip install 'mlx[cpu]' on Linux)")

from s2core.kit.codec_conformance import CodecConformance  # noqa: E402


class TestMlxCodec(CodecConformance):
    @pytest.fixture
    def backend(self):
        return "mlx"
