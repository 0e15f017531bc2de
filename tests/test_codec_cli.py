"""s2core.codec.audio (read, write, resample) and the `s2core decode` / `s2core encode` commands,
run through the real entry point on the shared example codec."""

from __future__ import annotations

import subprocess
import sys
import wave

import numpy as np
import pytest

import s2core
from s2core.codec.audio import AudioFileError, _read_pcm_wav, read_audio, read_for_codec, resample, write_wav
from s2core.cli.main import main
from s2core.kit.codec_models import example_codes_audio, example_path


def sine(freq: float, rate: int, seconds: float, amp: float = 0.5) -> np.ndarray:
    t = np.arange(int(rate * seconds)) / rate
    return (amp * np.sin(2 * np.pi * freq * t)).astype(np.float32)


# ---------------------------------------------------------------------- audio files
def test_wav_round_trip_is_16_bit_pcm(tmp_path):
    audio = sine(440, 44100, 0.1)
    path = write_wav(tmp_path / "a.wav", audio, 44100)
    with wave.open(str(path)) as w:
        assert (w.getnchannels(), w.getsampwidth(), w.getframerate(), w.getnframes()) == (1, 2, 44100, len(audio))
    back, rate = read_audio(path)
    assert rate == 44100 and back.dtype == np.float32
    assert np.max(np.abs(back - audio)) <= 1.0 / 32767
    ints, _ = _read_pcm_wav(path)  # the standard-library path agrees
    np.testing.assert_allclose(ints[:, 0], back, atol=1e-7)
    clipped = write_wav(tmp_path / "b.wav", np.array([2.0, -3.0, 0.0], np.float32), 8000)
    np.testing.assert_allclose(read_audio(clipped)[0], [32767 / 32768, -32767 / 32768, 0], atol=1e-7)
    with pytest.raises(AudioFileError, match="non-finite"):
        write_wav(tmp_path / "c.wav", np.array([np.nan], np.float32), 8000)


def test_read_other_formats_and_mix_down(tmp_path):
    soundfile = pytest.importorskip("soundfile")
    left, right = sine(300, 16000, 0.05), sine(500, 16000, 0.05, amp=0.25)
    stereo = np.stack([left, right], axis=1)
    soundfile.write(tmp_path / "f.wav", stereo, 16000, subtype="FLOAT")
    soundfile.write(tmp_path / "p24.wav", stereo, 16000, subtype="PCM_24")
    soundfile.write(tmp_path / "x.flac", stereo, 16000)
    for name, atol in (("f.wav", 1e-7), ("p24.wav", 2 ** -22), ("x.flac", 2 ** -15)):
        mono, rate = read_audio(tmp_path / name)
        assert rate == 16000
        np.testing.assert_allclose(mono, (left + right) / 2, atol=atol, err_msg=name)
    pcm24, _ = _read_pcm_wav(tmp_path / "p24.wav")  # the standard library's 24-bit path
    np.testing.assert_allclose(pcm24, stereo, atol=2 ** -22)
    with pytest.raises(AudioFileError, match="not a PCM WAV"):
        _read_pcm_wav(tmp_path / "f.wav")
    (tmp_path / "junk.wav").write_bytes(b"not audio at all")
    with pytest.raises(AudioFileError, match="not a readable audio file"):
        read_audio(tmp_path / "junk.wav")
    with pytest.raises(AudioFileError, match="not found"):
        read_audio(tmp_path / "absent.wav")


def test_resample_keeps_the_pitch_and_duration():
    pytest.importorskip("soxr")
    audio = sine(1000, 48000, 1.0)
    out = resample(audio, 48000, 44100)
    assert out.dtype == np.float32 and abs(len(out) - 44100) <= 1
    spectrum = np.abs(np.fft.rfft(out[2000:-2000] * np.hanning(len(out) - 4000)))
    peak_hz = np.argmax(spectrum) * 44100 / (len(out) - 4000)
    assert abs(peak_hz - 1000) < 2
    assert abs(np.sqrt(np.mean(out[2000:-2000] ** 2)) - 0.5 / np.sqrt(2)) < 1e-3
    assert resample(audio, 48000, 48000) is not None


# ---------------------------------------------------------------------- commands
def test_decode_command_writes_the_codec_output(tmp_path, capsys):
    codes, _ = example_codes_audio()
    np.save(tmp_path / "codes.npy", codes)
    assert main(["decode", str(example_path()), str(tmp_path / "codes.npy"), "--wav",
                 str(tmp_path / "one.wav"), "--backend", "numpy"]) == 0
    assert main(["decode", str(example_path()), str(tmp_path / "codes.npy"), "--wav",
                 str(tmp_path / "stream.wav"), "--backend", "numpy", "--stream", "--push", "2"]) == 0
    out = capsys.readouterr().out
    assert "5 frames" in out and "streamed 2 frame(s) a push" in out
    with s2core.load_codec(example_path(), backend="numpy") as c:
        expected = c.decode(codes)
    one, rate = read_audio(tmp_path / "one.wav")
    stream, _ = read_audio(tmp_path / "stream.wav")
    assert rate == 44100 and len(one) == len(expected) == 160
    # written as x * 32767 rounded, read back as n / 32768 (libsndfile's and wave's scales)
    assert np.max(np.abs(one - expected)) <= 2.0 / 32767
    assert np.max(np.abs(stream - one)) <= 1.0 / 32767


def test_encode_command_resamples_a_recording(tmp_path, capsys):
    pytest.importorskip("soxr")
    audio = sine(220, 48000, 0.01) + sine(3000, 48000, 0.01, amp=0.2)
    write_wav(tmp_path / "ref.wav", audio, 48000)
    assert main(["encode", str(example_path()), str(tmp_path / "ref.wav"), "--out",
                 str(tmp_path / "ref.npy"), "--backend", "numpy"]) == 0
    assert "resampled from 48000 Hz" in capsys.readouterr().out
    codes = np.load(tmp_path / "ref.npy")
    with s2core.load_codec(example_path(), backend="numpy") as c:
        at_rate = read_for_codec(tmp_path / "ref.wav", c.sample_rate)
        assert codes.dtype == np.int32
        assert codes.shape == (10, -(-len(at_rate) // c.samples_per_frame))
        np.testing.assert_array_equal(codes, c.encode(at_rate))


def test_commands_report_bad_input(tmp_path, capsys):
    np.save(tmp_path / "bad.npy", np.zeros((9, 4), np.int64))
    np.save(tmp_path / "float.npy", np.zeros((10, 4), np.float32))
    for codes, message in (("bad.npy", "codes_shape"), ("float.npy", "codes_dtype"),
                           ("absent.npy", "codes_file")):
        assert main(["decode", str(example_path()), str(tmp_path / codes), "--wav",
                     str(tmp_path / "o.wav"), "--backend", "numpy"]) == 2
        assert message in capsys.readouterr().err
    assert main(["encode", str(example_path()), str(tmp_path / "absent.wav"), "--out",
                 str(tmp_path / "o.npy")]) == 2
    assert "not found" in capsys.readouterr().err


def test_console_script_entry_point(tmp_path):
    codes, _ = example_codes_audio()
    np.save(tmp_path / "codes.npy", codes)
    script = [sys.executable, "-m", "s2core.cli"]
    done = subprocess.run(script + ["decode", str(example_path()), str(tmp_path / "codes.npy"),
                                    "--wav", str(tmp_path / "o.wav"), "--backend", "numpy"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "o.wav").stat().st_size == 44 + 2 * 160
