"""The Prometheus metrics of `GET /metrics` (prometheus-client), one registry per app so that
several apps in one process (tests, Ray replicas) count apart."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client import CONTENT_TYPE_LATEST

from s2core.http.engine import Engine

__all__ = ["Metrics", "CONTENT_TYPE_LATEST"]


class Metrics:
    def __init__(self, engine: Engine):
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("s2core_requests", "HTTP requests answered, by endpoint and "
                                "status", ["endpoint", "status"], registry=r)
        self.active = Gauge("s2core_active_sequences", "requests generating now", registry=r)
        self.active.set_function(lambda: engine.running)
        self.queued = Gauge("s2core_queued_requests", "requests waiting for a slot",
                            registry=r)
        self.queued.set_function(lambda: engine.queued)
        self.frames = Counter("s2core_frames", "frames generated", registry=r)
        self.time_to_first_audio = Histogram(
            "s2core_time_to_first_audio_seconds", "from a speech request's arrival to its "
            "first audio byte", registry=r,
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60))
        self.batch_size = Histogram("s2core_batch_size", "requests evaluated together in a "
                                    "step", registry=r,
                                    buckets=(1, 2, 4, 8, 16, 32, 64))
        engine.on_frames = self.frames.inc
        engine.on_step = self.batch_size.observe

    def text(self) -> bytes:
        return generate_latest(self.registry)
