"""The example plugin runs the conformance kit exactly as any third party would."""

import pytest

import s2core
from s2core.kit.conformance import BackendConformance


class TestExampleBackend(BackendConformance):
    @pytest.fixture
    def backend(self):
        info = {r.name: r for r in s2core.list_backends()}.get("example")
        if info is None:
            pytest.skip("s2core-example is not installed (pip install ./plugins/s2core-example)")
        return "example"
