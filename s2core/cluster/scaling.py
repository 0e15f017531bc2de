"""How many replicas serve the model and how many requests each takes: the options of
`s2core serve --replicas ...` as Ray Serve's deployment options.

A replica runs one continuous-batching Server: `max_sequences` requests decode together and
up to `max_queue` wait for a slot. Ray sends a replica at most that many at once
(`max_ongoing_requests`, whose default of 5 would leave most of a large batch idle). The
gateway admits at most `capacity` requests at once: what every replica takes plus `max_queued`
waiting for one (default `max_queue`); the next is answered 429 with Retry-After at once, as
the single-process server answers a full queue. The gateway counts them itself because Ray's
own bound (`max_queued_requests`) counts a burst's requests while they are being routed and
refuses some of a burst that would fit; it is kept as the bound for any other handle.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from s2core.errors import InvalidInputError

#: the seconds a client told "queue full" is asked to wait (the single server's answer too)
RETRY_AFTER_S = 1.0


@dataclass(frozen=True)
class Scaling:
    """replicas: a fixed count, or None with autoscaling between min_replicas and
    max_replicas, aiming at target_ongoing requests per replica (default: its slots)."""

    replicas: int | None = 1
    min_replicas: int | None = None
    max_replicas: int | None = None
    target_ongoing: float | None = None
    max_sequences: int = 4
    max_queue: int = 16
    max_queued: int | None = None   # None: max_queue per replica

    def __post_init__(self) -> None:
        def positive(name: str, value: Any, allow_zero: bool = False) -> None:
            low = 0 if allow_zero else 1
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise InvalidInputError(name, f"{name} must be an int >= {low}, got {value!r}")

        autoscaled = self.min_replicas is not None or self.max_replicas is not None
        if autoscaled:
            if self.replicas is not None:
                raise InvalidInputError("replicas", "give a fixed --replicas or an autoscaling "
                                        "range (--min-replicas/--max-replicas), not both")
            if self.min_replicas is None or self.max_replicas is None:
                raise InvalidInputError("autoscaling", "autoscaling needs both --min-replicas "
                                        "and --max-replicas")
            positive("min_replicas", self.min_replicas, allow_zero=True)
            positive("max_replicas", self.max_replicas)
            if self.min_replicas > self.max_replicas:
                raise InvalidInputError("autoscaling", f"min_replicas={self.min_replicas} "
                                        f"exceeds max_replicas={self.max_replicas}")
        else:
            if self.target_ongoing is not None:
                raise InvalidInputError("target_ongoing", "--target-ongoing-requests applies "
                                        "to autoscaling: give --min-replicas/--max-replicas")
            positive("replicas", self.replicas)
        if self.target_ongoing is not None and (
                isinstance(self.target_ongoing, bool)
                or not isinstance(self.target_ongoing, (int, float))
                or not 0 < self.target_ongoing <= self.max_ongoing):
            raise InvalidInputError("target_ongoing", f"target_ongoing must lie in (0, "
                                    f"max_ongoing_requests={self.max_ongoing}], got "
                                    f"{self.target_ongoing!r}")
        positive("max_sequences", self.max_sequences)
        positive("max_queue", self.max_queue, allow_zero=True)
        if self.max_queued is not None:
            positive("max_queued", self.max_queued, allow_zero=True)

    @property
    def autoscaled(self) -> bool:
        return self.replicas is None

    @property
    def max_ongoing(self) -> int:
        """Requests one replica takes at once: its slots and its queue."""
        return self.max_sequences + self.max_queue

    @property
    def most_replicas(self) -> int:
        return self.max_replicas if self.autoscaled else self.replicas

    @property
    def capacity(self) -> int:
        """Requests the gateway admits at once: every replica full, and the queue."""
        queued = self.max_queue if self.max_queued is None else self.max_queued
        return self.most_replicas * self.max_ongoing + queued

    def replica_options(self) -> dict[str, Any]:
        """Ray Serve's options of the deployment that runs the model."""
        options: dict[str, Any] = {
            "max_ongoing_requests": self.max_ongoing,
            # the gateway keeps below this; another handle gets Ray's 429 past it
            "max_queued_requests": self.capacity,
            "backpressure_config": {"status_code": 429, "retry_after_s": RETRY_AFTER_S},
        }
        if self.autoscaled:
            options["autoscaling_config"] = {
                "min_replicas": self.min_replicas,
                "max_replicas": self.max_replicas,
                # by default a replica counts as loaded when its slots are all busy
                "target_ongoing_requests": (self.max_sequences if self.target_ongoing is None
                                            else self.target_ongoing),
            }
        else:
            options["num_replicas"] = self.replicas
        return options

    def gateway_options(self) -> dict[str, Any]:
        """The gateway holds each request while a replica serves it and refuses those past
        `capacity` itself: Ray lets through more than that, so they reach it to be refused."""
        return {"max_ongoing_requests": 2 * self.capacity + 16}
