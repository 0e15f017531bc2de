"""What the MLX backend holds after load: the scale types it chose, still bit-exact against
gguf's dequantization, no more bytes than the file for the legacy quants, and none of the
file's pages left mapped in beside its copies."""

from __future__ import annotations

import mmap
import re
import sys
from pathlib import Path

import numpy as np
import pytest

import s2core
from s2core.plugin import ModelFile
from s2core.kit.conformance import prompt_and_frames
from s2core.kit.models import kit_model
from s2core.kit import tiny_hparams, write_model

mx = pytest.importorskip("mlx.core", reason="mlx is not installed (pip install 'mlx[cpu]')")

from s2core_mlx.weights import DenseMatrix, QuantizedMatrix, storage_bytes  # noqa: E402

LEGACY = ["q8_0", "q4_0", "q4_1", "q5_0", "q5_1"]
#: bias = factor * scale, so only the scales are held (f16 mode)
DERIVED_BIAS = {"q8_0": -128.0, "q4_0": -8.0, "q5_0": -16.0}
K_QUANTS = ["q4_k", "q5_k"]
BLOCK_PARTS = ("attention.wqkv", "attention.wo", "feed_forward.w1", "feed_forward.w3",
               "feed_forward.w2")


def named_matrices(backend) -> dict:
    """Every matrix the backend holds, by its GGUF tensor name."""
    slow, fast = backend.slow, backend.fast
    out = {"embeddings.weight": slow.embeddings, "codebook_embeddings.weight": slow.codebooks}
    for prefix, layers in (("layers", slow.layers), ("fast_layers", fast.layers)):
        for i, blk in enumerate(layers):
            for part, attr in zip(BLOCK_PARTS, ("wqkv", "wo", "w1", "w3", "w2")):
                out[f"{prefix}.{i}.{part}.weight"] = getattr(blk, attr)
    out["fast_embeddings.weight"] = fast.embeddings
    out["fast_output.weight"] = fast.output
    if fast.project_in is not None:
        out["fast_project_in.weight"] = fast.project_in
    return out


def held_values(mat) -> np.ndarray:
    """The matrix as float32 numpy, decoded by MLX through the backend's own lookup path."""
    rows = mat.packed.shape[0] if isinstance(mat, QuantizedMatrix) else mat.w.shape[0]
    return np.array(mat.rows(mx.arange(rows)))


# ---------------------------------------------------------------------- scale types
@pytest.mark.parametrize("weight_type", LEGACY + K_QUANTS)
def test_scale_types_by_mode(weight_type):
    with s2core.load(kit_model("mha-k", weight_type), backend="mlx") as m16, \
            s2core.load(kit_model("mha-k", weight_type), backend="mlx",
                        quant_scale_dtype="f32") as m32:
        for name, mat in named_matrices(m16.backend).items():
            assert isinstance(mat, QuantizedMatrix), name
            if weight_type in K_QUANTS:  # d*sc is not exact in float16
                assert mat.scales.dtype == mat.biases.dtype == mx.float32, name
            elif weight_type in DERIVED_BIAS:
                assert mat.scales.dtype == mx.float16 and mat.biases is None, name
                assert mat.bias_factor == DERIVED_BIAS[weight_type]
            else:  # Q4_1, Q5_1: m is stored
                assert mat.scales.dtype == mat.biases.dtype == mx.float16, name
        for name, mat in named_matrices(m32.backend).items():
            assert mat.scales.dtype == mat.biases.dtype == mx.float32, name


@pytest.mark.parametrize("weight_type", LEGACY + K_QUANTS)
def test_held_weights_equal_gguf_dequantization(weight_type):
    """Bit for bit, whatever scale type was chosen (and with rebuilt biases)."""
    for options in ({}, {"quant_scale_dtype": "f32"}):
        with s2core.load(kit_model("mha-k", weight_type), backend="mlx", **options) as m:
            for name, mat in named_matrices(m.backend).items():
                np.testing.assert_array_equal(held_values(mat), m.model_file.dequantize(name),
                                              err_msg=f"{name} {options}")


@pytest.mark.parametrize("config,weight_type", [("gqa4", "q8_0"), ("gqa4", "q4_0"),
                                                ("gqa2-noqk", "q5_1"), ("mha-k", "q5_0"),
                                                ("mha-k", "q4_1")])
