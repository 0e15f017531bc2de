"""The torch backend keeping GGUF's quantized types as stored (quantized="stored").

On the CPU: the torch decoders (dequant.py) against gguf's own dequantization, bit for bit; the
whole conformance matrix with the blocks kept as stored (every product dequantizes into the
reused buffer); memory held and mapped; mixed files; non-finite scales. The Triton kernels (the
CUDA path) run here under Triton's interpreter, skipped with the reason where triton is not
installed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

torch = pytest.importorskip("torch")

import s2core  # noqa: E402
from s2core.errors import BackendUnavailableError, InvalidInputError  # noqa: E402
from s2core.gguf.blocks import (QUANTIZED_TYPES, NonFiniteScalesWarning,  # noqa: E402
                                non_finite_scale_blocks)
from s2core.modelfile.file import ModelFile  # noqa: E402
from s2core.kit.conformance import BackendConformance, prompt_and_frames, rel_err  # noqa: E402
from s2core.kit.models import MATRIX, kit_model, kit_reference  # noqa: E402
from s2core.kit.tolerances import fast_tolerance, kv_tolerance, output_tolerance  # noqa: E402
from s2core.runtime.memory import copied_weight_bytes, resident_weight_bytes  # noqa: E402
from s2core.kit.blocks import random_blocks, set_scale  # noqa: E402
from s2core_torch import dequant, plugin, quantized  # noqa: E402
from s2core_torch.quantized import QuantizedMatrix  # noqa: E402

TYPES = sorted(QUANTIZED_TYPES, key=lambda t: t.name)
TYPE_IDS = [t.name for t in TYPES]
QUANTIZED_MATRIX = [(c, t) for c, t in MATRIX if t not in ("f32", "f16", "bf16")]
STORED = {"device": "cpu", "quantized": "stored"}


def load(config: str, weight_type: str, **options):
    return s2core.load(kit_model(config, weight_type), backend="torch", **{**STORED, **options})


def blocks_per_row(qtype: QT) -> int:
    return 3 if gguf.GGML_QUANT_SIZES[qtype][0] == 256 else 9


# ------------------------------------------------------------------ the torch decoders
@pytest.mark.parametrize("qtype", TYPES, ids=TYPE_IDS)
def test_torch_dequantization_is_gguf_bit_for_bit(qtype):
    raw = random_blocks(qtype, 13, blocks_per_row(qtype), seed=int(qtype))
    expected = gguf.quants.dequantize(raw, qtype)
    got = dequant.dequantize(torch.from_numpy(raw), qtype)
    assert got.dtype == torch.float32 and got.shape == expected.shape
    np.testing.assert_array_equal(got.numpy(), expected)


def test_non_finite_scales_are_counted_per_block():
    raw = random_blocks(QT.Q4_K, 4, 3, seed=1)
    assert non_finite_scale_blocks(raw, QT.Q4_K) == 0
    set_scale(raw, QT.Q4_K, 2, np.inf)
    set_scale(raw, QT.Q4_K, 7, np.nan, field=1)  # dmin
    set_scale(raw, QT.Q4_K, 7, -np.inf)          # the same block twice: counted once
    assert non_finite_scale_blocks(raw, QT.Q4_K) == 2
    q6 = random_blocks(QT.Q6_K, 2, 2, seed=2)
    set_scale(q6, QT.Q6_K, 3, np.nan)            # Q6_K's d sits at the end of its block
    assert non_finite_scale_blocks(q6, QT.Q6_K) == 1


# ------------------------------------------------------------------ the conformance matrix
class TestStoredQuantizedOnCpu(BackendConformance):
    """Every rule of the kit, with quantized weights kept as stored on the CPU."""

    @pytest.fixture
    def backend(self):
        return "torch"

    @pytest.fixture
    def backend_options(self):
        return dict(STORED)


# ------------------------------------------------------------------ what is held
def test_stored_blocks_are_the_memory_map_on_cpu_and_memory_is_declared():
    with load("mha-k", "q4_k_m") as m:
        b, caps, mf = m.backend, m.capabilities, m.model_file
        assert {"q4_k", "q6_k", "q2_k", "q8_0"} <= caps.native_weight_types
        assert caps.native_weight_types <= caps.mapped_weight_types  # used in place
        assert caps.compute_dtype == "f32"  # products from exact float32 weights on the CPU
        matrices = [b.embeddings, b.codebooks] + [w for blk in b.layers for w in blk.matrices()]
        assert all(isinstance(w, QuantizedMatrix) for w in matrices)
        for w in matrices:  # the file's own bytes: a view of its memory map, no copy
            raw = mf.raw(next(t.name for t in mf.model_tensors()
                              if mf.raw(t.name).ctypes.data == w.blocks.data_ptr()))
            assert w.blocks.shape == raw.shape and w.nbytes == raw.nbytes
        weights = sum(t.n_bytes for t in mf.model_tensors())
        assert resident_weight_bytes(mf, caps) == weights  # byte for byte
        assert copied_weight_bytes(mf, caps) == 0
    with load("mha-k", "q4_k_m", quantized="widen") as w:
        assert resident_weight_bytes(w.model_file, w.capabilities) > 3 * weights
        assert not isinstance(w.backend.layers[0].w1, QuantizedMatrix)


def test_a_mixed_file_keeps_every_tensor_in_its_own_type():
    with load("mha-k", "q4_k_m") as m:
        b = m.backend
        assert b.embeddings.qtype == QT.Q6_K                      # the tied output table
        assert b.layers[0].w2.qtype == QT.Q4_K and b.layers[1].w2.qtype == QT.Q6_K
        assert {blk.w1.qtype for blk in b.layers} == {QT.Q4_K}
        for name, held in (("embeddings.weight", b.embeddings), ("layers.1.feed_forward.w2.weight",
                                                                b.layers[1].w2)):
            ids = torch.tensor([0, 5, 17, 5])
            np.testing.assert_array_equal(
                held.rows(ids).numpy(), m.model_file.dequantize_rows(name, ids.numpy()))


def test_products_go_slab_by_slab_through_one_reused_buffer(monkeypatch):
    monkeypatch.setattr(quantized, "SLAB_ELEMENTS", 3 * 256)  # three rows of 256 per slab
    mf = ModelFile(kit_model("mha-k", "q6_k"))
    name = "layers.0.feed_forward.w1.weight"
    info = mf.info(name)
    w = QuantizedMatrix(torch.from_numpy(np.array(mf.raw(name))), info.type, info.shape)
    products = quantized.QuantizedProducts(torch.device("cpu"), torch.float32, "torch")
    x = torch.randn(5, info.shape[1])
    out = products(x, w)
    exact = x.double() @ torch.from_numpy(mf.dequantize(name)).double().T
    assert out.dtype == torch.float32 and rel_err(out.numpy(), exact.numpy()) < 1e-6
    pointer = products.buffer._flat.data_ptr()
    assert products.buffer._flat.numel() == 3 * 256
    products(torch.randn(1, info.shape[1]), w)
    assert products.buffer._flat.data_ptr() == pointer


# ------------------------------------------------------------------ non-finite scales
@pytest.fixture
def q4k_with_an_infinite_scale(tmp_path):
    path = tmp_path / "inf.gguf"
    shutil.copy(kit_model("mha-k", "q4_k"), path)
    reader = gguf.GGUFReader(path, "r+")
    tensor = next(t for t in reader.tensors if t.name == "layers.1.feed_forward.w3.weight")
    set_scale(tensor.data, QT.Q4_K, 5, np.inf)  # written through the map
    reader.data.flush()
    del reader
    return path


@pytest.mark.filterwarnings("ignore:invalid value encountered in multiply:RuntimeWarning")
def test_a_tensor_with_a_non_finite_scale_is_widened_and_says_so(q4k_with_an_infinite_scale):
    path = q4k_with_an_infinite_scale
    with pytest.warns(NonFiniteScalesWarning, match=r"layers.1.feed_forward.w3.weight.*1 block"):
        m = s2core.load(path, backend="torch", **STORED)
    with m:
        b = m.backend
        assert b.widened_non_finite == ("layers.1.feed_forward.w3.weight",)
        w3 = b.layers[1].w3
        assert isinstance(w3, torch.Tensor) and w3.dtype == torch.float16  # widened_weight_dtype
        assert isinstance(b.layers[1].w1, QuantizedMatrix)  # the others stay as stored
        expected = m.model_file.dequantize("layers.1.feed_forward.w3.weight").astype(np.float16)
        np.testing.assert_array_equal(w3.numpy(), expected)
        assert np.isinf(expected).any()


# ------------------------------------------------------------------ options
@pytest.mark.parametrize("options,check", [({"quantized": "int4"}, "quantized"),
                                           ({"quant_kernels": "cutlass"}, "quant_kernels")])
def test_bad_quantized_options_are_rejected(options, check):
    with pytest.raises(InvalidInputError) as info:
        load("gqa4", "q8_0", **options)
    assert info.value.check == check


def test_defaults_and_environment(monkeypatch):
    monkeypatch.delenv(plugin.ENV_QUANTIZED, raising=False)
    assert plugin.default_quantized_mode("cpu", True) == "widen"
    assert plugin.default_quantized_mode("cuda", True) == "stored"
    assert plugin.default_quantized_mode("cuda", False) == "widen"
    with s2core.load(kit_model("gqa4", "q8_0"), backend="torch", device="cpu") as m:
        assert m.backend.options.quantized == "widen"
        assert "q8_0" not in m.capabilities.native_weight_types
    monkeypatch.setenv(plugin.ENV_QUANTIZED, "stored")
    probe = plugin.probe()
    assert "q4_k" in probe.capabilities.native_weight_types
    with s2core.load(kit_model("gqa4", "q8_0"), backend="torch", device="cpu") as m:
        assert m.backend.options.quantized == "stored"
        assert isinstance(m.backend.layers[0].w1, QuantizedMatrix)
    monkeypatch.setenv(plugin.ENV_QUANTIZED, "int3")
    assert not plugin.probe().available and "int3" in plugin.probe().reason


def test_triton_kernels_on_the_cpu_need_the_interpreter(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(BackendUnavailableError, match="TRITON_INTERPRET|not installed"):
        load("gqa4", "q8_0", quant_kernels="triton")


def test_the_cpu_path_never_imports_triton():
    code = ("import sys, s2core; from s2core.kit.models import kit_model; "
            "m = s2core.load(kit_model('mha-k', 'q4_k'), backend='torch', device='cpu', "
            "quantized='stored'); m.init_kv_cache(8); m.prefill([[1, 0, 0, 0, 0]]); "
            "print('triton' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stderr


# ------------------------------------------------------------------ Triton, interpreted
@pytest.fixture(scope="module")
def triton_kernels():
    """The Triton module under the interpreter. Triton reads TRITON_INTERPRET when it (and
    each module of kernels) is imported, so it is set before the first import."""
    if "triton" not in sys.modules:
        os.environ["TRITON_INTERPRET"] = "1"
    triton = pytest.importorskip("triton", reason="triton is not installed "
                                 "(pip install 's2core[triton]')")
    from s2core_torch import triton_kernels as tk
    if not (tk.INTERPRETED and type(triton.language.zeros).__name__ == "InterpretedFunction"):
        pytest.skip("triton was imported before TRITON_INTERPRET=1 was set in this process "
                    "(run these tests in a process of their own)")
    return tk


@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")  # to f16
@pytest.mark.parametrize("qtype", TYPES, ids=TYPE_IDS)
def test_triton_dequantize_is_gguf_bit_for_bit(triton_kernels, qtype):
    raw = random_blocks(qtype, 133, blocks_per_row(qtype), seed=10 + int(qtype))  # 133: ragged
    expected = gguf.quants.dequantize(raw, qtype)
    out = torch.full(expected.shape, np.nan)
    triton_kernels.dequantize_into(torch.from_numpy(raw), qtype, out)
    np.testing.assert_array_equal(out.numpy(), expected)
    half = torch.empty(expected.shape, dtype=torch.float16)
    triton_kernels.dequantize_into(torch.from_numpy(raw), qtype, half)
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(half.numpy(), expected.astype(np.float16))


@pytest.mark.parametrize("qtype", TYPES, ids=TYPE_IDS)
def test_triton_gemv_matches_the_float64_product(triton_kernels, qtype):
    raw = random_blocks(qtype, 133, blocks_per_row(qtype), seed=20 + int(qtype))
    w = gguf.quants.dequantize(raw, qtype).astype(np.float64)
    assert np.isfinite(w).all()
    x = torch.randn(3, w.shape[1], dtype=torch.float64)
    x /= float(np.abs(x.numpy() @ w.T).max()) / 1000  # float16 outputs: no overflow
    exact = x.numpy() @ w.T
    for out_dtype, bound in ((torch.float32, 1e-6), (torch.float16, 1e-3)):
        y = triton_kernels.qmv(x.float(), torch.from_numpy(raw), qtype, out_dtype)
        assert y.dtype == out_dtype and y.shape == (3, 133)
        assert rel_err(y.float().numpy(), exact) < bound


@pytest.mark.parametrize("config,weight_type", QUANTIZED_MATRIX,
                         ids=[f"{c}-{t}" for c, t in QUANTIZED_MATRIX])
def test_triton_path_matches_the_reference(triton_kernels, config, weight_type):
    """A prefill (dequantize_into + matmul), steps (the fused GEMV) and Fast-AR calls, through
    the backend, within the kit's bounds."""
    with load(config, weight_type, quant_kernels="triton") as m:
        assert m.backend.matmul.quantized.kernels == "triton"
        ref = kit_reference(config, weight_type)
        prompt, frames = prompt_and_frames(config, n_frames=1)
        m.init_kv_cache(64)
        r = m.prefill(prompt)
        expected = ref.forward(prompt)
        tol = output_tolerance(m.capabilities)
        assert rel_err(r.logits, expected.logits) < tol
        assert rel_err(r.hidden, expected.hidden) < tol
        k, _ = m.kv_cache_snapshot()
        assert rel_err(k, expected.k) < kv_tolerance(m.capabilities)
        seq = prompt
        for frame in frames:
            r = m.step(frame)
            seq = np.vstack([seq, frame])
            assert rel_err(r.logits, ref.forward(seq).logits) < tol
        codes = [1, 2, 3]
        assert rel_err(m.fast_decode(r.hidden, codes), ref.fast_decode(r.hidden, codes)) \
            < fast_tolerance(m.capabilities)
