"""`s2core speak` and `s2core demo` end to end: text and a reference voice to codes, a saved
voice whose prefix is restored, and the recompute when the prefix does not fit."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

import s2core
from s2core.cli.main import main
from s2core.embedded.tokenizer import build_tokenizer_json
from s2core.embedded.writer import demo_hparams, write_model
from s2core.generation.loop import GenerationConfig
from s2core.speak.pipeline import speak
from s2core.testing.commands import s2core_executable
from s2core.text.tokenizer import Tokenizer
from s2core.voice.library import VoiceLibrary

HP = demo_hparams()
TRANSCRIPT = "This is the voice the demo speaks with."


def _speak_cli(assets: Path, *args: str) -> subprocess.CompletedProcess:
    cmd = [s2core_executable(), "speak", str(assets / "model.gguf"), "--tokenizer",
           str(assets / "tokenizer.json"), "--voices-dir", str(assets / "voices"),
           "--max-new-tokens", "6", "--min-tokens-before-end", "6", "--seed", "3",
           "--backend", "numpy", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


def _field(out: str, phase: str) -> str:
    line = next(l for l in out.splitlines() if l.startswith(phase))
    return line


def test_speak_with_a_reference_then_with_the_saved_voice(assets, tmp_path):
    first = _speak_cli(assets, "--text", "Hello there.", "--reference-codes",
                       str(assets / "reference.npy"), "--reference-text", TRANSCRIPT,
                       "--save-voice", "anna", "--out", str(tmp_path / "a.npy"))
    assert first.returncode == 0, first.stderr
    codes = np.load(tmp_path / "a.npy")
    assert codes.shape == (HP.num_codebooks, 6) and codes.dtype == np.int32
    assert ((codes >= 0) & (codes < HP.codebook_size)).all()
    assert "voice saved" in first.stderr and "computing" in first.stderr
    voices = assets / "voices"
    assert (voices / "anna.s2voice").exists()
    assert len(list(voices.glob("anna.*-f16.kvprefix.safetensors"))) == 1
    total = int(re.search(r"prompt\s+[\d.]+\s+(\d+) positions", first.stdout).group(1))

    second = _speak_cli(assets, "--text", "And once more, faster.", "--voice", "anna",
                        "--out", str(tmp_path / "b.npy"))
    assert second.returncode == 0, second.stderr
    assert "restoring" in second.stderr and "computing" not in second.stderr
    restored = int(re.search(r"prefix restore\s+[\d.]+\s+(\d+) positions restored",
                             second.stdout).group(1))
    prefilled = int(re.search(r"prefill\s+[\d.]+\s+(\d+) positions", second.stdout).group(1))
    reference_frames = np.load(assets / "reference.npy").shape[1]
    assert restored > reference_frames  # the system turn, transcript and reference codes
    assert prefilled < 40 and restored + prefilled < total + 20  # only the text part is prefilled
    assert "first frame" in second.stdout and "frames/s" in second.stdout
    assert np.load(tmp_path / "b.npy").shape == (HP.num_codebooks, 6)
    listing = subprocess.run([s2core_executable(), "voices", "--voices-dir", str(voices)], capture_output=True,
                             text=True, timeout=60)
    assert "anna" in listing.stdout and "48 frames" in listing.stdout
    assert "-f16" in listing.stdout  # its stored prefix


def test_same_voice_same_seed_same_codes_whether_computed_or_restored(assets, tmp_path):
    model = s2core.load(assets / "model.gguf", backend="numpy")
    tok = Tokenizer.from_file(assets / "tokenizer.json")
    ref = np.load(assets / "reference.npy")
    config = GenerationConfig(max_new_tokens=5, min_tokens_before_end=5, seed=9,
                              im_end_id=tok.im_end_id)
    voices = tmp_path / "voices"
    a = speak(model, tok, "One.", reference_codes=ref, reference_text=TRANSCRIPT,
              save_voice="v", voices_dir=voices, config=config)
    b = speak(model, tok, "One.", voice="v", voices_dir=voices, config=config)
    assert (a.voice.prefix, b.voice.prefix) == ("computed", "restored")
    np.testing.assert_array_equal(a.codes, b.codes)
    # a path to the .s2voice works as well as the name
    c = speak(model, tok, "One.", voice=str(voices / "v.s2voice"), config=config)
    np.testing.assert_array_equal(a.codes, c.codes)
    # the cold path (no voice prefix at all) runs the same prompt in one prefill
    cold = speak(model, tok, "One.", reference_codes=ref, reference_text=TRANSCRIPT,
                 config=config)
    assert cold.voice.prefix == "" and cold.stats.restored_positions == 0
    assert cold.stats.prefilled_positions == a.prompt_positions
    model.close()


def test_prefix_of_another_model_or_tokenizer_is_recomputed(assets, tmp_path):
    tok = Tokenizer.from_file(assets / "tokenizer.json")
    ref = np.load(assets / "reference.npy")
    voices = tmp_path / "voices"
    config = GenerationConfig(max_new_tokens=3, seed=0, im_end_id=tok.im_end_id)
    m16 = s2core.load(assets / "model.gguf", backend="numpy")
    speak(m16, tok, "Hi.", reference_codes=ref, reference_text=TRANSCRIPT, save_voice="v",
          voices_dir=voices, config=config)
    # another file of the same model (f32): its own prefix, stored beside the first
    other = tmp_path / "other.gguf"
    write_model(other, HP, "f32", seed=0)
    m32 = s2core.load(other, backend="numpy")
    messages = []
    r = speak(m32, tok, "Hi.", voice="v", voices_dir=voices, config=config, say=messages.append)
    assert r.voice.prefix == "computed" and "no stored prefix" in r.voice.why_computed
    assert len(list(voices.glob("v.*.kvprefix.safetensors"))) == 2
    assert speak(m32, tok, "Hi.", voice="v", voices_dir=voices, config=config).voice.prefix \
        == "restored"
    # a prefix file copied over from another model is refused and recomputed
    lib = VoiceLibrary(voices)
    path16 = lib.prefix_path(voices / "v.s2voice", m16.identity, "f16")
    shutil.copyfile(path16, lib.prefix_path(voices / "v.s2voice", m32.identity, "f16"))
    r = speak(m32, tok, "Hi.", voice="v", voices_dir=voices, config=config)
    assert r.voice.prefix == "computed" and "another model file" in r.voice.why_computed
    # another tokenizer encodes the transcript differently: the token rows differ
    import json
    j = json.loads(tok.to_str())
    j["model"]["merges"] = []  # bytes only
    other_tok = Tokenizer.from_str(json.dumps(j))
    assert other_tok.encode(TRANSCRIPT) != tok.encode(TRANSCRIPT)
    r = speak(m16, other_tok, "Hi.", voice="v", voices_dir=voices,
              config=GenerationConfig(max_new_tokens=3, seed=0, im_end_id=other_tok.im_end_id))
    assert r.voice.prefix == "computed" and "token rows" in r.voice.why_computed
    m16.close()
    m32.close()


@pytest.mark.parametrize("args,message", [
    (["--voice", "anna", "--reference-text", "x"], "voice_and_reference"),
    (["--voice", "nobody"], "not found"),
    (["--reference-codes", "missing.npy", "--reference-text", "x"], "reference_codes_file"),
    (["--save-voice", "x"], "save_voice"),
    (["--save-voice", "../evil", "--reference-text", "x"], "voice_name"),
    (["--temperature", "nan"], "temperature"),
    (["--seed", "-2"], "seed"),
    (["--text", ""], "[text]"),
    (["--max-new-tokens", "100000"], "context_length"),
])
def test_cli_errors_are_clean(assets, tmp_path, capsys, args, message):
    base = ["speak", str(assets / "model.gguf"), "--tokenizer", str(assets / "tokenizer.json"),
            "--voices-dir", str(tmp_path / "voices"), "--backend", "numpy", "--text", "Hi.",
            "--out", str(tmp_path / "x.npy")]
    assert main(base + args) == 2
    err = capsys.readouterr().err
    assert err.startswith("s2core: error:") and message in err, err
    assert not (tmp_path / "x.npy").exists()
    assert not (tmp_path / "voices").exists() or not list((tmp_path / "voices").iterdir())


def test_cli_refuses_a_tokenizer_without_the_specials(assets, tmp_path, capsys):
    import json
    j = json.loads(build_tokenizer_json(HP))
    j["added_tokens"] = [t for t in j["added_tokens"] if t["content"] != "<|voice|>"]
    bad = tmp_path / "tokenizer.json"
    bad.write_text(json.dumps(j))
    assert main(["speak", str(assets / "model.gguf"), "--tokenizer", str(bad), "--text", "Hi.",
                 "--out", str(tmp_path / "x.npy")]) == 2
    assert "<|voice|>" in capsys.readouterr().err


def test_demo_saves_its_voice_then_restores_it(tmp_path):
    exe = s2core_executable()
    env = {"S2CORE_CACHE": str(tmp_path), "PATH": "/usr/bin:/bin", "S2CORE_BACKEND": "numpy"}
    runs = [subprocess.run([exe, "demo", "--steps", "4"], capture_output=True, text=True,
                           env=env, timeout=300, cwd=tmp_path) for _ in range(2)]
    for run in runs:
        assert run.returncode == 0, run.stderr
        assert "backend      numpy" in run.stdout and "generated    4 frames" in run.stdout
    assert "voice saved" in runs[0].stdout and "restoring" in runs[1].stdout
    first_codes = [l for l in runs[0].stdout.splitlines() if "first frame codes" in l]
    assert first_codes == [l for l in runs[1].stdout.splitlines() if "first frame codes" in l]
    assert (tmp_path / "voices" / "demo.s2voice").exists()
