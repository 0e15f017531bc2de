"""Issue 23, case by case: what a hostile user's fuzz trial found, each now refused with the
documented error, within a second and 200 MB, its inputs untouched (tests/hardening_helpers).
The mutation fuzz of the same readers is tests/test_fuzz_readers.py."""

from __future__ import annotations

import importlib.util
import json
import os
import struct
import threading
import wave
from pathlib import Path

import numpy as np
import pytest

import s2core
from s2core.cli.main import main
from s2core.codec.audio import (AudioFileError, AudioLimits, WavWriter, probe_audio, read_audio,
                                read_for_codec, resample, write_wav)
from s2core.codec.codes_file import read_codes, write_codes
from s2core.embedded.writer import tiny_hparams
from s2core.errors import (InvalidInputError, ModelBusyError, PrefixFileError,
                           PrefixMismatchError, TokenizerError, VoiceFileError)
from s2core.generation.loop import GenerationConfig, generate, stream
from s2core.kit.prompts import mixed_prompt
from s2core.runtime.prefix import KVPrefix
from s2core.serving import Server
from s2core.text.tokenizer import Tokenizer
from s2core.voice.file import Voice, read_s2voice, write_s2voice

from hardening_helpers import bounded, digest, join_safetensors, split_safetensors

IM_END = 199  # a text id of the tiny model


def greedy(n: int) -> GenerationConfig:
    return GenerationConfig(max_new_tokens=n, min_tokens_before_end=n, im_end_id=IM_END,
                            temperature=0, seed=0)


PROMPT = mixed_prompt(tiny_hparams(), 12, np.random.default_rng(5))


@pytest.fixture
def model(tiny_model):
    m = s2core.load(tiny_model, backend="numpy")
    yield m
    m.close()


@pytest.fixture(scope="module")
def prefix_file(tiny_model, tmp_path_factory) -> Path:
    m = s2core.load(tiny_model, backend="numpy")
    m.init_kv_cache(16)
    m.prefill(PROMPT[:6])
    prefix = m.save_prefix()
    m.close()
    return prefix.save(tmp_path_factory.mktemp("prefix") / "p.kvprefix.safetensors")


def _fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


def _sparse(path: Path, head: bytes, size: int = 1_500_000_000) -> Path:
    """A file of `size` bytes (sparse: nothing is written but `head`)."""
    with open(path, "wb") as f:
        f.write(head)
        f.truncate(size)
    return path


# ---------------------------------------------------------------------- 1. destroyed model
def _speak(assets: Path, tmp_path: Path, *args: str) -> list[str]:
    return ["speak", str(assets / "model.gguf"), "--tokenizer", str(assets / "tokenizer.json"),
            "--voices-dir", str(tmp_path / "voices"), "--backend", "numpy", "--text", "Hi.",
            "--max-new-tokens", "2", "--seed", "1", *args]


@pytest.mark.parametrize("stream", [True, False])
def test_speak_refuses_to_write_over_its_model(assets, tmp_path, capsys, stream):
    model = assets / "model.gguf"
    before = digest(model)
    link = tmp_path / "link.wav"
    link.symlink_to(model)
    os.link(model, tmp_path / "hard.wav") if os.stat(model).st_dev == os.stat(tmp_path).st_dev \
        else None
    targets = [model, link] + ([tmp_path / "hard.wav"] if (tmp_path / "hard.wav").exists() else [])
    for target in targets:
        args = _speak(assets, tmp_path, "--wav", str(target)) + (["--stream"] if stream else [])
        assert main(args) == 2
        err = capsys.readouterr().err
        assert "output_is_input" in err and err.count("\n") == 1, err
    assert main(_speak(assets, tmp_path, "--out", str(assets / "tokenizer.json"))) == 2
    assert "output_is_input" in capsys.readouterr().err
    assert digest(model) == before


