"""Speech out: `speak` with the codec stored in the model file, audio decoded as frames come
(the same samples as decoding the codes at the end), a WAV that is valid while it grows,
reference voices from a recording, and the clear errors around them."""

from __future__ import annotations

import re
import subprocess
import wave
from pathlib import Path

import numpy as np
import pytest

import s2core
from s2core.codec.audio import WavWriter, read_audio, read_for_codec, write_wav
from s2core.embedded.codec_writer import tiny_codec_config
from s2core.embedded.writer import demo_hparams, write_model
from s2core.errors import InvalidInputError, ModelFileError
from s2core.generation.loop import GenerationConfig
from s2core.speak.pipeline import speak
from s2core.speak.audio_out import AudioOut, check_codec_fits
from s2core.testing.commands import s2core_executable
from s2core.text.tokenizer import Tokenizer
from s2core.voice.file import Voice

HP = demo_hparams()
TRANSCRIPT = "This is the voice the demo speaks with."
FRAMES = 5


def _config(tok: Tokenizer, frames: int = FRAMES) -> GenerationConfig:
    return GenerationConfig(max_new_tokens=frames, min_tokens_before_end=frames, seed=11,
                            im_end_id=tok.im_end_id)


@pytest.fixture(scope="module")
def parts(assets):
    model = s2core.load(assets / "model.gguf", backend="numpy")
    codec = s2core.load_codec(assets / "model.gguf", backend="numpy")
    tok = Tokenizer.from_file(assets / "tokenizer.json")
    yield model, codec, tok
    model.close()
    codec.close()


def _speak(parts, assets, audio):
    model, _, tok = parts
    return speak(model, tok, "Hello there.", reference_codes=np.load(assets / "reference.npy"),
                 reference_text=TRANSCRIPT, config=_config(tok), audio=audio)


def test_streamed_audio_is_the_one_shot_decode_of_the_codes(parts, assets):
    _, codec, _ = parts
    pieces = []
    streamed = _speak(parts, assets, AudioOut(codec, stream=True, on_audio=pieces.append))
    one_shot = _speak(parts, assets, AudioOut(codec, stream=False))
    # same seed, same codes; the audio of each equals decoding those codes in one call
    np.testing.assert_array_equal(streamed.codes, one_shot.codes)
    reference = codec.decode(streamed.codes)
    assert streamed.audio.shape == (FRAMES * codec.samples_per_frame,)
    np.testing.assert_allclose(streamed.audio, reference, atol=1e-5, rtol=0)
    np.testing.assert_allclose(one_shot.audio, reference, atol=0, rtol=0)
    # one piece a frame, each a frame's samples, the first before generation ended
    assert [p.size for p in pieces] == [codec.samples_per_frame] * FRAMES
    s = streamed.audio_stats
    assert s.mode == "streamed" and len(s.chunks) == FRAMES and s.decode_s > 0
    assert 0 < s.first_audio_s < streamed.stats.total_s
    # one shot: the first audio comes after the last frame
    assert one_shot.audio_stats.first_audio_s >= one_shot.stats.total_s
    assert streamed.audio_stats.audio_s == pytest.approx(FRAMES * 2048 / 44100)


def test_stopping_early_keeps_a_valid_wav_of_what_was_made(parts, assets, tmp_path):
    model, codec, tok = parts
    path = tmp_path / "partial.wav"

    def interrupt(i, frame):
        if i == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt), WavWriter(path, codec.sample_rate) as wav:
        speak(model, tok, "Hello there.", config=_config(tok, 8), on_frame=interrupt,
              audio=AudioOut(codec, on_audio=wav.write))
    audio, rate = read_audio(path)
    assert rate == 44100 and audio.size == 3 * codec.samples_per_frame
    assert model.n_past == 0 and model.max_seq_len is None  # the cache is freed, model usable
    assert _speak(parts, assets, None).frames == FRAMES


def test_wav_is_complete_while_it_grows(tmp_path):
    path = tmp_path / "grow.wav"
    rng = np.random.default_rng(0)
    with WavWriter(path, 16000) as w:
        with wave.open(str(path), "rb") as r:
            assert r.getnframes() == 0
        for n in (1, 100, 2048):
            w.write(rng.uniform(-1, 1, n).astype(np.float32))
            with wave.open(str(path), "rb") as r:  # a reader sees every sample written so far
                assert r.getnframes() == w.samples
    assert w.samples == 2149
    with pytest.raises(Exception, match="closed"):
        w.write(np.zeros(3, np.float32))


def test_codec_of_another_model_is_refused_before_anything_runs(parts, assets, tmp_path):
    model, _, tok = parts
    other = tmp_path / "tiny-codec.gguf"
    from s2core.embedded.codec_writer import write_codec
    write_codec(other, tiny_codec_config(residual_codebooks=3))
    with s2core.load_codec(other, backend="numpy") as small:
        with pytest.raises(InvalidInputError, match=r"4 codebooks.*10 codes a frame"):
            check_codec_fits(small, model.hparams)
        with pytest.raises(InvalidInputError, match="codec_codebooks"):
            speak(model, tok, "Hi.", config=_config(tok), audio=AudioOut(small))
    assert model.n_past == 0


