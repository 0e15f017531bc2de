"""The machine and software a run measured: stored with every result so it can be reproduced.

Nothing here imports a backend framework: versions come from package metadata. The BLAS and
thread counts of a backend's own libraries are recorded by its child process (`measure`),
because only that process loads them.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import re
import subprocess
import sys
from typing import Any

PACKAGES = ("s2core", "numpy", "torch", "mlx", "gguf", "matplotlib", "psutil", "threadpoolctl")
#: environment variables that change how BLAS / OpenMP libraries and the backends pick kernels
#: and threads (S2CORE_NO_AMX: the NumPy backend's AMX products off; NUMBA_CPU_*: the CPU
#: numba compiles its kernels for)
THREAD_ENV = ("OPENBLAS_CORETYPE", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
              "VECLIB_MAXIMUM_THREADS", "S2CORE_BACKEND", "S2CORE_NO_AMX", "NUMBA_CPU_NAME",
              "NUMBA_CPU_FEATURES")


#: numba's CPU features of a Haswell (AVX2, FMA, F16C; no AVX-512): NUMBA_CPU_NAME="haswell" with
#: NUMBA_CPU_FEATURES=HASWELL builds the code AVX2-only CPUs run, on an AVX-512 machine (the name
#: alone keeps the host's features)
HASWELL = ("+64bit,+avx,+avx2,+bmi,+bmi2,+cmov,+cx16,+cx8,+f16c,+fma,+fsgsbase,+fxsr,+invpcid,"
           "+lzcnt,+mmx,+movbe,+pclmul,+popcnt,+rdrnd,+sahf,+sse,+sse2,+sse3,+sse4.1,+sse4.2,"
           "+ssse3,+x87,+xsave,+xsaveopt")


def numba_build(env: dict[str, str]) -> str:
    """What numba compiles the kernels for under `env` (a describe()'s "env"): "" for this
    host's CPU, "avx2" for the Haswell build (NUMBA_CPU_NAME=haswell with HASWELL's features:
    the code AVX2-only CPUs run), else the CPU named."""
    name = env.get("NUMBA_CPU_NAME", "")
    if name == "haswell" and env.get("NUMBA_CPU_FEATURES") == HASWELL:
        return "avx2"
    return name


def numba_target() -> dict[str, str] | None:
    """What this process's numba compiled the kernels for, as numba read it at import: the CPU
    name ("host": this machine's) and its numba_build; None where numba is not loaded. A
    measuring child records it: proof of which code ran, beside the environment it was given."""
    config = sys.modules.get("numba.core.config")
    if config is None:
        return None
    env = {"NUMBA_CPU_NAME": config.CPU_NAME or "", "NUMBA_CPU_FEATURES": config.CPU_FEATURES or ""}
    return {"cpu_name": config.CPU_NAME or "host", "build": numba_build(env) or "host"}


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    if sys.platform == "darwin":
        try:
            return subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True,
                                  text=True, timeout=5).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            pass
    return platform.processor() or platform.machine()


#: the CPU flags that decide which kernels run fast (vector widths, FMA, half floats)
SIMD_FLAGS = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl",
              "avx512_bf16", "avx512_vnni", "avx_vnni", "amx_tile", "asimd", "fphp", "asimdhp",
              "sve", "sve2")


def cpu_flags() -> list[str]:
    """The SIMD flags /proc/cpuinfo lists (empty where there is none to read)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    have = set(line.split(":", 1)[1].split())
                    return [flag for flag in SIMD_FLAGS if flag in have]
    except OSError:
        pass
    return []


def versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def blas_info() -> list[dict[str, Any]]:
    """threadpoolctl's view of the BLAS / OpenMP libraries loaded in this process."""
    try:
        import numpy  # noqa: F401  (loads numpy's BLAS so threadpoolctl can see it)
        from threadpoolctl import threadpool_info
    except ImportError as exc:
        return [{"error": f"threadpoolctl unavailable: {exc}"}]
    keep = ("user_api", "internal_api", "prefix", "version", "architecture", "num_threads",
            "threading_layer")
    return [{k: lib.get(k) for k in keep if k in lib} for lib in threadpool_info()]


def describe() -> dict[str, Any]:
    import psutil

    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {
        "cpu_model": cpu_model(),
        "cpu_flags": cpu_flags(),
        "cpu_cores_logical": os.cpu_count(),
        "cpu_cores_physical": psutil.cpu_count(logical=False),
        "cpus_usable": usable,
        "ram_bytes": psutil.virtual_memory().total,
        "ram_available_bytes": psutil.virtual_memory().available,
        "platform": platform.platform(),
        "machine": platform.machine(),
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "env": {k: os.environ[k] for k in THREAD_ENV if k in os.environ},
        "versions": versions(),
        "blas": blas_info(),
    }


def machine_tag(info: dict[str, Any]) -> str:
    """A short file-name tag: 'amd-epyc-2c-24gb'."""
    words = re.sub(r"\(.*?\)|CPU|Processor|@.*|\d+-Core", " ", info["cpu_model"]).split()
    model = "-".join(w.lower() for w in words[:3]) or info["machine"]
    model = re.sub(r"[^a-z0-9-]+", "", model)
    gb = round(info["ram_bytes"] / 2**30)
    build = numba_build(info["env"])  # the AVX2 build's files apart from the host's
    return f"{model}-{info['cpus_usable']}c-{gb}gb" + (f"-{build}" if build else "")


def summary_lines(info: dict[str, Any]) -> list[str]:
    """Human-readable lines for the terminal and the markdown summary."""
    v = info["versions"]
    lines = [
        f"CPU: {info['cpu_model']}, {info['cpus_usable']} usable cores "
        f"({info['cpu_cores_physical']} physical), RAM {info['ram_bytes'] / 2**30:.1f} GiB "
        f"({info['ram_available_bytes'] / 2**30:.1f} GiB available at start)",
        "CPU flags: " + (" ".join(info["cpu_flags"]) or "none read")
        + " (the SIMD ones, which pick the kernels)",
        f"OS: {info['platform']}",
        "versions: " + ", ".join(f"{k} {val}" for k, val in v.items() if val),
    ]
    for lib in info["blas"]:
        if "error" in lib:
            lines.append(f"BLAS: {lib['error']}")
        else:
            arch = f" ({lib['architecture']} kernels)" if lib.get("architecture") else ""
            lines.append(f"{lib.get('user_api')} library in the parent (NumPy's): "
                         f"{lib.get('internal_api')} {lib.get('version') or ''}{arch}, "
                         f"{lib.get('num_threads')} threads")
    env = info["env"]
    if "OPENBLAS_CORETYPE" in env:
        lines.append(f"OPENBLAS_CORETYPE={env['OPENBLAS_CORETYPE']} is set: OpenBLAS uses that "
                     "kernel family instead of detecting the CPU")
    else:
        lines.append("OPENBLAS_CORETYPE is not set (this environment may set it; OpenBLAS then "
                     "uses that kernel family instead of detecting the CPU)")
    build = numba_build(env)
    if build:
        lines.append("numba compiles the kernels for " + (
            "a Haswell (the AVX2 build: what AVX2-only CPUs run)" if build == "avx2"
            else f"NUMBA_CPU_NAME={build}") + ", not this CPU")
    # (the Haswell build's long feature list is said in words above)
    hidden = ("OPENBLAS_CORETYPE",) + (("NUMBA_CPU_FEATURES",) if build == "avx2" else ())
    others = {k: val for k, val in env.items() if k not in hidden}
    if others:
        lines.append("kernel and thread environment: "
                     + ", ".join(f"{k}={val}" for k, val in others.items()))
    if info["load_average"] is not None:
        lines.append("load average at start (1/5/15 min): "
                     + " / ".join(f"{x:.2f}" for x in info["load_average"]))
    return lines
