"""s2.cpp's prompt (SPEC 7): text and an optional reference voice as token rows.

    rows = build_prompt(tok, "Hello.", reference_text="...", reference_codes=codes)
    prefix, rest = split_prompt(tok, "Hello.", reference_text="...", reference_codes=codes)

Rows are (n, num_codebooks + 1) int64: row 0 a text or semantic id, then the codes (0 at text
positions). `reference_codes` is [num_codebooks, T] (the layout s2.cpp and fish-speech store).

The voice prefix is everything that does not depend on the text: with a reference voice, up to
and including its codes; without one, the system turn. It is the same for every sentence in one
voice, so its K/V can be computed once (s2core.runtime.prefix) and restored for each sentence.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from s2core.errors import InvalidInputError
from s2core.modelfile.hparams import Hparams
from s2core.text.tokenizer import NEWLINE_ID, Tokenizer

SYSTEM_WITH_REFERENCE = "convert the provided text to speech reference to the following:\n\nText:\n"
SYSTEM_PLAIN = "convert the provided text to speech"
SPEECH_HEADER = "\n\nSpeech:\n"
SPEAKER_TAG = "<|speaker:0|>"


def build_prompt(tokenizer: Tokenizer, text: str, reference_text: str | None = None,
                 reference_codes: Any = None, *, hparams: Hparams | None = None) -> np.ndarray:
    """The whole prompt, (n, num_codebooks + 1) int64, exactly SPEC 7.

    `hparams`: the model's (its semantic_begin_id, num_codebooks, codebook_size, vocab_size);
    default S2 Pro's."""
    prefix, rest = split_prompt(tokenizer, text, reference_text, reference_codes,
                                hparams=hparams)
    return np.vstack([prefix, rest])


def split_prompt(tokenizer: Tokenizer, text: str, reference_text: str | None = None,
                 reference_codes: Any = None, *, hparams: Hparams | None = None
                 ) -> tuple[np.ndarray, np.ndarray]:
    """(voice prefix, rest): the prompt cut where the text-dependent part begins."""
    hp = Hparams() if hparams is None else hparams
    _check_tokenizer(tokenizer, hp)
    if not isinstance(text, str) or not text.strip():
        raise InvalidInputError("text", f"the text to speak must be a non-empty string, got "
                                f"{text!r}")
    prefix = voice_prefix(tokenizer, reference_text, reference_codes, hparams=hp)
    tok, nl = tokenizer, NEWLINE_ID
    if reference_codes is None:
        ids = tok.encode("<|im_start|>user") + [nl]
    else:
        ids = [tok.im_end_id, nl] + tok.encode("<|im_start|>user") + [nl]
    ids += tok.encode(text) + [tok.im_end_id, nl] + tok.encode("<|im_start|>assistant") \
        + [nl, tok.voice_id]
    return prefix, _text_rows(ids, hp, "text")


def voice_prefix(tokenizer: Tokenizer, reference_text: str | None = None,
                 reference_codes: Any = None, *, hparams: Hparams | None = None) -> np.ndarray:
    """The prompt's text-independent head: with a reference voice, the system turn up to and
    including the reference codes; without one, the system turn."""
    hp = Hparams() if hparams is None else hparams
    _check_tokenizer(tokenizer, hp)
    tok, nl = tokenizer, NEWLINE_ID
    codes = check_reference(reference_text, reference_codes, hp)
    if codes is None:
        ids = tok.encode("<|im_start|>system") + [nl] + tok.encode(SYSTEM_PLAIN) \
            + [tok.im_end_id, nl]
        return _text_rows(ids, hp, "system prompt")
    ids = tok.encode("<|im_start|>system") + [nl] + tok.encode(SYSTEM_WITH_REFERENCE)
    if "<|speaker:" not in reference_text:
        ids += tok.encode(SPEAKER_TAG)
    ids += tok.encode(reference_text) + tok.encode(SPEECH_HEADER)
    semantic = np.empty((codes.shape[1], hp.row_width), dtype=np.int64)
    semantic[:, 0] = hp.semantic_begin_id + codes[0]
    semantic[:, 1:] = codes.T
    return np.vstack([_text_rows(ids, hp, "reference transcript"), semantic])


