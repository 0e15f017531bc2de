"""The codec's core: keys, layout, file checks, the writer, selection and registration.

Files here are real GGUFs written with the `gguf` package in s2.cpp's layout; the variants
(a dropped tensor, a wrong shape, a missing key) are written the same way with one change.
"""

from __future__ import annotations

import textwrap
from dataclasses import replace

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

import s2core
from s2core.codec import CodecFile
from s2core.codec.hparams import CodecHparams
from s2core.runtime.codec_selection import choose_codec_backend
from s2core.embedded.codec_writer import (CODEC_ONLY_ARCH, FULL_ARCH, add_codec_metadata,
                                          codec_plan, codec_tensor_values, s2pro_codec_config,
                                          tiny_codec_config, write_codec, write_tensors)
from s2core.embedded.writer import tiny_hparams, write_model
from s2core.errors import BackendUnavailableError, InvalidInputError, ModelFileError
from s2core.kit.codec_models import example_codes_audio, example_path
from s2core.contract.registry import BackendInfo, Registry


def write_variant(path, config=None, weight_type="f16", arch=CODEC_ONLY_ARCH, drop=(),
                  reshape=None, retype=None, drop_keys=(), extra_keys=None):
    """A codec file like write_codec's with one change: tensors dropped, one tensor's shape
    or type changed, keys dropped or overridden."""
    config = config or tiny_codec_config()
    plan = [(n, (reshape[1] if reshape and n == reshape[0] else s),
             (retype[1] if retype and n == retype[0] else qt))
            for n, s, qt in codec_plan(config, weight_type) if n not in drop]
    w = gguf.GGUFWriter(path, arch=arch)
    scratch = gguf.GGUFWriter(None, arch=arch)  # collect keys, then copy all but the dropped
    add_codec_metadata(scratch, config)
    for shard in scratch.kv_data:
        for key, value in shard.items():
            if key.startswith("fish_speech.codec.") and key[len("fish_speech.codec."):] not in drop_keys:
                if extra_keys and key[len("fish_speech.codec."):] in extra_keys:
                    continue
                w.add_key_value(key, value.value, value.type, sub_type=value.sub_type)
    for key, (value, vtype) in (extra_keys or {}).items():
        w.add_key_value("fish_speech.codec." + key, value, vtype)
    values = codec_tensor_values(config, seed=0)
    write_tensors(w, plan, values)
    w.close()
    return path


# ---------------------------------------------------------------------- writer and layout
def test_s2pro_structure_has_the_real_parameter_count():
    cfg = s2pro_codec_config()
    assert cfg.n_params == 391_398_385  # CODEC.md 3
    hp = cfg.hparams
    assert (hp.samples_per_frame, hp.num_codebooks, hp.streaming_history_frames) == (2048, 10, 144)
    assert hp.codebook_sizes == (4096,) + (1024,) * 9


def test_writer_matches_the_shared_example_layout_and_key_types(tmp_path):
    """Our tiny config written by our writer has the shared example's tensors and key types."""
    ours = write_codec(tmp_path / "c.gguf", tiny_codec_config(), "f16", codec_only=False)
    theirs = gguf.GGUFReader(example_path())
    mine = gguf.GGUFReader(ours.path)
    shapes = lambda r: {t.name: (t.tensor_type, tuple(t.shape.tolist())) for t in r.tensors}
    assert shapes(mine) == shapes(theirs)
    assert [t.name for t in mine.tensors] == sorted(t.name for t in mine.tensors)
    types = lambda r: {k: tuple(f.types) for k, f in r.fields.items() if k.startswith("fish_speech.codec.")}
    assert types(mine) == types(theirs)
    assert mine.fields["general.architecture"].contents() == FULL_ARCH


def test_f32_and_codec_only_files(tmp_path):
    w = write_codec(tmp_path / "c.gguf", tiny_codec_config(), "f32", codec_only=True)
    r = gguf.GGUFReader(w.path)
    assert r.fields["general.architecture"].contents() == CODEC_ONLY_ARCH
    assert {t.tensor_type for t in r.tensors} == {QT.F32}
    assert not any(t.name.startswith("c.") for t in r.tensors)
    f = CodecFile(w.path)
    assert f.prefix == "" and f.type_name("decoder.model.0.conv.weight") == "f32"


