"""The embedded tokenizer: a small byte-level BPE in the shape of S2 Pro's Qwen3 tokenizer,
built by the package with `tokenizers` (a real tokenizer.json cannot be downloaded here).

Like Qwen3's: NFC normalization, Qwen's pre-tokenizer regex (words, single digits,
punctuation runs, newlines), GPT-2's byte-level alphabet as ids 0..255 in its order (so "\\n"
is id 198, which s2.cpp's prompt hard-codes), merges learned on an embedded English text, then
the special tokens (<|endoftext|>, <|im_start|>, <|im_end|>, <|voice|>, <|speaker:N|>),
reserved fillers, and <|semantic:i|> at the model's semantic ids when they fit.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from s2core.fileio import atomic_output
from s2core.modelfile.hparams import Hparams
from s2core.embedded.cache import cache_dir
from s2core.embedded.corpus import CORPUS

#: bump when the builder's output for the same arguments changes
BUILDER_VERSION = 1
#: Qwen2/Qwen3's pre-tokenizer pattern (tokenizer.json's Split)
QWEN_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|voice|>"] + \
    [f"<|speaker:{i}|>" for i in range(4)]


def build_tokenizer_json(hp: Hparams, bpe_vocab: int = 1024, text: str = CORPUS,
                         specials: list[str] | None = None,
                         semantic_tokens: bool | None = None) -> str:
    """tokenizer.json text for a model of hparams `hp`.

    Special tokens follow the BPE vocabulary; <|semantic:i|> tokens are placed at
    hp.semantic_begin_id.. (padded with reserved tokens) when `semantic_tokens` is True, or
    None and the padding is small (the demo model); else they are left out (an S2 Pro-sized
    vocabulary would need 150k fillers). Every id stays outside the semantic range."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=bpe_vocab, show_progress=False, special_tokens=[],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(text.splitlines(keepends=True), trainer)
    spec = json.loads(tok.to_str())
    n_bpe = len(spec["model"]["vocab"])
    names = list(SPECIALS if specials is None else specials)
    n_semantic = hp.semantic_end_id - hp.semantic_begin_id + 1
    padding = hp.semantic_begin_id - n_bpe - len(names)
    if semantic_tokens is None:
        semantic_tokens = 0 <= padding <= 8192
    if semantic_tokens:
        if padding < 0:
            raise ValueError(f"{n_bpe} BPE tokens and {len(names)} specials do not fit below "
                             f"semantic_begin_id {hp.semantic_begin_id}")
        names += [f"<|reserved:{i}|>" for i in range(padding)]
        names += [f"<|semantic:{i}|>" for i in range(n_semantic)]
    elif n_bpe + len(names) > hp.semantic_begin_id:
        raise ValueError(f"the tokenizer's {n_bpe + len(names)} ids reach the semantic range")
    spec["added_tokens"] = [
        {"id": n_bpe + i, "content": c, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": True} for i, c in enumerate(names)]
    return json.dumps(spec, ensure_ascii=False)


def tokenizer_path(hp: Hparams, directory: Path | None = None, stem: str = "tokenizer") -> Path:
    """Where the cache keeps the tokenizer.json for a model of hparams `hp`."""
    key = json.dumps({"sem": [hp.semantic_begin_id, hp.semantic_end_id], "builder":
                      BUILDER_VERSION, "text": hashlib.sha256(CORPUS.encode()).hexdigest()})
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    return (directory or cache_dir()) / f"{stem}-{digest}.json"


def cached_tokenizer(hp: Hparams, directory: Path | None = None, stem: str = "tokenizer") -> Path:
    """Path of the embedded tokenizer.json for `hp`, built first if the cache lacks it (built
    once and kept, so its ids stay the same for voices saved with it)."""
    path = tokenizer_path(hp, directory, stem)
    if not path.exists():
        with atomic_output(path, what="tokenizer") as f:  # a unique temporary name
            f.write(build_tokenizer_json(hp).encode("utf-8"))
    return path
