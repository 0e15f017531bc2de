"""Error bounds of the conformance matrix, as ||out - ref|| / ||ref|| against the float64
reference, by a backend's declared compute and KV-cache precision.

Measured with the NumPy backend on the kit's models (float32 compute): outputs about 5e-7
with a float32 cache and 2e-4 with an F16 cache, K/V 2.1e-4 (F16 rounding); the bounds leave
about 10x margin. Half-precision compute adds the rounding of activations fed to each matrix
product (unit roundoff 4.9e-4 for f16, 3.9e-3 for bf16) through a few layers.
"""

from __future__ import annotations

from s2core.contract.backend import Capabilities

#: error from the precision of the activations fed to matrix products
COMPUTE = {"f32": 1e-5, "f16": 1e-2, "bf16": 6e-2}
#: extra error on hidden/logits from history K/V read back from a rounded cache
CACHE_OUTPUT = {"f32": 0.0, "f16": 2e-3, "bf16": 2e-2}
#: error of the cached K/V themselves (one rounding)
CACHE_KV = {"f32": 1e-5, "f16": 1e-3, "bf16": 8e-3}


#: what one rounding flip of the declared arithmetic may add to an output. "ggml" rounds each
#: product's activation to 8-bit codes, a step function: float32 noise of 1e-7 that lands on a
#: code's half step moves that code by one, and its product by up to 1/127 of the block's
#: largest value (kit/arithmetic.py measured up to 1.5e-2 of a row; a batched slot whose
#: upstream sums were grouped otherwise, 9.1e-3 of its logits). Per-output bounds allow one
#: flip; kit/arithmetic.py holds the median row to the float32 bound, which catches an
#: arithmetic that is wrong everywhere rather than at a boundary.
ARITHMETIC_FLIP = {"f32": 0.0, "ggml": 5e-2}


def output_tolerance(caps: Capabilities) -> float:
    """hidden and logits of the Slow-AR."""
    return (COMPUTE[caps.compute_dtype] + CACHE_OUTPUT[caps.kv_cache_dtype]
            + ARITHMETIC_FLIP[caps.arithmetic])


#: a backend's batched results against its own results alone, same cache type: only the
#: grouping of the arithmetic differs (and an f16 rounding it flips now and then), never the
#: cache's precision, so the cache term of output_tolerance does not apply. Measured on the
#: kit's batching model: NumPy (f32 compute) 8e-6 with an f16 cache and 4e-7 with f32, torch
#: (f16 compute) 1.2e-3, MLX 0. A backend whose batched numbers drift by 1e-3 with f32
#: compute no longer hides under the f16 cache's 2e-3: greedy codes, which the README promises
#: equal generate()'s, follow the logits.
BATCHED = {"f32": 1e-4, "f16": 1e-2, "bf16": 6e-2}


def batched_tolerance(caps: Capabilities) -> float:
    """hidden and logits of a slot against the same backend's sequence alone."""
    return BATCHED[caps.compute_dtype] + ARITHMETIC_FLIP[caps.arithmetic]


def batched_median_tolerance(caps: Capabilities) -> float:
    """The median over a rule's slots of their error against the sequences alone: within the
    bound without rounding flips (ARITHMETIC_FLIP allows one per output, not a drift of all)."""
    return BATCHED[caps.compute_dtype]


def kv_tolerance(caps: Capabilities) -> float:
    """The cache contents (K after QK-norm and RoPE, V)."""
    return (COMPUTE[caps.compute_dtype] + CACHE_KV[caps.kv_cache_dtype]
            + ARITHMETIC_FLIP[caps.arithmetic])


def fast_tolerance(caps: Capabilities) -> float:
    """Fast-AR logits (no cache involved)."""
    return COMPUTE[caps.compute_dtype] + ARITHMETIC_FLIP[caps.arithmetic]


# ---------------------------------------------------------------------- the codec
#: codec audio against the float64 reference, as max |out - ref| (audio lies in [-1, 1]), by
#: the codec's compute precision. The issue's bound for float32 math is 1e-4; the NumPy and
#: torch codecs land at about 1e-6 on the kit's codecs.
CODEC_COMPUTE = {"f32": 1e-4, "f16": 2e-2, "bf16": 1e-1}
#: streamed against one-shot audio on the same backend: the same math in other groupings
#: (float32 rounding only; measured about 1e-6)
CODEC_STREAM = {"f32": 2e-5, "f16": 1e-2, "bf16": 5e-2}
#: encode: decisions whose best and second-best cosines are closer than this are near-ties,
#: where float32 may rightly pick the other code (the latent of float32 encoders is ~1e-6
#: relative from float64's: 1e-3 leaves a wide margin)
CODEC_NEAR_TIE = 1e-3


def codec_tolerance(codec_caps) -> float:
    return CODEC_COMPUTE[codec_caps.compute_dtype]


def codec_stream_tolerance(codec_caps) -> float:
    return CODEC_STREAM[codec_caps.compute_dtype]
