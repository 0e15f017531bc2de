"""The conformance matrix on every registered backend (skipped with a reason where unavailable)."""

from s2core.kit.conformance import BackendConformance


class TestConformance(BackendConformance):
    pass
