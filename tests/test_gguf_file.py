"""Loading: every way a model file can be wrong gives a ModelFileError that says how."""

from __future__ import annotations

import warnings
from dataclasses import replace

import gguf
import numpy as np
import pytest

from s2core import ModelFile, ModelFileError
from s2core.modelfile.hparams import GGUFKeyWarning
from s2core.modelfile.layout import expected_tensors
from s2core.embedded.writer import _add_metadata, random_weight, tiny_hparams, write_model


def write_custom(path, hp, tensors: dict, skip_keys=(), arch=None):
    """A GGUF with hp's metadata (minus skip_keys) and the given tensors (name -> array or
    (array, raw type))."""
    w = gguf.GGUFWriter(path, arch=arch or hp.architecture)
    _add_metadata(w, hp, "f32", "custom", include_codec=False)
    for key in skip_keys:
        w.kv_data[0].pop(key)
    for name, value in tensors.items():
        if isinstance(value, tuple):
            w.add_tensor(name, value[0], raw_dtype=value[1])
        else:
            w.add_tensor(name, value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def full_tensors(hp, seed=0):
    return {n: random_weight(n, s, seed) for n, s in expected_tensors(hp).items()}


def test_missing_file_and_not_gguf(tmp_path):
    with pytest.raises(ModelFileError, match="not found"):
        ModelFile(tmp_path / "nope.gguf")
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"definitely not a gguf file" * 10)
    with pytest.raises(ModelFileError, match="is not a GGUF file"):
        ModelFile(junk)


def test_missing_tensor_is_named(tmp_path):
    hp = tiny_hparams()
    t = full_tensors(hp)
    del t["layers.1.feed_forward.w2.weight"]
    with pytest.raises(ModelFileError, match=r"missing tensor layers\.1\.feed_forward\.w2\.weight"):
        ModelFile(write_custom(tmp_path / "m.gguf", hp, t))


def test_wrong_shape_names_both_orders(tmp_path):
    hp = tiny_hparams()
    t = full_tensors(hp)
    t["layers.0.attention.wo.weight"] = t["layers.0.attention.wo.weight"].T.copy()  # transposed
    with pytest.raises(ModelFileError, match=r"wo\.weight has shape \(128, 64\).*expected \(64, 128\)"):
        ModelFile(write_custom(tmp_path / "m.gguf", hp, t))


def test_unsupported_type_is_named(tmp_path):
    hp = tiny_hparams()
    t = full_tensors(hp)
    t["norm.weight"] = t["norm.weight"].astype(np.float64)
    with pytest.raises(ModelFileError, match="norm.weight has type F64"):
        ModelFile(write_custom(tmp_path / "m.gguf", hp, t))


def test_missing_key_warns_and_uses_the_s2pro_default(tmp_path):
    hp = tiny_hparams()
    path = write_custom(tmp_path / "m.gguf", hp, full_tensors(hp),
                        skip_keys=["fish-speech.rope.freq_base", "fish_speech.fast_rope_freq_base"])
    with pytest.warns(GGUFKeyWarning) as record:
        mf = ModelFile(path)
    messages = " ".join(str(r.message) for r in record)
    assert "fish-speech.rope.freq_base" in messages and "fast_rope_freq_base" in messages
    assert mf.hparams.rope_freq_base == 1e6 and mf.hparams.fast.rope_freq_base == 1e6


def test_complete_file_loads_without_warnings(tiny_model):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ModelFile(tiny_model)


def test_head_dim_comes_from_q_norm_or_wo_never_dim_over_heads(tmp_path):
    with_qk = tiny_hparams()  # dim 64, 4 heads, head_dim 32 (not 16)
    assert ModelFile(write_model(tmp_path / "a.gguf", with_qk).path).hparams.head_dim == 32
    no_qk = replace(tiny_hparams(), attention_qk_norm=False, head_dim=24)
    assert ModelFile(write_model(tmp_path / "b.gguf", no_qk).path).hparams.head_dim == 24


