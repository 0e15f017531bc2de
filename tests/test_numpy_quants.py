"""The NumPy backend's numba kernels for the block-quantized types (Q2_K..Q6_K, Q4_0, Q4_1,
Q5_0, Q5_1), against gguf's own dequantization, and how the backend holds such files."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

import s2core
from s2core.gguf.blocks import SCALE_FIELDS, NonFiniteScalesWarning, block_shape
from s2core.embedded.writer import write_model
from s2core.kit.models import CONFIGS, kit_model
from s2core.kit.blocks import random_blocks, set_scale
from s2core_numpy import plugin

pytestmark = pytest.mark.skipif(not plugin.numba_available(), reason="numba not installed")

TYPES = [QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1, QT.Q2_K, QT.Q3_K, QT.Q4_K, QT.Q5_K, QT.Q6_K]
IDS = [t.name.lower() for t in TYPES]
#: the types with fused kernels (quant_kernels.FUSED): one, two and four rows
K_QUANTS = [QT.Q2_K, QT.Q3_K, QT.Q4_K, QT.Q5_K, QT.Q6_K]


def every_byte_blocks(qtype: QT, rows: int, blocks_per_row: int, seed: int) -> np.ndarray:
    """Valid blocks (rows, blocks_per_row * block bytes) in which every byte that is not a
    float16 scale field takes each of its 256 values once per 256 blocks (a random order per
    byte): every bit pattern of the packed quants and sub-block scales occurs. The float16
    fields are random finite values of both signs (subnormals and zeros among them)."""
    _, nbytes = block_shape(qtype)
    flat = random_blocks(qtype, rows, blocks_per_row, seed).reshape(-1, nbytes)
    assert flat.shape[0] % 256 == 0
    rng = np.random.default_rng(seed + 1)
    scale_bytes = {o + i for o in SCALE_FIELDS[qtype] for i in (0, 1)}
    for k in range(nbytes):
        if k not in scale_bytes:
            flat[:, k] = np.concatenate([rng.permutation(256) for _ in range(flat.shape[0] // 256)])
    return flat.reshape(rows, -1)


def gguf_weights(raw: np.ndarray, qtype: QT) -> np.ndarray:
    return gguf.quants.dequantize(raw, qtype).astype(np.float32).reshape(raw.shape[0], -1)


def rel_err(out, ref) -> float:
    out, ref = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    return float(np.linalg.norm(out - ref) / np.linalg.norm(ref))


@pytest.fixture(scope="module", params=TYPES, ids=IDS)
def packed(request):
    """(type, raw blocks, gguf's float32 weights, the packed matrix): 100 rows (a partial last
    tile), every byte value at every packed position."""
    from s2core_numpy.quants import QuantMatrix
    qtype = request.param
    raw = every_byte_blocks(qtype, 128, 4, seed=3)[:100]
    m = QuantMatrix.from_raw(raw, qtype)
    return qtype, raw, gguf_weights(raw, qtype), m


def test_decoding_is_gguf_dequantization_bit_for_bit(packed):
    qtype, raw, w, m = packed
    assert m.shape == w.shape
    assert m.nbytes == raw.nbytes // 100 * 128  # the file's bytes; 100 rows fill 2 tiles of 64
    np.testing.assert_array_equal(m.dequantize().view(np.uint32), w.view(np.uint32))


def test_row_lookup_decodes_exactly_the_rows_asked_for(packed):
    _, _, w, m = packed
    ids = np.array([0, 63, 64, 99, 5, 5])
    np.testing.assert_array_equal(m.rows(ids).view(np.uint32), w[ids].view(np.uint32))


@pytest.mark.parametrize("n_rows", [1, 2, 3, 6, 40])
def test_products_equal_the_float64_product_of_ggufs_weights(packed, n_rows):
    """One row (the fused or decoding matvec), a few rows (in fours; two left over go to the
    two-row kernel of the K-quants, one to the one-row kernel) and many (float32 W^T and
    sgemm): gguf's weights times x, up to float32 summation order."""
    _, _, w, m = packed
    x = np.random.default_rng(n_rows).standard_normal((n_rows, w.shape[1]), dtype=np.float32)
    out = m(x)
    assert out.shape == (n_rows, w.shape[0]) and out.dtype == np.float32
    ref = x.astype(np.float64) @ w.astype(np.float64).T
    for r in range(n_rows):  # row by row: no row may hide in another's norm
        assert rel_err(out[r], ref[r]) < 1e-5


@pytest.mark.parametrize("n_rows", [2, 6])
@pytest.mark.parametrize("qtype", K_QUANTS, ids=[t.name.lower() for t in K_QUANTS])
def test_two_rows_of_the_k_quants_are_the_one_row_products_bit_for_bit(qtype, n_rows):
    """The two-row kernel of the K-quants (a frame's first Fast-AR call, a batch of two)
    sums each row exactly as the one-row kernel does: a row's numbers do not depend on its
    neighbour. (The other types' rows go one at a time.)"""
    from s2core_numpy.quants import QuantMatrix
    m = QuantMatrix.from_raw(every_byte_blocks(qtype, 128, 4, seed=5)[:100], qtype)
    x = np.random.default_rng(7).standard_normal((n_rows, m.shape[1]), dtype=np.float32)
    together = m(x)
    for r in range(n_rows - 2, n_rows):
        np.testing.assert_array_equal(together[r].view(np.uint32),
                                      m(x[r:r + 1])[0].view(np.uint32))


