"""The e2e case: a 10-word sentence spoken with a restored voice, from the call to the audio.

    s2core bench --case e2e [--types q4_k_m] [--layers 36] [--backends numpy]

The model file is the one the other cases write (S2 Pro's dimensions, 36 Slow-AR layers by
default) with a codec of S2 Pro's real structure in the same file, as s2.cpp's files carry
it. In one process per backend (the backend `load()` picks when none is named):

1. a voice (215 random reference frames, 10 s, and a transcript) is saved as `s2core speak
   --save-voice` saves one: the .s2voice file and its K/V prefix file beside it;
2. the codec's one-shot decode rate, the sgemm rate and the read bandwidth are measured in
   this process, before and after the sentence (the machine's speed moves between minutes);
3. time to first audio, repeated: `speak(voice=..., audio=AudioOut(codec, stream=True))`,
   the path `s2core speak` runs, from the call to the first samples out of the streaming
   decoder (the voice file read, its prefix restored from its file, the text prefilled, the
   first main token and nine Fast-AR codes drawn, the codec's first push), stopped there;
4. the whole sentence, SENTENCE_FRAMES frames (about 4 s of audio, ten words at 150 words a
   minute: random weights would not end it on their own), decoded as the frames come.

Time to first audio is set against its floor, the sum of what cannot be skipped:
* the text prefill's FLOPs (after the restored prefix: workload.prefill_flops) at the best
  sgemm rate measured in this process;
* the first frame's bytes at the best read bandwidth measured in this process: its nine
  Fast-AR calls (the prefill's last position already gave the main token, so no decode step
  comes before the first audio; the step's bytes are reported beside it);
* one codec frame at the codec's measured one-shot rate.
The whole sentence is reported as compute seconds per audio second, split into the Slow-AR
(restore, prefill, steps), the Fast-AR (its calls less the code draws), sampling (main tokens
and codes) and the codec (every streaming push and the flush); what the four leave of the
wall time is "other" (the prompt, the voice files, the loop itself).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable

import numpy as np

from s2core.benchmarking.cases import child_main, load_average, run_child, write_case_outputs
from s2core.benchmarking.timing import machine_busy_s
from s2core.benchmarking.voice import REFERENCE_FRAMES, TRANSCRIPT

SCHEMA = "s2core-bench-e2e/1"
#: ten words
SENTENCE = "She sells bright blue sea shells by the quiet shore."
#: frames of the whole sentence: 4.0 s of audio at 44100 / 2048 frames a second
SENTENCE_FRAMES = 86
#: the --quick run's (the demo codec's frames are as long)
QUICK_FRAMES = 6
DEFAULT_TYPES = ("q4_k_m",)
DEFAULT_LAYERS = 36
#: frames of the codec's one-shot decode whose rate prices the floor's codec frame (2.0 s)
CODEC_PROBE_FRAMES = 43
VOICE_NAME = "e2e"
#: the three parts of the floor, in the report's order
FLOOR_PARTS = ("prefill_ms", "fast_frame_ms", "codec_frame_ms")
#: the split of the sentence's time, in the report's order
SPLIT_PARTS = ("slow_ar", "fast_ar", "sampling", "codec")


def e2e_hparams(cfg):
    """S2 Pro's shape; with --quick the demo model's (a vocabulary that holds a tokenizer)."""
    if cfg.quick:
        from s2core.embedded.writer import demo_hparams
        return dataclasses.replace(demo_hparams(), n_layer=cfg.layers)
    return cfg.hparams()


def e2e_codec_config(quick: bool):
    from s2core.embedded.codec_writer import demo_codec_config, s2pro_codec_config
    return demo_codec_config() if quick else s2pro_codec_config()


# ---------------------------------------------------------------------- the child
def split_of(result, total_s: float) -> dict[str, float]:
    """Seconds of one synthesis by part (SPLIT_PARTS), "other" = the wall time they leave,
    from a SpeakResult's generation and audio stats."""
    s, a = result.stats, result.audio_stats
    parts = {"slow_ar": s.restore_s + s.prefill_s + float(sum(s.step_s)),
             "fast_ar": float(sum(s.fast_decode_s)) - s.code_sample_s,
             "sampling": s.sample_s + s.code_sample_s,
             "codec": a.decode_s}
    parts["other"] = total_s - sum(parts.values())
    parts["total"] = total_s
    return parts


