"""S2 Pro's tokenizer: the model's tokenizer.json (a Qwen3 byte-level BPE) on the `tokenizers`
package, with s2.cpp's handling of special tokens.

    tok = s2core.Tokenizer.from_file("tokenizer.json")
    tok.encode("<|im_start|>user")       # [im_start_id, ...ids of "user"]

`encode` first matches the special added tokens (`"special": true` in `added_tokens`)
literally in the text, as s2.cpp does (leftmost first; at one position the longest), and
BPE-encodes the text between them with the tokenizer.json's own pre-tokenizer and merges.
s2.cpp splits that text at whitespace only; the tokenizer.json (Qwen's) also splits off
punctuation and single digits, which is what the model was trained with (fish-speech encodes
with the same tokenizer), so a few texts with digits or punctuation encode differently from
s2.cpp.

`tokenizers` is imported when a tokenizer is loaded, not with s2core.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterable

from s2core.errors import InvalidInputError, TokenizerError
from s2core.fileio import read_bounded

#: the longest text (characters) a prompt's text or transcript may have: ~20 minutes of speech,
#: far more than one synthesis's context holds, refused in microseconds
MAX_TEXT_CHARS = 20_000
#: the largest tokenizer.json read (S2 Pro's is ~11 MB)
MAX_TOKENIZER_BYTES = 64 << 20
#: the special tokens SPEC 7's prompt needs, by name
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
VOICE = "<|voice|>"
REQUIRED_SPECIALS = (IM_START, IM_END, VOICE)
#: s2.cpp's build_prompt writes the newline as this id (Qwen3's "\n", GPT-2's byte 10)
NEWLINE_ID = 198
#: S2 Pro's first semantic token, when the tokenizer has them
SEMANTIC_0 = "<|semantic:0|>"


class Tokenizer:
    """A loaded tokenizer.json with the ids of the special tokens the prompt uses."""

    #: the longest text encode() takes (characters), checked before any work
    max_text_chars: int = MAX_TEXT_CHARS

    def __init__(self, hf_tokenizer: Any, source: str = "<memory>"):
        """`hf_tokenizer`: a `tokenizers.Tokenizer`. Use from_file / from_str."""
        self._tok = hf_tokenizer
        self.source = source
        added = hf_tokenizer.get_added_tokens_decoder()  # id -> AddedToken
        self.special_tokens: dict[str, int] = {t.content: int(i) for i, t in added.items()
                                               if t.special and t.content}
        missing = [s for s in REQUIRED_SPECIALS if s not in self.special_tokens]
        if missing:
            raise TokenizerError(
                f"{source}: the tokenizer lacks the special token(s) {', '.join(missing)} "
                f"that S2 Pro's prompt uses (SPEC 7); is this S2 Pro's tokenizer.json? "
                f"It has {len(self.special_tokens)} special tokens")
        newline = hf_tokenizer.encode("\n", add_special_tokens=False).ids
        if newline != [NEWLINE_ID]:
            raise TokenizerError(
                f'{source}: "\\n" encodes to {newline}, but s2.cpp\'s prompt writes the newline '
                f"as id {NEWLINE_ID} (Qwen3's); this is not a Qwen3-style byte-level BPE")
        # s2.cpp's order: longer specials first, so at one position the longest matches
        self._specials = sorted(self.special_tokens.items(), key=lambda kv: -len(kv[0]))
        self._first_chars = {content[0] for content in self.special_tokens}

    # ------------------------------------------------------------------ loading
    @classmethod
    def from_file(cls, path: str | os.PathLike, max_bytes: int = MAX_TOKENIZER_BYTES
                  ) -> "Tokenizer":
        """Load a tokenizer.json: a regular file of at most `max_bytes`."""
        path = Path(path)
        data = read_bounded(path, max_bytes, _error, "tokenizer file")
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise TokenizerError(f"{path}: cannot read it as UTF-8 text: {exc}",
                                 "utf8") from exc
        return cls.from_str(text, source=str(path))

    @classmethod
    def from_str(cls, json_text: str, source: str = "<string>") -> "Tokenizer":
        from tokenizers import Tokenizer as HFTokenizer
        try:
            tok = HFTokenizer.from_str(json_text)
        except Exception as exc:  # the Rust side raises plain Exception subclasses
            raise TokenizerError(f"{source}: not a tokenizer.json the `tokenizers` package "
                                 f"reads: {exc}") from exc
        return cls(tok, source)

    def to_str(self) -> str:
        """The tokenizer.json text."""
        return self._tok.to_str()

    # ------------------------------------------------------------------ ids
    @property
    def im_start_id(self) -> int:
        return self.special_tokens[IM_START]

    @property
    def im_end_id(self) -> int:
        return self.special_tokens[IM_END]

    @property
    def voice_id(self) -> int:
        return self.special_tokens[VOICE]

    @property
    def newline_id(self) -> int:
        return NEWLINE_ID

    @property
    def semantic_begin_id(self) -> int | None:
        """Id of <|semantic:0|> when the tokenizer has the semantic tokens (S2 Pro's does)."""
        return self.token_to_id(SEMANTIC_0)

    @property
    def vocab_size(self) -> int:
        """One more than the largest id, added tokens included."""
        return int(self._tok.get_vocab_size(with_added_tokens=True))

    def token_to_id(self, token: str) -> int | None:
        i = self._tok.token_to_id(token)
        return None if i is None else int(i)

    # ------------------------------------------------------------------ text
    def encode(self, text: str) -> list[int]:
        """Token ids of `text`: special tokens matched literally first, the rest BPE."""
        if not isinstance(text, str):
            raise TokenizerError(f"encode() takes a str, got {type(text).__name__}")
        check_text(text, self.max_text_chars)
        ids: list[int] = []
        pos = 0
        for start, end, token_id in self._special_matches(text):
            if start > pos:
                ids += self._bpe(text[pos:start])
            ids.append(token_id)
            pos = end
        if pos < len(text):
            ids += self._bpe(text[pos:])
        return ids

    def decode(self, ids: Iterable[int]) -> str:
        """The text of `ids`, special tokens included."""
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=False)

    def _bpe(self, segment: str) -> list[int]:
        return list(self._tok.encode(segment, add_special_tokens=False).ids)

    def _special_matches(self, text: str) -> list[tuple[int, int, int]]:
        """s2.cpp's split_on_specials: every occurrence of every special token, sorted by
        position (longer first at one position), keeping those that do not overlap an
        earlier kept one. A cheap test skips the search when no special can occur."""
        if not any(c in text for c in self._first_chars):
            return []
        found = []
        for content, token_id in self._specials:
            start = text.find(content)
            while start != -1:
                found.append((start, -len(content), token_id))
                start = text.find(content, start + len(content))
        found.sort()
        kept, last_end = [], 0
        for start, neg_len, token_id in found:
            if start >= last_end:
                kept.append((start, start - neg_len, token_id))
                last_end = start - neg_len
        return kept

    def __repr__(self) -> str:
        return (f"Tokenizer({self.source!r}, vocab_size={self.vocab_size}, "
                f"special_tokens={len(self.special_tokens)})")


def check_text(text: str, max_chars: int = MAX_TEXT_CHARS, what: str = "text") -> None:
    """A text to speak or transcribe: at most `max_chars` characters (`text_length`) and valid
    Unicode, no lone surrogate (`text_unicode`), checked before any tokenizing."""
    if len(text) > max_chars:
        raise InvalidInputError("text_length", f"the {what} has {len(text)} characters, more "
                                f"than the {max_chars} allowed (Tokenizer.max_text_chars)")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidInputError("text_unicode", f"the {what} is not valid Unicode: "
                                f"{exc.reason} at character {exc.start}") from None


def _error(message: str, check: str) -> TokenizerError:
    return TokenizerError(message, check)
