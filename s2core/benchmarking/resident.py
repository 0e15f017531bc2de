"""This process's memory: resident now, peak so far, and (on Linux) what kind of pages.

RSS counts pages actually touched. Two consequences the report states:
* a zero-filled KV cache (np.zeros) is mapped lazily, so it shows up as its rows are written,
  not at init_kv_cache;
* weights used straight from the memory-mapped file (float32 files on NumPy) are file pages
  (RssFile), shared with the OS page cache, while widened copies are anonymous (RssAnon).
On Linux the peak (VmHWM) can be reset, so each phase gets its own peak.
"""

from __future__ import annotations

import resource
import sys

import psutil

_STATUS_FIELDS = {"VmRSS": "rss", "VmHWM": "peak", "RssAnon": "anon", "RssFile": "file"}


def _proc_status() -> dict[str, int]:
    out: dict[str, int] = {}
    try:
        with open("/proc/self/status") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in _STATUS_FIELDS:
                    out[_STATUS_FIELDS[key]] = int(rest.split()[0]) * 1024  # kB
    except OSError:
        pass
    return out


def snapshot() -> dict[str, int]:
    """rss, peak (bytes) and, on Linux, anon and file (bytes)."""
    out = _proc_status()
    if "rss" not in out:
        out["rss"] = psutil.Process().memory_info().rss
    if "peak" not in out:
        maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        out["peak"] = maxrss if sys.platform == "darwin" else maxrss * 1024  # bytes vs kB
    return out


def reset_peak() -> bool:
    """Make the peak restart from the current RSS (Linux: /proc/self/clear_refs "5")."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False
