"""`s2core serve --replicas N`: the HTTP API on a Ray Serve application (ray_app.py), on a
local Ray instance this starts, or on the cluster at `--ray-address` (`auto`: the one this
machine belongs to). Serve's proxy listens on `host:port`; Ctrl-C (or SIGTERM) stops the
application and, when this started Ray, Ray too."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from typing import Any

from s2core.cluster.scaling import Scaling

#: the application's name in Ray Serve (`serve status` shows it)
APP_NAME = "s2core"


def serve_replicated(engine_options: dict[str, Any], scaling: Scaling, *,
                     app_options: dict[str, Any] | None = None, host: str = "127.0.0.1",
                     port: int = 8080, ray_address: str | None = None,
                     num_cpus: int | None = None, say: Callable[[str], None] = print,
                     stop: threading.Event | None = None) -> int:
    """Run until Ctrl-C, SIGTERM or `stop` is set; returns the exit status."""
    import ray
    from ray import serve

    from s2core.cluster.ray_app import build

    started_ray = ray_address is None
    if started_ray:
        ray.init(num_cpus=num_cpus, include_dashboard=False)
        say(f"started a local Ray instance ({ray.cluster_resources().get('CPU', 0):g} CPUs)")
    else:
        ray.init(address=ray_address)
        say(f"joined the Ray cluster at {ray_address}")
    stop = stop or threading.Event()
    try:
        serve.start(http_options={"host": host, "port": port})
        serve.run(build(engine_options, scaling, app_options), name=APP_NAME,
                  route_prefix="/")
        how = (f"{scaling.replicas} replicas" if not scaling.autoscaled else
               f"{scaling.min_replicas}-{scaling.max_replicas} replicas (autoscaled)")
        say(f"serving on http://{host}:{port} with {how}, each taking "
            f"{scaling.max_ongoing} requests ({scaling.max_sequences} slots + "
            f"{scaling.max_queue} queued)")
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, lambda *_: stop.set())
        try:
            while not stop.wait(1.0):
                pass
        except KeyboardInterrupt:
            pass
        return 0
    finally:
        say("stopping")
        serve.delete(APP_NAME)
        if started_ray:
            serve.shutdown()
            ray.shutdown()