def test_fast_head_dim_key_must_agree_with_tensors(tmp_path):
    hp = tiny_hparams()
    t = full_tensors(hp)
    path = tmp_path / "m.gguf"
    w = gguf.GGUFWriter(path, arch=hp.architecture)
    _add_metadata(w, hp, "f32", "custom", include_codec=False)
    w.kv_data[0]["fish_speech.fast_head_dim"].value = 16
    for name, value in t.items():
        w.add_tensor(name, value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ModelFileError, match="fast_head_dim: key says 16 but .* imply 32"):
        ModelFile(path)


def test_inconsistent_heads_are_rejected(tmp_path):
    hp = tiny_hparams()
    path = write_custom(tmp_path / "m.gguf", hp, full_tensors(hp))
    # Rewrite the kv head count to 3, which does not divide 4 query heads.
    w = gguf.GGUFWriter(tmp_path / "n.gguf", arch=hp.architecture)
    _add_metadata(w, replace(hp, n_head_kv=3), "f32", "custom", include_codec=False)
    for t in gguf.GGUFReader(path).tensors:
        w.add_tensor(t.name, np.asarray(t.data))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ModelFileError):
        ModelFile(tmp_path / "n.gguf")


@pytest.mark.parametrize("weight_type", ["f32", "f16", "bf16", "q8_0", "q4_k"])
def test_dequantize_rows_equals_rows_of_the_whole_table(tmp_path, weight_type):
    hp = replace(tiny_hparams(), dim=256, ffn=256, head_dim=64, fast=replace(tiny_hparams().fast, dim=256, ffn=256))
    mf = ModelFile(write_model(tmp_path / "m.gguf", hp, weight_type).path)
    rows = np.array([3, 0, 300, 3, 17])
    whole = mf.dequantize("codebook_embeddings.weight")
    np.testing.assert_array_equal(mf.dequantize_rows("codebook_embeddings.weight", rows), whole[rows])
    assert mf.info("codebook_embeddings.weight").type_name == weight_type


def test_bf16_raw_is_the_bit_pattern(tmp_path):
    mf = ModelFile(write_model(tmp_path / "m.gguf", tiny_hparams(), "bf16").path)
    raw = mf.raw("embeddings.weight")
    assert raw.dtype == np.uint16 and raw.shape == (200, 64)
    as_f32 = (raw.astype(np.uint32) << 16).view(np.float32)
    np.testing.assert_array_equal(as_f32, mf.dequantize("embeddings.weight"))


def test_typed_metadata_access(tmp_path):
    """GGUFFile.get refuses a stored type other than the one asked for, never converts."""
    from gguf import GGUFValueType as VT
    from s2core.modelfile.file import GGUFFile
    path = tmp_path / "typed.gguf"
    w = gguf.GGUFWriter(path, arch="fish-speech")
    w.add_uint32("a.count", 36)
    w.add_float32("a.ratio", 64.9)
    w.add_uint32("a.base", 10000)
    w.add_bool("a.flag", False)
    w.add_string("a.text", "false")
    w.add_array("a.names", ["x", "yz"])
    w.add_tensor("t", np.zeros((2, 32), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    f = GGUFFile(path)
    assert f.get("a.count", int) == 36 and f.get("a.flag", bool) is False
    assert f.get("a.base", float) == 10000.0  # integers are exact floats
    assert f.get("a.text", str) == "false" and f.get("a.missing", int, 7) == 7
    assert f.get_array("a.names", str) == ["x", "yz"]
    assert f.value_type("a.ratio").type == VT.FLOAT32
    for key, kind, check in [("a.ratio", int, "metadata_type"), ("a.text", bool, "metadata_type"),
                             ("a.flag", int, "metadata_type"), ("a.names", str, "metadata_type"),
                             ("a.missing", int, "missing_key")]:
        with pytest.raises(ModelFileError) as info:
            f.get(key, kind)
        assert info.value.check == check, key
    assert f.tensors["t"].shape == (2, 32) and f.tensor_data("t").flags.writeable is False
    f.close()
