"""The integer kernels of arithmetic="ggml" (backends/s2core_numpy/int_dots.py, simd.py):
exact decoding of the rearranged blocks, ggml's numbers, rows batched as alone, and the AVX2
code (built on this machine by naming a Haswell to numba) equal to the VNNI code bit for bit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

pytest.importorskip("numba")

from s2core.benchmarking.machine import HASWELL  # noqa: E402
from s2core.embedded.kquants import quantize_k  # noqa: E402
from s2core.kit.ggml_arithmetic import ggml_product  # noqa: E402

from s2core_numpy import act_quant, int_dots, simd  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TYPES = sorted(int_dots.TYPES)

needs_integer_kernels = pytest.mark.skipif(
    not simd.isa(), reason="this CPU has neither AVX2 nor AVX-512 VNNI: no integer kernels")


def quantized(qtype: QT, n_out: int, n_in: int, seed: int) -> np.ndarray:
    w = np.random.default_rng(seed).standard_normal((n_out, n_in)).astype(np.float32)
    raw = gguf.quants.quantize(w, qtype) if qtype == QT.Q8_0 else quantize_k(w, qtype)
    return raw.view(np.uint8).reshape(n_out, -1)


@needs_integer_kernels
@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_rearranged_blocks_decode_as_gguf(qtype):
    """37 rows: the last tile of 16 is padded; every row decodes to gguf's floats exactly."""
    raw = quantized(qtype, 37, 512, 1)
    m = int_dots.IntDotMatrix.from_raw(raw, qtype)
    want = gguf.quants.dequantize(raw, qtype).reshape(37, 512)
    assert np.array_equal(m.dequantize(), want)
    assert m.nbytes == int_dots.IntDotMatrix.from_raw(raw, qtype).codes.nbytes
    assert m.nbytes == -(-37 // 16) * 16 * raw.shape[1]  # the file's bytes, padded to 16 rows


@needs_integer_kernels
@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_products_are_ggmls_and_batched_rows_equal_single_rows(qtype):
    raw = quantized(qtype, 40, 768, 2)
    m = int_dots.IntDotMatrix.from_raw(raw, qtype)
    w64 = gguf.quants.dequantize(raw, qtype).reshape(40, 768).astype(np.float64)
    x = np.random.default_rng(3).standard_normal((9, 768)).astype(np.float32)
    x[4] = 0  # an all-zero row: d = 0, codes 0
    batched = m(x)
    ref = ggml_product(x, w64, qtype)
    assert np.abs(batched - ref).max() <= 2e-6 * np.abs(ref).max()
    for r in range(x.shape[0]):
        assert np.array_equal(m(x[r:r + 1])[0], batched[r]), r
    # exactly BLOCK rows, through the block kernel and one row a call (simd.LONE_BLOCK)
    xq, xd, xs = act_quant.quantize(m.dot_type, x[:simd.BLOCK])
    ways = []
    for lone in (True, False):
        out = np.empty((simd.BLOCK, m.codes.shape[0] * simd.ROWS), np.float32)
        simd.products(m.kind, m.codes, xq, xd, xs, out, lone)
        ways.append(out[:, :40])
    assert np.array_equal(ways[0], ways[1]) and np.array_equal(ways[0], batched[:simd.BLOCK])


@needs_integer_kernels
def test_kernel_sums_are_the_terms_the_kernels_take():
    """simd.kernel_sums, slot by slot, from ggml's sums of 16 codes: Q4_K's int16 pairs of
    32-code sums (a negative low half must not spill into the high one), Q6_K's 32 x sums,
    Q8_0's sums as they are. Random rows, and rows whose every code is the extreme -127."""
    x = np.random.default_rng(5).standard_normal((4, 512)).astype(np.float32)
    x[1], x[2] = -1, 1  # ggml's Q8_K codes a block of one value as -127
    for qtype in TYPES:
        _, _, xs = act_quant.quantize(act_quant.DOT_TYPE[qtype], x)
        made = simd.kernel_sums(int(qtype), xs).reshape(xs.shape)
        if qtype == QT.Q8_0:
            assert np.array_equal(made, xs)
        elif qtype == QT.Q6_K:
            assert np.array_equal(made, 32 * xs)
        else:
            sums32 = xs.reshape(4, -1, 2).sum(axis=2)  # (row, 32-code sub-block)
            low, high = sums32[:, 0::2], sums32[:, 1::2]
            pairs = np.ascontiguousarray(made[:, 0::4]).view(np.int16).reshape(4, -1, 2)
            assert np.array_equal(pairs[..., 0], low) and np.array_equal(pairs[..., 1], high)
            assert low.min() == -127 * 32 and ((low < 0) & (high > 0)).any()


@needs_integer_kernels
def test_avx2_code_equals_this_cpus_code():
    """The other ISA's kernels, compiled in a subprocess for a Haswell, give the same bits
    (the integer sums are exact; the float steps are the same operations in the same order):
    single rows, and blocks of rows, which AVX2 emits by halves of the output rows."""
    script = (
        "import json, sys, numpy as np, gguf\n"
        "from s2core_numpy import int_dots, simd\n"
        "out = {'isa': simd.isa()}\n"
        "for name, raw, x in np.load(sys.argv[1], allow_pickle=True)['cases']:\n"
        "    m = int_dots.IntDotMatrix.from_raw(raw, gguf.GGMLQuantizationType[name])\n"
        "    out[name] = m(x).tobytes().hex()\n"
        "    out[name + '/block'] = m(x[:simd.BLOCK]).tobytes().hex()\n"
        "print(json.dumps(out))\n")
    cases = []
    rng = np.random.default_rng(4)
    for qtype in TYPES:
        cases.append((qtype.name, quantized(qtype, 32, 512, int(qtype)),
                      rng.standard_normal((6, 512)).astype(np.float32)))  # a block + 2
    path = Path(os.environ.get("TMPDIR", "/tmp")) / f"int-dots-{os.getpid()}.npz"
    arr = np.empty(len(cases), dtype=object)
    arr[:] = cases
    np.savez(path, cases=arr)
    env = dict(os.environ, NUMBA_CPU_NAME="haswell", NUMBA_CPU_FEATURES=HASWELL,
               PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "backends"),
                                           os.environ.get("PYTHONPATH", "")]))
    try:
        done = subprocess.run([sys.executable, "-c", script, str(path)], env=env,
                              capture_output=True, text=True, timeout=600)
    finally:
        path.unlink(missing_ok=True)
    assert done.returncode == 0, done.stderr[-3000:]
    other = json.loads(done.stdout.strip().splitlines()[-1])
    assert other["isa"] == "avx2"
    for name, raw, x in cases:
        m = int_dots.IntDotMatrix.from_raw(raw, QT[name])
        assert other[name] == m(x).tobytes().hex(), \
            f"{name}: AVX2 ({other['isa']}) and {simd.isa()} differ"
        # exactly a block of rows: AVX2 takes its block kernel (by halves) for every type
        assert other[name + "/block"] == m(x[:simd.BLOCK]).tobytes().hex(), \
            f"{name}, {simd.BLOCK} rows: AVX2 ({other['isa']}) and {simd.isa()} differ"