# ---------------------------------------------------------------------- file checks
def test_reads_the_shared_example():
    f = CodecFile(example_path())
    hp = f.hparams
    assert f.prefix == "c." and f.can_encode
    assert (hp.sample_rate, hp.samples_per_frame, hp.num_codebooks) == (44100, 32, 10)
    assert f.layout.quantizer.post_module.n_layers == 2
    assert f.layout.encoder.blocks[1].transformer.n_layers == 1
    assert f.layout.encoder.blocks[0].transformer is None


def test_wrong_architecture(tmp_path):
    path = write_variant(tmp_path / "x.gguf", arch="llama")
    with pytest.raises(ModelFileError, match="'llama'.*fish-speech"):
        CodecFile(path)


@pytest.mark.parametrize("key", ["hop_length", "encoder_rates", "rvq_transformer.window_size",
                                 "transformer.head_dim", "quantizer_semantic_codebook_size"])
def test_missing_required_key(tmp_path, key):
    path = write_variant(tmp_path / "x.gguf", drop_keys=(key,))
    with pytest.raises(ModelFileError, match=f"fish_speech.codec.{key} is missing"):
        CodecFile(path)


def test_optional_keys_may_be_absent(tmp_path):
    path = write_variant(tmp_path / "x.gguf", drop_keys=("frame_length", "quantizer_type",
                                                         "decoder_transformer_layers",
                                                         "rvq_transformer.n_head",
                                                         "rvq_transformer.feed_forward_length"))
    assert CodecFile(path).hparams.frame_length == 512


def test_inconsistent_keys(tmp_path):
    cases = {"hop_length": ((7, gguf.GGUFValueType.UINT32), "hop_length = 7 but prod"),
             "latent_dim": ((48, gguf.GGUFValueType.UINT32), "latent_dim = 48 != quantizer_input_dim"),
             "rvq_transformer.head_dim": ((6, gguf.GGUFValueType.UINT32), "not a multiple of head_dim 6"),
             "rvq_transformer.n_local_heads": ((3, gguf.GGUFValueType.INT32), "do not share 3 KV heads"),
             "sample_rate": (("fast", gguf.GGUFValueType.STRING), "is not an integer")}
    for key, ((value, vtype), message) in cases.items():
        path = write_variant(tmp_path / f"{key}.gguf", extra_keys={key: (value, vtype)})
        with pytest.raises(ModelFileError, match=message):
            CodecFile(path)


def test_missing_decoder_tensor_wrong_shape_wrong_type(tmp_path):
    name = "decoder.model.1.block.3.block.1.conv.weight"
    with pytest.raises(ModelFileError, match=f"missing tensor {name}"):
        CodecFile(write_variant(tmp_path / "a.gguf", drop=(name,)))
    with pytest.raises(ModelFileError, match=r"quantizer.post_module.norm.weight has shape \[16\].*expected \[32\]"):
        CodecFile(write_variant(tmp_path / "b.gguf", reshape=("quantizer.post_module.norm.weight", (16,))))
    with pytest.raises(ModelFileError, match="codebook.weight has type Q8_0"):
        CodecFile(write_variant(tmp_path / "c.gguf", config=tiny_codec_config(codebook_dim=32),
                                retype=("quantizer.quantizer.quantizers.0.codebook.weight", QT.Q8_0)))


def test_transformer_depth_is_probed(tmp_path):
    """A post_module with layer 1 removed has one layer (as s2.cpp probes), not an error."""
    cfg = tiny_codec_config()
    layer1 = [n for n in cfg.layout().decode_tensors() if n.startswith("quantizer.post_module.layers.1.")]
    f = CodecFile(write_variant(tmp_path / "x.gguf", drop=tuple(layer1)))
    assert f.layout.quantizer.post_module.n_layers == 1
    assert f.layout.quantizer.pre_module.n_layers == 2


