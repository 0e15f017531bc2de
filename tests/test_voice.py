"""s2.cpp's .s2voice files (SPEC 8) and the voice directory."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from s2core.embedded.writer import demo_hparams
from s2core.errors import InvalidInputError, VoiceFileError
from s2core.voice.file import Voice, parse_s2voice, read_s2voice, write_s2voice
from s2core.voice.library import VoiceLibrary


def spec8_bytes(transcript: bytes, codes: np.ndarray, version: int = 1, rate: int = 44100,
                cb_size: int = 4096, magic: bytes = b"S2VOICE\0", text_len: int | None = None,
                codes_size: int | None = None, n_cb: int | None = None,
                T: int | None = None) -> bytes:
    """SPEC 8 written out field by field."""
    body = codes.astype("<i4").tobytes()
    text = transcript + b"\0"
    return (magic + struct.pack("<I", version)
            + struct.pack("<iiii", codes.shape[0] if n_cb is None else n_cb,
                          codes.shape[1] if T is None else T, rate, cb_size)
            + struct.pack("<QQ", len(text) if text_len is None else text_len,
                          len(body) if codes_size is None else codes_size)
            + text + body)


CODES = np.random.default_rng(0).integers(0, 4096, (10, 37))


def test_written_bytes_are_spec8_and_round_trip(tmp_path):
    voice = Voice("Héllo, world.", CODES.astype(np.int32))
    path = write_s2voice(tmp_path / "a.s2voice", voice)
    assert path.read_bytes() == spec8_bytes("Héllo, world.".encode(), CODES)
    back = read_s2voice(path)
    assert back == voice and back.codes.dtype == np.int32 and back.n_frames == 37
    assert (back.sample_rate, back.codebook_size, back.num_codebooks) == (44100, 4096, 10)


GOOD = spec8_bytes(b"Hello.", CODES)


@pytest.mark.parametrize("data,check", [
    (b"", "truncated"),
    (b"S2VOI", "truncated"),
    (b"RIFF" + GOOD[4:], "magic"),
    (spec8_bytes(b"Hello.", CODES, magic=b"S2VOICE1"), "magic"),
    (spec8_bytes(b"Hello.", CODES, version=2), "version"),
    (spec8_bytes(b"Hello.", CODES, version=0), "version"),
    (GOOD[:30], "truncated"),
    (spec8_bytes(b"Hello.", CODES, text_len=0), "transcript_length"),
    (spec8_bytes(b"Hello.", CODES, text_len=6), "transcript_nul"),      # NUL left out
    (spec8_bytes(b"Hel\0lo.", CODES), "transcript_nul"),
    (spec8_bytes(b"\xff\xfe", CODES), "transcript_utf8"),
    (spec8_bytes(b"Hello.", CODES, text_len=10**12), "truncated"),
    (spec8_bytes(b"Hello.", CODES, codes_size=10**15), "truncated"),
    (GOOD[:-1], "truncated"),
    (GOOD[:-4 * 37], "truncated"),
    (spec8_bytes(b"Hello.", CODES, codes_size=4 * 370 - 4) + b"\0" * 0, "codes_size"),
    (spec8_bytes(b"Hello.", CODES, T=36), "codes_size"),
    (spec8_bytes(b"Hello.", CODES, n_cb=-10), "header_values"),
    (spec8_bytes(b"Hello.", CODES, T=0, codes_size=0)[:-4 * 370], "header_values"),
    (spec8_bytes(b"Hello.", CODES, cb_size=0), "header_values"),
    (spec8_bytes(b"Hello.", CODES, rate=-1), "header_values"),
    (GOOD + b"\0", "trailing_bytes"),
    (spec8_bytes(b"Hello.", CODES, cb_size=1024), "codes_range"),
    (spec8_bytes(b"Hello.", -CODES - 1), "codes_range"),
])
def test_malformed_files_are_refused(data, check, tmp_path):
    with pytest.raises(VoiceFileError) as info:
        parse_s2voice(data)
    assert info.value.check == check, str(info.value)
    path = tmp_path / "bad.s2voice"
    path.write_bytes(data)
    with pytest.raises(VoiceFileError):
        read_s2voice(path)


def test_every_truncation_is_refused():
    for n in range(len(GOOD)):
        with pytest.raises(VoiceFileError):
            parse_s2voice(GOOD[:n])
    assert parse_s2voice(GOOD).transcript == "Hello."


def test_random_corruption_never_crashes():
    rng = np.random.default_rng(1)
    for _ in range(2000):
        data = bytearray(GOOD)
        for i in rng.integers(0, len(data), rng.integers(1, 6)):
            data[i] = int(rng.integers(0, 256))
        try:
            parse_s2voice(bytes(data))
        except VoiceFileError:
            pass


def test_writing_refuses_what_cannot_be_read_back(tmp_path):
    for bad, check in [(Voice("", CODES), "transcript"), (Voice("a\0b", CODES), "transcript"),
                       (Voice("ok", CODES[:, :0]), "codes_shape"),
                       (Voice("ok", CODES.astype(float)), "codes_shape"),
                       (Voice("ok", CODES + 4096), "codes_range")]:
        with pytest.raises(VoiceFileError) as info:
            write_s2voice(tmp_path / "x.s2voice", bad)
        assert info.value.check == check
    assert not (tmp_path / "x.s2voice").exists()


def test_compatibility_with_the_model():
    hp = demo_hparams()  # codebook_size 1024
    Voice("ok", CODES % 1024, codebook_size=1024).check_fits(hp)
    with pytest.raises(VoiceFileError, match="needs") as info:
        Voice("ok", CODES).check_fits(hp)
    assert info.value.check == "compatible"
    with pytest.raises(VoiceFileError):
        Voice("ok", CODES % 1024, codebook_size=1024, sample_rate=24000).check_fits(hp)


def test_library_names_and_paths(tmp_path):
    lib = VoiceLibrary(tmp_path / "voices")
    assert lib.names() == []
    lib.save("anna", Voice("Hi.", CODES))
    lib.save("bob-2", Voice("Yo.", CODES[:, :3]))
    assert lib.names() == ["anna", "bob-2"]
    voice, path = lib.load("anna")
    assert path == tmp_path / "voices" / "anna.s2voice" and voice.transcript == "Hi."
    assert lib.load(str(path))[0] == voice  # a path works too
    for bad in ("", "../x", ".hidden", "a b", "x.s2voice"):
        with pytest.raises(InvalidInputError) as info:
            lib.save(bad, voice)
        assert info.value.check == "voice_name"
    with pytest.raises(VoiceFileError, match="not found"):
        lib.load("nobody")
