"""Fuzz (issue 23): every reader on mutated files, every command on hostile paths.

A mutated file either still reads (the mutation hit something harmless: a sample, a code in
range) or is refused with the reader's documented error; either way within a second and
200 MB (tracemalloc), in a thread so that a hang fails the case instead of blocking the run,
and the file is left as it was. A command given a hostile path exits with status 2 and one
line of error, its inputs untouched.
"""

from __future__ import annotations

import os
import struct
import threading
import time
import wave
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import s2core
from s2core.cli.main import main
from s2core.codec.audio import AudioFileError, read_audio, read_for_codec
from s2core.codec.codes_file import read_codes, write_codes
from s2core.errors import InvalidInputError, PrefixFileError, TokenizerError, VoiceFileError
from s2core.kit.prompts import mixed_prompt
from s2core.embedded.writer import tiny_hparams
from s2core.runtime.prefix import KVPrefix
from s2core.text.tokenizer import Tokenizer
from s2core.voice.file import Voice, parse_s2voice, write_s2voice

from hardening_helpers import HANG_SECONDS, MAX_PEAK_BYTES, MAX_SECONDS, digest, run_bounded

EXTREMES = [0, 1, 2**15, 2**16 - 1, 2**31 - 1, 2**31, 2**32 - 1, 2**53, 2**63, 2**64 - 1]
FUZZ = settings(max_examples=120, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])


def within_bounds(read, path: Path, error: type) -> None:
    """read(path) returns or raises `error`, within the bounds; the file is unchanged."""
    before = path.read_bytes()
    exc, took, peak = run_bounded(lambda: read(path))
    assert exc is None or isinstance(exc, error), f"{type(exc).__name__}: {exc}"
    assert took < MAX_SECONDS and peak < MAX_PEAK_BYTES, (took, peak, exc)
    assert len(str(exc or "")) < 4000
    assert path.read_bytes() == before


# ---------------------------------------------------------------------- mutations
@st.composite
def mutation(draw, size: int):
    """(kind, arguments) of one mutation of a file of `size` bytes."""
    kind = draw(st.sampled_from(["truncate", "flip", "insert", "extreme32", "extreme64",
                                 "zeros", "append"]))
    at = draw(st.integers(0, max(0, size - 1)))
    if kind == "flip":
        return kind, at, draw(st.integers(1, 255))
    if kind in ("insert", "append"):
        return kind, at, draw(st.binary(min_size=1, max_size=64))
    if kind in ("extreme32", "extreme64"):
        return kind, at, draw(st.sampled_from(EXTREMES))
    if kind == "zeros":
        return kind, at, draw(st.integers(1, 64))
    return kind, at, None


def mutate(data: bytes, m) -> bytes:
    kind, at, arg = m
    b = bytearray(data)
    if kind == "truncate":
        return bytes(b[:at])
    if kind == "flip":
        b[at] ^= arg
    elif kind == "insert":
        b[at:at] = arg
    elif kind == "append":
        b += arg
    elif kind == "extreme32":
        b[at:at + 4] = struct.pack("<I", arg % 2**32)
    elif kind == "extreme64":
        b[at:at + 8] = struct.pack("<Q", arg)
    elif kind == "zeros":
        b[at:at + arg] = bytes(arg)
    return bytes(b)


def _header_region(data: bytes) -> int:
    """Mutations aimed at the first bytes hit the headers most readers parse."""
    return min(len(data), 4096)


@pytest.fixture(scope="module")
def files(tiny_model, tmp_path_factory):
    d = tmp_path_factory.mktemp("fuzz_valid")
    m = s2core.load(tiny_model, backend="numpy")
    m.init_kv_cache(8)
    m.prefill(mixed_prompt(tiny_hparams(), 4, np.random.default_rng(0)))
    m.save_prefix().save(d / "p.safetensors")
    m.close()
    write_s2voice(d / "v.s2voice", Voice("a voice to fuzz", np.arange(40, dtype=np.int32)
                                         .reshape(10, 4)))
    write_codes(d / "c.npy", np.arange(30, dtype=np.int32).reshape(10, 3))
    with wave.open(str(d / "a.wav"), "wb") as w:
        w.setnchannels(2)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(np.arange(2000, dtype="<i2").tobytes())
    return d


READERS = {
    "prefix": ("p.safetensors", KVPrefix.load, PrefixFileError),
    "voice": ("v.s2voice", lambda p: parse_s2voice(p.read_bytes()), VoiceFileError),
    "codes": ("c.npy", read_codes, InvalidInputError),
    "audio": ("a.wav", read_audio, AudioFileError),
    "audio for the codec": ("a.wav", lambda p: read_for_codec(p, 44100), AudioFileError),
}


@pytest.mark.parametrize("reader", sorted(READERS))
def test_mutated_files(files, tmp_path, reader):
    name, read, error = READERS[reader]
    valid = (files / name).read_bytes()
    path = tmp_path / name

    @FUZZ
    @given(st.data())
    def case(data):
        focus = data.draw(st.booleans())
        size = _header_region(valid) if focus else len(valid)
        m = data.draw(mutation(size))
        path.write_bytes(mutate(valid, m))
        within_bounds(read, path, error)
    case()