def test_decode_only_file_and_partial_encoder(tmp_path):
    cfg = tiny_codec_config()
    encode_only = [n for n in cfg.layout().encode_tensors() if n not in cfg.layout().decode_tensors()]
    path = write_variant(tmp_path / "dec.gguf", drop=tuple(encode_only))
    c = s2core.load_codec(path, backend="numpy")
    assert not c.can_encode
    assert c.decode(np.zeros((10, 2), np.int32)).shape == (64,)
    with pytest.raises(InvalidInputError, match="no encoder tensors") as info:
        c.encode(np.zeros(10, np.float32))
    assert info.value.check == "encode_supported"
    with pytest.raises(ModelFileError, match="missing encoder tensor encoder.block.0.conv.weight"):
        CodecFile(write_variant(tmp_path / "part.gguf", drop=("encoder.block.0.conv.weight",)))


def test_a_model_without_a_real_codec_is_refused(tmp_path):
    """The kit's Slow-AR files carry two placeholder c.* tensors and two keys."""
    path = tmp_path / "m.gguf"
    write_model(path, tiny_hparams(), "f32", include_codec=True)
    with pytest.raises(ModelFileError, match="codec key fish_speech.codec.frame_length|is missing"):
        s2core.load_codec(path, backend="numpy")
    with pytest.raises(ModelFileError, match="not found"):
        s2core.load_codec(tmp_path / "absent.gguf", backend="numpy")


def test_full_model_file_with_codec(tmp_path):
    """One file holds the Slow-AR, the Fast-AR and the codec (c.*), as released S2 Pro files."""
    path = tmp_path / "full.gguf"
    write_model(path, tiny_hparams(), "f16", codec=tiny_codec_config())
    m = s2core.load(path, backend="numpy")
    m.init_kv_cache(8)
    assert m.hparams.num_codebooks == 10
    c = s2core.load_codec(path, backend="numpy")
    assert c.codec_file.prefix == "c."
    codes, _ = example_codes_audio()
    assert c.decode(codes).shape == (160,)
    m.close()
    c.close()


# ---------------------------------------------------------------------- selection
def row(name, priority, codec=True, available=True, codec_priority=None, streaming=True,
        codec_class="m:C"):
    caps = s2core.Capabilities(codec=s2core.CodecCapabilities(priority=codec_priority,
                                                              streaming=streaming) if codec else None)
    return BackendInfo(name=name, priority=priority, available=available, reason="why",
                       capabilities=caps, source="test", codec_class=codec_class if codec else "")


def test_codec_selection_is_a_function_of_declarations():
    assert choose_codec_backend([row("a", 100), row("b", 90, codec_priority=110)]) == "b"
    assert choose_codec_backend([row("a", 100), row("b", 500, codec=False)]) == "a"
    assert choose_codec_backend([row("a", 100), row("b", 300, available=False)]) == "a"
    assert choose_codec_backend([row("a", 100, streaming=False), row("b", 100)]) == "b"
    assert choose_codec_backend([row("z", 100), row("y", 100)]) == "y"
    # declared in the probe but no class named: not a provider
    assert choose_codec_backend([row("a", 100), row("b", 200, codec_class="")]) == "a"
    with pytest.raises(BackendUnavailableError, match="no registered backend provides a codec"):
        choose_codec_backend([row("a", 100, codec=False)])
    with pytest.raises(BackendUnavailableError, match="a: why"):
        choose_codec_backend([row("a", 100, available=False)])


def test_load_codec_default_and_environment(monkeypatch):
    rows = s2core.list_backends()
    expected = choose_codec_backend(rows)
    with s2core.load_codec(example_path()) as c:
        assert c.backend_name == expected
    monkeypatch.setenv("S2CORE_CODEC_BACKEND", "numpy")
    with s2core.load_codec(example_path()) as c:
        assert c.backend_name == "numpy"


