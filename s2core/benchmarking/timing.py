"""Timed repetitions under a time cap, and the statistics the report shows."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Callable

import numpy as np
import psutil


#: below this, CPU accounting in 10 ms ticks cannot tell whose time it was
MIN_WALL_FOR_SHARE_S = 0.5


@dataclass(frozen=True)
class Timing:
    """Times of the repetitions of one operation, in milliseconds."""

    times_ms: list[float]
    planned: int         # repetitions asked for
    capped: bool         # stopped early by the phase's time budget
    cpu_per_wall: float  # process CPU time / wall time: ~ cores kept busy (threads at work)
    #: share of the machine's CPU time that other processes (or the hypervisor) took meanwhile:
    #: near 0 on a quiet machine; above ~0.2 the times are inflated by contention. None when
    #: the phase was too short for the kernel's CPU accounting (10 ms ticks) to tell.
    others_cpu_share: float | None

    @property
    def n(self) -> int:
        return len(self.times_ms)

    def stats(self) -> dict[str, float]:
        t = np.asarray(self.times_ms)
        q1, q3 = np.percentile(t, [25, 75])
        return {"median_ms": float(np.median(t)), "min_ms": float(t.min()),
                "max_ms": float(t.max()), "iqr_ms": float(q3 - q1), "mean_ms": float(t.mean())}

    def as_dict(self) -> dict:
        return {**asdict(self), "n": self.n, **self.stats()}


def repeat(fn: Callable[[], object], planned: int, budget_s: float, minimum: int) -> Timing:
    """Call fn up to `planned` times, timing each call.

    Stops early once another call would likely exceed `budget_s` in total, but never before
    `minimum` calls (or `planned`, if smaller), so a slow backend still gets a median.
    """
    minimum = min(minimum, planned)
    times: list[float] = []
    wall0, cpu0, busy0 = time.perf_counter(), time.process_time(), machine_busy_s()
    for i in range(planned):
        spent = time.perf_counter() - wall0
        if i >= minimum and spent + times[-1] > budget_s:
            break
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    wall = time.perf_counter() - wall0
    cpu = time.process_time() - cpu0
    others = None
    if wall >= MIN_WALL_FOR_SHARE_S:
        share = (machine_busy_s() - busy0 - cpu) / (wall * (psutil.cpu_count() or 1))
        others = min(1.0, max(0.0, share))
    return Timing(times_ms=[t * 1e3 for t in times], planned=planned, capped=len(times) < planned,
                  cpu_per_wall=cpu / wall if wall > 0 else 0.0, others_cpu_share=others)


def machine_busy_s() -> float:
    """CPU seconds all processes have used since boot (steal time counts: it was not ours)."""
    t = psutil.cpu_times()
    return sum(t) - t.idle - getattr(t, "iowait", 0.0) - getattr(t, "guest", 0.0) \
        - getattr(t, "guest_nice", 0.0)
