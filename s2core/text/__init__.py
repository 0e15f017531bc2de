"""Text to token rows: the tokenizer (tokenizer.json through the `tokenizers` package) and
s2.cpp's prompt (SPEC 7)."""

from s2core.text.tokenizer import Tokenizer

__all__ = ["Tokenizer"]
