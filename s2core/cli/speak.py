"""`s2core speak`: its arguments, its progress line and its timing report around the library
function `s2core.speak.speak`."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from s2core.errors import InvalidInputError
from s2core.generation.loop import audio_seconds
from s2core.codec.audio import AudioLimits, WavWriter, probe_audio, write_wav
from s2core.codec.codes_file import read_codes, write_codes
from s2core.fileio import check_output
from s2core.generation.loop import GenerationConfig
from s2core.speak.audio_out import AudioOut, check_codec_fits, reference_codes_from_audio
from s2core.speak.pipeline import SpeakResult, speak
from s2core.text.tokenizer import MAX_TEXT_CHARS, Tokenizer
from s2core.cli.codec import positive_float, positive_int
from s2core.cli.compile_time import compile_time
from s2core.voice.library import VoiceLibrary

#: the longest reference codes file read: 5 minutes at 21.5 frames a second
MAX_REFERENCE_FRAMES = 6_500


def reference_from_npy(path: str | Path) -> np.ndarray:
    """fish-speech's reference codes file: an .npy of integers [num_codebooks, T], its shape
    checked from the header before the body is read."""
    return read_codes(path, MAX_REFERENCE_FRAMES, "reference_codes_file")


# ---------------------------------------------------------------------- progress and report
class FrameProgress:
    """Frames, frames/s and seconds of audio while generating: a live line on a terminal,
    a line every few seconds in a log."""

    def __init__(self, stream: TextIO | None = None, every_s: float = 5.0):
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.every_s = every_s
        self.start = time.perf_counter()
        self.last = self.start
        self.frames = 0

    def __call__(self, i: int, codes: np.ndarray) -> None:
        self.frames = i + 1
        now = time.perf_counter()
        if self.tty or now - self.last >= self.every_s:
            self.last = now
            self.stream.write(("\r" if self.tty else "") + self.line(now) + ("" if self.tty
                                                                             else "\n"))
            self.stream.flush()

    def line(self, now: float | None = None) -> str:
        elapsed = (now or time.perf_counter()) - self.start
        rate = self.frames / elapsed if elapsed > 0 else 0.0
        return (f"generating: {self.frames} frames, {rate:.1f} frames/s, "
                f"{audio_seconds(self.frames):.1f} s of audio")

    def close(self) -> None:
        if self.tty and self.frames:
            self.stream.write("\n")
            self.stream.flush()


def report_lines(result: SpeakResult, load_s: float | None = None,
                 tokenizer_s: float | None = None, codec_load_s: float | None = None,
                 encode_s: float | None = None, compile_s: float = 0.0) -> list[str]:
    """The timing table printed at the end of `s2core speak` and `s2core demo`."""
    s, v, a = result.stats, result.voice, result.audio_stats
    lines = [f"{'phase':<22}{'seconds':>9}  notes"]

    def row(name: str, seconds: float | None, note: str = "") -> None:
        lines.append(f"{name:<22}{'' if seconds is None else f'{seconds:9.3f}':>9}  {note}")

    if tokenizer_s is not None:
        row("tokenizer", tokenizer_s)
    if load_s is not None:
        row("model load", load_s)
    if codec_load_s is not None:
        row("codec load", codec_load_s)
    if encode_s is not None:
        row("reference encode", encode_s, "the reference recording to codes")
    row("prompt", result.prompt_build_s, f"{result.prompt_positions} positions")
    if v.prefix == "computed":
        row("voice prefix", v.prefix_compute_s, f"{v.prefix_positions} positions prefilled "
            f"and stored ({v.why_computed})")
    if s.restored_positions:
        how = "recomputed by the backend" if s.prefix_recomputed else "restored"
        row("prefix restore", s.restore_s, f"{s.restored_positions} positions {how}")
    rate = s.prefilled_positions / s.prefill_s if s.prefill_s > 0 else 0.0
    row("prefill", s.prefill_s, f"{s.prefilled_positions} positions ({rate:.0f}/s)")
    row("first frame", s.first_frame_s, "from the start of generation")
    # a streaming decode runs between the frames: its time is the audio's, not generation's
    streamed_s = a.decode_s if a is not None and a.mode == "streamed" else 0.0
    gen_s = s.total_s - s.restore_s - s.prefill_s - streamed_s
    fps = s.frames / gen_s if gen_s > 0 else 0.0
    audio = audio_seconds(s.frames)
    codes_s = s.total_s - streamed_s
    row("generation", gen_s, f"{s.frames} frames, {fps:.1f} frames/s, {audio:.2f} s of audio"
        + (f" ({audio / codes_s:.2f}x real time)" if codes_s > 0 and s.frames else ""))
    if s.step_s:
        row("  step (Slow-AR)", float(np.sum(s.step_s)),
            f"median {np.median(s.step_s) * 1e3:.1f} ms")
    if s.fast_decode_s:
        row("  Fast-AR codes", float(np.sum(s.fast_decode_s)),
            f"median {np.median(s.fast_decode_s) * 1e3:.1f} ms a frame")
    row("  sampling", s.sample_s, "main tokens")
    if a is not None:
        rate = a.audio_s / a.decode_s if a.decode_s > 0 else 0.0
        how = (f"frame by frame, median {np.median(a.chunks) * 1e3:.1f} ms a frame"
               if a.mode == "streamed" and a.chunks else "one shot after generation")
        row("audio decode", a.decode_s, f"{a.audio_s:.2f} s of audio at {a.sample_rate} Hz, "
            f"{how} ({rate:.1f} s of audio a second)")
        if a.first_audio_s is not None:
            row("first audio", a.first_audio_s, "from the start of generation")
    total = s.total_s + (a.decode_s - streamed_s if a is not None else 0.0)
    row("total", total, f"stopped by {s.stopped_by}")
    if compile_s > 0:
        row("  numba compiling", compile_s, "once, inside the phases above: the kernels stay "
            "in numba's disk cache for later runs")
    return lines


# ---------------------------------------------------------------------- the command
def run_command(args: Any, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """`s2core speak` (arguments wired in s2core.cli)."""
    import s2core
    # the streams of the moment of the call, not of the import (pytest swaps them per test)
    out = sys.stdout if out is None else out
    err = sys.stderr if err is None else err

    def say(msg: str) -> None:
        print(msg, file=err, flush=True)

    _check_outputs(args)
    wav_path, codes_path = _output_paths(args)
    audio_limits = AudioLimits(max_seconds=args.max_reference_seconds)
    if args.reference_audio is not None:  # a bad recording is refused before any loading
        probe_audio(args.reference_audio, audio_limits)
    reference = None if args.reference_codes is None else reference_from_npy(args.reference_codes)
    t = time.perf_counter()
    tokenizer = Tokenizer.from_file(args.tokenizer)
    tokenizer.max_text_chars = args.max_text_chars
    tokenizer_s = time.perf_counter() - t
    config = GenerationConfig(
        max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p,
        top_k=args.top_k, min_tokens_before_end=args.min_tokens_before_end, seed=args.seed,
        im_end_id=tokenizer.im_end_id)
    options = {} if args.kv_cache_dtype is None else {"kv_cache_dtype": args.kv_cache_dtype}
    with compile_time() as compiling:  # the table names a first run's compiling
        t = time.perf_counter()
        model = s2core.load(args.model, backend=args.backend, **options)
        load_s = time.perf_counter() - t
        caps = model.capabilities
        print(f"backend      {model.backend.name} on {caps.device} (compute {caps.compute_dtype}, "
              f"KV cache {caps.kv_cache_dtype})", file=out)
        codec = wav = None
        codec_load_s = encode_s = None
        progress = FrameProgress(err)
        try:
            if args.wav is not None or args.reference_audio is not None:
                t = time.perf_counter()
                codec = s2core.load_codec(args.codec or args.model, backend=args.codec_backend)
                codec_load_s = time.perf_counter() - t
                check_codec_fits(codec, model.hparams)
                print(f"codec        {codec.backend_name}, {codec.sample_rate} Hz, "
                      f"{codec.samples_per_frame} samples a frame, from {codec.codec_file.path}",
                      file=out)
            if args.reference_audio is not None:
                t = time.perf_counter()
                reference = reference_codes_from_audio(codec, args.reference_audio, audio_limits)
                encode_s = time.perf_counter() - t
                say(f"reference audio: {args.reference_audio} -> codes {list(reference.shape)}")
            audio = None
            if args.wav is not None:
                if args.stream:
                    wav = WavWriter(wav_path, codec.sample_rate)
                audio = AudioOut(codec, stream=args.stream,
                                 on_audio=None if wav is None else wav.write)
            result = speak(model, tokenizer, args.text, reference_codes=reference,
                           reference_text=args.reference_text, voice=args.voice,
                           save_voice=args.save_voice, voices_dir=args.voices_dir, config=config,
                           on_frame=progress, audio=audio, say=say)
        finally:
            progress.close()
            if wav is not None:
                wav.close()  # a complete WAV of what was made, even after Ctrl-C
            if codec is not None:
                codec.close()
            model.close()
    if wav_path is not None and wav is None:
        write_wav(wav_path, result.audio, codec.sample_rate)
    for line in report_lines(result, load_s, tokenizer_s, codec_load_s, encode_s,
                             compiling.seconds):
        print(line, file=out)
    if codes_path is not None:
        write_codes(codes_path, result.codes)
        print(f"wrote        {codes_path}: codes {list(result.codes.shape)} int32 "
              f"([num_codebooks, frames], {result.audio_s:.2f} s of audio)", file=out)
    if wav_path is not None:
        how = "written as frames came" if args.stream else "decoded after generation"
        print(f"wrote        {wav_path}: {len(result.audio) / result.audio_stats.sample_rate:.2f}"
              f" s, {result.audio_stats.sample_rate} Hz mono PCM16 ({how})", file=out)
    return 0


def _check_outputs(args: Any) -> None:
    """Option combinations, refused before anything is loaded."""
    if args.stream and args.wav is None:
        raise InvalidInputError("stream", "--stream writes the WAV as frames come: give --wav")
    if args.reference_audio is not None and args.reference_codes is not None:
        raise InvalidInputError("reference", "give --reference-codes or --reference-audio, "
                                "not both")
    if args.reference_audio is not None and args.voice is not None:
        raise InvalidInputError("voice_and_reference", "give either a saved voice or a "
                                "reference recording with its transcript, not both")
    if args.reference_audio is not None and args.reference_text is None:
        raise InvalidInputError("reference_text", "--reference-audio needs --reference-text "
                                "(its transcript)")


def _output_paths(args: Any) -> tuple[Path | None, Path | None]:
    """(WAV, codes .npy) paths, each refused before any work when it cannot be a file or is
    one of the command's inputs (the model, codec, tokenizer, reference, voice files)."""
    inputs = [args.model, args.codec, args.tokenizer, args.reference_codes, args.reference_audio]
    if args.voice is not None:
        library = VoiceLibrary(args.voices_dir)
        inputs.append(library.path_of(args.voice))
    def fail(message: str, check: str) -> InvalidInputError:
        return InvalidInputError(check, message)
    wav = None if args.wav is None else check_output(args.wav, inputs, fail, "--wav")
    codes = None
    if args.out is not None or args.wav is None:
        codes = check_output("codes.npy" if args.out is None else args.out, inputs + [args.wav],
                             fail, "--out")
        if wav is not None and Path(os.path.abspath(codes)) == Path(os.path.abspath(wav)):
            raise InvalidInputError("output_is_input", f"--out and --wav are both {wav}")
    return wav, codes


