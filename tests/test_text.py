"""The tokenizer and s2.cpp's prompt (SPEC 7), on byte-level BPE tokenizers built with
`tokenizers` itself (S2 Pro's tokenizer.json cannot be downloaded here)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from s2core import Tokenizer
from s2core.embedded.tokenizer import build_tokenizer_json, cached_tokenizer
from s2core.embedded.writer import demo_hparams, s2pro_hparams, tiny_hparams
from s2core.errors import InvalidInputError, TokenizerError
from s2core.prompt import build_prompt, split_prompt, voice_prefix

HP = demo_hparams()


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer.from_str(build_tokenizer_json(HP))


def reference_codes(T: int = 7, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, HP.codebook_size, (HP.num_codebooks, T))


# ---------------------------------------------------------------------- tokenizer
def test_special_ids_and_newline(tok):
    assert tok.newline_id == 198 and tok.encode("\n") == [198]
    assert tok.token_to_id("Ċ") == 198  # GPT-2's byte-level alphabet: byte 10 -> 188 + 10
    for name, prop in (("<|im_start|>", "im_start_id"), ("<|im_end|>", "im_end_id"),
                       ("<|voice|>", "voice_id")):
        assert getattr(tok, prop) == tok.token_to_id(name) == tok.special_tokens[name]
        assert getattr(tok, prop) < HP.semantic_begin_id
    assert tok.semantic_begin_id == HP.semantic_begin_id
    assert tok.token_to_id(f"<|semantic:{HP.codebook_size - 1}|>") == HP.semantic_end_id


def test_specials_are_matched_literally_first(tok):
    ids = tok.encode("<|im_start|>user\nHi<|im_end|><|voice|>")
    assert ids[0] == tok.im_start_id and ids[-2:] == [tok.im_end_id, tok.voice_id]
    assert ids[1:-2] == tok.encode("user\nHi")
    # the text between specials is BPE-encoded on its own, exactly as a plain text
    assert tok.encode("a<|im_end|>b") == tok.encode("a") + [tok.im_end_id] + tok.encode("b")
    # a broken special is plain text
    broken = tok.encode("<|im_end|")
    assert tok.im_end_id not in broken and tok.decode(broken) == "<|im_end|"
    # adjacent and repeated specials; decode gives the text back
    text = "<|speaker:0|><|speaker:0|> x <|semantic:3|>"
    ids = tok.encode(text)
    assert ids[:2] == [tok.token_to_id("<|speaker:0|>")] * 2 and ids[-1] == HP.semantic_begin_id + 3
    assert tok.decode(ids) == text
    assert tok.encode("") == []


def test_at_one_position_the_longest_special_wins():
    spec = json.loads(build_tokenizer_json(HP))
    n = max(t["id"] for t in spec["added_tokens"]) + 1
    for i, content in enumerate(["<|a|>", "<|a|>b"]):  # one special is a prefix of the other
        spec["added_tokens"].append({"id": n + i, "content": content, "single_word": False,
                                     "lstrip": False, "rstrip": False, "normalized": False,
                                     "special": True})
    t = Tokenizer.from_str(json.dumps(spec))
    assert t.encode("x<|a|>by") == t.encode("x") + [n + 1] + t.encode("y")
    assert t.encode("x<|a|>cy") == t.encode("x") + [n] + t.encode("cy")


def test_unicode_round_trip(tok):
    text = "Grüße, 東京! naïve café — 42 €"
    assert tok.decode(tok.encode(text)) == text


def _without(name: str) -> str:
    spec = json.loads(build_tokenizer_json(HP))
    spec["added_tokens"] = [t for t in spec["added_tokens"] if t["content"] != name]
    return json.dumps(spec)


@pytest.mark.parametrize("name", ["<|im_start|>", "<|im_end|>", "<|voice|>"])
def test_a_tokenizer_without_the_prompt_specials_is_refused(name):
    with pytest.raises(TokenizerError, match=f"lacks the special token.*{name.replace('|', '.')}"):
        Tokenizer.from_str(_without(name))


def test_a_special_that_is_not_marked_special_is_refused():
    spec = json.loads(build_tokenizer_json(HP))
    for t in spec["added_tokens"]:
        if t["content"] == "<|voice|>":
            t["special"] = False
    with pytest.raises(TokenizerError, match="voice"):
        Tokenizer.from_str(json.dumps(spec))


def test_a_tokenizer_whose_newline_is_not_198_is_refused():
    from tokenizers import Tokenizer as HF, models, pre_tokenizers
    hf = HF(models.WordLevel({"<unk>": 0, "\n": 1, "a": 2}, unk_token="<unk>"))
    hf.pre_tokenizer = pre_tokenizers.Whitespace()
    hf.add_special_tokens(["<|im_start|>", "<|im_end|>", "<|voice|>"])
    with pytest.raises(TokenizerError, match="198"):
        Tokenizer.from_str(hf.to_str())


def test_bad_files_are_tokenizer_errors(tmp_path):
    with pytest.raises(TokenizerError, match="not found"):
        Tokenizer.from_file(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(TokenizerError, match="tokenizers"):
        Tokenizer.from_file(bad)
    binary = tmp_path / "binary.json"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(TokenizerError):
        Tokenizer.from_file(binary)


def test_embedded_tokenizer_is_cached_and_deterministic(tmp_path):
    path = cached_tokenizer(HP, tmp_path)
    assert path.exists() and cached_tokenizer(HP, tmp_path) == path
    assert Tokenizer.from_file(path).to_str() == Tokenizer.from_str(build_tokenizer_json(HP)).to_str()
    # S2 Pro-sized vocab: no semantic tokens (150k fillers), every id below the semantic range
    big = Tokenizer.from_str(build_tokenizer_json(s2pro_hparams(1)))
    assert big.semantic_begin_id is None and big.vocab_size < 151678


def test_import_s2core_does_not_import_tokenizers():
    code = "import sys, s2core; print('tokenizers' in sys.modules, 'safetensors' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


# ---------------------------------------------------------------------- prompt (SPEC 7)
def test_prompt_with_reference_is_spec7(tok):
    codes = reference_codes()
    text, transcript = "Good morning.", "Hello there."
    rows = build_prompt(tok, text, transcript, codes, hparams=HP)
    e, nl = tok.encode, 198
    head = (e("<|im_start|>system") + [nl]
            + e("convert the provided text to speech reference to the following:\n\nText:\n")
            + e("<|speaker:0|>") + e(transcript) + e("\n\nSpeech:\n"))
    tail = ([tok.im_end_id, nl] + e("<|im_start|>user") + [nl] + e(text) + [tok.im_end_id, nl]
            + e("<|im_start|>assistant") + [nl, tok.voice_id])
    T = codes.shape[1]
    assert rows.shape == (len(head) + T + len(tail), HP.num_codebooks + 1)
    assert rows.dtype == np.int64
    assert rows[:len(head), 0].tolist() == head and rows[len(head) + T:, 0].tolist() == tail
    sem = rows[len(head):len(head) + T]
    np.testing.assert_array_equal(sem[:, 0], HP.semantic_begin_id + codes[0])
    np.testing.assert_array_equal(sem[:, 1:], codes.T)
    assert not rows[:len(head), 1:].any() and not rows[len(head) + T:, 1:].any()
    prefix, rest = split_prompt(tok, text, transcript, codes, hparams=HP)
    assert len(prefix) == len(head) + T
    np.testing.assert_array_equal(np.vstack([prefix, rest]), rows)
    np.testing.assert_array_equal(voice_prefix(tok, transcript, codes, hparams=HP), prefix)
    other_prefix, _ = split_prompt(tok, "Something else entirely.", transcript, codes, hparams=HP)
    np.testing.assert_array_equal(other_prefix, prefix)  # the prefix is the voice's only


def test_speaker_tag_is_not_doubled(tok):
    codes = reference_codes()
    with_tag = build_prompt(tok, "Hi.", "<|speaker:1|>Hello.", codes, hparams=HP)
    assert tok.token_to_id("<|speaker:0|>") not in with_tag[:, 0]
    assert tok.token_to_id("<|speaker:1|>") in with_tag[:, 0]


def test_prompt_without_reference_is_spec7(tok):
    rows = build_prompt(tok, "Hi.", hparams=HP)
    e, nl = tok.encode, 198
    expected = (e("<|im_start|>system") + [nl] + e("convert the provided text to speech")
                + [tok.im_end_id, nl] + e("<|im_start|>user") + [nl] + e("Hi.")
                + [tok.im_end_id, nl] + e("<|im_start|>assistant") + [nl, tok.voice_id])
    assert rows[:, 0].tolist() == expected and not rows[:, 1:].any()
    prefix, rest = split_prompt(tok, "Hi.", hparams=HP)
    assert prefix[-1, 0] == nl and prefix[-2, 0] == tok.im_end_id


@pytest.mark.parametrize("kwargs,check", [
    (dict(text=""), "text"),
    (dict(text="   \n"), "text"),
    (dict(text=None), "text"),
    (dict(reference_codes=reference_codes()), "reference_text"),
    (dict(reference_text="", reference_codes=reference_codes()), "reference_text"),
    (dict(reference_text="Hi."), "reference_codes"),
    (dict(reference_text="Hi.", reference_codes=reference_codes().T), "reference_codes_shape"),
    (dict(reference_text="Hi.", reference_codes=reference_codes()[:, :0]),
     "reference_codes_shape"),
    (dict(reference_text="Hi.", reference_codes=reference_codes()[0]), "reference_codes_shape"),
    (dict(reference_text="Hi.", reference_codes=reference_codes()[:9]), "reference_codes_shape"),
    (dict(reference_text="Hi.", reference_codes=reference_codes().astype(float)),
     "reference_codes_dtype"),
    (dict(reference_text="Hi.", reference_codes=reference_codes() + HP.codebook_size),
     "reference_codes_range"),
    (dict(reference_text="Hi.", reference_codes=-reference_codes() - 1), "reference_codes_range"),
    (dict(tokenizer="not a tokenizer"), "tokenizer"),
    (dict(hparams=tiny_hparams()), "tokenizer_model"),
])
def test_prompt_errors_are_named(tok, kwargs, check):
    args = dict(tokenizer=tok, text="Hello.", hparams=HP)
    args.update(kwargs)
    with pytest.raises(InvalidInputError) as info:
        build_prompt(args.pop("tokenizer"), args.pop("text"), **args)
    assert info.value.check == check


def test_transposed_codes_get_a_hint(tok):
    with pytest.raises(InvalidInputError, match="transposed"):
        build_prompt(tok, "Hi.", "Hi.", reference_codes(T=12).T, hparams=HP)


def test_a_tokenizer_whose_ids_hit_the_semantic_range_is_refused():
    small = tiny_hparams()  # semantic ids 160..191: the BPE's own ids land there
    tok = Tokenizer.from_str(build_tokenizer_json(s2pro_hparams(1)))
    with pytest.raises(InvalidInputError) as info:
        build_prompt(tok, "Hello there, how are you today?", hparams=small)
    assert info.value.check == "tokenizer_model"
