"""torch's arithmetic="ggml" (s2.cpp's: 8-bit activations, integer block dots) in Triton.

The kernels (triton_ggml.py) run here under Triton's interpreter, on CPU tensors, as the
other Triton tests do (test_torch_quantized.py); skipped with the reason where triton is not
installed. Against the kit's float64 transcription of ggml (s2core.kit.ggml_arithmetic) and
NumPy's activation codes (act_quant.quantize), bit for bit. On CUDA, benchmarks/cuda_check.py
runs the kit's arithmetic rule for torch.
"""

from __future__ import annotations

import os
import sys

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

torch = pytest.importorskip("torch")

import s2core  # noqa: E402
from s2core.errors import BackendUnavailableError, InvalidInputError  # noqa: E402
from s2core.kit import ggml_arithmetic as kit_ggml  # noqa: E402
from s2core.kit.arithmetic import FLIP_BOUND, row_errors  # noqa: E402
from s2core.kit.blocks import random_blocks  # noqa: E402
from s2core.kit.conformance import prompt_and_frames, rel_err  # noqa: E402
from s2core.kit.models import CONFIGS, kit_model, kit_reference  # noqa: E402
from s2core.kit.prompts import mixed_prompt  # noqa: E402
from s2core.kit.tolerances import (CACHE_KV, COMPUTE, fast_tolerance,  # noqa: E402
                                   output_tolerance)
from s2core.modelfile.file import ModelFile  # noqa: E402
from s2core.runtime.model import SlowARModel  # noqa: E402
from s2core_torch import ops, plugin  # noqa: E402

INTEGER = [QT.Q8_0, QT.Q4_K, QT.Q6_K]
SNAPPED = [QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1, QT.Q2_K, QT.Q3_K, QT.Q5_K]


@pytest.fixture(scope="module")
def tg():
    """triton_ggml under the interpreter (TRITON_INTERPRET=1 set before triton's import)."""
    if "triton" not in sys.modules:
        os.environ["TRITON_INTERPRET"] = "1"
    triton = pytest.importorskip("triton", reason="triton is not installed "
                                 "(pip install 's2core[triton]')")
    from s2core_torch import triton_ggml
    if not (triton_ggml.INTERPRETED
            and type(triton.language.zeros).__name__ == "InterpretedFunction"):
        pytest.skip("triton was imported before TRITON_INTERPRET=1 was set in this process "
                    "(run these tests in a process of their own)")
    return triton_ggml


def activations(rows: int, width: int, seed: int) -> np.ndarray:
    """Rows of mixed scales, with the cases the rounding has to get right: an all-zero block,
    exact ties (x * inverse = k + 0.5), a negative peak of the same magnitude as a later
    positive one (Q8_K keeps the first, its sign decides iscale's)."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((rows, width)) * rng.uniform(1e-3, 30, (rows, 1))).astype(np.float32)
    x[0, :256] = 0
    if rows > 1 and width >= 512:  # amax 127: inverse 1, so the codes are rint(x): ties to even
        x[1, :32] = np.r_[127, -127, np.arange(30) - 14.5].astype(np.float32)
        x[1, 256:512] = np.r_[-100, 100, np.arange(254) * 0.37 - 47].astype(np.float32)
    return x


def blocks_for(qtype: QT, rows: int, width: int, seed: int) -> np.ndarray:
    return random_blocks(qtype, rows, width // gguf.GGML_QUANT_SIZES[qtype][0], seed=seed)


def kit_product(x: np.ndarray, raw: np.ndarray, qtype: QT) -> np.ndarray:
    w = gguf.quants.dequantize(raw, qtype).astype(np.float64)
    mins = (kit_ggml.block_mins_of(raw, gguf.GGML_QUANT_SIZES[qtype][1])
            if qtype in (QT.Q4_1, QT.Q5_1) else None)
    return kit_ggml.ggml_product(x.astype(np.float64), w, qtype, mins)


# ------------------------------------------------------------------ activation codes
@pytest.mark.parametrize("dot_type", ["q8_0", "q8_k"])
def test_activation_codes_are_ggml_bit_for_bit(tg, dot_type):
    x = activations(5, 768, seed=1)
    codes, d = tg.quantize(dot_type, torch.from_numpy(x))
    d = tg.dot_scales(dot_type, d).numpy()
    size = tg.BLOCK_VALUES[dot_type]
    for r in range(x.shape[0]):  # the kit's plain transcription, block by block
        for b in range(0, x.shape[1], size):
            if dot_type == "q8_k":
                expected, d_expected = kit_ggml.quantize_q8_k_block(x[r, b:b + size])
            else:
                expected, d_expected, _ = kit_ggml.quantize_q8_0_block(x[r, b:b + size])
            np.testing.assert_array_equal(codes[r, b:b + size].numpy(), expected)
            assert d[r, b // size] == np.float32(d_expected)
    pytest.importorskip("numba", reason="NumPy's integer codes need numba")
    from s2core_numpy import act_quant
    np_codes, np_d, _ = act_quant.quantize(dot_type, x)
    np.testing.assert_array_equal(codes.numpy(), np_codes)
    np.testing.assert_array_equal(d, np_d)


def test_ties_round_to_even(tg):
    """x * 127 / amax exactly k + 0.5: ggml's x86 rounding gives the even neighbour."""
    x = np.zeros((1, 32), np.float32)
    x[0, :6] = [127, 0.5, 1.5, 2.5, -0.5, -3.5]
    codes, _ = tg.quantize("q8_0", torch.from_numpy(x))
    assert codes[0, :6].tolist() == [127, 0, 2, 2, 0, -4]