def test_float16_scales_compute_the_same_numbers(config, weight_type):
    """The products widen float16 scales exactly, so every output is identical to float32
    scales': prefill, steps and the Fast-AR."""
    prompt, frames = prompt_and_frames(config)
    outs = []
    for scale in ("f16", "f32"):
        with s2core.load(kit_model(config, weight_type), backend="mlx",
                         quant_scale_dtype=scale) as m:
            m.init_kv_cache(64)
            r = m.prefill(prompt)
            got = [r.logits, r.hidden, m.step(frames[0]).logits]
            got += [m.fast_decode(r.hidden, [1, 2, 3][:n]) for n in range(3)]
            outs.append(got)
    for a, b in zip(*outs):
        np.testing.assert_array_equal(a, b)


def test_bad_scale_dtype_is_rejected():
    with pytest.raises(s2core.InvalidInputError) as info:
        s2core.load(kit_model("gqa4", "q8_0"), backend="mlx", quant_scale_dtype="bf16")
    assert info.value.check == "quant_scale_dtype"


# ---------------------------------------------------------------------- memory
@pytest.mark.parametrize("weight_type", LEGACY)
def test_legacy_quants_hold_exactly_the_file_bytes(weight_type):
    """f16 mode: packed values + float16 d (+ m): the file's own size, tensor by tensor.
    f32 mode: 2 bits a weight more (Q8_0 10 bits against 8.5)."""
    with s2core.load(kit_model("mha-k", weight_type), backend="mlx") as m16, \
            s2core.load(kit_model("mha-k", weight_type), backend="mlx",
                        quant_scale_dtype="f32") as m32:
        for name, mat in named_matrices(m16.backend).items():
            info = m16.model_file.info(name)
            assert storage_bytes(mat) == info.n_bytes, name
            bits = mat.bits
            assert storage_bytes(named_matrices(m32.backend)[name]) * 8 == \
                info.n_elements * (bits + 2), name


@pytest.mark.parametrize("weight_type,file_bits,held_bits", [("q4_k", 4.5, 6), ("q5_k", 5.5, 7)])
def test_k_quants_hold_float32_scales(weight_type, file_bits, held_bits):
    with s2core.load(kit_model("mha-k", weight_type), backend="mlx") as m:
        for name, mat in named_matrices(m.backend).items():
            info = m.model_file.info(name)
            assert info.n_bytes * 8 == info.n_elements * file_bits
            assert storage_bytes(mat) * 8 == info.n_elements * held_bits, name


def test_every_tensor_is_released_after_its_copy(monkeypatch):
    released = []
    original = ModelFile.release
    monkeypatch.setattr(ModelFile, "release",
                        lambda self, name: (released.append(name), original(self, name))[1])
    for weight_type in ("f32", "f16", "bf16", "q8_0", "q6_k"):
        config = "mha-k" if weight_type == "q6_k" else "gqa4"
        released.clear()
        with s2core.load(kit_model(config, weight_type), backend="mlx") as m:
            used = {t.name for t in m.model_file.model_tensors()}
            assert used <= set(released), (weight_type, used - set(released))


def _mapped_rss(path: Path) -> int:
    """Resident bytes of this process's mappings of `path` (Linux /proc/self/smaps)."""
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        if re.match(r"^[0-9a-f]+-[0-9a-f]+ ", line):
            inside = line.endswith(str(path))
        elif inside and line.startswith("Rss:"):
            total += int(line.split()[1]) * 1024
    return total


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/smaps")
@pytest.mark.parametrize("weight_type", ["f32", "f16", "q8_0"])
def test_file_pages_are_not_held_after_load(tmp_path, weight_type):
    """Copying every tensor faults the whole file in; after load only the pages that straddle
    tensor boundaries (and the header) may remain."""
    hp = tiny_hparams(vocab_size=40000)  # a 2.5-10 MB table: the file is mostly whole pages
    path = write_model(tmp_path / f"big-{weight_type}.gguf", hp, weight_type).path
    with s2core.load(path, backend="mlx") as m:
        size = Path(path).stat().st_size
        assert m.model_file.weight_bytes > 0.9 * size
        mapped = _mapped_rss(Path(path).resolve())
        # at most the two partial pages at each tensor's ends, and the header's
        n_tensors = len(list(m.model_file.model_tensors()))
        allowed = 2 * mmap.PAGESIZE * (n_tensors + 1)
        assert mapped <= allowed < 0.2 * size, f"{mapped} of {size} bytes still resident"
        # Still correct: nothing read after load needs the released pages.
        m.init_kv_cache(8)
        assert np.isfinite(m.prefill(prompt_and_frames("gqa4")[0][:4]).logits).all()


def test_dense_types_are_dense():
    with s2core.load(kit_model("gqa4", "f16"), backend="mlx") as m:
        assert all(isinstance(x, DenseMatrix) for x in named_matrices(m.backend).values())