def check_reference(reference_text: Any, reference_codes: Any, hp: Hparams) -> np.ndarray | None:
    """Reference codes as an int64 [num_codebooks, T] array (None without a reference).
    Codes and transcript come together: s2.cpp silently drops codes without a transcript;
    here that is an error, as is anything the model could not read."""
    if reference_codes is None and reference_text is None:
        return None
    if reference_codes is None:
        raise InvalidInputError("reference_codes", "a reference transcript was given without "
                                "reference codes ([num_codebooks, T] integers)")
    if not isinstance(reference_text, str) or not reference_text.strip():
        raise InvalidInputError("reference_text", "reference codes need their transcript (a "
                                f"non-empty string), got {reference_text!r}")
    try:
        codes = np.asarray(reference_codes)
    except (ValueError, TypeError, OverflowError) as exc:  # a ragged list, say
        raise InvalidInputError("reference_codes_shape", f"reference codes must be a "
                                f"rectangular [num_codebooks, T] array: {exc}") from None
    if codes.dtype.kind not in "iu":
        raise InvalidInputError("reference_codes_dtype", f"reference codes must be integers, "
                                f"got dtype {codes.dtype}")
    if codes.ndim != 2 or codes.shape[0] != hp.num_codebooks or codes.shape[1] == 0:
        hint = (" (it looks transposed: the layout is [num_codebooks, T])"
                if codes.ndim == 2 and codes.shape[1] == hp.num_codebooks else "")
        raise InvalidInputError("reference_codes_shape", f"reference codes must have shape "
                                f"[num_codebooks={hp.num_codebooks}, T >= 1], got "
                                f"{codes.shape}{hint}")
    bad = (codes < 0) | (codes >= hp.codebook_size)
    if bad.any():
        cb, t = (int(x[0]) for x in np.nonzero(bad))
        raise InvalidInputError("reference_codes_range", f"reference code [{cb}, {t}] is "
                                f"{int(codes[cb, t])}, outside [0, codebook_size="
                                f"{hp.codebook_size}) ({int(bad.sum())} such codes)")
    return codes.astype(np.int64)


def _check_tokenizer(tokenizer: Any, hp: Hparams) -> None:
    if not isinstance(tokenizer, Tokenizer):
        raise InvalidInputError("tokenizer", f"expected an s2core.Tokenizer "
                                f"(Tokenizer.from_file), got {type(tokenizer).__name__}")
    sem0 = tokenizer.semantic_begin_id
    if sem0 is not None and sem0 != hp.semantic_begin_id:
        raise InvalidInputError("tokenizer_model", f"the tokenizer's <|semantic:0|> is id "
                                f"{sem0} but the model's semantic_begin_id is "
                                f"{hp.semantic_begin_id}: tokenizer and model do not belong "
                                "together")


def _text_rows(ids: list[int], hp: Hparams, what: str) -> np.ndarray:
    arr = np.asarray(ids, dtype=np.int64)
    bad = (arr >= hp.vocab_size) | ((arr >= hp.semantic_begin_id) & (arr <= hp.semantic_end_id))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        reads = "a semantic token" if arr[i] < hp.vocab_size else "outside its vocab"
        raise InvalidInputError("tokenizer_model", f"the {what} encodes to id {int(arr[i])}, "
                                f"which the model reads as {reads} (vocab {hp.vocab_size}, "
                                f"semantic ids {hp.semantic_begin_id}..{hp.semantic_end_id}): "
                                "tokenizer and model do not belong together")
    rows = np.zeros((len(arr), hp.row_width), dtype=np.int64)
    rows[:, 0] = arr
    return rows