@pytest.mark.parametrize("reader", ["audio", "audio for the codec"])
def test_mutated_files_without_soundfile(files, tmp_path, monkeypatch, reader):
    """The standard library's PCM WAV reader, used when soundfile is not installed."""
    import importlib.util
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda n, *a: None if n == "soundfile" else real(n, *a))
    test_mutated_files(files, tmp_path, reader)


@FUZZ
@given(st.text(max_size=200) | st.binary(max_size=200).map(lambda b: b.decode("utf-8", "replace")))
def test_tokenizer_json_mutations(tmp_path_factory, text):
    """Anything in a tokenizer.json's place is a TokenizerError or a tokenizer (never hangs)."""
    path = tmp_path_factory.getbasetemp() / "tok_fuzz.json"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    within_bounds(Tokenizer.from_file, path, TokenizerError)


# ---------------------------------------------------------------------- hostile paths
def _hostile_paths(tmp_path: Path) -> dict[str, str]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    zero = tmp_path / "zero"
    zero.symlink_to("/dev/zero")
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "nowhere")
    (tmp_path / "file").write_text("x")
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    return {"fifo": str(fifo), "dev_zero": str(zero), "directory": str(tmp_path),
            "missing": str(tmp_path / "missing"), "dangling": str(dangling),
            "under_a_file": str(tmp_path / "file" / "x"), "newline": str(tmp_path / "a\nb"),
            "symlink_loop": str(loop), "empty": "", "dev_null": "/dev/null",
            "long": str(tmp_path / ("x" * 5000))}


def _commands(assets: Path, tmp_path: Path, hostile: str) -> dict[str, list[str]]:
    model, tok = str(assets / "model.gguf"), str(assets / "tokenizer.json")
    out = str(tmp_path / "out")
    speak = ["speak", model, "--tokenizer", tok, "--backend", "numpy", "--text", "Hi.",
             "--max-new-tokens", "2", "--voices-dir", str(tmp_path / "voices")]
    return {
        "info model": ["info", hostile],
        "speak model": ["speak", hostile, "--tokenizer", tok, "--text", "Hi.", "--out", out],
        "speak tokenizer": ["speak", model, "--tokenizer", hostile, "--text", "Hi.", "--out", out],
        "speak reference codes": speak + ["--reference-codes", hostile, "--reference-text", "x",
                                          "--out", out],
        "speak reference audio": speak + ["--reference-audio", hostile, "--reference-text", "x",
                                          "--out", out],
        "speak voice": speak + ["--voice", hostile if "/" in hostile else hostile + "/v",
                                "--out", out],
        "speak wav": speak + ["--wav", hostile],
        "speak out": speak + ["--out", hostile],
        "decode codes": ["decode", model, hostile, "--wav", out],
        "decode wav": ["decode", model, str(assets / "reference.npy"), "--wav", hostile],
        "encode audio": ["encode", model, hostile, "--out", out],
        "encode out": ["encode", model, str(assets / "reference.wav"), "--out", hostile],
        "voices dir": ["voices", "--voices-dir", hostile],
    }


#: hostile as inputs, but fine names for a new output (written, status 0)
NEW_FILE_KINDS = {"missing", "dangling", "newline"}


def test_every_command_on_hostile_paths(assets, tmp_path, capsys):
    before = {p: digest(p) for p in assets.iterdir() if p.is_file()}
    failures = []
    kinds = list(_hostile_paths(tmp_path / "kinds"))
    for i, kind in enumerate(kinds):
        for name in _commands(assets, tmp_path, "x"):
            d = tmp_path / f"{i}-{name.replace(' ', '_')}"
            d.mkdir()
            argv = _commands(assets, d, _hostile_paths(d)[kind])[name]
            output = name.endswith(("wav", "out"))
            fine = (output and kind in NEW_FILE_KINDS) or (
                name == "voices dir" and kind in NEW_FILE_KINDS | {"directory", "empty"})
            box: dict = {}
            t = time.perf_counter()
            thread = threading.Thread(target=lambda: box.update(rc=main(argv)), daemon=True)
            thread.start()
            thread.join(HANG_SECONDS)
            seconds = time.perf_counter() - t
            err = capsys.readouterr().err
            if thread.is_alive():
                failures.append(f"{name} / {kind}: hung")
            elif fine:
                if box.get("rc") != 0:
                    failures.append(f"{name} / {kind}: a fine path refused: {err[-300:]!r}")
            elif box.get("rc") != 2 or not err.startswith("s2core: error:") \
                    or err.count("\n") != 1 or seconds > 5:
                failures.append(f"{name} / {kind}: rc {box.get('rc')} in {seconds:.1f} s: "
                                f"{err[-300:]!r}")
    assert not failures, "\n".join(failures)
    assert {p: digest(p) for p in before} == before