def test_decode_and_encode_refuse_to_write_over_their_inputs(assets, tmp_path, capsys):
    model = assets / "model.gguf"
    before = digest(model), digest(assets / "reference.npy"), digest(assets / "reference.wav")
    assert main(["decode", str(model), str(assets / "reference.npy"), "--wav", str(model)]) == 2
    assert "output_is_input" in capsys.readouterr().err
    assert main(["decode", str(model), str(assets / "reference.npy"), "--wav",
                 str(assets / "reference.npy")]) == 2
    assert "output_is_input" in capsys.readouterr().err
    assert main(["encode", str(model), str(assets / "reference.wav"), "--out",
                 str(assets / "reference.wav")]) == 2
    assert "output_is_input" in capsys.readouterr().err
    assert (digest(model), digest(assets / "reference.npy"),
            digest(assets / "reference.wav")) == before


def test_a_streamed_wav_is_a_new_file_playable_at_every_moment(tmp_path):
    """The WAV that grows during --stream replaces what was at its path (a new inode): a
    reader of the old file keeps it whole, and the new one is a valid WAV after every write."""
    path = tmp_path / "out.wav"
    path.write_bytes(b"old contents")
    old_inode = os.stat(path).st_ino
    with open(path, "rb") as old_reader, WavWriter(path, 8000) as w:
        assert os.stat(path).st_ino != old_inode
        for i in range(3):
            w.write(np.full(100, 0.1 * i, np.float32))
            with wave.open(str(path), "rb") as r:
                assert r.getnframes() == 100 * (i + 1)
        assert old_reader.read() == b"old contents"
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


# ---------------------------------------------------------------------- 2. corrupt prefix files
def _mutated_prefix(prefix_file: Path, tmp_path: Path, edit=None, raw_header: bytes | None = None,
                    body_edit=None) -> Path:
    header, body = split_safetensors(prefix_file.read_bytes())
    if edit is not None:
        edit(header)
    if body_edit is not None:
        body = body_edit(header, bytearray(body))
    path = tmp_path / "bad.kvprefix.safetensors"
    path.write_bytes(join_safetensors(header, bytes(body), raw_header))
    return path


def _set(path_keys, value):
    def edit(h):
        d = h
        for k in path_keys[:-1]:
            d = d[k]
        d[path_keys[-1]] = value
    return edit


def _identity_with(hparams):
    def edit(h):
        ident = json.loads(h["__metadata__"]["model"])
        ident["hparams"] = hparams
        h["__metadata__"]["model"] = json.dumps(ident)
    return edit


PREFIX_CASES = {
    "metadata a string": (_set(["__metadata__"], "oops"), "metadata_type"),
    "metadata a list": (_set(["__metadata__"], ["format"]), "metadata_type"),
    "kv_cache_dtype a list": (_set(["__metadata__", "kv_cache_dtype"], ["f16"]), "metadata_type"),
    "shape Infinity": (_set(["k", "shape"], [float("inf"), 1, 1, 1]), "tensor_shape"),
    "shape 1e20": (_set(["k", "shape"], [1e20, 1, 1, 1]), "tensor_shape"),
    "shape wraps": (_set(["k", "shape"], [2**62, 2**62, 4, 1]), "tensor_shape"),
    "negative dim": (_set(["v", "shape"], [-1, 6, 2, 8]), "tensor_shape"),
    "offsets Infinity": (_set(["k", "data_offsets"], [0, float("inf")]), "tensor_offsets"),
    "offsets 1e20": (_set(["k", "data_offsets"], [0, 1e20]), "tensor_offsets"),
    "offsets past the end": (_set(["tokens", "data_offsets"], [0, 2**40]), "tensor_offsets"),
    "offsets a string": (_set(["k", "data_offsets"], "0-10"), "tensor_offsets"),
    "dtype a list": (_set(["k", "dtype"], ["F16"]), "tensor_dtype"),
    "tensor a number": (_set(["k"], 5), "tensor_entry"),
    "hparams a list": (_identity_with([]), "model_identity"),
    "hparams a number": (_identity_with(5), "model_identity"),
    "hparams null": (_identity_with(None), "model_identity"),
    "identity not JSON": (_set(["__metadata__", "model"], "{"), "model_identity"),
    "identity wrong n_layer": (lambda h: _identity_with(
        {**json.loads(h["__metadata__"]["model"])["hparams"], "n_layer": 99})(h),
        "model_identity"),
    "extra tensor": (_set(["x"], {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}),
                     "tensors"),
    "format": (_set(["__metadata__", "format"], "other/1"), "format"),
}


