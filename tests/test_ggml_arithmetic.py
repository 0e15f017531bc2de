"""s2.cpp's arithmetic (arithmetic="ggml"): the activation rounding of ggml's CPU backend.

The NumPy backend's rounding (s2core_numpy/act_quant.py) against the kit's plain transcription
(s2core/kit/ggml_arithmetic.py), product by product for every type; the core's option check;
and the capabilities field.
"""

from __future__ import annotations

import dataclasses

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

import s2core
from s2core.embedded.kquants import quantize_k
from s2core.errors import InvalidInputError
from s2core.kit.arithmetic import row_errors
from s2core.kit.ggml_arithmetic import (
    activation_row,
    block_mins_of,
    ggml_product,
    quantize_q8_0_block,
    quantize_q8_k_block,
)
from s2core.kit.models import CONFIGS, kit_model, kit_reference
from s2core.kit.prompts import mixed_prompt
from s2core.plugin import Capabilities, block_shape

act_quant = pytest.importorskip("s2core_numpy.act_quant")

TYPES = [QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1, QT.Q8_0, QT.Q2_K, QT.Q3_K, QT.Q4_K, QT.Q5_K,
         QT.Q6_K, QT.F16, QT.BF16]


def test_q8_0_block_by_hand():
    x = np.zeros(32, np.float32)
    x[:4] = [1.0, -0.5, 0.25, 2.54]
    codes, d16, d = quantize_q8_0_block(x)
    assert d == pytest.approx(2.54 / 127, rel=1e-7)
    assert d16 == float(np.float16(np.float32(2.54) / np.float32(127)))
    assert list(codes[:4]) == [50, -25, 12, 127]  # 12.5 rounds to even


def test_q8_k_block_by_hand():
    x = np.zeros(256, np.float32)
    x[3], x[7] = -4.0, 1.0  # the largest magnitude is negative: iscale = -127 / -4 > 0
    codes, d = quantize_q8_k_block(x)
    assert codes[3] == -127 and codes[7] == 32  # 31.75
    assert d == pytest.approx(4.0 / 127)


def test_zero_blocks_quantize_to_zero():
    x = np.zeros((1, 256), np.float32)
    for dot in ("q8_0", "q8_1", "q8_k"):
        assert not act_quant.snap(dot, x).any()
        assert not activation_row(x[0], dot)[0].any()


@pytest.mark.parametrize("dot", ["q8_0", "q8_1", "q8_k", "f16", "bf16"])
def test_backend_rounding_equals_the_transcription(dot):
    """The backend's vectorized rounding gives the kit's block-by-block values exactly."""
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((3, 512)) * rng.choice([0.01, 1, 300], (3, 512))).astype(np.float32)
    x[1, :32] = 0.0  # an all-zero block
    x[2, 7] = x[2, 9] = 5e3  # a tie for the largest magnitude
    backend = act_quant.snap(dot, x)
    for r in range(3):
        np.testing.assert_array_equal(backend[r], activation_row(x[r], dot)[0].astype(np.float32))
    if dot == "q8_1":
        s_error = act_quant.snap_q8_1(x)[1]
        for r in range(3):
            np.testing.assert_allclose(s_error[r], activation_row(x[r], dot)[1], rtol=0, atol=1e-6)


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_products_match_the_transcription(qtype):
    """Each kept type's product with arithmetic="ggml", one row and many (the sgemm path),
    against the float64 transcription: float32 summation noise only."""
    from s2core_numpy.weights import WeightLoader, linear
    rng = np.random.default_rng(int(qtype))
    n_out, n_in = 96, 512
    w = rng.standard_normal((n_out, n_in)).astype(np.float32)
    raw = quantize_k(w, qtype) if qtype.name.endswith("_K") else gguf.quants.quantize(w, qtype)
    w64 = gguf.quants.dequantize(raw, qtype).astype(np.float64).reshape(n_out, n_in)

    class OneTensor:  # the WeightLoader's view of a file
        def info(self, name):
            return type("Info", (), {"type": qtype, "shape": (n_out, n_in)})()

        def raw(self, name):
            return raw.view(np.uint8).reshape(n_out, -1)

        def release(self, name):
            pass

        def dequantize(self, name, dtype, release=False):
            return w64.astype(dtype)

    mins = None
    if qtype in (QT.Q4_1, QT.Q5_1):
        mins = block_mins_of(raw.view(np.uint8).reshape(n_out, -1), block_shape(qtype)[1])
    m = WeightLoader(OneTensor(), numba_kernels=True, arithmetic="ggml").matrix("w")
    for rows in (1, 3, 24):
        x = rng.standard_normal((rows, n_in)).astype(np.float32)
        ref = ggml_product(x, w64, qtype, mins)
        err = np.abs(linear(x, m) - ref).max() / np.abs(ref).max()
        assert err < 2e-6, (rows, err)
        plain = np.abs(x.astype(np.float64) @ w64.T - ref).max() / np.abs(ref).max()
        assert plain > 20 * err  # the rounding is what is measured, not noise


