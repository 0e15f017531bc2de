"""This machine's memory as the operating system reports it: the ceiling a backend's
allocations are checked against (contract: a cache that cannot fit is refused before it is
allocated)."""

from __future__ import annotations

import os


def _meminfo() -> dict[str, int]:
    """/proc/meminfo in bytes (Linux); empty elsewhere."""
    try:
        with open("/proc/meminfo") as f:
            return {k: int(v.split()[0]) * 1024 for k, v in
                    (line.split(":", 1) for line in f if ":" in line) if v.split()}
    except (OSError, ValueError):
        return {}


def host_memory_bytes() -> int | None:
    """RAM plus swap of this machine (None when unknown): no allocation beyond it can work."""
    info = _meminfo()
    if "MemTotal" in info:
        return info["MemTotal"] + info.get("SwapTotal", 0)
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def available_host_memory_bytes() -> int | None:
    """Memory this process can fill now without the system running out (None when unknown):
    the limit for allocators that touch every page at once."""
    info = _meminfo()
    if "MemAvailable" in info:
        return info["MemAvailable"] + info.get("SwapFree", 0)
    return host_memory_bytes()