def test_isa_reads_the_features_numba_compiles_for():
    """The instruction set follows numba's target, not the host's, so a named CPU is honoured."""
    script = "from s2core_numpy import simd; print(simd.isa())"
    env = dict(os.environ, NUMBA_CPU_NAME="x86-64", NUMBA_CPU_FEATURES="+sse2,+sse4.2",
               PYTHONPATH=os.pathsep.join([str(ROOT / "backends"), str(ROOT)]))
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == ""


def test_types_and_shapes_the_kernels_do_not_take_stay_on_the_float_path():
    assert not int_dots.supported(QT.Q4_0, (16, 256))
    assert not int_dots.supported(QT.Q4_K, (16, 64 * 3))  # not whole 256-input blocks
    assert not int_dots.supported(QT.F16, (16, 256))


@needs_integer_kernels
@pytest.mark.parametrize("dot_type,block", [("q8_0", 32), ("q8_k", 256)])
def test_integer_codes_are_the_rounded_activation(dot_type, block):
    """act_quant.quantize's codes times d are exactly act_quant.snap's values (the rounding
    the kit checks against the transcription), the sums are the codes' sums, and the peak of
    Q8_K is the first of largest magnitude (a tie of opposite signs)."""
    from s2core_numpy import act_quant
    rng = np.random.default_rng(5)
    x = rng.standard_normal((3, 1024)).astype(np.float32)
    x[0, :block] = 0  # a zero block
    x[1, 10], x[1, 20] = -9.0, 9.0  # equal magnitudes: the first (negative) is the peak
    x[2, ::7] = np.float32(0.5) * np.round(x[2, ::7] * 8)  # many exact halves: ties to even
    codes, d, sums = act_quant.quantize(dot_type, x)
    values = codes.reshape(3, -1, block).astype(np.float32) * d[..., None]
    assert np.array_equal(values.reshape(3, -1), act_quant.snap(dot_type, x))
    assert np.array_equal(sums, codes.reshape(3, -1, 16).astype(np.int64).sum(-1))
    if dot_type == "q8_k":
        assert codes[1, 10] == -127 and codes[1, 20] == 127  # iscale = -127 / the first peak


