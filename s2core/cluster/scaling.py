"""How many replicas serve the model and how many requests each takes: the options of
`s2core serve --replicas ...` as Ray Serve's deployment options.

A replica runs one continuous-batching Server of `max_sequences` slots, and Ray sends it at
most that many requests at once (`max_ongoing_requests`; Ray's default of 5 would leave part
of a larger batch idle, or queue behind a smaller one). The requests that wait do so in front
of the replicas, not in one replica's queue: a waiting request goes to whichever replica
frees a slot first, and a replica "has room" for a voice's request, in the voice routing,
when it has a free slot, not a free place in its queue (else one voice's requests would pile
up on one replica while another idles). `max_queue` bounds them as in the single-process
server: the gateway admits `capacity` = every replica's slots + `max_queue` requests at once
and answers the next 429 with Retry-After at once. The gateway counts them itself because
Ray's own bound (`max_queued_requests`) counts a burst's requests while they are being routed
and refuses part of a burst that fits; it is kept, at the same figure, for any other handle.
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

    @property
    def autoscaled(self) -> bool:
        return self.replicas is None

    @property
    def max_ongoing(self) -> int:
        """Requests one replica takes at once: its slots."""
        return self.max_sequences

    @property
    def engine_queue(self) -> int:
        """The queue of a replica's engine: only for a request that arrives while the one
        whose slot it takes is still leaving (Ray counts a request done when its response
        ends, the engine a step later)."""
        return self.max_sequences

    @property
    def most_replicas(self) -> int:
        return self.max_replicas if self.autoscaled else self.replicas

    @property
    def capacity(self) -> int:
        """Requests the gateway admits at once: every replica's slots, and the queue."""
        return self.most_replicas * self.max_ongoing + self.max_queue

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
