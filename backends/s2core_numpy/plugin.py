"""Registers the NumPy backend. Cheap to import: the backend module loads only when chosen."""

from __future__ import annotations

from s2core.backend import Capabilities
from s2core.plugin import BackendSpec, Probe, hookimpl

CACHE_DTYPES = ("f16", "f32")
#: the CPU reference: always available; other CPU backends rank by the benchmarks
PRIORITY = 100


def numpy_capabilities(kv_cache_dtype: str = "f16") -> Capabilities:
    return Capabilities(device="cpu", accelerator=False, n_accelerated_layers=0,
                        kv_cache_dtype=kv_cache_dtype, supported_kv_cache_dtypes=CACHE_DTYPES,
                        compute_dtype="f32", native_weight_types=frozenset({"f32"}),
                        widened_weight_dtype="f32")


def probe() -> Probe:
    return Probe(available=True, reason="NumPy runs on every CPU",
                 capabilities=numpy_capabilities())


@hookimpl
def s2core_backends() -> list[BackendSpec]:
    return [BackendSpec(name="numpy", backend_class="s2core_numpy.backend:NumpyBackend",
                        probe=probe, priority=PRIORITY,
                        description="float32 NumPy/BLAS on the CPU; widens weights to float32")]