@pytest.mark.parametrize("case", sorted(PREFIX_CASES))
def test_corrupt_prefix_headers_are_prefix_file_errors(prefix_file, tmp_path, case):
    edit, check = PREFIX_CASES[case]
    path = _mutated_prefix(prefix_file, tmp_path, edit)
    bounded(lambda: KVPrefix.load(path), PrefixFileError, check)


def test_deeply_nested_and_oversized_headers(prefix_file, tmp_path):
    _, body = split_safetensors(prefix_file.read_bytes())
    for raw, check in ((b"[" * 200_000 + b"]" * 200_000, "header_json"),
                       (b'{"a": ' * 100_000 + b"1" + b"}" * 100_000, "header_json")):
        path = tmp_path / "deep.safetensors"
        path.write_bytes(join_safetensors(None, body, raw))
        bounded(lambda: KVPrefix.load(path), PrefixFileError, (check, "header_length"))
    path = _sparse(tmp_path / "huge.safetensors", struct.pack("<Q", 2**40) + b"{")
    bounded(lambda: KVPrefix.load(path), PrefixFileError, "header_length")


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_non_finite_k_or_v_in_a_prefix_file_is_refused(prefix_file, tmp_path, value):
    def poison(header, body):
        begin = header["v"]["data_offsets"][0]
        body[begin + 6:begin + 8] = np.array([value], "<f2").tobytes()
        return body
    path = _mutated_prefix(prefix_file, tmp_path, body_edit=poison)
    exc = bounded(lambda: KVPrefix.load(path), PrefixFileError, "finite")
    assert "1 NaN or infinite" in str(exc)


def test_a_nan_prefix_is_refused_at_submit_and_the_running_request_is_unharmed(model,
                                                                             prefix_file):
    good = KVPrefix.load(prefix_file)
    k = good.k.copy()
    k[0, 0, 0, 0] = np.nan
    bad = KVPrefix(k, good.v, good.tokens, good.kv_cache_dtype, good.model)
    with Server(model, max_sequences=2) as server:
        innocent = server.submit(PROMPT, greedy(4))
        server.step()
        with pytest.raises(PrefixMismatchError) as info:
            server.submit(PROMPT, greedy(4), prefix=bad)
        assert info.value.check == "prefix_finite"
        codes = innocent.codes()
    np.testing.assert_array_equal(codes, generate(model, PROMPT, greedy(4)))
    with pytest.raises(PrefixMismatchError, match="NaN"):
        generate(model, PROMPT, greedy(2), prefix=bad)


def test_speak_with_a_corrupt_stored_prefix_recomputes_and_replaces_it(assets, tmp_path, capsys):
    ref = ["--reference-codes", str(assets / "reference.npy"), "--reference-text",
           (assets / "reference.txt").read_text().strip()]
    assert main(_speak(assets, tmp_path, *ref, "--save-voice", "anna", "--out",
                       str(tmp_path / "a.npy"))) == 0
    (stored,) = (tmp_path / "voices").glob("anna.*.kvprefix.safetensors")
    good_tokens = KVPrefix.load(stored).tokens
    for garbage in (b"", b"\xff" * 100, join_safetensors({"__metadata__": "x"}, b"")):
        stored.unlink()  # a new file: truncating a mapped one in place would be SIGBUS here
        stored.write_bytes(garbage)
        capsys.readouterr()
        assert main(_speak(assets, tmp_path, "--voice", "anna", "--out",
                           str(tmp_path / "b.npy"))) == 0
        err = capsys.readouterr().err
        assert "unreadable" in err and "computing" in err, err
        again = KVPrefix.load(stored)  # replaced by a valid one
        np.testing.assert_array_equal(again.tokens, good_tokens)
    stored.unlink()
    os.mkfifo(stored)  # a FIFO where the prefix was: refused, replaced, nothing hangs
    assert main(_speak(assets, tmp_path, "--voice", "anna", "--out", str(tmp_path / "c.npy"))) == 0
    assert stored.is_file() and KVPrefix.load(stored).n_positions == len(good_tokens)


