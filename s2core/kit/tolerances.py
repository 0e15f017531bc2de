"""Error bounds of the conformance matrix, as ||out - ref|| / ||ref|| against the float64
reference, by a backend's declared compute and KV-cache precision.

Measured with the NumPy backend on the kit's models (float32 compute): outputs about 5e-7
with a float32 cache and 2e-4 with an F16 cache, K/V 2.1e-4 (F16 rounding); the bounds leave
about 10x margin. Half-precision compute adds the rounding of activations fed to each matrix
product (unit roundoff 4.9e-4 for f16, 3.9e-3 for bf16) through a few layers.
"""

from __future__ import annotations

from ..backend import Capabilities

#: error from the precision of the activations fed to matrix products
COMPUTE = {"f32": 1e-5, "f16": 1e-2, "bf16": 6e-2}
#: extra error on hidden/logits from history K/V read back from a rounded cache
CACHE_OUTPUT = {"f32": 0.0, "f16": 2e-3, "bf16": 2e-2}
#: error of the cached K/V themselves (one rounding)
CACHE_KV = {"f32": 1e-5, "f16": 1e-3, "bf16": 8e-3}


def output_tolerance(caps: Capabilities) -> float:
    """hidden and logits of the Slow-AR."""
    return COMPUTE[caps.compute_dtype] + CACHE_OUTPUT[caps.kv_cache_dtype]


def kv_tolerance(caps: Capabilities) -> float:
    """The cache contents (K after QK-norm and RoPE, V)."""
    return COMPUTE[caps.compute_dtype] + CACHE_KV[caps.kv_cache_dtype]


def fast_tolerance(caps: Capabilities) -> float:
    """Fast-AR logits (no cache involved)."""
    return COMPUTE[caps.compute_dtype]