def test_the_two_references_differ_where_the_arithmetic_matters():
    prompt = mixed_prompt(CONFIGS["gqa4"], 8, np.random.default_rng(1))
    for weight_type, lowest in (("q8_0", 1e-3), ("f16", 5e-5)):
        a = kit_reference("gqa4", weight_type, "f32").forward(prompt).k
        b = kit_reference("gqa4", weight_type, "ggml").forward(prompt).k
        assert np.median(row_errors(a, b)) > lowest, weight_type
    a = kit_reference("gqa4", "f32", "f32").forward(prompt)
    b = kit_reference("gqa4", "f32", "ggml").forward(prompt)
    np.testing.assert_array_equal(a.logits, b.logits)  # F32 weights: no rounding at all


def test_load_refuses_an_arithmetic_a_backend_does_not_offer():
    path = kit_model("gqa4", "q8_0")
    offering = [r.name for r in s2core.get_registry().list()
                if r.available and r.capabilities and "ggml" in r.capabilities.arithmetics]
    assert "numpy" in offering
    for row in s2core.get_registry().list():
        if row.available and row.capabilities and "ggml" not in row.capabilities.arithmetics:
            with pytest.raises(InvalidInputError, match="numpy") as info:
                s2core.load(path, backend=row.name, arithmetic="ggml")
            assert info.value.check == "arithmetic"
    with pytest.raises(InvalidInputError) as info:
        s2core.load(path, backend="numpy", arithmetic="int8")
    assert info.value.check == "arithmetic"
    m = s2core.load(path, arithmetic="ggml")  # chosen among the backends that offer it
    assert m.capabilities.arithmetic == "ggml"
    m.close()


def test_capabilities_validate_arithmetics():
    caps = Capabilities()
    assert caps.arithmetics == ("f32",) and caps.arithmetic == "f32"
    assert Capabilities(arithmetics=["ggml", "f32"], arithmetic="ggml").arithmetics == ("ggml",
                                                                                          "f32")
    for bad in ({"arithmetics": ()}, {"arithmetics": ("int4",)},
                {"arithmetics": ("f32",), "arithmetic": "ggml"}):
        with pytest.raises(InvalidInputError):
            dataclasses.replace(caps, **bad)


def test_f32_files_give_s2cpps_own_numbers_with_ggml():
    """s2.cpp's own vector (an F32 file): ggml feeds F32 weights float32 activations, so the
    arithmetics differ only in the order of float32 operations. With numba, "ggml" takes the
    order of s2.cpp's AVX2 build (ggml_ops.py): the prefill-and-steps scenario comes out bit
    for bit, and every scenario at least as close as with "f32".

    "f32" sums in another order, so its hidden and logits are within 1e-5; its K and V go
    through the f16 cache, where a float32 difference at a rounding boundary is a whole f16
    step (2^-10 of the value: 1.3e-4 of the largest K on an AMD EPYC, whose BLAS kernels
    sum in yet another order)."""
    pytest.importorskip("numba")
    from conftest import S2CPP_VECTOR
    from s2cpp_replay import replay, worst
    for name in ("s1_prefill_steps", "s5_fast_decode"):
        errors = {}
        for arithmetic in ("f32", "ggml"):
            m = s2core.load(S2CPP_VECTOR / "tiny_f32.gguf", backend="numpy",
                            arithmetic=arithmetic)
            try:
                errors[arithmetic] = replay(m, S2CPP_VECTOR / name, "prefill_fast")
            finally:
                m.close()
        assert worst(errors["ggml"])[1] <= worst(errors["f32"])[1], name
        for what, error in errors["f32"].items():
            cached = what.endswith((" K", " V"))
            assert error <= (2.0 ** -10 if cached else 1e-5), (name, what, error)
        if name == "s1_prefill_steps":
            assert worst(errors["ggml"])[1] == 0.0, worst(errors["ggml"])
