"""Text to audio codes end to end: tokenizer, prompt, voice prefix, generation (`s2core speak`).

    result = speak(model, tokenizer, "Hello there.", voice="anna", voices_dir="voices")
    result.codes                  # [num_codebooks, frames] int32, fish-speech's codes.npy layout

    codec = s2core.load_codec("model.gguf")      # the codec stored in the same file
    result = speak(model, tokenizer, "Hello.", voice="anna", audio=AudioOut(codec))
    result.audio                  # float32 samples at codec.sample_rate, decoded as frames came

A reference voice comes as codes [num_codebooks, T] plus transcript, or as a saved voice
(`voice=`: a name in the voice directory or a path to an .s2voice file). With a saved voice the
prompt's voice prefix (SPEC 7) is restored from the K/V stored for this model file, and only
the text part is prefilled; when none is stored (or it was made by another model file, or for
other token rows) the prefix is prefilled once and stored for the next time. `save_voice=`
stores a reference as a voice (s2.cpp's .s2voice) with its prefix.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from s2core.contract import inputs
from s2core.errors import InvalidInputError, PrefixMismatchError
from s2core.generation.loop import (GenerationConfig, GenerationStats, audio_seconds, check_prompt,
                         stream)
from s2core.runtime.model import SlowARModel
from s2core.runtime.prefix import KVPrefix
from s2core.speak.audio_out import AudioOut, AudioStats, check_codec_fits
from s2core.text.prompt import check_reference, split_prompt
from s2core.text.tokenizer import Tokenizer
from s2core.voice.file import SAMPLE_RATE, Voice
from s2core.voice.library import VoiceLibrary, check_name


@dataclass
class VoiceReport:
    """What happened to the voice prefix."""

    source: str = "none"      # "none", "reference" (codes given, nothing saved), "saved voice"
    voice_path: Path | None = None
    saved_voice: Path | None = None
    prefix_path: Path | None = None
    #: "restored" (stored K/V written back), "computed" (prefilled now and stored), "" (none)
    prefix: str = ""
    why_computed: str = ""
    prefix_positions: int = 0
    prefix_compute_s: float = 0.0
    messages: list[str] = field(default_factory=list)


@dataclass
class SpeakResult:
    codes: np.ndarray                   # [num_codebooks, frames] int32
    stats: GenerationStats
    voice: VoiceReport
    prompt_positions: int
    prompt_build_s: float
    audio: np.ndarray | None = None     # float32 at audio_stats.sample_rate (with a codec)
    audio_stats: AudioStats | None = None

    @property
    def frames(self) -> int:
        return int(self.codes.shape[1])

    @property
    def audio_s(self) -> float:
        return audio_seconds(self.frames)


def speak(model: SlowARModel, tokenizer: Tokenizer, text: str, *,
          reference_codes: Any = None, reference_text: str | None = None,
          voice: str | Path | None = None, save_voice: str | None = None,
          voices_dir: str | Path | None = None, config: GenerationConfig | None = None,
          on_frame: Callable[[int, np.ndarray], Any] | None = None,
          audio: AudioOut | None = None,
          say: Callable[[str], None] = lambda msg: None) -> SpeakResult:
    """Generate codes for `text` (see the module docstring). `on_frame(i, codes)` is called
    after each frame (returning False stops); `audio` turns the frames into sound (as they
    come when it streams); `say` receives progress messages."""
    hp = model.hparams
    config = config or GenerationConfig(im_end_id=tokenizer.im_end_id)
    if config.im_end_id != tokenizer.im_end_id:
        raise InvalidInputError("im_end_id", f"config.im_end_id {config.im_end_id} is not the "
                                f"tokenizer's <|im_end|> ({tokenizer.im_end_id})")
    library = VoiceLibrary(voices_dir)
    report = VoiceReport()
    if voice is not None and (reference_codes is not None or reference_text is not None):
        raise InvalidInputError("voice_and_reference", "give either a saved voice or reference "
                                "codes with their transcript, not both")
    if save_voice is not None:
        check_name(save_voice)
    if audio is not None:
        check_codec_fits(audio.codec, hp)
    if voice is not None:
        loaded, report.voice_path = library.load(voice)
        loaded.check_fits(hp, str(report.voice_path))
        reference_codes, reference_text = loaded.codes, loaded.transcript
        report.source = "saved voice"
        say(f"voice: {report.voice_path} ({loaded.n_frames} frames, transcript "
            f"{_short(loaded.transcript)})")
    codes = check_reference(reference_text, reference_codes, hp)
    if codes is not None and report.source == "none":
        report.source = "reference"
    if save_voice is not None and codes is None:
        raise InvalidInputError("save_voice", "saving a voice needs reference codes and their "
                                "transcript (or a saved voice to copy)")

    t = time.perf_counter()
    prefix_rows, rest = split_prompt(tokenizer, text, reference_text, reference_codes,
                                     hparams=hp)
    prompt = np.vstack([prefix_rows, rest])
    build_s = time.perf_counter() - t
    check_prompt(model, prompt, config, None)  # every check before anything changes

    if save_voice is not None:
        report.saved_voice = library.save(save_voice, Voice(reference_text, codes.astype(np.int32),
                                                            SAMPLE_RATE, hp.codebook_size))
        report.voice_path = report.saved_voice
        say(f"voice saved: {report.saved_voice}")
    prefix = None
    if report.voice_path is not None:
        prefix = stored_or_computed_prefix(model, library, report, prefix_rows, say)

    stats = GenerationStats()
    frames = []
    if audio is not None:
        audio.start()
    it = stream(model, prompt, config, prefix, stats)
    try:
        for frame in it:
            frames.append(frame)
            if audio is not None:
                audio.frame(frame)
            if on_frame is not None and on_frame(len(frames) - 1, frame) is False:
                break
    finally:
        it.close()
    out = (np.stack(frames, axis=1) if frames else np.zeros((hp.num_codebooks, 0), np.int64))
    codes = out.astype(np.int32)
    result = SpeakResult(codes, stats, report, len(prompt), build_s)
    if audio is not None:
        result.audio, result.audio_stats = audio.finish(codes), audio.stats
    return result


def stored_or_computed_prefix(model: SlowARModel, library: VoiceLibrary, report: VoiceReport,
                              rows: np.ndarray, say: Callable[[str], None] = lambda msg: None
                              ) -> KVPrefix:
    """The voice prefix of `report.voice_path`: the stored one when it fits this model and
    these rows; else prefilled now (with the model's own single-sequence cache, so nothing
    else may use the model meanwhile) and stored for the next time."""
    dtype = model.capabilities.kv_cache_dtype
    report.prefix_path = library.prefix_path(report.voice_path, model.identity, dtype)
    report.prefix_positions = len(rows)
    stored, why = library.load_prefix(report.voice_path, model.identity, dtype)
    if stored is not None:
        try:
            model.check_prefix(stored, len(rows))
            if not np.array_equal(stored.tokens, inputs.canonical_rows(rows, model.hparams)):
                raise PrefixMismatchError("prefix_tokens", "its token rows differ from this "
                                          "voice's prompt (another tokenizer?)")
            report.prefix = "restored"
            say(f"voice prefix: restoring {len(rows)} positions from {report.prefix_path}")
            return stored
        except PrefixMismatchError as exc:
            why = f"the stored prefix does not fit: {exc}"
    report.prefix, report.why_computed = "computed", why
    say(f"voice prefix: computing {len(rows)} positions ({why})")
    t = time.perf_counter()
    model.init_kv_cache(len(rows))
    try:
        model.prefill(rows)
        prefix = model.save_prefix()
    finally:
        model.clear_kv_cache()
    report.prefix_compute_s = time.perf_counter() - t
    library.save_prefix(report.voice_path, prefix)
    say(f"voice prefix: stored {report.prefix_path} for the next time")
    return prefix


def _short(text: str, n: int = 48) -> str:
    return repr(text if len(text) <= n else text[:n - 3] + "...")