# ---------------------------------------------------------------------- 4. hangs, unbounded reads
def _readers(tmp_path: Path):
    return {
        "prefix": (lambda p: KVPrefix.load(p), PrefixFileError),
        "voice": (lambda p: read_s2voice(p), VoiceFileError),
        "tokenizer": (lambda p: Tokenizer.from_file(p), TokenizerError),
        "codes": (lambda p: read_codes(p), InvalidInputError),
        "audio": (lambda p: read_audio(p), AudioFileError),
    }


@pytest.mark.parametrize("reader", ["prefix", "voice", "tokenizer", "codes", "audio"])
def test_no_reader_opens_a_fifo_a_device_or_a_directory(tmp_path, reader):
    read, error = _readers(tmp_path)[reader]
    fifo = _fifo(tmp_path / "fifo")
    zero = tmp_path / "zero"
    zero.symlink_to("/dev/zero")
    for path in (fifo, zero, tmp_path, Path("/dev/null")):
        bounded(lambda: read(path), error, "not_regular_file" if reader != "codes"
                else "codes_file")


@pytest.mark.parametrize("reader,head", [
    ("prefix", struct.pack("<Q", 2**31)), ("voice", b"S2VOICE\0" + b"\xff" * 36),
    ("tokenizer", b"{"), ("codes", b"\x93NUMPY\x01\x00v\x00" + b"{'descr': '<i4', "
                          b"'fortran_order': False, 'shape': (10, 1000000000000), }"),
    ("audio", b"RIFF\xff\xff\xff\xffWAVEfmt "),
])
def test_a_huge_sparse_file_with_a_bad_header_is_refused_without_reading_it(tmp_path, reader,
                                                                            head):
    read, error = _readers(tmp_path)[reader]
    path = _sparse(tmp_path / "sparse", head)
    bounded(lambda: read(path), error)


def test_voices_lists_a_directory_holding_a_fifo_and_dev_zero(tmp_path, capsys):
    voices = tmp_path / "voices"
    voices.mkdir()
    write_s2voice(voices / "good.s2voice", Voice("hello", np.zeros((10, 3), np.int32)))
    _fifo(voices / "pipe.s2voice")
    (voices / "zero.s2voice").symlink_to("/dev/zero")
    bounded(lambda: (_ for _ in ()).throw(SystemExit(main(["voices", "--voices-dir",
                                                           str(voices)]))), SystemExit)
    out = capsys.readouterr().out
    assert "good" in out and "pipe" in out and "zero" in out
    assert out.count("not a regular file") == 2


# ---------------------------------------------------------------------- 5. torn files
def test_concurrent_writers_of_one_voice_and_one_prefix_never_tear(tmp_path, prefix_file):
    voices = [Voice(f"voice {i}", np.full((10, 50 + i), i, np.int32)) for i in range(4)]
    prefix = KVPrefix.load(prefix_file)
    errors: list[BaseException] = []
    seen: list[str] = []

    def writer(i: int) -> None:
        try:
            for _ in range(25):
                write_s2voice(tmp_path / "v.s2voice", voices[i])
                prefix.save(tmp_path / "p.kvprefix.safetensors")
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    def reader() -> None:
        for _ in range(100):
            try:
                seen.append(read_s2voice(tmp_path / "v.s2voice").transcript)
                KVPrefix.load(tmp_path / "p.kvprefix.safetensors")
            except (VoiceFileError, PrefixFileError) as exc:
                if exc.check != "exists":
                    errors.append(exc)
    threads = [threading.Thread(target=writer, args=(i,)) for i in range(4)]
    threads.append(threading.Thread(target=reader))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:3]
    assert read_s2voice(tmp_path / "v.s2voice") in voices
    assert set(seen) <= {v.transcript for v in voices}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.kvprefix.safetensors", "v.s2voice"]


# ---------------------------------------------------------------------- 6. audio
def _wav(path: Path, rate: int, samples: np.ndarray) -> Path:
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes((samples * 20000).astype("<i2").tobytes())
    return path


