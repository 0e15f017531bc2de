"""Bounds for hostile inputs (issue 23): a case passes when it raises the documented error
within a second and 200 MB, and leaves its inputs untouched."""

from __future__ import annotations

import hashlib
import json
import os
import struct
import threading
import time
import tracemalloc
from pathlib import Path
from typing import Any, Callable

MAX_SECONDS = 1.0
MAX_PEAK_BYTES = 200 * 2**20
#: a case that has not returned by then is a hang
HANG_SECONDS = 10.0


def run_bounded(fn: Callable[[], Any]) -> tuple[BaseException | None, float, int]:
    """fn() in a thread (a hang fails the test instead of blocking it) with tracemalloc
    counting every Python and NumPy allocation: what it raised (None if nothing), its seconds
    and the peak bytes allocated."""
    box: dict[str, Any] = {}

    def run() -> None:
        t = time.perf_counter()
        try:
            fn()
        except BaseException as exc:  # noqa: BLE001 - judged by the caller
            box["exc"] = exc
        box["seconds"] = time.perf_counter() - t

    tracemalloc.start()
    try:
        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        thread.join(HANG_SECONDS)
        _, used = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert not thread.is_alive(), f"hung for more than {HANG_SECONDS} s"
    return box.get("exc"), box["seconds"], used


def bounded(fn: Callable[[], Any], error: type | tuple[type, ...],
            check: str | tuple[str, ...] | None = None,
            seconds: float = MAX_SECONDS, peak: int = MAX_PEAK_BYTES) -> BaseException:
    """Run fn in a thread (a hang fails the test instead of blocking it) with tracemalloc
    counting every Python and NumPy allocation; it must raise `error` (with `check` when
    given) within `seconds` and `peak` bytes. Returns the exception."""
    exc, took, used = run_bounded(fn)
    assert exc is not None, "no error raised"
    assert isinstance(exc, error), f"raised {type(exc).__name__}: {exc}"
    if check is not None:
        wanted = (check,) if isinstance(check, str) else check
        assert getattr(exc, "check", None) in wanted, f"check {getattr(exc, 'check', None)!r}: {exc}"
    assert took < seconds, f"took {took:.2f} s: {exc}"
    assert used < peak, f"peak {used / 2**20:.0f} MB: {exc}"
    return exc


def digest(path: str | os.PathLike) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


# ---------------------------------------------------------------------- safetensors surgery
def split_safetensors(data: bytes) -> tuple[dict, bytes]:
    (n,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8:8 + n]), data[8 + n:]


def join_safetensors(header: Any, body: bytes, raw_header: bytes | None = None) -> bytes:
    raw = raw_header if raw_header is not None else json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + body