def measure(spec: dict[str, Any]) -> dict[str, Any]:
    import s2core
    from s2core.benchmarking.bandwidth import measure_bandwidth
    from s2core.benchmarking.codec import sgemm_gflops
    from s2core.embedded.tokenizer import build_tokenizer_json
    from s2core.generation.config import GenerationConfig
    from s2core.speak import AudioOut, speak
    from s2core.text.tokenizer import Tokenizer

    name = spec["backend"]
    out: dict[str, Any] = {"backend": name, "weight_type": spec["weight_type"], "status": "ok"}
    sgemm: list[float] = []
    bandwidth: list[dict[str, Any]] = []

    def machine_rates() -> None:
        sgemm.append(sgemm_gflops(reps=3))
        bandwidth.append(measure_bandwidth(spec["bandwidth_mb"], 3).as_dict())

    wall0, cpu0, busy0 = time.perf_counter(), time.process_time(), machine_busy_s()
    try:
        machine_rates()
        s2core.get_registry().backend_class(name)  # the backend's import is not the load
        t = time.perf_counter()
        model = s2core.load(spec["path"], backend=name)
        out["load_s"] = time.perf_counter() - t
        out["capabilities"] = model.capabilities.describe()
        t = time.perf_counter()
        codec = s2core.load_codec(spec["path"])
        out["codec_load_s"] = time.perf_counter() - t
        out["codec_backend"] = codec.backend_name
        hp = model.hparams
        tok = Tokenizer.from_str(build_tokenizer_json(hp))
        voices = Path(spec["tmp"]) / f"voices-{name}"
        reference = np.random.default_rng([spec["seed"], 5]).integers(
            0, hp.codebook_size, (hp.num_codebooks, REFERENCE_FRAMES))

        # 1. the voice and its prefix, saved as `s2core speak --save-voice` saves them
        one = GenerationConfig(max_new_tokens=1, seed=0, im_end_id=tok.im_end_id)
        t = time.perf_counter()
        saved = speak(model, tok, SENTENCE, reference_codes=reference,
                      reference_text=TRANSCRIPT, save_voice=VOICE_NAME, voices_dir=voices,
                      config=one)
        out["voice_save_s"] = time.perf_counter() - t
        out["voice"] = {"prefix_positions": saved.voice.prefix_positions,
                        "prefix_file_bytes": saved.voice.prefix_path.stat().st_size,
                        "prompt_positions": saved.prompt_positions,
                        "text_positions": saved.prompt_positions - saved.voice.prefix_positions,
                        "sentence_tokens": len(tok.encode(SENTENCE))}

        # 2. the codec's one-shot rate (after a warm-up decode)
        codes = np.random.default_rng([spec["seed"], 6]).integers(
            0, hp.codebook_size, (hp.num_codebooks, spec["codec_probe_frames"]))
        codec.decode(codes[:, :4])
        decodes = []
        for _ in range(spec["codec_reps"]):
            t = time.perf_counter()
            codec.decode(codes)
            decodes.append(time.perf_counter() - t)
        out["codec_one_shot_s"] = decodes
        out["codec_frame_ms"] = min(decodes) / spec["codec_probe_frames"] * 1e3

        # the sentence's length: <|im_end|> is blocked until then (random weights)
        sentence = GenerationConfig(max_new_tokens=spec["frames"],
                                    min_tokens_before_end=spec["frames"], seed=0,
                                    im_end_id=tok.im_end_id)

        # 3. time to first audio, from the call, the voice restored from its files
        def first_audio() -> dict[str, Any]:
            marks: dict[str, float] = {}

            def on_audio(samples: np.ndarray) -> None:
                if samples.size and "first" not in marks:
                    marks["first"] = time.perf_counter()

            t0 = time.perf_counter()
            r = speak(model, tok, SENTENCE, voice=VOICE_NAME, voices_dir=voices,
                      config=sentence, audio=AudioOut(codec, stream=True, on_audio=on_audio),
                      on_frame=lambda i, frame: False)  # stop after the first frame
            if r.voice.prefix != "restored":
                raise RuntimeError(f"the voice prefix was {r.voice.prefix!r}, not restored "
                                   f"({r.voice.why_computed})")
            s = r.stats
            parts = {"restore_ms": s.restore_s * 1e3, "prefill_ms": s.prefill_s * 1e3,
                     "fast_ar_ms": float(sum(s.fast_decode_s)) * 1e3,
                     "codec_push_ms": r.audio_stats.chunks[0] * 1e3}
            first_ms = (marks["first"] - t0) * 1e3
            return {"first_audio_ms": first_ms, **parts,
                    "rest_ms": first_ms - sum(parts.values()),
                    "prompt_build_ms": r.prompt_build_s * 1e3,
                    "first_frame_ms": s.first_frame_s * 1e3,
                    "prefilled_positions": s.prefilled_positions,
                    "restored_positions": s.restored_positions}

        first_audio()  # warm-up: the first touch of buffers on this path
        runs = [first_audio() for _ in range(spec["reps"])]
        out["first_audio_runs"] = runs
        out["first_audio"] = {k: float(np.median([r[k] for r in runs])) for k in runs[0]}

        # 4. the whole sentence
        t0 = time.perf_counter()
        r = speak(model, tok, SENTENCE, voice=VOICE_NAME, voices_dir=voices, config=sentence,
                  audio=AudioOut(codec, stream=True))
        total_s = time.perf_counter() - t0
        out["sentence"] = {"frames": r.frames, "audio_s": r.audio_stats.audio_s,
                           "samples": r.audio_stats.samples, "stopped_by": r.stats.stopped_by,
                           "seconds": split_of(r, total_s)}
        machine_rates()
        codec.close()
        model.close()
    except BaseException as exc:  # report what was measured, and why the rest was not
        out["status"] = "error"
        out["error"] = f"{type(exc).__name__}: {exc}"
        out["traceback"] = traceback.format_exc()
    out["sgemm_gflops"] = sgemm
    out["bandwidth"] = bandwidth
    out["others_cpu_share"] = others_cpu_share(wall0, cpu0, busy0)
    return out