def test_the_blocks_cover_every_byte_value():
    """The helper above does what the tests rely on (a check of the check)."""
    flat = every_byte_blocks(QT.Q4_K, 64, 4, seed=0).reshape(-1, 144)
    for k in range(4, 144):
        assert len(np.unique(flat[:, k])) == 256


def test_a_non_finite_scale_is_refused_by_the_packer():
    from s2core_numpy.quants import QuantMatrix
    for qtype in TYPES:
        for field in range(len(SCALE_FIELDS[qtype])):
            for bad in (np.inf, np.nan):
                raw = every_byte_blocks(qtype, 64, 4, seed=1)
                set_scale(raw, qtype, 37, bad, field)
                assert QuantMatrix.from_raw(raw, qtype) is None


# ------------------------------------------------------------------------------ backend
@pytest.mark.parametrize("weight_type", ["q4_k_m", "q5_k_m", "q6_k", "q3_k", "q2_k"])
def test_backend_keeps_every_tensor_in_its_own_type(weight_type):
    from s2core_numpy.quants import QuantMatrix
    from s2core.modelfile.file import ModelFile
    path = kit_model("mha-k", weight_type)
    mf = ModelFile(path)
    # arithmetic "f32": the float kernels' holdings (test_int_dots.py: the integer kernels')
    m = s2core.load(path, backend="numpy", arithmetic="f32")
    b = m.backend
    named = {"embeddings.weight": b.embeddings, "fast_embeddings.weight": b.fast.embeddings,
             "fast_output.weight": b.fast.output}
    for i, blk in enumerate(b.layers):
        for attr, name in (("wqkv", "attention.wqkv"), ("wo", "attention.wo"),
                           ("w1", "feed_forward.w1"), ("w2", "feed_forward.w2"),
                           ("w3", "feed_forward.w3")):
            named[f"layers.{i}.{name}.weight"] = getattr(blk, attr)
    types = set()
    for name, w in named.items():
        assert isinstance(w, QuantMatrix), name
        assert w.qtype == mf.info(name).type, name
        types.add(w.qtype)
    if weight_type.endswith("_m"):
        assert QT.Q6_K in types and len(types) == 2  # mixed: each tensor its own type
    assert m.backend.widened_non_finite == ()
    m.close()
    mf.close()


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")  # gguf's inf * 0
def test_a_tensor_with_an_infinite_scale_is_widened_and_said(tmp_path):
    """Widened as gguf decodes it (the infinity stays where gguf puts it), with a warning
    naming the tensor; the others stay as stored."""
    path = write_model(tmp_path / "inf.gguf", CONFIGS["mha-k"], "q4_k", seed=7).path
    r = gguf.GGUFReader(path, "r+")
    t = next(t for t in r.tensors if t.name == "layers.0.attention.wo.weight")
    set_scale(t.data, QT.Q4_K, 3, np.inf)
    del r
    with pytest.warns(NonFiniteScalesWarning, match="layers.0.attention.wo.weight"):
        m = s2core.load(path, backend="numpy", arithmetic="f32")
    b = m.backend
    assert b.widened_non_finite == ("layers.0.attention.wo.weight",)
    from s2core_numpy.f32_rows import F32Matrix  # float32, multiplied by its own kernels
    assert isinstance(b.layers[0].wo, F32Matrix) and not np.isfinite(b.layers[0].wo.w).all()
    from s2core_numpy.quants import QuantMatrix
    assert isinstance(b.layers[0].wqkv, QuantMatrix)
    m.close()


def test_probe_declares_all_nine_types_with_numba(monkeypatch):
    monkeypatch.setattr(plugin, "numba_available", lambda: True)
    native = plugin.probe().capabilities.native_weight_types
    assert {t.name.lower() for t in TYPES} | {"f16", "q8_0", "f32"} == native
    monkeypatch.setattr(plugin, "numba_available", lambda: False)
    assert plugin.probe().capabilities.native_weight_types == {"f32"}


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")
def test_a_q8_0_tensor_with_a_nan_scale_is_widened_and_said(tmp_path):
    path = write_model(tmp_path / "nan.gguf", CONFIGS["gqa4"], "q8_0", seed=7).path
    r = gguf.GGUFReader(path, "r+")
    t = next(t for t in r.tensors if t.name == "layers.1.feed_forward.w1.weight")
    set_scale(t.data, QT.Q8_0, 0, np.nan)
    del r
    with pytest.warns(NonFiniteScalesWarning, match="layers.1.feed_forward.w1.weight"):
        m = s2core.load(path, backend="numpy", arithmetic="f32")
    assert m.backend.widened_non_finite == ("layers.1.feed_forward.w1.weight",)
    assert np.isnan(m.backend.layers[1].w1.w[0, :32]).all()  # f32_rows.F32Matrix
    m.close()