@pytest.mark.parametrize("soundfile", [True, False])
def test_audio_rates_and_lengths_are_checked_from_the_header(tmp_path, monkeypatch, soundfile):
    if not soundfile:
        real = importlib.util.find_spec
        monkeypatch.setattr(importlib.util, "find_spec",
                            lambda name, *a: None if name == "soundfile" else real(name, *a))
    rng = np.random.default_rng(0)
    tiny = _wav(tmp_path / "tiny.wav", 1, rng.uniform(-1, 1, 1000))            # 2 KB at 1 Hz
    long1 = _wav(tmp_path / "long1.wav", 1, rng.uniform(-1, 1, 100_000))       # 1 Hz, 100k
    for path in (tiny, long1):
        bounded(lambda: read_for_codec(path, 44100), AudioFileError, "sample_rate")
    zero = bytearray(tiny.read_bytes())
    zero[24:28] = struct.pack("<I", 0)  # a 0 Hz rate
    bounded(lambda: read_for_codec(bytes(zero), 44100), AudioFileError, ("sample_rate", "format"))
    # a valid ten-minute recording (sparse: silence): refused as a reference from its header
    ten = tmp_path / "ten.wav"
    _wav(ten, 44100, np.zeros(0))
    n = 44100 * 600 * 2
    with open(ten, "r+b") as f:
        f.seek(4)
        f.write(struct.pack("<I", 36 + n))
        f.seek(40)
        f.write(struct.pack("<I", n))
        f.truncate(44 + n)
    bounded(lambda: read_for_codec(ten, 44100), AudioFileError, "duration")
    assert probe_audio(ten, AudioLimits(max_seconds=None))[:2] == (44100, 44100 * 600)
    # a forged RIFF size and data size: never more than the file holds
    forged = bytearray(_wav(tmp_path / "f.wav", 16000, rng.uniform(-1, 1, 800)).read_bytes())
    forged[4:8] = forged[40:44] = b"\xff\xff\xff\xff"
    audio, rate = read_audio(bytes(forged))
    assert rate == 16000 and audio.size == 800


def test_reading_and_resampling_are_streamed_and_bytes_equal_paths(tmp_path):
    import tracemalloc
    rng = np.random.default_rng(1)
    path = _wav(tmp_path / "a.wav", 48000, rng.uniform(-1, 1, 48000 * 50))  # 50 s
    tracemalloc.start()
    out = read_for_codec(path, 44100)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    # the output (8.8 MB) plus a few blocks: not the whole input at float64, nor soxr's copy
    assert peak < 3 * out.nbytes, peak
    one_shot = resample(read_audio(path)[0], 48000, 44100)
    np.testing.assert_array_equal(out, one_shot)
    np.testing.assert_array_equal(read_for_codec(path.read_bytes(), 44100), out)
    with open(path, "rb") as f:
        np.testing.assert_array_equal(read_for_codec(f, 44100), out)


def test_resample_refuses_impossible_rates():
    for rate in (0, -5, 10**9, 1.5, True):
        bounded(lambda: resample(np.zeros(10, np.float32), rate, 44100), AudioFileError,
                "sample_rate")


# ---------------------------------------------------------------------- 7. text
@pytest.fixture(scope="module")
def tokenizer(assets) -> Tokenizer:
    return Tokenizer.from_file(assets / "tokenizer.json")


def test_texts_are_checked_before_tokenizing(tokenizer):
    bounded(lambda: tokenizer.encode("a\ud800b"), InvalidInputError, "text_unicode")
    bounded(lambda: tokenizer.encode("<|" * 500_000), InvalidInputError, "text_length",
            seconds=0.05)
    bounded(lambda: tokenizer.encode("plain text " * 100_000), InvalidInputError,
            "text_length", seconds=0.05, peak=5 * 2**20)
    assert tokenizer.encode("a" * tokenizer.max_text_chars)  # the limit itself is allowed