# ------------------------------------------------------------------ products
@pytest.mark.parametrize("rows", [1, 3, 20], ids=["one-row", "3-rows", "20-rows"])
@pytest.mark.parametrize("qtype", INTEGER, ids=[t.name for t in INTEGER])
def test_integer_dots_match_the_kit(tg, qtype, rows):
    """20 rows: two tiles of activation rows; 133 weight rows: a ragged tile."""
    x = activations(rows, 512, seed=rows)
    raw = blocks_for(qtype, 133, 512, seed=int(qtype))
    out = tg.int_dot(torch.from_numpy(x), torch.from_numpy(raw), qtype).numpy()
    expected = kit_product(x, raw, qtype)
    assert out.shape == (rows, 133) and out.dtype == np.float32
    assert rel_err(out, expected) < 1e-6
    # the same weights times float32 activations miss by the 8-bit rounding: the check bites
    unrounded = x.astype(np.float64) @ gguf.quants.dequantize(raw, qtype).astype(np.float64).T
    assert rel_err(unrounded, expected) > 1e-4


def test_a_rows_integer_product_does_not_depend_on_its_neighbours(tg):
    """Integer sums are exact and the float steps go in one order: a row batched with others
    (a batched step's sequences) gets its numbers alone, bit for bit."""
    x = torch.from_numpy(activations(19, 512, seed=9))
    raw = torch.from_numpy(blocks_for(QT.Q4_K, 70, 512, seed=2))
    together = tg.int_dot(x, raw, QT.Q4_K)
    for r in (0, 7, 18):
        assert torch.equal(tg.int_dot(x[r:r + 1], raw, QT.Q4_K)[0], together[r])


@pytest.mark.parametrize("qtype", SNAPPED, ids=[t.name for t in SNAPPED])
def test_other_quantized_types_match_the_kit(tg, qtype):
    from s2core_torch.ggml_products import GgmlProducts
    from s2core_torch.quantized import QuantizedMatrix
    x = activations(3, 512, seed=5)
    raw = blocks_for(qtype, 40, 512, seed=int(qtype))
    w = QuantizedMatrix(torch.from_numpy(raw), qtype, (40, 512))
    out = GgmlProducts(torch.device("cpu"))(torch.from_numpy(x), w).numpy()
    assert rel_err(out, kit_product(x, raw, qtype)) < 1e-6


def test_half_weights_take_half_activations(tg):
    rng = np.random.default_rng(3)
    w = rng.standard_normal((48, 256)).astype(np.float16)
    x = activations(2, 256, seed=4)
    mm = ops.Matmul(torch.device("cpu"), torch.float32, "triton", arithmetic="ggml")
    out = mm(torch.from_numpy(x), torch.from_numpy(w)).numpy()
    expected = kit_ggml.ggml_product(x.astype(np.float64), w.astype(np.float64), QT.F16)
    assert rel_err(out, expected) < 1e-6


# ------------------------------------------------------------------ through the backend
def load_ggml(config: str, weight_type: str, **options) -> SlowARModel:
    """The torch backend with arithmetic="ggml" on the CPU, which only the interpreter allows:
    opened directly, since the registry (rightly) offers torch's "ggml" on CUDA only."""
    from s2core_torch.backend import TorchBackend
    mf = ModelFile(kit_model(config, weight_type))
    try:
        return SlowARModel(mf, TorchBackend(mf, device="cpu", arithmetic="ggml",
                                            kv_cache_dtype="f32", **options))
    except BaseException:
        mf.close()
        raise


