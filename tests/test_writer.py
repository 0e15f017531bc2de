"""The test-model writer produces files in exactly s2.cpp's layout."""

from __future__ import annotations

import json
from dataclasses import replace

import gguf
import numpy as np
import pytest

from conftest import S2CPP_VECTOR
from s2core import ModelFile
from s2core.modelfile.layout import expected_tensors
from s2core.embedded.writer import (WEIGHT_TYPES, s2pro_hparams, tensor_type, tiny_hparams,
                                   write_model)


def test_same_tensors_shapes_and_keys_as_the_s2cpp_oracle_file(tmp_path):
    ours = gguf.GGUFReader(write_model(tmp_path / "t.gguf", tiny_hparams(), "f32").path)
    oracle = gguf.GGUFReader(S2CPP_VECTOR / "tiny_f32.gguf")
    facts = json.loads((S2CPP_VECTOR / "s2cpp_facts.json").read_text())["tensors"]
    ours_t = {t.name: t for t in ours.tensors}
    assert sorted(ours_t) == sorted(t.name for t in oracle.tensors) == sorted(facts)
    for name, fact in facts.items():
        ne = [int(d) for d in ours_t[name].shape] + [1] * (4 - len(ours_t[name].shape))
        assert ne == fact["ne"], name
        assert ours_t[name].tensor_type.name.lower() == fact["type"]
    skip = ("GGUF.", "general.name", "oracle.")
    keys = lambda r: {k for k in r.fields if not k.startswith(skip)}  # noqa: E731
    assert keys(ours) == keys(oracle)
    for key in keys(oracle):
        assert ours.fields[key].contents() == pytest.approx(oracle.fields[key].contents()), key


@pytest.mark.parametrize("weight_type", sorted(WEIGHT_TYPES))
def test_every_weight_type_reads_back_close_to_the_f32_weights(tmp_path, weight_type):
    hp = replace(tiny_hparams(), dim=256, ffn=256, n_head=4, head_dim=64, n_head_kv=2)
    hp = replace(hp, fast=replace(hp.fast, dim=256, ffn=256, head_dim=64))
    exact = ModelFile(write_model(tmp_path / "f32.gguf", hp, "f32", seed=5).path)
    other = ModelFile(write_model(tmp_path / f"{weight_type}.gguf", hp, weight_type, seed=5).path)
    bound = {"f32": 0, "f16": 1e-3, "bf16": 8e-3, "q8_0": 1e-2, "q6_k": 3e-2, "q5_0": 5e-2,
             "q5_1": 5e-2, "q5_k": 5e-2, "q4_0": 0.1, "q4_1": 0.1, "q4_k": 0.1, "q3_k": 0.2,
             "q2_k": 0.4}[weight_type]
    name = "layers.0.feed_forward.w1.weight"
    assert other.info(name).type_name == weight_type
    assert other.info("layers.0.attention_norm.weight").type_name == "f32"  # norms stay F32
    a, b = exact.dequantize(name), other.dequantize(name)
    assert np.linalg.norm(b - a) / np.linalg.norm(a) <= bound


def test_rows_that_are_not_whole_blocks_fall_back_like_llama_cpp():
    assert tensor_type("x.weight", (8, 256), "q4_k").name == "Q4_K"
    assert tensor_type("x.weight", (8, 96), "q4_k").name == "Q8_0"   # 96 = 3 blocks of 32
    assert tensor_type("x.weight", (8, 48), "q4_k").name == "F16"
    assert tensor_type("x.weight", (8, 48), "q8_0").name == "F16"
    assert tensor_type("layers.0.ffn_norm.weight", (256,), "q8_0").name == "F32"


def test_codec_tensors_are_written_and_ignored(tmp_path):
    mf = ModelFile(write_model(tmp_path / "c.gguf", tiny_hparams(), "f16", include_codec=True).path)
    assert mf.codec_tensor_names == ["c.encoder.conv.weight", "c.quantizer.codebook"]
    assert set(mf.extra_tensor_names) == set(mf.codec_tensor_names)
    assert "fish_speech.codec.sample_rate" in mf.metadata
    assert all(not t.name.startswith("c.") for t in mf.model_tensors())