# ---------------------------------------------------------------------- 8. codes
def test_codes_files_are_checked_from_their_header(tmp_path):
    empty = tmp_path / "empty.npy"
    empty.write_bytes(b"")
    bounded(lambda: read_codes(empty), InvalidInputError, "codes_file")
    huge = tmp_path / "huge.npy"
    header = "{'descr': '<i8', 'fortran_order': False, 'shape': (10, 1000000000000), }"
    huge.write_bytes(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header) + 1)
                     + header.encode() + b"\n")
    bounded(lambda: read_codes(huge), InvalidInputError, "codes_frames")
    million = tmp_path / "million.npy"
    write_codes(million, np.zeros((10, 10), np.int32))
    data = million.read_bytes().replace(b"(10, 10)", b"(10, 1000000)")
    million.write_bytes(data)
    bounded(lambda: read_codes(million), InvalidInputError, "codes_frames")
    short = tmp_path / "short.npy"
    short.write_bytes(data.replace(b"(10, 1000000)", b"(10, 20)     "))  # header says more
    bounded(lambda: read_codes(short), InvalidInputError, "codes_file")
    ragged = tmp_path / "ragged.npy"
    np.save(ragged, np.array([[1, 2], [3]], dtype=object), allow_pickle=True)
    bounded(lambda: read_codes(ragged), InvalidInputError, "codes_file")


def test_ragged_codes_given_in_python_are_input_errors(assets, tokenizer):
    from s2core.speak.pipeline import speak
    m = s2core.load(assets / "model.gguf", backend="numpy")
    try:
        with pytest.raises(InvalidInputError) as info:
            speak(m, tokenizer, "Hi.", reference_codes=[[1, 2], [3]], reference_text="x")
        assert info.value.check == "reference_codes_shape"
    finally:
        m.close()
    with s2core.load_codec(assets / "model.gguf", backend="numpy") as codec:
        with pytest.raises(InvalidInputError, match="rectangular"):
            codec.check_codes([[1, 2], [3]])


def test_codes_are_written_under_exactly_the_path_given(assets, tmp_path, capsys):
    out = tmp_path / "x.json"
    assert main(_speak(assets, tmp_path, "--out", str(out))) == 0
    assert out.exists() and not (tmp_path / "x.json.npy").exists()
    assert f"wrote        {out}:" in capsys.readouterr().out
    assert read_codes(out).shape[0] == 10


# ---------------------------------------------------------------------- 9. serving
def test_a_server_cannot_free_the_cache_a_stream_holds(model):
    expected = generate(model, PROMPT, greedy(4))
    it = stream(model, PROMPT, greedy(4))
    frames = [next(it)]
    server = Server(model, max_sequences=2)
    request = server.submit(PROMPT, greedy(4))
    with pytest.raises(ModelBusyError, match="holds the model"):
        server.step()
    frames += list(it)  # the stream goes on, unharmed
    np.testing.assert_array_equal(np.stack(frames, axis=1), expected)
    np.testing.assert_array_equal(request.codes(), expected)  # and the server after it
    server.close()


def test_an_idle_server_does_not_block_a_new_one(model):
    first = Server(model, max_sequences=2)
    a = first.submit(PROMPT, greedy(3))
    a.codes()  # done: the first server is idle, its slots hold nothing
    second = Server(model, max_sequences=2)
    np.testing.assert_array_equal(second.submit(PROMPT, greedy(3)).codes(), a.codes())
    np.testing.assert_array_equal(first.submit(PROMPT, greedy(3)).codes(), a.codes())
    first.close()
    second.close()


@pytest.mark.parametrize("name,value", [
    ("max_new_tokens", np.uint64(2**64 - 1)), ("max_new_tokens", 2**40),
    ("min_tokens_before_end", np.int64(-1)), ("seed", 2**64), ("ras_window", np.uint64(2**63)),
])
def test_integer_settings_are_python_ints_in_range(name, value):
    with pytest.raises(InvalidInputError) as info:
        GenerationConfig(**{name: value})
    assert info.value.check == name
    config = GenerationConfig(max_new_tokens=np.uint16(7), seed=np.uint64(2**63),
                              top_k=np.uint64(2**64 - 1))
    assert type(config.max_new_tokens) is int and type(config.seed) is int
    assert config.top_k == 2**64 - 1 and type(config.top_k) is int


