"""`s2core bench --codec`: codec decode speed per backend on S2 Pro's real codec structure.

The package writes a codec with S2 Pro's structure and random weights (391 M parameters, 0.78 GB
in F16, cached). Every backend that provides a codec is measured in its own process: load time,
one-shot decode (seconds of compute per second of audio, and GFLOP/s against this machine's
sgemm peak, measured in the same run before and after), and the streaming decoder's cost per
frame pushed one at a time near the start (frame 10) and far into a stream (frame 1000; the
stream is advanced there in exact pushes of 64 frames, then the two streams are pushed in turn
so both points see the same load). FLOPs are counted from the layout:
every conv, transposed conv, linear and attention product (elementwise work not counted).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from s2core.codec.layout import CodecLayout, Transformer

SCHEMA = "s2core-bench-codec/1"
#: frames of the one-shot decode (43 frames = 2.0 s of S2 Pro audio)
ONE_SHOT_FRAMES = 43
NEAR_FRAME, FAR_FRAME = 10, 1000
#: frames timed one at a time at each point
STREAM_PROBE = 7
ADVANCE_PUSH = 64


# ---------------------------------------------------------------------- FLOPs from the layout
def _transformer_flops(tf: Transformer, t: int) -> float:
    w, hd = tf.width, tf.head_dim
    proj = w * (tf.n_head + 2 * tf.n_kv_head) * hd + tf.n_head * hd * w + 3 * w * tf.ffn
    keys = min(tf.window, t) if tf.window > 0 else t
    return tf.n_layers * (2.0 * t * proj + 4.0 * t * keys * tf.n_head * hd)


def decode_flops(layout: CodecLayout, n_frames: int) -> float:
    """Multiply-adds x 2 of decoding n_frames (one shot)."""
    q, dec = layout.quantizer, layout.decoder
    flops = _transformer_flops(q.post_module, n_frames)
    length = n_frames
    for conv, cnx in q.upsample:
        flops += 2.0 * conv.c_in * conv.c_out * conv.kernel * length
        length *= conv.stride
        flops += 2.0 * 7 * cnx.dim * length + 2.0 * 2 * 4 * cnx.dim * cnx.dim * length
    c = dec.conv_in
    flops += 2.0 * c.c_out * c.c_in * c.kernel * length
    for b in dec.blocks:
        u = b.upsample
        flops += 2.0 * u.c_in * u.c_out * u.kernel * length
        length *= u.stride
        for ru in b.units:
            flops += 2.0 * ru.conv1.c_in * ru.conv1.c_out * (ru.conv1.kernel + 1) * length
    c = dec.conv_out
    return flops + 2.0 * c.c_out * c.c_in * c.kernel * length


def sgemm_gflops(n: int = 2048, reps: int = 5) -> float:
    """Best float32 GEMM rate of NumPy's BLAS on this machine (all its threads)."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    a @ b
    best = min(_timed(lambda: a @ b) for _ in range(reps))
    return 2.0 * n ** 3 / best / 1e9


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