def test_a_model_file_without_a_codec_says_so(tmp_path, assets, capsys):
    path = tmp_path / "no-codec.gguf"
    write_model(path, HP, "f16")
    with pytest.raises(ModelFileError, match=r"holds no audio codec \(no fish_speech.codec.\* "
                                             r"keys, no c.\* tensors\)"):
        s2core.load_codec(path)
    from s2core.cli.main import main
    assert main(["info", str(path)]) == 0
    assert "codec        none usable" in capsys.readouterr().out
    assert main(["info", str(assets / "model.gguf")]) == 0
    assert re.search(r"codec        44100 Hz, 2048 samples a frame, 10 codebooks .*f16, "
                     r"encoder too", capsys.readouterr().out)


# ---------------------------------------------------------------------- the command
def _speak_cli(assets: Path, *args: str) -> subprocess.CompletedProcess:
    cmd = [s2core_executable(), "speak", str(assets / "model.gguf"), "--tokenizer",
           str(assets / "tokenizer.json"), "--voices-dir", str(assets / "voices-speech"),
           "--max-new-tokens", "4", "--min-tokens-before-end", "4", "--seed", "5",
           "--backend", "numpy", "--codec-backend", "numpy", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("stream", [False, True])
def test_speak_writes_the_wav_of_its_codes(assets, tmp_path, stream):
    wav, npy = tmp_path / "out.wav", tmp_path / "out.npy"
    run = _speak_cli(assets, "--text", "Hello there.", "--wav", str(wav), "--out", str(npy),
                     *(["--stream"] if stream else []))
    assert run.returncode == 0, run.stderr
    codes = np.load(npy)
    with wave.open(str(wav), "rb") as w:
        rate, pcm = w.getframerate(), np.frombuffer(w.readframes(w.getnframes()), "<i2")
    with s2core.load_codec(assets / "model.gguf", backend="numpy") as codec:
        expected = np.round(np.clip(codec.decode(codes), -1, 1) * 32767)
    assert rate == 44100 and pcm.size == 4 * 2048
    # the PCM16 of the decoded codes (a streamed sample may round the other way: 1 step)
    assert np.abs(pcm - expected).max() <= (1 if stream else 0)
    assert "first audio" in run.stdout
    assert re.search(r"audio decode\s+[\d.]+\s+0\.19 s of audio at 44100 Hz", run.stdout)
    assert "written as frames came" in run.stdout if stream else "decoded after" in run.stdout


def test_speak_takes_a_reference_recording(assets, tmp_path):
    """A 48 kHz stereo recording: mixed down, resampled to 44.1 kHz, encoded by the codec in
    the model file; the saved voice holds exactly those codes."""
    audio48 = np.stack([np.sin(np.linspace(0, 400, 48000)), np.zeros(48000)], 1) * 0.5
    import soundfile
    ref = tmp_path / "ref48k.wav"
    soundfile.write(ref, audio48.astype(np.float32), 48000, subtype="FLOAT")
    run = _speak_cli(assets, "--text", "Hello there.", "--reference-audio", str(ref),
                     "--reference-text", TRANSCRIPT, "--save-voice", "rec",
                     "--out", str(tmp_path / "c.npy"))
    assert run.returncode == 0, run.stderr
    assert "reference encode" in run.stdout
    with s2core.load_codec(assets / "model.gguf", backend="numpy") as codec:
        expected = codec.encode(read_for_codec(ref, codec.sample_rate))
    saved = Voice.load(assets / "voices-speech" / "rec.s2voice")
    assert saved.codes.shape == (HP.num_codebooks, 22)  # ceil(44100 / 2048) frames
    np.testing.assert_array_equal(saved.codes, expected)


@pytest.mark.parametrize("args, check", [
    (["--stream"], "stream"),
    (["--reference-audio", "x.wav"], "reference_text"),
    (["--reference-audio", "x.wav", "--reference-codes", "y.npy", "--reference-text", "t"],
     "reference"),
    (["--reference-audio", "x.wav", "--reference-text", "t", "--voice", "anna"],
     "voice_and_reference"),
])
def test_speak_refuses_option_combinations_before_loading(assets, args, check):
    run = _speak_cli(assets, "--text", "Hi.", *args)
    assert run.returncode == 2
    assert f"[{check}]" in run.stderr


def test_speak_wav_without_a_codec_in_the_file(assets, tmp_path):
    bare = tmp_path / "bare.gguf"
    write_model(bare, HP, "f16")
    run = subprocess.run([s2core_executable(), "speak", str(bare), "--tokenizer",
                          str(assets / "tokenizer.json"), "--text", "Hi.", "--wav",
                          str(tmp_path / "x.wav"), "--backend", "numpy"],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 2 and "holds no audio codec" in run.stderr
    # the codec can come from its own file instead
    run = subprocess.run([s2core_executable(), "speak", str(bare), "--tokenizer",
                          str(assets / "tokenizer.json"), "--text", "Hi.", "--wav",
                          str(tmp_path / "x.wav"), "--codec", str(assets / "model.gguf"),
                          "--max-new-tokens", "2", "--min-tokens-before-end", "2",
                          "--backend", "numpy", "--seed", "1"],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert read_audio(tmp_path / "x.wav")[0].size == 2 * 2048


def test_write_wav_refuses_non_finite_before_creating_a_file(tmp_path):
    with pytest.raises(Exception, match="non-finite"):
        write_wav(tmp_path / "nan.wav", np.array([0.0, np.nan], np.float32), 8000)
    assert not (tmp_path / "nan.wav").exists()