def test_a_prefix_longer_than_the_prompt_is_a_prefix_check(model, tiny_model):
    long_prompt = mixed_prompt(tiny_hparams(), 30, np.random.default_rng(2))
    model.init_kv_cache(32)
    model.prefill(long_prompt[:20])
    prefix = model.save_prefix()
    model.clear_kv_cache()
    config = GenerationConfig(max_new_tokens=model.hparams.context_length - 12,
                              im_end_id=IM_END)
    for submit in (lambda: generate(model, PROMPT, config, prefix=prefix),
                   lambda: Server(model).submit(PROMPT, config, prefix=prefix)):
        with pytest.raises(PrefixMismatchError) as info:
            submit()
        assert info.value.check == "prefix_length"


# ---------------------------------------------------------------------- 10. the command line
@pytest.mark.parametrize("target", ["/dev/full", "DIR", "", "FILE/under.wav", "LONG"])
def test_unwritable_outputs_are_one_line_errors(assets, tmp_path, capsys, target):
    (tmp_path / "file").write_text("x")
    target = {"DIR": str(tmp_path), "FILE/under.wav": str(tmp_path / "file" / "under.wav"),
              "LONG": str(tmp_path / ("n" * 300 + ".wav"))}.get(target, target)
    model = str(assets / "model.gguf")
    for args in (_speak(assets, tmp_path, "--wav", target),
                 _speak(assets, tmp_path, "--out", target),
                 ["decode", model, str(assets / "reference.npy"), "--wav", target],
                 ["encode", model, str(assets / "reference.wav"), "--out", target]):
        assert main(args) == 2, args
        err = capsys.readouterr().err
        assert err.startswith("s2core: error: [output_path]") and err.count("\n") == 1, err
    assert (tmp_path / "file").read_text() == "x"


def test_voice_directories_and_names(assets, tmp_path, capsys):
    as_file = tmp_path / "voices_file"
    as_file.write_text("x")
    assert main(["voices", "--voices-dir", str(as_file)]) == 2
    assert "[voices_dir]" in capsys.readouterr().err
    ref = ["--reference-codes", str(assets / "reference.npy"), "--reference-text", "Hello."]
    base = ["speak", str(assets / "model.gguf"), "--tokenizer", str(assets / "tokenizer.json"),
            "--backend", "numpy", "--text", "Hi.", "--max-new-tokens", "2",
            "--out", str(tmp_path / "o.npy")]
    assert main(base + ["--voices-dir", str(as_file), *ref, "--save-voice", "anna"]) == 2
    assert "[output_path]" in capsys.readouterr().err
    for n in (300, 225, 129):
        assert main(base + ["--voices-dir", str(tmp_path / "v"), *ref,
                            "--save-voice", "a" * n]) == 2
        assert "[voice_name]" in capsys.readouterr().err
    assert not (tmp_path / "v").exists()


def test_info_refuses_a_negative_context(assets, capsys):
    assert main(["info", str(assets / "model.gguf"), "--ctx", "-5"]) == 2
    assert "[ctx]" in capsys.readouterr().err


def test_decode_streams_to_its_output(assets, tmp_path, capsys):
    codes = read_codes(assets / "reference.npy")
    out = tmp_path / "s.wav"
    assert main(["decode", str(assets / "model.gguf"), str(assets / "reference.npy"), "--wav",
                 str(out), "--stream", "--push", "3", "--backend", "numpy"]) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    with s2core.load_codec(assets / "model.gguf", backend="numpy") as codec:
        expected = codec.decode(codes)
    got, _ = read_audio(out)
    assert got.size == expected.size and np.max(np.abs(got - expected)) <= 2 / 32767
    assert main(["decode", str(assets / "model.gguf"), str(assets / "reference.npy"), "--wav",
                 str(out), "--max-frames", str(codes.shape[1] - 1)]) == 2
    assert "[codes_frames]" in capsys.readouterr().err


def test_write_wav_is_atomic(tmp_path):
    path = write_wav(tmp_path / "a.wav", np.zeros(10, np.float32), 8000)
    assert read_audio(path, AudioLimits(min_sample_rate=8000))[0].size == 10
    assert [p.name for p in tmp_path.iterdir()] == ["a.wav"]