def add_arguments(p: Any) -> None:
    """The `s2core speak` options (s2.cpp's names where it has them)."""
    p.add_argument("model", help="GGUF model file (s2.cpp's)")
    p.add_argument("--tokenizer", required=True, help="the model's tokenizer.json")
    p.add_argument("--text", required=True, help="text to speak")
    p.add_argument("--reference-codes", metavar="NPY",
                   help="reference voice codes: .npy integers [num_codebooks, T] (fish-speech's)")
    p.add_argument("--reference-audio", metavar="WAV",
                   help="reference voice as a recording (any rate; encoded by the codec)")
    p.add_argument("--reference-text", help="transcript of the reference voice")
    p.add_argument("--voice", metavar="NAME|PATH",
                   help="a saved voice: NAME in --voices-dir, or a path to an .s2voice file")
    p.add_argument("--save-voice", metavar="NAME",
                   help="store the reference as voice NAME (.s2voice + its KV prefix)")
    p.add_argument("--voices-dir", metavar="DIR",
                   help="voice directory (default $S2CORE_VOICES, else ./voices as s2.cpp)")
    g = GenerationConfig()
    p.add_argument("--max-new-tokens", type=int, default=g.max_new_tokens)
    p.add_argument("--temperature", type=float, default=g.temperature)
    p.add_argument("--top-p", type=float, default=g.top_p)
    p.add_argument("--top-k", type=int, default=g.top_k)
    p.add_argument("--min-tokens-before-end", type=int, default=g.min_tokens_before_end)
    p.add_argument("--seed", type=int, default=None, help="default: fresh randomness (s2.cpp)")
    p.add_argument("--backend", default=None, help="backend name (default: auto)")
    p.add_argument("--kv-cache-dtype", default=None, help="KV cache type (default: the "
                   "backend's, f16 as s2.cpp)")
    p.add_argument("--wav", metavar="WAV", help="write the speech: 44.1 kHz mono 16-bit PCM")
    p.add_argument("--stream", action="store_true",
                   help="decode each frame as it is generated and grow the WAV as it goes "
                        "(reports the time to the first audio)")
    p.add_argument("--codec", metavar="GGUF",
                   help="the codec's file (default: the model file, which carries it)")
    p.add_argument("--codec-backend", default=None, help="codec backend (default: auto)")
    p.add_argument("--max-text-chars", type=positive_int, default=MAX_TEXT_CHARS,
                   help=f"refuse longer texts and transcripts (default {MAX_TEXT_CHARS})")
    p.add_argument("--max-reference-seconds", type=positive_float, default=60.0,
                   help="refuse longer reference recordings, checked from the header "
                        "(default 60)")
    p.add_argument("--out", default=None,
                   help="output .npy: codes [num_codebooks, frames] int32 (default codes.npy "
                        "when no --wav is given)")
