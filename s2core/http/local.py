"""A real uvicorn server for an app on 127.0.0.1 and a free port, in a thread of this process
(the tests and `s2core bench --case http` talk to it over real HTTP).

    with local_server(create_app(engine)) as base_url:
        httpx.get(f"{base_url}/health")
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from typing import Any, Iterator


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def local_server(app: Any, startup_timeout_s: float = 300.0) -> Iterator[str]:
    import uvicorn
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port,
                                           log_level="warning", timeout_graceful_shutdown=5))
    thread = threading.Thread(target=server.run, name="uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + startup_timeout_s
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the HTTP server did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=60)