def test_registry_refuses_a_codec_class_of_the_wrong_kind(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "p_codec.py").write_text(textwrap.dedent("""
        from s2core.contract.plugin_spec import BackendSpec, Probe, hookimpl
        from s2core.contract.backend import Capabilities
        from s2core.codec import CodecCapabilities

        class NotACodec:
            pass

        def probe():
            return Probe(True, "ok", Capabilities(codec=CodecCapabilities()))

        def no_codec():
            return Probe(True, "ok", Capabilities())

        @hookimpl
        def s2core_backends():
            return [BackendSpec(name="bad", backend_class="s2core_numpy.backend:NumpyBackend",
                                probe=probe, codec_class="p_codec:NotACodec"),
                    BackendSpec(name="none", backend_class="s2core_numpy.backend:NumpyBackend",
                                probe=no_codec)]
        """))
    reg = Registry(["p_codec"], entry_point_group=None)
    with pytest.raises(BackendUnavailableError, match="not a subclass of s2core.codec.CodecBackend"):
        reg.codec_class("bad")
    with pytest.raises(BackendUnavailableError, match="provides no codec"):
        reg.codec_class("none")
    assert reg.info("bad").as_dict()["capabilities"]["codec"]["streaming"] is True


def test_stream_mode_and_history_checks():
    with s2core.load_codec(example_path(), backend="numpy") as c:
        for kwargs, check in (({"mode": "fast"}, "stream_mode"), ({"history_frames": -1}, "history_frames"),
                              ({"history_frames": 2.5}, "history_frames")):
            with pytest.raises(InvalidInputError) as info:
                c.stream_decoder(**kwargs)
            assert info.value.check == check


def test_hparams_are_frozen_values():
    hp = CodecFile(example_path()).hparams
    assert isinstance(hp, CodecHparams)
    with pytest.raises(Exception):
        hp.sample_rate = 1  # type: ignore[misc]
    assert replace(hp, sample_rate=16000).sample_rate == 16000


def test_a_backend_without_exact_streaming_falls_back_to_windows():
    """The core re-decodes a window of history for a codec that declares no stateful decode
    (here NumPy's codec with that part switched off), as s2.cpp's pipeline does."""
    from s2core.codec import Codec, CodecBackend, CodecCapabilities
    from s2core_numpy.codec import NumpyCodec

    class OneShotOnly(NumpyCodec):
        decode_stream = CodecBackend.decode_stream
        begin_stream = CodecBackend.begin_stream

        def __init__(self, f):
            super().__init__(f)
            self._caps = CodecCapabilities(streaming=False)

        def decode(self, codes):
            return NumpyCodec.decode_stream(self, NumpyCodec.begin_stream(self), codes)[0]

    codes, _ = example_codes_audio()
    c = Codec(CodecFile(example_path()), OneShotOnly(CodecFile(example_path())))
    assert not c.backend.streams
    s = c.stream_decoder()
    assert s.mode == "windowed"
    out = np.concatenate([s.push(codes[:, i:i + 1]) for i in range(codes.shape[1])])
    np.testing.assert_allclose(out, c.decode(codes), rtol=0, atol=1e-6)  # history covers all
    with pytest.raises(InvalidInputError, match="no exact streaming") as info:
        c.stream_decoder(mode="exact")
    assert info.value.check == "stream_mode"
    short = c.stream_decoder(history_frames=1)
    assert short.push(codes).shape == (160,) and short._history.shape == (10, 1)
    c.close()


def test_hostile_codec_files_are_named_model_file_errors(tmp_path):
    """The codec is read through the same validating reader as the model (gguf_container):
    a truncated file, a FIFO, a NaN key and a directory fail with the reason, never hang."""
    import math
    import os
    good = write_variant(tmp_path / "good.gguf")
    data = good.read_bytes()
    for cut in (10, len(data) // 3, len(data) - 1):
        bad = tmp_path / f"cut{cut}.gguf"
        bad.write_bytes(data[:cut])
        with pytest.raises(ModelFileError, match="truncated"):
            CodecFile(bad)
    fifo = tmp_path / "fifo.gguf"
    os.mkfifo(fifo)
    with pytest.raises(ModelFileError) as info:
        CodecFile(fifo)
    assert info.value.check == "not_regular_file"
    with pytest.raises(ModelFileError):
        CodecFile(tmp_path)
    nan = write_variant(tmp_path / "nan.gguf", extra_keys={
        "rvq_transformer.rope_freq_base": (math.nan, gguf.GGUFValueType.FLOAT32)})
    with pytest.raises(ModelFileError, match="finite"):
        CodecFile(nan)