# ---------------------------------------------------------------------- one backend (child)
def measure_backend(spec: dict[str, Any]) -> dict[str, Any]:
    import s2core
    from s2core.benchmarking.machine import blas_info

    t0 = time.perf_counter()
    codec = s2core.load_codec(spec["path"], backend=spec["backend"])
    load_s = time.perf_counter() - t0
    rng = np.random.default_rng(0)
    far, n = spec["far_frame"], spec["frames"]
    total = max(n, far + STREAM_PROBE)
    codes = np.stack([rng.integers(0, s, total) for s in codec.codebook_sizes])
    spf, rate = codec.samples_per_frame, codec.sample_rate
    codec.decode(codes[:, :4])  # warm-up (first-call set-up of the libraries)
    # sgemm right around the decodes, in this process with its thread settings: the ratio
    # holds under the machine's load at that moment
    sgemm = [sgemm_gflops(reps=3)]
    one_shot = [_timed(lambda: codec.decode(codes[:, :n])) for _ in range(spec["reps"])]
    sgemm.append(sgemm_gflops(reps=3))
    audio_s = n * spf / rate

    # Two streams, one at NEAR_FRAME and one at far_frame, pushed one frame each in turn: both
    # points see the same machine conditions (other processes come and go), so their ratio
    # holds even when the absolute times drift.
    streams = {at: [codec.stream_decoder(), 0] for at in (spec["near_frame"], far)}
    for at, entry in streams.items():
        stream, _ = entry
        while entry[1] < at:
            step = min(ADVANCE_PUSH, at - entry[1])
            stream.push(codes[:, entry[1]:entry[1] + step])
            entry[1] += step
    times: dict[int, list[float]] = {at: [] for at in streams}
    for _ in range(STREAM_PROBE):
        for at, entry in streams.items():
            stream, pos = entry
            times[at].append(_timed(lambda: stream.push(codes[:, pos:pos + 1])))
            entry[1] += 1
    frame_s = {str(at): float(np.median(t)) for at, t in times.items()}
    codec.close()
    return {"backend": spec["backend"], "status": "ok", "load_s": load_s,
            "one_shot_frames": n, "one_shot_audio_s": audio_s,
            "one_shot_s": one_shot, "compute_per_audio_s": float(np.median(one_shot)) / audio_s,
            "best_compute_per_audio_s": float(np.min(one_shot)) / audio_s,
            "stream_frame_s": frame_s, "frame_audio_s": spf / rate, "sgemm_gflops": sgemm,
            "blas": blas_info()}


def _stderr_or_none():
    """The child's output goes to our stderr when that is a real file (not under capture)."""
    try:
        sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        return None
    return sys.stderr