@pytest.mark.parametrize("config,weight_type", [("gqa4", "q8_0"), ("mha-k", "q4_k_m"),
                                                ("mha-k", "q6_k"), ("gqa4", "f16"),
                                                ("gqa2-noqk", "q4_1")])
def test_the_kits_arithmetic_rule_under_the_interpreter(tg, config, weight_type):
    """The body of the kit's rule (s2core/kit/arithmetic.py) with torch's "ggml" products."""
    with load_ggml(config, weight_type) as m:
        caps = m.capabilities
        assert caps.arithmetic == "ggml" and "ggml" in caps.arithmetics
        assert caps.compute_dtype == "f32"
        prompt = mixed_prompt(CONFIGS[config], 24, np.random.default_rng(0))
        m.init_kv_cache(32)
        r = m.prefill_fast(prompt)
        ref = kit_reference(config, weight_type, "ggml").forward(prompt)
        k, v = m.kv_cache_snapshot()
        errors = np.concatenate([row_errors(k, ref.k), row_errors(v, ref.v)])
        assert np.median(errors) <= COMPUTE["f32"] + CACHE_KV["f32"]
        assert errors.max() <= FLIP_BOUND
        assert rel_err(r.logits, ref.logits) <= FLIP_BOUND
        # and the "f32" reference is farther: the products did round their activations
        f32_ref = kit_reference(config, weight_type, "f32").forward(prompt)
        assert rel_err(k, f32_ref.k) > 10 * rel_err(k, ref.k)
        if weight_type == "q4_k_m":  # a decode step and the Fast-AR take the same products
            frame = prompt_and_frames(config, n_frames=1)[1][0]
            step = m.step(frame)
            reference = kit_reference(config, weight_type, "ggml")
            assert rel_err(step.logits, reference.forward(np.vstack([prompt, frame])).logits) \
                < output_tolerance(caps)
            codes = [1, 2, 3]
            assert rel_err(m.fast_decode(step.hidden, codes),
                           reference.fast_decode(step.hidden, codes)) < fast_tolerance(caps)


# ------------------------------------------------------------------ who offers it
def test_torch_offers_ggml_on_cuda_with_triton_only():
    assert plugin.offered_arithmetics("cuda", True, "f32", "stored") == ("ggml", "f32")
    assert plugin.offered_arithmetics("cuda", False, "f32", "stored") == ("f32",)
    assert plugin.offered_arithmetics("cuda", True, "f16", "stored") == ("f32",)
    assert plugin.offered_arithmetics("cuda", True, "f32", "widen") == ("f32",)
    assert plugin.offered_arithmetics("cpu", True, "f32", "stored") == ("f32",)


@pytest.fixture
def torch_on_the_cpu(monkeypatch):
    """The registry probing torch for the CPU (as on a machine without CUDA)."""
    monkeypatch.setenv(plugin.ENV_DEVICE, "cpu")
    s2core.get_registry().refresh()
    yield
    monkeypatch.undo()
    s2core.get_registry().refresh()


def test_ggml_on_a_torch_cpu_load_names_the_backends_that_offer_it(torch_on_the_cpu):
    assert s2core.get_registry().info("torch").capabilities.arithmetics == ("f32",)
    with pytest.raises(InvalidInputError, match="offer arithmetic='ggml'.*numpy") as e:
        s2core.load(kit_model("gqa4", "q8_0"), backend="torch", arithmetic="ggml")
    assert e.value.check == "arithmetic"


def test_ggml_options_that_contradict_it_are_refused(tg, monkeypatch):
    from s2core_torch.backend import TorchBackend
    mf = ModelFile(kit_model("gqa4", "q8_0"))
    try:
        for bad in ({"quantized": "widen"}, {"quant_kernels": "torch"}):
            with pytest.raises(InvalidInputError, match="arithmetic='ggml'"):
                TorchBackend(mf, device="cpu", arithmetic="ggml", **bad)
        monkeypatch.delenv("TRITON_INTERPRET")
        with pytest.raises(BackendUnavailableError, match="CUDA"):
            TorchBackend(mf, device="cpu", arithmetic="ggml")
    finally:
        mf.close()
