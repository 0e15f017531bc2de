"""`s2core demo`: `s2core speak --wav --stream` on the embedded default model, with the time of
each phase.

Writes a small S2 Pro-structured model (carrying a small codec, as s2.cpp's files carry
theirs) and its tokenizer into the cache directory (once), loads the model and its codec on
the auto-selected backends and speaks a sentence in the demo's reference voice, decoding each
frame to audio as it comes into a growing WAV: the first run saves that voice (s2.cpp's
.s2voice, in the cache's voices/) with its KV prefix, later runs restore the prefix and
prefill only the text. Frames are sampled with s2.cpp's settings, seeded, and
min_tokens_before_end = --steps so every run makes that many. The weights are random, so the
WAV is noise-like sound, not speech: the demo shows the path, a real GGUF gives the voice.

`--export DIR` writes the model, tokenizer.json and the reference voice (.npy codes, their
audio as a WAV, the transcript) into DIR for trying `s2core speak` by hand, and prints the
commands.
"""

from __future__ import annotations

import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

import s2core

from s2core.codec.audio import WavWriter, write_wav
from s2core.codec.codes_file import write_codes
from s2core.embedded.cache import cache_dir
from s2core.embedded.default import (DEFAULT_REFERENCE_FRAMES, DEFAULT_TRANSCRIPT,
                                     default_model_files, default_model_is_cached,
                                     default_reference)
from s2core.embedded.writer import demo_hparams
from s2core.generation.loop import GenerationConfig
from s2core.cli.progress import Progress
from s2core.cli.compile_time import compile_time
from s2core.cli.speak import FrameProgress, report_lines
from s2core.speak.pipeline import SpeakResult, speak
from s2core.speak.audio_out import AudioOut
from s2core.text.tokenizer import Tokenizer
from s2core.voice.library import VoiceLibrary

DEMO_TEXT = "Hello! This is s2core speaking with its embedded model."
DEMO_TRANSCRIPT = DEFAULT_TRANSCRIPT
DEMO_VOICE = "demo"
DEMO_REFERENCE_FRAMES = DEFAULT_REFERENCE_FRAMES
#: where the demo's speech goes (the current directory)
DEMO_WAV = "s2core-demo.wav"


demo_reference = default_reference


@dataclass
class DemoReport:
    backend: str
    model_path: str
    prompt_positions: int
    frames: np.ndarray                  # [num_codebooks, frames]
    write_s: float
    load_s: float
    result: SpeakResult
    model_from_cache: bool = False      # the model file was already there (write_s is a lookup)
    wav: Path | None = None
    codec_load_s: float = 0.0
    compile_s: float = 0.0              # numba compiling, inside the phases (compile_time.py)


def demo_assets(weight_type: str = "f16", seed: int = 0) -> tuple[Path, Path, bool, float]:
    """(model path, tokenizer path, model was cached, seconds to write or find them)."""
    from_cache = default_model_is_cached(weight_type, seed)
    t = time.perf_counter()
    path, tok_path = default_model_files(weight_type, seed,
                                         progress=Progress("writing model and codec", 1))
    return path, tok_path, from_cache, time.perf_counter() - t


