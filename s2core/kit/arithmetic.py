"""Every arithmetic a backend declares (Capabilities.arithmetics) against its own reference.

"f32" is checked by the whole matrix already (conformance.py); here each declared arithmetic
is loaded by name (`load(..., arithmetic=a)`) and compared with the float64 reference in that
arithmetic (reference.py; "ggml": ggml_arithmetic.py). A float32 cache keeps the cache's own
rounding out of the comparison.

Rounding the activation is a step function: a float32 activation that lands within float32
noise of a rounding boundary (an 8-bit code's half step, a float16 half ulp) may round the other
way in the backend than in the float64 reference, and that one code moves its row's product by
up to 1/127 of the block's largest value (measured: up to 1.5e-2 of a K row on the kit's Q4_K
model, one row in 50). So the check is on the rows of the cache: the median K/V row must agree
to the float32 bound, every row to the size of a rounding flip. A backend that feeds float32
activations where the arithmetic rounds them (or the reverse) misses the median by 10-1000x
(f16 weights 5e-4, 8-bit activations 1e-2).
"""

from __future__ import annotations

import numpy as np
import pytest

import s2core
from s2core.kit.models import CONFIGS, MATRIX, MATRIX_IDS, kit_reference
from s2core.kit.prompts import mixed_prompt
from s2core.kit.tolerances import ARITHMETIC_FLIP, CACHE_KV, COMPUTE

#: every cached row within this of the reference: one rounding flip's worth (see above)
FLIP_BOUND = ARITHMETIC_FLIP["ggml"]


def row_errors(out: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """||out - ref|| / ||ref|| of each (layer, position) row of a cache snapshot."""
    out, ref = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    diff = np.linalg.norm((out - ref).reshape(out.shape[0], out.shape[1], -1), axis=-1)
    return (diff / np.linalg.norm(ref.reshape(diff.shape + (-1,)), axis=-1)).reshape(-1)


class ArithmeticConformance:
    """Needs the `backend` fixture and `open_model` (conformance.py)."""

    @pytest.mark.parametrize("config,weight_type", MATRIX, ids=MATRIX_IDS)
    def test_each_declared_arithmetic_matches_its_reference(self, backend, open_model, config,
                                                            weight_type):
        declared = [a for a in s2core.get_registry().info(backend).capabilities.arithmetics
                    if a != "f32"]
        if not declared:
            pytest.skip(f"{backend} declares arithmetic 'f32' only, which the matrix checks")
        hp = CONFIGS[config]
        prompt = mixed_prompt(hp, 24, np.random.default_rng(0))
        bound = COMPUTE["f32"] + CACHE_KV["f32"]
        for arithmetic in declared:
            m = open_model(config, weight_type, arithmetic=arithmetic, kv_cache_dtype="f32")
            assert m.capabilities.arithmetic == arithmetic, (
                f"loaded with arithmetic={arithmetic!r}, the model declares "
                f"{m.capabilities.arithmetic!r}")
            m.init_kv_cache(32)
            r = m.prefill_fast(prompt)
            ref = kit_reference(config, weight_type, arithmetic).forward(prompt)
            k, v = m.kv_cache_snapshot()
            errors = np.concatenate([row_errors(k, ref.k), row_errors(v, ref.v)])
            what = f"arithmetic={arithmetic!r} on {config}-{weight_type}"
            assert np.median(errors) <= bound, (
                f"{what}: median K/V row error {np.median(errors):.2e} > {bound:.1e} against "
                f"the {arithmetic!r} reference")
            assert errors.max() <= FLIP_BOUND, f"{what}: a K/V row off by {errors.max():.2e}"
            logits_err = (np.linalg.norm(r.logits - ref.logits) / np.linalg.norm(ref.logits))
            assert logits_err <= FLIP_BOUND, f"{what}: logits off by {logits_err:.2e}"