@needs_integer_kernels
def test_a_q4_k_m_load_holds_its_k_quants_as_integer_matrices_of_the_files_bytes():
    """The default arithmetic on this CPU is "ggml", and every Q4_K and Q6_K matrix of a
    q4_k_m file is held by the integer kernels, in the file's bytes (rows padded to 16)."""
    import s2core
    from s2core.kit import kit_model
    from s2core.modelfile.file import ModelFile
    path = kit_model("mha-k", "q4_k_m")
    mf = ModelFile(path)
    with s2core.load(path, backend="numpy") as m:
        assert m.capabilities.arithmetic == "ggml"
        b = m.backend
        named = {"embeddings.weight": b.embeddings, "fast_output.weight": b.fast.output}
        for i, blk in enumerate(b.layers):
            named[f"layers.{i}.attention.wqkv.weight"] = blk.wqkv
            named[f"layers.{i}.feed_forward.w2.weight"] = blk.w2
        types = set()
        for name, w in named.items():
            info = mf.info(name)
            assert isinstance(w, int_dots.IntDotMatrix), name
            assert w.qtype == info.type and w.shape == tuple(info.shape), name
            assert w.nbytes == -(-info.shape[0] // 16) * 16 * info.n_bytes // info.shape[0]
            types.add(w.qtype)
        assert types == {QT.Q4_K, QT.Q6_K}
    mf.close()


@needs_integer_kernels
@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")  # gguf's inf * 0
def test_a_non_finite_scale_is_widened_and_said_under_ggml(tmp_path):
    """A Q4_K tensor with an infinite scale is not packed for the integer kernels: widened as
    gguf decodes it, said, and still multiplied with ggml's activation rounding."""
    import s2core
    from s2core.embedded.writer import write_model
    from s2core.kit.models import CONFIGS
    from s2core.plugin import NonFiniteScalesWarning
    from s2core_numpy.act_quant import ActivationRounded
    path = write_model(tmp_path / "inf.gguf", CONFIGS["mha-k"], "q4_k", seed=7).path
    r = gguf.GGUFReader(path, "r+")
    t = next(t for t in r.tensors if t.name == "layers.0.attention.wo.weight")
    t.data.reshape(t.data.shape[0], -1, 144)[0, 0, 0:2] = np.array([np.inf], np.float16).view(
        np.uint8)
    del r
    with pytest.warns(NonFiniteScalesWarning, match="layers.0.attention.wo.weight"):
        m = s2core.load(path, backend="numpy", arithmetic="ggml")
    wo = m.backend.layers[0].wo
    from s2core_numpy.f32_rows import F32Matrix
    assert isinstance(wo, ActivationRounded) and isinstance(wo.weight, F32Matrix)
    assert isinstance(m.backend.layers[0].wqkv, int_dots.IntDotMatrix)
    m.close()


def test_default_arithmetic_follows_the_instruction_set_numba_compiles_for(monkeypatch):
    """"ggml" by default only where the integer kernels run: the features named to numba win
    over the host's, and its generic target has none."""
    from s2core_numpy import plugin
    monkeypatch.setenv("NUMBA_CPU_FEATURES", "+sse2,+sse4.2")
    assert plugin.default_arithmetic() == "f32"
    monkeypatch.setenv("NUMBA_CPU_FEATURES", "+avx,+avx2,+fma")  # no F16C (simd.isa)
    assert plugin.default_arithmetic() == "f32"
    monkeypatch.setenv("NUMBA_CPU_FEATURES", "+avx,+avx2,+fma,+f16c")
    assert plugin.default_arithmetic() == "ggml"
    monkeypatch.setenv("NUMBA_CPU_FEATURES", "+avx512f,+avx512bw,+avx512vnni")
    assert plugin.default_arithmetic() == "ggml"
    assert plugin.default_arithmetic(f16_share=0.5) == "ggml"
    assert plugin.default_arithmetic(f16_share=0.9) == "f32"  # an F16 file's products
    monkeypatch.delenv("NUMBA_CPU_FEATURES")
    monkeypatch.setenv("NUMBA_CPU_NAME", "generic")
    assert plugin.default_arithmetic() == "f32"
    monkeypatch.setattr(plugin, "numba_available", lambda: False)
    monkeypatch.delenv("NUMBA_CPU_NAME")
    assert plugin.default_arithmetic() == "f32"



@needs_integer_kernels
@pytest.mark.parametrize("weight_type,expected", [
    ("q4_k_m", "ggml"), ("q8_0", "ggml"), ("q4_0", "ggml"), ("f32", "ggml"), ("f16", "f32")])
def test_the_default_arithmetic_is_ggml_except_for_f16_files(weight_type, expected):
    """"ggml" by default where the integer kernels run, except for files of mostly F16
    matrices (ggml's order of float sums, slower there than the tiled kernels); either is
    there by name, and a named one is what the model computes with."""
    import s2core
    from s2core.kit import kit_model
    from s2core_numpy import plugin
    path = kit_model("mha-k", weight_type)
    with s2core.load(path, backend="numpy") as m:
        assert m.capabilities.arithmetic == expected
    other = {"ggml": "f32", "f32": "ggml"}[expected]
    with s2core.load(path, backend="numpy", arithmetic=other) as m:
        assert m.capabilities.arithmetic == other
        # F16 rows are used in place only under "ggml"; the probe states an f16 file's
        # default load, which copies them
        assert ("f16" in m.capabilities.mapped_weight_types) == (other == "ggml")
    assert "f16" not in plugin.numpy_capabilities(numba_kernels=True).mapped_weight_types