def others_cpu_share(wall0: float, cpu0: float, busy0: float) -> float:
    """The share of the machine's CPU time that other processes (or the hypervisor) took
    since (wall0, cpu0, busy0): on a shared machine every figure here is slower by it."""
    import psutil
    wall = time.perf_counter() - wall0
    share = (machine_busy_s() - busy0 - (time.process_time() - cpu0)) / (
        wall * (psutil.cpu_count() or 1))
    return min(1.0, max(0.0, share))


# ---------------------------------------------------------------------- the parent
def floor_of(result: dict[str, Any], acct, hp) -> dict[str, float]:
    """The time to first audio's floor (module docstring), from a child's rates."""
    from s2core.benchmarking.workload import floor_ms, prefill_flops
    v = result["voice"]
    sgemm = max(result["sgemm_gflops"])
    read = max(b["read_gbps"] for b in result["bandwidth"])
    flops = prefill_flops(hp, v["text_positions"], v["prefix_positions"])
    return {"prefill_flops": flops, "sgemm_gflops": sgemm, "read_gbps": read,
            "prefill_ms": flops / (sgemm * 1e9) * 1e3,
            "fast_frame_bytes": acct.fast_frame_read_bytes,
            "fast_frame_ms": floor_ms(acct.fast_frame_read_bytes, read),
            "step_bytes": acct.step_read_bytes,
            "step_ms": floor_ms(acct.step_read_bytes, read),
            "codec_frame_ms": result["codec_frame_ms"]}


def derive(result: dict[str, Any], acct, hp) -> None:
    """Adds the floor, the ratio and the split per audio second to an ok result."""
    floor = floor_of(result, acct, hp)
    floor["total_ms"] = sum(floor[k] for k in FLOOR_PARTS)
    result["floor"] = floor
    result["first_audio_ratio"] = result["first_audio"]["first_audio_ms"] / floor["total_ms"]
    sentence = result["sentence"]
    sentence["per_audio_s"] = {k: v / sentence["audio_s"] for k, v in sentence["seconds"].items()}


def run_e2e_benchmark(cfg, say: Callable[[str], None]) -> dict[str, Any]:
    import s2core
    from s2core.benchmarking import machine
    from s2core.benchmarking.models import prepare_model
    from s2core.benchmarking.runner import child_env, select_backends

    info = machine.describe()
    hp = e2e_hparams(cfg)
    report: dict[str, Any] = {
        "schema": SCHEMA, "case": "e2e",
        "created": dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "config": cfg.as_dict(), "machine": info,
        "model_label": (f"demo-sized, {cfg.layers} Slow-AR layer(s), the demo codec"
                        if cfg.quick else f"{cfg.model_label}, S2 Pro's codec structure"),
        "machine_tag": machine.machine_tag(info), "sentence": SENTENCE, "results": [],
        "load_average_start": list(load_average())}
    for line in machine.summary_lines(info):
        say(line)
    frames = QUICK_FRAMES if cfg.quick else SENTENCE_FRAMES
    with tempfile.TemporaryDirectory(prefix="s2core-e2e-") as tmp:
        for wtype in cfg.types:
            acct = prepare_model(hp, wtype, cfg.seed, 1, cfg.model_dir,
                                 codec=e2e_codec_config(cfg.quick))
            if cfg.backends is None:  # what a user gets: the backend load() picks
                names, skipped = [s2core.default_backend(acct.path)], []
            else:
                names, skipped = select_backends(cfg.backends)
            report.setdefault("skipped_backends", []).extend(skipped)
            for name in names:
                say(f"[{wtype}] {name}: a {frames}-frame sentence with a restored voice, in a "
                    "fresh process ...")
                spec = {"backend": name, "weight_type": wtype, "path": acct.path, "tmp": tmp,
                        "seed": cfg.seed, "frames": frames, "reps": 2 if cfg.quick else 5,
                        "codec_probe_frames": 8 if cfg.quick else CODEC_PROBE_FRAMES,
                        "codec_reps": 2 if cfg.quick else 3,
                        "bandwidth_mb": cfg.bandwidth_mb}
                result = run_child("e2e", spec, tmp, child_env(cfg.threads), cfg.child_timeout_s)
                if result["status"] == "ok":
                    derive(result, acct, hp)
                    say(f"    first audio {result['first_audio']['first_audio_ms']:.0f} ms = "
                        f"{result['first_audio_ratio']:.2f}x its floor "
                        f"{result['floor']['total_ms']:.0f} ms; "
                        f"{result['sentence']['per_audio_s']['total']:.2f} compute s per audio s")
                else:
                    say(f"    FAILED: {result['error']}")
                report["results"].append(result)
    report["load_average_end"] = list(load_average())
    return report