def test_s2pro_dimensions_match_the_spec():
    hp = s2pro_hparams()
    t = expected_tensors(hp)
    assert t["layers.0.attention.wqkv.weight"] == ((32 + 2 * 8) * 128, 2560)
    assert t["layers.35.attention.wo.weight"] == (2560, 4096)
    assert t["layers.0.feed_forward.w2.weight"] == (2560, 9728)
    assert t["codebook_embeddings.weight"] == (10 * 4096, 2560)
    assert t["embeddings.weight"] == (155776, 2560)
    assert (hp.q_size, hp.kv_size) == (4096, 1024)
    assert "fast_project_in.weight" not in t and t["fast_output.weight"] == (4096, 2560)
    assert sum(1 for n in t if n.startswith("layers.")) == 36 * 9


def test_same_seed_same_bytes_and_a_crash_leaves_no_partial_file(tmp_path):
    a = write_model(tmp_path / "a.gguf", tiny_hparams(), "q8_0", seed=1).path
    b = write_model(tmp_path / "b.gguf", tiny_hparams(), "q8_0", seed=1).path
    assert a.read_bytes() == b.read_bytes()

    def boom(done, total):
        if done == 3:
            raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        write_model(tmp_path / "c.gguf", tiny_hparams(), "f16", progress=boom)
    assert not (tmp_path / "c.gguf").exists()


@pytest.mark.parametrize("weight_type,base", [("q4_k_m", "q4_k"), ("q5_k_m", "q5_k")])
def test_mixed_files_give_some_tensors_more_bits_like_llama_cpp(tmp_path, weight_type, base):
    """s2-pro-q4_k_m.gguf's recipe: the tied table and some layers' w2 in Q6_K, the rest in
    the base type; general.file_type says which recipe."""
    hp = replace(tiny_hparams(), dim=256, ffn=256, n_head=4, head_dim=64, n_head_kv=2,
                 n_layer=8)
    hp = replace(hp, fast=replace(hp.fast, dim=256, ffn=256, head_dim=64))
    written = write_model(tmp_path / f"{weight_type}.gguf", hp, weight_type, seed=5)
    types = written.tensor_types
    assert types["embeddings.weight"] == "q6_k"
    more = [i for i in range(8) if types[f"layers.{i}.feed_forward.w2.weight"] == "q6_k"]
    assert more == [0, 3, 6, 7]  # first and last eighth, every third in between
    assert {types[f"layers.{i}.feed_forward.w1.weight"] for i in range(8)} == {base}
    assert types["fast_layers.0.feed_forward.w2.weight"] == base
    mf = ModelFile(written.path)
    assert {t.type_name for t in mf.model_tensors()} == {"f32", base, "q6_k"}
    assert int(mf.metadata["general.file_type"]) == int(
        {"q4_k_m": gguf.LlamaFileType.MOSTLY_Q4_K_M, "q5_k_m": gguf.LlamaFileType.MOSTLY_Q5_K_M}[
            weight_type])


def test_random_blocks_write_an_s2pro_sized_layer_fast(tmp_path):
    """Timing files: random valid blocks of every quantized tensor, finite weights of order
    1e-2, written without the K-quant quantizer."""
    hp = replace(tiny_hparams(), dim=256, ffn=512, n_head=4, head_dim=64, n_head_kv=2)
    hp = replace(hp, fast=replace(hp.fast, dim=256, ffn=512, head_dim=64))
    mf = ModelFile(write_model(tmp_path / "r.gguf", hp, "q4_k_m", random_blocks=True).path)
    w = mf.dequantize("layers.1.feed_forward.w2.weight")
    assert mf.info("layers.1.feed_forward.w2.weight").type_name == "q6_k"
    assert np.isfinite(w).all() and 1e-3 < float(np.abs(w).max()) < 1.0