def _child_main(spec_path: str, out_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    Path(out_path).write_text(json.dumps(measure_backend(spec)))
    return 0


# ---------------------------------------------------------------------- the run (parent)
def run(backends: tuple[str, ...] | None, out_dir: Path, quick: bool = False,
        frames: int = ONE_SHOT_FRAMES, far_frame: int = FAR_FRAME, threads: int | None = None
        ) -> dict[str, Any]:
    import s2core
    from s2core.codec.file import CodecFile
    from s2core.runtime.codec_selection import provides_codec
    from s2core.embedded.cache import cached_codec
    from s2core.embedded.codec_writer import demo_codec_config, s2pro_codec_config
    from s2core.benchmarking import machine
    from s2core.benchmarking.runner import child_env

    say = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    config = demo_codec_config() if quick else s2pro_codec_config()
    if quick:
        frames, far_frame = min(frames, 8), min(far_frame, 40)
    say("writing (or finding) the codec ...")
    path = cached_codec(config, "f16", stem="demo-codec" if quick else "s2pro-codec")
    layout = CodecFile(path).layout
    rows = [r for r in s2core.list_backends() if provides_codec(r)]
    names = [r.name for r in rows if r.available and (backends is None or r.name in backends)]
    skipped = [{"backend": r.name, "reason": r.reason} for r in rows
               if not r.available and (backends is None or r.name in backends)]
    report: dict[str, Any] = {
        "schema": SCHEMA, "created": dt.datetime.now().isoformat(timespec="seconds"),
        "machine": machine.describe(), "codec": {"path": str(path), "params": config.n_params,
                                                 "quick": quick},
        "flops_per_audio_s": decode_flops(layout, frames) / (frames * config.hparams.samples_per_frame
                                                             / config.hparams.sample_rate),
        "near_frame": NEAR_FRAME, "far_frame": far_frame,
        "sgemm_gflops_before": sgemm_gflops(), "results": [], "skipped": skipped}
    say(f"sgemm: {report['sgemm_gflops_before']:.0f} GFLOP/s")
    for name in names:
        say(f"measuring {name} ...")
        spec = {"backend": name, "path": str(path), "frames": frames, "reps": 2 if quick else 5,
                "near_frame": NEAR_FRAME, "far_frame": far_frame}
        with tempfile.TemporaryDirectory(prefix="s2core-bench-codec-") as tmp:
            spec_path, out_path = Path(tmp) / "spec.json", Path(tmp) / "out.json"
            spec_path.write_text(json.dumps(spec))
            proc = subprocess.run([sys.executable, "-m", "s2core.benchmarking.codec", "--child",
                                   str(spec_path), str(out_path)], env=child_env(threads),
                                  stdout=_stderr_or_none())
            result = (json.loads(out_path.read_text()) if out_path.exists() else
                      {"backend": name, "status": "error",
                       "error": f"child exited with code {proc.returncode}"})
        report["results"].append(result)
    report["sgemm_gflops_after"] = sgemm_gflops()
    for r in report["results"]:
        if r["status"] == "ok":
            r["audio_s_per_s"] = 1.0 / r["compute_per_audio_s"]
            r["best_audio_s_per_s"] = 1.0 / r["best_compute_per_audio_s"]
            r["gflops"] = report["flops_per_audio_s"] / r["compute_per_audio_s"] / 1e9
            r["of_sgemm_peak"] = r["gflops"] / max(r["sgemm_gflops"])
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = out_dir / f"bench-codec-{dt.datetime.now():%Y%m%d-%H%M}-{machine.machine_tag(report['machine'])}"
    stem.with_suffix(".json").write_text(json.dumps(report, indent=1))
    text = markdown(report)
    stem.with_suffix(".md").write_text(text)
    print(text)
    print(f"wrote {stem}.json, {stem}.md")
    return report


def markdown(report: dict[str, Any]) -> str:
    from s2core.benchmarking.machine import summary_lines

    gf = report["flops_per_audio_s"] / 1e9
    lines = [f"# Codec decode ({report['created']})", "",
             f"Codec: {report['codec']['params']:,} parameters "
             f"({'demo' if report['codec']['quick'] else 'S2 Pro structure'}, F16, random weights); "
             f"{gf:.1f} GFLOP per second of audio.",
             f"sgemm (NumPy's BLAS, float32): {report['sgemm_gflops_before']:.0f} GFLOP/s before the "
             f"run, {report['sgemm_gflops_after']:.0f} after; each backend's share is of the best "
             "sgemm measured in its own process just before and after its decodes.", "",
             "| backend | load | audio s / compute s (median, best) | compute s / audio s | GFLOP/s | sgemm there | of sgemm peak "
             f"| stream frame {report['near_frame']} | stream frame {report['far_frame']} |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in report["results"]:
        if r["status"] != "ok":
            lines.append(f"| {r['backend']} | failed: {r.get('error')} ||||||||")
            continue
        near, far = (r["stream_frame_s"][str(k)] for k in (report["near_frame"], report["far_frame"]))
        lines.append(f"| {r['backend']} | {r['load_s']:.1f} s | {r['audio_s_per_s']:.2f}, "
                     f"{r['best_audio_s_per_s']:.2f} | "
                     f"{r['compute_per_audio_s']:.2f} | {r['gflops']:.0f} | {max(r['sgemm_gflops']):.0f} | "
                     f"{r['of_sgemm_peak']:.0%} | "
                     f"{near * 1e3:.0f} ms | {far * 1e3:.0f} ms |")
    lines += [f"| (skipped) {s['backend']} | {s['reason']} ||||||||" for s in report["skipped"]]
    lines += ["", f"A frame is {report['results'][0]['frame_audio_s'] * 1e3:.1f} ms of audio."
              if report["results"] and report["results"][0]["status"] == "ok" else "", ""]
    lines += summary_lines(report["machine"])
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--child":
        return _child_main(argv[1], argv[2])
    p = argparse.ArgumentParser(prog="s2core bench --codec", description=__doc__)
    p.add_argument("--backends", type=lambda s: tuple(x for x in s.split(",") if x),
                   help="backends to measure (default: every available codec provider)")
    p.add_argument("--frames", type=int, default=ONE_SHOT_FRAMES, help="frames of the one-shot decode")
    p.add_argument("--far-frame", type=int, default=FAR_FRAME,
                   help="the far point of the streaming measurement (frame index)")
    p.add_argument("--threads", type=int, help="set OMP/BLAS/torch thread counts")
    p.add_argument("--out", type=Path, default=Path("benchmarks") / "results")
    p.add_argument("--quick", action="store_true", help="the demo's small codec, few frames")
    args = p.parse_args([a for a in argv if a != "--codec"])
    report = run(args.backends, args.out, args.quick, args.frames, args.far_frame, args.threads)
    return 0 if report["results"] and all(r["status"] == "ok" for r in report["results"]) else 1


if __name__ == "__main__":
    sys.exit(main())