# ---------------------------------------------------------------------- output
def table_lines(report: dict[str, Any]) -> list[str]:
    lines = [f"End to end ({report['model_label']}): \"{report['sentence']}\" spoken with a "
             "voice restored from its files, the audio decoded as the frames come.", ""]
    for r in report["results"]:
        head = f"**{r['weight_type']}, {r['backend']}**"
        if r["status"] != "ok":
            lines += [f"{head}: failed: {r['error']}", ""]
            continue
        f, fa, v, s = r["floor"], r["first_audio"], r["voice"], r["sentence"]
        lines += [
            f"{head}: load {r['load_s']:.1f} s, codec load {r['codec_load_s']:.1f} s; voice "
            f"prefix {v['prefix_positions']} positions restored, {v['text_positions']} text "
            f"positions prefilled ({v['sentence_tokens']}-token sentence).", "",
            f"Time to first audio, medians of {len(r['first_audio_runs'])} runs (ms):", "",
            "| part | measured | floor | floor's basis |", "|---|---:|---:|---|",
            f"| restore the voice prefix | {fa['restore_ms']:.0f} | | |",
            f"| prefill the text | {fa['prefill_ms']:.0f} | {f['prefill_ms']:.0f} | "
            f"{f['prefill_flops'] / 1e9:.0f} GFLOP at {f['sgemm_gflops']:.0f} GFLOP/s (sgemm) |",
            f"| first frame's Fast-AR (nine calls, their draws) | {fa['fast_ar_ms']:.0f} | "
            f"{f['fast_frame_ms']:.0f} | {f['fast_frame_bytes'] / 1e6:.0f} MB at "
            f"{f['read_gbps']:.1f} GB/s (read) |",
            f"| codec's first push | {fa['codec_push_ms']:.0f} | {f['codec_frame_ms']:.0f} | "
            "a frame of its one-shot decode |",
            f"| the rest (voice files, prompt, sampling) | {fa['rest_ms']:.0f} | | |",
            f"| **time to first audio** | **{fa['first_audio_ms']:.0f}** | "
            f"**{f['total_ms']:.0f}** | ratio **{r['first_audio_ratio']:.2f}x** "
            "(target <= 1.5x) |", "",
            f"Whole sentence: {s['frames']} frames, {s['audio_s']:.2f} s of audio "
            f"(stopped by {s['stopped_by']}).", "",
            "| part | seconds | compute s / audio s |", "|---|---:|---:|"]
        for k in SPLIT_PARTS + ("other", "total"):
            lines.append(f"| {k.replace('_', '-')} | {s['seconds'][k]:.2f} | "
                         f"{s['per_audio_s'][k]:.3f} |")
        lines += ["", f"sgemm {', '.join(f'{x:.0f}' for x in r['sgemm_gflops'])} GFLOP/s and "
                  "read bandwidth " + ", ".join(f"{b['read_gbps']:.1f}" for b in r["bandwidth"])
                  + " GB/s (before, after; floors use the best). A decode step's bytes would "
                  f"add {f['step_ms']:.0f} ms to the floor; none comes before the first audio. "
                  "While this backend ran, other processes and the hypervisor took "
                  f"{r['others_cpu_share']:.0%} of the machine's CPU time.", ""]
    lines += ["Slow-AR = restore + prefill + decode steps; Fast-AR = its calls less the code "
              "draws; sampling = main tokens and codes; codec = every streaming push and the "
              "flush; other = the wall time the four leave (prompt, voice files, the loop).",
              f"Load average at start {report['load_average_start']}, end "
              f"{report['load_average_end']}."]
    return lines


def write_outputs(report: dict[str, Any], out_dir: Path) -> int:
    return write_case_outputs("e2e", report, out_dir, table_lines(report))


def main(argv: list[str] | None = None) -> int:
    return child_main(measure, argv)


if __name__ == "__main__":
    sys.exit(main())