def run_demo(backend: str | None = None, steps: int = 32, weight_type: str = "f16",
             seed: int = 0, out=None, export: str | Path | None = None,
             wav: str | Path = DEMO_WAV) -> DemoReport | None:
    out = sys.stdout if out is None else out  # at call time: a test may have swapped it
    hp = demo_hparams()
    path, tok_path, from_cache, write_s = demo_assets(weight_type, seed)
    if export is not None:
        export_demo(Path(export), path, tok_path, out)
        return None

    with compile_time() as compiling:  # the table names a first run's compiling
        t = time.perf_counter()
        model = s2core.load(path, backend=backend)
        load_s = time.perf_counter() - t
        t = time.perf_counter()
        codec = s2core.load_codec(path)
        codec_load_s = time.perf_counter() - t
        tokenizer = Tokenizer.from_file(tok_path)
        caps = model.capabilities
        print(f"backend      {model.backend.name} on {caps.device} (compute {caps.compute_dtype}, "
              f"KV cache {caps.kv_cache_dtype})", file=out)
        print(f"model        {path} ({path.stat().st_size / 1e6:.1f} MB, {weight_type}, "
              f"{hp.n_layer} layers, dim {hp.dim}; codec inside)", file=out)
        print(f"codec        {codec.backend_name}, {codec.sample_rate} Hz, "
              f"{codec.samples_per_frame} samples a frame", file=out)
        print(f"tokenizer    {tok_path}", file=out)

        library = VoiceLibrary(cache_dir() / "voices")
        saved = DEMO_VOICE in library.names()
        voice_args = (dict(voice=DEMO_VOICE) if saved else
                      dict(reference_codes=demo_reference(hp), reference_text=DEMO_TRANSCRIPT,
                           save_voice=DEMO_VOICE))
        config = GenerationConfig(max_new_tokens=steps, min_tokens_before_end=steps, seed=seed,
                                  im_end_id=tokenizer.im_end_id)
        progress = FrameProgress()
        with model, codec, WavWriter(wav, codec.sample_rate) as writer:
            audio = AudioOut(codec, stream=True, on_audio=writer.write)
            result = speak(model, tokenizer, DEMO_TEXT, voices_dir=library.directory,
                           config=config, on_frame=progress, audio=audio,
                           say=lambda msg: print(msg, file=out), **voice_args)
    progress.close()
    report = DemoReport(model.backend.name, str(path), result.prompt_positions, result.codes,
                        write_s, load_s, result, from_cache, Path(wav), codec_load_s,
                        compiling.seconds)
    _print_report(report, out)
    return report


def export_demo(directory: Path, model: Path, tokenizer: Path, out) -> None:
    hp = demo_hparams()
    directory.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(model, directory / "model.gguf")
    shutil.copyfile(tokenizer, directory / "tokenizer.json")
    reference = demo_reference(hp).astype(np.int32)
    write_codes(directory / "reference.npy", reference)
    with s2core.load_codec(directory / "model.gguf") as codec:
        write_wav(directory / "reference.wav", codec.decode(reference), codec.sample_rate)
    (directory / "reference.txt").write_text(DEMO_TRANSCRIPT + "\n", encoding="utf-8")
    d = directory
    print(f"wrote {d}/model.gguf (with its codec), tokenizer.json, reference.npy "
          f"([{hp.num_codebooks}, {DEMO_REFERENCE_FRAMES}] codes), reference.wav (their audio) "
          "and reference.txt (the transcript). Try:", file=out)
    common = f"s2core speak {d}/model.gguf --tokenizer {d}/tokenizer.json --voices-dir {d}/voices"
    print(f'  {common} --text "Hello there." --reference-codes {d}/reference.npy '
          f'--reference-text "{DEMO_TRANSCRIPT}" --save-voice anna --wav {d}/hello.wav', file=out)
    print(f'  {common} --text "And once more, faster." --voice anna --wav {d}/again.wav '
          '--stream', file=out)
    print(f'  {common} --text "From a recording." --reference-audio {d}/reference.wav '
          f'--reference-text "{DEMO_TRANSCRIPT}" --out {d}/codes.npy', file=out)


def _print_report(r: DemoReport, out) -> None:
    label = "model (from the cache)" if r.model_from_cache else "model write"
    print(f"{label:<22}{r.write_s:9.3f}", file=out)
    for line in report_lines(r.result, r.load_s, codec_load_s=r.codec_load_s,
                             compile_s=r.compile_s):
        print(line, file=out)
    n = r.frames.shape[1]
    print(f"generated    {n} frames; first frame codes: "
          f"{r.frames[:, 0].tolist() if n else []}", file=out)
    if r.wav is not None:
        a = r.result.audio_stats
        print(f"wrote        {r.wav}: {a.audio_s:.2f} s of {a.sample_rate} Hz mono PCM16, "
              "written as frames came (random weights: it sounds like noise, not speech)",
              file=out)
