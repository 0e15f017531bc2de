"""The codec conformance tests on every registered backend (skipped where a backend provides
no codec or is unavailable here)."""

from s2core.kit.codec_conformance import CodecConformance


class TestCodecConformance(CodecConformance):
    pass
